// Belady eviction and prefetch decisions of the chunk cache.
#include "loader/chunk_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "tests/testing/sources.h"

namespace gpufeed::loader {
namespace {

// A plan whose batch b touches exactly the chunks in `seq[b]` (one sample
// each, chunk_samples 1).
EpochPlan PlanOf(const std::vector<std::vector<uint32_t>>& seq, uint64_t num_chunks) {
  EpochPlan p;
  p.batch_size = 1;
  p.num_batches = seq.size();
  p.batch_chunks = seq;
  p.chunk_users.assign(num_chunks, {});
  for (uint32_t b = 0; b < seq.size(); ++b) {
    for (uint32_t c : seq[b]) p.chunk_users[c].push_back(b);
  }
  return p;
}

TEST(ChunkCacheTest, EvictsTheChunkNeededFurthestInTheFuture) {
  testing::InMemorySource src(/*n=*/6, /*sample_bytes=*/100, /*chunk_samples=*/1);
  // Budget: two chunks. Accesses: 0 1 2 0 1 3 0 ...
  ChunkCache cache(src, 200);
  EpochPlan plan = PlanOf({{0}, {1}, {2}, {0}, {1}, {3}, {0}}, 6);
  cache.BeginEpoch(&plan, 0);
  tbb::task_group tasks;
  auto run = [&](uint64_t b) {
    auto h = cache.Acquire(b, /*max_pending=*/0, tasks);
    for (auto& e : h) EXPECT_TRUE(cache.Ensure(*e).ok());
  };
  run(0);
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0}));
  run(1);
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1}));
  // 2 is used once only: not admitted (transient); 0 and 1 stay.
  run(2);
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1}));
  run(3);  // hit 0
  run(4);  // hit 1: never needed again in this plan, it stays while nothing needs its room
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1}));
  run(5);  // 3: used once, and no free room: transient
  run(6);  // hit 0
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1}));
  tasks.wait();
  EXPECT_EQ(cache.counters().hits.load(), 3u);
  EXPECT_EQ(cache.counters().misses.load(), 4u);
  EXPECT_EQ(src.reads(), 4u);  // Belady's optimum for this trace and budget
}

// Past a budget of 0, the epoch's working set (chunks between their first
// and last use, at the peak) is kept where it is within the cap: each chunk
// decoded once. Over the cap, nothing is kept and shared chunks are read again.
TEST(ChunkCacheTest, KeepsTheEpochsWorkingSetUpToItsCap) {
  // Batches 0-4 share chunks 0, 1, 2 (all three between their first and
  // last use at batches 1 to 3); 3 is used once. With no cache, 10 reads.
  const std::vector<std::vector<uint32_t>> seq = {{0, 1}, {1, 2}, {0, 2}, {0, 1}, {2}, {3}};
  for (auto [cap, reads] : {std::pair<uint64_t, uint64_t>{300, 4}, {200, 10}}) {
    testing::InMemorySource src(4, 100, 1);
    ChunkCache cache(src, /*budget=*/0, 8, cap);
    EpochPlan plan = PlanOf(seq, 4);
    cache.BeginEpoch(&plan, 0);
    EXPECT_EQ(cache.working_set_bytes(), 300u);
    EXPECT_EQ(cache.effective_budget_bytes(), cap >= 300 ? 300u : 0u);
    tbb::task_group tasks;
    for (uint64_t b = 0; b < seq.size(); ++b) {
      for (auto& e : cache.Acquire(b, 0, tasks)) ASSERT_TRUE(cache.Ensure(*e).ok());
      tasks.wait();
    }
    EXPECT_EQ(src.reads(), reads) << "cap " << cap;
  }
}

TEST(ChunkCacheTest, BeladyKeepsTheSoonerOfTwoCandidates) {
  testing::InMemorySource src(4, 100, 1);
  ChunkCache cache(src, 200);
  // 0 1 2 | 1 ... 0 much later: when 2 arrives (needed again at 4), the
  // victim is 0 (next use 6), not 1 (next use 3).
  EpochPlan plan = PlanOf({{0}, {1}, {2}, {1}, {2}, {3}, {0}}, 4);
  cache.BeginEpoch(&plan, 0);
  tbb::task_group tasks;
  for (uint64_t b = 0; b < 3; ++b) {
    for (auto& e : cache.Acquire(b, 0, tasks)) ASSERT_TRUE(cache.Ensure(*e).ok());
    // A decode task still queued holds its chunk, and a held chunk is never
    // the victim: wait for them, so both candidates are free when 2 comes.
    tasks.wait();
  }
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{1, 2}));
}

