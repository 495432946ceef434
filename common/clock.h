// The one monotonic clock of gpufeed's timings (stage busy times, waits,
// benchmark figures): seconds on the steady clock, for differences only.
#ifndef GPUFEED_COMMON_CLOCK_H_
#define GPUFEED_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gpufeed {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds the nanoseconds of its own life to *ns (a counter read by stats).
class ScopedNanos {
 public:
  explicit ScopedNanos(std::atomic<uint64_t>* ns) : ns_(ns), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedNanos() {
    const auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_);
    ns_->fetch_add(static_cast<uint64_t>(d.count()), std::memory_order_relaxed);
  }
  ScopedNanos(const ScopedNanos&) = delete;
  ScopedNanos& operator=(const ScopedNanos&) = delete;

 private:
  std::atomic<uint64_t>* const ns_;
  const std::chrono::steady_clock::time_point t0_;
};

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_CLOCK_H_
