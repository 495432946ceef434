// What the C API's files share (capi/loader.cc, capi/batch.cc): the Core
// behind a gpufeed_loader, which its batches and their tensors hold too; the
// batch handle; the feeder state and the deferred host releases. Not
// installed.
//
// Ownership. A gpufeed_loader is a handle on a Core (shared_ptr); every batch
// and, through its batch, every exported tensor holds the Core too, so the
// Loader, its pool and the feeder outlive the last buffer anyone can see,
// whatever order the user releases things in. Each batch also holds the
// feeder it came from (FeedState), which outlives later epochs' feeders
// while its batches are held.
//
// Threads. The consumer's calls run on its thread: gpufeed_loader_next is
// the stream's (or feeder's) NextFor, whose wait a timeout or an interrupt
// ends with nothing taken; gpufeed_loader_interrupt reaches the live stream
// from any thread through Core::interrupt_mu. Batch releases come from any
// thread: host slots go back through the thread-safe BatchPool; device slots
// through GpuFeeder::ReleaseSlot, which is not thread-safe, so every feeder
// call holds its FeedState's mutex.
#ifndef GPUFEED_CAPI_CORE_H_
#define GPUFEED_CAPI_CORE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "capi/c_api_internal.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "gpu/device_ops.h"
#include "gpufeed/c_api.h"
#include "gpufeed/dtype.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"
#include "gpufeed/open_source.h"
#include "gpufeed/status.h"

namespace gpufeed::capi {

// DLPack's type of a dtype: the dtype table's (gpufeed/dtype.h).
inline DLDataType DlType(DType t) {
  const gpufeed::DTypeDlpack d = gpufeed::DTypeDlpackOf(t);
  return {d.code, d.bits, 1};
}

// The feeder of one epoch and the lock every call into it takes.
struct FeedState {
  std::mutex mu;
  std::unique_ptr<gpufeed::GpuFeeder> feeder;  // GUARDED_BY(mu) for Next/Release
};

// Host batches released after a stream (gpufeed_batch_set_release_stream):
// a non_blocking copy of a tensor to the GPU may still be reading its slot
// when the tensor is freed, so the slot goes back to the pool from a
// callback the stream runs after that copy. The count is shared with the
// callbacks, which may outlive a Core that gave up waiting for them.
struct DeferredReleases {
  gpufeed::Mutex mu;
  gpufeed::CondVar cv;
  uint64_t pending GUARDED_BY(mu) = 0;
};
struct PendingRelease {
  Batch batch;
  std::shared_ptr<DeferredReleases> gate;
};
// The stream callback (capi/batch.cc): no CUDA call there (cudaLaunchHostFunc's
// rule); the pool's Release only takes its mutex.
void RunPendingRelease(void* p);
constexpr auto kDeferredReleaseWait = std::chrono::seconds(30);

// What one fetch produced.
struct Fetched {
  Status status;
  std::optional<Batch> host;
  std::optional<DeviceBatch> device;
  std::shared_ptr<FeedState> feed;  // the feeder `device` came from
};

// Everything a loader handle, its batches and their tensors share.
struct Core {
  std::unique_ptr<gpufeed::OpenedSource> opened;
  std::string name, dtype_name;
  std::vector<uint64_t> sample_shape;
  bool feed = false;
  gpufeed::FeedOptions feed_options;
  std::string decode;  // where JPEGs are decoded, and why: gpufeed_loader_decode
  uint64_t seed = 0;
  uint64_t pool_slots = 0;  // the loader's pool: prefetch + 1 host batches
  // Host batches the consumer holds (handles or tensors), of any epoch: all
  // of them from one pool.
  std::atomic<uint64_t> held_host{0};

