// O_DIRECT reads through aligned bounce buffers, and page-cache eviction and
// residency for the cold benchmark.
#include "hdf5io/io/direct_io.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "gpufeed/page_cache.h"

#include "common/mutex.h"
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

namespace {
constexpr auto kIoTimeout = std::chrono::seconds(60);
constexpr long kReapSliceNs = 100'000'000;  // a reaper re-checks its deadline every 100 ms
constexpr auto kAbandonedAfter = std::chrono::seconds(2);
}  // namespace

struct UringReadAhead::Impl {
  enum class State { kFree, kInFlight, kDone, kClaimed };
  struct Slot {
    State state = State::kFree;
    uint64_t key = 0, offset = 0, n = 0;            // the range asked for
    uint64_t start = 0;                             // aligned start of the read
    int64_t res = 0;                                // bytes read from `start`, or -errno
    uint64_t seq = 0;                               // Start order
    std::chrono::steady_clock::time_point done_at;  // when its read completed (kDone)
    std::unique_ptr<std::byte, FreeDeleter> buf;
    size_t cap = 0;
  };
  int fd = -1;
  // Submissions and completions are consumed under mu; the reaper waits on
  // the ring without it (that wait goes around the submission queue).
  io_uring ring{};
  Mutex mu;
  CondVar cv;
  // A slot claimed by Take (kClaimed) is its own until it frees it: its
  // buffer is read without mu.
  std::vector<Slot> slots GUARDED_BY(mu);
  bool reaping GUARDED_BY(mu) = false;  // one thread at a time consumes completions
  unsigned inflight GUARDED_BY(mu) = 0;
  uint64_t seq GUARDED_BY(mu) = 0;
  // Reads started, taken, and hints dropped with every slot busy (the read
  // is then made synchronously when it is wanted); GPUFEED_IO_STATS=1 prints
  // them when the file closes.
  uint64_t started GUARDED_BY(mu) = 0, taken GUARDED_BY(mu) = 0, dropped GUARDED_BY(mu) = 0;

  // Marks the slots whose reads completed. Requires the reaper role too.
  void HandleCompletions() REQUIRES(mu) {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe != nullptr) {
      const uint64_t idx = io_uring_cqe_get_data64(cqe);
      if (idx < slots.size() && slots[idx].state == State::kInFlight) {
        slots[idx].res = cqe->res;
        slots[idx].state = State::kDone;
        slots[idx].done_at = std::chrono::steady_clock::now();
        inflight -= 1;
      }
      io_uring_cqe_seen(&ring, cqe);
    }
  }

  // Waits a slice for completions as the reaper, or for the reaper to report.
  // Releases mu meanwhile.
  void WaitSome() REQUIRES(mu) {
    if (reaping) {
      cv.WaitFor(&mu, std::chrono::nanoseconds(kReapSliceNs));
      return;
    }
    reaping = true;
    mu.Unlock();
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts{0, kReapSliceNs};
    io_uring_wait_cqe_timeout(&ring, &cqe, &ts);  // only a wake-up: consumed below, under mu
    mu.Lock();
    HandleCompletions();
    reaping = false;
    cv.SignalAll();
  }
};

