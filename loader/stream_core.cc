// StreamCore (loader/stream_core.h).
#include "loader/stream_core.h"

namespace gpufeed::loader {

void StreamCore::Push(Item it) {
  {
    MutexLock lock(&mu_);
    ready_.push_back(it);
  }
  cv_.SignalAll();
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
  }
  cv_.SignalAll();
}

Result<std::optional<StreamCore::Item>> StreamCore::Pop(const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  Item it;
  {
    MutexLock lock(&mu_);
    depth_sum_ += ready_.size();
    // Slices, so a consumer that holds every slot is noticed: the producer
    // cannot fill a batch until one comes back, and only the consumer (or a
    // thread it owns) can give one back.
    bool holding = false;
    Clock::time_point holding_since;
    while (ready_.empty() && !done_) {
      if (cv_.WaitFor(&mu_, std::chrono::milliseconds(20))) continue;
      if (!pool_->ConsumerHoldsAll()) {
        holding = false;
        continue;
      }
      const auto now = Clock::now();
      if (!holding) {
        holding = true;
        holding_since = now;
      }
      if (now - holding_since >= kHoldAllGrace) {
        wait_seconds_ += std::chrono::duration<double>(now - t0).count();
        return Status::InvalidArgument(
            what + ": the consumer holds all " + std::to_string(pool_->size()) +
            " batch buffers and asks for another, which cannot be filled until one is released; release (destroy) "
            "batches you no longer need before asking for more, or " +
            pool_->hold_hint());
      }
    }
    wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
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
