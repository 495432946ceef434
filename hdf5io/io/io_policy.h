// The direct path's I/O policy: how a file's chunk bytes are read — through
// the page cache or O_DIRECT (IoMode, gpufeed/names.h) — and how many reads
// are kept in flight ahead of the reader. Decided here, in io, for the file a
// dataset asks about (hdf5io/hdf5/dataset.cc asks, then opens the file with
// OpenRandomAccessFile, file.h, as told).
//
//   auto policy = io::IoPolicy::Resolve(options.io);      // the environment read once
//   io::IoChoice c = policy->For(path, file_size);        // direct or buffered, and why
//   auto file = io::OpenRandomAccessFile(path, c.mode == IoMode::kDirect, c.depth, ...);
#ifndef GPUFEED_IO_IO_POLICY_H_
#define GPUFEED_IO_IO_POLICY_H_

#include <cstdint>
#include <string>

#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed::io {

// What the policy chose for one file.
struct IoChoice {
  IoMode mode = IoMode::kBuffered;  // kDirect or kBuffered, never kAuto
  unsigned depth = 4;               // reads in flight ahead of the reader (O_DIRECT's io_uring ring)
  std::string note;                 // why auto chose as it did; empty when the mode was asked outright
};

class IoPolicy {
 public:
  // The mode asked (OpenOptions::io). kAuto takes GPUFEED_IO (auto, direct,
  // buffered) from the environment where it is set; the depth is
  // GPUFEED_IO_DEPTH (1 to 256) where set, else one read a hardware thread,
  // 4 to 32. InvalidArgument naming the variable and what it takes for a
  // value it does not.
  static Result<IoPolicy> Resolve(IoMode asked);

  // For `path` of `file_size` bytes: a remote object (s3://, https://)
  // buffered (its transport reads ahead; O_DIRECT does not apply); auto:
  // direct when the file exceeds the memory available to the page cache
  // (common/memory.h), else buffered, saying which and why; otherwise as
  // asked.
  IoChoice For(const std::string& path, uint64_t file_size) const;

  IoMode asked() const { return asked_; }
  unsigned depth() const { return depth_; }

 private:
  IoPolicy(IoMode asked, unsigned depth) : asked_(asked), depth_(depth) {}
  IoMode asked_ = IoMode::kAuto;
  unsigned depth_ = 4;
};

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_IO_POLICY_H_
