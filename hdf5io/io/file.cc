// RandomAccessFile (hdf5io/io/file.h): pread and O_DIRECT files, the tests' hook and
// the fault-injecting wrapper.
#include "hdf5io/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/mutex.h"
#include "hdf5io/io/direct_io.h"
#include "hdf5io/io/http_file.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed::io {
namespace {

// Full-length pread; returns bytes read (< n only at end of file) or -errno.
int64_t PreadFull(int fd, std::byte* dst, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<int64_t>(done);
}

// Through the page cache: read-ahead hints become posix_fadvise WILLNEED.
class BufferedFile final : public RandomAccessFile {
 public:
  explicit BufferedFile(int fd) : fd_(fd) {}
  ~BufferedFile() override { ::close(fd_); }
  int64_t ReadAt(uint64_t, std::byte* dst, size_t n, uint64_t offset) const override {
    return PreadFull(fd_, dst, n, offset);
  }
  void WillRead(uint64_t, uint64_t offset, size_t n) const override {
    ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_WILLNEED);
  }
  unsigned read_ahead() const override { return 0; }

 private:
  const int fd_;
};

// O_DIRECT, around the page cache: reads started by WillRead through
// io_uring are taken by ReadAt; others are synchronous aligned preads.
class DirectFile final : public RandomAccessFile {
 public:
  DirectFile(int fd, std::unique_ptr<UringReadAhead> ahead, unsigned depth)
      : fd_(fd), ahead_(std::move(ahead)), depth_(ahead_ ? depth : 0) {}
  ~DirectFile() override {
    ahead_.reset();  // waits for its reads in flight before the descriptor goes
    ::close(fd_);
  }
  int64_t ReadAt(uint64_t key, std::byte* dst, size_t n, uint64_t offset) const override {
    if (ahead_) {
      if (auto r = ahead_->Take(key, dst, n, offset)) return *r;
    }
    return PreadDirect(fd_, dst, n, offset);
  }
  void WillRead(uint64_t key, uint64_t offset, size_t n) const override {
    if (ahead_) ahead_->Start(key, offset, n);
  }
  unsigned read_ahead() const override { return depth_; }

 private:
  const int fd_;
  std::unique_ptr<UringReadAhead> ahead_;
  const unsigned depth_;
};

Status IdentityOf(int fd, const std::string& path, FileIdentity* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::IOError(path + ": cannot stat: " + std::strerror(errno));
  out->dev = static_cast<uint64_t>(st.st_dev);
  out->ino = static_cast<uint64_t>(st.st_ino);
  out->size = static_cast<uint64_t>(st.st_size);
  out->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  out->ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  return Status::Ok();
}

struct WrapperHook {
  Mutex mu;
  FileWrapper wrap GUARDED_BY(mu);
};
WrapperHook& Hook() {
  static WrapperHook* hook = new WrapperHook();  // never destroyed: files may open during exit
  return *hook;
}

}  // namespace

namespace {
thread_local std::string read_error_text;
}  // namespace

void SetReadErrorText(std::string text) { read_error_text = std::move(text); }

std::string ReadErrorText(int64_t r) {
  if (r == -EREMOTEIO && !read_error_text.empty()) return std::exchange(read_error_text, std::string());
  return std::strerror(static_cast<int>(-r));
}

FileIdentity RemoteIdentity(const RemoteFile& f) {
  // FNV-1a of the version: equal for the same object, as a plan's check needs.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : f.version()) h = (h ^ c) * 1099511628211ull;
  FileIdentity id;
  id.ino = h;
  id.size = f.size();
  return id;
}

void SetFileWrapperForTests(FileWrapper wrap) {
  WrapperHook& h = Hook();
  MutexLock lock(&h.mu);
  h.wrap = std::move(wrap);
}

Result<std::unique_ptr<RandomAccessFile>> OpenRandomAccessFile(const std::string& path, bool direct, unsigned depth,
                                                               std::string* note, bool* fell_back,
                                                               FileIdentity* identity) {
  note->clear();
  *fell_back = false;
  std::unique_ptr<RandomAccessFile> out;
  if (IsRemoteUrl(path)) {
    auto options = RemoteOptions::FromEnv();
    if (!options.ok()) return options.status();
    auto remote = RemoteFile::Open(path, *options);
    if (!remote.ok()) return remote.status();
    *note = options->in_flight_fixed ? "ranged GETs, " + std::to_string(options->in_flight) +
                                           " in flight ahead of the reader (GPUFEED_REMOTE_IN_FLIGHT)"
                                     : "ranged GETs ahead of the reader, as many in flight as the link holds (from " +
                                           std::to_string(options->in_flight) + ")";
    if (identity != nullptr) *identity = RemoteIdentity(**remote);
    out = std::move(*remote);
  } else if (direct) {
    std::string why;
    const int fd = OpenDirect(path, &why);
    if (fd >= 0) {
      if (identity != nullptr) {
        if (Status st = IdentityOf(fd, path, identity); !st.ok()) {
          ::close(fd);
          return st;
        }
      }
      std::string ring_why;
      auto ahead = UringReadAhead::Create(fd, depth, &ring_why);
      *note = ahead ? "io_uring read-ahead, " + std::to_string(depth) + " chunks deep"
                    : ring_why + ": synchronous O_DIRECT preads";
      out = std::make_unique<DirectFile>(fd, std::move(ahead), depth);
    } else {
      *fell_back = true;
      *note = why + "; reading through the page cache with pread";
    }
  }
  if (!out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::IOError(path + ": cannot open for reading: " + std::strerror(errno));
    out = std::make_unique<BufferedFile>(fd);
    if (identity != nullptr) GPUFEED_RETURN_IF_ERROR(IdentityOf(fd, path, identity));
  }
  WrapperHook& h = Hook();
  MutexLock lock(&h.mu);
  if (h.wrap) out = h.wrap(std::move(out), path);
  return out;
}

int64_t FaultInjectingFile::ReadAt(uint64_t key, std::byte* dst, size_t n, uint64_t offset) const {
  const uint64_t k = reads_.fetch_add(1);
  if (k >= faults_.fail_from) return -faults_.error;
  const int64_t r = base_->ReadAt(key, dst, n, offset);
  if (k >= faults_.short_from && r > 0) return r / 2;
  return r;
}

}  // namespace gpufeed::io