TEST(ChunkCacheTest, PrefetchesWhatTheNextBatchesNeed) {
  testing::InMemorySource src(8, 100, 1);
  // Slow reads keep the prefetches pending while Acquire decides: a decode
  // that finished mid-loop would free a slot and (rightly) start a 4th one,
  // which made this test depend on scheduling (seen under TSan in CI).
  src.set_delay_ms(300);
  ChunkCache cache(src, 400);
  EpochPlan plan = PlanOf({{0}, {1}, {2}, {3}, {4}}, 8);
  cache.BeginEpoch(&plan, 0);
  tbb::task_group tasks;
  auto h = cache.Acquire(0, /*max_pending=*/3, tasks);
  tasks.wait();
  EXPECT_EQ(cache.counters().prefetched.load(), 3u);
  // 0 (used once) stays in the room left, decoded by the caller, not queued.
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1, 2, 3}));
  for (uint64_t b = 1; b < 4; ++b) {
    for (auto& e : cache.Acquire(b, 0, tasks)) {
      EXPECT_EQ(e->state.load(), ChunkEntry::kDone) << "decoded ahead of its batch";
    }
  }
  tasks.wait();
}

// A chunk used by neither this plan nor the next stays only in free room:
// the first chunk needed gets its place.
TEST(ChunkCacheTest, ChunksNotNeededAheadGiveWayToChunksThatAre) {
  testing::InMemorySource src(4, 100, 1);
  ChunkCache cache(src, 200);
  EpochPlan plan = PlanOf({{0}, {1}, {2}, {3}, {2}, {3}}, 4);
  cache.BeginEpoch(&plan, 0);
  tbb::task_group tasks;
  for (uint64_t b = 0; b < plan.num_batches; ++b) {
    for (auto& e : cache.Acquire(b, 0, tasks)) ASSERT_TRUE(cache.Ensure(*e).ok());
    tasks.wait();
    if (b == 1) {
      EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1}));  // both in free room
    }
  }
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{2, 3}));  // 0 and 1 made room for them
  EXPECT_EQ(src.reads(), 4u);
}

// The future spans the epoch boundary: trace 0 1 2 3 | 2 0 3 1 with room
// for two chunks. Belady over both epochs keeps 0 and 2 (needed first in
// epoch 2) and reads 6 chunks in all, 2 of them in epoch 2; a cache that saw
// only its own epoch would drop everything at the end and read 4 again.
TEST(ChunkCacheTest, BeladyHorizonSpansTheEpochBoundary) {
  testing::InMemorySource src(4, 100, 1);
  ChunkCache cache(src, 200);
  EpochPlan e1 = PlanOf({{0}, {1}, {2}, {3}}, 4);
  EpochPlan e2 = PlanOf({{2}, {0}, {3}, {1}}, 4);
  tbb::task_group tasks;
  auto run = [&](const EpochPlan& plan) {
    for (uint64_t b = 0; b < plan.num_batches; ++b) {
      for (auto& e : cache.Acquire(b, /*max_pending=*/0, tasks)) ASSERT_TRUE(cache.Ensure(*e).ok());
    }
  };
  cache.BeginEpoch(&e1, 0, &e2);
  run(e1);
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(src.reads(), 4u);
  cache.BeginEpoch(&e2, 0, nullptr);
  run(e2);
  tasks.wait();
  EXPECT_EQ(src.reads(), 6u);  // Belady's optimum for the two-epoch trace
  EXPECT_EQ(cache.counters().reads.load(), 2u);
  EXPECT_EQ(cache.counters().hits.load(), 2u);
}

// Near an epoch's end the prefetch runs on into the next epoch's first
// batches.
TEST(ChunkCacheTest, PrefetchRunsIntoTheNextEpoch) {
  testing::InMemorySource src(6, 100, 1);
  ChunkCache cache(src, 600);
  EpochPlan e1 = PlanOf({{0}, {1}}, 6);
  EpochPlan e2 = PlanOf({{4}, {5}, {0}}, 6);
  cache.BeginEpoch(&e1, 0, &e2);
  tbb::task_group tasks;
  for (uint64_t b = 0; b < 2; ++b) {
    for (auto& e : cache.Acquire(b, /*max_pending=*/8, tasks)) ASSERT_TRUE(cache.Ensure(*e).ok());
  }
  tasks.wait();
  // 1 is not used again in either plan: it stays only because there is room.
  EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1, 4, 5}));
}

