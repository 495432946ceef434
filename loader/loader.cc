// Loader and EpochStream: a TBB parallel_pipeline run on a background thread.
//   plan (serial, in order): take a pool slot (back-pressure), Acquire the
//     batch's chunks from the cache (which starts decodes and prefetches)
//   assemble (parallel): per chunk, Ensure it is decoded, copy its samples
//     into the slot (parallel over the batch's chunks)
//   deliver (serial, in order): hand the slot to the consumer's queue
#include "gpufeed/loader.h"

#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "common/trace.h"
#include "gpu/host_buffer.h"
#include "gpufeed/dataset.h"
#include "loader/batch_pool.h"
#include "loader/chunk_cache.h"
#include "loader/stream_impl.h"
#include "loader/sampler.h"

namespace gpufeed {

std::string_view OrderName(Order o) {
  switch (o) {
    case Order::kSequential: return "sequential";
    case Order::kRandom: return "random";
    case Order::kBlock: return "block";
  }
  return "?";
}

Result<Order> OrderFromName(std::string_view name) {
  if (name == "sequential") return Order::kSequential;
  if (name == "random") return Order::kRandom;
  if (name == "block") return Order::kBlock;
  return Status::InvalidArgument("unknown order '" + std::string(name) + "' (expected sequential, random or block)");
}

// ---------------------------------------------------------------------------
// LoaderState

namespace {
constexpr char kStateMagic[8] = {'G', 'P', 'F', 'D', 'L', 'S', 'T', 'A'};
constexpr uint32_t kStateVersion = 1;

void PutU64(std::string& s, uint64_t v) {
  for (int k = 0; k < 8; ++k) s += static_cast<char>((v >> (8 * k)) & 0xff);
}
uint64_t GetU64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= uint64_t(uint8_t(s[at + k])) << (8 * k);
  return v;
}
}  // namespace

std::string LoaderState::Serialize() const {
  std::string s(kStateMagic, 8);
  for (int k = 0; k < 4; ++k) s += static_cast<char>((kStateVersion >> (8 * k)) & 0xff);
  PutU64(s, seed);
  PutU64(s, epoch);
  PutU64(s, next_batch);
  return s;
}

Result<LoaderState> LoaderState::Deserialize(std::string_view bytes) {
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kStateMagic, 8) != 0) {
    return Status::Corrupt("loader state: bad magic (not a gpufeed loader state)");
  }
  uint32_t version = 0;
  for (int k = 0; k < 4; ++k) version |= uint32_t(uint8_t(bytes[8 + k])) << (8 * k);
  if (version != kStateVersion) {
    return Status::Unsupported("loader state: version " + std::to_string(version) + ", this build reads " +
                               std::to_string(kStateVersion));
  }
  if (bytes.size() != 12 + 24) return Status::Corrupt("loader state: wrong length " + std::to_string(bytes.size()));
  LoaderState s;
  s.seed = GetU64(bytes, 12);
  s.epoch = GetU64(bytes, 20);
  s.next_batch = GetU64(bytes, 28);
  return s;
}

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
    free_.push_back(s);
  }
  cv_.notify_all();
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

// ---------------------------------------------------------------------------
// Loader::Impl

struct LocalStream;

struct Loader::Impl {
  const ChunkSource& source;
  LoaderOptions options;
  BatchSourceInfo info;
  int threads = 1;
  BatchPool own_pool;
  BatchPool* pool = &own_pool;  // or the daemon's (LoaderInternal::UsePool)
  std::unique_ptr<loader::ChunkCache> cache;
  LoaderState state;
  LocalStream* active = nullptr;  // the live stream, stopped by the next Epoch()

  Impl(const ChunkSource& s, const LoaderOptions& o) : source(s), options(o) {
    threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    state.seed = o.seed;
    cache = std::make_unique<loader::ChunkCache>(source, o.cache_bytes, static_cast<size_t>(threads + 4));
    info.name = s.name();
    info.dtype = s.dtype();
    info.sample_shape = s.sample_shape();
    info.sample_bytes = s.sample_bytes();
    info.num_samples = s.num_samples();
    info.batch_size = o.batch_size;
    info.has_labels = !s.labels().empty();
    if (const auto* ds = dynamic_cast<const Dataset*>(&s); ds != nullptr) {
      info.mean = ds->info().mean;
      info.stddev = ds->info().stddev;
    }
  }
  uint64_t batch_bytes() const { return options.batch_size * source.sample_bytes(); }

  Status EnsurePool() {
    if (pool != &own_pool) return Status::Ok();  // sized by whoever lent it
    return own_pool.Allocate(std::max(1, options.prefetch) + 1, options.batch_size, source.sample_bytes(),
                         options.pin_memory);
  }
};

