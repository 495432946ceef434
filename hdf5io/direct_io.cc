// O_DIRECT reads through aligned bounce buffers, and page-cache eviction and
// residency for the cold benchmark.
#include "hdf5io/direct_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "common/sizes.h"

namespace gpufeed::io {
namespace {

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// This thread's aligned buffer of at least n bytes (grows, never shrinks).
std::byte* AlignedScratch(size_t n) {
  thread_local std::unique_ptr<std::byte, FreeDeleter> buf;
  thread_local size_t cap = 0;
  if (cap < n) {
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, n) != 0) return nullptr;
    buf.reset(static_cast<std::byte*>(p));
    cap = n;
  }
  return buf.get();
}

}  // namespace

int64_t PreadDirect(int fd, std::byte* dst, size_t n, uint64_t offset) {
  if (n == 0) return 0;
  const uint64_t start = offset / kDirectAlign * kDirectAlign;
  const auto end = CheckedAdd(offset, n);
  if (!end || *end > UINT64_MAX - kDirectAlign) return -EOVERFLOW;
  const uint64_t stop = (*end + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  const size_t span = static_cast<size_t>(stop - start);
  std::byte* buf = AlignedScratch(span);
  if (buf == nullptr) return -ENOMEM;
  size_t done = 0;
  while (done < span) {
    // Every request stays aligned: `done` advances by whole blocks except at
    // end of file, where the loop stops.
    ssize_t r = ::pread(fd, buf + done, span - done, static_cast<off_t>(start + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
    if (done % kDirectAlign != 0) break;  // a short read ends at end of file
  }
  const uint64_t skip = offset - start;
  if (done <= skip) return 0;
  const size_t got = std::min<size_t>(n, done - skip);
  CopyBytes(dst, buf + skip, got);
  return static_cast<int64_t>(got);
}

int OpenDirect(const std::string& path, std::string* why) {
  const char* refuse = std::getenv("GPUFEED_IO_REFUSE_DIRECT");
  if (refuse != nullptr && std::string_view(refuse) == "1") {
    *why = "O_DIRECT refused (GPUFEED_IO_REFUSE_DIRECT=1)";
    return -1;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) {
    *why = std::string("O_DIRECT refused at open: ") + std::strerror(errno);
    return -1;
  }
  std::byte probe[1];
  if (PreadDirect(fd, probe, 1, 0) < 0) {
    *why = std::string("O_DIRECT refused at the first read: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

Status EvictFromPageCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open to evict it: " + std::strerror(errno));
  ::fdatasync(fd);  // read-only fds may fdatasync; dirty pages would stay cached
  const int r = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (r != 0) return Status::IOError(path + ": posix_fadvise(DONTNEED) failed: " + std::strerror(r));
  return Status::Ok();
}

Result<double> ResidentFraction(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IOError(path + ": cannot stat: " + std::strerror(errno));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return 0.0;
  }
  const size_t len = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return Status::IOError(path + ": cannot map: " + std::strerror(errno));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((len + page - 1) / page);
  const int r = ::mincore(m, len, vec.data());
  ::munmap(m, len);
  if (r != 0) return Status::IOError(path + ": mincore failed: " + std::strerror(errno));
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

}  // namespace gpufeed::io
