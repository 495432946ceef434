// ChunkSources for loader tests: index-valued samples in memory, optionally
// slow, optionally failing at one chunk, optionally stalled (as a remote
// object's read with its server gone), counting every read.
#ifndef GPUFEED_TESTS_TESTING_SOURCES_H_
#define GPUFEED_TESTS_TESTING_SOURCES_H_

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common/cancel.h"
#include "gpufeed/chunk_source.h"
#include "tests/testing/test_data.h"

namespace gpufeed::testing {

class InMemorySource : public ChunkSource {
 public:
  InMemorySource(uint64_t n, uint64_t sample_bytes, uint64_t chunk_samples)
      : n_(n), sb_(sample_bytes), k_(chunk_samples), shape_{sample_bytes}, data_(IndexSamples(n, sample_bytes)) {
    for (uint64_t i = 0; i < n; ++i) labels_.push_back(IndexLabel(i));
  }
  uint64_t num_samples() const override { return n_; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  uint64_t sample_bytes() const override { return sb_; }
  DType dtype() const override { return DType::kUInt8; }
  uint64_t chunk_samples() const override { return k_; }
  uint64_t num_chunks() const override { return (n_ + k_ - 1) / k_; }
  uint64_t samples_in_chunk(uint64_t i) const override { return std::min(k_, n_ - i * k_); }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return samples_in_chunk(i) * sb_; }
  const std::vector<int64_t>& labels() const override { return labels_; }
  std::string name() const override { return "memory"; }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    reads_ += 1;
    if (stall_.load()) return Stalled(i);
    if (const int ms = delay_ms_.load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    if (static_cast<int64_t>(i) == fail_chunk_) {
      return Status::Corrupt("memory chunk " + std::to_string(i) + ": injected failure");
    }
    std::memcpy(dst.data(), data_.data() + i * k_ * sb_, samples_in_chunk(i) * sb_);
    return Status::Ok();
  }

  void set_delay_ms(int ms) { delay_ms_ = ms; }  // also while a loader reads
  void set_fail_chunk(int64_t c) { fail_chunk_ = c; }
  uint64_t reads() const { return reads_.load(); }
  // From now on a read stalls as a remote read whose server is gone: until
  // its thread's work is cancelled (common/cancel.h), else for kStallMs
  // (its retries), then it fails. Also while a loader reads.
  static constexpr int kStallMs = 5000;
  void set_stall(bool on) { stall_ = on; }
  uint64_t stalled_now() const { return stalled_.load(); }  // reads stalled at this moment

 private:
  uint64_t n_, sb_, k_;
  std::vector<uint64_t> shape_;
  std::vector<std::byte> data_;
  std::vector<int64_t> labels_;
  std::atomic<int> delay_ms_{0};
  int64_t fail_chunk_ = -1;
  mutable std::atomic<uint64_t> reads_{0};
  std::atomic<bool> stall_{false};
  mutable std::atomic<uint64_t> stalled_{0};

  Status Stalled(uint64_t i) const {
    stalled_ += 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStallMs);
    while (!CurrentCancelled() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stalled_ -= 1;
    const std::string what = "memory chunk " + std::to_string(i);
    if (CurrentCancelled()) return Status::IOError(what + ": the read was cancelled");
    return Status::IOError(what + ": no answer in " + std::to_string(kStallMs) + " ms");
  }
};

}  // namespace gpufeed::testing

#endif  // GPUFEED_TESTS_TESTING_SOURCES_H_
