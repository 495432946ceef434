// Whole-file and header reads by path (read_file.h).
#include "hdf5io/io/read_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace gpufeed::io {

Result<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path, const ReadOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (options.no_follow ? O_NOFOLLOW : 0));
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": cannot open: " + std::strerror(err));
    if (err == ELOOP && options.no_follow) {
      return Status::InvalidArgument(path + ": is a symbolic link, which is not followed here");
    }
    return Status::IOError(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(path + ": cannot stat: " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": is a directory, not a file");
  }
  return ReadOnlyFile(path, fd, static_cast<uint64_t>(st.st_size), st.st_mode);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_), mode_(other.mode_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    mode_ = other.mode_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<size_t> ReadOnlyFile::ReadAt(uint64_t offset, std::span<std::byte> dst) const {
  size_t done = 0;
  while (done < dst.size()) {
    const ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::IOError(path_ + ": read failed at byte " + std::to_string(offset + done) + ": " +
                             std::strerror(errno));
    }
    if (n == 0) break;  // the end of the file
    done += static_cast<size_t>(n);
  }
  return done;
}

Status ReadOnlyFile::ReadExactly(uint64_t offset, std::span<std::byte> dst) const {
  auto got = ReadAt(offset, dst);
  if (!got.ok()) return got.status();
  if (*got < dst.size()) {
    return Status::Corrupt(path_ + ": ends at byte " + std::to_string(offset + *got) + ", before the " +
                           std::to_string(dst.size()) + " bytes read at " + std::to_string(offset) +
                           " (the file shrank while being read)");
  }
  return Status::Ok();
}

Status ReadWholeFile(const std::string& path, const PlaceBytes& place, const ReadOptions& options) {
  auto f = ReadOnlyFile::Open(path, options);
  if (!f.ok()) return f.status();
  auto dst = place(f->size());
  if (!dst.ok()) return dst.status();
  return f->ReadExactly(0, {*dst, static_cast<size_t>(f->size())});
}

Result<bool> CachedOrReadAhead(const std::string& path, bool advise) {
  auto f = ReadOnlyFile::Open(path);
  if (!f.ok()) return f.status();
  if (f->size() == 0) return true;
  char byte;
  struct iovec v = {&byte, 1};
  ssize_t got;
  do {
    got = ::preadv2(f->fd(), &v, 1, 0, RWF_NOWAIT);
  } while (got < 0 && errno == EINTR);
  if (got >= 0 || errno != EAGAIN) return true;  // read from the cache, or no RWF_NOWAIT here (EOPNOTSUPP)
  if (advise) (void)::posix_fadvise(f->fd(), 0, 0, POSIX_FADV_WILLNEED);  // a hint: its failure changes nothing
  return false;
}

Result<MappedFile> MappedFile::Open(const std::string& path, const ReadOptions& options) {
  auto f = ReadOnlyFile::Open(path, options);
  if (!f.ok()) return f.status();
  if (f->size() == 0) return MappedFile(path, nullptr, 0);
  void* p = ::mmap(nullptr, static_cast<size_t>(f->size()), PROT_READ, MAP_PRIVATE, f->fd(), 0);
  if (p == MAP_FAILED) return Status::IOError(path + ": mmap failed: " + std::strerror(errno));
  return MappedFile(path, static_cast<const std::byte*>(p), static_cast<size_t>(f->size()));
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), size_);
    path_ = std::move(other.path_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) ::munmap(const_cast<std::byte*>(base_), size_);
}

Status CopyFile(const std::string& from, const std::string& to, mode_t mode) {
  auto in = ReadOnlyFile::Open(from);
  if (!in.ok()) return in.status();
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 07777);
  if (out < 0) return Status::IOError(from + ": cannot create the copy " + to + ": " + std::strerror(errno));
  Status st;
  if (::ioctl(out, FICLONE, in->fd()) != 0) {
    bool use_rw = false;
    for (;;) {
      ssize_t n = 0;
      if (!use_rw) {
        n = ::copy_file_range(in->fd(), nullptr, out, nullptr, 1 << 30, 0);
        if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
          use_rw = true;
          continue;
        }
      } else {
        char buf[1 << 16];
        n = ::read(in->fd(), buf, sizeof buf);
        for (ssize_t w = 0, off = 0; n > 0 && off < n; off += w) {
          w = ::write(out, buf + off, static_cast<size_t>(n - off));
          if (w < 0) {
            if (errno == EINTR) {
              w = 0;
              continue;
            }
            n = -1;
            break;
          }
        }
      }
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        st = Status::IOError(from + ": copying to " + to + " failed: " + std::strerror(errno) +
                             (errno == ENOSPC ? " (disk full)" : ""));
        break;
      }
    }
  }
  if (::close(out) != 0 && st.ok()) st = Status::IOError(to + ": close failed: " + std::strerror(errno));
  return st;
}

}  // namespace gpufeed::io
