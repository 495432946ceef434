// BatchPool (loader/batch_pool.h) and Batch, the consumer's view of a slot.
#include "loader/batch_pool.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace gpufeed {

// ---------------------------------------------------------------------------
// Buffer pool

Status BatchPool::Allocate(int n, uint64_t batch_size, uint64_t sample_bytes, bool pin_memory) {
  if (allocated()) return Status::Ok();
  const uint64_t batch_bytes = batch_size * sample_bytes;
  std::vector<std::unique_ptr<Batch::Slot>> slots;
  for (int i = 0; i < n; ++i) {
    auto images = gpu::HostBuffer::Allocate(std::max<uint64_t>(1, batch_bytes), pin_memory);
    if (images.data() == nullptr) {
      return Status::Internal("loader: cannot allocate a " + std::to_string(batch_bytes) + "-byte batch buffer");
    }
    // Fault the pages in now, once, rather than during the first batches
    // (pinned memory is resident already).
    if (!images.pinned()) std::memset(images.data(), 0, images.bytes());
    slots.push_back(NewSlot(static_cast<uint32_t>(i), std::move(images), batch_size));
  }
  Install(std::move(slots), /*start_free=*/true);
  return Status::Ok();
}

std::unique_ptr<Batch::Slot> BatchPool::NewSlot(uint32_t id, gpu::HostBuffer images, uint64_t batch_size) {
  auto slot = std::make_unique<Batch::Slot>();
  slot->images = std::move(images);
  slot->labels.resize(batch_size);
  slot->indices.resize(batch_size);
  slot->pool = this;
  slot->id = id;
  return slot;
}

void BatchPool::Install(std::vector<std::unique_ptr<Batch::Slot>> slots, bool start_free) {
  std::lock_guard<std::mutex> lock(mu_);
  if (start_free) {
    for (auto& slot : slots) free_.push_back(slot.get());
  }
  slots_ = std::move(slots);
}

Status BatchPool::AllocateViews(std::span<std::byte> region, uint64_t stride, int n, uint64_t batch_size,
                                uint64_t sample_bytes, bool pin_memory, bool start_free) {
  if (allocated()) return Status::Ok();
  const uint64_t batch_bytes = batch_size * sample_bytes;
  if (n < 1 || stride < batch_bytes || region.size() / stride < static_cast<uint64_t>(n)) {
    return Status::InvalidArgument("batch pool: " + std::to_string(n) + " slots of " + std::to_string(batch_bytes) +
                                   " bytes (stride " + std::to_string(stride) + ") do not fit a region of " +
                                   std::to_string(region.size()) + " bytes");
  }
  std::vector<std::unique_ptr<Batch::Slot>> slots;
  for (int i = 0; i < n; ++i) {
    slots.push_back(NewSlot(static_cast<uint32_t>(i),
                            gpu::HostBuffer::Adopt(region.data() + static_cast<uint64_t>(i) * stride,
                                                   std::max<uint64_t>(1, batch_bytes), pin_memory),
                            batch_size));
  }
  Install(std::move(slots), start_free);
  return Status::Ok();
}

Batch::Slot* BatchPool::Acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return cancelled_ || !free_.empty(); });
  if (cancelled_) return nullptr;
  Batch::Slot* s = free_.back();
  free_.pop_back();
  return s;
}

Batch::Slot* BatchPool::AcquireFor(std::chrono::milliseconds timeout, bool* timed_out) {
  std::unique_lock<std::mutex> lock(mu_);
  *timed_out = !cv_.wait_for(lock, timeout, [&] { return cancelled_ || !free_.empty(); });
  if (*timed_out || cancelled_) return nullptr;
  Batch::Slot* s = free_.back();
  free_.pop_back();
  return s;
}

Batch::Slot* BatchPool::TryAcquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_ || free_.empty()) return nullptr;
  Batch::Slot* s = free_.back();
  free_.pop_back();
  return s;
}

void BatchPool::Release(Batch::Slot* s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s->with_consumer) {
      s->with_consumer = false;
      --with_consumer_;
    }
    free_.push_back(s);
  }
  cv_.notify_all();
}

void BatchPool::MarkDelivered(Batch::Slot* s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!s->with_consumer) {
    s->with_consumer = true;
    ++with_consumer_;
  }
}

bool BatchPool::ConsumerHoldsAll() {
  std::lock_guard<std::mutex> lock(mu_);
  return !hold_hint_.empty() && !slots_.empty() && with_consumer_ >= slots_.size();
}

void BatchPool::SetHoldHint(std::string hint) {
  std::lock_guard<std::mutex> lock(mu_);
  hold_hint_ = std::move(hint);
}

std::string BatchPool::hold_hint() {
  std::lock_guard<std::mutex> lock(mu_);
  return hold_hint_;
}

size_t BatchPool::TakeAllFree() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = free_.size();
  free_.clear();
  return n;
}

void BatchPool::SetCancelled(bool c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = c;
  }
  cv_.notify_all();
}

Batch::Batch(Batch&& o) noexcept { *this = std::move(o); }
Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    if (slot_ != nullptr) slot_->pool->Release(slot_);
    slot_ = std::exchange(o.slot_, nullptr);
    data_ = std::exchange(o.data_, nullptr);  // a moved-from Batch is empty
    labels_ = std::exchange(o.labels_, {});
    indices_ = std::exchange(o.indices_, {});
    sample_shape_ = o.sample_shape_;
    epoch_ = o.epoch_;
    index_ = o.index_;
    sample_bytes_ = o.sample_bytes_;
    pinned_ = o.pinned_;
  }
  return *this;
}
Batch::~Batch() {
  if (slot_ != nullptr) slot_->pool->Release(slot_);
}

}  // namespace gpufeed
