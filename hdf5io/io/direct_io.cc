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
#include <deque>
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
// Hints waiting for a buffer, per buffer (UringReadAhead's queue).
constexpr size_t kQueuedPerSlot = 4;
}  // namespace

struct UringReadAhead::Impl {
  // kOrphan: a read whose entry is in the submission queue but whose
  // submit failed; the next submit sends it, so its buffer is the kernel's
  // until its completion frees the slot (never reused before: two reads
  // would land in one buffer).
  enum class State { kFree, kInFlight, kDone, kClaimed, kOrphan };
  struct Range {
    uint64_t key = 0, offset = 0, n = 0;  // the range asked for
  };
  struct Slot {
    State state = State::kFree;
    Range range;
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
  // Hints not started yet for want of a free buffer, in the order they came
  // (the plan's): each slot a Take frees starts the oldest.
  std::deque<Range> queued GUARDED_BY(mu);
  size_t max_queued = 0;
  bool reaping GUARDED_BY(mu) = false;  // one thread at a time consumes completions
  unsigned inflight GUARDED_BY(mu) = 0, done_untaken GUARDED_BY(mu) = 0, claimed GUARDED_BY(mu) = 0;
  uint64_t seq GUARDED_BY(mu) = 0;
  Stats st GUARDED_BY(mu);
  // The slots' states over time: st's slot-seconds are summed from here.
  std::chrono::steady_clock::time_point first_start GUARDED_BY(mu), last_change GUARDED_BY(mu);
  bool any_start GUARDED_BY(mu) = false;

  // Adds the time since the last change of the slots' states to their
  // slot-seconds; called before every such change.
  void Account() REQUIRES(mu) {
    const auto now = std::chrono::steady_clock::now();
    if (any_start) {
      const double dt = std::chrono::duration<double>(now - last_change).count();
      st.in_flight_slot_s += dt * inflight;
      st.done_untaken_slot_s += dt * done_untaken;
      st.claimed_slot_s += dt * claimed;
      st.seconds = std::chrono::duration<double>(now - first_start).count();
    }
    last_change = now;
  }

  // A free slot, or the oldest holding a read completed kAbandonedAfter ago
  // and never taken (hinted and then not read: a cache hit, an epoch's end),
  // given up; null if every slot is busy.
  Slot* FreeSlot() REQUIRES(mu) {
    for (Slot& s : slots) {
      if (s.state == State::kFree) return &s;
    }
    const auto now = std::chrono::steady_clock::now();
    Slot* slot = nullptr;
    for (Slot& s : slots) {
      if (s.state == State::kDone && now - s.done_at > kAbandonedAfter && (slot == nullptr || s.seq < slot->seq)) {
        slot = &s;
      }
    }
    if (slot != nullptr) {
      Account();
      done_untaken -= 1;
      slot->state = State::kFree;
    }
    return slot;
  }

  // Submits the read of `r` into `slot` (free). False if it cannot (no
  // memory for its buffer, the ring refusing): the range is then read
  // synchronously by its reader.
  bool Submit(Slot& slot, const Range& r) REQUIRES(mu) {
    const uint64_t start = r.offset / kDirectAlign * kDirectAlign;
    const uint64_t stop = (r.offset + r.n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    const size_t span = static_cast<size_t>(stop - start);
    if (slot.cap < span) {
      void* p = nullptr;
      if (posix_memalign(&p, kDirectAlign, span) != 0) return false;
      slot.buf.reset(static_cast<std::byte*>(p));
      slot.cap = span;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) return false;
    io_uring_prep_read(sqe, fd, slot.buf.get(), static_cast<unsigned>(span), start);
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(&slot - slots.data()));
    if (io_uring_submit(&ring) < 1) {
      // The entry stays queued and goes out with the next submit: the slot
      // waits for that read's completion, read by no one.
      Account();
      slot.state = State::kOrphan;
      slot.range = Range{};
      inflight += 1;
      return false;
    }
    Account();
    if (!any_start) {
      any_start = true;
      first_start = last_change;
    }
    slot.state = State::kInFlight;
    slot.range = r;
    slot.start = start;
    slot.seq = ++seq;
    inflight += 1;
    st.started += 1;
    return true;
  }

