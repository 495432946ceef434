// Sealed memfd regions shared by a RemoteLoader and the daemon (shm.h).
#include "loader/remote/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpufeed::daemon {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SharedRegion::SharedRegion(SharedRegion&& o) noexcept
    : fd_(std::move(o.fd_)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      inode_(std::exchange(o.inode_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    inode_ = std::exchange(o.inode_, 0);
  }
  return *this;
}

SharedRegion::~SharedRegion() { Unmap(); }

void SharedRegion::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  fd_.Reset();
}

Result<SharedRegion> SharedRegion::Create(uint64_t bytes, const std::string& name) {
  SharedRegion r;
  r.fd_ = UniqueFd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!r.fd_.valid()) return Status::IOError("memfd_create: " + std::string(std::strerror(errno)));
  if (::ftruncate(r.fd_.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::IOError("memfd of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  }
  if (::fcntl(r.fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::IOError("sealing the memfd: " + std::string(std::strerror(errno)));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r.fd_.get(), 0);
  if (p == MAP_FAILED)
    return Status::IOError("mapping a memfd of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  r.data_ = static_cast<std::byte*>(p);
  r.size_ = bytes;
  std::memset(r.data_, 0, bytes);  // the pages exist now, not during the first batches
  struct stat st {};
  if (::fstat(r.fd_.get(), &st) == 0) r.inode_ = st.st_ino;
  return r;
}

Result<uint64_t> SharedRegion::Inspect(int fd, uint64_t bytes, const std::string& peer) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return Status::InvalidArgument(peer + ": the shared-memory descriptor is not a memfd (" + std::strerror(errno) +
                                   ")");
  }
  if ((seals & F_SEAL_SHRINK) == 0 || (seals & F_SEAL_GROW) == 0) {
    return Status::InvalidArgument(peer +
                                   ": the shared-memory memfd is not sealed against resizing "
                                   "(F_SEAL_SHRINK | F_SEAL_GROW required)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::IOError(peer + ": fstat of the memfd: " + std::strerror(errno));
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return Status::InvalidArgument(peer + ": the shared-memory memfd holds " + std::to_string(st.st_size) +
                                   " bytes, the stream's slots need " + std::to_string(bytes));
  }
  return static_cast<uint64_t>(st.st_ino);
}

Result<SharedRegion> SharedRegion::Map(UniqueFd fd, uint64_t bytes, const std::string& peer) {
  auto inode = Inspect(fd.get(), bytes, peer);
  if (!inode.ok()) return inode.status();
  SharedRegion r;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) {
    return Status::IOError(peer + ": mapping the shared memory (" + std::to_string(bytes) +
                           " bytes): " + std::strerror(errno));
  }
  r.fd_ = std::move(fd);
  r.data_ = static_cast<std::byte*>(p);
  r.size_ = bytes;
  r.inode_ = *inode;
  return r;
}

Result<std::unique_ptr<ShmPool>> ShmPool::Map(UniqueFd fd, uint32_t slots, uint64_t stride, uint64_t batch_size,
                                              uint64_t sample_bytes, const std::string& peer) {
  auto region = SharedRegion::Map(std::move(fd), uint64_t{slots} * stride, peer);
  if (!region.ok()) return region.status();
  auto p = std::make_unique<ShmPool>();
  p->region = std::move(*region);
  p->stride = stride;
  GPUFEED_RETURN_IF_ERROR(p->pool.AllocateViews(p->region.bytes(), stride, static_cast<int>(slots), batch_size,
                                                sample_bytes, /*pin_memory=*/false, /*start_free=*/false));
  return p;
}

}  // namespace gpufeed::daemon
