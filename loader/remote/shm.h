// Shared memory between a RemoteLoader and the daemon on one host: the
// client's batch pool lives in a sealed memfd, passed to the daemon over the
// Unix socket (SCM_RIGHTS), and the daemon's Loader assembles batches straight
// into it. Only small frames (which slot, which samples) cross the socket.
//
// Safety. The daemon maps only a memfd whose size is sealed (F_SEAL_SHRINK,
// F_SEAL_GROW), so a client cannot truncate it under the daemon (which would
// be SIGBUS there); and the daemon never reads what is in it, so what a client
// writes there can harm only that client's own batches.
#ifndef GPUFEED_DAEMON_SHM_H_
#define GPUFEED_DAEMON_SHM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "gpufeed/status.h"
#include "loader/batch_pool.h"

namespace gpufeed::daemon {

// A file descriptor that closes itself.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

// A MAP_SHARED mapping of a memfd (owns both).
class SharedRegion {
 public:
  SharedRegion() = default;
  SharedRegion(SharedRegion&& o) noexcept;
  SharedRegion& operator=(SharedRegion&& o) noexcept;
  ~SharedRegion();

  // Client side: a new memfd of `bytes`, size sealed, mapped and touched
  // (so its pages exist before the first batch).
  static Result<SharedRegion> Create(uint64_t bytes, const std::string& name);
  // Daemon side: checks that `fd` is a memfd sealed against resizing that
  // holds at least `bytes`, and returns its inode; errors name `peer`.
  static Result<uint64_t> Inspect(int fd, uint64_t bytes, const std::string& peer);
  // Daemon side: Inspect, then map.
  static Result<SharedRegion> Map(UniqueFd fd, uint64_t bytes, const std::string& peer);

  std::span<std::byte> bytes() const { return {data_, size_}; }
  int fd() const { return fd_.get(); }
  // Identity of the memory (the memfd's inode), to recognize a region a
  // client sends again on its next connection.
  uint64_t inode() const { return inode_; }

 private:
  void Unmap();
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  uint64_t inode_ = 0;
};

// The daemon's side of one client's shared memory: the mapping and the
// pool of slot views the stream's Loader fills. Parked with the Loader when
// the connection ends, and reused when the same client (the same memfd)
// comes back for its next epoch: mapping 9 slots of 30 MB costs ~20 ms.
struct ShmPool {
  SharedRegion region;
  uint64_t stride = 0;
  BatchPool pool;  // views of region; a slot is free only while granted and unfilled

  // Maps `fd` as `slots` slots of `stride` bytes for batches of
  // batch_size x sample_bytes; every slot starts as the client's.
  static Result<std::unique_ptr<ShmPool>> Map(UniqueFd fd, uint32_t slots, uint64_t stride, uint64_t batch_size,
                                              uint64_t sample_bytes, const std::string& peer);
  // For a new connection of the same client: true when every slot was back
  // in the pool, which then holds none (all are the client's again) and is
  // no longer cancelled (the last session's stop cancelled it).
  bool Reclaim() {
    pool.SetCancelled(false);
    return pool.TakeAllFree() == pool.size();
  }
};

// Page-aligned slot stride for batches of `batch_bytes`.
inline uint64_t ShmSlotStride(uint64_t batch_bytes) {
  constexpr uint64_t kPage = 4096;
  return (std::max<uint64_t>(batch_bytes, 1) + kPage - 1) / kPage * kPage;
}

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_SHM_H_
