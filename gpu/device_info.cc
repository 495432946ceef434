// QueryGpus for every build: the CUDA variant lives in device_info_cuda.cu.
#include "gpufeed/device.h"

namespace gpufeed {

#ifdef GPUFEED_WITH_CUDA
GpuReport QueryGpusCuda();  // device_info_cuda.cu
GpuReport QueryGpus() { return QueryGpusCuda(); }
#else
GpuReport QueryGpus() {
  GpuReport r;
  r.reason = "gpufeed was built without CUDA (GPUFEED_CUDA=OFF or no nvcc found)";
  return r;
}
#endif

}  // namespace gpufeed
