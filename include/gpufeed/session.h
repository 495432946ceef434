// Session: what a consumer iterates, in one object — a data spec opened
// through the door (OpenBatchSource: a local Loader, a daemon, the node's
// server), where its JPEGs are decoded (PlaceDecode), the feed (GpuFeeder,
// on a GPU or its CPU twins) or the loader's host batches as they are, and
// the epoch lifecycle around them: epoch 0 started at open, the next
// epoch started when one ends, resume and reshard from a saved state (at
// another world size or batch size), interrupts from any thread, batches
// released after a stream, and the statistics. The C API (and so Python's
// gpufeed.Loader) is argument checking and handles over it.
//
//   auto s = gpufeed::Session::Open({.source = {.data = "train.h5", .loader = {.batch_size = 256}},
//                                    .feed = true, .feed_options = {.dtype = gpufeed::DType::kBFloat16}});
//   if (!s.ok()) { report(s.status()); return; }
//   for (uint64_t e = 0; e < epochs; ++e) {
//     if (Status st = (*s)->StartEpoch(e); !st.ok()) { report(st); return; }
//     for (;;) {
//       auto b = (*s)->Next();             // Result<std::optional<SessionBatch>>
//       if (!b.ok()) { report(b.status()); return; }
//       if (!*b) break;                    // end of the epoch
//       (*b)->WaitOn(my_stream);           // the consumer's stream waits for the feed's work
//       train_step((*b)->device()->images(), my_stream);
//       (*b)->SetReleaseStream(my_stream); // the slot goes back after the work queued there
//     }                                    // (the batch released as it goes out of scope)
//     save((*s)->state());                 // resumes mid-epoch, at any world size or batch size
//   }
//
// Threads. One consumer thread calls StartEpoch, Next/NextFor, LoadState
// and the accessors. Interrupt() may be called from any thread. A
// SessionBatch may be released (destroyed) on any thread, in any order,
// before or after its Session: batches hold the session's internals (the
// loader, its pool, the feeder they came from), which live until the last
// batch is gone.
#ifndef GPUFEED_SESSION_H_
#define GPUFEED_SESSION_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"
#include "gpufeed/open_source.h"
#include "gpufeed/status.h"

