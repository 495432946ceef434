// Reading file bytes around the page cache: O_DIRECT reads of aligned ranges
// (the direct path's IoMode::kDirect), and the page-cache tools the cold
// benchmark and the tests use (evict a file, measure how much of it is
// resident).
//
// Thread safety: every function may be called from any thread; PreadDirect
// keeps one aligned bounce buffer per thread.
#ifndef GPUFEED_IO_DIRECT_IO_H_
#define GPUFEED_IO_DIRECT_IO_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
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

// Reads ahead on an O_DIRECT descriptor with io_uring: Start() queues the
// aligned read of a chunk the loader will need soon (in its plan's order) and
// returns at once; Take() hands the bytes over when the reader gets there,
// waiting only for what is still in flight. This keeps up to `depth` reads in
// flight while the loader's threads decode and assemble, where synchronous
// preads would leave the device idle.
//
// Bounded: at most `depth` buffers (each as large as the largest read); a
// Start() that finds every buffer in flight, claimed or holding a read not
// yet taken is dropped (the read then happens synchronously in Take's
// caller): hints come in the order of the reads, so the oldest completed
// read is the one wanted soonest. A completed read untaken for 2 s (hinted,
// then never read: a cache hit, an epoch's end) gives its buffer up. Thread-safe: any thread may Start or Take;
// one mutex guards the slots and the submission queue, and one thread at a
// time reaps completions. Every wait has a timeout (an I/O that does not
// complete in 60 s is an error, not a hang). The destructor waits for reads
// in flight, since the kernel writes into their buffers.
class UringReadAhead {
 public:
  // nullptr with *why set where io_uring is unavailable (old kernel, or a
  // container runtime's seccomp profile refusing io_uring_setup) or disabled
  // by GPUFEED_IO_URING=0.
  static std::unique_ptr<UringReadAhead> Create(int fd, unsigned depth, std::string* why);
  ~UringReadAhead();
  UringReadAhead(const UringReadAhead&) = delete;
  UringReadAhead& operator=(const UringReadAhead&) = delete;

  // Queues the read of [offset, offset + n) for `key` (a chunk index) unless
  // it is queued already or no buffer is free. Never blocks on I/O.
  void Start(uint64_t key, uint64_t offset, size_t n);
  // If `key` was started with this range: waits for it, copies the bytes to
  // dst and returns their count (< n only at end of file) or -errno. nullopt
  // if it was not started (the caller reads synchronously).
  std::optional<int64_t> Take(uint64_t key, std::byte* dst, size_t n, uint64_t offset);

  struct Impl;

 private:
  explicit UringReadAhead(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_DIRECT_IO_H_
