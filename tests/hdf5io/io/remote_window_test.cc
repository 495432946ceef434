// The remote read-ahead's window (hdf5io/io/remote_window.h): its arithmetic,
// and the sizer driven by a simulated link on a fake clock (busy seconds
// passed in): a link whose window bounds it grows the window to the bytes
// budget or the cap, a reader slower than the link brings it down to twice
// what the link holds for it, and neither stays at a few requests.
#include "hdf5io/io/remote_window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace gpufeed::io {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

TEST(RemoteWindowTest, TheLimitIsTheCapAndTheBytesBudget) {
  WindowPolicy p;  // 1024 requests, 128 MiB
  EXPECT_EQ(WindowLimit(p, 128 * kKiB), 1024u);
  EXPECT_EQ(WindowLimit(p, 1 * kMiB), 128u);
  EXPECT_EQ(WindowLimit(p, 16 * kMiB), 8u);
  EXPECT_EQ(WindowLimit(p, 1024 * kMiB), 1u);  // a chunk over the budget: one at a time
  EXPECT_EQ(WindowLimit(p, 0), 1024u);         // size unknown: the cap
  EXPECT_EQ(WindowLimit(p, std::numeric_limits<double>::quiet_NaN()), 1024u);
}

TEST(RemoteWindowTest, NextIsTwiceLatencyTimesRateWithinBounds) {
  WindowPolicy p;
  // 20 ms x 1000/s: the link held 20; twice that.
  EXPECT_EQ(NextWindow(p, 64, 0.020, 1000, 128 * kKiB), 40u);
  EXPECT_EQ(NextWindow(p, 40, 0.020, 1000, 128 * kKiB), 40u);  // settled
  // It grows by at most the headroom a period, falls by at most half.
  EXPECT_EQ(NextWindow(p, 64, 0.100, 2000, 128 * kKiB), 128u);
  EXPECT_EQ(NextWindow(p, 200, 0.001, 100, 128 * kKiB), 100u);
  // Not under the floor, not over the cap or the budget.
  EXPECT_EQ(NextWindow(p, 20, 0.001, 100, 128 * kKiB), 16u);
  EXPECT_EQ(NextWindow(p, 1000, 1.0, 5000, 128 * kKiB), 1024u);
  EXPECT_EQ(NextWindow(p, 64, 0.050, 1000, 16 * kMiB), 8u);  // the budget is under the floor
  // Nothing measured: the current window, within bounds.
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_EQ(NextWindow(p, 64, bad, 1000, 128 * kKiB), 64u) << bad;
    EXPECT_EQ(NextWindow(p, 64, 0.02, bad, 128 * kKiB), 64u) << bad;
  }
  EXPECT_EQ(NextWindow(p, 64, 0.0, 0.0, 4 * kMiB), 32u);
}

// A link of `latency_s` a request serving whatever is in flight at once,
// read by a reader that keeps at most `reader_per_s` requests a second asked
// (0: no bound), on a fake clock: the requests in flight are the window or
// what the reader keeps asked, whichever is less, and complete at in-flight
// / latency a second (Little's law), each reported with the busy seconds so
// far. The window is read again at each completion.
struct SimulatedLink {
  double latency_s = 0.020;
  double reader_per_s = 0;
  uint64_t request_bytes = 128 * kKiB;
  double busy_s = 0;  // the fake clock: busy seconds, never going back

  // `n` completions; the windows it moved to, in order.
  std::vector<unsigned> Run(WindowSizer* sizer, int n) {
    std::vector<unsigned> moved;
    for (int i = 0; i < n; ++i) {
      double in_flight = sizer->window();
      if (reader_per_s > 0) in_flight = std::min(in_flight, reader_per_s * latency_s);
      busy_s += latency_s / in_flight;
      if (sizer->Completed(latency_s, request_bytes, busy_s)) moved.push_back(sizer->window());
    }
    return moved;
  }
};

