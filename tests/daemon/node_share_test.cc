// Share::kNode through OpenBatchSource (the door every caller uses): ranks
// of one job on one host find or start one node-local server, read their
// own shards through it, and the server ends with the last of them.
#include "daemon/node_share.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gpufeed/open_source.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

class ScopedEnv {  // sets variables for one test, restores them after
 public:
  void Set(const char* name, const std::string& value) {
    const char* old = getenv(name);
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) {
        setenv(it->name, it->value.c_str(), 1);
      } else {
        unsetenv(it->name);
      }
    }
  }

 private:
  struct Saved {
    const char* name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

SourceOptions Rank(const std::string& data, int rank, int world) {
  SourceOptions o;
  o.data = data;
  o.loader.batch_size = 32;
  o.loader.seed = 3;
  o.loader.threads = 2;
  o.loader.prefetch = 2;
  o.loader.rank = rank;
  o.loader.world_size = world;
  o.loader.cache_bytes = 1 << 20;
  return o;
}

TEST(NodeShareTest, ResolvesAutoUnderTorchrunAndRefusesWhatTheServerCannotTake) {
  ScopedEnv env;
  env.Set("LOCAL_WORLD_SIZE", "1");
  SourceOptions o = Rank("x.h5", 0, 1);
  EXPECT_EQ(*ResolveShare(o), Share::kNone);
  env.Set("LOCAL_WORLD_SIZE", "2");
  EXPECT_EQ(*ResolveShare(o), Share::kNode);
  o.open.labels_path = "/y";
  EXPECT_EQ(*ResolveShare(o), Share::kNone);  // auto: a local loader takes it
  o.share = Share::kNode;
  auto r = ResolveShare(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot pass labels"), std::string::npos) << r.status().message();
  o = Rank("unix:/tmp/x.sock", 0, 1);
  EXPECT_EQ(*ResolveShare(o), Share::kNone);
  o.share = Share::kNode;
  EXPECT_FALSE(ResolveShare(o).ok());
  EXPECT_FALSE(ShareFromName("sometimes").ok());
  EXPECT_EQ(*ShareFromName("node"), Share::kNode);
}

TEST(NodeShareTest, RanksShareOneServerThatEndsWithTheLast) {
#if !GPUFEED_TESTS_HAVE_CLI
  GTEST_SKIP() << "this build has no gpufeed command to start as the node's server (GPUFEED_BUILD_CLI=OFF: "
                  "scripts/test's ThreadSanitizer pass)";
#endif
  const std::string dir = testing::MakeTempDir("node");
  const std::string data = dir + "/data.h5";
  const uint64_t n = 300, sb = 3 * 4 * 4;
  testing::H5Layout layout;
  layout.chunk = {20, 3, 4, 4};
  ASSERT_TRUE(testing::WriteH5(data, {n, 3, 4, 4}, H5T_NATIVE_UINT8, testing::IndexSamples(n, sb), layout));
  ScopedEnv env;
  env.Set("GPUFEED_NODE_DIR", dir);
  env.Set("LOCAL_WORLD_SIZE", "2");
  env.Set("TORCHELASTIC_RUN_ID", "node-share-test-" + std::to_string(::getpid()));
  auto first = OpenBatchSource(Rank(data, 0, 2));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = OpenBatchSource(Rank(data, 1, 2));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE((*first)->node_shared() && (*second)->node_shared());
  EXPECT_TRUE((*first)->started_node_server());
  EXPECT_FALSE((*second)->started_node_server());
  std::vector<int> seen(n, 0);
  for (auto* s : {&*first, &*second}) {
    for (const Batch& b : (*s)->source().Epoch(0)) {
      for (uint64_t i = 0; i < b.size(); ++i) {
        ASSERT_EQ(testing::SampleIndexOf(b.images().subspan(i * sb, sb)), static_cast<int64_t>(b.indices()[i]));
        seen[b.indices()[i]] += 1;
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(n));
  // The server's socket stays while a rank holds the lease, and goes after.
  std::string sock;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".sock") sock = e.path().string();
  }
  ASSERT_FALSE(sock.empty());
  first->reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  struct stat st {};
  EXPECT_EQ(::stat(sock.c_str(), &st), 0) << "the server stopped while a rank still held it";
  second->reset();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::stat(sock.c_str(), &st) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(::stat(sock.c_str(), &st), 0) << "the node's server outlived its last rank";
}

}  // namespace
}  // namespace gpufeed
