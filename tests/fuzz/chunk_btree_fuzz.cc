// Fuzz target: gpufeed's own reader of a version 1 B-tree chunk index
// (hdf5io/hdf5/chunk_btree.h), which parses a file's object header and B-tree nodes
// from its bytes. The input's first byte picks the address and length sizes,
// the next 8 the object header's address; the rest is the file. A walk must
// end (no node twice), stay in the file, never list more entries than
// allowed, and give only keys of the dataset's rank.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hdf5io/hdf5/chunk_btree.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  const size_t sa = 2 + (data[0] & 7) % 7, ss = 2 + ((data[0] >> 3) & 7) % 7;
  uint64_t header = 0;
  std::memcpy(&header, data + 1, 8);
  const uint8_t* file = data + 9;
  const uint64_t file_size = size - 9;
  uint64_t bytes_read = 0;
  const gpufeed::h5::ReadBytes read = [&](uint64_t at, uint64_t n, std::vector<uint8_t>* out) {
    if (at > file_size || n > file_size - at) return false;
    bytes_read += n;
    out->assign(file + at, file + at + n);
    return true;
  };
  constexpr uint64_t kMax = 4096;
  auto keys = gpufeed::h5::WalkChunkBTreeAt(read, header, sa, ss, kMax, "fuzz.h5:/x");
  if (!keys.ok()) return 0;
  GPUFEED_FUZZ_CHECK(keys->size() <= kMax);
  for (const gpufeed::h5::ChunkKey& k : *keys) GPUFEED_FUZZ_CHECK(!k.offset.empty() && k.offset.size() <= 32);
  return 0;
}
