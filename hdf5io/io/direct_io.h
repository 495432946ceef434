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
// Bounded: at most `depth` buffers (each as large as the largest read). A
// Start() that finds every buffer in flight, claimed or holding a read not
// yet taken waits in a queue (4 x depth hints at most, then dropped: the read
// then happens synchronously in Take's caller) and is started, oldest first,
// by the Take that frees a buffer: hints come in the order of the reads, so
// the reads keep to that order and a buffer never idles while a hint waits.
// A completed read untaken for 2 s (hinted, then never read: a cache hit, an
// epoch's end) gives its buffer up. Thread-safe: any thread may Start or Take;
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

  // Starts the read of [offset, offset + n) for `key` (a chunk index), or
  // queues it until a buffer is free, unless it is under way or queued
  // already. Never blocks on I/O.
  void Start(uint64_t key, uint64_t offset, size_t n);
  // If `key` was started with this range: waits for it, copies the bytes to
  // dst and returns their count (< n only at end of file) or -errno. nullopt
  // if it was not started (the caller reads synchronously; a queued hint for
  // it is forgotten).
  std::optional<int64_t> Take(uint64_t key, std::byte* dst, size_t n, uint64_t offset);

  // What the ring did so far (GPUFEED_IO_STATS=1 prints it when the file
  // closes). The slot-seconds, divided by `seconds`, are how many buffers
  // were in each state on average since the first read started.
  struct Stats {
    uint64_t started = 0;      // reads submitted
    uint64_t taken = 0;        // of them, handed to a Take
    uint64_t dropped = 0;      // hints never started (the queue full, or no memory for a buffer)
    uint64_t not_started = 0;  // Takes of a range not started (its reader reads it synchronously)
    uint64_t not_started_bytes = 0;
    double seconds = 0;              // from the first read started to the last change of a slot
    double in_flight_slot_s = 0;     // buffers with a read in flight, summed over time
    double done_untaken_slot_s = 0;  // buffers holding a completed read no Take has claimed yet
    double claimed_slot_s = 0;       // buffers being copied out by a Take
    double take_wait_s = 0;          // Takes' waits for reads still in flight, summed
  };
  Stats stats() const;

  struct Impl;

 private:
  explicit UringReadAhead(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_DIRECT_IO_H_
