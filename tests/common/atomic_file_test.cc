// AtomicFile: the target is either untouched or the whole new content; an
// uncommitted write leaves no temporary file; errors name the file.
#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

std::string Slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t FilesIn(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(AtomicFileTest, CommitReplacesTheTargetWhole) {
  const std::string dir = testing::MakeTempDir("atomic");
  const std::string path = dir + "/out.bin";
  ASSERT_TRUE(AtomicFile::WriteWhole(path, "old").ok());
  {
    AtomicFile f(path);
    ASSERT_TRUE(f.Write("new ").ok());
    ASSERT_TRUE(f.Write("content").ok());
    EXPECT_EQ(Slurp(path), "old");  // not visible before Commit
    EXPECT_TRUE(std::filesystem::exists(f.tmp_path()));
    ASSERT_TRUE(f.Commit().ok());
  }
  EXPECT_EQ(Slurp(path), "new content");
  EXPECT_EQ(FilesIn(dir), 1u);
}

TEST(AtomicFileTest, UncommittedWriteLeavesTheTargetAndNoTemporary) {
  const std::string dir = testing::MakeTempDir("atomic");
  const std::string path = dir + "/out.bin";
  ASSERT_TRUE(AtomicFile::WriteWhole(path, "old").ok());
  {
    AtomicFile f(path);
    ASSERT_TRUE(f.Write("half").ok());
  }
  EXPECT_EQ(Slurp(path), "old");
  EXPECT_EQ(FilesIn(dir), 1u);
}

TEST(AtomicFileTest, UnwritableDirectoryIsNamed) {
  Status st = AtomicFile::WriteWhole("/proc/gpufeed-no-such-dir/out.bin", "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("/proc/gpufeed-no-such-dir/out.bin"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace gpufeed
