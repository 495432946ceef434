// The direct path's I/O policy (io_policy.h).
#include "hdf5io/io/io_policy.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "common/memory.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed::io {

Result<IoPolicy> IoPolicy::Resolve(IoMode asked) {
  const char* env = std::getenv("GPUFEED_IO");
  if (asked == IoMode::kAuto && env != nullptr && env[0] != '\0') {
    auto m = ParseIoMode(env);
    if (!m.ok()) return Status::InvalidArgument("GPUFEED_IO: " + m.status().message());
    asked = *m;
  }
  // Direct: reads in flight while the loader's threads decode, a chunk ahead
  // for each hardware thread, 4 to 32 (chunk-sized buffers, on top of the
  // loader's memory bound). 4 left 16 inflating threads waiting for the
  // disk (cold celeba-deflate on the H200: 0.55 of the O_DIRECT ceiling).
  // Buffered: the loader's WillRead hints (posix_fadvise WILLNEED) carry the
  // plan's order to the kernel's read-ahead.
  // GPUFEED_IO_DEPTH sets it (a fast NVMe drive may want more reads queued).
  unsigned depth = std::clamp(std::thread::hardware_concurrency(), 4u, 32u);
  if (const char* d = std::getenv("GPUFEED_IO_DEPTH"); d != nullptr && d[0] != '\0') {
    char* end = nullptr;
    const unsigned long v = std::strtoul(d, &end, 10);
    if (*end != '\0' || d[0] == '-' || v < 1 || v > 256) {
      return Status::InvalidArgument(std::string("GPUFEED_IO_DEPTH='") + d +
                                     "': expected a number of chunks from 1 to 256 (the direct I/O read-ahead's "
                                     "depth; unset: one per hardware thread, 4 to 32)");
    }
    depth = static_cast<unsigned>(v);
  }
  return IoPolicy(asked, depth);
}

IoChoice IoPolicy::For(const std::string& path, uint64_t file_size) const {
  IoChoice c;
  c.depth = depth_;
  c.mode = asked_;
  if (IsRemoteUrl(path)) {
    c.mode = IoMode::kBuffered;  // neither applies: the transport's ranged GETs and read-ahead
  } else if (asked_ == IoMode::kAuto) {
    const uint64_t avail = AvailableMemoryBytes();
    c.mode = file_size > avail ? IoMode::kDirect : IoMode::kBuffered;
    c.note = "auto: the file (" + HumanBytes(file_size) + ") " + (c.mode == IoMode::kDirect ? "exceeds" : "fits in") +
             " the memory available to the page cache (" + HumanBytes(avail) + ")";
  }
  return c;
}

}  // namespace gpufeed::io
