// StreamCore (loader/stream_core.h).
#include "loader/stream_core.h"

namespace gpufeed::loader {

void StreamCore::Push(Item it) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(it);
  }
  cv_.notify_all();
}

void StreamCore::Fail(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(s);
  }
  failed_ = true;
  cv_.notify_all();
}

void StreamCore::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

Result<std::optional<StreamCore::Item>> StreamCore::Pop(const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  depth_sum_ += ready_.size();
  // Slices, so a consumer that holds every slot is noticed: the producer
  // cannot fill a batch until one comes back, and only the consumer (or a
  // thread it owns) can give one back.
  bool holding = false;
  Clock::time_point holding_since;
  while (!cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return !ready_.empty() || done_; })) {
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
          "batches you no longer need before asking for more, or " + pool_->hold_hint());
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
  Item it = ready_.front();
  ready_.pop_front();
  lock.unlock();
  pool_->MarkDelivered(it.slot);
  return std::optional<Item>(it);
}

void StreamCore::ReleaseUndelivered() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Item& it : ready_) pool_->Release(it.slot);
  ready_.clear();
}

}  // namespace gpufeed::loader
