// The trainer's two train loaders run alternate epochs and share their
// decoded chunks (trainer.cc): with each cache able to hold the data, the
// epoch after the first, on the other loader, reads nothing, and its batches
// are those of a fresh loader.
#include <gtest/gtest.h>

#include "gpufeed/loader.h"
#include "loader/batch_pool.h"
#include "loader/chunk_cache.h"
#include "tests/testing/sources.h"

namespace gpufeed {
namespace {

using testing::InMemorySource;

std::vector<uint64_t> RunEpoch(Loader& l, uint64_t epoch, LoaderStats* stats) {
  std::vector<uint64_t> order;
  EpochStream s = l.Epoch(epoch);
  while (true) {
    auto b = s.Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || !b->has_value()) break;
    for (uint64_t idx : (**b).indices()) order.push_back(idx);
  }
  *stats = s.stats();
  return order;
}

TEST(SharedLoadersTest, TheOtherLoadersEpochReadsWhatTheFirstCached) {
  InMemorySource src(600, 64, 10);  // 60 chunks, 38 KB decoded
  LoaderOptions lo;
  lo.batch_size = 32;
  lo.threads = 2;
  lo.order = Order::kBlock;
  lo.cache_bytes = 1 << 20;  // each cache holds the whole dataset
  Loader a(src, lo), b(src, lo);
  auto shared = std::make_shared<loader::SharedChunks>();
  LoaderInternal::ShareChunks(a, shared);
  LoaderInternal::ShareChunks(b, shared);
  LoaderStats s0, s1;
  RunEpoch(a, 0, &s0);
  EXPECT_EQ(s0.chunk_reads, 60u);
  const uint64_t reads_before = src.reads();
  const std::vector<uint64_t> got = RunEpoch(b, 1, &s1);
  EXPECT_EQ(src.reads(), reads_before) << "epoch 1 on the other loader read chunks again";
  EXPECT_EQ(s1.chunk_reads, 0u);
  Loader fresh(src, lo);
  LoaderStats sf;
  EXPECT_EQ(got, RunEpoch(fresh, 1, &sf));
}

}  // namespace
}  // namespace gpufeed
