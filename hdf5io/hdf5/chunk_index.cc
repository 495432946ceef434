// The chunk index checks (hdf5io/hdf5/chunk_index.h).
#include "hdf5io/hdf5/chunk_index.h"

#include <algorithm>
#include <cassert>

#include "hdf5io/hdf5/h5_util.h"

namespace gpufeed::h5 {
namespace {

std::string OffsetText(const std::vector<uint64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

Status CheckChunkKeys(const std::vector<ChunkKey>& keys, const std::vector<uint64_t>& extent,
                      const std::vector<uint64_t>& chunk, const std::string& what) {
  assert(extent.size() == chunk.size());
  const std::string damaged = " (a damaged chunk index: HDF5 and gpufeed would read different samples there)";
  for (size_t i = 0; i < keys.size(); ++i) {
    const ChunkKey& k = keys[i];
    const std::string entry = what + ": chunk index entry " + std::to_string(i) + " of " + std::to_string(keys.size()) +
                              " (offset " + OffsetText(k.offset) + ", " + std::to_string(k.size) + " bytes at byte " +
                              std::to_string(k.addr) + ")";
    if (k.offset.size() != extent.size()) {
      return Status::Corrupt(entry + " has " + std::to_string(k.offset.size()) + " coordinates, the dataset " +
                             std::to_string(extent.size()) + damaged);
    }
    for (size_t a = 0; a < extent.size(); ++a) {
      assert(chunk[a] > 0);
      if (k.offset[a] >= extent[a]) {
        return Status::Corrupt(entry + " lies outside the dataset's extent " + OffsetText(extent) + damaged);
      }
      if (k.offset[a] % chunk[a] != 0) {
        return Status::Corrupt(entry + " is off the chunk grid " + OffsetText(chunk) + " on axis " + std::to_string(a) +
                               damaged);
      }
    }
  }
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return keys[a].offset != keys[b].offset ? keys[a].offset < keys[b].offset : a < b;
  });
  for (size_t j = 1; j < order.size(); ++j) {
    const ChunkKey& a = keys[order[j - 1]];
    const ChunkKey& b = keys[order[j]];
    if (a.offset == b.offset) {
      return Status::Corrupt(what + ": chunk index entries " + std::to_string(order[j - 1]) + " and " +
                             std::to_string(order[j]) + " both hold the chunk at offset " + OffsetText(a.offset) +
                             " (" + std::to_string(a.size) + " bytes at byte " + std::to_string(a.addr) + ", " +
                             std::to_string(b.size) + " bytes at byte " + std::to_string(b.addr) + ")" + damaged);
    }
  }
  return Status::Ok();
}

Result<std::vector<ChunkKey>> ReadChunkKeys(hid_t dset, uint64_t max) {
  Id space(H5Dget_space(dset));
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  hsize_t n = 0;
  if (rank < 0 || rank > H5S_MAX_RANK || H5Dget_num_chunks(dset, space.get(), &n) < 0) {
    return Status::Corrupt("chunk index unreadable: " + LastErrorText());
  }
  std::vector<ChunkKey> out;
  out.reserve(std::min<uint64_t>(n, max));
  std::vector<hsize_t> offset(static_cast<size_t>(rank));
  for (hsize_t i = 0; i < n && i < max; ++i) {
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info(dset, space.get(), i, offset.data(), &mask, &addr, &size) < 0) {
      return Status::Corrupt("chunk index entry " + std::to_string(i) + " unreadable: " + LastErrorText());
    }
    out.push_back({std::vector<uint64_t>(offset.begin(), offset.end()), addr, size, mask});
  }
  return out;
}

Result<uint64_t> LookupChunkBytes(hid_t dset, const std::vector<hsize_t>& offset) {
  hsize_t bytes = 0;
  if (H5Dget_chunk_storage_size(dset, offset.data(), &bytes) < 0) {
    // HDF5 says so when it finds no chunk there ("chunk storage is not
    // allocated"), and H5Dread reads the fill value.
    const std::string why = LastErrorText();
    H5Eclear2(H5E_DEFAULT);
    if (why.find("not allocated") != std::string::npos) return uint64_t{0};
    return Status::Corrupt("chunk lookup failed: " + why);
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace gpufeed::h5
