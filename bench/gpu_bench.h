// GPU-side benchmarks (`gpufeed bench h2d|kernel|feed`). Each checks what it
// produced before it reports, and reports a ratio to a ceiling measured in
// the same run: pinned host->device bandwidth for copies, device memory
// bandwidth (a device-to-device copy, bytes read + written) for the
// transform, the loader alone for the feed. In a build without CUDA, or on a
// machine without a GPU, they return Unsupported saying so.
#ifndef GPUFEED_BENCH_GPU_BENCH_H_
#define GPUFEED_BENCH_GPU_BENCH_H_

#include <string>

#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"

namespace gpufeed::bench {

struct H2dResult {
  double pinned_gb_per_s = 0;  // one large pinned buffer, repeated copies (the ceiling)
  double pool_gb_per_s = 0;    // batch-sized pinned pool slots into rotating device slots
  double pageable_gb_per_s = 0;
  uint64_t batch_bytes = 0;
  double ratio() const { return pool_gb_per_s / pinned_gb_per_s; }
};
Result<H2dResult> RunH2dBench(uint64_t batch_bytes, int slots);

struct KernelResult {
  std::string dtype, layout;
  double kernel_gb_per_s = 0;   // (uint8 read + output written) / time
  double memcpy_gb_per_s = 0;   // device-to-device copy, read + written
  double ms = 0;
  double ratio() const { return kernel_gb_per_s / memcpy_gb_per_s; }
};
// A CelebA-sized batch (B x 3 x 218 x 178) through the fused transform, after
// checking it bit for bit against the CPU reference.
Result<std::vector<KernelResult>> RunKernelBench(int batch);

struct FeedBenchOptions {
  // A `bench gen` file, or a daemon address serving one (dataset, token_file
  // as for the loader bench; the file must be readable here to verify).
  std::string data;
  std::string dataset, token_file;
  LoaderOptions loader;
  FeedOptions feed;
  int epochs = 2;  // the last is reported
};
struct FeedBenchResult {
  double loader_samples_per_s = 0;  // loader alone, same options, same run
  FeedStats stats;                  // last epoch through the feeder
  double seconds = 0;
  uint64_t verified_samples = 0;
  double fresh_share() const { return stats.fresh_samples / seconds / loader_samples_per_s; }
};
Result<FeedBenchResult> RunFeedBench(const FeedBenchOptions& options);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_GPU_BENCH_H_
