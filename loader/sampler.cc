// Sample orders (sequential, random, block), sharding and batch planning.
#include "loader/sampler.h"

#include <algorithm>

#include "common/memory.h"
#include "common/sizes.h"

namespace gpufeed::loader {

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<uint64_t> GlobalOrder(uint64_t n, uint64_t chunk_samples, Order order, uint64_t seed, uint64_t epoch,
                                  uint64_t shuffle_window, uint64_t shard_samples) {
  std::vector<uint64_t> out;
  out.reserve(n);
  // Mix seed and epoch so that (seed, epoch) pairs give unrelated streams.
  Rng rng(Rng(seed ^ 0x5851F42D4C957F2Dull).Next() ^ Rng(epoch + 0x14057B7EF767814Full).Next());
  switch (order) {
    case Order::kSequential:
      for (uint64_t i = 0; i < n; ++i) out.push_back(i);
      break;
    case Order::kRandom:
      for (uint64_t i = 0; i < n; ++i) out.push_back(i);
      FisherYates(out, rng);
      break;
    case Order::kBlock: {
      const uint64_t k = std::max<uint64_t>(1, chunk_samples);
      const uint64_t chunks = (n + k - 1) / k;
      std::vector<uint64_t> chunk_order(chunks);
      for (uint64_t c = 0; c < chunks; ++c) chunk_order[c] = c;
      FisherYates(chunk_order, rng);
      for (uint64_t c : chunk_order) {
        for (uint64_t s = c * k; s < std::min(n, (c + 1) * k); ++s) out.push_back(s);
      }
      // Windows of w chunk pieces, restarting at every shard boundary (a
      // chunk cut by one is a piece on each side); samples are shuffled
      // within a window.
      const uint64_t w = std::max<uint64_t>(1, shuffle_window);
      const uint64_t shard = shard_samples == 0 ? n : shard_samples;
      auto shuffle = [&](uint64_t from, uint64_t to) {
        std::vector<uint64_t> window(out.begin() + from, out.begin() + to);
        FisherYates(window, rng);
        std::copy(window.begin(), window.end(), out.begin() + from);
      };
      uint64_t begin = 0, pieces = 0;
      for (uint64_t p = 0; p < n; ++p) {
        const bool shard_start = p % shard == 0;
        if (p == 0 || shard_start || out[p] / k != out[p - 1] / k) {  // a piece starts
          if (p > begin && (shard_start || pieces == w)) {
            shuffle(begin, p);
            begin = p;
            pieces = 0;
          }
          ++pieces;
        }
      }
      shuffle(begin, n);
      break;
    }
  }
  return out;
}

uint64_t RankShare(uint64_t num_samples, const LoaderOptions& o, uint64_t epoch) {
  const uint64_t world = static_cast<uint64_t>(std::max(1, o.world_size));
  const uint64_t n =
      o.reshard.world_size > 0 && o.reshard.epoch == epoch ? ReshardRemaining(num_samples, o.reshard) : num_samples;
  if (o.drop_last) return o.batch_size == 0 ? 0 : n / world / o.batch_size * o.batch_size;
  return (n + world - 1) / world;
}

Result<EpochPlan> MakeEpochPlan(uint64_t num_samples, uint64_t chunk_samples, uint64_t num_chunks,
                                const LoaderOptions& o, uint64_t epoch) {
  if (o.batch_size == 0) return Status::InvalidArgument("loader: batch size must be at least 1 (--batch-size)");
  if (o.threads < 0) {
    return Status::InvalidArgument("loader: threads is " + std::to_string(o.threads) +
                                   "; use 0 (all cores) or a positive count (--threads)");
  }
  if (o.prefetch < 1) {
    return Status::InvalidArgument("loader: prefetch is " + std::to_string(o.prefetch) +
                                   "; at least 1 batch must be in flight (--prefetch)");
  }
  if (o.order == Order::kBlock && o.shuffle_window == 0) {
    return Status::InvalidArgument("loader: shuffle window must be at least 1 chunk (--shuffle-window)");
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Status::InvalidArgument("loader: rank " + std::to_string(o.rank) + " outside world of " +
                                   std::to_string(o.world_size));
  }
  if (num_samples == 0) return Status::InvalidArgument("loader: the source has no samples");
  if (num_chunks >= (1ull << 32)) {
    return Status::Unsupported("loader: " + std::to_string(num_chunks) +
                               " chunks (at most 2^32 - 1); rechunk with more samples per chunk (gpufeed convert "
                               "--chunk-samples)");
  }
  // The plan is held in memory: the epoch's order (16 bytes a sample with the
  // rank's copy), the chunk -> batches index and the batch -> chunks lists.
  const auto order_bytes = CheckedMul(num_samples, 16);
  const auto index_bytes = CheckedMul(num_chunks, 48);
  const auto plan_bytes = order_bytes && index_bytes ? CheckedAdd(*order_bytes, *index_bytes) : std::nullopt;
  GPUFEED_RETURN_IF_ERROR(CheckFitsInMemory(
      plan_bytes.value_or(UINT64_MAX), "loader: the epoch plan of " + std::to_string(num_samples) + " samples",
      "gpufeed keeps each epoch's sample order in memory; is the dataset's declared shape right?"));
  const uint64_t world = static_cast<uint64_t>(o.world_size);
  EpochPlan plan;
  plan.batch_size = o.batch_size;
  const LoaderOptions::Reshard& rs = o.reshard;
  if (rs.world_size > 0 && rs.epoch == epoch) {
    // A run saved at rs.world_size ranks continues here: the samples none of
    // its ranks received, in their order, cut into this run's shares.
    if (rs.consumed > rs.share || rs.share > num_samples) {
      return Status::InvalidArgument("loader: a saved state's shard (" + std::to_string(rs.consumed) + " of " +
                                     std::to_string(rs.share) + " samples at " + std::to_string(rs.world_size) +
                                     " ranks) does not fit a source of " + std::to_string(num_samples) +
                                     " samples: is it this dataset's state?");
    }
    const std::vector<uint64_t> global = GlobalOrder(num_samples, chunk_samples, o.order, o.seed, epoch,
                                                     o.shuffle_window, rs.world_size > 1 ? rs.share : 0);
    std::vector<uint64_t> left;
    left.reserve(ReshardRemaining(num_samples, rs));
    for (uint64_t r = 0; r < rs.world_size; ++r) {
      for (uint64_t p = r * rs.share + rs.consumed; p < (r + 1) * rs.share && p < num_samples; ++p) {
        left.push_back(global[p]);
      }
    }
    const uint64_t m = left.size();
    const uint64_t per_rank = o.drop_last ? m / world / o.batch_size * o.batch_size : (m + world - 1) / world;
    const uint64_t start = static_cast<uint64_t>(o.rank) * per_rank;
    plan.samples.reserve(per_rank);
    for (uint64_t p = start; p < start + per_rank && m > 0; ++p) plan.samples.push_back(left[p % m]);
  } else {
    // Contiguous shards of the global order: with kBlock a rank's share is
    // made of whole windows, so ranks do not read each other's chunks (but
    // the one cut by a shard boundary).
    const uint64_t per_rank = RankShare(num_samples, o, epoch);
    const std::vector<uint64_t> global =
        GlobalOrder(num_samples, chunk_samples, o.order, o.seed, epoch, o.shuffle_window, world > 1 ? per_rank : 0);
    const uint64_t start = static_cast<uint64_t>(o.rank) * per_rank;
    plan.samples.reserve(per_rank);
    for (uint64_t p = start; p < start + per_rank; ++p) plan.samples.push_back(global[p % num_samples]);
  }
  plan.num_batches = (plan.samples.size() + o.batch_size - 1) / o.batch_size;
  if (plan.num_batches >= (1ull << 32)) return Status::Unsupported("loader: more than 2^32 batches");

  const uint64_t k = std::max<uint64_t>(1, chunk_samples);
  plan.batch_chunks.resize(plan.num_batches);
  plan.chunk_users.assign(num_chunks, {});
  std::vector<uint32_t> last_user(num_chunks, UINT32_MAX);
  for (uint64_t b = 0; b < plan.num_batches; ++b) {
    for (uint64_t i = plan.batch_first(b); i < plan.batch_first(b) + plan.batch_count(b); ++i) {
      const uint64_t c = plan.samples[i] / k;
      if (last_user[c] != b) {
        last_user[c] = static_cast<uint32_t>(b);
        plan.batch_chunks[b].push_back(static_cast<uint32_t>(c));
        plan.chunk_users[c].push_back(static_cast<uint32_t>(b));
      }
    }
  }
  return plan;
}

}  // namespace gpufeed::loader

