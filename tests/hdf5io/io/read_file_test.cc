// io's reads of whole files and headers by path (hdf5io/io/read_file.h):
// bytes as written (each encodes its offset), the end of a file told apart
// from an error, sizes refused before anything is allocated, links refused
// where asked, and every error naming the path. And the readers that now go
// through it: an IDX file of two gzip members (gzread read both), a .npy
// mapped, an image folder's file rewritten after the open.
#include "hdf5io/io/read_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpufeed/sample_source.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;

uint8_t ByteAt(uint64_t offset) { return static_cast<uint8_t>((offset * 131 + 7) ^ (offset >> 8)); }

std::string WriteBytes(const std::string& path, uint64_t n) {
  std::string b(n, '\0');
  for (uint64_t i = 0; i < n; ++i) b[i] = static_cast<char>(ByteAt(i));
  std::ofstream(path, std::ios::binary) << b;
  return b;
}

TEST(ReadFileTest, WholeFilesReadAsWrittenAndSizesAreRefusedFirst) {
  const std::string dir = testing::MakeTempDir("read_file_whole");
  const std::string want = WriteBytes(dir + "/f", 200'003);  // more than one read of most kernels' pipes
  std::string got;
  ASSERT_TRUE(io::ReadWholeFile(dir + "/f", &got).ok());
  EXPECT_EQ(got, want);
  std::vector<unsigned char> bytes;
  ASSERT_TRUE(io::ReadWholeFile(dir + "/f", &bytes).ok());
  ASSERT_EQ(bytes.size(), want.size());
  for (size_t i = 0; i < bytes.size(); i += 997) ASSERT_EQ(bytes[i], ByteAt(i)) << i;

  // Over the bound: refused before the buffer is sized.
  std::string small = "untouched";
  Status big = io::ReadWholeFile(dir + "/f", &small, 1000);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("200003 bytes"), std::string::npos) << big.ToString();
  EXPECT_EQ(small, "untouched");
  // The caller's refusal (a size it did not expect) is the answer.
  Status other = io::ReadWholeFile(dir + "/f", [](uint64_t size) -> Result<std::byte*> {
    return Status::Corrupt("expected 5 bytes, not " + std::to_string(size));
  });
  EXPECT_EQ(other.code(), StatusCode::kCorrupt);
  EXPECT_EQ(other.message(), "expected 5 bytes, not 200003");

  Status missing = io::ReadWholeFile(dir + "/nope", &got);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(dir + "/nope"), std::string::npos);
  Status a_dir = io::ReadWholeFile(dir, &got);
  EXPECT_EQ(a_dir.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a_dir.message().find("is a directory"), std::string::npos) << a_dir.ToString();
  std::ofstream(dir + "/empty");
  got = "x";
  ASSERT_TRUE(io::ReadWholeFile(dir + "/empty", &got).ok());
  EXPECT_TRUE(got.empty());
}

TEST(ReadFileTest, ReadsAtOffsetsStopAtTheEndAndExactReadsSayTheFileEnded) {
  const std::string dir = testing::MakeTempDir("read_file_at");
  WriteBytes(dir + "/f", 1000);
  auto f = io::ReadOnlyFile::Open(dir + "/f");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->size(), 1000u);
  std::vector<std::byte> buf(64);
  auto got = f->ReadAt(990, buf);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 10u);  // the end of the file, not an error
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(static_cast<uint8_t>(buf[i]), ByteAt(990 + i));
  got = f->ReadAt(5000, buf);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
  ASSERT_TRUE(f->ReadExactly(100, buf).ok());
  EXPECT_EQ(static_cast<uint8_t>(buf[0]), ByteAt(100));
  Status past = f->ReadExactly(990, buf);
  EXPECT_EQ(past.code(), StatusCode::kCorrupt);
  EXPECT_NE(past.message().find(dir + "/f: ends at byte 1000"), std::string::npos) << past.ToString();
  // Moved, the file is read through its new owner; the old one holds nothing.
  io::ReadOnlyFile moved = std::move(*f);
  ASSERT_TRUE(moved.ReadExactly(0, std::span(buf).first(8)).ok());
  EXPECT_EQ(static_cast<uint8_t>(buf[7]), ByteAt(7));
}

