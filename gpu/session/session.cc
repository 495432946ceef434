// Session (include/gpufeed/session.h): open, epochs, next and interrupt,
// position and state. Batches: session_batch.cc; statistics: session_stats.cc.
#include "gpufeed/session.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "gpu/session/session_core.h"
#include "gpufeed/logger.h"

namespace gpufeed {
namespace {

// A feeder of `epoch` from `start_batch` over the core's source.
Result<std::shared_ptr<FeedState>> MakeFeed(Session::Core& c, uint64_t epoch, uint64_t start_batch) {
  auto st = std::make_shared<FeedState>();
  st->feeder = std::make_unique<GpuFeeder>(c.opened->source(), c.feed_options(), epoch, start_batch);
  if (st->feeder->on_gpu() && !c.device_ops) {
    auto ops = gpu::MakeCudaOps(c.feed_options().device);
    if (!ops.ok()) return ops.status();
    c.device_ops = std::move(*ops);
  }
  return st;
}

// An environment variable overriding a switch: "0" off, "1" on, else unset.
void Override(const char* name, bool* field) {
  const char* v = std::getenv(name);
  if (v == nullptr) return;
  if (std::string_view(v) == "0") *field = false;
  if (std::string_view(v) == "1") *field = true;
}

// The ended epoch's statistics, then the epoch after it started (Core::next_started).
void StartNextEpochEarly(Session::Core& c, const SessionStats& ended) {
  if (!c.options.next_epoch_early || c.opened->remote() || c.resumed) return;
  const uint64_t next = c.epoch + c.epoch_step;
  if (c.feed()) {
    if (!c.options.restart_feeder || !c.feed_state || c.feed_state->feeder->fields().empty()) return;
    c.ended_stats = ended;
    MutexLock lock(&c.feed_state->mu);
    // A failure here is the start's to report: it restarts the feeder again.
    if (!c.feed_state->feeder->Restart(next, 0).ok()) return;
  } else {
    if (!c.stream) return;
    c.ended_stats = ended;
    {
      MutexLock lock(&c.interrupt_mu);
      c.stream.reset();
    }
    EpochStream s = c.opened->source().Epoch(next, 0);
    MutexLock lock(&c.interrupt_mu);
    c.stream.emplace(std::move(s));
  }
  c.next_started = true;
  c.next_epoch = next;
  MutexLock lock(&c.interrupt_mu);
  c.live_is_ahead = true;
}

}  // namespace

SessionOptions WithEnvironment(SessionOptions options) {
  Override("GPUFEED_FEED_RESTART", &options.restart_feeder);
  Override("GPUFEED_NEXT_EPOCH_EARLY", &options.next_epoch_early);
  Override("GPUFEED_FIRST_EPOCH_EARLY", &options.first_epoch_early);
  return options;
}

// ---- Core --------------------------------------------------------------------

gpu::DeviceOps* Session::Core::ReleaseOps() {
  MutexLock lock(&release_ops_mu);
  if (!release_ops_tried) {
    release_ops_tried = true;
    auto ops = gpu::MakeCudaOps(gpu::kCurrentDevice);
    if (ops.ok()) release_ops = std::move(*ops);
  }
  return release_ops.get();
}

void Session::Core::InterruptLive() {
  if (live_is_ahead) {
    interrupt_pending = true;  // for the consumer's next wait, whichever epoch it starts
  } else if (feed() && feed_state) {
    feed_state->feeder->Interrupt();
  } else if (!feed() && stream) {
    stream->Interrupt();
  } else {
    interrupt_pending = true;
  }
}

Session::Core::~Core() {
  // Slots still read by copies on a stream go back to the pool first. A
  // stream stuck past the bound (a hung GPU) would have its callbacks
  // release into freed memory: the loader is left allocated instead.
  bool abandoned = false;
  {
    MutexLock lock(&deferred->mu);
    const auto until = std::chrono::steady_clock::now() + kDeferredReleaseWait;
    while (deferred->pending != 0 && !abandoned) {
      const auto left = until - std::chrono::steady_clock::now();
      abandoned = left <= left.zero() || (!deferred->cv.WaitFor(&deferred->mu, left) && deferred->pending != 0);
    }
  }
  if (abandoned) {
    const std::shared_ptr<Logger> log = options.source.loader.logger ? options.source.loader.logger : StderrLogger();
    log->Log(LogLevel::kWarning, "release_abandoned",
             name + ": a CUDA stream has not reached the copies of released host batches in " +
                 std::to_string(kDeferredReleaseWait.count()) + " s; leaving the loader's memory allocated");
    (void)new std::optional<EpochStream>(std::move(stream));  // never freed: see above
    (void)opened.release();
    return;
  }
  feed_state.reset();
  warm_feed.reset();
  stream.reset();
  opened.reset();
}

uint64_t Session::Core::Position() const {
  if (!feed()) return start_batch + delivered;
  if (ended) return opened->num_batches();
  // Loader batches whose outputs were all delivered: whole uploads.
  const uint64_t per_upload =
      static_cast<uint64_t>(std::max(1, feed_options().echo)) * static_cast<uint64_t>(feed_options().super_batch);
  return start_batch + delivered / per_upload * static_cast<uint64_t>(feed_options().super_batch);
}

// ---- Session -----------------------------------------------------------------

Session::Session(std::shared_ptr<Core> core) : core_(std::move(core)) {}

Session::~Session() {
  // The handle goes; batches still held keep the Core (and its pipeline,
  // parked on a full pool) until they are released.
  MutexLock lock(&core_->interrupt_mu);  // an interrupt may be reaching the stream
  core_->stream.reset();
}

Result<std::unique_ptr<Session>> Session::Open(SessionOptions options) {
  auto core = std::make_shared<Core>();
  core->options = WithEnvironment(std::move(options));
  SourceOptions& so = core->options.source;
  FeedOptions& fo = core->options.feed_options;
  const bool feed = core->options.feed;
  core->pool_slots = static_cast<uint64_t>(std::max(1, so.loader.prefetch)) + 1;
  // Where JPEGs are decoded (encoded image datasets): the GPU's decoder
  // when asked or (auto) when the feed is on a GPU that has one.
  auto placed = PlaceDecode(core->options.decode, feed && !fo.force_cpu, fo.device);
  if (!placed.ok()) {
    return Status::Unsupported("decode=\"gpu\": " + placed.status().message() +
                               " (it needs device=\"cuda\" and libnvjpeg; decode=\"auto\" falls back to the CPU)");
  }
  so.loader.defer_decode = placed->defer;
  so.loader.balance_decode = placed->balance;
  fo.skip_corrupt = so.decode.skip_corrupt;
  auto opened = OpenBatchSource(so);
  if (!opened.ok()) return opened.status();
  core->opened = std::move(*opened);
  if (core->opened->remote() && core->opened->source().info().encoded_batches) {
    core->decode = placed->Describe() + ", read by the server";  // it sends the JPEGs this GPU decodes encoded
  } else if (core->opened->encoded() == nullptr) {
    core->decode = core->opened->remote() ? "server" : "none";
  } else {
    core->decode = placed->Describe();
  }
  const BatchSourceInfo& info = core->opened->source().info();
  core->name = info.name;
  if (info.pool_slots > 0) core->pool_slots = info.pool_slots;  // the source's own count (a daemon's pool)
  if (feed) {
    // What the first batch would refuse, refused now (a uint32 dataset
    // with dtype float32 on the CPU: 3.8 s later, worded for the GPU).
    GPUFEED_RETURN_IF_ERROR(CheckFeedInput(info, fo));
  }
  // Epoch 0 from its start, now: its first batches are read, decoded (and
  // with a feed uploaded) while the caller builds its model; from a daemon
  // (the node's server) they are on their way.
  const bool early = core->options.first_epoch_early;
  if (feed && (info.encoded_batches || early)) {
    // Epoch 0's feeder: its buffers and streams made, its loader stream
    // reading; with JPEGs for the feed's decode stage its worker makes the
    // GPU's decoder and fills the first upload. The first start of epoch 0
    // at batch 0 takes it (StartEpochOf).
    auto warm = MakeFeed(*core, 0, 0);
    if (!warm.ok()) return warm.status();
    core->warm_feed = std::move(*warm);
  } else if (early) {
    // Epoch 0's stream, kept as an epoch started early: StartEpoch(0, 0)
    // takes it, any other start (and LoadState) ends it unused.
    EpochStream s = core->opened->source().Epoch(0, 0);
    MutexLock lock(&core->interrupt_mu);
    core->stream.emplace(std::move(s));
    core->next_started = true;
    core->next_epoch = 0;
    core->live_is_ahead = true;
  } else {
    // The batch buffers and epoch 0's plan, made while the caller builds
    // its model (pinned buffers of large samples take seconds: issue 30).
    core->opened->source().Warm();
  }
  return std::unique_ptr<Session>(new Session(std::move(core)));
}

const BatchSourceInfo& Session::info() const { return core_->opened->source().info(); }
const std::string& Session::name() const { return core_->name; }
uint64_t Session::num_batches() const { return core_->opened->num_batches(); }
const OpenedSource& Session::opened() const { return *core_->opened; }
const SessionOptions& Session::options() const { return core_->options; }
const std::string& Session::decode() const { return core_->decode; }
uint64_t Session::pool_slots() const { return core_->pool_slots; }
bool Session::on_gpu() const { return core_->feed_state && core_->feed_state->feeder->on_gpu(); }

// The start itself, for StartEpoch and LoadState (which set the reshard first).
static Status StartEpochOf(Session::Core& c, uint64_t epoch, uint64_t start_batch) {
  std::shared_ptr<FeedState> old_feed;
  {
    MutexLock lock(&c.interrupt_mu);
    old_feed = std::move(c.feed_state);
  }
  // The feeder made at open (only before any start): taken as it is, or
  // restarted below. Not by a resume: its reshard (PrepareResume) may have
  // ended the stream the feeder reads.
  const bool take_warm = c.warm_feed && epoch == 0 && start_batch == 0 && !c.resumed;
  if (c.warm_feed) old_feed = std::move(c.warm_feed);
  // The epoch started when the last one ended: taken as it is, or
  // restarted below.
  const bool take_next = c.next_started && epoch == c.next_epoch && start_batch == 0;
  c.next_started = false;
  c.ended_stats = SessionStats{};
  c.start_time = std::chrono::steady_clock::now();
  c.first_batch_seconds = 0;
  c.started_early = take_warm || take_next;
  if (c.started) c.epoch_step = epoch == c.epoch && start_batch == 0 ? 0 : 1;
  c.epoch = epoch;
  c.start_batch = start_batch;
  c.delivered = 0;
  c.ended = false;
  c.started = true;
  if (take_next && !c.feed()) {
    // The stream is this epoch's already.
  } else if (take_warm || (take_next && old_feed)) {
    // Made (or restarted) for this very start: its first upload may be done.
    MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(old_feed);
  } else if (c.options.restart_feeder && c.feed() && old_feed && !old_feed->feeder->fields().empty()) {
    // The same feeder, restarted: its device buffers, streams and image
    // decoder stay. A new feeder an epoch made them again at each epoch's
    // start, on every rank of a node at once. Batches of the last epoch
    // still held stay valid. (A feeder that did not start is made anew.)
    {
      MutexLock lock(&old_feed->mu);
      GPUFEED_RETURN_IF_ERROR(old_feed->feeder->Restart(epoch, start_batch));
    }
    MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(old_feed);
  } else if (c.feed()) {
    old_feed.reset();  // unless batches still hold it, it goes before the new one takes the loader's pool
    {
      MutexLock lock(&c.interrupt_mu);
      c.stream.reset();
    }
    auto st = MakeFeed(c, epoch, start_batch);
    if (!st.ok()) return st.status();
    MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(*st);
  } else {
    {
      MutexLock lock(&c.interrupt_mu);
      c.stream.reset();  // ends the previous stream before the next starts
    }
    EpochStream next = c.opened->source().Epoch(epoch, start_batch);
    MutexLock lock(&c.interrupt_mu);
    c.stream.emplace(std::move(next));
  }
  // An interrupt that came while nothing was live ends the new stream's first wait.
  MutexLock lock(&c.interrupt_mu);
  c.live_is_ahead = false;
  if (c.interrupt_pending) {
    c.interrupt_pending = false;
    c.InterruptLive();
  }
  return Status::Ok();
}

Status Session::StartEpoch(uint64_t epoch, uint64_t start_batch) {
  // An epoch of its own, not a resumed one (SetReshard may stop the running
  // stream: nothing waits in it, this is the consumer's thread).
  core_->opened->source().SetReshard({});
  core_->resumed = false;
  return StartEpochOf(*core_, epoch, start_batch);
}

Result<Session::Waited> Session::NextFor(std::chrono::milliseconds timeout) {
  Core& c = *core_;
  if (!c.started)
    return Status::InvalidArgument(c.name + ": no epoch started (Session::StartEpoch; C: gpufeed_loader_start_epoch)");
  Waited out;
  if (c.next_started) return out;              // the live stream is the next epoch's, not yet started
  if (c.feed() ? !c.feed_state : !c.stream) {  // the last start failed before its stream existed
    return Status::InvalidArgument(
        c.name +
        ": the last epoch start failed (its error said why); start an epoch again (Session::StartEpoch; C: "
        "gpufeed_loader_start_epoch)");
  }
  if (!c.feed() && c.held_host.load() >= c.pool_slots) {
    // No batch can be assembled until the consumer gives one back: say so
    // rather than wait forever.
    return Status::InvalidArgument(c.name + ": the consumer holds all " + std::to_string(c.pool_slots) +
                                   " batches of the pool (prefetch + 1); free batches (their tensors) before "
                                   "asking for more, or raise prefetch (LoaderOptions::prefetch)");
  }
  auto state = std::make_unique<SessionBatch::State>();
  if (c.feed()) {
    MutexLock lock(&c.feed_state->mu);
    auto r = c.feed_state->feeder->NextFor(timeout);
    if (!r.ok()) return r.status();  // the consumer holding every slot can continue
    out.wait = r->wait;
    if (r->batch) {
      state->index = r->batch->index();
      state->size = static_cast<uint64_t>(r->batch->size());
      state->device = std::move(*r->batch);
      state->feed = c.feed_state;
    }
  } else {
    auto r = c.stream->NextFor(timeout);
    if (!r.ok()) return r.status();
    out.wait = r->wait;
    if (r->batch) {
      state->index = r->batch->index();
      state->size = r->batch->size();
      state->host = std::move(*r->batch);
      c.held_host.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (out.wait != WaitResult::kReady) return out;
  if (!state->host && !state->device) {
    c.ended = true;
    StartNextEpochEarly(c, stats());
    return out;
  }
  if (c.delivered == 0) {
    c.first_batch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start_time).count();
  }
  ++c.delivered;
  state->epoch = state->host ? state->host->epoch() : c.epoch;
  state->core = core_;
  out.batch.emplace(SessionBatch(std::move(state)));
  return out;
}

Result<std::optional<SessionBatch>> Session::Next() {
  for (;;) {
    auto r = NextFor(std::chrono::milliseconds::max());
    if (!r.ok()) return r.status();
    if (r->wait == WaitResult::kReady) return std::move(r->batch);
  }
}

void Session::Interrupt() {
  MutexLock lock(&core_->interrupt_mu);
  core_->InterruptLive();
}

Session::Position Session::position() const { return {core_->epoch, core_->Position()}; }

LoaderState Session::state() const {
  LoaderState st;
  st.seed = core_->options.source.loader.seed;
  st.epoch = core_->epoch;
  st.next_batch = core_->Position();
  const BatchSource& src = core_->opened->source();
  DescribeShard(src.info().num_samples, src.sharding(), &st);
  return st;
}

Result<LoaderState> Session::CheckState(std::string_view serialized) const {
  auto st = LoaderState::Deserialize(serialized);
  if (!st.ok()) return st.status().WithContext(core_->name);
  const BatchSource& src = core_->opened->source();
  const LoaderOptions o = src.sharding();
  if (Status fits = CheckStateFits(*st, src.info().num_samples, o); !fits.ok()) return fits.WithContext(core_->name);
  if (auto r = ReshardFor(*st, o); !r.ok()) return r.status().WithContext(core_->name);
  return st;
}

Status Session::LoadState(std::string_view serialized) {
  auto st = CheckState(serialized);
  if (!st.ok()) return st.status();
  // At another world size: the epoch's samples its ranks had not received,
  // split among this run's (gpufeed/loader.h, Resharding). A warm feeder
  // made at open with a fill worker goes first: the reshard may stop the
  // loader's stream its worker reads. One without (its stream read on this
  // thread) is restarted by the start below, its buffers kept.
  if (core_->warm_feed && core_->opened->source().info().encoded_batches) core_->warm_feed.reset();
  auto start = core_->opened->source().PrepareResume(*st);
  if (!start.ok()) return start.status().WithContext(core_->name);
  // An epoch started early is not taken: the reshard may have stopped its
  // stream, and the start below makes the resumed epoch's anew.
  core_->next_started = false;
  core_->resumed = true;
  return StartEpochOf(*core_, st->epoch, *start);
}

}  // namespace gpufeed