// A source that reads `depth` chunks ahead (as O_DIRECT's ring does),
// recording the hints it is given.
class ReadAheadSource : public testing::InMemorySource {
 public:
  ReadAheadSource(uint64_t n, uint32_t depth) : InMemorySource(n, 100, 1), depth_(depth) {}
  uint32_t read_ahead_chunks() const override { return depth_; }
  void WillRead(uint64_t i) const override { hints_.push_back(i); }  // from Acquire's thread only
  std::vector<uint64_t> TakeHints() const { return std::exchange(hints_, {}); }

 private:
  const uint32_t depth_;
  mutable std::vector<uint64_t> hints_;
};

// The read-ahead is fed from the plan, not from what the budget admits: with
// room for 3 chunks and no decodes started ahead, each batch still hints the
// next 3 chunks to read, in the plan's order, and the next epoch's hints skip
// the chunks the cache kept. A source that does not read ahead gets none.
TEST(ChunkCacheTest, ReadAheadHintsFollowThePlanBeyondTheBudget) {
  EpochPlan e1 = PlanOf({{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}, 8);
  EpochPlan e2 = PlanOf({{0}, {3}, {1}, {4}, {2}, {5}}, 8);
  for (uint32_t depth : {0u, 3u}) {
    SCOPED_TRACE(depth);
    ReadAheadSource src(8, depth);
    ChunkCache cache(src, 300);
    tbb::task_group tasks;
    cache.BeginEpoch(&e1, 0);
    for (uint64_t b = 0; b < e1.num_batches; ++b) {
      auto h = cache.Acquire(b, /*max_pending=*/0, tasks);
      std::vector<uint64_t> want;
      for (uint64_t c = b + 1; c < std::min<uint64_t>(b + 1 + depth, 8); ++c) want.push_back(c);
      EXPECT_EQ(src.TakeHints(), want) << "batch " << b;
      for (auto& e : h) ASSERT_TRUE(cache.Ensure(*e).ok());
    }
    // Kept in free room: 0, 1 and 2, decoded. Epoch 2 hints past them.
    EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1, 2}));
    cache.BeginEpoch(&e2, 0);
    auto h = cache.Acquire(0, /*max_pending=*/0, tasks);
    EXPECT_EQ(src.TakeHints(), depth == 0 ? std::vector<uint64_t>{} : (std::vector<uint64_t>{3, 4, 5}));
    EXPECT_EQ(cache.counters().read_hints.load(), depth);  // counted from the epoch's start
    for (auto& e : h) ASSERT_TRUE(cache.Ensure(*e).ok());
    tasks.wait();
    EXPECT_EQ(src.reads(), 8u);  // the hints change no read
  }
}

// A remote source's read-ahead follows its link (hdf5io/io/remote_window.h):
// the cache asks its depth at each batch and hints that many chunks, past
// kMaxLookaheadBatches batches when the depth is larger (here 200 chunks of
// one batch each: the 64 batches alone would cap it at 64).
TEST(ChunkCacheTest, ReadAheadHintsReachTheSourcesDepthAskedEachBatch) {
  std::vector<std::vector<uint32_t>> seq;
  for (uint32_t c = 0; c < 400; ++c) seq.push_back({c});
  EpochPlan plan = PlanOf(seq, 400);
  class MovingDepth : public ReadAheadSource {
   public:
    using ReadAheadSource::ReadAheadSource;
    uint32_t read_ahead_chunks() const override { return depth; }
    uint32_t depth = 200;
  } src(400, 0);
  ChunkCache cache(src, 100 * 400);
  tbb::task_group tasks;
  cache.BeginEpoch(&plan, 0);
  auto hinted = [&](uint64_t b) {
    auto h = cache.Acquire(b, /*max_pending=*/0, tasks);
    for (auto& e : h) EXPECT_TRUE(cache.Ensure(*e).ok());
    return src.TakeHints();
  };
  std::vector<uint64_t> want;
  for (uint64_t c = 1; c <= 200; ++c) want.push_back(c);
  EXPECT_EQ(hinted(0), want);
  src.depth = 3;  // the link holds fewer now
  EXPECT_EQ(hinted(1), (std::vector<uint64_t>{2, 3, 4}));
  src.depth = 0;  // none
  EXPECT_EQ(hinted(2), std::vector<uint64_t>{});
  tasks.wait();
}

}  // namespace
}  // namespace gpufeed::loader
