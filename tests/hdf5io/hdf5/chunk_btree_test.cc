// The version 1 B-tree chunk index read in one pass (hdf5io/hdf5/chunk_btree.h):
// the same entries as HDF5's own calls list, for B-trees of one and of
// several levels, version 1 and 2 object headers, a user block and filters;
// the latest file format left to HDF5; damaged nodes Corrupt; and Dataset's
// open linear in the chunks where HDF5's calls are quadratic.
#include "hdf5io/hdf5/chunk_btree.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpufeed/dataset.h"
#include "hdf5io/hdf5/h5_util.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using h5::ChunkKey;

struct FileCase {
  const char* name;
  H5F_libver_t low = H5F_LIBVER_EARLIEST, high = H5F_LIBVER_LATEST;
  hsize_t userblock = 0;
  bool deflate = false;
  bool extendible = true;
};

// /x: n chunks of 64 uint8 (value: the element's index mod 251), chunked
// 1-D; written chunk by chunk with H5Dwrite.
void WriteChunked(const std::string& path, const FileCase& c, uint64_t n) {
  h5::Id fcpl(H5Pcreate(H5P_FILE_CREATE));
  if (c.userblock) H5Pset_userblock(fcpl.get(), c.userblock);
  h5::Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  ASSERT_GE(H5Pset_libver_bounds(fapl.get(), c.low, c.high), 0);
  h5::Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()));
  ASSERT_TRUE(file.valid());
  const hsize_t dims = n * 64, chunk = 64, unlimited = H5S_UNLIMITED;
  h5::Id space(H5Screate_simple(1, &dims, c.extendible ? &unlimited : nullptr));
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl.get(), 1, &chunk);
  if (c.deflate) H5Pset_deflate(dcpl.get(), 4);
  h5::Id ds(H5Dcreate2(file.get(), "x", H5T_STD_U8LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  ASSERT_TRUE(ds.valid());
  std::vector<uint8_t> v(dims);
  for (hsize_t i = 0; i < dims; ++i) v[i] = uint8_t(i % 251);
  ASSERT_GE(H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
}

Result<std::vector<ChunkKey>> Walk(const std::string& path, hsize_t userblock, uint64_t max) {
  h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  h5::Id ds(H5Dopen2(file.get(), "x", H5P_DEFAULT));
  return h5::WalkChunkBTree(ds.get(), path, userblock, max, path + ":/x");
}

std::vector<ChunkKey> Hdf5Keys(const std::string& path) {
  h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  h5::Id ds(H5Dopen2(file.get(), "x", H5P_DEFAULT));
  auto keys = h5::ReadChunkKeys(ds.get(), UINT64_MAX);
  EXPECT_TRUE(keys.ok()) << keys.status().ToString();
  return keys.ok() ? *keys : std::vector<ChunkKey>{};
}

bool SameKeys(std::vector<ChunkKey> a, std::vector<ChunkKey> b) {
  auto by_offset = [](const ChunkKey& x, const ChunkKey& y) { return x.offset < y.offset; };
  std::sort(a.begin(), a.end(), by_offset);
  std::sort(b.begin(), b.end(), by_offset);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].offset != b[i].offset || a[i].addr != b[i].addr || a[i].size != b[i].size || a[i].mask != b[i].mask) {
      ADD_FAILURE() << "entry " << i << ": offset " << a[i].offset[0] << " at " << a[i].addr << " (" << a[i].size
                    << " bytes) against " << b[i].offset[0] << " at " << b[i].addr << " (" << b[i].size << ")";
      return false;
    }
  }
  return true;
}

// Every sample of /x read back through Dataset: the index found is the
// file's.
void ExpectReadsBack(const std::string& path) {
  OpenOptions o;
  o.labels_path = "none";
  o.trust_files = true;
  auto ds = Dataset::Open(path + ":/x", o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->info().read_path, ReadPath::kDirect) << ds->info().read_path_reason;
  std::vector<std::byte> all(ds->num_samples());
  ASSERT_TRUE(ds->ReadSamples(0, ds->num_samples(), all).ok());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(uint8_t(all[i]), uint8_t(i % 251)) << "element " << i;
}

