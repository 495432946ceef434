// The per-channel accumulator behind ComputeStats (gpufeed/stats.h) and
// Convert's mean/std: one implementation, used by both.
#ifndef GPUFEED_CONVERT_CHANNEL_STATS_H_
#define GPUFEED_CONVERT_CHANNEL_STATS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpufeed/dtype.h"
#include "gpufeed/stats.h"

namespace gpufeed::stats {

// Where the channel axis is in a sample: `channels` runs of `inner`
// contiguous elements, repeated `outer` times.
struct Geometry {
  uint64_t outer = 1, channels = 1, inner = 1;
};
// channel_axis -1: one channel, the whole sample. Requires axis < rank.
Geometry GeometryOf(const std::vector<uint64_t>& sample_shape, int channel_axis);

// Count, mean and sum of squared deviations (M2) of one channel's finite
// values, with min/max and the non-finite values seen.
struct Moments {
  uint64_t n = 0;
  double mean = 0, m2 = 0;
  double min = 0, max = 0;  // valid when n > 0
  uint64_t nan = 0, inf = 0;
  // Chan et al.'s pairwise update: exact in exact arithmetic, stable in
  // floating point (no catastrophic sum-of-squares cancellation).
  void Merge(const Moments& o);
};

class Accumulator {
 public:
  Accumulator() = default;
  Accumulator(DType dtype, Geometry g);
  // False for dtypes without statistics (bfloat16).
  static bool Supports(DType dtype);
  // Adds `samples` consecutive samples starting at `data`.
  void Add(const std::byte* data, uint64_t samples);
  // Merges another accumulator of the same dtype and geometry.
  void Merge(const Accumulator& o);
  const std::vector<Moments>& moments() const { return m_; }
  std::vector<ChannelStats> Result() const;

 private:
  template <typename T>
  void AddInt(const std::byte* data, uint64_t samples);
  template <typename T>
  void AddFloat(const std::byte* data, uint64_t samples);

  DType dtype_ = DType::kUInt8;
  Geometry g_;
  std::vector<Moments> m_;
};

}  // namespace gpufeed::stats

#endif  // GPUFEED_CONVERT_CHANNEL_STATS_H_
