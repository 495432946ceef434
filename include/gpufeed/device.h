// What CUDA devices this process can see. Never fails: a machine without a
// GPU, without a driver, or a build without CUDA yields an empty list and a
// reason, so CPU-only callers (CI, laptops) can branch on it.
#ifndef GPUFEED_DEVICE_H_
#define GPUFEED_DEVICE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace gpufeed {

struct GpuDevice {
  int index = 0;
  std::string name;
  uint64_t memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;  // compute capability
};

struct GpuReport {
  bool built_with_cuda = false;
  int driver_version = 0;   // e.g. 13000; 0 when no driver
  int runtime_version = 0;  // CUDA runtime gpufeed was built with
  std::vector<GpuDevice> devices;
  std::string reason;  // why devices is empty, when it is
};

GpuReport QueryGpus();

}  // namespace gpufeed

#endif  // GPUFEED_DEVICE_H_