// ---------------------------------------------------------------------------
// LocalStream: the pipeline's EpochStream::Impl

struct LocalStream final : EpochStream::Impl {
  Loader::Impl* loader = nullptr;
  uint64_t epoch = 0;
  uint64_t start_batch = 0;
  loader::EpochPlan plan;

  // Ready queue: slots delivered in order, or the error that ended the run.
  struct Item {
    uint64_t batch = 0;
    uint64_t count = 0;
    Batch::Slot* slot = nullptr;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> ready;     // GUARDED_BY(mu)
  bool producer_done = false; // GUARDED_BY(mu)
  Status error;               // GUARDED_BY(mu); first failure
  bool error_returned = false;

  std::atomic<bool> cancel{false};
  std::atomic<bool> failed{false};
  std::thread producer;
  bool stopped = false;

  // Stats (the consumer-side ones are touched only by the consumer).
  std::atomic<uint64_t> plan_ns{0}, assemble_ns{0};
  double consumer_wait_seconds = 0;
  uint64_t delivered_batches = 0, delivered_samples = 0, delivered_bytes = 0, queue_depth_sum = 0;
  std::chrono::steady_clock::time_point start_time;

  void Fail(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (error.ok()) error = std::move(s);
    }
    failed = true;
  }

  void Run();
  void Stop() override;
  Result<std::optional<Batch>> Next() override;
  uint64_t num_batches() const override { return plan.num_batches; }
  LoaderStats stats() const override;
  static EpochStream Start(std::unique_ptr<LocalStream> s) { return Wrap(std::move(s)); }
};

void LocalStream::Run() {
  Loader::Impl& L = *loader;
  const ChunkSource& src = L.source;
  const uint64_t sb = src.sample_bytes();
  const uint64_t k = src.chunk_samples();
  const std::vector<int64_t>& labels = src.labels();
  uint64_t next = start_batch;
  tbb::task_arena arena(L.threads);
  struct Work {
    uint64_t batch = 0;
    Batch::Slot* slot = nullptr;
    std::vector<std::shared_ptr<loader::ChunkEntry>> chunks;
    Status status;
  };
  try {
    arena.execute([&] {
      tbb::task_group prefetch_tasks;
      try {
        tbb::parallel_pipeline(
            static_cast<size_t>(std::max(1, L.options.prefetch)),
            tbb::make_filter<void, std::shared_ptr<Work>>(
                tbb::filter_mode::serial_in_order,
                [&](tbb::flow_control& fc) -> std::shared_ptr<Work> {
                  if (next >= plan.num_batches || cancel.load() || failed.load()) {
                    fc.stop();
                    return nullptr;
                  }
                  Batch::Slot* slot = L.pool->Acquire();  // back-pressure: waits for the consumer
                  if (slot == nullptr) {
                    fc.stop();
                    return nullptr;
                  }
                  TraceRange trace("gpufeed plan batch");
                  const auto t0 = std::chrono::steady_clock::now();
                  auto w = std::make_shared<Work>();
                  w->batch = next++;
                  w->slot = slot;
                  // Enough decodes queued to keep every thread busy across
                  // a window boundary, never more than the budget admits.
                  w->chunks = L.cache->Acquire(w->batch, 2 * static_cast<uint64_t>(L.threads), prefetch_tasks);
                  plan_ns += static_cast<uint64_t>((std::chrono::steady_clock::now() - t0).count());
                  return w;
                }) &
                tbb::make_filter<std::shared_ptr<Work>, std::shared_ptr<Work>>(
                    tbb::filter_mode::parallel,
                    [&](std::shared_ptr<Work> w) -> std::shared_ptr<Work> {
                      TraceRange trace("gpufeed assemble batch");
                      const auto t0 = std::chrono::steady_clock::now();
                      const uint64_t first = plan.batch_first(w->batch);
                      const uint64_t count = plan.batch_count(w->batch);
                      Batch::Slot& slot = *w->slot;
                      // Positions of the batch grouped by chunk, in the
                      // order of plan.batch_chunks (== w->chunks).
                      std::vector<std::vector<uint32_t>> by_chunk(w->chunks.size());
                      {
                        const auto& bc = plan.batch_chunks[w->batch];
                        for (uint64_t i = 0; i < count; ++i) {
                          const uint64_t s = plan.samples[first + i];
                          const uint32_t c = static_cast<uint32_t>(s / k);
                          // bc is short (distinct chunks of one batch); find c.
                          size_t j = std::find(bc.begin(), bc.end(), c) - bc.begin();
                          by_chunk[j].push_back(static_cast<uint32_t>(i));
                          slot.indices[i] = s;
                          slot.labels[i] = labels.empty() ? -1 : labels[s];
                        }
                      }
                      std::mutex status_mu;
                      // Isolated: a thread waiting for this parallel_for must
                      // not steal the plan stage, which can block on the pool
                      // (back-pressure) and so deadlock beneath this batch.
                      tbb::this_task_arena::isolate([&] {
                      tbb::parallel_for(size_t{0}, w->chunks.size(), [&](size_t j) {
                        loader::ChunkEntry& e = *w->chunks[j];
                        Status st = L.cache->Ensure(e);
                        if (!st.ok()) {
                          std::lock_guard<std::mutex> lock(status_mu);
                          if (w->status.ok()) w->status = st;
                          return;
                        }
                        const uint64_t base = uint64_t(e.chunk) * k;
                        for (uint32_t i : by_chunk[j]) {
                          std::memcpy(slot.images.data() + i * sb, e.data.get() + (slot.indices[i] - base) * sb, sb);
                        }
                        w->chunks[j].reset();  // a transient chunk is freed here
                      });
                      });
                      w->chunks.clear();
                      assemble_ns += static_cast<uint64_t>((std::chrono::steady_clock::now() - t0).count());
                      return w;
                    }) &
                tbb::make_filter<std::shared_ptr<Work>, void>(
                    tbb::filter_mode::serial_in_order, [&](std::shared_ptr<Work> w) {
                      if (!w->status.ok() || failed.load()) {
                        if (!w->status.ok()) Fail(w->status.WithContext("batch " + std::to_string(w->batch)));
                        L.pool->Release(w->slot);
                        return;
                      }
                      {
                        std::lock_guard<std::mutex> lock(mu);
                        ready.push_back({w->batch, plan.batch_count(w->batch), w->slot});
                      }
                      cv.notify_all();
                    }));
      } catch (...) {
        prefetch_tasks.wait();
        throw;
      }
      prefetch_tasks.wait();  // no task outlives the stream
    });
  } catch (const std::exception& e) {
    Fail(Status::Internal(src.name() + ": loader pipeline: " + e.what()));
  } catch (...) {
    Fail(Status::Internal(src.name() + ": loader pipeline: unknown exception"));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    producer_done = true;
  }
  cv.notify_all();
}

