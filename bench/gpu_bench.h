// GPU-side benchmarks (`gpufeed bench h2d|kernel|feed`). Each checks what it
// produced before it reports, and reports a ratio to a ceiling measured in
// the same run: pinned host->device bandwidth for copies, device memory
// bandwidth (a device-to-device copy, bytes read + written) for the
// transform, the loader alone for the feed. In a build without CUDA, or on a
// machine without a GPU, they return Unsupported saying so.
#ifndef GPUFEED_BENCH_GPU_BENCH_H_
#define GPUFEED_BENCH_GPU_BENCH_H_

#include <string>
#include <vector>

#include "gpufeed/encoded.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/hw_timing.h"
#include "gpufeed/loader.h"

namespace gpufeed::bench {

// `bench h2d` and `bench kernel` measure through the library's testing hooks
// (gpufeed/hw_timing.h): they need the pinned pool's allocation and the
// transform kernel with its CPU twin, which are not public API.
using H2dResult = gpufeed::H2dTiming;
using KernelResult = gpufeed::KernelTiming;
inline Result<H2dResult> RunH2dBench(uint64_t batch_bytes, int slots) { return MeasureH2d(batch_bytes, slots); }
inline Result<std::vector<KernelResult>> RunKernelBench(int batch) { return MeasureTransformKernel(batch); }

struct FeedBenchOptions {
  // A `bench gen` file, or a daemon address serving one (dataset, token_file
  // as for the loader bench; the file must be readable here to verify).
  std::string data;
  std::string dataset, token_file;
  LoaderOptions loader;
  FeedOptions feed;
  int epochs = 2;  // each is timed and verified; the last is reported
};
// Every epoch is verified (gpu_bench.cc says how): the timed run's rows by
// index (every index once per fresh pass, echo passes permutations of their
// upload, counts), and an untimed re-run of the same epoch, equal to it
// index for index, by label (every row) and value (one row of every batch
// against an independent CPU reference, bench_checks.h).
struct FeedBenchResult {
  double loader_samples_per_s = 0;  // loader alone, same options, same run
  FeedStats stats;                  // last epoch through the feeder
  double seconds = 0;
  uint64_t timed_samples = 0;     // rows the last (reported) epoch delivered, fresh + echoed
  uint64_t verified_samples = 0;  // rows of every timed epoch checked by index (= their deliveries)
  uint64_t labels_checked = 0;    // rows whose label was compared with the file's
  uint64_t values_checked = 0;    // rows whose values were compared with the CPU reference
  int epochs_verified = 0;
  double fresh_share() const { return stats.fresh_samples / seconds / loader_samples_per_s; }
};
Result<FeedBenchResult> RunFeedBench(const FeedBenchOptions& options);

// `bench loader --decode gpu|auto|cpu` on an encoded image dataset: epochs
// through Loader + GpuFeeder (bf16, the feed's device) with the JPEGs
// decoded where `where` says, then the same number of epochs with the
// loader's CPU decode (the peer in the same run, same threads). Every epoch
// is verified as it is timed: every index once (DeviceBatch::indices()),
// every row's label equal to the file's, and the pixels of one row of every
// 16th batch against the CPU decode of the same sample (DecodeImage, same
// seed, epoch and crop) within kJpegMeanLevels (the GPU's decoder and resize
// are not libjpeg-turbo's bit for bit); with skip_corrupt, pixels are not
// compared (a replaced row holds another sample's).
inline constexpr double kJpegMeanLevels = 2.0;
struct JpegFeedBenchOptions {
  std::string data;
  LoaderOptions loader;
  DecodeOptions decode;
  DecodeDevice where = DecodeDevice::kAuto;
  int device = 0;
  int epochs = 2;
};
struct JpegFeedEpoch {
  double seconds = 0;
  uint64_t samples = 0;
  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
};
struct JpegFeedBenchResult {
  std::string decode;                     // "gpu (nvjpeg hardware)" or "cpu (why)"
  std::vector<JpegFeedEpoch> epochs;      // as asked
  std::vector<JpegFeedEpoch> cpu_epochs;  // the loader's own decode, same run (empty when `decode` is it)
  FeedStats stats;                        // the last epoch's
  LoaderStats loader_stats;               // the last epoch's loader
  uint64_t verified_samples = 0;          // every epoch's rows, by index and label
  uint64_t pixels_checked = 0;            // rows compared with the CPU decode
  double worst_mean_levels = 0;           // the largest mean difference seen, levels of 255
};
Result<JpegFeedBenchResult> RunJpegFeedBench(const JpegFeedBenchOptions& options);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_GPU_BENCH_H_
