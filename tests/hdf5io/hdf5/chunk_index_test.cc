// The chunk index checked (hdf5io/hdf5/chunk_index.h): a key outside the extent,
// off the grid or on another chunk's offset is Corrupt, named; and a file
// whose v1 B-tree key was damaged by one byte, which HDF5 reads as the fill
// value while the chunk's bytes sit in the file, is Corrupt instead of the
// chunk's bytes at a place HDF5 does not put them.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpufeed/dataset.h"
#include "hdf5io/hdf5/chunk_index.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using h5::CheckChunkKeys;
using h5::ChunkKey;

const std::vector<uint64_t> kExtent{40, 4}, kChunk{8, 4};

std::vector<ChunkKey> GoodKeys() {
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 5; ++i) keys.push_back({{i * 8, 0}, 1000 + 32 * i, 32});
  return keys;
}

void ExpectCorrupt(const Status& st, const std::vector<std::string>& texts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  for (const std::string& t : texts) EXPECT_NE(st.message().find(t), std::string::npos) << t << ": " << st.ToString();
}

TEST(ChunkIndexTest, KeysOnTheGridInsideTheExtentPass) {
  EXPECT_TRUE(CheckChunkKeys(GoodKeys(), kExtent, kChunk, "f.h5:/images").ok());
  auto shuffled = GoodKeys();  // the index's order is its own
  std::swap(shuffled[0], shuffled[3]);
  EXPECT_TRUE(CheckChunkKeys(shuffled, kExtent, kChunk, "f.h5:/images").ok());
}

TEST(ChunkIndexTest, AKeyOutsideTheExtentIsCorrupt) {
  auto keys = GoodKeys();
  keys[2].offset[0] = 40;
  ExpectCorrupt(CheckChunkKeys(keys, kExtent, kChunk, "f.h5:/images"),
                {"f.h5:/images", "entry 2 of 5", "offset [40, 0]", "outside the dataset's extent [40, 4]"});
  keys = GoodKeys();
  keys[1].offset[1] = 4;  // past the sample's extent on axis 1
  ExpectCorrupt(CheckChunkKeys(keys, kExtent, kChunk, "f.h5:/images"), {"entry 1 of 5", "offset [8, 4]"});
}

TEST(ChunkIndexTest, AKeyOffTheGridIsCorrupt) {
  auto keys = GoodKeys();
  keys[3].offset[0] = 25;
  ExpectCorrupt(CheckChunkKeys(keys, kExtent, kChunk, "f.h5:/images"),
                {"entry 3 of 5", "offset [25, 0]", "off the chunk grid [8, 4] on axis 0"});
}

TEST(ChunkIndexTest, TwoKeysAtOneOffsetAreCorrupt) {
  auto keys = GoodKeys();
  keys[4].offset[0] = 8;
  ExpectCorrupt(CheckChunkKeys(keys, kExtent, kChunk, "f.h5:/images"),
                {"entries 1 and 4 both hold the chunk at offset [8, 0]", "1032", "1128"});
  keys = GoodKeys();
  keys[1].offset = {0, 0, 0};
  ExpectCorrupt(CheckChunkKeys(keys, kExtent, kChunk, "f.h5:/images"), {"entry 1 of 5", "3 coordinates"});
}

// /images uint8 [40, 4] in chunks of [8, 4], unfiltered, indexed by a
// version 1 B-tree (HDF5's oldest format, its default); sample k's row holds
// k. Returns the file's bytes.
std::vector<char> WriteV1BTreeFile(const std::string& path) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  hsize_t dims[2] = {40, 4}, chunk[2] = {8, 4};
  hid_t space = H5Screate_simple(2, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 2, chunk);
  hid_t d = H5Dcreate2(f, "images", H5T_NATIVE_UINT8, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  std::vector<uint8_t> bytes(160);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i / 4);
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  H5Pclose(fapl);
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// Where chunk key `k` of the raw-data B-tree node starts: after the node's
// "TREE", type 1, level, entry count and two sibling addresses (24 bytes),
// each key (chunk size 4, filter mask 4, 3 offsets of 8: the two axes and
// the element's byte) followed by a child address of 8.
size_t KeyAt(const std::vector<char>& file, int k) {
  const std::string bytes(file.begin(), file.end());
  for (size_t at = bytes.find("TREE"); at != std::string::npos; at = bytes.find("TREE", at + 1)) {
    if (bytes[at + 4] == 1) return at + 24 + static_cast<size_t>(k) * (8 + 3 * 8 + 8);
  }
  ADD_FAILURE() << "no raw-data B-tree node";
  return 0;
}

void Rewrite(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

// HDF5's own read of samples [16, 24) (chunk 2).
std::vector<uint8_t> Hdf5ReadsChunk2(const std::string& path) {
  std::vector<uint8_t> out(32, 0xEE);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "images", H5P_DEFAULT);
  hid_t space = H5Dget_space(d);
  hsize_t start[2] = {16, 0}, count[2] = {8, 4};
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t mem = H5Screate_simple(2, count, nullptr);
  EXPECT_GE(H5Dread(d, H5T_NATIVE_UINT8, mem, space, H5P_DEFAULT, out.data()), 0);
  H5Sclose(mem);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  return out;
}

TEST(ChunkIndexTest, AFlippedByteInAV1BTreeKeyIsCorrupt) {
  const std::string path = testing::MakeTempDir("chunk_key") + "/flipped.h5";
  std::vector<char> bytes = WriteV1BTreeFile(path);
  {
    auto ds = Dataset::Open(path);  // undamaged: the direct path, every byte right
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->info().read_path, ReadPath::kDirect);
    std::vector<std::byte> got(160);
    ASSERT_TRUE(ds->ReadSamples(0, 40, got).ok());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(static_cast<uint8_t>(got[i]), i / 4) << i;
  }
  // Chunk 2's key: its offset on the element-byte axis, 0 -> 1. HDF5's
  // lookup no longer finds the chunk (it reads the fill value), while a walk
  // of the index still lists it at [16, 0].
  const size_t key = KeyAt(bytes, 2);
  ASSERT_EQ(bytes[key + 8], 16);  // offset on axis 0: 16
  bytes[key + 8 + 16] ^= 1;
  Rewrite(path, bytes);
  ASSERT_EQ(Hdf5ReadsChunk2(path), std::vector<uint8_t>(32, 0)) << "the damage is not the one this test is about";
  auto ds = Dataset::Open(path);
  ASSERT_FALSE(ds.ok()) << "read the chunk's bytes where HDF5 reads the fill value";
  ExpectCorrupt(ds.status(), {path + ":/images", "chunk 2", "[16, 0]", "fill value"});
}

TEST(ChunkIndexTest, AKeyMovedOutsideTheExtentOrOntoAnotherIsCorrupt) {
  const std::string dir = testing::MakeTempDir("chunk_key_moved");
  const std::string path = dir + "/moved.h5";
  const std::vector<char> good = WriteV1BTreeFile(path);
  const size_t key = KeyAt(good, 2);
  std::vector<char> bytes = good;
  bytes[key + 8 + 1] = 1;  // offset 16 -> 272, past the 40 samples
  Rewrite(path, bytes);
  ExpectCorrupt(Dataset::Open(path).status(), {path + ":/images", "offset [272, 0]", "outside the dataset's extent"});
  bytes = good;
  bytes[key + 8] = 8;  // offset 16 -> 8, chunk 1's
  Rewrite(path, bytes);
  ExpectCorrupt(Dataset::Open(path).status(), {path + ":/images", "both hold the chunk at offset [8, 0]"});
}

}  // namespace
}  // namespace gpufeed