TEST(ReadFileTest, ALinkIsFollowedUnlessNoFollowIsAsked) {
  const std::string dir = testing::MakeTempDir("read_file_link");
  const std::string want = WriteBytes(dir + "/target", 100);
  fs::create_symlink(dir + "/target", dir + "/link");
  std::string got;
  ASSERT_TRUE(io::ReadWholeFile(dir + "/link", &got).ok());
  EXPECT_EQ(got, want);
  Status refused = io::ReadWholeFile(dir + "/link", &got, UINT64_MAX, {.no_follow = true});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find(dir + "/link: is a symbolic link"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(io::ReadWholeFile(dir + "/target", &got, UINT64_MAX, {.no_follow = true}).ok());
}

TEST(ReadFileTest, MappedFilesAndCopiesHoldTheFilesBytes) {
  const std::string dir = testing::MakeTempDir("read_file_map");
  const std::string want = WriteBytes(dir + "/f", 70'001);
  auto m = io::MappedFile::Open(dir + "/f");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->bytes().size(), want.size());
  EXPECT_EQ(std::memcmp(m->bytes().data(), want.data(), want.size()), 0);
  io::MappedFile moved = std::move(*m);
  EXPECT_EQ(static_cast<uint8_t>(moved.bytes()[70'000]), ByteAt(70'000));
  std::ofstream(dir + "/empty");
  auto empty = io::MappedFile::Open(dir + "/empty");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->bytes().empty());
  EXPECT_EQ(io::MappedFile::Open(dir + "/nope").status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(io::CopyFile(dir + "/f", dir + "/copy", 0640).ok());
  std::string copy;
  ASSERT_TRUE(io::ReadWholeFile(dir + "/copy", &copy).ok());
  EXPECT_EQ(copy, want);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/copy").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0700, 0600u);  // the mode asked (less the umask, which leaves the owner's bits)
  Status exists = io::CopyFile(dir + "/f", dir + "/copy", 0640);  // never over an existing file
  EXPECT_EQ(exists.code(), StatusCode::kIOError);
  EXPECT_NE(exists.message().find(dir + "/copy"), std::string::npos) << exists.ToString();
}

// gzip members, one after another (what `cat a.gz b.gz` makes), as gzread read them.
void AppendGzipMember(const std::string& path, const std::vector<uint8_t>& data) {
  gzFile g = gzopen((path + ".part").c_str(), "wb");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(gzwrite(g, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  ASSERT_EQ(gzclose(g), Z_OK);
  std::ifstream in(path + ".part", std::ios::binary);
  std::ofstream(path, std::ios::binary | std::ios::app) << in.rdbuf();
  fs::remove(path + ".part");
}

TEST(ReadFileTest, AnIdxFileOfTwoGzipMembersReadsWhole) {
  const std::string dir = testing::MakeTempDir("read_file_idx");
  constexpr uint32_t kN = 40;
  std::vector<uint8_t> file = {0, 0, 0x08, 3, 0, 0, 0, kN, 0, 0, 0, 4, 0, 0, 0, 4};
  std::vector<std::byte> samples(kN * 16);
  testing::FillIndexSamples(0, kN, 16, samples);
  for (std::byte b : samples) file.push_back(static_cast<uint8_t>(b));
  const std::vector<uint8_t> first(file.begin(), file.begin() + 300), rest(file.begin() + 300, file.end());
  AppendGzipMember(dir + "/img.gz", first);
  AppendGzipMember(dir + "/img.gz", rest);
  auto src = OpenIdxSource(dir + "/img.gz", "");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ((*src)->num_samples(), kN);
  EXPECT_EQ((*src)->input_bytes(), fs::file_size(dir + "/img.gz"));
  std::vector<std::byte> got(kN * 16);
  ASSERT_TRUE((*src)->Read(0, kN, got).ok());
  for (uint64_t k = 0; k < kN; ++k) {
    EXPECT_EQ(testing::SampleIndexOf(std::span(got).subspan(k * 16, 16)), static_cast<int64_t>(k));
  }
  // A damaged member is Corrupt, naming the file.
  std::string bytes;
  ASSERT_TRUE(io::ReadWholeFile(dir + "/img.gz", &bytes).ok());
  bytes[20] = static_cast<char>(bytes[20] ^ 0xff);
  bytes[21] = static_cast<char>(bytes[21] ^ 0xff);
  std::ofstream(dir + "/bad.gz", std::ios::binary) << bytes;
  auto bad = OpenIdxSource(dir + "/bad.gz", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find(dir + "/bad.gz"), std::string::npos);
}

}  // namespace
}  // namespace gpufeed