namespace gpufeed {

uint64_t ReshardRemaining(uint64_t num_samples, const LoaderOptions::Reshard& r) {
  // From a saved state or the wire: a share larger than the source is not
  // this source's (MakeEpochPlan refuses it), and must not overflow here.
  if (r.share > num_samples || r.world_size > (1u << 24)) return 0;
  uint64_t left = 0;
  for (uint64_t k = 0; k < r.world_size; ++k) {
    const uint64_t from = k * r.share + r.consumed, to = std::min((k + 1) * r.share, num_samples);
    if (from < to) left += to - from;
  }
  return left;
}

void DescribeShard(uint64_t num_samples, const LoaderOptions& o, LoaderState* s) {
  s->world_size = static_cast<uint32_t>(std::max(1, o.world_size));
  s->share = loader::RankShare(num_samples, o, s->epoch);
  s->base = o.reshard.world_size > 0 && o.reshard.epoch == s->epoch ? o.reshard : LoaderOptions::Reshard{};
  uint64_t consumed = 0;
  s->consumed =
      __builtin_mul_overflow(s->next_batch, o.batch_size, &consumed) ? s->share : std::min(consumed, s->share);
  s->order = o.order;
  s->shuffle_window = o.shuffle_window;
  s->num_samples = num_samples;
}

Status CheckStateFits(const LoaderState& s, uint64_t num_samples, const LoaderOptions& o) {
  // Worded by option (LoaderOptions::seed): the C API, the CLI and Python
  // each name it as their caller spells it.
  const std::string fix = ": resume it with the run's options, or start this loader without the state";
  if (s.seed != o.seed) {
    return Status::InvalidArgument("loader: the state is of a run with seed " + std::to_string(s.seed) +
                                   ", this loader has seed " + std::to_string(o.seed) + " (LoaderOptions::seed)" + fix);
  }
  if (s.order && *s.order != o.order) {
    return Status::InvalidArgument("loader: the state is of a run with order '" + std::string(OrderName(*s.order)) +
                                   "', this loader has order '" + std::string(OrderName(o.order)) +
                                   "' (LoaderOptions::order)" + fix);
  }
  if (s.order == Order::kBlock && s.shuffle_window != 0 && s.shuffle_window != o.shuffle_window) {
    return Status::InvalidArgument("loader: the state is of a run with shuffle window " +
                                   std::to_string(s.shuffle_window) + ", this loader has " +
                                   std::to_string(o.shuffle_window) + " (LoaderOptions::shuffle_window)" + fix);
  }
  if (s.num_samples != 0 && s.num_samples != num_samples) {
    return Status::InvalidArgument("loader: the state is of a run over a dataset of " + std::to_string(s.num_samples) +
                                   " samples, this loader's has " + std::to_string(num_samples) +
                                   ": resume it over the run's dataset");
  }
  return Status::Ok();
}

Result<LoaderOptions::Reshard> ReshardFor(const LoaderState& s, const LoaderOptions& o) {
  const auto world = static_cast<uint32_t>(std::max(1, o.world_size));
  // Batches of another size: the saved batch count no longer says how many
  // samples were received (next_batch x 256 is not next_batch x 100), also
  // at the epoch's end (all received: nothing is left, where batch
  // next_batch of smaller batches would deliver the epoch's tail again).
  const uint64_t b = o.batch_size;
  const bool batch_moved = s.world_size > 0 && b > 0 &&
                           (std::min(s.next_batch * b, s.share) != s.consumed || s.next_batch > (s.share + b - 1) / b);
  if (s.world_size == 0 || (s.world_size == world && !batch_moved)) {
    // The same world size and batch size (or an old state that does not
    // say): the same shares, the epoch from its batch; a resharded epoch as
    // it was.
    return s.world_size == world ? s.base : LoaderOptions::Reshard{};
  }
  if (s.base.world_size > 0 && s.world_size == world) {
    return Status::InvalidArgument("loader: the state was saved at " + std::to_string(s.consumed) + " samples after " +
                                   std::to_string(s.next_batch) + " batches, mid-way through an epoch that itself " +
                                   "resumed another run; resume it at that batch size, or from a state saved at " +
                                   "the end of an epoch");
  }
  if (s.base.world_size > 0) {
    return Status::InvalidArgument(
        "loader: the state was saved at " + std::to_string(s.world_size) + " ranks, mid-way through an epoch that " +
        "itself resumed a run of " + std::to_string(s.base.world_size) + " ranks; resume it at " +
        std::to_string(s.world_size) + " ranks, or from a state saved at the end of an epoch");
  }
  if (s.consumed > s.share) {
    return Status::InvalidArgument("loader: a saved state received " + std::to_string(s.consumed) +
                                   " samples of a share of " + std::to_string(s.share) + " (damaged state?)");
  }
  LoaderOptions::Reshard r;
  r.epoch = s.epoch;
  r.world_size = s.world_size;
  r.share = s.share;
  r.consumed = s.consumed;
  return r;
}

std::vector<uint64_t> EpochOrder(uint64_t num_samples, uint64_t chunk_samples, Order order, uint64_t seed,
                                 uint64_t epoch, uint64_t shuffle_window) {
  return loader::GlobalOrder(num_samples, chunk_samples, order, seed, epoch, shuffle_window);
}

}  // namespace gpufeed
