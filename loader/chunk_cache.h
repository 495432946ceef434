// ChunkCache: decoded chunks under a byte budget, managed with the epoch's
// known future (Belady): a chunk leaves as soon as no later batch needs it;
// when the budget is full, the unheld chunk needed furthest in the future
// goes, and a chunk is only admitted if it is needed sooner than that one.
// It also prefetches: chunks of the next batches start decoding while
// earlier batches are assembled.
//
// Memory: the cached chunks stay within the budget. A chunk a batch in
// flight still reads is never evicted (that would free nothing and cost a
// re-read); one whose last use is such a batch has already left the budget
// and is freed when the batch has copied it. So the bytes alive are at most
// the budget plus the chunks at their last use in batches in flight (a
// window's worth at a block-order window boundary, a few otherwise).
//
// Threading: Acquire() is called by one thread at a time, in batch order (the
// pipeline's serial plan stage), which makes every cache decision — and so
// every read count — independent of thread counts and timing. Ensure() and
// the entries it returns are used from any thread.
#ifndef GPUFEED_LOADER_CHUNK_CACHE_H_
#define GPUFEED_LOADER_CHUNK_CACHE_H_

#include <tbb/task_group.h>

#include <atomic>
#include <deque>
#include <cstdint>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "gpufeed/chunk_source.h"
#include "loader/sampler.h"

namespace gpufeed::loader {

// Recycles chunk-sized buffers: a fresh 10 MB allocation is an mmap whose
// every page faults (and a std::vector would also zero it) — that cost more
// than a tenth of a deflate decode. Thread-safe; outlives every entry that
// holds one of its buffers (shared ownership).
// Buffers are mapped and unmapped directly, so a buffer given back and not
// kept is returned to the OS at once instead of lingering in malloc's arenas.
// A buffer given back is kept for the next Get while the buffers in use and
// kept number fewer than SetKeep's count (the cache's budget in buffers: the
// chunks it evicts are the room of those it admits next) plus `max_free`
// (the chunks in flight beside the cache), or than the most ever in use at
// once (the chunks batches in flight hold at their last use: a random
// order's batches each hold many): so a cache that turns its chunks over (a
// budget smaller than the data, a block window's working set) reuses pages
// touched once, in this epoch and the next, instead of zeroing fresh ones
// at every eviction, and the buffers mapped never pass the larger of the
// most in use at once and that sum.
// It counts the bytes it maps (each page zeroed by the kernel at its first
// touch) and the bytes mapped now, in use or kept.
class ChunkBufferPool {
 public:
  struct Unmap {
    size_t bytes = 0;
    std::atomic<uint64_t>* held = nullptr;  // the pool's bytes_held(), lowered on unmap
    void operator()(std::byte* p) const;
  };
  using Buffer = std::unique_ptr<std::byte[], Unmap>;

  ChunkBufferPool(size_t buffer_bytes, size_t max_free) : bytes_(buffer_bytes), max_free_(max_free) {}
  Buffer Get();  // throws std::bad_alloc when the OS refuses
  void Put(Buffer b);
  // Buffers (in use + kept) up to which one given back is kept.
  void SetKeep(size_t buffers);
  size_t buffer_bytes() const { return bytes_; }
  // Bytes of buffers mapped since the pool was made (fresh pages), and
  // mapped now (in use, or kept for reuse).
  uint64_t bytes_mapped() const { return mapped_.load(std::memory_order_relaxed); }
  uint64_t bytes_held() const { return held_.load(std::memory_order_relaxed); }

