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
//   .lease, .lock and .log in $GPUFEED_NODE_DIR, else $XDG_RUNTIME_DIR, else
//   $TMPDIR or /tmp.
// - A rank takes PREFIX.lock exclusively (the start-up mutex), then a shared
//   flock on PREFIX.lease, which its NodeLease holds until it is destroyed
//   (or the process ends); if nothing accepts on PREFIX.sock it starts
//   `gpufeed serve --lease-file PREFIX.lease` in a session of its own and
//   waits until it accepts; then it lets PREFIX.lock go.
// - The server stops once no process holds the lease
//   (ServerOptions::lease_file): after the job's last rank, and after a job
//   whose ranks all died. A rank that dies drops only its own lock and
//   connection; the others' streams go on.
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

// Attaches to the node's server for o.data (o.open.fields,
// o.open.no_sample_axis, o.open.trust_files; o.loader.cache_bytes and
// prefetch for each stream; o.loader.threads x the local ranks, or every
// core when 0), starting it when none runs. Errors name what failed: no
// writable directory, no gpufeed executable (GPUFEED_CLI), a server that
// exited (its log) or did not listen within 180 s.
Result<std::unique_ptr<NodeLease>> AttachNodeServer(const SourceOptions& o);

}  // namespace gpufeed

#endif  // GPUFEED_DAEMON_NODE_SHARE_H_
