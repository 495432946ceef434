// How many read-ahead requests the remote transport (hdf5io/io/http_file.h)
// keeps in flight: sized from what the link held, not a fixed number.
//
// Little's law: the requests a link holds on average are its request
// latency times its completion rate. Each period (kPeriodBusySeconds of time
// with a request in flight and kPeriodRequests completions, whichever ends
// later) the window is set to `headroom` times that. While the window is
// what bounds the requests in flight (the store would take more) it grows by
// up to `headroom` a period; when the reader or its look-ahead bounds them
// it falls, by at most half a period, toward what they need. Always within
// [min(floor, limit), limit], the limit being the request cap and the bytes
// budget over the period's mean request size (never under 1): large chunks
// get few requests, small ones up to the cap.
//
// Pure arithmetic on what it is told (no clock of its own: times are passed
// in), so tests drive it with a simulated link. Not thread-safe: the
// transfer thread owns it.
#ifndef GPUFEED_IO_REMOTE_WINDOW_H_
#define GPUFEED_IO_REMOTE_WINDOW_H_

#include <cstdint>

namespace gpufeed::io {

struct WindowPolicy {
  double headroom = 2.0;
  unsigned initial = 64;  // before anything is measured
  unsigned floor = 16;
  unsigned cap = 1024;
  uint64_t budget_bytes = uint64_t{128} << 20;  // requests in flight x their bytes
};

// The most requests of `request_bytes` each the policy keeps in flight: the
// cap and budget_bytes / request_bytes, at least 1 (a size not above 0: the
// cap alone).
unsigned WindowLimit(const WindowPolicy& p, double request_bytes);

// The next window after `current`, from a period's mean request latency
// (seconds), completions per second of busy time and mean request bytes.
// Inputs that are not positive and finite leave `current` (within bounds).
unsigned NextWindow(const WindowPolicy& p, unsigned current, double latency_s, double completions_per_s,
                    double request_bytes);

class WindowSizer {
 public:
  static constexpr double kPeriodBusySeconds = 0.05;
  static constexpr unsigned kPeriodRequests = 8;

  explicit WindowSizer(const WindowPolicy& p);

  // One request ended after `latency_s` (its last attempt's start to its
  // end) with `bytes`; `busy_total_s` is the transfer's seconds with a
  // request in flight so far (non-decreasing). Re-sizes at a period's end:
  // true when the window changed.
  bool Completed(double latency_s, uint64_t bytes, double busy_total_s);

  unsigned window() const { return window_; }
  const WindowPolicy& policy() const { return policy_; }
  // The last period's measurements (0 before the first).
  double latency_s() const { return last_latency_s_; }
  double completions_per_s() const { return last_rate_; }

 private:
  WindowPolicy policy_;
  unsigned window_;
  double period_start_busy_s_ = 0;  // busy_total_s when the period began
  uint64_t period_requests_ = 0;
  double period_latency_s_ = 0, period_bytes_ = 0;
  double last_latency_s_ = 0, last_rate_ = 0;
};

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_REMOTE_WINDOW_H_
