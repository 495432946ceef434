// AtomicFile (common/atomic_file.h): temporary file, fsync, rename, fsync of
// the directory; a fixed registry of live temporary names that a signal
// handler may unlink (async-signal-safe: no allocation, no locks).
#include "common/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace gpufeed {
namespace {

constexpr int kRegistrySlots = 64;
constexpr size_t kMaxPath = 4096;
struct RegistryEntry {
  std::atomic<bool> used{false};
  std::atomic<bool> live{false};  // the name below is complete and the file may exist
  char name[kMaxPath];
};
RegistryEntry g_registry[kRegistrySlots];
std::atomic<uint64_t> g_counter{0};

int Register(const std::string& name) {
  if (name.size() >= kMaxPath) return -1;
  for (int i = 0; i < kRegistrySlots; ++i) {
    bool expected = false;
    if (g_registry[i].used.compare_exchange_strong(expected, true)) {
      std::memcpy(g_registry[i].name, name.c_str(), name.size() + 1);
      g_registry[i].live.store(true);
      return i;
    }
  }
  return -1;  // full: the file is still removed by the destructor, not on a signal
}

void Unregister(int slot) {
  if (slot < 0) return;
  g_registry[slot].live.store(false);
  g_registry[slot].used.store(false);
}

void OnSignal(int sig) {
  for (RegistryEntry& e : g_registry) {
    if (e.live.load()) ::unlink(e.name);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status SyncPath(const std::string& path, int flags, const std::string& what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::IOError(what + ": cannot open " + path + " to sync it: " + std::strerror(errno));
  const int r = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on a directory (EINVAL): nothing to sync.
  if (r != 0 && !(err == EINVAL && (flags & O_DIRECTORY))) {
    return Status::IOError(what + ": fsync of " + path + " failed: " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_counter.fetch_add(1));
  registry_slot_ = Register(tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
  Unregister(registry_slot_);
}

Status AtomicFile::Write(const void* data, size_t n) {
  if (fd_ < 0) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      return Status::IOError(path_ + ": cannot create " + tmp_ + ": " + std::strerror(errno) +
                             " (is the directory writable?)");
    }
  }
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(path_ + ": writing " + tmp_ + " failed: " + std::strerror(errno) +
                             (errno == ENOSPC ? " (disk full)" : ""));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status AtomicFile::Commit() {
  if (committed_) return Status::Ok();
  if (fd_ >= 0) {
    if (::fsync(fd_) != 0) return Status::IOError(path_ + ": fsync of " + tmp_ + " failed: " + std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  } else {
    GPUFEED_RETURN_IF_ERROR(SyncPath(tmp_, O_RDONLY, path_));  // written by someone else (HDF5)
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return Status::IOError(path_ + ": cannot rename " + tmp_ + " onto it: " + std::strerror(errno));
  }
  committed_ = true;
  Unregister(registry_slot_);
  registry_slot_ = -1;
  return SyncPath(DirOf(path_), O_RDONLY | O_DIRECTORY, path_);
}

Status AtomicFile::WriteWhole(const std::string& path, std::string_view data) {
  AtomicFile f(path);
  GPUFEED_RETURN_IF_ERROR(f.Write(data));
  return f.Commit();
}

void RemoveTempFilesOnSignal() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace gpufeed
