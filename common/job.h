// The job this process belongs to, as torchrun's environment (or
// `gpufeed train --gpus`, which sets the same variables) describes it: one
// place for the loader's defaults, the node-shared server and the trainer's
// ranks (STYLE.md practices 21 and 23).
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

// A writable directory for the node's sockets and rendezvous files:
// $GPUFEED_NODE_DIR, else $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp.
Result<std::string> NodeDir();

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_JOB_H_