TEST(RemoteWindowTest, AWindowBoundLinkGrowsToTheBudgetOrTheCap) {
  for (uint64_t bytes : {128 * kKiB, 1 * kMiB, 16 * kMiB}) {
    SCOPED_TRACE(bytes);
    WindowSizer sizer{WindowPolicy{}};
    EXPECT_EQ(sizer.window(), 64u);  // before anything is measured
    SimulatedLink link;
    link.request_bytes = bytes;
    const std::vector<unsigned> moved = link.Run(&sizer, 20000);
    const unsigned limit = std::min<uint64_t>(1024, (128 * kMiB) / bytes);
    EXPECT_EQ(sizer.window(), limit);
    ASSERT_FALSE(moved.empty());
    EXPECT_LE(*std::max_element(moved.begin(), moved.end()), limit);
    EXPECT_NEAR(sizer.latency_s(), 0.020, 1e-9);
  }
}

TEST(RemoteWindowTest, FromTheFloorItDoublesEachPeriod) {
  WindowPolicy p;
  p.initial = 16;
  WindowSizer sizer(p);
  SimulatedLink link;
  EXPECT_EQ(link.Run(&sizer, 20000), (std::vector<unsigned>{32, 64, 128, 256, 512, 1024}));
  // Each period was its 50 ms of busy time: 6 periods, then the rest at 1024.
  EXPECT_NEAR(sizer.completions_per_s(), 1024 / 0.020, 1);
}

TEST(RemoteWindowTest, AReaderSlowerThanTheLinkSettlesItAtTwiceWhatTheLinkHolds) {
  // 500 requests/s over 50 ms: 25 in flight serve the reader; the window
  // falls from 64 by at most half a period and settles at 50.
  WindowSizer sizer{WindowPolicy{}};
  SimulatedLink link{0.050, 500};
  EXPECT_EQ(link.Run(&sizer, 1000), (std::vector<unsigned>{50}));
  EXPECT_NEAR(sizer.completions_per_s(), 500, 1e-6);
  // Faster answers for the same reader (1 ms: half a request in flight):
  // down to the floor, each period at least halving, never below. (The
  // period the change falls in mixes the two links.)
  link.latency_s = 0.001;
  std::vector<unsigned> moved = link.Run(&sizer, 1000);
  ASSERT_FALSE(moved.empty());
  EXPECT_EQ(moved.back(), 16u);
  for (size_t i = 0; i < moved.size(); ++i) EXPECT_GE(moved[i], (i == 0 ? 50u : moved[i - 1]) / 2) << i;
  // The reader speeds up (the window bounds it again): back up to the cap,
  // each period at most doubling.
  link.latency_s = 0.020;
  link.reader_per_s = 0;
  moved = link.Run(&sizer, 20000);
  ASSERT_FALSE(moved.empty());
  EXPECT_EQ(moved.back(), 1024u);
  for (size_t i = 0; i < moved.size(); ++i) EXPECT_LE(moved[i], (i == 0 ? 16u : moved[i - 1]) * 2) << i;
}

TEST(RemoteWindowTest, APeriodNeedsItsBusyTimeAndItsRequests) {
  WindowSizer sizer{WindowPolicy{}};
  // Seven requests over a long busy time: not a period yet.
  for (int i = 1; i < static_cast<int>(WindowSizer::kPeriodRequests); ++i) {
    EXPECT_FALSE(sizer.Completed(0.5, 128 * kKiB, i * 1.0));
  }
  // Many requests in less than the busy time: still not.
  WindowSizer quick{WindowPolicy{}};
  for (int i = 1; i < 100; ++i) EXPECT_FALSE(quick.Completed(0.2, 128 * kKiB, i * 1e-4));
  EXPECT_EQ(quick.window(), 64u);
  EXPECT_EQ(quick.latency_s(), 0);
  // A latency that is not positive teaches nothing and is not counted.
  EXPECT_FALSE(quick.Completed(0, 128 * kKiB, 1.0));
  EXPECT_TRUE(quick.Completed(0.2, 128 * kKiB, 1.0));  // 100 over 1 s x 0.2 s = 20: twice, from 64 -> 40
  EXPECT_EQ(quick.window(), 40u);
}

}  // namespace
}  // namespace gpufeed::io
