// CUDA library errors as Status (cuBLAS, cuDNN) and DType -> library data
// types, for the trainer's CUDA backend (ops_cuda.cu, conv_plans_cuda.cu).
// The libraries' calls go through the tables of cuda_libs.h.
#ifndef GPUFEED_TRAINER_CUDA_STATUS_H_
#define GPUFEED_TRAINER_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cudnn.h>

#include <string>

#include "gpu/cuda_check.h"
#include "gpufeed/dtype.h"
#include "gpufeed/status.h"
#include "trainer/cuda_libs.h"

namespace gpufeed::trainer {

// A status that is not success came from a call through the loaded tables,
// so LoadCudaLibs() has succeeded and returns them at once.
inline Status CublasStatus(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  const CublasApi& blas = (*LoadCudaLibs())->blas;
  return Status::Internal(std::string(call) + " failed: " + blas.status_name(s) + " (" + blas.status_string(s) +
                          ") at " + file + ":" + std::to_string(line));
}
inline Status CudnnStatus(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(call) + " failed: " + (*LoadCudaLibs())->dnn.error_string(s) + " at " + file +
                          ":" + std::to_string(line));
}
#define CUBLAS_RETURN(call) GPUFEED_RETURN_IF_ERROR(CublasStatus((call), #call, __FILE__, __LINE__))
#define CUDNN_RETURN(call) GPUFEED_RETURN_IF_ERROR(CudnnStatus((call), #call, __FILE__, __LINE__))
#define LAUNCH_CHECK() GPUFEED_CUDA_RETURN(cudaGetLastError())

inline cudaDataType_t CudaType(DType d) {
  return d == DType::kFloat32 ? CUDA_R_32F : d == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
}
inline cudnnDataType_t CudnnType(DType d) {
  return d == DType::kFloat32 ? CUDNN_DATA_FLOAT : d == DType::kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_CUDA_STATUS_H_