void LocalStream::Stop() {
  if (stopped) return;
  stopped = true;
  cancel = true;
  loader->pool->SetCancelled(true);
  if (producer.joinable()) producer.join();
  // Slots delivered but never taken go back to the pool.
  std::lock_guard<std::mutex> lock(mu);
  for (const Item& it : ready) loader->pool->Release(it.slot);
  ready.clear();
  loader->pool->SetCancelled(false);
  if (loader->active == this) loader->active = nullptr;
}

// ---------------------------------------------------------------------------
// EpochStream

EpochStream::EpochStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EpochStream::EpochStream(EpochStream&&) noexcept = default;
EpochStream& EpochStream::operator=(EpochStream&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->Stop();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
EpochStream::~EpochStream() {
  if (impl_) impl_->Stop();
}

uint64_t EpochStream::num_batches() const { return impl_->num_batches(); }
Result<std::optional<Batch>> EpochStream::Next() { return impl_->Next(); }
LoaderStats EpochStream::stats() const { return impl_->stats(); }

Batch EpochStream::MakeBatch(Batch::Slot* slot, uint64_t epoch, uint64_t index, uint64_t count,
                             uint64_t sample_bytes, bool has_labels, const std::vector<uint64_t>* sample_shape) {
  Batch b;
  b.slot_ = slot;
  b.data_ = slot->images.data();
  b.labels_ = std::span<const int64_t>(slot->labels.data(), has_labels ? count : 0);
  b.indices_ = std::span<const uint64_t>(slot->indices.data(), count);
  b.sample_shape_ = sample_shape;
  b.epoch_ = epoch;
  b.index_ = index;
  b.sample_bytes_ = sample_bytes;
  b.pinned_ = slot->images.pinned();
  return b;
}

Result<std::optional<Batch>> LocalStream::Next() {
  LocalStream& s = *this;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(s.mu);
  s.queue_depth_sum += s.ready.size();
  s.cv.wait(lock, [&] { return !s.ready.empty() || s.producer_done; });
  s.consumer_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (s.ready.empty()) {
    if (!s.error.ok() && !s.error_returned) {
      s.error_returned = true;
      return s.error;
    }
    return std::optional<Batch>();
  }
  Item it = s.ready.front();
  s.ready.pop_front();
  lock.unlock();
  Batch b = MakeBatch(it.slot, s.epoch, it.batch, it.count, s.loader->source.sample_bytes(),
                      !s.loader->source.labels().empty(), &s.loader->source.sample_shape());
  ++s.delivered_batches;
  s.delivered_samples += it.count;
  s.delivered_bytes += it.count * b.sample_bytes();
  s.loader->state.epoch = s.epoch;
  s.loader->state.next_batch = it.batch + 1;
  return std::optional<Batch>(std::move(b));
}

LoaderStats LocalStream::stats() const {
  const LocalStream& s = *this;
  LoaderStats st;
  st.batches = s.delivered_batches;
  st.samples = s.delivered_samples;
  st.bytes_delivered = s.delivered_bytes;
  auto& c = s.loader->cache->counters();
  st.chunk_reads = c.reads;
  st.bytes_read = c.bytes_read;
  st.bytes_decoded = c.bytes_decoded;
  st.chunk_hits = c.hits;
  st.chunk_misses = c.misses;
  st.prefetched = c.prefetched;
  st.chunk_shared_hits = c.shared_hits;
  st.fetch_seconds = c.fetch_ns * 1e-9;
  st.plan_seconds = s.plan_ns * 1e-9;
  st.assemble_seconds = s.assemble_ns * 1e-9;
  st.consumer_wait_seconds = s.consumer_wait_seconds;
  st.queue_depth_sum = s.queue_depth_sum;
  st.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start_time).count();
  return st;
}

