// The loader's decode stage (decode_stage.h).
#include "loader/decode_stage.h"

#include <tbb/parallel_for.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/first_error.h"
#include "loader/batch_pool.h"
#include "loader/sampler.h"

namespace gpufeed::loader {

DecodeStage::DecodeStage(const ChunkSource& source, std::shared_ptr<const SampleDecoder> decoder,
                         std::shared_ptr<Logger> logger)
    : source_(source), decoder_(std::move(decoder)), logger_(std::move(logger)) {}

Status DecodeStage::Decode(const Where& where, uint64_t sample, const DecodeContext& context, std::span<std::byte> dst,
                           uint64_t* delivered) const {
  *delivered = sample;
  if (decoder_ == nullptr) return Status::Internal(source_.name() + ": encoded samples and no decoder for them");
  const uint64_t first = where.chunk * source_.chunk_samples();
  const uint64_t count = source_.samples_in_chunk(where.chunk);
  auto decode = [&](uint64_t k) -> Status {
    auto bytes = source_.EncodedBytes(where.chunk_bytes, where.chunk, k);
    if (!bytes.ok()) return bytes.status();
    return decoder_->Decode(*bytes, k, context, dst);
  };
  Status st = decode(sample);
  if (st.ok() || st.code() == StatusCode::kInternal) return st;
  if (!decoder_->replaces_corrupt()) {
    return Status::Corrupt(source_.sample_name(sample) + ": " + st.message() +
                           " (--skip-corrupt / DecodeOptions::skip_corrupt replaces corrupt samples)");
  }
  for (uint64_t step = 1; step < count; ++step) {
    const uint64_t k = first + (sample - first + step) % count;
    if (decode(k).ok()) {
      LoggerOr(logger_).Log(
          LogLevel::kWarning, "sample_replaced",
          source_.sample_name(sample) + " skipped (" + st.message() + "); replaced by sample " + std::to_string(k));
      *delivered = k;
      return Status::Ok();
    }
  }
  return Status::Corrupt(source_.sample_name(sample) + ": " + st.message() + "; and no sample of its chunk " +
                         std::to_string(where.chunk) + " decodes to replace it");
}

Status DecodeStage::DecodeBatch(std::span<const Where> where, uint64_t count, const DecodeContext& context,
                                const BatchOptions& options, Batch::Slot& slot, BatchCounts* counts) const {
  *counts = BatchCounts{};
  if (decoder_ == nullptr) return Status::Internal(source_.name() + ": encoded samples and no decoder for them");
  const uint64_t sb = source_.sample_bytes();
  const std::vector<int64_t>& labels = source_.labels();
  FirstError first_error;  // the first sample that failed, by time
  std::atomic<uint64_t> skipped{0};
  auto fail = [&](Status st) { first_error.Set(std::move(st)); };
  // Sample i decoded here into `at` (its replacement's index and label
  // when one is replaced).
  auto decode_here = [&](uint64_t i, std::byte* at) {
    uint64_t delivered = slot.indices[i];
    const bool timed = options.decode_ns != nullptr;
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    Status ds = Decode(where[i], slot.indices[i], context, std::span(at, sb), &delivered);
    if (timed) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
      options.decode_ns->fetch_add(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
      options.decodes->fetch_add(1, std::memory_order_relaxed);
    }
    if (!ds.ok()) return fail(std::move(ds));
    if (delivered != slot.indices[i]) skipped.fetch_add(1, std::memory_order_relaxed);
    slot.indices[i] = delivered;
    slot.labels[i] = labels.empty() ? -1 : labels[delivered];
  };
  slot.deferred = options.defer;
  if (!options.defer) {
    // One by one into the slot, in parallel over the batch's samples (a
    // batch may draw on a single chunk).
    tbb::parallel_for(uint64_t{0}, count, [&](uint64_t i) { decode_here(i, slot.images.data() + i * sb); });
    counts->skipped = skipped.load();
    return first_error.Get();
  }
  // 1. Each sample's bytes, header and crop, in parallel.
  struct Planned {
    std::span<const std::byte> bytes;
    DevicePlan plan;
  };
  std::vector<Planned> plans(count);
  tbb::parallel_for(uint64_t{0}, count, [&](uint64_t i) {
    auto bytes = source_.EncodedBytes(where[i].chunk_bytes, where[i].chunk, slot.indices[i]);
    if (!bytes.ok()) return fail(bytes.status());
    plans[i].bytes = *bytes;
    Status st = decoder_->PlanDevice(*bytes, slot.indices[i], context, &plans[i].plan);
    if (!st.ok()) fail(std::move(st));
  });
  GPUFEED_RETURN_IF_ERROR(first_error.Get());
  // 2. Places in the slot, in order: a sample goes encoded when its bytes fit
  // with room left for every later sample decoded (sample_bytes() each), so
  // the slot never overflows whatever the sizes.
  if (slot.encoded.size() < count) slot.encoded.resize(count);
  const uint64_t room = slot.images.bytes();
  uint64_t used = 0;
  auto by_share = [&](uint64_t index) {
    if (options.host_share <= 0) return false;
    Rng r(context.seed ^ (context.epoch * 0x9E3779B97F4A7C15ull) ^ (index * 0xD1B54A32D192ED03ull));
    return double(r.Next() >> 11) * (1.0 / 9007199254740992.0) < options.host_share;
  };
  for (uint64_t i = 0; i < count; ++i) {
    const DevicePlan& p = plans[i].plan;
    const uint64_t size = plans[i].bytes.size();
    EncodedSample& e = slot.encoded[i];
    e = EncodedSample{};
    e.offset = used;
    const uint64_t later = (count - i - 1) * sb;
    const bool takes = p.device_decodable && size > 0;
    if (takes && by_share(slot.indices[i])) {
      used += sb;
      ++counts->balanced;
    } else if (takes && used + size + later <= room) {
      e.bytes = size;
      e.height = p.height;
      e.width = p.width;
      e.crop = p.crop;
      used += e.bytes;
      ++counts->deferred;
    } else {
      used += sb;
      counts->host_reason = p.device_decodable ? "larger than the slot's room" : p.why_not;
    }
  }
  // 3. Copies and host decodes, in parallel.
  tbb::parallel_for(uint64_t{0}, count, [&](uint64_t i) {
    const EncodedSample& e = slot.encoded[i];
    std::byte* at = slot.images.data() + e.offset;
    if (e.bytes > 0) {
      std::memcpy(at, plans[i].bytes.data(), e.bytes);
    } else {
      decode_here(i, at);
    }
  });
  counts->skipped = skipped.load();
  return first_error.Get();
}

}  // namespace gpufeed::loader
