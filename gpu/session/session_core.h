// What a Session (include/gpufeed/session.h) and its batches share: the
// Core behind a Session, the feeder state and the deferred host releases.
// Not installed.
//
// Ownership. A Session is a handle on a Core (shared_ptr); every
// SessionBatch holds the Core too, so the loader, its pool and the feeder
// outlive the last buffer anyone can see, whatever order things are
// released in. Each batch also holds the feeder it came from (FeedState),
// which outlives later epochs' feeders while its batches are held.
//
// Threads. The consumer's calls run on its thread: NextFor is the stream's
// (or feeder's) NextFor, whose wait a timeout or an interrupt ends with
// nothing taken; Interrupt reaches the live stream from any thread through
// Core::interrupt_mu. Batch releases come from any thread: host slots go
// back through the thread-safe BatchPool; device slots through
// GpuFeeder::ReleaseSlot, which is not thread-safe, so every feeder call
// holds its FeedState's mutex.
#ifndef GPUFEED_GPU_SESSION_SESSION_CORE_H_
#define GPUFEED_GPU_SESSION_SESSION_CORE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "gpu/device_ops.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"
#include "gpufeed/open_source.h"
#include "gpufeed/session.h"
#include "gpufeed/status.h"

namespace gpufeed {

// The feeder of one epoch and the lock every call into it takes. The
// pointer is set once, when the state is made; the calls into the feeder
// (Next, Restart, Release, stats) hold mu.
struct FeedState {
  Mutex mu;
  std::unique_ptr<GpuFeeder> feeder;
};

// Host batches released after a stream (SessionBatch::SetReleaseStream): a
// non_blocking copy of a batch to the GPU may still be reading its slot when
// the batch is released, so the slot goes back to the pool from a callback
// the stream runs after that copy. The count is shared with the callbacks,
// which may outlive a Core that gave up waiting for them.
struct DeferredReleases {
  Mutex mu;
  CondVar cv;
  uint64_t pending GUARDED_BY(mu) = 0;
};
struct PendingRelease {
  Batch batch;
  std::shared_ptr<DeferredReleases> gate;
};
// The stream callback: no CUDA call there (cudaLaunchHostFunc's rule); the
// pool's Release only takes its mutex.
void RunPendingRelease(void* p);
constexpr auto kDeferredReleaseWait = std::chrono::seconds(30);

struct Session::Core {
  SessionOptions options;  // as opened: the environment's overrides applied
  std::unique_ptr<OpenedSource> opened;
  std::string name;
  std::string decode;       // where JPEGs are decoded, and why (Session::decode)
  uint64_t pool_slots = 0;  // the loader's pool: prefetch + 1 host batches, or the source's count
  // Host batches the consumer holds, of any epoch: all of them from one pool.
  std::atomic<uint64_t> held_host{0};

  bool feed() const { return options.feed; }
  const FeedOptions& feed_options() const { return options.feed_options; }

  // The current epoch (consumer thread only, and never while a fetch runs).
  bool started = false;
  uint64_t epoch = 0, start_batch = 0, delivered = 0;
  bool ended = false;
  std::optional<EpochStream> stream;
  std::shared_ptr<FeedState> feed_state;
  // Epoch 0's feeder made at open (where the batches come encoded, or with
  // first_epoch_early: its loader stream reads ahead, a fill worker starts
  // the GPU's decoder and the first upload, while the caller builds its
  // model): the first start of epoch 0 at batch 0 that is not a resume
  // takes it as it is, any other start restarts it (StartEpoch). Without a
  // feed, epoch 0's stream started at open is kept as an epoch started
  // early (next_started, next_epoch 0, below). Consumer thread only.
  std::shared_ptr<FeedState> warm_feed;
  // The epoch after an ended one, started when it ended (its first batches
  // are read, and decoded and uploaded by the feed, while the caller
  // finishes the ended epoch's steps and starts the next): the live stream
  // or feeder is then that epoch's. A start of exactly (next_epoch, 0) takes
  // it; any other start restarts as before. next_epoch is the last epoch
  // plus the last step between started epochs (1, or 0 for a caller that
  // reruns one epoch). Until that start, Next() answers the end and the
  // statistics are the ended epoch's (ended_stats). Consumer thread only.
  bool next_started = false;
  uint64_t next_epoch = 0;
  // The live epoch's start (StartEpoch, LoadState), its first batch's wait
  // (SessionStats::first_batch_seconds; 0 until it came) and whether it was
  // started before that start (SessionStats::started_early).
  std::chrono::steady_clock::time_point start_time;
  double first_batch_seconds = 0;
  bool started_early = false;
  uint64_t epoch_step = 1;
  SessionStats ended_stats;
  // The live epoch came from LoadState: its successor starts only when
  // asked (a resume at another world size reshards the loader, and the next
  // start undoes that, stopping whatever runs).
  bool resumed = false;
  std::unique_ptr<gpu::DeviceOps> device_ops;  // stream waits for device batches
  // Host batches' release after a stream: CUDA ops made on first use (null
  // where there is no CUDA), and the callbacks still pending.
  Mutex release_ops_mu;
  bool release_ops_tried GUARDED_BY(release_ops_mu) = false;
  std::unique_ptr<gpu::DeviceOps> release_ops;  // set once, then read-only
  const std::shared_ptr<DeferredReleases> deferred = std::make_shared<DeferredReleases>();

  gpu::DeviceOps* ReleaseOps();

  // Interrupt (any thread) reaches the stream or feeder the consumer waits
  // in through this lock, under which the consumer swaps them (StartEpoch);
  // with none live, the interrupt waits in `interrupt_pending` for the next
  // one.
  Mutex interrupt_mu;
  bool interrupt_pending GUARDED_BY(interrupt_mu) = false;
  // The live stream or feeder runs ahead of its epoch's start (an epoch
  // started early): an interrupt then waits in `interrupt_pending`, since
  // the start may end that stream unused.
  bool live_is_ahead GUARDED_BY(interrupt_mu) = false;
  void InterruptLive() REQUIRES(interrupt_mu);

  ~Core();

  uint64_t Position() const;
};

// What a SessionBatch holds. Its fields are set once, when the batch is
// made; the release stream may be set from any thread.
struct SessionBatch::State {
  std::shared_ptr<Session::Core> core;
  std::shared_ptr<FeedState> feed;  // the feeder `device` came from
  std::optional<Batch> host;
  std::optional<DeviceBatch> device;
  std::atomic<void*> release_stream{nullptr};
  std::atomic<bool> host_release_stream{false};  // set for a host batch: release after the stream
  uint64_t epoch = 0, index = 0, size = 0;

  ~State();
  // Moves *host into a stream callback, or leaves it for the caller to release.
  void DeferHostRelease();
};

}  // namespace gpufeed

#endif  // GPUFEED_GPU_SESSION_SESSION_CORE_H_
