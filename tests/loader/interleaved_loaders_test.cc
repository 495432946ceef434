// Several Loaders of several threads each in one process, their batches
// taken in turn by one consumer that holds the previous ones (gpufeed.jax's
// feed per device; Python's zip over loaders): every stream keeps going
// whatever the others do. A watchdog turns a hang into a failure in seconds.
//
// History: this hung (about 1 run in 4 of tests/python/test_jax.py with 2
// threads a loader). A stream's plan stage waited for a pool slot inside a
// TBB task while its batches in flight sat in the same thread's task deque,
// and the process's one TBB worker (2 cores) was blocked likewise in another
// Loader's plan stage: the consumer, holding two of the stream's batches,
// waited for a batch no thread would run (loader/loader.cc, the file's
// comment).
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "gpufeed/loader.h"
#include "tests/testing/sources.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using testing::InMemorySource;

// Runs `body` on a thread of its own; if it has not returned after `limit`,
// the process is aborted naming `what`: a hung loader cannot be unwound, and
// a test that waits forever stalls CI rather than failing (CTest runs each
// case in a process of its own).
void WithWatchdog(const char* what, std::chrono::milliseconds limit, const std::function<void()>& body) {
  std::packaged_task<void()> task(body);
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr,
                 "%s: still running after %lld ms: a loader hung (its threads' stacks: gdb -p PID -batch -ex "
                 "'thread apply all bt')\n",
                 what, static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::abort();
  }
  runner.join();
  done.get();  // rethrows what the body threw
}

// One loader of the set, its stream, and what its consumer holds.
struct Feed {
  std::unique_ptr<InMemorySource> src;
  std::unique_ptr<Loader> loader;
  std::optional<EpochStream> stream;
  std::deque<Batch> held;  // batches the consumer keeps, oldest first
  size_t hold = 2;         // how many it keeps while it asks for the next
  uint64_t next_index = 0;
  uint64_t stop_after = UINT64_MAX;  // batches taken before the stream (or the loader) goes
  bool destroy_loader = false;       // at stop_after the loader goes while its stream runs
  int every = 1;                     // taken at one pass in `every`
  bool done = false;
};

// Takes feed f's next batch, checking its order and that every sample's bytes
// and label encode its index; false once the feed is done.
bool TakeOne(Feed& f, int which) {
  if (f.done) return false;
  if (f.next_index >= f.stop_after) {
    f.held.clear();
    if (f.destroy_loader) f.loader.reset();  // stops its stream mid-epoch
    f.stream.reset();
    f.done = true;
    return false;
  }
  // The consumer asks for the next batch while it holds `hold` batches (a
  // Python loop over zip() holds the previous round's batch of every loader,
  // and more until the garbage collector runs).
  while (f.held.size() > f.hold) f.held.pop_front();
  auto b = f.stream->Next();
  EXPECT_TRUE(b.ok()) << "loader " << which << ": " << b.status().ToString();
  if (!b.ok() || !b->has_value()) {
    f.held.clear();
    f.stream.reset();
    f.done = true;
    return false;
  }
  const Batch& batch = **b;
  EXPECT_EQ(batch.index(), f.next_index) << "loader " << which;
  for (uint64_t i = 0; i < batch.size(); ++i) {
    const uint64_t k = batch.indices()[i];
    EXPECT_EQ(testing::SampleIndexOf(batch.images().subspan(i * batch.sample_bytes(), batch.sample_bytes())),
              static_cast<int64_t>(k))
        << "loader " << which << " batch " << batch.index() << " row " << i;
    EXPECT_EQ(batch.labels()[i], testing::IndexLabel(k)) << "loader " << which;
  }
  ++f.next_index;
  f.held.push_back(std::move(**b));
  return true;
}

// One round: six loaders of 2-3 threads (clamped to the cores), prefetch 2
// to 4, taken in turn (one only at every 8th pass) while the consumer holds
// 2-3 of each; one stops its stream early, one is destroyed mid-epoch; the
// others run two epochs to the end. Random order and a small cache: batches
// span several chunks, so assembly times vary and batches finish out of
// order.
void InterleavedRound(uint64_t round) {
  struct Shape {
    int threads, prefetch;
    size_t hold;
    uint64_t stop_after;
    bool destroy_loader;
    int every;
  };
  // {threads, prefetch, hold, stop_after, destroy_loader, every}
  const Shape shapes[] = {
      {2, 2, 2, UINT64_MAX, false, 8},     // taken rarely: it waits for a slot most of the time
      {3, 2, 2, UINT64_MAX, false, 1},     // 3 threads asked (as many as the cores allow)
      {2, 3, 2, UINT64_MAX, false, 1},     // prefetch 3
      {2, 2, 2, UINT64_MAX, false, 1},     // as the first, taken at every pass
      {2, 4, 3, 5 + round % 4, false, 1},  // stops its stream early
      {3, 2, 2, 7 + round % 3, true, 1},   // its loader destroyed mid-epoch
  };
  std::vector<Feed> feeds(std::size(shapes));
  for (size_t i = 0; i < feeds.size(); ++i) {
    Feed& f = feeds[i];
    const Shape& sh = shapes[i];
    f.src = std::make_unique<InMemorySource>(240 + 8 * i, 32, 8);
    LoaderOptions o;
    o.batch_size = 8;
    o.order = Order::kRandom;
    o.seed = round * 7 + i;
    o.threads = sh.threads;
    o.prefetch = sh.prefetch;
    o.cache_bytes = 4 << 10;  // a few chunks: reads and transient decodes throughout
    o.pin_memory = false;
    f.loader = std::make_unique<Loader>(*f.src, o);
    f.hold = sh.hold;
    f.stop_after = sh.stop_after;
    f.destroy_loader = sh.destroy_loader;
    f.every = sh.every;
  }
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    for (Feed& f : feeds) {
      if (f.loader == nullptr || (f.stop_after != UINT64_MAX && epoch > 0)) continue;
      f.stream.emplace(f.loader->Epoch(epoch));
      f.done = false;
      f.next_index = 0;
    }
    for (int pass = 0, any = 1; any; ++pass) {
      any = 0;
      for (size_t i = 0; i < feeds.size(); ++i) {
        Feed& f = feeds[i];
        if (pass % f.every != 0) {
          any |= !f.done;
          continue;
        }
        any |= TakeOne(f, static_cast<int>(i));
      }
    }
    for (size_t i = 0; i < feeds.size(); ++i) {
      if (feeds[i].stop_after == UINT64_MAX) {
        EXPECT_EQ(feeds[i].next_index, feeds[i].loader->num_batches()) << "loader " << i << " epoch " << epoch;
      }
    }
  }
}

TEST(InterleavedLoadersTest, LoadersOfSeveralThreadsTakenInTurnNeverHang) {
  // At most 2 threads for TBB, as on the 2-core machines where this hung:
  // one worker shared by every Loader's arena, whatever this machine has.
  tbb::global_control two(tbb::global_control::max_allowed_parallelism, 2);
  // Rounds for 1.5 s (fewer under a sanitizer). Before the fix every one of
  // 20 runs hung (on 2 cores; rounds run on alone hung after 0.01-1.2 s, 30
  // runs); the watchdog allows a slow last round.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  uint64_t rounds = 0;
  WithWatchdog("InterleavedLoadersTest", std::chrono::seconds(10), [&] {
    while (std::chrono::steady_clock::now() < until && !::testing::Test::HasFailure()) InterleavedRound(rounds++);
  });
  EXPECT_GT(rounds, 0u);
}

}  // namespace
}  // namespace gpufeed
