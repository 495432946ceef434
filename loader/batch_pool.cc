// BatchPool (loader/batch_pool.h) and Batch, the consumer's view of a slot.
#include "loader/batch_pool.h"

#include <algorithm>
#include <utility>

#include "common/trace.h"

namespace gpufeed {

uint64_t SlotSampleBytes(const ChunkSource& source, bool defers) {
  const uint64_t sb = source.sample_bytes();
  if (!defers || source.num_samples() == 0) return sb;
  uint64_t stored = 0;
  for (uint64_t c = 0; c < source.num_chunks(); ++c) stored += source.stored_chunk_bytes(c);
  const uint64_t mean = stored / source.num_samples();
  return std::max(sb, (2 * mean + 63) / 64 * 64);
}

// ---------------------------------------------------------------------------
// Buffer pool

BatchPool::~BatchPool() {
  {
    MutexLock lock(&mu_);
    stop_allocating_ = true;
  }
  if (allocator_.joinable()) allocator_.join();
}

Status BatchPool::Allocate(int n, uint64_t batch_size, uint64_t sample_bytes, bool pin_memory) {
  if (allocated()) return Status::Ok();
  if (n < 1) return Status::InvalidArgument("batch pool: " + std::to_string(n) + " slots");
  std::vector<std::unique_ptr<Batch::Slot>> slots;
  for (int i = 0; i < n; ++i) slots.push_back(NewSlot(static_cast<uint32_t>(i), HostBuffer(), batch_size));
  Install(std::move(slots), /*start_free=*/false);
  const uint64_t bytes = std::max<uint64_t>(1, batch_size * sample_bytes);
  allocator_ = std::thread([this, bytes, pin_memory] { AllocateSlots(bytes, pin_memory); });
  return Status::Ok();
}

void BatchPool::AllocateSlots(uint64_t bytes, bool pin_memory) {
  TraceRange trace("gpufeed batch pool");
  for (const auto& slot : slots_) {
    {
      MutexLock lock(&mu_);
      if (stop_allocating_) return;
    }
    // Plain memory is not touched here: its pages fault in as the first
    // batches are assembled into them, on the loader's threads and only for
    // the slots an epoch uses. Faulting all of them before the first batch
    // held epoch 1 back where slots are large (DeepCAM, batches of 4 x 60
    // MB: the first epoch at 11-14 samples/s against 28-31 on 2 cores;
    // issue 30).
    HostBuffer images = allocate_(bytes, pin_memory);
    MutexLock lock(&mu_);
    if (images.data() == nullptr) {
      alloc_error_ =
          Status::Internal("loader: cannot allocate a " + std::to_string(bytes) + "-byte batch buffer (slot " +
                           std::to_string(slot->id + 1) + " of " + std::to_string(slots_.size()) +
                           "); lower batch_size, prefetch or pool_bytes (--batch-size, --prefetch, --pool-bytes)");
      cv_.SignalAll();
      return;
    }
    slot->images = std::move(images);
    free_.push_back(slot.get());
    cv_.SignalAll();
  }
}

Status BatchPool::status() {
  MutexLock lock(&mu_);
  return alloc_error_;
}

std::unique_ptr<Batch::Slot> BatchPool::NewSlot(uint32_t id, HostBuffer images, uint64_t batch_size) {
  auto slot = std::make_unique<Batch::Slot>();
  slot->images = std::move(images);
  slot->labels.resize(batch_size);
  slot->indices.resize(batch_size);
  slot->pool = this;
  slot->id = id;
  return slot;
}

void BatchPool::Install(std::vector<std::unique_ptr<Batch::Slot>> slots, bool start_free) {
  MutexLock lock(&mu_);
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
                            HostBuffer::Adopt(region.data() + static_cast<uint64_t>(i) * stride,
                                              std::max<uint64_t>(1, batch_bytes), pin_memory),
                            batch_size));
  }
  Install(std::move(slots), start_free);
  return Status::Ok();
}

Batch::Slot* BatchPool::PopFree() {
  Batch::Slot* s = free_.back();
  free_.pop_back();
  return s;
}

Batch::Slot* BatchPool::Acquire() {
  MutexLock lock(&mu_);
  while (MustWait()) cv_.Wait(&mu_);
  return cancelled_ || !alloc_error_.ok() ? nullptr : PopFree();
}

Batch::Slot* BatchPool::AcquireUnless(const std::atomic<bool>& give_up, bool* gave_up) {
  MutexLock lock(&mu_);
  *gave_up = false;
  while (MustWait()) {
    if (give_up.load()) {
      *gave_up = true;
      return nullptr;
    }
    cv_.Wait(&mu_);
  }
  return cancelled_ || !alloc_error_.ok() ? nullptr : PopFree();
}

void BatchPool::WakeWaiters() {
  // Under the mutex: a waiter between its check of `give_up` and its wait
  // holds it, so this signal cannot fall between the two.
  MutexLock lock(&mu_);
  cv_.SignalAll();
}

Batch::Slot* BatchPool::AcquireFor(std::chrono::milliseconds timeout, bool* timed_out) {
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  *timed_out = false;
  while (MustWait()) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      *timed_out = true;
      return nullptr;
    }
    cv_.WaitFor(&mu_, left);
  }
  return cancelled_ || !alloc_error_.ok() ? nullptr : PopFree();
}

Batch::Slot* BatchPool::TryAcquire() {
  MutexLock lock(&mu_);
  if (cancelled_ || free_.empty() || !alloc_error_.ok()) return nullptr;
  return PopFree();
}

void BatchPool::Release(Batch::Slot* s) {
  {
    MutexLock lock(&mu_);
    if (s->with_consumer) {
      s->with_consumer = false;
      --with_consumer_;
    }
    free_.push_back(s);
  }
  cv_.SignalAll();
}

void BatchPool::MarkDelivered(Batch::Slot* s) {
  MutexLock lock(&mu_);
  if (!s->with_consumer) {
    s->with_consumer = true;
    ++with_consumer_;
  }
}

bool BatchPool::ConsumerHoldsAll() {
  MutexLock lock(&mu_);
  return !hold_hint_.empty() && !slots_.empty() && with_consumer_ >= slots_.size();
}

void BatchPool::SetHoldHint(std::string hint) {
  MutexLock lock(&mu_);
  hold_hint_ = std::move(hint);
}

std::string BatchPool::hold_hint() {
  MutexLock lock(&mu_);
  return hold_hint_;
}

size_t BatchPool::TakeAllFree() {
  MutexLock lock(&mu_);
  const size_t n = free_.size();
  free_.clear();
  return n;
}

void BatchPool::SetCancelled(bool c) {
  {
    MutexLock lock(&mu_);
    cancelled_ = c;
  }
  cv_.SignalAll();
}

Batch::Batch(Batch&& o) noexcept { *this = std::move(o); }
Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    if (slot_ != nullptr) slot_->pool->Release(slot_);
    slot_ = std::exchange(o.slot_, nullptr);
    data_ = std::exchange(o.data_, nullptr);  // a moved-from Batch is empty
    labels_ = std::exchange(o.labels_, {});
    indices_ = std::exchange(o.indices_, {});
    encoded_ = std::exchange(o.encoded_, {});
    buffer_bytes_ = std::exchange(o.buffer_bytes_, 0);
    sample_shape_ = o.sample_shape_;
    fields_ = o.fields_;
    capacity_ = o.capacity_;
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
