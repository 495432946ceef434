// io's policy for the direct path (hdf5io/io/io_policy.h), asked directly:
// auto chooses by the file's size against the memory the page cache has, a
// mode asked outright is kept, the environment overrides auto only, a
// remote object is buffered, the read-ahead depth is bounded and a bad
// variable is named. (Through Dataset::Open: DirectIoTest.)
#include "hdf5io/io/io_policy.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <string>
#include <thread>

#include "common/memory.h"

namespace gpufeed {
namespace {

class ScopedEnv {  // sets (or unsets) a variable for one test, restores it after
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(IoPolicyTest, AutoChoosesByTheFilesSizeAndAnAskedModeIsKept) {
  ScopedEnv io("GPUFEED_IO", nullptr), depth("GPUFEED_IO_DEPTH", nullptr);
  auto policy = io::IoPolicy::Resolve(IoMode::kAuto);
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  EXPECT_EQ(policy->depth(), std::clamp(std::thread::hardware_concurrency(), 4u, 32u));
  const uint64_t avail = AvailableMemoryBytes();
  const io::IoChoice small = policy->For("/data/small.h5", 1 << 20);
  EXPECT_EQ(small.mode, IoMode::kBuffered);
  EXPECT_NE(small.note.find("fits in"), std::string::npos) << small.note;
  const io::IoChoice big = policy->For("/data/big.h5", avail + 1);
  EXPECT_EQ(big.mode, IoMode::kDirect);
  EXPECT_NE(big.note.find("exceeds"), std::string::npos) << big.note;
  EXPECT_EQ(big.depth, policy->depth());
  // A remote object: its transport reads ahead; O_DIRECT does not apply.
  EXPECT_EQ(policy->For("s3://bucket/big.h5", avail + 1).mode, IoMode::kBuffered);

  for (IoMode m : {IoMode::kDirect, IoMode::kBuffered}) {
    auto asked = io::IoPolicy::Resolve(m);
    ASSERT_TRUE(asked.ok());
    const io::IoChoice c = asked->For("/data/big.h5", avail + 1);
    EXPECT_EQ(c.mode, m);
    EXPECT_TRUE(c.note.empty()) << c.note;
  }
}

TEST(IoPolicyTest, TheEnvironmentOverridesAutoOnlyAndBadValuesAreNamed) {
  {
    ScopedEnv io("GPUFEED_IO", "direct");
    auto automatic = io::IoPolicy::Resolve(IoMode::kAuto);
    ASSERT_TRUE(automatic.ok());
    EXPECT_EQ(automatic->For("/data/small.h5", 1).mode, IoMode::kDirect);
    auto buffered = io::IoPolicy::Resolve(IoMode::kBuffered);
    ASSERT_TRUE(buffered.ok());
    EXPECT_EQ(buffered->For("/data/small.h5", 1).mode, IoMode::kBuffered);
  }
  {
    ScopedEnv io("GPUFEED_IO", "fast");
    auto bad = io::IoPolicy::Resolve(IoMode::kAuto);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("GPUFEED_IO"), std::string::npos) << bad.status().ToString();
    EXPECT_TRUE(io::IoPolicy::Resolve(IoMode::kDirect).ok());  // asked outright: the variable is not read
  }
  {
    ScopedEnv depth("GPUFEED_IO_DEPTH", "5");
    auto p = io::IoPolicy::Resolve(IoMode::kDirect);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->For("/data/f.h5", 1).depth, 5u);
  }
  for (const char* bad : {"0", "257", "-3", "8x"}) {
    ScopedEnv depth("GPUFEED_IO_DEPTH", bad);
    auto p = io::IoPolicy::Resolve(IoMode::kDirect);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.status().message().find(std::string("GPUFEED_IO_DEPTH='") + bad + "'"), std::string::npos)
        << p.status().ToString();
  }
}

}  // namespace
}  // namespace gpufeed
