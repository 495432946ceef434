// The epoch plan: which samples this rank sees, in which order, grouped into
// batches, and which chunks each batch touches. A pure function of its inputs
// (no global RNG, no std:: distributions, whose output differs between
// standard libraries), so every rank, thread count and platform agrees.
#ifndef GPUFEED_LOADER_SAMPLER_H_
#define GPUFEED_LOADER_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "gpufeed/loader.h"

namespace gpufeed::loader {

// Counter-based 64-bit generator (splitmix64): deterministic everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n) by Lemire's multiply-shift (bias < n / 2^64).
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64); }

 private:
  uint64_t state_;
};

template <typename T>
void FisherYates(std::vector<T>& v, Rng& rng) {
  for (uint64_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.Below(i)]);
}

// The order of all n samples in an epoch (identical on every rank). With
// kBlock, windows never straddle a multiple of `shard_samples` (the ranks'
// contiguous shares; 0: no shards): a rank's share is made of whole windows
// of its own chunks, so two ranks share at most the one chunk cut by their
// boundary instead of every chunk of a window.
std::vector<uint64_t> GlobalOrder(uint64_t n, uint64_t chunk_samples, Order order, uint64_t seed, uint64_t epoch,
                                  uint64_t shuffle_window, uint64_t shard_samples = 0);

struct EpochPlan {
  std::vector<uint64_t> samples;  // this rank's samples, in delivery order
  uint64_t batch_size = 0;
  uint64_t num_batches = 0;
  // Per batch, the distinct chunks it touches (in first-use order).
  std::vector<std::vector<uint32_t>> batch_chunks;
  // Per chunk, the batches that touch it, ascending.
  std::vector<std::vector<uint32_t>> chunk_users;

  uint64_t batch_first(uint64_t b) const { return b * batch_size; }
  uint64_t batch_count(uint64_t b) const { return std::min(batch_size, samples.size() - b * batch_size); }
};

// Samples in each rank's share of `epoch` (every rank's is the same size):
// the contiguous share of the epoch's order, or of the samples a reshard
// left (o.reshard, for its epoch); drop_last rounds down to whole batches,
// else it is rounded up (the short shares padded).
uint64_t RankShare(uint64_t num_samples, const LoaderOptions& o, uint64_t epoch);

// Builds the plan for one rank, or fails with InvalidArgument for bad options
// (batch_size 0, rank outside [0, world_size), ...).
Result<EpochPlan> MakeEpochPlan(uint64_t num_samples, uint64_t chunk_samples, uint64_t num_chunks,
                                const LoaderOptions& options, uint64_t epoch);

}  // namespace gpufeed::loader

#endif  // GPUFEED_LOADER_SAMPLER_H_
