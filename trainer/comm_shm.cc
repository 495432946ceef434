// The CPU ranks' collectives (trainer/comm.h): a file-backed shared segment
// rank 0 creates, one slot of floats per rank and a barrier. AllReduce
// copies each rank's values into its slot, waits for all, and every rank
// sums the slots in rank order (so all get the same bits), then waits again
// before a slot may be reused.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "trainer/comm.h"

namespace gpufeed::trainer {
namespace {

constexpr uint64_t kShmMagic = 0x67706673686d3031ull;  // "gpfshm01"
constexpr int kMaxRanks = 256;
constexpr size_t kSlotFloats = size_t(1) << 20;  // 4 MiB a rank; larger tensors go in pieces

// Every field another rank reads is atomic: the ranks may be threads of one
// process (the tests), and what orders them is these atomics, not the
// rendezvous file. magic is stored last (release); the rest is read after it.
struct Header {
  std::atomic<uint64_t> magic;
  uint64_t nonce;  // rank 0's, in the rendezvous payload: a stale segment is refused
  int32_t world;
  std::atomic<int32_t> attached;
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> failed;  // a rank that called Abort, else -1
  std::atomic<int32_t> pids[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics");

class ShmComm final : public Comm {
 public:
  ShmComm(const CommOptions& o) : Comm(o.rank, o.world_size), o_(o) {}
  ~ShmComm() override {
    if (base_) ::munmap(base_, bytes_);
  }

  Status Init() {
    if (o_.world_size > kMaxRanks)
      return Status::InvalidArgument("train: at most " + std::to_string(kMaxRanks) + " CPU ranks");
    bytes_ = sizeof(Header) + size_t(o_.world_size) * kSlotFloats * sizeof(float);
    const std::string path = o_.prefix + ".shm";
    std::string payload;
    uint64_t nonce = 0;
    if (rank() == 0) {
      nonce = std::random_device{}() * 0x100000001ull ^ uint64_t(::getpid()) ^ uint64_t(NowSeconds() * 1e6);
      ::unlink(path.c_str());
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) return Status::IOError("train: create " + path + ": " + std::strerror(errno));
      if (::ftruncate(fd, off_t(bytes_)) != 0) {
        const int e = errno;
        ::close(fd);
        return Status::IOError("train: size " + path + ": " + std::strerror(e));
      }
      GPUFEED_RETURN_IF_ERROR(Map(fd, path));
      auto* h = header();
      h->nonce = nonce;
      h->world = o_.world_size;
      h->attached.store(0);
      h->arrived.store(0);
      h->generation.store(0);
      h->failed.store(-1);
      for (auto& p : h->pids) p.store(0);
      h->magic.store(kShmMagic, std::memory_order_release);
      payload = path + "\n" + std::to_string(nonce);
    }
    auto got = Rendezvous(o_, payload);
    if (!got.ok()) return got.status();
    if (rank() != 0) {
      const size_t nl = got->find('\n');
      if (nl == std::string::npos) return Status::Corrupt("train: bad rendezvous payload");
      nonce = std::stoull(got->substr(nl + 1));
      const std::string shm = got->substr(0, nl);
      const int fd = ::open(shm.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return Status::IOError("train: open rank 0's segment " + shm + ": " + std::strerror(errno));
      struct stat st {};
      if (::fstat(fd, &st) != 0 || size_t(st.st_size) != bytes_) {
        ::close(fd);
        return Status::InvalidArgument("train: " + shm + " is not a segment for " + std::to_string(world_size()) +
                                       " ranks");
      }
      GPUFEED_RETURN_IF_ERROR(Map(fd, shm));
      if (header()->magic.load(std::memory_order_acquire) != kShmMagic || header()->nonce != nonce)
        return Status::InvalidArgument("train: " + shm + " is not rank 0's segment of this job (stale?)");
    }
    header()->pids[rank()].store(int32_t(::getpid()));
    header()->attached.fetch_add(1);
    GPUFEED_RETURN_IF_ERROR(Barrier());  // everyone has the segment: the files can go
    if (rank() == 0) ::unlink(path.c_str());
    RendezvousDone(o_);
    return Status::Ok();
  }

  std::string Describe() const override { return "shared memory"; }

  Status AllReduce(float* const* bufs, const size_t* sizes, int count) override {
    // Walk the tensors as one sequence, a slot's worth at a time.
    int t = 0;
    size_t off = 0;
    while (t < count) {
      struct Piece {
        float* p;
        size_t n;
      };
      std::vector<Piece> pieces;
      size_t used = 0;
      while (t < count && used < kSlotFloats) {
        const size_t take = std::min(sizes[t] - off, kSlotFloats - used);
        if (take > 0) pieces.push_back({bufs[t] + off, take});
        used += take, off += take;
        if (off == sizes[t]) ++t, off = 0;
      }
      float* mine = slot(rank());
      size_t at = 0;
      for (const Piece& p : pieces) std::memcpy(mine + at, p.p, p.n * sizeof(float)), at += p.n;
      GPUFEED_RETURN_IF_ERROR(Barrier());
      at = 0;
      for (const Piece& p : pieces) {
        for (size_t i = 0; i < p.n; ++i) {
          float s = slot(0)[at + i];
          for (int r = 1; r < world_size(); ++r) s += slot(r)[at + i];
          p.p[i] = s;
        }
        at += p.n;
      }
      GPUFEED_RETURN_IF_ERROR(Barrier());
    }
    return Status::Ok();
  }

  Status Broadcast(float* buf, size_t n, int root) override {
    for (size_t off = 0; off < n; off += kSlotFloats) {
      const size_t k = std::min(kSlotFloats, n - off);
      if (rank() == root) std::memcpy(slot(root), buf + off, k * sizeof(float));
      GPUFEED_RETURN_IF_ERROR(Barrier());
      if (rank() != root) std::memcpy(buf + off, slot(root), k * sizeof(float));
      GPUFEED_RETURN_IF_ERROR(Barrier());
    }
    return Status::Ok();
  }

  Status Join() override { return Status::Ok(); }

  Status AllGather(const void* mine, size_t bytes, void* all) override {
    if (bytes > kSlotFloats * sizeof(float)) return Status::InvalidArgument("train: AllGather of too many bytes");
    std::memcpy(slot(rank()), mine, bytes);
    GPUFEED_RETURN_IF_ERROR(Barrier());
    for (int r = 0; r < world_size(); ++r) std::memcpy(static_cast<char*>(all) + size_t(r) * bytes, slot(r), bytes);
    return Barrier();
  }

  void Abort() override {
    if (base_) header()->failed.store(rank());
  }

 private:
  Header* header() const { return static_cast<Header*>(base_); }
  float* slot(int r) const {
    return reinterpret_cast<float*>(static_cast<char*>(base_) + sizeof(Header)) + size_t(r) * kSlotFloats;
  }

  Status Map(int fd, const std::string& path) {
    base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      return Status::IOError("train: map " + path + ": " + std::strerror(e));
    }
    return Status::Ok();
  }

  // A central barrier: the last to arrive opens the next generation. The
  // others wait with a deadline, watching for a rank that failed or died.
  Status Barrier() {
    Header* h = header();
    const uint32_t gen = h->generation.load(std::memory_order_acquire);
    if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(world_size())) {
      h->arrived.store(0, std::memory_order_relaxed);
      h->generation.fetch_add(1, std::memory_order_acq_rel);
      return Status::Ok();
    }
    const double deadline = NowSeconds() + o_.timeout_s;
    double next_check = NowSeconds() + 0.1;
    for (int spin = 0; h->generation.load(std::memory_order_acquire) == gen; ++spin) {
      if (spin < 200) continue;
      if (spin < 2000) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (const int f = h->failed.load(); f >= 0 && f != rank())
        return Status::IOError("train: rank " + std::to_string(f) + " failed; rank " + std::to_string(rank()) +
                               " stops too");
      const double now = NowSeconds();
      if (now < next_check) continue;
      next_check = now + 0.1;
      for (int r = 0; r < world_size(); ++r) {
        const pid_t pid = h->pids[r].load();
        if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
          return Status::IOError("train: rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                                 ") exited; rank " + std::to_string(rank()) + " stops too");
      }
      if (now > deadline)
        return Status::IOError("train: rank " + std::to_string(rank()) + " waited " +
                               std::to_string(int(o_.timeout_s)) + " s for the other ranks (" +
                               std::to_string(h->attached.load()) + " of " + std::to_string(world_size()) +
                               " attached)");
    }
    return Status::Ok();
  }

  CommOptions o_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<Comm>> MakeShmComm(const CommOptions& o) {
  auto c = std::make_unique<ShmComm>(o);
  GPUFEED_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Comm>(std::move(c));
}

#ifndef GPUFEED_WITH_CUDA
Result<std::unique_ptr<Comm>> MakeNcclComm(const CommOptions&, int, void*) {
  return Status::Unsupported("this gpufeed was built without CUDA (GPUFEED_CUDA=OFF): no NCCL");
}
#endif

}  // namespace gpufeed::trainer
