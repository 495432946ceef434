// Loader and EpochStream: a TBB parallel_pipeline run on a background thread,
// three named stages of LocalStream:
//   PlanBatch (serial, in order): take a pool slot (back-pressure), Acquire
//     the batch's chunks from the cache (which starts reads and prefetches)
//   AssembleBatch (parallel): per chunk, Ensure it is read, copy its samples
//     into the slot (parallel over the batch's chunks); a source of encoded
//     samples goes through the decode stage instead (decode_stage.h)
//   DeliverBatch (serial, in order): hand the slot to the consumer's queue
//
// The plan stage's wait for a slot blocks a TBB thread inside a task, and the
// batches in flight may be tasks in that very thread's deque: no other thread
// is promised to take them. The arena's master and the process's few workers
// (one on 2 cores, shared by every Loader's arena) may all be blocked so,
// each in its own stream's plan stage. A consumer that holds two of a
// stream's batches and asks for the next (zip over several loaders, the
// previous round still held) then waited for a batch that no thread would
// run, while the thread that held it waited for the consumer: several Loaders
// of 2 threads iterated together hung. So the plan stage gives up its wait
// when the consumer asks for a batch that is not ready (StreamCore::starved),
// the pipeline stops and runs its batches in flight to the end, and the slot
// is waited for outside the pipeline (LocalStream::Run), which then starts
// again. One thread alone then finishes every batch the consumer waits for.
#include "gpufeed/loader.h"

#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "common/cancel.h"
#include "common/cores.h"
#include "common/first_error.h"
#include "common/trace.h"
#include "common/host_buffer.h"
#include "gpufeed/dataset.h"
#include "gpufeed/encoded.h"
#include "gpufeed/sample_decoder.h"
#include "loader/batch_pool.h"
#include "loader/chunk_cache.h"
#include "loader/decode_stage.h"
#include "loader/stream_core.h"
#include "loader/stream_impl.h"
#include "loader/sampler.h"

