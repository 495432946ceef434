// AvailableCores / DefaultLoaderThreads (common/cores.h).
#include "common/cores.h"

#include "common/job.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace gpufeed {

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int DefaultLoaderThreads() {
  const int cores = AvailableCores();
  const int ranks = LocalWorldSize();  // 1 when not torchrun's value
  if (ranks <= 1) return cores;
  return std::max(2, cores / ranks);
}

}  // namespace gpufeed
