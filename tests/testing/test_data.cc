// Index-valued samples and an HDF5 writer that uses HDF5's own filters.
#include "tests/testing/test_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>

#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/zstd_filter.h"

namespace gpufeed::testing {

uint8_t IndexByte(uint64_t sample, uint64_t pos) {
  uint64_t x = sample * 0x9E3779B97F4A7C15ull + pos * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return static_cast<uint8_t>(x >> 56);
}

void FillIndexSamples(uint64_t first, uint64_t count, uint64_t sample_bytes, std::span<std::byte> dst) {
  for (uint64_t k = 0; k < count; ++k) {
    std::byte* s = dst.data() + k * sample_bytes;
    const uint64_t idx = first + k;
    for (uint64_t p = 0; p < sample_bytes; ++p) s[p] = std::byte{IndexByte(idx, p)};
    if (sample_bytes >= 8) std::memcpy(s, &idx, 8);
  }
}

std::vector<std::byte> IndexSamples(uint64_t n, uint64_t sample_bytes) {
  std::vector<std::byte> v(n * sample_bytes);
  FillIndexSamples(0, n, sample_bytes, v);
  return v;
}

int64_t SampleIndexOf(std::span<const std::byte> sample) {
  if (sample.size() < 8) return -1;
  uint64_t idx;
  std::memcpy(&idx, sample.data(), 8);
  for (uint64_t p = 8; p < sample.size(); ++p) {
    if (sample[p] != std::byte{IndexByte(idx, p)}) return -1;
  }
  return static_cast<int64_t>(idx);
}

std::string MakeTempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  std::filesystem::path p = std::filesystem::path(::testing::TempDir()) /
                            ("gpufeed_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

bool WriteH5(const std::string& path, const std::vector<hsize_t>& shape, hid_t mem_type,
             std::span<const std::byte> data, const H5Layout& layout, bool with_labels) {
  h5::QuietErrors();
  h5::EnsureZstdFilterRegistered();
  h5::Id fcpl(H5Pcreate(H5P_FILE_CREATE));
  if (layout.userblock) H5Pset_userblock(fcpl.get(), layout.userblock);
  h5::Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT));
  if (!file.valid()) return false;
  h5::Id space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (!layout.chunk.empty()) {
    H5Pset_chunk(dcpl.get(), static_cast<int>(layout.chunk.size()), layout.chunk.data());
    if (layout.fletcher32) H5Pset_fletcher32(dcpl.get());
    if (layout.shuffle) H5Pset_shuffle(dcpl.get());
    if (layout.deflate >= 0) H5Pset_deflate(dcpl.get(), layout.deflate);
    if (layout.zstd >= 0) {
      unsigned cd = static_cast<unsigned>(layout.zstd);
      H5Pset_filter(dcpl.get(), h5::kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &cd);
    }
  }
  h5::Id ftype(H5Tcopy(mem_type));
  if (layout.big_endian) H5Tset_order(ftype.get(), H5T_ORDER_BE);
  h5::Id dset(H5Dcreate2(file.get(), "images", ftype.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!dset.valid()) return false;
  if (H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0) return false;
  if (with_labels) {
    std::vector<int64_t> labels(shape[0]);
    for (uint64_t k = 0; k < shape[0]; ++k) labels[k] = IndexLabel(k);
    hsize_t n = shape[0];
    h5::Id lspace(H5Screate_simple(1, &n, nullptr));
    h5::Id ldset(H5Dcreate2(file.get(), "labels", H5T_STD_I32LE, lspace.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!ldset.valid() || H5Dwrite(ldset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0) {
      return false;
    }
  }
  return true;
}

}  // namespace gpufeed::testing
