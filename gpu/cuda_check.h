// CUDA error handling: every runtime call goes through GPUFEED_CUDA_RETURN,
// which turns a failure into a Status naming the call, the error, file and
// line. Only for .cu files and CUDA-only .cc files.
#ifndef GPUFEED_GPU_CUDA_CHECK_H_
#define GPUFEED_GPU_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <string>

#include "gpufeed/status.h"

namespace gpufeed::gpu {

inline Status CudaStatus(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return Status::Ok();
  // The runtime keeps a failed call's error as the thread's last error; a
  // later launch's cudaGetLastError() would report it again, against a call
  // that did not fail. It is this Status's now.
  (void)cudaGetLastError();
  return Status::Internal(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                          ") at " + file + ":" + std::to_string(line));
}

}  // namespace gpufeed::gpu

#define GPUFEED_CUDA_RETURN(call) GPUFEED_RETURN_IF_ERROR(::gpufeed::gpu::CudaStatus((call), #call, __FILE__, __LINE__))

#endif  // GPUFEED_GPU_CUDA_CHECK_H_
