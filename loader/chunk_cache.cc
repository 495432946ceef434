// Belady-managed decoded-chunk cache with prefetch.
#include "loader/chunk_cache.h"

#include "common/cancel.h"
#include "common/sizes.h"
#include "common/trace.h"
#include "gpufeed/loader.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <unordered_set>

namespace gpufeed::loader {

void ChunkBufferPool::Unmap::operator()(std::byte* p) const {
  ::munmap(p, bytes);
  if (held != nullptr) held->fetch_sub(bytes, std::memory_order_relaxed);
}

ChunkBufferPool::Buffer ChunkBufferPool::Get() {
  {
    MutexLock lock(&mu_);
    ++in_use_;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    if (!free_.empty()) {
      Buffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    MutexLock lock(&mu_);
    --in_use_;
    throw std::bad_alloc();
  }
  mapped_.fetch_add(bytes_, std::memory_order_relaxed);
  held_.fetch_add(bytes_, std::memory_order_relaxed);
  return Buffer(static_cast<std::byte*>(p), Unmap{bytes_, &held_});
}

void ChunkBufferPool::Put(Buffer b) {
  Buffer dropped;  // unmapped after the lock is let go
  MutexLock lock(&mu_);
  if (in_use_ > 0) --in_use_;
  if (in_use_ + free_.size() < std::max(keep_ + max_free_, peak_in_use_)) {
    free_.push_back(std::move(b));
  } else {
    dropped = std::move(b);
  }
}

void ChunkBufferPool::SetKeep(size_t buffers) {
  MutexLock lock(&mu_);
  keep_ = buffers;
}

ChunkCache::ChunkCache(const ChunkSource& source, uint64_t budget_bytes, size_t spare_buffers, uint64_t working_set_cap)
    : source_(source),
      budget_(budget_bytes),
      working_set_cap_(working_set_cap),
      planar_fields_(source.fields().size() > 1),
      buffers_(
          std::make_shared<ChunkBufferPool>(std::max<uint64_t>(1, source.max_chunk_buffer_bytes()), spare_buffers)) {}

ChunkCache::~ChunkCache() = default;

uint64_t ChunkCache::ChunkBytes(uint32_t c) const { return source_.chunk_buffer_bytes(c); }

uint64_t ChunkCache::bytes_mapped_this_epoch() const {
  return buffers_->bytes_mapped() - mapped_at_begin_.load(std::memory_order_relaxed);
}

uint64_t WorkingSetCap(uint64_t shuffle_window, uint64_t max_chunk_bytes) {
  return SaturatingMul(std::max<uint64_t>(1, shuffle_window) + 2, max_chunk_bytes);
}

uint64_t ChunkCache::Budget() const {
  return working_set_ <= working_set_cap_ ? std::max(budget_, working_set_) : budget_;
}
uint64_t ChunkCache::working_set_bytes() const {
  MutexLock lock(&mu_);
  return working_set_;
}
uint64_t ChunkCache::effective_budget_bytes() const {
  MutexLock lock(&mu_);
  return Budget();
}

uint64_t ChunkCache::NextUse(uint32_t c) const {
  if (plan_ == nullptr) return kNever;
  const auto& users = plan_->chunk_users[c];
  if (uses_done_[c] < users.size()) return users[uses_done_[c]];
  if (next_plan_ != nullptr && c < next_plan_->chunk_users.size() && !next_plan_->chunk_users[c].empty()) {
    return plan_->num_batches + next_plan_->chunk_users[c].front();
  }
  return kNever;
}

void ChunkCache::BeginEpoch(const EpochPlan* plan, uint64_t start_batch, const EpochPlan* next) {
  MutexLock lock(&mu_);
  plan_ = plan;
  next_plan_ = next;
  uses_done_.assign(source_.num_chunks(), 0);
  // The working set (working_set_bytes()): a chunk needs the budget from
  // its first use (from start_batch on) until its last, where it leaves the
  // budget before the batch's misses are admitted (Acquire) and its batch
  // holds it (the bound in loader.h); the peak of the running sum.
  std::vector<int64_t> delta(plan->num_batches + 1, 0);
  for (size_t c = 0; c < plan->chunk_users.size(); ++c) {
    const auto& u = plan->chunk_users[c];
    uses_done_[c] = static_cast<uint32_t>(std::lower_bound(u.begin(), u.end(), start_batch) - u.begin());
    if (uses_done_[c] + 1 < u.size()) {  // used again after its first use here
      const auto bytes = static_cast<int64_t>(ChunkBytes(static_cast<uint32_t>(c)));
      delta[u[uses_done_[c]]] += bytes;
      delta[u.back()] -= bytes;
    }
  }
  int64_t open = 0, peak = 0;
  for (int64_t d : delta) {
    open += d;
    peak = std::max(peak, open);
  }
  working_set_ = static_cast<uint64_t>(peak);
  by_next_use_.clear();
  for (auto& [c, e] : resident_) {
    key_[c] = NextUse(c);
    by_next_use_.insert({key_[c], c});
  }
  counters_.reads = counters_.bytes_read = counters_.bytes_decoded = 0;
  counters_.hits = counters_.misses = counters_.prefetched = counters_.fetch_ns = 0;
  counters_.shared_hits = counters_.reads_ahead = counters_.bytes_read_ahead = counters_.read_hints = 0;
  mapped_at_begin_.store(buffers_->bytes_mapped(), std::memory_order_relaxed);
  // The buffers of the chunks this epoch may cache are kept when evicted:
  // the next admitted chunks reuse their pages.
  const uint64_t per_buffer = std::max<uint64_t>(1, buffers_->buffer_bytes());
  buffers_->SetKeep(static_cast<size_t>(std::min<uint64_t>(Budget() / per_buffer, SIZE_MAX / 2)));
}

void ChunkCache::Insert(const std::shared_ptr<ChunkEntry>& e) {
  resident_[e->chunk] = e;
  resident_bytes_ += ChunkBytes(e->chunk);
  key_[e->chunk] = NextUse(e->chunk);
  by_next_use_.insert({key_[e->chunk], e->chunk});
}

void ChunkCache::Erase(uint32_t c) {
  auto it = resident_.find(c);
  if (it == resident_.end()) return;
  by_next_use_.erase({key_[c], c});
  key_.erase(c);
  resident_bytes_ -= ChunkBytes(c);
  resident_.erase(it);
}

bool ChunkCache::Admit(uint64_t bytes, uint64_t next_use) {
  // The working set is kept for this epoch's uses: a chunk wanted next in
  // the next epoch (read ahead into it) has the budget alone.
  const uint64_t budget = plan_ != nullptr && next_use < plan_->num_batches ? Budget() : budget_;
  if (bytes > budget) return false;
  while (resident_bytes_ + bytes > budget) {
    // The unheld chunk needed furthest in the future. A held one (a batch in
    // flight reads it, or it is being decoded) would not free memory now —
    // except one needed next only in the next epoch: its holders are batches
    // at its last use of this epoch, so it leaves the budget like any chunk
    // at its last use and is freed when they have copied it (the bound in
    // loader.h). use_count() can only rise behind this check through another
    // cache taking the entry from SharedChunks; evicting it then drops only
    // this cache's reference, and the entry counts in that cache's budget.
    const uint64_t epoch_end = plan_ != nullptr ? plan_->num_batches : 0;
    auto it = by_next_use_.end();
    uint32_t victim = UINT32_MAX;
    while (it != by_next_use_.begin()) {
      --it;
      if (it->first >= epoch_end || resident_.find(it->second)->second.use_count() == 1) {
        victim = it->second;
        break;
      }
    }
    if (victim == UINT32_MAX) return false;
    if (it->first <= next_use && it->first != kNever) return false;
    Erase(victim);  // frees it now: the map held the only reference
  }
  return true;
}

std::shared_ptr<ChunkEntry> SharedChunks::Find(uint32_t chunk) {
  MutexLock lock(&mu_);
  if (auto r = retained_.find(chunk); r != retained_.end()) return r->second;
  auto it = entries_.find(chunk);
  if (it == entries_.end()) return nullptr;
  auto e = it->second.lock();
  if (!e) entries_.erase(it);
  return e;
}

void SharedChunks::Publish(const std::shared_ptr<ChunkEntry>& e) {
  MutexLock lock(&mu_);
  std::weak_ptr<ChunkEntry>& slot = entries_[e->chunk];
  if (slot.expired()) slot = e;
  const uint64_t bytes = e->pool->buffer_bytes();
  if (retain_budget_ > 0 && retained_bytes_ + bytes <= retain_budget_ && !retained_.count(e->chunk)) {
    retained_.emplace(e->chunk, slot.lock());
    retained_bytes_ += bytes;
  }
}

void SharedChunks::Retain(uint64_t bytes) {
  MutexLock lock(&mu_);
  retain_budget_ = bytes;
}

uint64_t SharedChunks::retained_bytes() const {
  MutexLock lock(&mu_);
  return retained_bytes_;
}

std::shared_ptr<ChunkEntry> ChunkCache::NewOrShared(uint32_t c, bool* shared) {
  if (shared_) {
    if (auto e = shared_->Find(c)) {
      *shared = true;
      counters_.shared_hits += 1;
      return e;
    }
  }
  *shared = false;
  return std::make_shared<ChunkEntry>(c, buffers_);
}

void ChunkCache::Spawn(const std::shared_ptr<ChunkEntry>& e, tbb::task_group& tasks) {
  e->pending_of = pending_decodes_;
  *pending_decodes_ += 1;
  source_.WillRead(e->chunk);  // the plan's order reaches the kernel's read-ahead
  {
    MutexLock lock(&pending_mu_);
    pending_.push_back(e);
  }
  // Each task decodes the oldest queued chunk, which is not necessarily `e`:
  // decodes then start in schedule order whoever runs them. Under the
  // stream's cancel flag, as the stage that spawned it.
  tasks.run([this, flag = CurrentCancel()] {
    ScopedCancel scope(flag);
    HelpOne();
  });
}

bool ChunkCache::HelpOne() {
  // A cancelled stream decodes nothing more: what is queued stays queued,
  // for whoever needs it next (counted pending until then).
  while (!CurrentCancelled()) {
    std::shared_ptr<ChunkEntry> e;
    {
      MutexLock lock(&pending_mu_);
      if (pending_.empty()) return false;
      e = pending_.front().lock();
      pending_.pop_front();
    }
    if (e && TryDecode(*e)) return true;
    if (e && CurrentCancelled()) {  // cancelled between the two: back where it was
      MutexLock lock(&pending_mu_);
      pending_.push_front(e);
    }
  }
  return false;
}

Status ChunkCache::Ensure(ChunkEntry& e) {
  // A read cut short by a cancel puts `e` back in kQueued (TryDecode): the
  // loop then decodes it here, unless this thread is cancelled too.
  while (e.state.load() != ChunkEntry::kDone) {
    if (CurrentCancelled()) {
      return Status::IOError(source_.name() + " chunk " + std::to_string(e.chunk) +
                             ": not read: the loader's stream was stopped");
    }
    if (TryDecode(e)) continue;
    if (e.state.load() == ChunkEntry::kDone) break;
    if (HelpOne()) continue;  // useful work while another thread decodes `e`
    MutexLock lock(&e.mu);
    // Slices: a cancel of this thread's stream ends the wait (the decode may
    // be another stream's, not cancelled).
    while (e.state.load() == ChunkEntry::kRunning && !CurrentCancelled()) {
      e.done_cv.WaitFor(&e.mu, std::chrono::milliseconds(50));
    }
  }
  return e.status;
}

bool ChunkCache::TryDecode(ChunkEntry& e) {
  int expected = ChunkEntry::kQueued;
  if (CurrentCancelled()) return false;  // a stopped stream starts no read
  if (e.state.compare_exchange_strong(expected, ChunkEntry::kRunning)) {
    const auto t0 = std::chrono::steady_clock::now();
    // Whatever happens, the entry must reach kDone: other threads wait on it.
    TraceRange trace("gpufeed read+decode chunk");
    try {
      e.data = e.pool->Get();  // its own pool (a shared entry may be another cache's): the buffer goes back there
      const uint64_t span_bytes =
          planar_fields_ ? source_.chunk_samples() * source_.sample_bytes() : ChunkBytes(e.chunk);
      e.status = source_.ReadChunk(e.chunk, std::span(e.data.get(), span_bytes));
    } catch (const std::bad_alloc&) {
      e.status = Status::Internal(source_.name() + " chunk " + std::to_string(e.chunk) +
                                  ": out of memory for its decoded bytes");
    } catch (const std::exception& ex) {
      e.status = Status::Internal(source_.name() + " chunk " + std::to_string(e.chunk) + ": " + ex.what());
    }
    if (e.for_next_epoch) {
      counters_.reads_ahead += 1;
      counters_.bytes_read_ahead += source_.stored_chunk_bytes(e.chunk);
    } else {
      counters_.reads += 1;
      counters_.bytes_read += source_.stored_chunk_bytes(e.chunk);
      counters_.bytes_decoded += ChunkBytes(e.chunk);
    }
    counters_.fetch_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    if (e.pending_of) *e.pending_of -= 1;
    e.pending_of.reset();  // decoded (or given back below): no longer a prefetch pending
    const bool cut_short = !e.status.ok() && CurrentCancelled();
    if (cut_short) {
      // The read failed because this thread's stream was stopped (a remote
      // read cancelled): that says nothing about the chunk. It goes back to
      // kQueued, for whoever reads it next (another stream sharing it, the
      // next epoch), never kDone with this error.
      if (e.data) e.pool->Put(std::move(e.data));
      e.status = Status::Ok();
    }
    {
      MutexLock lock(&e.mu);
      e.state.store(cut_short ? ChunkEntry::kQueued : ChunkEntry::kDone);
    }
    e.done_cv.SignalAll();
    return true;
  }
  return false;
}

std::vector<std::shared_ptr<ChunkEntry>> ChunkCache::Acquire(uint64_t b, uint64_t max_pending, tbb::task_group& tasks) {
  MutexLock lock(&mu_);
  const EpochPlan& plan = *plan_;
  const std::vector<uint32_t>& chunks = plan.batch_chunks[b];
  std::vector<std::shared_ptr<ChunkEntry>> handles(chunks.size());
  // First consume this batch's uses of every chunk, so that chunks it is the
  // last user of leave the budget before its misses are admitted (at a block
  // window boundary, the old window makes room for the new one).
  for (size_t j = 0; j < chunks.size(); ++j) {
    const uint32_t c = chunks[j];
    ++uses_done_[c];
    auto it = resident_.find(c);
    if (it == resident_.end()) continue;
    counters_.hits += 1;
    handles[j] = it->second;
    // A chunk with no use ahead in this epoch or the next stays while the
    // budget has room: it is the first to go (Admit evicts the furthest
    // next use first), and a later epoch may want it — a rank's share moves
    // every epoch, so a loader per rank would otherwise decode again, every
    // epoch, the part of its share that another rank had last time.
    by_next_use_.erase({key_[c], c});
    key_[c] = NextUse(c);
    by_next_use_.insert({key_[c], c});
  }
  for (size_t j = 0; j < chunks.size(); ++j) {
    if (handles[j]) continue;
    const uint32_t c = chunks[j];
    bool shared = false;
    auto e = NewOrShared(c, &shared);
    if (shared) {
      counters_.hits += 1;
    } else {
      counters_.misses += 1;
    }
    const uint64_t next = NextUse(c);
    // Kept if needed ahead (making room), or in room that is free anyway.
    const bool keep = next != kNever ? Admit(ChunkBytes(c), next) : resident_bytes_ + ChunkBytes(c) <= Budget();
    if (keep) {
      Insert(e);
      // A shared one is decoded (or queued) by its cache; one kept only in
      // free room is decoded by the assembling thread, as a transient is.
      if (!shared && next != kNever) Spawn(e, tasks);
    }  // else transient: decoded by the assembling thread (or the other cache's), freed after
    if (!shared && shared_) shared_->Publish(e);
    handles[j] = std::move(e);
  }
  Prefetch(b, max_pending, tasks);
  HintReads(b);
  return handles;
}

const std::vector<uint32_t>& ChunkCache::ChunksOfBatch(uint64_t b2) const {
  return b2 < plan_->num_batches ? plan_->batch_chunks[b2] : next_plan_->batch_chunks[b2 - plan_->num_batches];
}

uint64_t ChunkCache::LookaheadEnd(uint64_t b) const {
  const uint64_t next_batches = next_plan_ != nullptr ? next_plan_->num_batches : 0;
  return std::min<uint64_t>(plan_->num_batches + next_batches, b + 1 + kMaxLookaheadBatches);
}

void ChunkCache::Prefetch(uint64_t b, uint64_t max_pending, tbb::task_group& tasks) {
  // What the next batches need — on into the next epoch's first batches near
  // the end of this one — as long as each is needed sooner than what it
  // would displace, keeping up to max_pending decodes going.
  const EpochPlan& plan = *plan_;
  const uint64_t horizon = LookaheadEnd(b);
  for (uint64_t b2 = b + 1; b2 < horizon; ++b2) {
    for (uint32_t c : ChunksOfBatch(b2)) {
      if (pending_decodes_->load() >= max_pending) return;
      if (resident_.count(c)) continue;
      if (!Admit(ChunkBytes(c), NextUse(c))) return;
      bool shared = false;
      auto e = NewOrShared(c, &shared);
      Insert(e);
      if (!shared) {
        e->for_next_epoch = NextUse(c) >= plan.num_batches;
        Spawn(e, tasks);
        if (shared_) shared_->Publish(e);
        counters_.prefetched += 1;
      }
    }
  }
}

void ChunkCache::HintReads(uint64_t b) {
  // Asked each time: a remote object's window follows its link
  // (hdf5io/io/remote_window.h).
  const uint32_t depth = source_.read_ahead_chunks();
  if (depth == 0 || shared_) return;
  // The next `depth` chunks the coming batches read, in the plan's order:
  // those not resident (read when their batch or a later prefetch gets
  // them), and those queued for a decode that has not read them yet (their
  // hint at Spawn was dropped if every read-ahead buffer was busy then).
  // Resident chunks being decoded or decoded are read already. The source
  // starts what it has room for and ignores what it started already.
  // Chunks, not batches, bound how far: past kMaxLookaheadBatches when the
  // source reads further ahead than they hold (up to `depth` batches,
  // looking at no more than 8 x depth chunks there: a resident plan costs
  // no more than the first 64 batches' scan).
  std::unordered_set<uint32_t> hinted;
  hinted.reserve(depth);
  const uint64_t next_batches = next_plan_ != nullptr ? next_plan_->num_batches : 0;
  const uint64_t near = b + 1 + kMaxLookaheadBatches;
  const uint64_t horizon =
      std::min<uint64_t>(plan_->num_batches + next_batches, b + 1 + std::max<uint64_t>(kMaxLookaheadBatches, depth));
  uint64_t looked_past_near = 0;
  for (uint64_t b2 = b + 1; b2 < horizon; ++b2) {
    for (uint32_t c : ChunksOfBatch(b2)) {
      if (b2 >= near && ++looked_past_near > 8ull * depth) return;
      if (auto it = resident_.find(c); it != resident_.end() && it->second->state.load() != ChunkEntry::kQueued) {
        continue;
      }
      if (!hinted.insert(c).second) continue;
      source_.WillRead(c);
      counters_.read_hints += 1;
      if (hinted.size() >= depth) return;
    }
  }
}

std::vector<uint32_t> ChunkCache::ResidentChunks() const {
  MutexLock lock(&mu_);
  std::vector<uint32_t> out;
  for (const auto& [c, e] : resident_) out.push_back(c);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace gpufeed::loader

namespace gpufeed {
uint64_t CacheBoundBytes(const LoaderOptions& o, uint64_t max_chunk_bytes) {
  return std::max(o.cache_bytes, loader::WorkingSetCap(o.shuffle_window, max_chunk_bytes));
}
}  // namespace gpufeed
