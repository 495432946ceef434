// Sample orders and epoch plans: pure, sharded without loss or doubling.
#include "loader/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace gpufeed::loader {
namespace {

TEST(SamplerTest, OrdersArePermutationsAndDeterministic) {
  for (Order o : {Order::kSequential, Order::kRandom, Order::kBlock}) {
    auto a = GlobalOrder(1003, 10, o, 7, 3, 4);
    auto sorted = a;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i) << OrderName(o);
    EXPECT_EQ(a, GlobalOrder(1003, 10, o, 7, 3, 4)) << OrderName(o);
    if (o != Order::kSequential) {
      EXPECT_NE(a, GlobalOrder(1003, 10, o, 7, 4, 4)) << "epochs differ";
      EXPECT_NE(a, GlobalOrder(1003, 10, o, 8, 3, 4)) << "seeds differ";
    }
  }
}

TEST(SamplerTest, BlockWindowsHoldWChunks) {
  const uint64_t k = 10, w = 4, n = 1000;  // 100 chunks, 25 windows of 40 samples
  auto a = GlobalOrder(n, k, Order::kBlock, 1, 0, w);
  std::set<uint64_t> all_chunks;
  for (uint64_t g = 0; g < n / (w * k); ++g) {
    std::set<uint64_t> chunks;
    for (uint64_t p = g * w * k; p < (g + 1) * w * k; ++p) chunks.insert(a[p] / k);
    EXPECT_EQ(chunks.size(), w) << "window " << g;
    for (uint64_t c : chunks) EXPECT_TRUE(all_chunks.insert(c).second) << "chunk " << c << " in two windows";
  }
  // Samples are shuffled within windows, not left in chunk order.
  EXPECT_NE(std::vector<uint64_t>(a.begin(), a.begin() + 10),
            std::vector<uint64_t>(
                {a[0], a[0] + 1, a[0] + 2, a[0] + 3, a[0] + 4, a[0] + 5, a[0] + 6, a[0] + 7, a[0] + 8, a[0] + 9}));
}

// Block order with ranks: windows end at shard boundaries, so ranks share
// at most the chunk a boundary cuts (and the last rank's padding), not a
// whole window of chunks each.
TEST(SamplerTest, BlockShardsReadTheirOwnChunks) {
  const uint64_t k = 10, w = 16;
  for (uint64_t n : {uint64_t{1000}, uint64_t{1003}}) {
    for (int world : {2, 4, 7}) {
      std::vector<std::set<uint64_t>> chunks(world);
      for (int r = 0; r < world; ++r) {
        LoaderOptions opt;
        opt.batch_size = 32;
        opt.order = Order::kBlock;
        opt.shuffle_window = w;
        opt.seed = 9;
        opt.rank = r;
        opt.world_size = world;
        auto plan = MakeEpochPlan(n, k, (n + k - 1) / k, opt, 1);
        ASSERT_TRUE(plan.ok());
        // The last rank's padding (samples from the start of the order) aside.
        const uint64_t own = std::min<uint64_t>(plan->samples.size(), n - r * plan->samples.size());
        for (uint64_t i = 0; i < own; ++i) chunks[r].insert(plan->samples[i] / k);
        // Samples are still shuffled across the chunks of a window.
        std::set<uint64_t> first10;
        for (int i = 0; i < 10; ++i) first10.insert(plan->samples[i] / k);
        EXPECT_GT(first10.size(), 1u) << "world " << world << " rank " << r << ": not shuffled";
      }
      for (int r = 0; r < world; ++r) {
        for (int q = r + 1; q < world; ++q) {
          std::vector<uint64_t> both;
          std::set_intersection(chunks[r].begin(), chunks[r].end(), chunks[q].begin(), chunks[q].end(),
                                std::back_inserter(both));
          EXPECT_LE(both.size(), 1u) << "n " << n << " world " << world << ": ranks " << r << " and " << q << " read "
                                     << both.size() << " chunks both";
        }
      }
    }
  }
}

TEST(SamplerTest, ShardsAreDisjointAndComplete) {
  const uint64_t n = 1001, b = 16;
  for (Order o : {Order::kSequential, Order::kRandom, Order::kBlock}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (bool drop_last : {false, true}) {
        std::multiset<uint64_t> seen;
        uint64_t per_rank = 0;
        for (int r = 0; r < world; ++r) {
          LoaderOptions opt;
          opt.batch_size = b;
          opt.order = o;
          opt.seed = 5;
          opt.rank = r;
          opt.world_size = world;
          opt.drop_last = drop_last;
          auto plan = MakeEpochPlan(n, 10, 101, opt, 2);
          ASSERT_TRUE(plan.ok());
          if (r == 0) per_rank = plan->samples.size();
          EXPECT_EQ(plan->samples.size(), per_rank) << "ranks get equal shares";
          seen.insert(plan->samples.begin(), plan->samples.end());
          if (drop_last) {
            EXPECT_EQ(plan->samples.size() % b, 0u);
            EXPECT_EQ(plan->samples.size(), n / world / b * b);
          }
        }
        std::set<uint64_t> distinct(seen.begin(), seen.end());
        if (drop_last) {
          EXPECT_EQ(distinct.size(), seen.size()) << "no sample doubled";
        } else {
          EXPECT_EQ(distinct.size(), n) << "no sample lost";
          EXPECT_EQ(seen.size(), per_rank * world);
          EXPECT_LT(seen.size() - n, static_cast<uint64_t>(world)) << "padding only";
        }
      }
    }
  }
}

TEST(SamplerTest, PlanListsChunkUsers) {
  LoaderOptions opt;
  opt.batch_size = 4;
  opt.order = Order::kSequential;
  auto plan = MakeEpochPlan(10, 3, 4, opt, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_batches, 3u);
  EXPECT_EQ(plan->batch_chunks[0], (std::vector<uint32_t>{0, 1}));  // samples 0-3
  EXPECT_EQ(plan->batch_chunks[1], (std::vector<uint32_t>{1, 2}));  // 4-7
  EXPECT_EQ(plan->batch_chunks[2], (std::vector<uint32_t>{2, 3}));  // 8-9
  EXPECT_EQ(plan->chunk_users[1], (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(plan->batch_count(2), 2u);
  opt.batch_size = 0;
  EXPECT_FALSE(MakeEpochPlan(10, 3, 4, opt, 0).ok());
  opt.batch_size = 4;
  opt.rank = 2;
  opt.world_size = 2;
  EXPECT_FALSE(MakeEpochPlan(10, 3, 4, opt, 0).ok());
}

}  // namespace
}  // namespace gpufeed::loader