EpochStream::Iterator EpochStream::begin() {
  Iterator it;
  it.stream_ = this;
  ++it;
  return it;
}

EpochStream::Iterator& EpochStream::Iterator::operator++() {
  batch_ = Batch();  // the previous batch's slot goes back to the pool first
  auto r = stream_->Next();
  if (!r.ok()) {
    stream_ = nullptr;
    throw LoaderError(r.status());
  }
  if (!r->has_value()) {
    stream_ = nullptr;
  } else {
    batch_ = std::move(**r);
  }
  return *this;
}

// ---------------------------------------------------------------------------
// Loader

Loader::Loader(const ChunkSource& source, const LoaderOptions& options)
    : impl_(std::make_unique<Impl>(source, options)) {}

Loader::~Loader() {
  if (impl_->active != nullptr) impl_->active->Stop();
}

const LoaderOptions& Loader::options() const { return impl_->options; }
const ChunkSource& Loader::source() const { return impl_->source; }
const BatchSourceInfo& Loader::info() const { return impl_->info; }
uint64_t Loader::batch_bytes() const { return impl_->batch_bytes(); }
LoaderState Loader::state() const { return impl_->state; }

uint64_t Loader::num_batches() const {
  auto plan = loader::MakeEpochPlan(impl_->source.num_samples(), impl_->source.chunk_samples(),
                                    impl_->source.num_chunks(), impl_->options, 0);
  return plan.ok() ? plan->num_batches : 0;
}

void LoaderInternal::UsePool(Loader& loader, BatchPool* pool) {
  loader.impl_->pool = pool != nullptr ? pool : &loader.impl_->own_pool;
}

void LoaderInternal::SetThreads(Loader& loader, int threads) { loader.impl_->threads = std::max(1, threads); }

void LoaderInternal::ShareChunks(Loader& loader, std::shared_ptr<loader::SharedChunks> shared) {
  loader.impl_->cache->SetShared(std::move(shared));
}

EpochStream Loader::Epoch(uint64_t epoch, uint64_t start_batch) {
  if (impl_->active != nullptr) impl_->active->Stop();
  auto s = std::make_unique<LocalStream>();
  s->loader = impl_.get();
  s->epoch = epoch;
  s->start_batch = start_batch;
  s->start_time = std::chrono::steady_clock::now();
  impl_->state.epoch = epoch;
  impl_->state.next_batch = start_batch;
  auto fail_now = [&](Status st) {
    s->error = std::move(st);
    s->producer_done = true;
    s->stopped = true;
    return LocalStream::Start(std::move(s));
  };
  auto plan = loader::MakeEpochPlan(impl_->source.num_samples(), impl_->source.chunk_samples(),
                                    impl_->source.num_chunks(), impl_->options, epoch);
  if (!plan.ok()) return fail_now(plan.status().WithContext(impl_->source.name()));
  s->plan = std::move(*plan);
  if (start_batch > s->plan.num_batches) {
    return fail_now(Status::InvalidArgument(impl_->source.name() + ": resume at batch " + std::to_string(start_batch) +
                                            " past the epoch's " + std::to_string(s->plan.num_batches)));
  }
  if (Status st = impl_->EnsurePool(); !st.ok()) return fail_now(st);
  impl_->cache->BeginEpoch(&s->plan, start_batch);
  impl_->active = s.get();
  LocalStream* raw = s.get();
  raw->producer = std::thread([raw] { raw->Run(); });
  return LocalStream::Start(std::move(s));
}

}  // namespace gpufeed
