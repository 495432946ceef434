// How much memory this process may still use, and the check every allocation
// sized from outside goes through before it is made (a declared shape of 2^40
// samples is an error naming the size, not std::bad_alloc).
#ifndef GPUFEED_COMMON_MEMORY_H_
#define GPUFEED_COMMON_MEMORY_H_

#include <cstdint>
#include <string_view>

#include "gpufeed/status.h"

namespace gpufeed {

// Bytes this process can still allocate: /proc/meminfo's MemAvailable,
// lowered to the room left under the cgroup (v2 or v1) memory limit when
// there is one. UINT64_MAX when neither can be read.
uint64_t AvailableMemoryBytes();

// Ok when `bytes` fits in the memory available now; otherwise
// InvalidArgument "<what> needs N bytes (X GiB) but M are available; <hint>".
Status CheckFitsInMemory(uint64_t bytes, std::string_view what, std::string_view hint = {});

// "1.5 GiB", "312 MiB", "4096 bytes".
std::string HumanBytes(uint64_t bytes);

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_MEMORY_H_
