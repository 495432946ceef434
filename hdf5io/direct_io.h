// Reading file bytes around the page cache: O_DIRECT reads of aligned ranges
// (the direct path's IoMode::kDirect), and the page-cache tools the cold
// benchmark and the tests use (evict a file, measure how much of it is
// resident).
//
// Thread safety: every function may be called from any thread; PreadDirect
// keeps one aligned bounce buffer per thread.
#ifndef GPUFEED_HDF5IO_DIRECT_IO_H_
#define GPUFEED_HDF5IO_DIRECT_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed::io {

// Offset, length and buffer alignment of every O_DIRECT read: 4 KiB covers
// 512-byte and 4 KiB logical blocks (what NVMe and SATA devices report).
inline constexpr uint64_t kDirectAlign = 4096;

// Full-length pread on an O_DIRECT descriptor of [offset, offset + n): reads
// the covering aligned range into this thread's aligned buffer and copies
// the wanted bytes to dst. Returns the bytes delivered (< n only at end of
// file) or -errno.
int64_t PreadDirect(int fd, std::byte* dst, size_t n, uint64_t offset);

// Opens `path` with O_DIRECT and checks that an aligned read of its first
// block works (tmpfs before Linux 6.6, some FUSE and container file systems
// refuse O_DIRECT at open or at the first read). Returns the descriptor, or
// -1 with *why set to the reason. GPUFEED_IO_REFUSE_DIRECT=1 makes it refuse,
// so the fallback is tested on any file system.
int OpenDirect(const std::string& path, std::string* why);

// Drops `path`'s pages from the page cache (posix_fadvise DONTNEED; dirty
// pages are not dropped, so the file is fdatasync'ed first).
Status EvictFromPageCache(const std::string& path);

// The share of `path`'s pages in the page cache (mincore over a mapping).
Result<double> ResidentFraction(const std::string& path);

}  // namespace gpufeed::io

#endif  // GPUFEED_HDF5IO_DIRECT_IO_H_
