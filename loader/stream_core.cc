// StreamCore (loader/stream_core.h).
#include "loader/stream_core.h"

namespace gpufeed::loader {

void StreamCore::Push(Item it) {
  {
    MutexLock lock(&mu_);
    ready_.push_back(it);
    starved_ = false;
  }
  cv_.SignalAll();
}

void StreamCore::MarkStarved() {
  // The pool's mutex under this one, as ConsumerHoldsAll() takes it.
  if (!starved_.exchange(true)) pool_->WakeWaiters();
}

void StreamCore::Fail(Status s) {
  {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = std::move(s);
  }
  failed_ = true;
  cv_.SignalAll();
}

void StreamCore::Finish() {
  {
    MutexLock lock(&mu_);
    done_ = true;
    starved_ = false;
  }
  cv_.SignalAll();
}

WaitResult StreamCore::WaitLocked(std::chrono::steady_clock::time_point deadline, bool interruptible, bool* holds_all) {
  using Clock = std::chrono::steady_clock;
  // Slices, so a consumer that holds every slot is noticed: the producer
  // cannot fill a batch until one comes back, and only the consumer (or a
  // thread it owns) can give one back.
  bool holding = false;
  Clock::time_point holding_since;
  *holds_all = false;
  for (;;) {
    // An interrupt ends this wait even where an item is ready: it answers
    // one wait, whichever comes first after it.
    if (interruptible && interrupted_) {
      interrupted_ = false;
      return WaitResult::kInterrupted;
    }
    if (!ready_.empty() || done_) return WaitResult::kReady;
    // Asked for and none ready (also by a poll that will not wait).
    MarkStarved();
    const auto now = Clock::now();
    if (now >= deadline) return WaitResult::kTimeout;
    if (cv_.WaitFor(&mu_, std::min<Clock::duration>(std::chrono::milliseconds(20), deadline - now))) continue;
    if (!pool_->ConsumerHoldsAll()) {
      holding = false;
      continue;
    }
    const auto then = Clock::now();
    if (!holding) {
      holding = true;
      holding_since = then;
    }
    if (then - holding_since >= kHoldAllGrace) {
      *holds_all = true;
      return WaitResult::kReady;
    }
  }
}

WaitResult StreamCore::WaitReady(std::chrono::steady_clock::time_point deadline) {
  const auto t0 = std::chrono::steady_clock::now();
  MutexLock lock(&mu_);
  bool holds_all = false;
  const WaitResult w = WaitLocked(deadline, true, &holds_all);
  AddWait(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return w;
}

void StreamCore::Interrupt() {
  {
    MutexLock lock(&mu_);
    interrupted_ = true;
  }
  cv_.SignalAll();
}

Result<std::optional<StreamCore::Item>> StreamCore::Pop(const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Item it;
  {
    MutexLock lock(&mu_);
    depth_sum_.store(depth_sum_.load(std::memory_order_relaxed) + ready_.size(), std::memory_order_relaxed);
    bool holds_all = false;
    (void)WaitLocked(Clock::time_point::max(), false, &holds_all);
    AddWait(std::chrono::duration<double>(Clock::now() - t0).count());
    if (holds_all) {
      return Status::InvalidArgument(
          what + ": the consumer holds all " + std::to_string(pool_->size()) +
          " batch buffers and asks for another, which cannot be filled until one is released; release (destroy) "
          "batches you no longer need before asking for more, or " +
          pool_->hold_hint());
    }
    if (ready_.empty()) {
      if (!error_.ok() && !error_returned_) {
        error_returned_ = true;
        return error_;
      }
      return std::optional<Item>();
    }
    it = ready_.front();
    ready_.pop_front();
  }
  pool_->MarkDelivered(it.slot);
  return std::optional<Item>(it);
}

void StreamCore::ReleaseUndelivered() {
  MutexLock lock(&mu_);
  for (const Item& it : ready_) pool_->Release(it.slot);
  ready_.clear();
}

}  // namespace gpufeed::loader
