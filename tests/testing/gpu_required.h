// How a GPU test case that finds no usable GPU ends. On a machine without one
// (CI) it skips; on the GPU host, where scripts/gpu-host-* run the tests with
// GPUFEED_REQUIRE_GPU=1, the same condition (no device, a CUDA or decoder
// initialisation error, a silent fallback to the CPU twins) fails the case,
// so a broken GPU path cannot read as "skipped".
//   if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << ops.status().ToString() << ")");
#ifndef GPUFEED_TESTS_TESTING_GPU_REQUIRED_H_
#define GPUFEED_TESTS_TESTING_GPU_REQUIRED_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace gpufeed::testing {

inline bool GpuRequired() {
  const char* v = std::getenv("GPUFEED_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace gpufeed::testing

// `why` is streamed (it may hold `<<`). Returns from the calling function
// (a test body or SetUp), as GTEST_SKIP and FAIL do.
#define GPUFEED_GPU_UNAVAILABLE(why)                                                                 \
  do {                                                                                               \
    if (::gpufeed::testing::GpuRequired()) {                                                         \
      FAIL() << "GPUFEED_REQUIRE_GPU=1 (a GPU host), and this GPU case cannot run: " << why;         \
    } else {                                                                                         \
      GTEST_SKIP() << why << "; the GPU case runs on the GPU host (GPUFEED_REQUIRE_GPU=1 fails it)"; \
    }                                                                                                \
  } while (0)

#endif  // GPUFEED_TESTS_TESTING_GPU_REQUIRED_H_
