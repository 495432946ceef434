// A chunked dataset's chunk index read in one pass from the file's bytes,
// where it is a version 1 B-tree (layout message versions 1 to 3: HDF5's
// default file format, what h5py and gpufeed convert write). HDF5 1.10 finds
// a chunk's address only by walking the index from its start
// (H5Dget_chunk_info_by_coord), so asking it chunk by chunk is quadratic:
// 1.7 s for 20,000 chunks, hours for the 540,000 256 KiB chunks of an
// ImageNet's encoded bytes. Only inside hdf5/.
#ifndef GPUFEED_HDF5_CHUNK_BTREE_H_
#define GPUFEED_HDF5_CHUNK_BTREE_H_

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpufeed/status.h"
#include "hdf5io/hdf5/chunk_index.h"

namespace gpufeed::h5 {

// Every entry of `dset`'s chunk index in B-tree order: its offset (in the
// file's coordinates, one per axis of the dataset), its address relative to
// the file's base address (as HDF5's chunk calls give it), its stored size.
// `path` is the file `dset` is in (read with pread: no HDF5 call after the
// object header's address and the file's address and length sizes; an
// object, s3:// or http(s)://, through the remote driver's page cache,
// remote_vfd.h's RemoteBytesOf), `base`
// its base address (the user block's size). The file is hostile input: every
// node is checked to lie inside the file, to be a raw-data node of the level
// its parent says, and to be visited once; more than `max_entries` entries
// is Corrupt. Unsupported where the index is another kind (layout version 4:
// a fixed or extensible array, a version 2 B-tree, one chunk) or the object
// header is not one this reads: the caller then asks HDF5 chunk by chunk.
// Corrupt names `what`.
Result<std::vector<ChunkKey>> WalkChunkBTree(hid_t dset, const std::string& path, uint64_t base, uint64_t max_entries,
                                             const std::string& what);

// The walk itself, over bytes `read` gives (false: past the end): the object
// header at `header`, addresses of `sa` and lengths of `ss` bytes (2 to 8).
// No HDF5 call: what the fuzz target drives.
using ReadBytes = std::function<bool(uint64_t at, uint64_t n, std::vector<uint8_t>* out)>;
Result<std::vector<ChunkKey>> WalkChunkBTreeAt(const ReadBytes& read, uint64_t header, size_t sa, size_t ss,
                                               uint64_t max_entries, const std::string& what);

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_CHUNK_BTREE_H_
