// Share::kNode (SourceOptions::share, gpufeed.Loader(share="node")): the
// local ranks of one job on one host read a dataset through one node-local
// `gpufeed serve`, so the node decodes each chunk once and holds one
// decoded-chunk cache instead of one per rank. Internal to daemon/; the door
// is OpenBatchSource.
//
// How the ranks meet, with nothing to run by hand:
// - Every rank of the job on this host derives the same name from the job
//   (torchrun's TORCHELASTIC_RUN_ID, GROUP_RANK and restart count, else
//   MASTER_ADDR and MASTER_PORT, else the process group) and from what the
//   server opens (the data, its fields, the cache, the threads): PREFIX.sock,
//   .lease, .lock and .log in the user's private node directory (NodeDir,
//   common/job.h: $GPUFEED_NODE_DIR, else $XDG_RUNTIME_DIR/gpufeed, else
//   gpufeed-<euid> in $TMPDIR or /tmp; made 0700, refused unless it is a
//   directory of this uid's with mode 0700 and no symbolic link).
// - A rank takes PREFIX.lock exclusively (the start-up mutex; still the
//   file at its path once locked, else it opens the path again), then a
//   shared flock on PREFIX.lease, which its NodeLease holds until it is
//   destroyed (or the process ends); if nothing accepts on PREFIX.sock it
//   makes PREFIX.log afresh and starts `gpufeed serve --lease-file
//   PREFIX.lease --lease-lock PREFIX.lock --lease-remove PREFIX.log` in a
//   session of its own, its stderr on the log, and waits until it accepts;
//   then it lets PREFIX.lock go. The lock and lease are opened O_NOFOLLOW
//   and checked (a regular file of this uid's, no group or other bits); the
//   log O_CREAT|O_EXCL|O_NOFOLLOW; a link or another's file at the socket or
//   log path is refused. The client checks the server's uid (SO_PEERCRED,
//   loader/remote/conn.cc) before it sends anything.
// - The server stops once no process holds the lease
//   (ServerOptions::lease_file): after the job's last rank, and after a job
//   whose ranks all died. A rank that dies drops only its own lock and
//   connection; the others' streams go on. Stopping so, the server removes
//   the socket, then the lease, log and lock unless a rank holds the lock
//   (it is starting a new server that will use them): a finished job leaves
//   no file. A server that cannot start leaves only its log, which the
//   rank's error names.
#ifndef GPUFEED_DAEMON_NODE_SHARE_H_
#define GPUFEED_DAEMON_NODE_SHARE_H_

#include <memory>
#include <string>

#include "gpufeed/open_source.h"
#include "gpufeed/status.h"

namespace gpufeed {

// A rank's hold on its node's server for one dataset.
class NodeLease {
 public:
  ~NodeLease();  // drops the shared lock: the server may stop once no rank holds one
  NodeLease(const NodeLease&) = delete;
  NodeLease& operator=(const NodeLease&) = delete;

  const std::string& address() const { return address_; }  // "unix:PREFIX.sock"
  const std::string& dataset() const { return dataset_; }  // the server's name for the data
  bool started_here() const { return started_here_; }      // this process started the server

 private:
  friend Result<std::unique_ptr<NodeLease>> AttachNodeServer(const SourceOptions& o);
  NodeLease() = default;
  int lease_fd_ = -1;
  std::string address_, dataset_;
  bool started_here_ = false;
};

// o.share resolved: kNode or kNone. kAuto is kNode when torchrun started
// more than one local rank (LOCAL_WORLD_SIZE > 1), the data is a file spec
// and no option only a local loader takes is given (open.labels_path,
// open.io, open.max_open_files); kNode with one of those, or with a daemon
// address, is InvalidArgument naming it.
Result<Share> ResolveShare(const SourceOptions& o);

// PREFIX for o: NodeDir() (created and checked; its errors) + "/gpufeed-"
// + euid + "-" + a hash of the job and of what the server opens. The
// node's server for o listens on PREFIX.sock. InvalidArgument when that
// path is too long for a Unix socket.
Result<std::string> NodePrefix(const SourceOptions& o);

// Attaches to the node's server for o.data (o.open.fields,
// o.open.no_sample_axis, o.open.trust_files; o.loader.cache_bytes and
// prefetch for each stream; o.loader.threads x the local ranks, or every
// core when 0), starting it when none runs. Errors name what failed: no
// private directory (NodeDir's errors), a symbolic link or another's file
// at one of PREFIX's paths, no gpufeed executable (GPUFEED_CLI), a server
// that exited (the error names its log, the one file then left) or did not
// listen within 180 s. A server of another uid on PREFIX.sock is refused
// when the rank connects (OpenBatchSource), before anything is sent.
Result<std::unique_ptr<NodeLease>> AttachNodeServer(const SourceOptions& o);

}  // namespace gpufeed

#endif  // GPUFEED_DAEMON_NODE_SHARE_H_