  // The current epoch (consumer thread only, and never while a fetch runs).
  bool started = false;
  uint64_t epoch = 0, start_batch = 0, delivered = 0;
  bool ended = false;
  std::optional<gpufeed::EpochStream> stream;
  std::shared_ptr<FeedState> feed_state;
  // Epoch 0's feeder made at open where the batches come encoded (its fill
  // worker starts the GPU's decoder and the first upload while the caller
  // builds its model): the first start of epoch 0 at batch 0 takes it as it
  // is, any other start restarts it (StartEpoch). Consumer thread only.
  std::shared_ptr<FeedState> warm_feed;
  // The epoch after an ended one, started when it ended (its first batches
  // are read, and decoded and uploaded by the feed, while the caller
  // finishes the ended epoch's steps and starts the next): the live stream
  // or feeder is then that epoch's. A start of exactly (next_epoch, 0) takes
  // it; any other start restarts as before. next_epoch is the last epoch
  // plus the last step between started epochs (1, or 0 for a caller that
  // reruns one epoch). Until that start, next() answers GPUFEED_END and the
  // statistics are the ended epoch's (ended_stats). Consumer thread only.
  bool next_started = false;
  uint64_t next_epoch = 0;
  uint64_t epoch_step = 1;
  std::string ended_stats;
  // The live epoch came from gpufeed_loader_restore_state: its successor
  // starts only when asked (a resume at another world size reshards the
  // loader, and the next start undoes that, stopping whatever runs).
  bool resumed = false;
  std::unique_ptr<gpufeed::gpu::DeviceOps> device_ops;  // stream waits for device batches
  // Host batches' release after a stream: CUDA ops made on first use (null
  // where there is no CUDA), and the callbacks still pending.
  gpufeed::Mutex release_ops_mu;
  bool release_ops_tried GUARDED_BY(release_ops_mu) = false;
  std::unique_ptr<gpufeed::gpu::DeviceOps> release_ops;  // set once, then read-only
  const std::shared_ptr<DeferredReleases> deferred = std::make_shared<DeferredReleases>();

  gpufeed::gpu::DeviceOps* ReleaseOps() {
    gpufeed::MutexLock lock(&release_ops_mu);
    if (!release_ops_tried) {
      release_ops_tried = true;
      auto ops = gpufeed::gpu::MakeCudaOps(gpufeed::gpu::kCurrentDevice);
      if (ops.ok()) release_ops = std::move(*ops);
    }
    return release_ops.get();
  }

  // gpufeed_loader_interrupt (any thread) reaches the stream or feeder the
  // consumer waits in through this lock, under which the consumer swaps them
  // (StartEpoch); with none live, the interrupt waits in `interrupt_pending`
  // for the next one.
  gpufeed::Mutex interrupt_mu;
  bool interrupt_pending GUARDED_BY(interrupt_mu) = false;

  void InterruptLive() REQUIRES(interrupt_mu) {
    if (feed && feed_state) {
      feed_state->feeder->Interrupt();
    } else if (!feed && stream) {
      stream->Interrupt();
    } else {
      interrupt_pending = true;
    }
  }

  ~Core() {
    // Slots still read by copies on a stream go back to the pool first. A
    // stream stuck past the bound (a hung GPU) would have its callbacks
    // release into freed memory: the loader is left allocated instead.
    bool abandoned = false;
    {
      gpufeed::MutexLock lock(&deferred->mu);
      const auto until = std::chrono::steady_clock::now() + kDeferredReleaseWait;
      while (deferred->pending != 0 && !abandoned) {
        const auto left = until - std::chrono::steady_clock::now();
        abandoned = left <= left.zero() || (!deferred->cv.WaitFor(&deferred->mu, left) && deferred->pending != 0);
      }
    }
    if (abandoned) {
      gpufeed::StderrLogger()->Log(gpufeed::LogLevel::kWarning, "release_abandoned",
                                   name + ": a CUDA stream has not reached the copies of released host batches in " +
                                       std::to_string(kDeferredReleaseWait.count()) +
                                       " s; leaving the loader's memory allocated");
    }
    if (abandoned) {
      (void)new std::optional<gpufeed::EpochStream>(std::move(stream));  // never freed: see above
      (void)opened.release();
      return;
    }
    feed_state.reset();
    stream.reset();
    opened.reset();
  }

