// The pool of batch buffers behind every Batch: prefetch + 1 slots allocated
// once (pinned when a CUDA device is present), shared by the local Loader and
// RemoteLoader, so a Batch looks the same to GpuFeeder whoever filled it.
#ifndef GPUFEED_LOADER_BATCH_POOL_H_
#define GPUFEED_LOADER_BATCH_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/host_buffer.h"
#include "gpufeed/loader.h"

namespace gpufeed {

class BatchPool;

struct Batch::Slot {
  gpu::HostBuffer images;         // batch_size x sample_bytes
  std::vector<int64_t> labels;    // batch_size
  std::vector<uint64_t> indices;  // batch_size
  BatchPool* pool = nullptr;
};

// Thread-safe. Acquire blocks until a slot is free or the pool is cancelled
// (then returns nullptr), so every wait is woken by shutdown.
class BatchPool {
 public:
  // Allocates `slots` slots once (later calls are no-ops). Pages of plain
  // memory are touched now rather than during the first batches.
  Status Allocate(int slots, uint64_t batch_size, uint64_t sample_bytes, bool pin_memory);
  bool allocated() const { return !slots_.empty(); }
  size_t size() const { return slots_.size(); }

  Batch::Slot* Acquire();
  Batch::Slot* TryAcquire();  // nullptr when none is free (or cancelled)
  void Release(Batch::Slot* s);
  void SetCancelled(bool c);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Batch::Slot>> slots_;  // owns them all; fixed after Allocate
  std::vector<Batch::Slot*> free_;                   // GUARDED_BY(mu_)
  bool cancelled_ = false;                           // GUARDED_BY(mu_)
};

}  // namespace gpufeed

#endif  // GPUFEED_LOADER_BATCH_POOL_H_
