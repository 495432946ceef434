// The decode stage as a seam: a source that serves encoded bytes and a
// decoder composed with it, neither of them an image. Samples encode their
// own index (their bytes and the decoder's output both), so a sample
// decoded from the wrong bytes, in the wrong place or for the wrong epoch
// shows.
#include "loader/decode_stage.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "gpufeed/loader.h"
#include "tests/testing/capturing_logger.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

// Sample k is stored as 1 + k % 5 bytes, each k & 0xff (sizes differ, so an
// offset off by one sample shows); chunks of 4 samples.
class EncodedIndexSource final : public ChunkSource {
 public:
  EncodedIndexSource(uint64_t n, std::shared_ptr<const SampleDecoder> decoder) : n_(n), decoder_(std::move(decoder)) {
    offsets_.push_back(0);
    for (uint64_t k = 0; k < n; ++k) offsets_.push_back(offsets_.back() + Stored(k));
    for (uint64_t k = 0; k < n; ++k) labels_.push_back(testing::IndexLabel(k));
  }
  static uint64_t Stored(uint64_t k) { return 1 + k % 5; }

  uint64_t num_samples() const override { return n_; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  uint64_t sample_bytes() const override { return 16; }
  DType dtype() const override { return DType::kUInt8; }
  uint64_t chunk_samples() const override { return kChunk; }
  uint64_t num_chunks() const override { return (n_ + kChunk - 1) / kChunk; }
  uint64_t samples_in_chunk(uint64_t i) const override { return std::min(kChunk, n_ - i * kChunk); }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return chunk_buffer_bytes(i); }
  uint64_t chunk_buffer_bytes(uint64_t i) const override {
    return offsets_[std::min(n_, (i + 1) * kChunk)] - offsets_[i * kChunk];
  }
  uint64_t max_chunk_buffer_bytes() const override { return kChunk * 5; }
  const std::vector<int64_t>& labels() const override { return labels_; }
  std::string name() const override { return "encoded memory"; }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    uint64_t at = 0;
    for (uint64_t k = i * kChunk; k < i * kChunk + samples_in_chunk(i); ++k) {
      std::memset(dst.data() + at, static_cast<int>(k & 0xff), Stored(k));
      at += Stored(k);
    }
    return Status::Ok();
  }
  bool decodes_samples() const override { return true; }
  Result<std::span<const std::byte>> EncodedBytes(std::span<const std::byte> chunk_bytes, uint64_t chunk,
                                                  uint64_t sample) const override {
    const uint64_t first = chunk * kChunk;
    if (sample < first || sample >= first + samples_in_chunk(chunk)) return Status::Internal("outside the chunk");
    return chunk_bytes.subspan(offsets_[sample] - offsets_[first], Stored(sample));
  }
  std::shared_ptr<const SampleDecoder> sample_decoder() const override { return decoder_; }

 private:
  static constexpr uint64_t kChunk = 4;
  uint64_t n_;
  std::shared_ptr<const SampleDecoder> decoder_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> shape_{16};
  std::vector<int64_t> labels_;
};

// Writes [sample, seed ^ epoch] as two uint64; checks the bytes are
// sample's. `corrupt` samples do not decode; even samples are device
// decodable.
class IndexDecoder final : public SampleDecoder {
 public:
  IndexDecoder(std::set<uint64_t> corrupt, bool replace) : corrupt_(std::move(corrupt)), replace_(replace) {}
  std::string name() const override { return "index decoder"; }
  uint64_t sample_bytes() const override { return 16; }
  bool replaces_corrupt() const override { return replace_; }
  Status Decode(std::span<const std::byte> encoded, uint64_t sample, const DecodeContext& context,
                std::span<std::byte> dst) const override {
    if (corrupt_.count(sample)) return Status::Corrupt("injected corrupt stream");
    if (encoded.size() != EncodedIndexSource::Stored(sample)) return Status::Corrupt("not this sample's size");
    for (std::byte b : encoded) {
      if (std::to_integer<uint64_t>(b) != (sample & 0xff)) return Status::Corrupt("not this sample's bytes");
    }
    const uint64_t out[2] = {sample, context.seed ^ context.epoch};
    std::memcpy(dst.data(), out, sizeof(out));
    return Status::Ok();
  }
  Status PlanDevice(std::span<const std::byte> encoded, uint64_t sample, const DecodeContext&,
                    DevicePlan* plan) const override {
    *plan = DevicePlan{};
    plan->device_decodable = sample % 2 == 0;
    plan->why_not = plan->device_decodable ? "" : "odd";
    plan->height = static_cast<int32_t>(encoded.size());
    return Status::Ok();
  }

 private:
  std::set<uint64_t> corrupt_;
  bool replace_;
};

LoaderOptions Opts() {
  LoaderOptions o;
  o.batch_size = 6;
  o.threads = 2;
  o.prefetch = 2;
  o.seed = 5;
  return o;
}

TEST(DecodeStageTest, TheLoaderDecodesEachSampleFromItsOwnBytesForItsEpoch) {
  EncodedIndexSource src(37, std::make_shared<IndexDecoder>(std::set<uint64_t>{}, false));
  Loader loader(src, Opts());
  for (uint64_t epoch : {0, 3}) {
    std::map<uint64_t, int> seen;
    for (const Batch& b : loader.Epoch(epoch)) {
      EXPECT_TRUE(b.encoded().empty());
      for (uint64_t i = 0; i < b.size(); ++i) {
        uint64_t out[2];
        std::memcpy(out, b.images().data() + i * 16, 16);
        EXPECT_EQ(out[0], b.indices()[i]);
        EXPECT_EQ(out[1], 5u ^ epoch);
        EXPECT_EQ(b.labels()[i], testing::IndexLabel(b.indices()[i]));
        ++seen[b.indices()[i]];
      }
    }
    ASSERT_EQ(seen.size(), 37u) << "epoch " << epoch;
    for (auto [k, times] : seen) EXPECT_EQ(times, 1) << "sample " << k;
  }
}