namespace gpufeed {

struct SessionOptions {
  // What to open, and the loader (OpenBatchSource). source.loader's
  // defer_decode and balance_decode are set by `decode` below.
  SourceOptions source;
  // true: batches go through a GpuFeeder (feed_options: device, dtype,
  // layout, normalization, augmentation, echo; force_cpu runs its CPU
  // twins) and come out as SessionBatch::device(). false: the loader's host
  // batches, as stored (SessionBatch::host()).
  bool feed = false;
  // skip_corrupt is taken from source.decode.skip_corrupt.
  FeedOptions feed_options;
  // Where JPEGs of an encoded image dataset are decoded (PlaceDecode): kGpu
  // needs the feed on a GPU with nvJPEG (else Open fails Unsupported);
  // kAuto takes the GPU's decoder where it is there.
  DecodeDevice decode = DecodeDevice::kAuto;
  // Between epochs the feeder is restarted (GpuFeeder::Restart: its device
  // buffers, streams and image decoder kept) rather than made anew. The
  // environment overrides it: GPUFEED_FEED_RESTART=0 makes a new feeder an
  // epoch (the GPU host's A/B runs, scripts/gpu-host-node), =1 restarts.
  bool restart_feeder = true;
  // When an epoch ends, the next one (the last epoch plus the last step
  // between started epochs: 1, or 0 for a caller that reruns one) starts at
  // once, so its first batches are read, decoded and uploaded while the
  // caller finishes the ended epoch; StartEpoch of exactly that epoch at
  // batch 0 takes it, any other start restarts. Until then Next() answers
  // the end and stats() are the ended epoch's. Not for a daemon's source
  // nor a resumed epoch. The environment overrides it:
  // GPUFEED_NEXT_EPOCH_EARLY=0 turns it off, =1 on.
  bool next_epoch_early = true;
  // Epoch 0 starts at Open, at batch 0: the loader's first batches (up to
  // prefetch) are read and decoded, and with a feed the feeder is made (its
  // buffers, streams and decoder) and its first upload filled, while the
  // caller builds its model, so that the first batch after StartEpoch is
  // there at once. StartEpoch(0, 0) takes it; a start of any other epoch
  // or batch, and any LoadState (a resume, at another world size too),
  // drops what was read ahead and starts what was asked, so no batch of
  // another epoch or position is delivered. false: only the batch buffers
  // and epoch 0's plan are made at Open (BatchSource::Warm), and a feed of
  // encoded batches is made as before. From a daemon (the node's server)
  // the stream is opened at Open too: the server sends the first batches.
  // The environment overrides it: GPUFEED_FIRST_EPOCH_EARLY=0 turns it off,
  // =1 on.
  bool first_epoch_early = true;
};

// The options as a session uses them: the environment's overrides
// (GPUFEED_FEED_RESTART, GPUFEED_NEXT_EPOCH_EARLY, GPUFEED_FIRST_EPOCH_EARLY)
// applied. Open does this.
SessionOptions WithEnvironment(SessionOptions options);

struct SessionStats {
  LoaderStats loader;  // of the loader stream the epoch reads (the feeder's, with a feed)
  bool has_feed = false;
  FeedStats feed;  // with has_feed
  // Seconds from the epoch's start (StartEpoch, LoadState) to its first
  // batch's return from Next; 0 until that batch came. What a training
  // loop waits at iter() before its first step.
  double first_batch_seconds = 0;
  // The epoch's first batches were read (and with a feed uploaded) before
  // its start: epoch 0 at Open (first_epoch_early), a next epoch when the
  // last one ended (next_epoch_early).
  bool started_early = false;
};
// As JSON: the feed's counters ("feed_*", with has_feed) and the loader's,
// with its derived rates (hit_rate, read_amplification, ...).
std::string SessionStatsJson(const SessionStats& stats);

class Session;

// One delivered batch: a host Batch (no feed) or a DeviceBatch (the feed),
// with what it keeps alive. Move-only. Its slot goes back when it is
// destroyed or Release()d, from any thread: a device slot after the work
// queued on its release stream; a pinned host slot after the release
// stream has run what was queued on it so far (an asynchronous copy to a
// GPU may still read it), through a callback of that stream.
class SessionBatch {
 public:
  SessionBatch();
  SessionBatch(SessionBatch&&) noexcept;
  SessionBatch& operator=(SessionBatch&&) noexcept;
  ~SessionBatch();  // Release()

  // Exactly one is non-null until Release().
  const Batch* host() const;
  const DeviceBatch* device() const;
  // The feeder's arrays for a device batch (GpuFeeder::fields()); empty for a host batch.
  const std::vector<FeedField>& feed_fields() const;
  uint64_t epoch() const;
  uint64_t index() const;  // within the epoch (an output batch index with a feed)
  uint64_t size() const;   // samples

  // Makes `stream` (a cudaStream_t; nullptr: the legacy default stream)
  // wait for a device batch's ready event. Nothing to do for a host batch
  // or on the CPU path.
  Status WaitOn(void* stream) const;
  // Waits for the batch and copies its images (size() samples as delivered:
  // the feed's output dtype and layout, or as stored) and labels (int64, or
  // int32 with FeedOptions::labels_int32) to host memory; either pointer may
  // be null. For tests, debugging and checksums, not the training loop.
  Status CopyToHost(void* images, void* labels) const;
  // The stream (a cudaStream_t; nullptr: the legacy default stream) whose
  // work queued so far the release waits for. Any thread. Without a call a
  // pinned host batch waits for the legacy default stream (torch's
  // default); pageable memory and the CPU path are released at once.
  void SetReleaseStream(void* stream);
  // Gives the slot back now (as above). Idempotent.
  void Release();

