// CelebA-like synthetic workload generator.
#include "bench/synthetic_source.h"

#include <cstring>

namespace gpufeed::bench {
namespace {

constexpr uint64_t kC = 3, kH = 218, kW = 178, kPatch = 8;
constexpr uint64_t kGridH = 28, kGridW = 23;  // ceil(218/8), ceil(178/8)

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class CelebaLikeSource final : public SampleSource {
 public:
  CelebaLikeSource(uint64_t n, uint64_t seed) : n_(n), seed_(seed), shape_{kC, kH, kW} {
    labels_.resize(n);
    for (uint64_t k = 0; k < n; ++k) labels_[k] = static_cast<int64_t>(Mix(seed_ ^ (k * 7919)) % 40);
  }
  uint64_t num_samples() const override { return n_; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  DType dtype() const override { return DType::kUInt8; }
  std::string layout() const override { return std::string(LayoutName(Layout::kNCHW)); }
  const std::vector<int64_t>& labels() const override { return labels_; }
  uint64_t input_bytes() const override { return 0; }
  std::string description() const override { return "synthetic celeba-like (" + std::to_string(n_) + " samples)"; }

  Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
    constexpr uint64_t kSampleBytes = kC * kH * kW;
    for (uint64_t s = 0; s < count; ++s) {
      const uint64_t k = first + s;
      auto* out = reinterpret_cast<uint8_t*>(dst.data() + s * kSampleBytes);
      uint8_t grid[kC][kGridH][kGridW];
      uint64_t state = Mix(seed_ * 0x100000001B3ull + k);
      for (auto& plane : grid) {
        for (auto& row : plane) {
          for (uint8_t& v : row) {
            state = Mix(state);
            v = static_cast<uint8_t>(state);
          }
        }
      }
      uint64_t noise = 0;
      int noise_left = 0;
      for (uint64_t c = 0; c < kC; ++c) {
        for (uint64_t y = 0; y < kH; ++y) {
          for (uint64_t x = 0; x < kW; ++x) {
            if (noise_left == 0) {  // 21 three-bit draws per 64-bit word
              state = Mix(state);
              noise = state;
              noise_left = 21;
            }
            *out++ = static_cast<uint8_t>(grid[c][y / kPatch][x / kPatch] + (noise & 7));
            noise >>= 3;
            --noise_left;
          }
        }
      }
      std::memcpy(dst.data() + s * kSampleBytes, &k, sizeof(k));  // index-valued
    }
    return Status::Ok();
  }

 private:
  uint64_t n_, seed_;
  std::vector<uint64_t> shape_;
  std::vector<int64_t> labels_;
};

}  // namespace

std::unique_ptr<SampleSource> MakeCelebaLikeSource(uint64_t num_samples, uint64_t seed) {
  return std::make_unique<CelebaLikeSource>(num_samples, seed);
}

Status WorkloadWriteOptions(const std::string& name, WriteOptions* out) {
  out->chunk_samples = 100;
  out->shuffle_filter = false;
  if (name == "celeba-raw") {
    out->codec = Codec::kNone;
  } else if (name == "celeba-deflate") {
    out->codec = Codec::kDeflate;
    out->level = 4;
  } else if (name == "celeba-zstd") {
    out->codec = Codec::kZstd;
    out->level = 3;
  } else {
    return Status::InvalidArgument("unknown workload '" + name +
                                   "' (expected celeba-raw, celeba-deflate or celeba-zstd)");
  }
  return Status::Ok();
}

}  // namespace gpufeed::bench