 private:
  const size_t bytes_, max_free_;
  std::atomic<uint64_t> mapped_{0}, held_{0};  // before free_: its buffers unmap into held_
  Mutex mu_;
  size_t keep_ GUARDED_BY(mu_) = 0;
  size_t in_use_ GUARDED_BY(mu_) = 0;  // handed out by Get, not yet Put back
  size_t peak_in_use_ GUARDED_BY(mu_) = 0;
  std::vector<Buffer> free_ GUARDED_BY(mu_);
};

// One decoded chunk, or one being decoded.
struct ChunkEntry {
  enum State : int { kQueued = 0, kRunning = 1, kDone = 2 };
  ChunkEntry(uint32_t c, std::shared_ptr<ChunkBufferPool> p) : chunk(c), pool(std::move(p)) {}
  ~ChunkEntry() {
    if (data) pool->Put(std::move(data));
    if (pending_of) *pending_of -= 1;  // spawned, never decoded (evicted, or its stream stopped)
  }
  const uint32_t chunk;
  const std::shared_ptr<ChunkBufferPool> pool;
  // Set when a prefetch decode was queued for it: the spawning cache's count
  // of pending decodes, decremented (and this reset) by whichever thread (of
  // any cache sharing the entry) decodes it, or when it goes undecoded.
  std::shared_ptr<std::atomic<uint64_t>> pending_of;
  // Read ahead for the next epoch (near this one's end): counted apart, so
  // an epoch's reads are those its own batches needed.
  bool for_next_epoch = false;
  ChunkBufferPool::Buffer data;  // written once, by the thread that wins kQueued -> kRunning
  Status status;                 // valid once state == kDone
  // Atomic: Ensure() and TryDecode() read and claim it without the lock. It
  // moves to kDone under `mu` so that a waiter on done_cv cannot miss it.
  std::atomic<int> state{kQueued};
  Mutex mu;  // guards the wait below
  CondVar done_cv;
};

// Decoded chunks of one source that several caches (the daemon's streams of
// one file) pick up from each other: a chunk another stream has decoded, or is
// decoding, is used rather than read again. Weak references: each entry lives
// as long as some cache or batch holds it, and counts in the budget of every
// cache that holds it (so each cache's bound still holds). And, up to
// Retain()'s bytes of chunk buffers, strong ones: the node's one cache. A
// stream's cache ranks chunks by its own shard's next uses (this epoch and
// the next) and keeps others only in room nothing needs, while the ranks'
// shards move every epoch: without the retained set a stream whose cache is
// small reads again, every epoch, chunks another stream had (as a loader per
// rank did, docs/benchmarks.md, "The whole node"). Retained entries are
// never dropped: the first budget's worth published stay until the
// SharedChunks goes (a retained entry still queued is decoded by whoever
// needs it, Ensure).
// Thread-safe.
class SharedChunks {
 public:
  // Retains up to `bytes` of chunk buffers from now on (0: none, the
  // default); call before the caches that share it start.
  void Retain(uint64_t bytes);
  std::shared_ptr<ChunkEntry> Find(uint32_t chunk);
  void Publish(const std::shared_ptr<ChunkEntry>& e);  // keeps a live entry already there
  uint64_t retained_bytes() const;

 private:
  mutable Mutex mu_;
  uint64_t retain_budget_ GUARDED_BY(mu_) = 0;
  std::unordered_map<uint32_t, std::weak_ptr<ChunkEntry>> entries_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, std::shared_ptr<ChunkEntry>> retained_ GUARDED_BY(mu_);
  uint64_t retained_bytes_ GUARDED_BY(mu_) = 0;
};

struct CacheCounters {
  std::atomic<uint64_t> reads{0}, bytes_read{0}, bytes_decoded{0};
  std::atomic<uint64_t> hits{0}, misses{0}, prefetched{0};
  std::atomic<uint64_t> shared_hits{0};  // misses served by another cache's entry (counted in hits)
  std::atomic<uint64_t> reads_ahead{0}, bytes_read_ahead{0};  // for the next epoch (not in reads)
  std::atomic<uint64_t> fetch_ns{0};
  std::atomic<uint64_t> read_hints{0};  // HintReads' hints to the source (for tests)
};

// The working set a cache keeps past its budget (ChunkCache's
// working_set_bytes()) at most: (shuffle_window + 2) of the source's largest
// chunks, a block window's chunks and the two its batches straddle at its
// edges (sequential order needs two or three). CacheBoundBytes
// (gpufeed/loader.h) is the cache's bound with it.
uint64_t WorkingSetCap(uint64_t shuffle_window, uint64_t max_chunk_bytes);

class ChunkCache {
 public:
  // Keeps decoded-chunk buffers for reuse up to the budget's worth (set at
  // each BeginEpoch: ChunkBufferPool::SetKeep) and `spare_buffers` beyond it
  // (the loader passes 2 x threads + 4: every thread's transient chunk and
  // the decodes in flight, loader.h's bound).
  //
  // `working_set_cap` bounds the epoch's working set the cache keeps even
  // past the budget (see working_set_bytes()); 0 keeps none past it.
  ChunkCache(const ChunkSource& source, uint64_t budget_bytes, size_t spare_buffers = 8, uint64_t working_set_cap = 0);
  ~ChunkCache();

