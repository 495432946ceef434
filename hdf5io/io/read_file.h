// Reads of whole files and of a file's header, by path: every read of a file
// outside the chunk path (RandomAccessFile, file.h) goes through here — an
// image read whole, a .npy mapped, an IDX or checkpoint file, the HDF5
// signature the door looks for, a statistics sidecar, a file's copy — so a
// file is opened, sized and read one way everywhere: O_RDONLY | O_CLOEXEC
// (O_NOFOLLOW where asked), its size from the descriptor it is read through,
// EINTR retried, a short read at the end of the file told apart from an
// error, and every error naming the path (and the byte where a read failed).
//
//   auto f = io::ReadOnlyFile::Open("x.h5");
//   std::array<std::byte, 8> head;
//   auto got = f->ReadAt(0, head);              // fewer only at the end of the file
//   std::string text;
//   Status s = io::ReadWholeFile("ckpt.bin", &text);
#ifndef GPUFEED_IO_READ_FILE_H_
#define GPUFEED_IO_READ_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed::io {

struct ReadOptions {
  // O_NOFOLLOW: a symbolic link at the path itself is refused (InvalidArgument
  // naming it), not followed (docs/practices.md, practice 24).
  bool no_follow = false;
};

// A file opened for reading. Not copyable; movable. ReadAt may be called
// from any number of threads at once (pread).
class ReadOnlyFile {
 public:
  // Errors: NotFound (no such file), InvalidArgument (a directory, or a
  // link with no_follow), IOError (anything else), each naming the path.
  static Result<ReadOnlyFile> Open(const std::string& path, const ReadOptions& options = {});
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // at Open (fstat of its descriptor)
  mode_t mode() const { return mode_; }    // at Open
  int fd() const { return fd_; }           // for what takes a descriptor (a copy, a mapping)

  // Up to dst.size() bytes at `offset` (fewer only at the end of the file).
  // IOError naming the path and the offset.
  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const;
  // Exactly dst.size() bytes at `offset`; Corrupt naming the path when the
  // file ends first (it shrank while read, or is shorter than its header says).
  Status ReadExactly(uint64_t offset, std::span<std::byte> dst) const;

 private:
  ReadOnlyFile(std::string path, int fd, uint64_t size, mode_t mode)
      : path_(std::move(path)), fd_(fd), size_(size), mode_(mode) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  mode_t mode_ = 0;
};

// The whole of `path`, read into the buffer `place(size)` returns for its
// size at open (or the error `place` returns: a size the caller refuses, or
// that differs from what it expected). Errors as ReadOnlyFile::Open and
// ReadExactly.
using PlaceBytes = std::function<Result<std::byte*>(uint64_t size)>;
Status ReadWholeFile(const std::string& path, const PlaceBytes& place, const ReadOptions& options = {});

// The whole of `path` into *out (a std::string or a vector of 1-byte
// elements), refused (InvalidArgument naming the path and both sizes) when
// it holds more than max_bytes.
template <class Bytes>
Status ReadWholeFile(const std::string& path, Bytes* out, uint64_t max_bytes = UINT64_MAX,
                     const ReadOptions& options = {}) {
  static_assert(sizeof(typename Bytes::value_type) == 1, "a container of bytes");
  return ReadWholeFile(
      path,
      [&](uint64_t size) -> Result<std::byte*> {
        if (size > max_bytes) {
          return Status::InvalidArgument(path + ": holds " + std::to_string(size) + " bytes, more than the " +
                                         std::to_string(max_bytes) + " it may");
        }
        out->resize(static_cast<size_t>(size));
        return reinterpret_cast<std::byte*>(out->data());
      },
      options);
}

// Whether `path`'s first byte is in the page cache (preadv2 with
// RWF_NOWAIT: no wait for the disk); when it is not and `advise` is set,
// asks the kernel to read the whole file ahead (posix_fadvise WILLNEED,
// which starts the reads and returns). Errors as ReadOnlyFile::Open; an
// empty file, or a kernel without RWF_NOWAIT, counts as cached.
Result<bool> CachedOrReadAhead(const std::string& path, bool advise);

// A whole file mapped read-only (MAP_PRIVATE), unmapped when destroyed. An
// empty file maps to an empty span. Errors as ReadOnlyFile::Open; IOError
// when the mapping is refused. A file cut short after the mapping is made
// faults on the pages it lost (SIGBUS): map only files this process's own
// user gave it.
class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path, const ReadOptions& options = {});
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {base_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const std::byte* base, size_t size) : path_(std::move(path)), base_(base), size_(size) {}
  std::string path_;
  const std::byte* base_ = nullptr;
  size_t size_ = 0;
};

// Copies `from` to the new file `to` (created O_EXCL with `mode`): a reflink
// where the file system shares extents (btrfs, XFS), else copy_file_range,
// else read and write. IOError naming both; ENOSPC said as a full disk.
Status CopyFile(const std::string& from, const std::string& to, mode_t mode);

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_READ_FILE_H_
