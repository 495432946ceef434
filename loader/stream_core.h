// StreamCore: the consumer side shared by every EpochStream kind (the local
// pipeline's LocalStream, RemoteLoader's RemoteStream): a ready queue of
// filled pool slots in delivery order, the first error of the producer, and
// Next()'s wait. That wait ends by a batch, by the end of the epoch, by an
// error — or, when the consumer holds every slot of the pool (so no producer
// can fill another), by an error naming the option to raise. It never waits
// without end (docs/practices.md, practice 16).
#ifndef GPUFEED_LOADER_STREAM_CORE_H_
#define GPUFEED_LOADER_STREAM_CORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

#include "common/mutex.h"
#include "gpufeed/loader.h"
#include "loader/batch_pool.h"

namespace gpufeed::loader {

class StreamCore {
 public:
  struct Item {
    Batch::Slot* slot = nullptr;
    uint64_t index = 0;  // batch index within the epoch
    uint64_t count = 0;  // samples
  };

  // How long the consumer may hold every slot while it waits in Pop() before
  // that is an error: a slot released from another thread (a tensor's
  // deleter) within it ends the wait normally.
  // Generous: a releasing thread descheduled on a loaded machine must not
  // turn a legal hand-off into this error (seen at 500 ms under CI load).
  static constexpr std::chrono::milliseconds kHoldAllGrace{2000};

  explicit StreamCore(BatchPool* pool) : pool_(pool) {}

  // Producer side (any thread).
  void Push(Item it);
  // True from when the consumer asks for an item and none is ready until the
  // producer pushes one or the stream ends; each time it turns true the
  // pool's waits are woken (BatchPool::WakeWaiters). A producer waiting for
  // a slot gives up on it (BatchPool::AcquireUnless): the consumer may be
  // waiting for a batch in flight that only the waiting thread can finish
  // (LocalStream::Run, loader/loader.cc).
  const std::atomic<bool>& starved() const { return starved_; }
  void Fail(Status s);  // records the first error; the producer should stop
  bool failed() const { return failed_.load(); }
  void Finish();  // no more items (after the last Push or Fail)
  // A stream that failed before its producer started.
  void FailNow(Status s) {
    Fail(std::move(s));
    Finish();
  }

  // Consumer side (one thread): the next item, its slot marked as the
  // consumer's; nullopt at the end; the producer's error once, then nullopt.
  // `what` names the stream in the held-every-slot error.
  Result<std::optional<Item>> Pop(const std::string& what);
  // Waits until Pop() would return at once (an item, the end, an error, or
  // the held-every-slot error), at most until `deadline`, or until
  // Interrupt(): kReady, kTimeout or kInterrupted. Takes nothing.
  WaitResult WaitReady(std::chrono::steady_clock::time_point deadline);
  // Any thread: the current WaitReady, or the next one, returns
  // kInterrupted (once).
  void Interrupt();

  // After the producer has ended: slots delivered but never taken go back to
  // the pool.
  void ReleaseUndelivered();

  // Any thread (stats() beside a taker on another thread, as the feed's fill
  // worker is).
  double wait_seconds() const { return wait_seconds_.load(std::memory_order_relaxed); }
  uint64_t depth_sum() const { return depth_sum_.load(std::memory_order_relaxed); }

 private:
  BatchPool* pool_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Item> ready_ GUARDED_BY(mu_);
  bool done_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);
  bool error_returned_ GUARDED_BY(mu_) = false;
  bool interrupted_ GUARDED_BY(mu_) = false;
  // starved(): written under mu_ (true only while ready_ is empty), read
  // without it by the producer's pool wait.
  std::atomic<bool> starved_{false};
  void MarkStarved() REQUIRES(mu_);
  // Pop's and WaitReady's wait: until an item or the end, the deadline, an
  // interrupt (when `interruptible`), or the consumer holding every slot for
  // kHoldAllGrace (*holds_all set).
  WaitResult WaitLocked(std::chrono::steady_clock::time_point deadline, bool interruptible, bool* holds_all)
      REQUIRES(mu_);
  std::atomic<bool> failed_{false};
  // Written by the one thread that takes items; read by anyone.
  std::atomic<double> wait_seconds_{0};
  std::atomic<uint64_t> depth_sum_{0};
  void AddWait(double seconds) {
    wait_seconds_.store(wait_seconds_.load(std::memory_order_relaxed) + seconds, std::memory_order_relaxed);
  }
};

}  // namespace gpufeed::loader

#endif  // GPUFEED_LOADER_STREAM_CORE_H_