  // Starts an epoch at batch `start_batch` (uses by earlier batches count as
  // done): `plan` must outlive its use. Resident chunks stay and are ranked
  // by their next use in the new plan. Resets the counters.
  //
  // `next` (optional, outliving its use too) is the plan of the epoch that
  // follows. The future then spans the boundary: a chunk whose last use in
  // this epoch is done stays if the next epoch needs it soon enough (ranked
  // after every use of this epoch, by its first use in the next), and the
  // prefetch runs on into the next epoch's first batches. With a budget of
  // the whole decoded dataset, epochs after the first read nothing.
  void BeginEpoch(const EpochPlan* plan, uint64_t start_batch, const EpochPlan* next = nullptr);

  // Serial, in batch order: handles to batch b's chunks (plan.batch_chunks[b]
  // order), cached or transient (decoded by whoever Ensure()s it first, then
  // freed with the last handle). Starts decoding admitted misses on `tasks`,
  // then prefetches the chunks of the following batches (at most
  // kMaxLookaheadBatches ahead) until `max_pending` decodes are queued or
  // running, or the budget is full. Then, where the source reads ahead
  // (read_ahead_chunks() > 0, asked each time), hints it the next that many chunks of the
  // plan still to be read, admitted or not: the reads run ahead of the
  // decodes, bounded by the source's read-ahead buffers, not the budget.
  std::vector<std::shared_ptr<ChunkEntry>> Acquire(uint64_t b, uint64_t max_pending, tbb::task_group& tasks);
  static constexpr uint64_t kMaxLookaheadBatches = 64;

  // Decodes `e` now unless another thread already started it; while another
  // thread decodes it, this one decodes other queued chunks (oldest first)
  // instead of idling, and only blocks when none is left. Returns the decode
  // status.
  Status Ensure(ChunkEntry& e);
  // Decodes the oldest queued chunk, if any; false when none is queued.
  bool HelpOne();

  // Shares decoded chunks with the other caches of `shared` (same source);
  // call before the first epoch.
  void SetShared(std::shared_ptr<SharedChunks> shared) { shared_ = std::move(shared); }

  uint64_t budget_bytes() const { return budget_; }
  // Bytes of decoded-chunk buffers mapped fresh since the epoch began (their
  // pages zeroed at first touch), and mapped now (ChunkBufferPool).
  uint64_t bytes_mapped_this_epoch() const;
  uint64_t bytes_held() const { return buffers_->bytes_held(); }
  // The epoch's working set: the most decoded bytes of chunks past their
  // first use and before their last in this epoch's plan at any one batch
  // (from the epoch's start batch; at its last use a chunk is held by its
  // batch, outside the budget). Under a budget smaller than it, a chunk that
  // several batches share would be decoded again for each (block order: a
  // chunk serves the batches of its shuffle window); so where it is at most
  // the working-set cap, the cache may hold that much whatever its budget,
  // and each chunk is decoded once an epoch (memory: the working set where
  // it passes the budget). Above the cap (random order over whole chunks:
  // the working set is the data) the budget alone rules. Set by BeginEpoch.
  uint64_t working_set_bytes() const;
  // The bytes the cache may hold now: the budget, or the working set where
  // that is kept (above).
  uint64_t effective_budget_bytes() const;
  CacheCounters& counters() { return counters_; }
  // The chunks resident now, ascending (for tests).
  std::vector<uint32_t> ResidentChunks() const;

