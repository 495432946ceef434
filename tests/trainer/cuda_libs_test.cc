// cuBLAS and cuDNN loaded at run time (trainer/cuda_libs.h): a missing library
// is an error naming it and what to install; where they are installed every
// entry point resolves to the right function. Needs no GPU.
#include <gtest/gtest.h>

#if GPUFEED_TESTS_HAVE_CUDA

#include <string>

#include "trainer/cuda_libs.h"

namespace gpufeed::trainer {
namespace {

TEST(CudaLibsTest, AMissingCublasIsNamedWithWhatToInstall) {
  CudaLibs libs;
  const Status s = OpenCudaLibs("libcublas-not-here.so.13", CudnnSoname(), &libs);
  ASSERT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  const std::string m = s.message();
  EXPECT_NE(m.find("training on a GPU needs cuBLAS"), std::string::npos) << m;
  EXPECT_NE(m.find("libcublas-not-here.so.13"), std::string::npos) << m;
  EXPECT_NE(m.find("nvidia-cublas"), std::string::npos) << m;
  EXPECT_NE(m.find("LD_LIBRARY_PATH"), std::string::npos) << m;
}

TEST(CudaLibsTest, AMissingCudnnIsNamedWithWhatToInstall) {
  CudaLibs libs;
  const Status s = OpenCudaLibs(CublasSoname(), "libcudnn-not-here.so.9", &libs);
  if (s.message().find("needs cuBLAS") != std::string::npos) GTEST_SKIP() << "no cuBLAS here: " << s.ToString();
  ASSERT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  const std::string m = s.message();
  EXPECT_NE(m.find("training on a GPU needs cuDNN"), std::string::npos) << m;
  EXPECT_NE(m.find("libcudnn-not-here.so.9"), std::string::npos) << m;
  EXPECT_NE(m.find("nvidia-cudnn-cu"), std::string::npos) << m;
}

TEST(CudaLibsTest, TheHostsLibrariesResolveEveryEntryPoint) {
  auto libs = LoadCudaLibs();
  if (!libs.ok()) GTEST_SKIP() << "cuBLAS or cuDNN not installed here: " << libs.status().ToString();
  EXPECT_EQ(std::string(CublasSoname()), "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
  EXPECT_EQ(std::string(CudnnSoname()), "libcudnn.so." + std::to_string(CUDNN_MAJOR));
  const CudaLibs& l = **libs;
  // Calls that need no GPU, so the tables point at the named functions.
  EXPECT_STREQ(l.blas.status_name(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_EQ(l.dnn.get_version() / 10000, size_t{CUDNN_MAJOR});
  EXPECT_NE(std::string(l.dnn.error_string(CUDNN_STATUS_BAD_PARAM)), "");
  EXPECT_EQ(LoadCudaLibs().value(), &l);  // loaded once
}

}  // namespace
}  // namespace gpufeed::trainer

#else

TEST(CudaLibsTest, BuiltWithoutCuda) { GTEST_SKIP() << "a CPU-only build loads no CUDA library"; }

#endif  // GPUFEED_TESTS_HAVE_CUDA
