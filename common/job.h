// The job this process belongs to, as torchrun's environment (or
// `gpufeed train --gpus`, which sets the same variables) describes it: one
// place for the loader's defaults, the node-shared server and the trainer's
// ranks (docs/practices.md, 21 and 23).
#ifndef GPUFEED_COMMON_JOB_H_
#define GPUFEED_COMMON_JOB_H_

#include <string>

#include "gpufeed/status.h"

namespace gpufeed {

// getenv as a string ("" when unset).
std::string Env(const char* name);

// LOCAL_WORLD_SIZE when it is a count torchrun would set (1..4096), else 1.
int LocalWorldSize();

// This process's place in a data-parallel job: RANK, WORLD_SIZE, LOCAL_RANK
// and LOCAL_WORLD_SIZE. Without RANK and WORLD_SIZE: rank 0 of 1.
// InvalidArgument for values that contradict each other or are not counts.
struct JobRanks {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
};
Result<JobRanks> JobRanksFromEnv();

// A name every process of this job on this host derives alike: torchrun's
// TORCHELASTIC_RUN_ID (with GROUP_RANK when `per_node`) and restart count,
// else GPUFEED_TRAIN_JOB (set by `gpufeed train --gpus`), else MASTER_ADDR
// and MASTER_PORT, else the process group.
std::string JobId(bool per_node);

// The node's private directory for sockets and rendezvous files (this
// user's, shared by all of this user's jobs on the host): $GPUFEED_NODE_DIR,
// else $XDG_RUNTIME_DIR/gpufeed, else gpufeed-<euid> in $TMPDIR, else in
// /tmp. Created with mode 0700 when absent, then checked (lstat, then
// open(O_DIRECTORY|O_NOFOLLOW) and fstat): a directory, not a symbolic link,
// owned by this process's effective uid, mode exactly 0700. Anything else is
// InvalidArgument naming the path, what is wrong and the fix (remove it, or
// set GPUFEED_NODE_DIR); no writable place at all is IOError. Another local
// user can then neither plant a server or a link where a rank looks, nor
// read what is there (docs/practices.md, practice 24).
Result<std::string> NodeDir();

// Opens `path` (a file in NodeDir()) with `flags` | O_NOFOLLOW | O_CLOEXEC,
// mode 0600 when created, and checks what was opened: a regular file owned
// by this process's effective uid with no group or other bits. A symbolic
// link is refused (IOError, ELOOP), never followed; the rest is
// InvalidArgument naming the path. Returns the descriptor, the caller's.
Result<int> OpenPrivateFile(const std::string& path, int flags);

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_JOB_H_