 private:
  static constexpr uint64_t kNever = UINT64_MAX;
  // The batch of c's next use, counting the next epoch's batches after this
  // epoch's (plan_->num_batches + b); kNever if neither uses it again.
  uint64_t NextUse(uint32_t c) const REQUIRES(mu_);
  uint64_t ChunkBytes(uint32_t c) const;
  // Makes room for `bytes` by evicting unheld chunks used later than
  // `next_use` (furthest first); false if it cannot.
  bool Admit(uint64_t bytes, uint64_t next_use) REQUIRES(mu_);
  void Insert(const std::shared_ptr<ChunkEntry>& e) REQUIRES(mu_);
  void Erase(uint32_t c) REQUIRES(mu_);
  void Spawn(const std::shared_ptr<ChunkEntry>& e, tbb::task_group& tasks);
  // Acquire's steps after batch b's own chunks: decodes started ahead within
  // the budget, then the source's read-ahead fed from the plan.
  void Prefetch(uint64_t b, uint64_t max_pending, tbb::task_group& tasks) REQUIRES(mu_);
  void HintReads(uint64_t b) REQUIRES(mu_);
  // Batch b2's chunks, counting the next plan's batches after this plan's.
  const std::vector<uint32_t>& ChunksOfBatch(uint64_t b2) const REQUIRES(mu_);
  // One past the last batch Acquire(b) looks ahead to.
  uint64_t LookaheadEnd(uint64_t b) const REQUIRES(mu_);
  // Runs the decode if `e` is still queued; true if this call ran it.
  bool TryDecode(ChunkEntry& e);

  const ChunkSource& source_;
  const uint64_t budget_;
  const uint64_t working_set_cap_;
  uint64_t working_set_ GUARDED_BY(mu_) = 0;
  // max(budget_, working_set_ where it is at most working_set_cap_).
  uint64_t Budget() const REQUIRES(mu_);
  // Several fields: read units are laid out for chunk_samples() samples
  // (planar, chunk_source.h), also the short last one.
  const bool planar_fields_;
  std::shared_ptr<ChunkBufferPool> buffers_;
  std::atomic<uint64_t> mapped_at_begin_{0};  // buffers_->bytes_mapped() at BeginEpoch
  CacheCounters counters_;

  mutable Mutex mu_;
  const EpochPlan* plan_ GUARDED_BY(mu_) = nullptr;
  const EpochPlan* next_plan_ GUARDED_BY(mu_) = nullptr;
  std::vector<uint32_t> uses_done_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, std::shared_ptr<ChunkEntry>> resident_ GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, uint32_t>> by_next_use_ GUARDED_BY(mu_);
  std::unordered_map<uint32_t, uint64_t> key_ GUARDED_BY(mu_);  // chunk -> its key in by_next_use_
  uint64_t resident_bytes_ GUARDED_BY(mu_) = 0;

  // A miss: another cache's entry for `c` if there is one (a shared hit),
  // else a new entry (the caller publishes it).
  std::shared_ptr<ChunkEntry> NewOrShared(uint32_t c, bool* shared) REQUIRES(mu_);

  std::shared_ptr<SharedChunks> shared_;
  // Spawned and not yet decoded (shared with the entries, see ChunkEntry).
  std::shared_ptr<std::atomic<uint64_t>> pending_decodes_ = std::make_shared<std::atomic<uint64_t>>(0);
  Mutex pending_mu_;
  std::deque<std::weak_ptr<ChunkEntry>> pending_ GUARDED_BY(pending_mu_);  // spawned, in schedule order
};

}  // namespace gpufeed::loader

#endif  // GPUFEED_LOADER_CHUNK_CACHE_H_
