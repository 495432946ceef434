// WindowSizer (hdf5io/io/remote_window.h): the remote read-ahead's requests
// in flight from the measured latency and completion rate.
#include "hdf5io/io/remote_window.h"

#include <algorithm>
#include <cmath>

namespace gpufeed::io {
namespace {

bool PositiveFinite(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

unsigned WindowLimit(const WindowPolicy& p, double request_bytes) {
  double limit = std::max(1u, p.cap);
  if (PositiveFinite(request_bytes)) limit = std::min(limit, static_cast<double>(p.budget_bytes) / request_bytes);
  return std::max(1u, static_cast<unsigned>(limit));
}

unsigned NextWindow(const WindowPolicy& p, unsigned current, double latency_s, double completions_per_s,
                    double request_bytes) {
  const unsigned limit = WindowLimit(p, request_bytes);
  const unsigned lo = std::min(std::max(1u, p.floor), limit);
  if (!PositiveFinite(latency_s) || !PositiveFinite(completions_per_s)) return std::clamp(current, lo, limit);
  // Little's law: what the link held; with headroom, bounded by growing at
  // most `headroom` and falling at most half a period (a noisy period moves
  // it by at most that much).
  const double held = latency_s * completions_per_s;
  // (less a millionth: 0.02 s x 1000/s is 20, not a hair over it)
  double target = std::ceil(held * std::max(1.0, p.headroom) - 1e-6);
  target = std::min(target, std::ceil(static_cast<double>(current) * std::max(1.0, p.headroom)));
  target = std::max(target, std::floor(static_cast<double>(current) / 2));
  target = std::clamp(target, static_cast<double>(lo), static_cast<double>(limit));
  return static_cast<unsigned>(target);
}

WindowSizer::WindowSizer(const WindowPolicy& p)
    : policy_(p),
      window_(std::clamp(p.initial, std::min(std::max(1u, p.floor), WindowLimit(p, 0)), WindowLimit(p, 0))) {}

bool WindowSizer::Completed(double latency_s, uint64_t bytes, double busy_total_s) {
  if (!PositiveFinite(latency_s)) return false;  // a clock that did not move: nothing to learn
  period_requests_ += 1;
  period_latency_s_ += latency_s;
  period_bytes_ += static_cast<double>(bytes);
  const double busy = busy_total_s - period_start_busy_s_;
  if (busy < kPeriodBusySeconds || period_requests_ < kPeriodRequests) return false;
  const double n = static_cast<double>(period_requests_);
  last_latency_s_ = period_latency_s_ / n;
  last_rate_ = n / busy;
  const unsigned was = window_;
  window_ = NextWindow(policy_, window_, last_latency_s_, last_rate_, period_bytes_ / n);
  period_start_busy_s_ = busy_total_s;
  period_requests_ = 0;
  period_latency_s_ = period_bytes_ = 0;
  return window_ != was;
}

}  // namespace gpufeed::io