TEST(DecodeStageTest, ACorruptSampleIsNamedOrReplacedByTheNextOfItsChunk) {
  {
    EncodedIndexSource src(12, std::make_shared<IndexDecoder>(std::set<uint64_t>{6}, false));
    LoaderOptions o = Opts();
    o.order = Order::kSequential;
    Loader loader(src, o);
    EpochStream s = loader.Epoch(0);
    Status error;
    for (;;) {
      auto b = s.Next();
      if (!b.ok()) {
        error = b.status();
        break;
      }
      if (!*b) break;
    }
    ASSERT_EQ(error.code(), StatusCode::kCorrupt) << error.ToString();
    EXPECT_NE(error.message().find("encoded memory sample 6: injected corrupt stream"), std::string::npos)
        << error.ToString();
    EXPECT_NE(error.message().find("--skip-corrupt"), std::string::npos) << error.ToString();
  }
  // 6 and 7 do not decode: 6 becomes 4 (its chunk [4, 8) cyclically from 6:
  // 7, then 4), 7 becomes 4 too.
  EncodedIndexSource src(12, std::make_shared<IndexDecoder>(std::set<uint64_t>{6, 7}, true));
  LoaderOptions o = Opts();
  o.order = Order::kSequential;
  auto logger = std::make_shared<testing::CapturingLogger>();
  o.logger = logger;  // each replacement is said there, not on stderr
  Loader loader(src, o);
  EpochStream s = loader.Epoch(0);
  std::vector<uint64_t> indices;
  for (const Batch& b : s) {
    for (uint64_t i = 0; i < b.size(); ++i) {
      uint64_t out[2];
      std::memcpy(out, b.images().data() + i * 16, 16);
      EXPECT_EQ(out[0], b.indices()[i]);  // the replacement's bytes, index and label
      EXPECT_EQ(b.labels()[i], testing::IndexLabel(b.indices()[i]));
      indices.push_back(b.indices()[i]);
    }
  }
  EXPECT_EQ(indices, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 4, 4, 8, 9, 10, 11}));
  EXPECT_EQ(s.stats().skipped_samples, 2u);
  const auto events = logger->events();
  ASSERT_EQ(events.size(), 2u);
  for (const auto& [event, message] : events) {
    EXPECT_EQ(event, "sample_replaced");
    EXPECT_NE(message.find("encoded memory sample "), std::string::npos) << message;
    EXPECT_NE(message.find("replaced by sample 4"), std::string::npos) << message;
  }
}

// Deferred decoding: what the decoder's PlanDevice takes stays encoded in
// the batch (its own bytes at its offset), the rest is decoded in place.
TEST(DecodeStageTest, DeferredSamplesKeepTheirBytesAndTheOthersAreDecoded) {
  EncodedIndexSource src(37, std::make_shared<IndexDecoder>(std::set<uint64_t>{}, false));
  LoaderOptions o = Opts();
  o.defer_decode = true;
  Loader loader(src, o);
  EpochStream s = loader.Epoch(1);
  uint64_t samples = 0, deferred = 0;
  for (const Batch& b : s) {
    ASSERT_EQ(b.encoded().size(), b.size());
    for (uint64_t i = 0; i < b.size(); ++i) {
      const uint64_t k = b.indices()[i];
      const EncodedSample& e = b.encoded()[i];
      const std::byte* at = b.buffer().data() + e.offset;
      if (k % 2 == 0) {
        ASSERT_EQ(e.bytes, EncodedIndexSource::Stored(k)) << "sample " << k;
        EXPECT_EQ(e.height, static_cast<int32_t>(e.bytes));  // the plan travels with it
        for (uint64_t j = 0; j < e.bytes; ++j) EXPECT_EQ(std::to_integer<uint64_t>(at[j]), k & 0xff);
        ++deferred;
      } else {
        ASSERT_EQ(e.bytes, 0u) << "sample " << k;
        uint64_t out[2];
        std::memcpy(out, at, 16);
        EXPECT_EQ(out[0], k);
        EXPECT_EQ(out[1], 5u ^ 1u);
      }
      ++samples;
    }
  }
  EXPECT_EQ(samples, 37u);
  EXPECT_EQ(deferred, 19u);
  EXPECT_EQ(s.stats().deferred_samples, 19u);
  EXPECT_EQ(s.stats().host_decoded_samples, 18u);
  EXPECT_EQ(s.stats().host_decode_reason, "odd");
}

// A source of encoded samples that names no decoder: an Internal error
// naming it, decoding here or deferring, never a crash.
TEST(DecodeStageTest, EncodedSamplesWithoutADecoderAreAnError) {
  EncodedIndexSource src(12, nullptr);
  for (bool defer : {false, true}) {
    LoaderOptions o = Opts();
    o.defer_decode = defer;
    Loader loader(src, o);
    EpochStream s = loader.Epoch(0);
    auto b = s.Next();
    ASSERT_FALSE(b.ok()) << "defer " << defer;
    EXPECT_EQ(b.status().code(), StatusCode::kInternal);
    EXPECT_NE(b.status().message().find("no decoder"), std::string::npos) << b.status().ToString();
  }
}

}  // namespace
}  // namespace gpufeed
