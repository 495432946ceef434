// The page cache, for cold-data runs and tests (`gpufeed bench loader
// --cold`): drop a file's pages before an epoch, and see how much of it the
// kernel holds. The alignment is that of gpufeed's direct I/O (offsets,
// lengths and buffers of every O_DIRECT read).
#ifndef GPUFEED_PAGE_CACHE_H_
#define GPUFEED_PAGE_CACHE_H_

#include <cstdint>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed {

inline constexpr uint64_t kDirectIoAlignment = 4096;

// Drops `path`'s pages from the page cache (posix_fadvise DONTNEED after
// fdatasync: dirty pages are not dropped).
Status EvictFromPageCache(const std::string& path);

// The share of `path`'s pages in the page cache, 0..1 (mincore).
Result<double> PageCacheResidentFraction(const std::string& path);

}  // namespace gpufeed

#endif  // GPUFEED_PAGE_CACHE_H_
