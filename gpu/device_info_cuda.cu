// Device enumeration through the CUDA runtime (linked statically, so only the
// driver is needed where gpufeed runs).
#include <cuda_runtime.h>

#include "gpufeed/device.h"

namespace gpufeed {

GpuReport QueryGpusCuda() {
  GpuReport r;
  r.built_with_cuda = true;
  cudaRuntimeGetVersion(&r.runtime_version);
  if (cudaError_t e = cudaDriverGetVersion(&r.driver_version); e != cudaSuccess || r.driver_version == 0) {
    r.reason = "no NVIDIA driver found";
    return r;
  }
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    r.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    r.devices.push_back({i, p.name, static_cast<uint64_t>(p.totalGlobalMem), p.major, p.minor});
  }
  if (r.devices.empty()) r.reason = "the driver reports no CUDA devices";
  return r;
}

}  // namespace gpufeed
