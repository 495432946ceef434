// cuBLAS and cuDNN for the trainer's CUDA backend, loaded at run time (dlopen,
// as NCCL, nvJPEG and NVML are): the gpufeed command, libgpufeed.so and a CPU
// run start without them (cuBLAS alone is ~0.5 GB and took ~1 s to map at every
// start), and a GPU run on a host lacking one fails with a Status naming the
// library and what to install instead of the loader's "cannot open shared
// object file" before main(). The tables' types come from the toolkit's
// headers (decltype), so a signature that changes fails the build, not a run.
#ifndef GPUFEED_TRAINER_CUDA_LIBS_H_
#define GPUFEED_TRAINER_CUDA_LIBS_H_

#include <cublas_v2.h>
#include <cudnn.h>

#include "gpufeed/status.h"

namespace gpufeed::trainer {

// The cuBLAS calls the trainer makes. (cublas_v2.h maps cublasCreate and its
// kin to the _v2 symbols, the names the library exports.)
struct CublasApi {
  // cublasGemmEx has a C++ overload (cudaDataType computeType); this is the
  // exported one.
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void*, cudaDataType, int, const void*, cudaDataType, int, const void*,
                                      void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  GemmExFn gemm_ex = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The cuDNN calls the trainer makes (ops_cuda.cu, conv_plans_cuda.cu).
struct CudnnApi {
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_tensor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_tensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_tensor_4d = nullptr;
  decltype(&cudnnCreateFilterDescriptor) create_filter = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) destroy_filter = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) set_filter_4d = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) create_conv = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) destroy_conv = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) set_conv_2d = nullptr;
  decltype(&cudnnSetConvolutionMathType) set_conv_math = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) forward_algorithms = nullptr;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) forward_workspace = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) backward_data_algorithms = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) backward_data_workspace = nullptr;
  decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) backward_filter_algorithms = nullptr;
  decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize) backward_filter_workspace = nullptr;
  decltype(&cudnnConvolutionForward) convolution_forward = nullptr;
  decltype(&cudnnConvolutionBackwardData) convolution_backward_data = nullptr;
  decltype(&cudnnConvolutionBackwardFilter) convolution_backward_filter = nullptr;
};

struct CudaLibs {
  CublasApi blas;
  CudnnApi dnn;
};

// The sonames of the major versions the build's headers declare
// ("libcublas.so.13", "libcudnn.so.9").
const char* CublasSoname();
const char* CudnnSoname();

// Opens the two libraries by soname (the dynamic loader's search:
// LD_LIBRARY_PATH, the ld.so cache, ...) and fills *libs. Unsupported, naming
// the library and what to install, when one is missing or lacks an entry
// point. The handles stay open for the process. Tests pass other names.
Status OpenCudaLibs(const char* cublas_soname, const char* cudnn_soname, CudaLibs* libs);

// The process's tables, opened on the first call with the default sonames;
// later calls return the same result. Thread-safe. Every cuBLAS or cuDNN
// handle is made after this succeeded, so code that holds one may call
// through LoadCudaLibs() without checking it again.
Result<const CudaLibs*> LoadCudaLibs();

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_CUDA_LIBS_H_
