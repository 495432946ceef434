// Synthetic CelebA-like samples (docs/benchmarks.md, Workloads): uint8 NCHW
// [3, 218, 178], labels in [0, 40). Per sample, uniform bytes over 8x8
// patches (a [3, 28, 23] grid cropped to 218x178) plus uniform noise in
// [0, 8), wrapping: some structure and deflate ~1.1x, like real photos.
// Deterministic in (seed, sample index), so any chunk can be made by any
// thread in any order, and the first 8 bytes of sample k hold k so readers
// can verify what they got.
#ifndef GPUFEED_BENCH_SYNTHETIC_SOURCE_H_
#define GPUFEED_BENCH_SYNTHETIC_SOURCE_H_

#include <memory>

#include "gpufeed/convert.h"

namespace gpufeed::bench {

std::unique_ptr<SampleSource> MakeCelebaLikeSource(uint64_t num_samples, uint64_t seed = 1);

// Named workloads: "celeba-raw", "celeba-deflate", "celeba-zstd". Fills the
// write options (codec, level, 100 samples a chunk).
Status WorkloadWriteOptions(const std::string& name, WriteOptions* out);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_SYNTHETIC_SOURCE_H_
