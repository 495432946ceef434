// The chunk index as the direct path reads it, checked as hostile input: each
// chunk's key (its offset in the dataset) inside the extent, on the chunk
// grid and held by no other chunk, and HDF5's own lookup agreeing that the
// chunk at a position is the one listed there. A damaged key otherwise makes
// the direct path read a chunk's bytes where HDF5 reads the fill value (or
// another chunk): two answers, both without error. Only inside hdf5/.
#ifndef GPUFEED_HDF5_CHUNK_INDEX_H_
#define GPUFEED_HDF5_CHUNK_INDEX_H_

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed::h5 {

// One entry of a chunk index: the chunk's offset (in elements, one per axis
// of the file's dataspace), where its bytes are and how many.
struct ChunkKey {
  std::vector<uint64_t> offset;
  uint64_t addr = 0;
  uint64_t size = 0;
  uint32_t mask = 0;  // HDF5's filter mask (bit k: filter k skipped)
};

// Ok when every key lies inside `extent`, on the grid of `chunk` (each
// offset a multiple of the chunk's extent on its axis), and no two keys
// share an offset. Else Corrupt naming `what` (the "file:/path"), the entry
// (its place in the index) and its offset. Programmer error: `extent` and
// `chunk` of different ranks, or a chunk extent of 0.
Status CheckChunkKeys(const std::vector<ChunkKey>& keys, const std::vector<uint64_t>& extent,
                      const std::vector<uint64_t>& chunk, const std::string& what);

// Every entry of `dset`'s chunk index in index order (H5Dget_chunk_info),
// at most `max` of them: HDF5 walks the index from its start for each entry
// (quadratic), so this names a damaged entry once the index is known to be
// damaged; it is not read for every open.
Result<std::vector<ChunkKey>> ReadChunkKeys(hid_t dset, uint64_t max);

// The chunk at `offset` as HDF5 itself finds it when it reads (its
// lookup, not the walk of the index H5Dget_chunk_info_by_coord makes): its
// stored bytes, or 0 where HDF5 finds none and would read the fill value.
Result<uint64_t> LookupChunkBytes(hid_t dset, const std::vector<hsize_t>& offset);

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_CHUNK_INDEX_H_