TEST(ChunkBTreeTest, OnePassListsWhatHdf5Lists) {
  const std::string dir = testing::MakeTempDir("btree");
  const FileCase cases[] = {
      {"earliest_one_level", H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST, 0, false, true},
      {"v108_object_header_v2", H5F_LIBVER_V18, H5F_LIBVER_V18, 0, false, true},
      {"userblock_deflate", H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST, 1024, true, true},
      {"fixed_size", H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST, 0, true, false},
  };
  for (const FileCase& c : cases) {
    for (uint64_t n : {1, 7, 150, 3000}) {  // 3000 chunks: B-tree nodes of 64 entries, two levels and more
      SCOPED_TRACE(std::string(c.name) + ", " + std::to_string(n) + " chunks");
      const std::string path = dir + "/" + c.name + "-" + std::to_string(n) + ".h5";
      WriteChunked(path, c, n);
      auto walked = Walk(path, c.userblock, n);
      ASSERT_TRUE(walked.ok()) << walked.status().ToString();
      ASSERT_EQ(walked->size(), n);
      EXPECT_TRUE(SameKeys(*walked, Hdf5Keys(path)));
      ExpectReadsBack(path);
      // An index of more entries than the caller counts is Corrupt.
      if (n > 1) {
        auto fewer = Walk(path, c.userblock, n - 1);
        ASSERT_FALSE(fewer.ok());
        EXPECT_EQ(fewer.status().code(), StatusCode::kCorrupt) << fewer.status().ToString();
      }
    }
  }
}

TEST(ChunkBTreeTest, TheLatestFormatsIndexIsLeftToHdf5) {
  const std::string dir = testing::MakeTempDir("btree_latest");
  const FileCase c{"latest", H5F_LIBVER_LATEST, H5F_LIBVER_LATEST, 0, false, true};
  const std::string path = dir + "/latest.h5";
  WriteChunked(path, c, 40);
  auto walked = Walk(path, 0, 40);
  ASSERT_FALSE(walked.ok());
  EXPECT_EQ(walked.status().code(), StatusCode::kUnsupported) << walked.status().ToString();
  ExpectReadsBack(path);  // through HDF5's calls, chunk by chunk
}

// Offsets of `what` in the file's bytes.
std::vector<size_t> Find(const std::string& bytes, const std::string& what) {
  std::vector<size_t> at;
  for (size_t p = bytes.find(what); p != std::string::npos; p = bytes.find(what, p + 1)) at.push_back(p);
  return at;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(ChunkBTreeTest, DamagedNodesAreCorruptNamed) {
  const std::string dir = testing::MakeTempDir("btree_damaged");
  const FileCase c{"damaged", H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST, 0, false, true};
  const std::string good = dir + "/good.h5";
  WriteChunked(good, c, 3000);
  const std::string bytes = ReadAll(good);
  std::vector<size_t> nodes = Find(bytes, "TREE");
  ASSERT_GE(nodes.size(), 3u) << "a B-tree of several nodes";
  // The group's B-tree (type 0) is one of them: the dataset's nodes are type 1.
  std::vector<size_t> raw;
  for (size_t p : nodes) {
    if (bytes[p + 4] == 1) raw.push_back(p);
  }
  ASSERT_GE(raw.size(), 3u);
  auto expect_corrupt = [&](const std::string& name, const std::string& damaged, const std::string& text) {
    SCOPED_TRACE(name);
    const std::string path = dir + "/" + name + ".h5";
    WriteAll(path, damaged);
    auto walked = Walk(path, 0, 3000);
    ASSERT_FALSE(walked.ok());
    EXPECT_EQ(walked.status().code(), StatusCode::kCorrupt) << walked.status().ToString();
    EXPECT_NE(walked.status().message().find(text), std::string::npos) << walked.status().ToString();
  };
  // A leaf's signature gone: not a node.
  std::string no_sig = bytes;
  no_sig[raw.back()] = 'X';
  expect_corrupt("signature", no_sig, "no B-tree node signature");
  // A leaf that claims a level: not the level its parent says.
  std::string level = bytes;
  size_t leaf = 0;
  for (size_t p : raw) {
    if (bytes[p + 5] == 0) leaf = p;
  }
  ASSERT_NE(leaf, 0u);
  level[leaf + 5] = 3;
  expect_corrupt("level", level, "level 3");
  // A leaf that claims far more entries than fit in the file.
  std::string entries = bytes;
  entries[leaf + 6] = char(0xff), entries[leaf + 7] = char(0xff);
  expect_corrupt("entries", entries, "entries");
}

// Linear, not quadratic: 40,000 chunks open in well under the time HDF5's
// walk per chunk takes (measured here: 1.7 s for 20,000 chunks, 4x that for
// twice as many).
TEST(ChunkBTreeTest, ManyChunksOpenInOnePass) {
  const std::string dir = testing::MakeTempDir("btree_many");
  const FileCase c{"many", H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST, 0, false, true};
  const std::string path = dir + "/many.h5";
  WriteChunked(path, c, 40000);
  const auto t0 = std::chrono::steady_clock::now();
  OpenOptions o;
  o.labels_path = "none";
  o.trust_files = true;
  auto ds = Dataset::Open(path + ":/x", o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->num_chunks(), 40000u);
  EXPECT_LT(seconds, 3.0) << "opening 40,000 chunks";
  ExpectReadsBack(path);
}

}  // namespace
}  // namespace gpufeed
