// Index-valued test data and HDF5 file builders shared by the tests.
//
// Sample k's bytes encode k: its first 8 bytes are k (little-endian) when the
// sample has room, and every byte is a hash of (k, position), so a lost,
// doubled, reordered or corrupted sample is identified exactly.
#ifndef GPUFEED_TESTS_TESTING_TEST_DATA_H_
#define GPUFEED_TESTS_TESTING_TEST_DATA_H_

#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gpufeed::testing {

uint8_t IndexByte(uint64_t sample, uint64_t pos);
// Fills `dst` with samples [first, first + count) of `sample_bytes` each.
void FillIndexSamples(uint64_t first, uint64_t count, uint64_t sample_bytes, std::span<std::byte> dst);
std::vector<std::byte> IndexSamples(uint64_t n, uint64_t sample_bytes);
// The index a sample's bytes claim, or -1 if the bytes match no index.
int64_t SampleIndexOf(std::span<const std::byte> sample);
// Label of sample k in test files.
inline int64_t IndexLabel(uint64_t k) { return static_cast<int64_t>(k % 10); }

// A fresh empty directory under the test temp dir.
std::string MakeTempDir(const std::string& tag);

// How a test file's /images is stored; written with HDF5's own H5Dwrite and
// filters (the code path h5py uses), independent of gpufeed's writer.
struct H5Layout {
  std::vector<hsize_t> chunk;  // empty: contiguous
  bool shuffle = false;
  int deflate = -1;  // level, -1: none
  int zstd = -1;     // level, -1: none
  bool fletcher32 = false;
  hsize_t userblock = 0;
  bool big_endian = false;
};

// Writes `path` with /images of `shape` (axis 0 = samples), element type
// `mem_type` (a native HDF5 type), bytes `data`, and /labels (IndexLabel)
// unless with_labels is false. Returns false on any HDF5 error.
bool WriteH5(const std::string& path, const std::vector<hsize_t>& shape, hid_t mem_type,
             std::span<const std::byte> data, const H5Layout& layout, bool with_labels = true);

}  // namespace gpufeed::testing

#endif  // GPUFEED_TESTS_TESTING_TEST_DATA_H_
