// DefaultLoaderThreads: a torchrun rank takes its share of the host's cores.
#include "common/cores.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <string>

namespace gpufeed {
namespace {

class LocalWorld {  // sets LOCAL_WORLD_SIZE for one test, restores it after
 public:
  explicit LocalWorld(const char* value) {
    const char* old = getenv("LOCAL_WORLD_SIZE");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv("LOCAL_WORLD_SIZE", value, 1);
    } else {
      unsetenv("LOCAL_WORLD_SIZE");
    }
  }
  ~LocalWorld() {
    if (had_) {
      setenv("LOCAL_WORLD_SIZE", old_.c_str(), 1);
    } else {
      unsetenv("LOCAL_WORLD_SIZE");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

TEST(CoresTest, AvailableCoresIsTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_EQ(AvailableCores(), CPU_COUNT(&set));
}

TEST(CoresTest, LocalRanksSplitTheCores) {
  const int cores = AvailableCores();
  {
    LocalWorld w(nullptr);
    EXPECT_EQ(DefaultLoaderThreads(), cores);
  }
  {
    LocalWorld w("1");
    EXPECT_EQ(DefaultLoaderThreads(), cores);
  }
  {
    LocalWorld w("2");
    EXPECT_EQ(DefaultLoaderThreads(), std::max(2, cores / 2));
  }
  {
    LocalWorld w("64");  // more ranks than cores: each still gets 2
    EXPECT_EQ(DefaultLoaderThreads(), std::max(2, cores / 64));
  }
  for (const char* junk : {"", "x", "2x", "-3", "0", "99999999999"}) {
    LocalWorld w(junk);
    EXPECT_EQ(DefaultLoaderThreads(), cores) << "LOCAL_WORLD_SIZE=" << junk;
  }
}

}  // namespace
}  // namespace gpufeed
