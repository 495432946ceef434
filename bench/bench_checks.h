// The checks the benchmarks make before they print a figure, as functions of
// what was delivered (indices, hashes, output values), so that a test can hand
// them a wrong result and see it refused (tests/bench/bench_checks_test.cc).
// Each returns Corrupt naming the first sample that is wrong.
#ifndef GPUFEED_BENCH_BENCH_CHECKS_H_
#define GPUFEED_BENCH_BENCH_CHECKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/dtype.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/status.h"

namespace gpufeed::bench {

// Deliveries per sample index of one epoch (or of the union of its ranks).
class IndexTally {
 public:
  explicit IndexTally(uint64_t num_samples) : count_(num_samples, 0) {}
  // Corrupt for an index outside the dataset.
  Status Add(uint64_t index);
  Status Add(std::span<const uint64_t> indices);
  uint64_t delivered() const { return delivered_; }
  uint64_t num_samples() const { return count_.size(); }
  const std::vector<uint32_t>& counts() const { return count_; }

 private:
  std::vector<uint32_t> count_;
  uint64_t delivered_ = 0;
};

// What an epoch promised, and so what is checked:
//  - kEveryIndexOnce: a whole epoch of one rank (or the union of ranks with
//    drop_last): every index exactly once;
//  - kNoIndexDoubled: a partial epoch (--batches), or ranks' union with
//    drop_last (indices cut to whole batches): none twice, `expected`
//    deliveries;
//  - kPadded: the union of `ranks` ranks without drop_last: every index at
//    least once, and exactly ranks x ceil(N / ranks) - N repeats (the
//    padding, as PyTorch's DistributedSampler).
enum class Coverage { kEveryIndexOnce, kNoIndexDoubled, kPadded };
struct CoverageClaim {
  Coverage kind = Coverage::kEveryIndexOnce;
  uint64_t expected = 0;  // deliveries (kNoIndexDoubled); ranks (kPadded)
};
Status CheckCoverage(const IndexTally& tally, const CoverageClaim& claim, const std::string& what);
// The claim in words, for the report ("every index once", "no index doubled
// (250 of 2000 samples)", "the union of 4 ranks: every index, 2 padded
// repeats").
std::string DescribeCoverage(const IndexTally& tally, const CoverageClaim& claim);

// bench read: every timed pass's per-sample hashes equal the reference's.
Status CompareHashes(std::span<const uint64_t> got, std::span<const uint64_t> want, const std::string& what);

// bench feed, echo: the output batches of one upload. Pass 0 lists the
// upload's samples; every later pass must be a permutation of them, and
// there must be `echo` passes (`exact`), or at most `echo` (the feed's auto
// echo, which runs at 1 while it measures).
class EchoCheck {
 public:
  EchoCheck(int echo, bool exact) : echo_(echo), exact_(exact) {}
  // One output batch, in delivery order: its upload (DeviceBatch::upload()),
  // pass and row indices. A batch of another upload than the last one's
  // starts the next upload (the previous is checked then); uploads come in
  // increasing order. (A pass-0 batch after a later pass is not enough: with
  // auto echo an upload used once is followed by pass-0 batches of the next.)
  Status Add(uint64_t upload, int pass, std::span<const uint64_t> indices);
  Status Finish();  // checks the last upload
  uint64_t uploads() const { return uploads_; }

 private:
  Status CheckUpload();
  int echo_;
  bool exact_;
  int last_pass_ = -1;
  bool started_ = false;      // a batch was added
  uint64_t last_upload_ = 0;  // its upload
  uint64_t uploads_ = 0;
  std::vector<std::vector<uint64_t>> passes_;  // this upload's indices per pass
};

// bench feed: the output sample the feed made from a uint8 sample, as the
// transform's contract defines it, computed here independently of the
// feed's code: per channel (x - mean) * inv_std in fp32 (mean and inv_std as
// the feed takes them: float(mean), float(1 / std)), an optional crop with
// zero padding (offsets dy, dx in [-padding, padding]) and horizontal flip,
// from `in_layout` to `out_layout`, in `dtype`. The crop and flip are not
// known here (the feed draws them): every one the options allow is tried,
// and the sample passes if one matches every element. Tolerances: fp32
// exact; fp16 within 2^-11 of the value (its round-to-nearest half ulp) or
// 2^-25 absolute; bf16 within 2^-8 of the value.
struct FeedSampleSpec {
  int channels = 0, height = 0, width = 0;
  Layout in_layout = Layout::kNCHW, out_layout = Layout::kNCHW;
  DType dtype = DType::kFloat32;
  std::vector<float> mean, inv_std;  // per channel
  int crop_padding = 0;
  bool flip = false;
  uint64_t out_sample_bytes() const;
};
// `got` is one output sample (out_sample_bytes()); `stored` the dataset's
// sample (channels x height x width uint8 in in_layout). *crop gets the
// crop and flip that matched ("dy -2 dx 1 flipped").
Status CheckFeedSample(const FeedSampleSpec& spec, const uint8_t* stored, const void* got, const std::string& what,
                       std::string* crop = nullptr);

// An output element (fp32, fp16 or bf16 bits) as a float.
float OutputValue(DType dtype, const void* row, uint64_t element);

// bench loader --decode: a fed image (bf16/fp16/fp32, `spec` without crop or
// flip) against the CPU decode of the same sample (`reference`, uint8 in
// spec.in_layout): the mean absolute difference in levels of 255, after
// undoing the normalization, must be at most `max_mean_levels` (the GPU's
// decoder and resize are not libjpeg-turbo's bit for bit).
Status CheckDecodedSample(const FeedSampleSpec& spec, const uint8_t* reference, const void* got, double max_mean_levels,
                          const std::string& what, double* mean_levels = nullptr);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_BENCH_CHECKS_H_
