// Belady eviction and prefetch decisions of the chunk cache.
#include "loader/chunk_cache.h"

#include <gtest/gtest.h>

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
    if (b == 1) EXPECT_EQ(cache.ResidentChunks(), (std::vector<uint32_t>{0, 1}));  // both in free room
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

}  // namespace
}  // namespace gpufeed::loader
