// The pool of batch buffers behind every Batch: prefetch + 1 slots allocated
// once (pinned when a CUDA device is present), shared by the local Loader and
// RemoteLoader, so a Batch looks the same to GpuFeeder whoever filled it.
#ifndef GPUFEED_LOADER_BATCH_POOL_H_
#define GPUFEED_LOADER_BATCH_POOL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/host_buffer.h"
#include "gpufeed/loader.h"

namespace gpufeed {

class BatchPool;
class Loader;
namespace loader {
class SharedChunks;
}

// Bytes of a pool slot per sample for a Loader over `source`: the decoded
// sample, or with deferred decoding (`defers`: LoaderOptions::defer_decode
// over a source of encoded samples) room for encoded samples up to twice
// the source's mean (a sample that does not fit is decoded by the loader,
// into its sample_bytes()). A daemon's shared slots and its client's pool
// are sized by it too, so a deferred batch is laid out alike wherever it
// is made.
uint64_t SlotSampleBytes(const ChunkSource& source, bool defers);

struct Batch::Slot {
  HostBuffer images;              // batch_size x sample_bytes
  std::vector<int64_t> labels;    // batch_size
  std::vector<uint64_t> indices;  // batch_size
  // Deferred decoding (LoaderOptions::defer_decode): per sample, where its
  // bytes lie in `images`; `deferred` says whether this batch's are so.
  std::vector<EncodedSample> encoded;
  bool deferred = false;
  BatchPool* pool = nullptr;
  uint32_t id = 0;             // position in its pool
  bool with_consumer = false;  // held by a Batch; read and written under its pool's mutex
};

// Thread-safe. Acquire blocks until a slot is free or the pool is cancelled
// (then returns nullptr), so every wait is woken by shutdown.
//
// The pool also counts the slots its consumer holds (Batch objects alive):
// when the consumer holds every slot and asks for another batch, no producer
// can make progress, and the stream ends the wait with an error naming the
// option to raise (SetHoldHint) instead of waiting forever.
class BatchPool {
 public:
  BatchPool() = default;
  ~BatchPool();  // stops and joins the allocating thread
  BatchPool(const BatchPool&) = delete;
  BatchPool& operator=(const BatchPool&) = delete;

  // Allocates `slots` slots once (later calls are no-ops), on a thread of
  // the pool's, in order: each slot joins the free list when its buffer is
  // made, so the first batch waits for one slot's buffer, not all of them
  // (DeepCAM's 9 pinned slots of 480 MB took 2.25 s before its first batch,
  // issue 30). A slot that cannot be allocated ends every Acquire with
  // nullptr and status() says why. Pinned memory is resident once
  // allocated; pages of plain memory fault in when the first batches are
  // assembled into them.
  Status Allocate(int slots, uint64_t batch_size, uint64_t sample_bytes, bool pin_memory);
  // Not ok when a slot's buffer could not be allocated.
  Status status();
  // Tests: Allocate makes each slot's buffer with `f` (a null buffer: the
  // allocation failed). Call before Allocate.
  void SetAllocatorForTests(std::function<HostBuffer(uint64_t bytes, bool pinned)> f) { allocate_ = std::move(f); }
  // Slots whose images are views of `region` (slot i at i x stride; the
  // region outlives the pool): a shared-memory mapping that the daemon and a
  // RemoteLoader both see. `start_free` false leaves every slot out of the
  // free list until Release()d (the daemon's side: a slot is the client's
  // until it grants it).
  Status AllocateViews(std::span<std::byte> region, uint64_t stride, int slots, uint64_t batch_size,
                       uint64_t sample_bytes, bool pin_memory, bool start_free);
  bool allocated() const { return !slots_.empty(); }
  size_t size() const { return slots_.size(); }
  Batch::Slot* slot(size_t i) const { return slots_[i].get(); }

