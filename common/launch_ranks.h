// `gpufeed train --gpus N` without torchrun: this program started again N
// times as ranks 0..N-1 of one job on this host, with the environment
// torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)
// and a job name of their own (GPUFEED_TRAIN_JOB, common/job.h).
#ifndef GPUFEED_COMMON_LAUNCH_RANKS_H_
#define GPUFEED_COMMON_LAUNCH_RANKS_H_

#include "gpufeed/status.h"

namespace gpufeed {

// Runs /proc/self/exe with this process's own arguments as `n` ranks and
// waits for them. When a rank fails (a non-zero exit or a signal) the others
// are stopped (SIGTERM, SIGKILL after 10 s) and the error names the first
// rank that failed and how. Ok when every rank exited 0.
Status LaunchLocalRanks(int n);

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_LAUNCH_RANKS_H_