  struct State;  // defined in gpu/session/session_core.h

 private:
  friend class Session;
  explicit SessionBatch(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

class Session {
 public:
  // Opens options.source through OpenBatchSource after placing the decode
  // (errors as OpenBatchSource; Unsupported for decode kGpu where it cannot
  // run), checks what the feed would refuse at its first batch
  // (CheckFeedInput), and warms up: with batches left encoded for the feed,
  // epoch 0's feeder starts (the GPU's decoder made, the first upload
  // filled while the caller builds its model); with first_epoch_early
  // (the default) epoch 0 starts (SessionOptions::first_epoch_early);
  // otherwise the loader's batch buffers and epoch 0's plan are made.
  static Result<std::unique_ptr<Session>> Open(SessionOptions options);
  // Ends the live stream; what batches still held need lives until they go.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const BatchSourceInfo& info() const;  // of the source (name, dtype, shape, labels, fields)
  const std::string& name() const;      // info().name
  uint64_t num_batches() const;         // loader batches an epoch, for this rank
  const OpenedSource& opened() const;   // what the door opened
  const SessionOptions& options() const;
  // Where JPEGs are decoded, and why: "gpu (nvjpeg hardware)", "cpu (<why>)",
  // "none" (no encoded images), "server" (a daemon decodes).
  const std::string& decode() const;
  // Host batches a consumer may hold at once (the pool); asking for another
  // while holding them all is InvalidArgument, never a wait without end.
  uint64_t pool_slots() const;
  bool on_gpu() const;  // the live feeder runs on a GPU

  // Starts `epoch` at loader batch `start_batch` (with a feed: a multiple of
  // super_batch), ending what runs unless it is that very start made ahead
  // (the warm feeder, the next epoch started early). Clears a resume's
  // reshard: the epoch is this run's own.
  Status StartEpoch(uint64_t epoch, uint64_t start_batch = 0);

  // The next batch of the started epoch, nullopt at its end (the next epoch
  // then starts early: SessionOptions::next_epoch_early). Waits at most
  // `timeout` for the loader: kTimeout or kInterrupted with nothing taken.
  // InvalidArgument without a started epoch, after a failed start, or when
  // the consumer holds every host batch of the pool (naming prefetch).
  struct Waited {
    WaitResult wait = WaitResult::kReady;
    std::optional<SessionBatch> batch;
  };
  Result<Waited> NextFor(std::chrono::milliseconds timeout);
  // NextFor without a time limit, not interrupted (as EpochStream::Next):
  // a consumer that another thread must be able to stop calls NextFor.
  Result<std::optional<SessionBatch>> Next();
  // From any thread: ends the consumer's current wait, or its next one if
  // none is waiting (once), with kInterrupted; nothing is lost.
  void Interrupt();

  // Where the consumer is: the epoch, and the loader batches whose outputs
  // it has all received (with a feed, whole uploads; an ended epoch counts
  // all of them).
  struct Position {
    uint64_t epoch = 0, next_batch = 0;
  };
  Position position() const;
  // The position with the run's seed and shard (LoaderState::Serialize to save it).
  LoaderState state() const;
  // Whether `state` resumes here: of the same run (CheckStateFits) and at a
  // world size and batch size this session resumes at (ReshardFor).
  // InvalidArgument otherwise, naming the session.
  Result<LoaderState> CheckState(std::string_view serialized) const;
  // Resumes `state` (as CheckState, then BatchSource::PrepareResume): its
  // epoch from its batch, or the samples its run had not received split
  // among this run's ranks, at this batch size; started at once. A session
  // at another world size or batch size gets, that epoch, exactly the
  // samples the saved run had not received.
  Status LoadState(std::string_view serialized);

  // The live epoch's statistics (the ended epoch's while the next one runs
  // ahead of its start).
  SessionStats stats() const;

  struct Core;  // gpu/session/session_core.h

 private:
  explicit Session(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

}  // namespace gpufeed

#endif  // GPUFEED_SESSION_H_