  // Starts queued hints, oldest first, while there are buffers for them.
  void Pump() REQUIRES(mu) {
    while (!queued.empty()) {
      Slot* slot = FreeSlot();
      if (slot == nullptr) return;
      const Range r = queued.front();
      queued.pop_front();
      if (!Submit(*slot, r)) st.dropped += 1;
    }
  }

  // Marks the slots whose reads completed. Requires the reaper role too.
  void HandleCompletions() REQUIRES(mu) {
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe != nullptr) {
      const uint64_t idx = io_uring_cqe_get_data64(cqe);
      if (idx < slots.size() && slots[idx].state == State::kOrphan) {
        Account();
        slots[idx].state = State::kFree;
        inflight -= 1;
      } else if (idx < slots.size() && slots[idx].state == State::kInFlight) {
        Account();
        done_untaken += 1;
        slots[idx].res = cqe->res;
        slots[idx].state = State::kDone;
        slots[idx].done_at = std::chrono::steady_clock::now();
        inflight -= 1;
      }
      io_uring_cqe_seen(&ring, cqe);
    }
  }

  // Consumes the completions already there unless a reaper is waiting (it
  // consumes them when it wakes): the slots' states, and so their
  // slot-seconds, follow the reads without waiting for a Take to wait.
  void Reap() REQUIRES(mu) {
    if (!reaping) HandleCompletions();
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

  // Under mu: the slot holding `key`'s read covering [offset, offset + n),
  // in flight or completed; null if none.
  Slot* Find(uint64_t key, uint64_t offset, size_t n) REQUIRES(mu) {
    for (Slot& s : slots) {
      if ((s.state == State::kInFlight || s.state == State::kDone) && s.range.key == key && offset >= s.range.offset &&
          offset + n <= s.range.offset + s.range.n) {
        return &s;
      }
    }
    return nullptr;
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
  impl->max_queued = kQueuedPerSlot * depth;
  return std::unique_ptr<UringReadAhead>(new UringReadAhead(std::move(impl)));
}

UringReadAhead::~UringReadAhead() {
  Impl& d = *impl_;
  {
    MutexLock lock(&d.mu);
    d.queued.clear();  // nothing more is started
    if (const char* e = std::getenv("GPUFEED_IO_STATS"); e != nullptr && std::string_view(e) == "1") {
      // Up to the last change of the slots (the time after it, the file left
      // open idle, is not the reader's).
      const Stats& s = d.st;
      const double t = s.seconds > 0 ? s.seconds : 1;
      std::fprintf(stderr,
                   "gpufeed io_uring read-ahead: %llu reads started, %llu taken, %llu hints dropped (%zu slots, "
                   "%zu hints queued at most); over %.2f s, slots with a read in flight %.2f, completed and untaken "
                   "%.2f, being copied out %.2f (means); readers waited %.2f s for reads in flight; %llu reads "
                   "(%.2f GB) not started\n",
                   static_cast<unsigned long long>(s.started), static_cast<unsigned long long>(s.taken),
                   static_cast<unsigned long long>(s.dropped), d.slots.size(), d.max_queued, s.seconds,
                   s.in_flight_slot_s / t, s.done_untaken_slot_s / t, s.claimed_slot_s / t, s.take_wait_s,
                   static_cast<unsigned long long>(s.not_started), static_cast<double>(s.not_started_bytes) / 1e9);
    }
    const auto deadline = std::chrono::steady_clock::now() + kIoTimeout;
    if (d.inflight > 0) io_uring_submit(&d.ring);  // an orphan's entry (kOrphan) goes out, to complete
    while (d.inflight > 0 && std::chrono::steady_clock::now() < deadline) d.WaitSome();
    if (d.inflight > 0) {
      // The kernel may still write into these buffers: leak them rather than
      // free memory a read lands in.
      for (Impl::Slot& s : d.slots) {
        if (s.state == Impl::State::kInFlight || s.state == Impl::State::kOrphan) (void)s.buf.release();
      }
    }
  }
  io_uring_queue_exit(&d.ring);
}

UringReadAhead::Stats UringReadAhead::stats() const {
  MutexLock lock(&impl_->mu);
  impl_->Reap();
  impl_->Account();
  return impl_->st;
}

void UringReadAhead::Start(uint64_t key, uint64_t offset, size_t n) {
  Impl& d = *impl_;
  const auto end = CheckedAdd(offset, n);
  if (n == 0 || !end || *end > (UINT64_MAX >> 1)) return;
  const uint64_t start = offset / kDirectAlign * kDirectAlign;
  const uint64_t stop = (*end + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (stop - start > (1u << 30)) return;  // one SQE reads at most 1 GiB here; larger reads go synchronously
  MutexLock lock(&d.mu);
  d.Reap();
  for (const Impl::Slot& s : d.slots) {
    if (s.state != Impl::State::kFree && s.range.key == key) return;  // already under way
  }
  for (const Impl::Range& q : d.queued) {
    if (q.key == key) return;  // already waiting for a buffer
  }
  // Every buffer busy: the hint waits in the queue for the next buffer a
  // Take frees (hints come in the order of the reads, so it is wanted after
  // those in the buffers). A completed read nobody took yet is not given up
  // for it while it may still be wanted (giving it up read the same bytes
  // twice, once here and once synchronously). Past the queue's bound the
  // hint is dropped: its read is made synchronously when it is wanted.
  if (d.queued.size() >= d.max_queued) {
    d.st.dropped += 1;
    return;
  }
  d.queued.push_back({key, offset, n});
  d.Pump();
}

std::optional<int64_t> UringReadAhead::Take(uint64_t key, std::byte* dst, size_t n, uint64_t offset) {
  Impl& d = *impl_;
  Impl::Slot* slot = nullptr;
  int64_t res = 0;
  uint64_t skip = 0;
  {
    MutexLock lock(&d.mu);
    d.Reap();
    slot = d.Find(key, offset, n);
    if (slot == nullptr) {
      // Wanted before a buffer came free for it: read synchronously by the
      // caller, and not started later.
      for (auto it = d.queued.begin(); it != d.queued.end(); ++it) {
        if (it->key == key) {
          d.queued.erase(it);
          break;
        }
      }
      d.st.not_started += 1;
      d.st.not_started_bytes += n;
      return std::nullopt;
    }
    const uint64_t seq = slot->seq;
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + kIoTimeout;
    while (slot->state == Impl::State::kInFlight && slot->seq == seq) {
      if (std::chrono::steady_clock::now() >= deadline) return -ETIMEDOUT;
      d.WaitSome();
    }
    d.st.take_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Reused for another read while this thread waited (a completed read
    // untaken for kAbandonedAfter is given up): read synchronously instead.
    if (slot->state != Impl::State::kDone || slot->seq != seq) return std::nullopt;
    d.Account();
    d.done_untaken -= 1;
    d.claimed += 1;
    slot->state = Impl::State::kClaimed;
    d.st.taken += 1;
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
  d.Account();
  d.claimed -= 1;
  slot->state = Impl::State::kFree;
  d.Pump();  // the oldest queued hint takes the buffer
  d.cv.SignalAll();
  return out;
}

}  // namespace gpufeed::io

namespace gpufeed {

static_assert(kDirectIoAlignment == io::kDirectAlign);
Status EvictFromPageCache(const std::string& path) { return io::EvictFromPageCache(path); }
Result<double> PageCacheResidentFraction(const std::string& path) { return io::ResidentFraction(path); }

}  // namespace gpufeed
