// A file read at offsets: the direct path's one interface to a file's bytes
// (LevelDB's Env::RandomAccessFile is the model). OpenRandomAccessFile makes
// it for an I/O mode — pread through the page cache, or O_DIRECT with an
// io_uring read-ahead — and tests wrap every file opened through a hook
// (SetFileWrapperForTests), for instance in a FaultInjectingFile that fails
// or shortens reads as told.
//
// Thread safety: ReadAt and WillRead may be called from any number of
// threads at once.
#ifndef GPUFEED_IO_FILE_H_
#define GPUFEED_IO_FILE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed::io {

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads [offset, offset + n) into dst for the read named `key` (a chunk
  // index: what WillRead announced). Returns the bytes delivered (< n only
  // at the end of the file) or -errno.
  virtual int64_t ReadAt(uint64_t key, std::byte* dst, size_t n, uint64_t offset) const = 0;
  // [offset, offset + n) will be read soon as `key`: starts it (O_DIRECT's
  // read-ahead) or tells the kernel (posix_fadvise WILLNEED). Never blocks;
  // may do nothing.
  virtual void WillRead(uint64_t key, uint64_t offset, size_t n) const = 0;
  // Reads kept in flight ahead of the reader (the io_uring ring's depth; 0:
  // none), for the memory bound and how far the loader hints. A remote
  // object's moves with its link (http_file.h): ask again, do not keep it.
  virtual unsigned read_ahead() const = 0;
};

// Which file a descriptor or path is, and whether it changed: device,
// inode, size and the modification and status-change times. A plan of a
// file's bytes made in another process (the probe's, hdf5io/hdf5/probe.h) is used
// only while the file it opens is still the one the plan was made from.
struct FileIdentity {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// `path` opened for ReadAt; an s3:// or http(s):// URL is a remote object
// (hdf5io/io/http_file.h: ranged GETs, its own read-ahead; `direct` and
// `depth` do not apply), its identity the object's size and version.
// direct: O_DIRECT, with an io_uring read-ahead
// `depth` deep where the kernel has it; where O_DIRECT is refused (some
// tmpfs, FUSE and container file systems), the page cache, *fell_back set
// and *note saying why. *note also says how reads are made. IOError naming
// the file when it cannot be opened. identity (when given): the opened
// file's, from its descriptor.
Result<std::unique_ptr<RandomAccessFile>> OpenRandomAccessFile(const std::string& path, bool direct, unsigned depth,
                                                               std::string* note, bool* fell_back,
                                                               FileIdentity* identity = nullptr);

// A read that failed for a reason an errno cannot carry (a remote object's
// HTTP status, its changed ETag) returns -EREMOTEIO and leaves its message
// here, for this thread: ReadErrorText(r) is that message when r is
// -EREMOTEIO (and takes it), else strerror(-r).
void SetReadErrorText(std::string text);
std::string ReadErrorText(int64_t r);

// Tests: every file opened from now on is handed to `wrap` (with its path),
// which returns what the reader reads through; null: none. Set it before the
// opens it is for, not while another thread opens.
using FileWrapper =
    std::function<std::unique_ptr<RandomAccessFile>(std::unique_ptr<RandomAccessFile>, const std::string& path)>;
void SetFileWrapperForTests(FileWrapper wrap);

// A file that fails as told (LevelDB's fault-injecting Env, in small): from
// its `fail_from`-th read on (0-based, counted over every thread) a read
// returns -error; from its `short_from`-th read on it delivers half of
// what it read. Read-ahead hints pass through.
class FaultInjectingFile final : public RandomAccessFile {
 public:
  struct Faults {
    uint64_t fail_from = UINT64_MAX;
    int error = 5;  // EIO
    uint64_t short_from = UINT64_MAX;
  };
  FaultInjectingFile(std::unique_ptr<RandomAccessFile> base, Faults faults) : base_(std::move(base)), faults_(faults) {}
  int64_t ReadAt(uint64_t key, std::byte* dst, size_t n, uint64_t offset) const override;
  void WillRead(uint64_t key, uint64_t offset, size_t n) const override { base_->WillRead(key, offset, n); }
  unsigned read_ahead() const override { return base_->read_ahead(); }
  uint64_t reads() const { return reads_.load(); }

 private:
  std::unique_ptr<RandomAccessFile> base_;
  Faults faults_;
  mutable std::atomic<uint64_t> reads_{0};
};

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_FILE_H_
