// AvailableCores / DefaultLoaderThreads (common/cores.h).
#include "common/cores.h"

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
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (local == nullptr || *local == '\0') return cores;
  char* end = nullptr;
  const long ranks = std::strtol(local, &end, 10);
  if (*end != '\0' || ranks <= 1 || ranks > 4096) return cores;  // not torchrun's value: ignore it
  return std::max(2, cores / static_cast<int>(ranks));
}

}  // namespace gpufeed