namespace gpufeed {
namespace {

// The process's page faults so far (getrusage); 0 where it fails.
void ProcessFaults(uint64_t* minor, uint64_t* major) {
  rusage u{};
  const bool ok = ::getrusage(RUSAGE_SELF, &u) == 0;
  *minor = ok ? static_cast<uint64_t>(u.ru_minflt) : 0;
  *major = ok ? static_cast<uint64_t>(u.ru_majflt) : 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// Loader::Impl

struct LocalStream;

// The read unit of an encoded source under `o`: null to read the source's
// own runs (about 4 MiB of consecutive samples), or a view whose read unit
// is one sample. A uniform shuffle (Order::kRandom) meets a run's samples at
// random points of the epoch: unless the cache holds every run, each of
// them costs the whole run (40 samples read to decode one). One sample's
// bytes a read makes an encoded sample cost its own bytes in any order, and
// the cache keeps the samples, not runs, across epochs. Not with
// skip_corrupt: a corrupt sample's replacement comes from its own read unit.
// GPUFEED_SAMPLE_READS=0 keeps the runs (for A/B measurements).
namespace {
std::unique_ptr<ChunkSource> SampleReadUnits(const ChunkSource& s, const LoaderOptions& o) {
  if (o.order != Order::kRandom || !s.decodes_samples() || s.chunk_samples() <= 1) return nullptr;
  if (const char* ab = std::getenv("GPUFEED_SAMPLE_READS"); ab != nullptr && std::string_view(ab) == "0") {
    return nullptr;
  }
  const auto* encoded = dynamic_cast<const EncodedImageSource*>(&s);
  const auto decoder = s.sample_decoder();
  if (encoded == nullptr || decoder == nullptr || decoder->replaces_corrupt()) return nullptr;
  return encoded->WithReadUnit(1);
}
}  // namespace

struct Loader::Impl {
  std::unique_ptr<ChunkSource> sample_units;  // SampleReadUnits: before `source`, which may name it
  const ChunkSource& source;
  LoaderOptions options;
  BatchSourceInfo info;
  int threads = 1;
  BatchPool own_pool;
  BatchPool* pool = &own_pool;  // or the daemon's (LoaderInternal::UsePool)
  std::unique_ptr<loader::ChunkCache> cache;
  // Sources of encoded samples: their decoder composed with the source.
  std::optional<loader::DecodeStage> decode_stage;
  // The position: written by whichever thread takes the stream's batches
  // (the feed's fill worker, when batches come encoded), read by state().
  mutable Mutex state_mu;
  LoaderState state GUARDED_BY(state_mu);
  LocalStream* active = nullptr;  // the live stream, stopped by the next Epoch()
  // The plan of the epoch after the live stream's (plans are pure functions
  // of the options and the epoch): the cache's future spans the boundary,
  // and the next Epoch() takes it rather than computing it again.
  std::optional<loader::EpochPlan> next_plan;
  uint64_t next_plan_epoch = 0;

  // LoaderOptions::balance_decode: the rate the feed's device decoder
  // reports, and this loader's decode time per sample, measured.
  std::atomic<double> device_decode_rate{0};
  std::atomic<uint64_t> host_decode_ns{0}, host_decodes{0};
  // Until this many host decodes are measured, a probe share measures them.
  static constexpr uint64_t kShareProbeSamples = 64;
  static constexpr double kProbeShare = 1.0 / 16;
  // Of a thread's time, what decoding may take: the threads also read,
  // parse headers and copy the encoded samples.
  static constexpr double kHostDecodeBusy = 0.8;
  double HostDecodeShare() const {
    const double device = device_decode_rate.load(std::memory_order_relaxed);
    if (!options.balance_decode || device <= 0) return 0;
    const uint64_t n = host_decodes.load(std::memory_order_relaxed);
    if (n < kShareProbeSamples) return kProbeShare;
    const double per_sample = double(host_decode_ns.load(std::memory_order_relaxed)) * 1e-9 / double(n);
    const double host = kHostDecodeBusy * threads / std::max(per_sample, 1e-9);
    return host / (host + device);
  }

  Impl(const ChunkSource& given, const LoaderOptions& o)
      : sample_units(SampleReadUnits(given, o)), source(sample_units ? *sample_units : given), options(o) {
    const ChunkSource& s = source;
    // A batch larger than the rank's share only costs memory (its pool is
    // prefetch + 1 such batches): clamp it.
    const uint64_t world = static_cast<uint64_t>(std::max(1, o.world_size));
    const uint64_t share = (s.num_samples() + world - 1) / world;
    if (!o.drop_last && share > 0 && o.batch_size > share) {
      info.warnings.push_back("batch size " + std::to_string(o.batch_size) + " is larger than the " +
                              std::to_string(share) + " samples of " +
                              (world > 1 ? "this rank's share" : std::string("the dataset")) + ": using " +
                              std::to_string(share));
      options.batch_size = share;
    }
    threads = o.threads > 0 ? o.threads : DefaultLoaderThreads();
    if (const int cores = AvailableCores(); threads > cores) {
      // TBB would run no more workers than the cores anyway, and say so on
      // stderr ("TBB Warning: The number of workers is currently limited").
      info.warnings.push_back("threads " + std::to_string(threads) + " is more than the " + std::to_string(cores) +
                              " cores this process may use: using " + std::to_string(cores));
      threads = cores;
    }
    state.seed = o.seed;
    if (s.decodes_samples()) decode_stage.emplace(s, s.sample_decoder(), o.logger);
    cache = std::make_unique<loader::ChunkCache>(source, o.cache_bytes, static_cast<size_t>(2 * threads + 4),
                                                 loader::WorkingSetCap(o.shuffle_window, s.max_chunk_buffer_bytes()));
    info.name = s.name();
    info.dtype = s.dtype();
    info.sample_shape = s.sample_shape();
    info.sample_bytes = s.sample_bytes();
    info.num_samples = s.num_samples();
    info.batch_size = options.batch_size;
    info.has_labels = !s.labels().empty();
    info.pool_slots = static_cast<uint64_t>(PoolSlots());
    const SourceAttributes attrs = s.attributes();
    info.mean = attrs.mean;
    info.stddev = attrs.stddev;
    info.fields = s.fields();
    info.encoded_batches = defers();
  }
  uint64_t batch_bytes() const { return options.batch_size * source.sample_bytes(); }

  // prefetch + 1, fewer where that many batches would pass pool_bytes
  // (LoaderOptions::pool_bytes), never fewer than 3.
  int PoolSlots() const {
    const int want = std::max(1, options.prefetch) + 1;
    const uint64_t bytes = std::max<uint64_t>(1, options.batch_size * slot_sample_bytes());
    if (options.pool_bytes == 0 || uint64_t(want) * bytes <= options.pool_bytes) return want;
    return std::min(want, static_cast<int>(std::max<uint64_t>(3, options.pool_bytes / bytes)));
  }
  Status EnsurePool() {
    if (pool != &own_pool) return Status::Ok();           // sized by whoever lent it
    const int slots = static_cast<int>(info.pool_slots);  // PoolSlots(), made at construction
    own_pool.SetHoldHint(slots == std::max(1, options.prefetch) + 1
                             ? "raise prefetch (LoaderOptions::prefetch, --prefetch; the pool has prefetch + 1 = " +
                                   std::to_string(slots) + " buffers)"
                             : "raise pool_bytes (LoaderOptions::pool_bytes, --pool-bytes; the pool has " +
                                   std::to_string(slots) + " buffers, as many batches as fit in " +
                                   std::to_string(options.pool_bytes) + " bytes)");
    return own_pool.Allocate(slots, options.batch_size, slot_sample_bytes(), options.pin_memory);
  }
  bool defers() const { return options.defer_decode && source.decodes_samples(); }
  // Bytes of a pool slot per sample (SlotSampleBytes, loader/batch_pool.h).
  uint64_t slot_sample_bytes() const { return SlotSampleBytes(source, defers()); }
};

// ---------------------------------------------------------------------------
// LocalStream: the pipeline's EpochStream::Impl

struct LocalStream final : EpochStream::Impl {
  explicit LocalStream(Loader::Impl* l) : loader(l), core(l->pool) {}

  Loader::Impl* loader;
  uint64_t epoch = 0;
  uint64_t start_batch = 0;
  loader::EpochPlan plan;
  loader::StreamCore core;  // the ready queue, the first error, Next()'s wait

  // Set by Stop(). Every task of the stream runs under it (ScopedCancel,
  // common/cancel.h): the reads in flight for batches no one will take end
  // at once, a remote object's without their retries, and none starts.
  const std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
  std::thread producer;
  bool stopped = false;
  // Run() read the epoch to its end without a failure: nothing of the
  // stream runs any more, and Stop() leaves its read-aheads (the next
  // epoch's first chunks, hinted near the end) uncancelled.
  std::atomic<bool> ran_to_end{false};

  // Stats: the delivered ones are written by the thread that takes the
  // batches (the feed's fill worker, when batches come encoded) and read by
  // stats() on any thread.
  std::atomic<uint64_t> plan_ns{0}, assemble_ns{0};
  std::atomic<uint64_t> delivered_batches{0}, delivered_samples{0}, delivered_bytes{0};
  std::chrono::steady_clock::time_point start_time;
  uint64_t minor_faults0 = 0, major_faults0 = 0;  // the process's at the start

  // The pipeline's unit: a batch in flight.
  struct Work {
    uint64_t batch = 0;
    Batch::Slot* slot = nullptr;
    std::vector<std::shared_ptr<loader::ChunkEntry>> chunks;  // in the order of plan.batch_chunks
    Status status;
  };
  void Run();
  // One run of the pipeline from batch `next` (advanced past each batch
  // planned), its first slot `first` if not null; true when it stopped
  // because the consumer asked for a batch while no slot was free (the
  // file's comment), false at the epoch's end, a cancel or a failure.
  bool RunPipeline(uint64_t& next, Batch::Slot* first, tbb::task_group& prefetch_tasks);
  // The stages (the file's comment). PlanBatch takes `slot` (null: it waits
  // for one) and returns null when the epoch is over, cancelled or failed,
  // or (*starved set) when it gave up waiting for a slot.
  std::shared_ptr<Work> PlanBatch(uint64_t batch, Batch::Slot* slot, bool* starved, tbb::task_group& prefetch_tasks);
  void AssembleBatch(Work& w);
  void DeliverBatch(Work& w);
  // AssembleBatch's decode step: the batch's samples through the decode stage.
  Status DecodeBatch(const Work& w, const std::vector<std::vector<uint32_t>>& by_chunk);
  std::atomic<uint64_t> deferred_samples{0}, host_decoded_samples{0}, balanced_samples{0}, skipped_samples{0};
  std::atomic<double> host_decode_share{0};
  std::atomic<const char*> host_decode_reason{""};
  void Stop() override;
  Result<std::optional<Batch>> Next() override;
  WaitResult WaitReady(std::chrono::steady_clock::time_point deadline) override { return core.WaitReady(deadline); }
  void Interrupt() override { core.Interrupt(); }
  uint64_t num_batches() const override { return plan.num_batches; }
  LoaderStats stats() const override;
  static EpochStream Start(std::unique_ptr<LocalStream> s) { return Wrap(std::move(s)); }
};

void LocalStream::Run() {
  Loader::Impl& L = *loader;
  uint64_t next = start_batch;
  tbb::task_arena arena(L.threads);
  try {
    arena.execute([&] {
      tbb::task_group prefetch_tasks;
      try {
        Batch::Slot* first = nullptr;
        while (RunPipeline(next, first, prefetch_tasks)) {
          // No batch of the stream is in flight now: the slot is waited for
          // here, outside any task, and no task waits behind this thread.
          first = L.pool->Acquire();
          if (first == nullptr) {
            if (Status why = L.pool->status(); !why.ok()) core.Fail(why);  // a buffer it could not allocate
            break;
          }
        }
      } catch (...) {
        prefetch_tasks.wait();
        throw;
      }
      prefetch_tasks.wait();  // no task outlives the stream
    });
  } catch (const std::exception& e) {
    core.Fail(Status::Internal(L.source.name() + ": loader pipeline: " + e.what()));
  } catch (...) {
    core.Fail(Status::Internal(L.source.name() + ": loader pipeline: unknown exception"));
  }
  ran_to_end.store(next >= plan.num_batches && !cancel->load() && !core.failed(), std::memory_order_release);
  core.Finish();
}

bool LocalStream::RunPipeline(uint64_t& next, Batch::Slot* first, tbb::task_group& prefetch_tasks) {
  bool starved = false;
  auto plan_stage = [&](tbb::flow_control& fc) -> std::shared_ptr<Work> {
    ScopedCancel scope(cancel);
    auto w = PlanBatch(next, std::exchange(first, nullptr), &starved, prefetch_tasks);
    if (w == nullptr) {
      fc.stop();
    } else {
      ++next;
    }
    return w;
  };
  auto assemble_stage = [&](std::shared_ptr<Work> w) {
    ScopedCancel scope(cancel);
    AssembleBatch(*w);
    return w;
  };
  auto deliver_stage = [&](std::shared_ptr<Work> w) { DeliverBatch(*w); };
  tbb::parallel_pipeline(
      static_cast<size_t>(std::max(1, loader->options.prefetch)),
      tbb::make_filter<void, std::shared_ptr<Work>>(tbb::filter_mode::serial_in_order, plan_stage) &
          tbb::make_filter<std::shared_ptr<Work>, std::shared_ptr<Work>>(tbb::filter_mode::parallel, assemble_stage) &
          tbb::make_filter<std::shared_ptr<Work>, void>(tbb::filter_mode::serial_in_order, deliver_stage));
  return starved;
}

std::shared_ptr<LocalStream::Work> LocalStream::PlanBatch(uint64_t batch, Batch::Slot* slot, bool* starved,
                                                          tbb::task_group& prefetch_tasks) {
  Loader::Impl& L = *loader;
  if (batch >= plan.num_batches || cancel->load() || core.failed()) {
    if (slot != nullptr) L.pool->Release(slot);
    return nullptr;
  }
  if (slot == nullptr) {
    // Back-pressure: waits for the consumer, unless the consumer waits for
    // a batch (then this thread may hold it: the file's comment).
    bool gave_up = false;
    slot = L.pool->AcquireUnless(core.starved(), &gave_up);
    if (gave_up) {
      *starved = true;
      return nullptr;
    }
  }
  if (slot == nullptr) {
    if (Status why = L.pool->status(); !why.ok()) core.Fail(why);  // a buffer it could not allocate
    return nullptr;
  }
  TraceRange trace("gpufeed plan batch");
  const auto t0 = std::chrono::steady_clock::now();
  auto w = std::make_shared<Work>();
  w->batch = batch;
  w->slot = slot;
  // Enough reads queued to keep every thread busy across a window
  // boundary, never more than the budget admits.
  w->chunks = L.cache->Acquire(w->batch, 2 * static_cast<uint64_t>(L.threads), prefetch_tasks);
  plan_ns += static_cast<uint64_t>((std::chrono::steady_clock::now() - t0).count());
  return w;
}

void LocalStream::AssembleBatch(Work& w) {
  Loader::Impl& L = *loader;
  const ChunkSource& src = L.source;
  const uint64_t sb = src.sample_bytes();
  const uint64_t k = src.chunk_samples();
  const std::vector<int64_t>& labels = src.labels();
  const std::vector<FieldInfo>& fields = L.info.fields;
  const bool decodes = L.decode_stage.has_value();
  TraceRange trace("gpufeed assemble batch");
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t first = plan.batch_first(w.batch);
  const uint64_t count = plan.batch_count(w.batch);
  Batch::Slot& slot = *w.slot;
  const uint64_t capacity = slot.images.bytes() / sb;
  // Positions of the batch grouped by chunk, in the order of
  // plan.batch_chunks (== w.chunks).
  std::vector<std::vector<uint32_t>> by_chunk(w.chunks.size());
  {
    const auto& bc = plan.batch_chunks[w.batch];
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
  FirstError chunk_error;  // the first chunk that failed, by time
  // Isolated: a thread waiting for this parallel_for must not steal the plan
  // stage, which can block on the pool (back-pressure) and so deadlock
  // beneath this batch.
  tbb::this_task_arena::isolate([&] {
    tbb::parallel_for(size_t{0}, w.chunks.size(), [&](size_t j) {
      ScopedCancel scope(cancel);        // this body may run on another thread
      if (chunk_error.failed()) return;  // the batch fails: its other chunks are not waited for
      loader::ChunkEntry& e = *w.chunks[j];
      Status st = L.cache->Ensure(e);
      if (!st.ok()) {
        chunk_error.Set(std::move(st));
        return;
      }
      if (decodes) return;  // decoded per sample below, once every chunk is here
      const uint64_t base = uint64_t(e.chunk) * k;
      if (fields.size() == 1) {
        for (uint32_t i : by_chunk[j]) {
          std::memcpy(slot.images.data() + i * sb, e.data.get() + (slot.indices[i] - base) * sb, sb);
        }
      } else {
        // Planar: field f of the chunk at k x offset, of the batch at
        // capacity x offset.
        for (const FieldInfo& f : fields) {
          const uint64_t fb = f.sample_bytes;
          std::byte* out = slot.images.data() + capacity * f.offset;
          const std::byte* in = e.data.get() + k * f.offset;
          for (uint32_t i : by_chunk[j]) std::memcpy(out + i * fb, in + (slot.indices[i] - base) * fb, fb);
        }
      }
      w.chunks[j].reset();  // a transient chunk is freed here
    });
    if (w.status.ok()) w.status = chunk_error.Get();
    if (decodes && w.status.ok()) w.status = DecodeBatch(w, by_chunk);
  });
  w.chunks.clear();
  assemble_ns += static_cast<uint64_t>((std::chrono::steady_clock::now() - t0).count());
}

Status LocalStream::DecodeBatch(const Work& w, const std::vector<std::vector<uint32_t>>& by_chunk) {
  Loader::Impl& L = *loader;
  const uint64_t count = plan.batch_count(w.batch);
  std::vector<loader::DecodeStage::Where> where(count);
  for (size_t j = 0; j < by_chunk.size(); ++j) {
    const loader::ChunkEntry& e = *w.chunks[j];
    const loader::DecodeStage::Where at{std::span<const std::byte>(e.data.get(), L.source.chunk_buffer_bytes(e.chunk)),
                                        e.chunk};
    for (uint32_t i : by_chunk[j]) where[i] = at;
  }
  loader::DecodeStage::BatchOptions o;
  o.defer = L.defers();
  if (o.defer) {
    // LoaderOptions::balance_decode: this share of what the device takes
    // is decoded here, measured by this loader's decode time a sample.
    o.host_share = L.HostDecodeShare();
    host_decode_share.store(o.host_share, std::memory_order_relaxed);
    if (L.options.balance_decode) {
      o.decode_ns = &L.host_decode_ns;
      o.decodes = &L.host_decodes;
    }
  }
  loader::DecodeStage::BatchCounts counts;
  Status st = L.decode_stage->DecodeBatch(where, count, DecodeContext{L.options.seed, epoch}, o, *w.slot, &counts);
  deferred_samples += counts.deferred;
  host_decoded_samples += o.defer ? count - counts.deferred : 0;
  balanced_samples += counts.balanced;
  skipped_samples += counts.skipped;
  if (counts.host_reason != nullptr) host_decode_reason.store(counts.host_reason);
  return st;
}

void LocalStream::DeliverBatch(Work& w) {
  if (cancel->load()) {  // stopping: its reads may have been cut short, and no one takes it
    loader->pool->Release(w.slot);
    return;
  }
  if (!w.status.ok() || core.failed()) {
    if (!w.status.ok()) {
      core.Fail(w.status.WithContext("batch " + std::to_string(w.batch)));
      // No later batch is delivered: the reads of those in flight stop
      // (a dead server's retries would hold Stop() up), as at Stop().
      cancel->store(true, std::memory_order_release);
    }
    loader->pool->Release(w.slot);
    return;
  }
  core.Push({w.slot, w.batch, plan.batch_count(w.batch)});
}

void LocalStream::Stop() {
  if (stopped) return;
  stopped = true;
  // Only a stream stopped before its end cancels its reads: one that ran to
  // its end has none of its own left, and its read-aheads are the next
  // epoch's (a remote object's would be cut off and asked for again).
  if (!ran_to_end.load(std::memory_order_acquire)) cancel->store(true, std::memory_order_release);
  loader->pool->SetCancelled(true);
  if (producer.joinable()) producer.join();
  core.ReleaseUndelivered();
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

namespace {
std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  // A timeout past what the clock holds waits without a deadline.
  if (timeout >=
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::time_point::max() - now)) {
    return std::chrono::steady_clock::time_point::max();
  }
  return now + std::max(timeout, std::chrono::milliseconds(0));
}
}  // namespace

WaitResult EpochStream::WaitFor(std::chrono::milliseconds timeout) { return impl_->WaitReady(DeadlineAfter(timeout)); }

Result<EpochStream::Waited> EpochStream::NextFor(std::chrono::milliseconds timeout) {
  Waited out;
  out.wait = WaitFor(timeout);
  if (out.wait != WaitResult::kReady) return out;
  auto r = Next();
  if (!r.ok()) return r.status();
  out.batch = std::move(*r);
  return out;
}

void EpochStream::Interrupt() { impl_->Interrupt(); }
LoaderStats EpochStream::stats() const { return impl_->stats(); }

Batch EpochStream::MakeBatch(Batch::Slot* slot, uint64_t epoch, uint64_t index, uint64_t count, uint64_t sample_bytes,
                             bool has_labels, const std::vector<uint64_t>* sample_shape,
                             const std::vector<FieldInfo>* fields) {
  Batch b;
  b.fields_ = fields;
  b.capacity_ = sample_bytes ? slot->images.bytes() / sample_bytes : 0;
  b.slot_ = slot;
  b.data_ = slot->images.data();
  b.labels_ = std::span<const int64_t>(slot->labels.data(), has_labels ? count : 0);
  b.indices_ = std::span<const uint64_t>(slot->indices.data(), count);
  if (slot->deferred) b.encoded_ = std::span<const EncodedSample>(slot->encoded.data(), count);
  b.buffer_bytes_ = slot->images.bytes();
  b.sample_shape_ = sample_shape;
  b.epoch_ = epoch;
  b.index_ = index;
  b.sample_bytes_ = sample_bytes;
  b.pinned_ = slot->images.pinned();
  return b;
}

Result<std::optional<Batch>> LocalStream::Next() {
  auto r = core.Pop(loader->source.name());
  if (!r.ok()) return r.status();
  if (!r->has_value()) return std::optional<Batch>();
  const loader::StreamCore::Item& it = **r;
  Batch b = MakeBatch(it.slot, epoch, it.index, it.count, loader->source.sample_bytes(),
                      !loader->source.labels().empty(), &loader->source.sample_shape(), &loader->info.fields);
  delivered_batches.fetch_add(1, std::memory_order_relaxed);
  delivered_samples.fetch_add(it.count, std::memory_order_relaxed);
  delivered_bytes.fetch_add(it.count * b.sample_bytes(), std::memory_order_relaxed);
  MutexLock lock(&loader->state_mu);
  loader->state.epoch = epoch;
  loader->state.next_batch = it.index + 1;
  return std::optional<Batch>(std::move(b));
}

LoaderStats LocalStream::stats() const {
  const LocalStream& s = *this;
  LoaderStats st;
  st.batches = s.delivered_batches.load(std::memory_order_relaxed);
  st.samples = s.delivered_samples.load(std::memory_order_relaxed);
  st.bytes_delivered = s.delivered_bytes.load(std::memory_order_relaxed);
  auto& c = s.loader->cache->counters();
  st.chunk_reads = c.reads;
  st.bytes_read = c.bytes_read;
  st.bytes_decoded = c.bytes_decoded;
  st.chunk_hits = c.hits;
  st.chunk_misses = c.misses;
  st.prefetched = c.prefetched;
  st.chunk_shared_hits = c.shared_hits;
  st.chunk_reads_ahead = c.reads_ahead;
  st.fetch_seconds = c.fetch_ns * 1e-9;
  st.plan_seconds = s.plan_ns * 1e-9;
  st.assemble_seconds = s.assemble_ns * 1e-9;
  st.deferred_samples = s.deferred_samples.load();
  st.host_decoded_samples = s.host_decoded_samples.load();
  st.host_decode_reason = s.host_decode_reason.load();
  st.balanced_samples = s.balanced_samples.load();
  st.skipped_samples = s.skipped_samples.load();
  uint64_t minor = 0, major = 0;
  ProcessFaults(&minor, &major);
  st.minor_faults = minor - s.minor_faults0;
  st.major_faults = major - s.major_faults0;
  st.chunk_bytes_mapped = s.loader->cache->bytes_mapped_this_epoch();
  st.chunk_bytes_held = s.loader->cache->bytes_held();
  const ChunkSource::OpenCosts oc = s.loader->source.open_costs();
  st.source_probe_seconds = oc.probe_seconds;
  st.source_open_seconds = oc.open_seconds;
  st.source_opens = oc.opens;
  st.source_planned_opens = oc.planned_opens;
  st.host_decode_share = s.host_decode_share.load();
  st.consumer_wait_seconds = s.core.wait_seconds();
  st.queue_depth_sum = s.core.depth_sum();
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
LoaderState Loader::state() const {
  LoaderState s;
  {
    MutexLock lock(&impl_->state_mu);
    s = impl_->state;
  }
  DescribeShard(impl_->source.num_samples(), impl_->options, &s);
  return s;
}

void Loader::ReportDeviceDecodeRate(double samples_per_second) {
  if (samples_per_second > 0 && std::isfinite(samples_per_second))
    impl_->device_decode_rate.store(samples_per_second, std::memory_order_relaxed);
}

uint64_t Loader::num_batches() const {
  auto plan = loader::MakeEpochPlan(impl_->source.num_samples(), impl_->source.chunk_samples(),
                                    impl_->source.num_chunks(), impl_->options, 0);
  return plan.ok() ? plan->num_batches : 0;
}

void LoaderInternal::UsePool(Loader& loader, BatchPool* pool) {
  loader.impl_->pool = pool != nullptr ? pool : &loader.impl_->own_pool;
}

bool LoaderInternal::ReadsSampleUnits(const Loader& loader) { return loader.impl_->sample_units != nullptr; }

void LoaderInternal::SetThreads(Loader& loader, int threads) {
  loader.impl_->threads = std::clamp(threads, 1, AvailableCores());
}

void LoaderInternal::ShareChunks(Loader& loader, std::shared_ptr<loader::SharedChunks> shared) {
  loader.impl_->cache->SetShared(std::move(shared));
}

namespace {

// A stream that fails at its first Next() (a state that cannot resume here).
struct FailedStream final : EpochStream::Impl {
  explicit FailedStream(Status st) : status(std::move(st)) {}
  Result<std::optional<Batch>> Next() override { return status; }
  uint64_t num_batches() const override { return 0; }
  LoaderStats stats() const override { return {}; }
  void Stop() override {}
  static EpochStream Make(Status st) { return Wrap(std::make_unique<FailedStream>(std::move(st))); }
  Status status;
};

}  // namespace

Result<uint64_t> BatchSource::PrepareResume(const LoaderState& state) {
  const LoaderOptions o = sharding();
  GPUFEED_RETURN_IF_ERROR(CheckStateFits(state, info().num_samples, o));
  auto r = ReshardFor(state, o);
  if (!r.ok()) return r.status();
  SetReshard(*r);
  // Resharded here (another world size or batch size): the epoch's samples
  // left, split anew, from its start. Else the epoch as it was, from its
  // batch.
  const LoaderOptions::Reshard& was = state.base;
  const bool as_saved =
      r->world_size == was.world_size && r->epoch == was.epoch && r->share == was.share && r->consumed == was.consumed;
  return r->world_size > 0 && !as_saved ? 0 : state.next_batch;
}

EpochStream BatchSource::Resume(const LoaderState& state) {
  auto start = PrepareResume(state);
  if (!start.ok()) return FailedStream::Make(start.status());
  return Epoch(state.epoch, *start);
}

LoaderOptions Loader::sharding() const { return impl_->options; }

void Loader::SetReshard(const LoaderOptions::Reshard& r) {
  const LoaderOptions::Reshard& now = impl_->options.reshard;
  if (r.epoch == now.epoch && r.world_size == now.world_size && r.share == now.share && r.consumed == now.consumed) {
    return;  // nothing changes: the next epoch's plan stays good
  }
  // The running stream's cache reads the next epoch's plan (its look-ahead
  // crosses into that epoch): it ends before the plan goes. A new Epoch()
  // follows anyway.
  if (impl_->active != nullptr) impl_->active->Stop();
  impl_->options.reshard = r;
  impl_->next_plan.reset();  // made under the old options
}

void Loader::Warm() {
  if (impl_->active != nullptr || impl_->next_plan) return;  // an epoch has started
  // Bad options are Epoch()'s to report, and allocate nothing here.
  auto plan = loader::MakeEpochPlan(impl_->source.num_samples(), impl_->source.chunk_samples(),
                                    impl_->source.num_chunks(), impl_->options, 0);
  if (!plan.ok()) return;
  impl_->next_plan = std::move(*plan);
  impl_->next_plan_epoch = 0;
  (void)impl_->EnsurePool();  // its error, if any, is the first Epoch()'s too
}

EpochStream Loader::Epoch(uint64_t epoch, uint64_t start_batch) {
  if (impl_->active != nullptr) impl_->active->Stop();
  auto s = std::make_unique<LocalStream>(impl_.get());
  s->epoch = epoch;
  s->start_batch = start_batch;
  s->start_time = std::chrono::steady_clock::now();
  ProcessFaults(&s->minor_faults0, &s->major_faults0);
  {
    MutexLock lock(&impl_->state_mu);
    impl_->state.epoch = epoch;
    impl_->state.next_batch = start_batch;
  }
  auto fail_now = [&](Status st) {
    s->core.FailNow(std::move(st));
    s->stopped = true;
    return LocalStream::Start(std::move(s));
  };
  auto make_plan = [&](uint64_t e) {
    return loader::MakeEpochPlan(impl_->source.num_samples(), impl_->source.chunk_samples(), impl_->source.num_chunks(),
                                 impl_->options, e);
  };
  if (impl_->next_plan && impl_->next_plan_epoch == epoch) {
    s->plan = std::move(*impl_->next_plan);
  } else {
    auto plan = make_plan(epoch);
    if (!plan.ok()) return fail_now(plan.status().WithContext(impl_->source.name()));
    s->plan = std::move(*plan);
  }
  impl_->next_plan.reset();
  if (auto next = make_plan(epoch + 1); next.ok()) {
    impl_->next_plan = std::move(*next);
    impl_->next_plan_epoch = epoch + 1;
  }
  if (start_batch > s->plan.num_batches) {
    return fail_now(Status::InvalidArgument(impl_->source.name() + ": resume at batch " + std::to_string(start_batch) +
                                            " past the epoch's " + std::to_string(s->plan.num_batches)));
  }
  if (Status st = impl_->EnsurePool(); !st.ok()) return fail_now(st);
  impl_->cache->BeginEpoch(&s->plan, start_batch, impl_->next_plan ? &*impl_->next_plan : nullptr);
  impl_->active = s.get();
  LocalStream* raw = s.get();
  raw->producer = std::thread([raw] { raw->Run(); });
  return LocalStream::Start(std::move(s));
}

}  // namespace gpufeed
