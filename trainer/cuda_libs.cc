// (A .cc in the module's CUDA sources: host code built by the C++ compiler.)
// cuBLAS and cuDNN through dlopen (cuda_libs.h): each entry point looked up
// once, into the tables ops_cuda.cu and conv_plans_cuda.cu call through.
#include "trainer/cuda_libs.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

namespace gpufeed::trainer {
namespace {

#define GPUFEED_STRINGIFY_(x) #x
#define GPUFEED_STRINGIFY(x) GPUFEED_STRINGIFY_(x)
// The major versions the build's headers declare, as text.
constexpr const char* kCublasMajor = GPUFEED_STRINGIFY(CUBLAS_VER_MAJOR);
constexpr const char* kCudnnMajor = GPUFEED_STRINGIFY(CUDNN_MAJOR);

// The build fails here if the header's exported cublasGemmEx stops matching
// GemmExFn (the one entry point typed by hand).
[[maybe_unused]] constexpr CublasApi::GemmExFn kGemmExAsDeclared = &cublasGemmEx;

// Opens `soname` and looks up each entry point `bind` names; `what` and
// `install` word the error (which library, what to install).
template <class Bind>
Status Open(const char* soname, const std::string& what, const std::string& install, Bind bind) {
  void* so = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (so == nullptr) {
    const char* why = dlerror();
    return Status::Unsupported("training on a GPU needs " + what + " (" + soname + "), which is not loadable here (" +
                               (why != nullptr ? why : "dlopen failed") + "): " + install);
  }
  std::string missing;
  auto sym = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(so, name));
    if (*fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  bind(sym);
  if (!missing.empty()) {
    dlclose(so);
    return Status::Unsupported(std::string(soname) + " lacks " + missing + " (an older " + what +
                               " than the build's headers?): " + install);
  }
  return Status::Ok();  // the handle stays open: the tables point into it
}

}  // namespace

const char* CublasSoname() { return "libcublas.so." GPUFEED_STRINGIFY(CUBLAS_VER_MAJOR); }
const char* CudnnSoname() { return "libcudnn.so." GPUFEED_STRINGIFY(CUDNN_MAJOR); }

Status OpenCudaLibs(const char* cublas_soname, const char* cudnn_soname, CudaLibs* libs) {
  const std::string blas = kCublasMajor, dnn = kCudnnMajor;
  const std::string findable = " and make it findable (the ld.so cache, or its directory on LD_LIBRARY_PATH)";
  CublasApi& b = libs->blas;
  GPUFEED_RETURN_IF_ERROR(Open(cublas_soname, "cuBLAS " + blas,
                               "install CUDA " + blas + "'s cuBLAS (apt: libcublas-" + blas +
                                   "-0 from NVIDIA's CUDA repository, or pip: nvidia-cublas)" + findable,
                               [&](auto sym) {
                                 sym(&b.create, "cublasCreate_v2");
                                 sym(&b.destroy, "cublasDestroy_v2");
                                 sym(&b.set_stream, "cublasSetStream_v2");
                                 sym(&b.set_workspace, "cublasSetWorkspace_v2");
                                 sym(&b.gemm_ex, "cublasGemmEx");
                                 sym(&b.status_name, "cublasGetStatusName");
                                 sym(&b.status_string, "cublasGetStatusString");
                               }));
  CudnnApi& d = libs->dnn;
  GPUFEED_RETURN_IF_ERROR(Open(cudnn_soname, "cuDNN " + dnn,
                               "install cuDNN " + dnn + " for CUDA " + blas + " (apt: libcudnn" + dnn + "-cuda-" +
                                   blas + " from NVIDIA's CUDA repository, or pip: nvidia-cudnn-cu" + blas + ")" +
                                   findable,
                               [&](auto sym) {
                                 sym(&d.get_version, "cudnnGetVersion");
                                 sym(&d.error_string, "cudnnGetErrorString");
                                 sym(&d.create, "cudnnCreate");
                                 sym(&d.destroy, "cudnnDestroy");
                                 sym(&d.set_stream, "cudnnSetStream");
                                 sym(&d.create_tensor, "cudnnCreateTensorDescriptor");
                                 sym(&d.destroy_tensor, "cudnnDestroyTensorDescriptor");
                                 sym(&d.set_tensor_4d, "cudnnSetTensor4dDescriptor");
                                 sym(&d.create_filter, "cudnnCreateFilterDescriptor");
                                 sym(&d.destroy_filter, "cudnnDestroyFilterDescriptor");
                                 sym(&d.set_filter_4d, "cudnnSetFilter4dDescriptor");
                                 sym(&d.create_conv, "cudnnCreateConvolutionDescriptor");
                                 sym(&d.destroy_conv, "cudnnDestroyConvolutionDescriptor");
                                 sym(&d.set_conv_2d, "cudnnSetConvolution2dDescriptor");
                                 sym(&d.set_conv_math, "cudnnSetConvolutionMathType");
                                 sym(&d.forward_algorithms, "cudnnGetConvolutionForwardAlgorithm_v7");
                                 sym(&d.forward_workspace, "cudnnGetConvolutionForwardWorkspaceSize");
                                 sym(&d.backward_data_algorithms, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
                                 sym(&d.backward_data_workspace, "cudnnGetConvolutionBackwardDataWorkspaceSize");
                                 sym(&d.backward_filter_algorithms, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
                                 sym(&d.backward_filter_workspace, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
                                 sym(&d.convolution_forward, "cudnnConvolutionForward");
                                 sym(&d.convolution_backward_data, "cudnnConvolutionBackwardData");
                                 sym(&d.convolution_backward_filter, "cudnnConvolutionBackwardFilter");
                               }));
  return Status::Ok();
}

Result<const CudaLibs*> LoadCudaLibs() {
  // Once per process (a magic static: thread-safe); a failure is kept too,
  // so every GPU backend that asks gets the same error without retrying.
  static const auto loaded = [] {
    static CudaLibs libs;
    Status s = OpenCudaLibs(CublasSoname(), CudnnSoname(), &libs);
    return s.ok() ? Result<const CudaLibs*>(&libs) : Result<const CudaLibs*>(std::move(s));
  }();
  return loaded;
}

}  // namespace gpufeed::trainer