  Batch::Slot* Acquire();
  Batch::Slot* TryAcquire();  // nullptr when none is free (or cancelled)
  // Acquire, except that it also ends, with nullptr and *gave_up set, when
  // `give_up` is true while no slot is free. Whoever sets `give_up` calls
  // WakeWaiters() after, so a wait in progress sees it at once.
  Batch::Slot* AcquireUnless(const std::atomic<bool>& give_up, bool* gave_up);
  void WakeWaiters();  // every Acquire* wait checks its conditions again
  // Acquire, giving up after `timeout` (nullptr; *timed_out says which).
  Batch::Slot* AcquireFor(std::chrono::milliseconds timeout, bool* timed_out);
  void Release(Batch::Slot* s);
  // Empties the free list (those slots are now the caller's); returns how
  // many it held.
  size_t TakeAllFree();
  void SetCancelled(bool c);

  // A slot handed to the consumer as a Batch; Release() takes it back.
  void MarkDelivered(Batch::Slot* s);
  // True when the consumer holds every slot (and a hold hint is set: pools
  // whose slots also come back from elsewhere, as the daemon's shared-memory
  // pool, set none).
  bool ConsumerHoldsAll();
  // What to tell a consumer that holds every slot: "raise prefetch (...)".
  void SetHoldHint(std::string hint);
  std::string hold_hint();

 private:
  std::unique_ptr<Batch::Slot> NewSlot(uint32_t id, HostBuffer images, uint64_t batch_size);
  void Install(std::vector<std::unique_ptr<Batch::Slot>> slots, bool start_free) EXCLUDES(mu_);
  Batch::Slot* PopFree() REQUIRES(mu_);
  // Whether Acquire waits on: nothing free, not cancelled, no failed slot.
  bool MustWait() REQUIRES(mu_) { return !cancelled_ && free_.empty() && alloc_error_.ok(); }
  void AllocateSlots(uint64_t bytes, bool pin_memory);  // the allocating thread

  Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<Batch::Slot>> slots_;  // owns them all; fixed after Allocate
  std::vector<Batch::Slot*> free_ GUARDED_BY(mu_);
  bool cancelled_ GUARDED_BY(mu_) = false;
  Status alloc_error_ GUARDED_BY(mu_);
  bool stop_allocating_ GUARDED_BY(mu_) = false;
  std::thread allocator_;  // Allocate's; a slot's buffer is its until the slot joins free_
  std::function<HostBuffer(uint64_t, bool)> allocate_ = HostBuffer::Allocate;
  size_t with_consumer_ GUARDED_BY(mu_) = 0;
  std::string hold_hint_ GUARDED_BY(mu_);
};

// gpufeed-internal access to a Loader: the daemon makes a stream's Loader
// assemble straight into the slots of a client's shared memory.
struct LoaderInternal {
  // Batches come from `pool` (nullptr: the Loader's own) from the next
  // Epoch() on. Call only while no stream of the Loader is alive; the pool
  // must outlive every stream started with it. The pipeline keeps up to
  // options().prefetch batches in flight, so size the pool to match.
  static void UsePool(Loader& loader, BatchPool* pool);
  // The Loader's decoded-chunk cache picks up chunks from (and offers its own
  // to) the other caches of `shared`, which must all read the same source as
  // this Loader. Call before its first Epoch().
  static void ShareChunks(Loader& loader, std::shared_ptr<loader::SharedChunks> shared);
  // Whether the Loader reads an encoded source one sample a chunk (random
  // order: EncodedImageSource::WithReadUnit(1)): its chunks are then not
  // the source's runs, and may be shared only with Loaders that read so too.
  static bool ReadsSampleUnits(const Loader& loader);
  // The TBB threads of the Loader's next streams (its own arena's size).
  // Call while no stream of the Loader is alive.
  static void SetThreads(Loader& loader, int threads);
};

}  // namespace gpufeed

#endif  // GPUFEED_LOADER_BATCH_POOL_H_