UringReadAhead::UringReadAhead(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<UringReadAhead> UringReadAhead::Create(int fd, unsigned depth, std::string* why) {
  const char* env = std::getenv("GPUFEED_IO_URING");
  if (env != nullptr && std::string_view(env) == "0") {
    *why = "io_uring disabled (GPUFEED_IO_URING=0)";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->fd = fd;
  const int r = io_uring_queue_init(std::max(2u, 2 * depth), &impl->ring, 0);
  if (r < 0) {
    *why = std::string("io_uring refused: ") + std::strerror(-r);
    return nullptr;
  }
  // Completions are waited for while another thread submits: that needs
  // waits that do not go through the submission queue (Linux 5.11+).
  if (!(impl->ring.features & IORING_FEAT_EXT_ARG)) {
    io_uring_queue_exit(&impl->ring);
    *why = "io_uring too old (no IORING_FEAT_EXT_ARG, Linux < 5.11)";
    return nullptr;
  }
  {
    MutexLock lock(&impl->mu);  // not shared yet: for the analysis
    impl->slots.resize(depth);
  }
  return std::unique_ptr<UringReadAhead>(new UringReadAhead(std::move(impl)));
}

UringReadAhead::~UringReadAhead() {
  Impl& d = *impl_;
  {
    MutexLock lock(&d.mu);
    if (const char* e = std::getenv("GPUFEED_IO_STATS"); e != nullptr && std::string_view(e) == "1") {
      std::fprintf(stderr,
                   "gpufeed io_uring read-ahead: %llu reads started, %llu taken, %llu hints dropped (%zu slots)\n",
                   static_cast<unsigned long long>(d.started), static_cast<unsigned long long>(d.taken),
                   static_cast<unsigned long long>(d.dropped), d.slots.size());
    }
    const auto deadline = std::chrono::steady_clock::now() + kIoTimeout;
    while (d.inflight > 0 && std::chrono::steady_clock::now() < deadline) d.WaitSome();
    if (d.inflight > 0) {
      // The kernel may still write into these buffers: leak them rather than
      // free memory a read lands in.
      for (Impl::Slot& s : d.slots) {
        if (s.state == Impl::State::kInFlight) (void)s.buf.release();
      }
    }
  }
  io_uring_queue_exit(&d.ring);
}

void UringReadAhead::Start(uint64_t key, uint64_t offset, size_t n) {
  Impl& d = *impl_;
  const auto end = CheckedAdd(offset, n);
  if (n == 0 || !end || *end > (UINT64_MAX >> 1)) return;
  const uint64_t start = offset / kDirectAlign * kDirectAlign;
  const uint64_t stop = (*end + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (stop - start > (1u << 30)) return;  // one SQE reads at most 1 GiB here; larger reads go synchronously
  const size_t span = static_cast<size_t>(stop - start);
  MutexLock lock(&d.mu);
  Impl::Slot* slot = nullptr;
  for (Impl::Slot& s : d.slots) {
    if (s.state != Impl::State::kFree && s.key == key) return;  // already under way
  }
  for (Impl::Slot& s : d.slots) {
    if (s.state == Impl::State::kFree) {
      slot = &s;
      break;
    }
  }
  // Every slot busy: the hint is dropped. A completed read nobody took yet
  // is not given up for it while it may still be wanted: hints come in the
  // order of the reads, so the oldest completed read is the one wanted
  // soonest (giving it up read the same bytes twice, once here and once
  // synchronously). One untaken for kAbandonedAfter was hinted and never
  // read (a cache hit, an epoch's end): its slot is reused.
  if (slot == nullptr) {
    const auto now = std::chrono::steady_clock::now();
    for (Impl::Slot& s : d.slots) {
      if (s.state == Impl::State::kDone && now - s.done_at > kAbandonedAfter &&
          (slot == nullptr || s.seq < slot->seq)) {
        slot = &s;
      }
    }
  }
  if (slot == nullptr) {
    d.dropped += 1;
    return;
  }
  if (slot->cap < span) {
    void* p = nullptr;
    if (posix_memalign(&p, kDirectAlign, span) != 0) return;
    slot->buf.reset(static_cast<std::byte*>(p));
    slot->cap = span;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(&d.ring);
  if (sqe == nullptr) return;
  io_uring_prep_read(sqe, d.fd, slot->buf.get(), static_cast<unsigned>(span), start);
  io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot - d.slots.data()));
  if (io_uring_submit(&d.ring) < 1) {
    slot->state = Impl::State::kFree;
    return;
  }
  slot->state = Impl::State::kInFlight;
  slot->key = key;
  slot->offset = offset;
  slot->n = n;
  slot->start = start;
  slot->seq = ++d.seq;
  d.inflight += 1;
  d.started += 1;
}

std::optional<int64_t> UringReadAhead::Take(uint64_t key, std::byte* dst, size_t n, uint64_t offset) {
  Impl& d = *impl_;
  Impl::Slot* slot = nullptr;
  int64_t res = 0;
  uint64_t skip = 0;
  {
    MutexLock lock(&d.mu);
    for (Impl::Slot& s : d.slots) {
      if ((s.state == Impl::State::kInFlight || s.state == Impl::State::kDone) && s.key == key && offset >= s.offset &&
          offset + n <= s.offset + s.n) {
        slot = &s;
        break;
      }
    }
    if (slot == nullptr) return std::nullopt;
    const uint64_t seq = slot->seq;
    const auto deadline = std::chrono::steady_clock::now() + kIoTimeout;
    while (slot->state == Impl::State::kInFlight && slot->seq == seq) {
      if (std::chrono::steady_clock::now() >= deadline) return -ETIMEDOUT;
      d.WaitSome();
    }
    // Reused for another read while this thread waited (Start takes a
    // completed read untaken for kAbandonedAfter): read synchronously instead.
    if (slot->state != Impl::State::kDone || slot->seq != seq) return std::nullopt;
    slot->state = Impl::State::kClaimed;
    d.taken += 1;
    res = slot->res;
    skip = offset - slot->start;
  }
  // Claimed: no other thread touches the slot until it is freed below.
  int64_t out;
  if (res < 0) {
    out = res;
  } else if (static_cast<uint64_t>(res) < skip + n && static_cast<uint64_t>(res) % kDirectAlign == 0) {
    out = PreadDirect(d.fd, dst, n, offset);  // a short read not at end of file: read it again
  } else {
    const size_t got = static_cast<uint64_t>(res) <= skip ? 0 : std::min<size_t>(n, static_cast<uint64_t>(res) - skip);
    CopyBytes(dst, slot->buf.get() + skip, got);
    out = static_cast<int64_t>(got);
  }
  MutexLock lock(&d.mu);
  slot->state = Impl::State::kFree;
  d.cv.SignalAll();
  return out;
}

}  // namespace gpufeed::io

namespace gpufeed {

static_assert(kDirectIoAlignment == io::kDirectAlign);
Status EvictFromPageCache(const std::string& path) { return io::EvictFromPageCache(path); }
Result<double> PageCacheResidentFraction(const std::string& path) { return io::ResidentFraction(path); }

}  // namespace gpufeed