  uint64_t Position() const {
    if (!feed) return start_batch + delivered;
    if (ended) return opened->num_batches();
    // Loader batches whose outputs were all delivered: whole uploads.
    const uint64_t per_upload =
        static_cast<uint64_t>(std::max(1, feed_options.echo)) * static_cast<uint64_t>(feed_options.super_batch);
    return start_batch + delivered / per_upload * static_cast<uint64_t>(feed_options.super_batch);
  }
};

struct Array {
  const char* name;
  void* data;
  DLDataType dtype;
  std::vector<int64_t> shape;
};

}  // namespace gpufeed::capi

struct gpufeed_loader {
  std::shared_ptr<gpufeed::capi::Core> core;
};

struct gpufeed_batch {
  std::atomic<int> refs{1};  // the handle + every live exported tensor
  std::shared_ptr<gpufeed::capi::Core> core;
  std::shared_ptr<gpufeed::capi::FeedState> feed;
  std::optional<gpufeed::Batch> host;
  std::optional<gpufeed::DeviceBatch> device;
  std::atomic<void*> release_stream{nullptr};
  std::atomic<bool> host_release_stream{false};  // set for a host batch: release after the stream
  uint64_t epoch = 0, index = 0, size = 0;
  DLDevice dl_device{kDLCPU, 0};
  std::vector<gpufeed::capi::Array> arrays;

  // A pinned host batch goes back to its pool after its release stream, by
  // default the legacy default stream (torch's default), has run what was
  // queued on it: an asynchronous copy to a GPU may still read it. (A copy
  // from pageable memory cannot outlive the call that queued it.) Moves
  // *host into a stream callback, or leaves it for the caller to release.
  void DeferHostRelease() {
    gpufeed::gpu::DeviceOps* ops = nullptr;
    if (host_release_stream.load()) {
      ops = core->release_ops.get();
    } else if (host->pinned()) {
      ops = core->ReleaseOps();
    }
    if (ops == nullptr) return;
    void* stream = release_stream.load();
    auto r = std::make_unique<gpufeed::capi::PendingRelease>(
        gpufeed::capi::PendingRelease{std::move(*host), core->deferred});
    host.reset();
    {
      gpufeed::MutexLock lock(&core->deferred->mu);
      ++core->deferred->pending;
    }
    bool launched = false;
    try {
      launched = ops->LaunchHostFunc(gpufeed::gpu::StreamRef{stream}, gpufeed::capi::RunPendingRelease, r.get()).ok();
    } catch (...) {
    }
    if (launched) {
      (void)r.release();  // RunPendingRelease owns it now
      return;
    }
    try {
      (void)ops->StreamSync(gpufeed::gpu::StreamRef{stream});  // no callback: wait here instead
    } catch (...) {
    }
    gpufeed::capi::RunPendingRelease(r.release());
  }

  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // The slot goes back first, then the references that keep its pool alive.
    if (device) {
      std::lock_guard<std::mutex> lock(feed->mu);
      device->Release(release_stream.load());
      device.reset();
    }
    if (host) {
      try {
        DeferHostRelease();
      } catch (...) {
        // Out of memory making the callback: released at once, as without a stream.
      }
      host.reset();
      core->held_host.fetch_sub(1, std::memory_order_relaxed);
    }
    feed.reset();
    core.reset();
    delete this;
  }
};

namespace gpufeed::capi {

// A batch handle for what a wait produced (capi/batch.cc): its named arrays
// (DLPack types from the dtype table), its slot held by the handle.
gpufeed_batch* MakeBatch(const std::shared_ptr<Core>& core, Fetched f);

}  // namespace gpufeed::capi

#endif  // GPUFEED_CAPI_CORE_H_
