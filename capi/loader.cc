// The C API's loader (include/gpufeed/c_api.h, "loader"): open, epochs,
// next and interrupt, position and state, statistics.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "capi/core.h"

using gpufeed::Batch;
using gpufeed::DeviceBatch;
using gpufeed::DType;
using gpufeed::Status;
using gpufeed::capi::Core;
using gpufeed::capi::Fail;
using gpufeed::capi::FeedState;
using gpufeed::capi::Fetched;
using gpufeed::capi::Guard;

namespace {

// A feeder of `epoch` from `start_batch` over the core's source.
gpufeed::Result<std::shared_ptr<FeedState>> MakeFeed(Core& c, uint64_t epoch, uint64_t start_batch) {
  auto st = std::make_shared<FeedState>();
  st->feeder = std::make_unique<gpufeed::GpuFeeder>(c.opened->source(), c.feed_options, epoch, start_batch);
  if (st->feeder->on_gpu() && !c.device_ops) {
    auto ops = gpufeed::gpu::MakeCudaOps(c.feed_options.device);
    if (!ops.ok()) return ops.status();
    c.device_ops = std::move(*ops);
  }
  return st;
}

// The benchmarks' A/B switches: on unless the variable is "0".
bool SwitchOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string_view(v) != "0";
}
// GPUFEED_FEED_RESTART=0 makes a new feeder every epoch, as before Restart
// existed (scripts/gpu-host-node).
bool RestartFeeders() {
  static const bool on = SwitchOn("GPUFEED_FEED_RESTART");
  return on;
}
// GPUFEED_NEXT_EPOCH_EARLY=0: the next epoch starts only when asked, as before.
bool NextEpochEarly() {
  static const bool on = SwitchOn("GPUFEED_NEXT_EPOCH_EARLY");
  return on;
}

gpufeed_code StartEpoch(Core& c, uint64_t epoch, uint64_t start_batch, gpufeed_error** error) {
  std::shared_ptr<FeedState> old_feed;
  {
    gpufeed::MutexLock lock(&c.interrupt_mu);
    old_feed = std::move(c.feed_state);
  }
  // The feeder made at open (only before any start): taken as it is, or
  // restarted below.
  const bool take_warm = c.warm_feed && epoch == 0 && start_batch == 0;
  if (c.warm_feed) old_feed = std::move(c.warm_feed);
  // The epoch started when the last one ended: taken as it is, or
  // restarted below.
  const bool take_next = c.next_started && epoch == c.next_epoch && start_batch == 0;
  c.next_started = false;
  c.ended_stats.clear();
  if (c.started) c.epoch_step = epoch == c.epoch && start_batch == 0 ? 0 : 1;
  c.epoch = epoch;
  c.start_batch = start_batch;
  c.delivered = 0;
  c.ended = false;
  c.started = true;
  const bool restart = RestartFeeders();
  if (take_next && !c.feed) {
    // The stream is this epoch's already.
  } else if (take_warm || (take_next && old_feed)) {
    // Made (or restarted) for this very start: its first upload may be done.
    gpufeed::MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(old_feed);
  } else if (restart && c.feed && old_feed && !old_feed->feeder->fields().empty()) {
    // The same feeder, restarted: its device buffers, streams and image
    // decoder stay. A new feeder an epoch made them again at each epoch's
    // start, on every rank of a node at once. Batches of the last epoch
    // still held stay valid. (A feeder that did not start is made anew.)
    {
      std::lock_guard<std::mutex> lock(old_feed->mu);
      gpufeed::Status restarted = old_feed->feeder->Restart(epoch, start_batch);
      if (!restarted.ok()) return Fail(error, restarted);
    }
    gpufeed::MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(old_feed);
  } else if (c.feed) {
    old_feed.reset();  // unless batches still hold it, it goes before the new one takes the loader's pool
    {
      gpufeed::MutexLock lock(&c.interrupt_mu);
      c.stream.reset();
    }
    auto st = MakeFeed(c, epoch, start_batch);
    if (!st.ok()) return Fail(error, st.status());
    gpufeed::MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(*st);
  } else {
    {
      gpufeed::MutexLock lock(&c.interrupt_mu);
      c.stream.reset();  // ends the previous stream before the next starts
    }
    gpufeed::EpochStream next = c.opened->source().Epoch(epoch, start_batch);
    gpufeed::MutexLock lock(&c.interrupt_mu);
    c.stream.emplace(std::move(next));
  }
  // An interrupt that came while nothing was live ends the new stream's first wait.
  gpufeed::MutexLock lock(&c.interrupt_mu);
  if (c.interrupt_pending) {
    c.interrupt_pending = false;
    c.InterruptLive();
  }
  return GPUFEED_OK;
}

std::string JsonNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

char* CopyString(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

// The statistics of the live epoch, as JSON (gpufeed_loader_stats_json).
std::string StatsJson(Core& c) {
  gpufeed::LoaderStats s;
  std::string j = "{";
  auto add = [&](const char* k, double v) {
    if (j.size() > 1) j += ", ";
    j += std::string("\"") + k + "\": " + JsonNumber(v);
  };
  if (c.feed && c.feed_state) {
    std::lock_guard<std::mutex> lock(c.feed_state->mu);
    s = c.feed_state->feeder->loader_stats();
    const gpufeed::FeedStats f = c.feed_state->feeder->stats();
    add("feed_fresh_batches", double(f.fresh_batches));
    add("feed_echoed_batches", double(f.echoed_batches));
    add("feed_fresh_samples", double(f.fresh_samples));
    add("feed_echoed_samples", double(f.echoed_samples));
    add("feed_uploads", double(f.uploads));
    add("feed_bytes_uploaded", double(f.bytes_uploaded));
    add("feed_data_wait_seconds", f.data_wait_seconds);
    add("feed_wall_seconds", f.wall_seconds);
    add("feed_echo", f.echo);
    add("feed_on_gpu", f.on_gpu ? 1 : 0);
    add("feed_decoded_on_device", double(f.decoded_on_device));
    add("feed_decoded_by_loader", double(f.decoded_by_loader));
    add("feed_decode_fallbacks", double(f.decode_fallbacks));
    add("feed_decode_skipped", double(f.decode_skipped));
    add("feed_decode_seconds", f.decode_seconds);
  } else if (c.stream) {
    s = c.stream->stats();
  }
  add("batches", double(s.batches));
  add("samples", double(s.samples));
  add("bytes_delivered", double(s.bytes_delivered));
  add("chunk_reads", double(s.chunk_reads));
  add("bytes_read", double(s.bytes_read));
  add("bytes_decoded", double(s.bytes_decoded));
  add("chunk_hits", double(s.chunk_hits));
  add("chunk_misses", double(s.chunk_misses));
  add("prefetched", double(s.prefetched));
  add("chunk_shared_hits", double(s.chunk_shared_hits));
  add("chunk_reads_ahead", double(s.chunk_reads_ahead));
  add("plan_seconds", s.plan_seconds);
  add("fetch_seconds", s.fetch_seconds);
  add("assemble_seconds", s.assemble_seconds);
  add("deferred_samples", double(s.deferred_samples));
  add("host_decoded_samples", double(s.host_decoded_samples));
  add("balanced_samples", double(s.balanced_samples));
  add("skipped_samples", double(s.skipped_samples));
  add("minor_faults", double(s.minor_faults));
  add("major_faults", double(s.major_faults));
  add("source_probe_seconds", s.source_probe_seconds);
  add("source_open_seconds", s.source_open_seconds);
  add("source_opens", double(s.source_opens));
  add("source_planned_opens", double(s.source_planned_opens));
  add("host_decode_share", s.host_decode_share);
  add("consumer_wait_seconds", s.consumer_wait_seconds);
  add("wall_seconds", s.wall_seconds);
  add("hit_rate", s.hit_rate());
  add("read_amplification", s.read_amplification());
  add("samples_per_second", s.samples_per_second());
  add("mean_queue_depth", s.mean_queue_depth());
  j += "}";
  return j;
}

// Starts the epoch after the one that just ended (Core::next_started).
void StartNextEpochEarly(Core& c) {
  if (!NextEpochEarly() || c.opened->remote() || c.resumed) return;
  const uint64_t next = c.epoch + c.epoch_step;
  if (c.feed) {
    if (!RestartFeeders() || !c.feed_state || c.feed_state->feeder->fields().empty()) return;
    c.ended_stats = StatsJson(c);
    std::lock_guard<std::mutex> lock(c.feed_state->mu);
    // A failure here is the start's to report: it restarts the feeder again.
    if (!c.feed_state->feeder->Restart(next, 0).ok()) return;
  } else {
    if (!c.stream) return;
    c.ended_stats = StatsJson(c);
    {
      gpufeed::MutexLock lock(&c.interrupt_mu);
      c.stream.reset();
    }
    gpufeed::EpochStream s = c.opened->source().Epoch(next, 0);
    gpufeed::MutexLock lock(&c.interrupt_mu);
    c.stream.emplace(std::move(s));
  }
  c.next_started = true;
  c.next_epoch = next;
}

// Saved state bytes as a state this loader resumes: parsed, of the same
// run (seed, order, dataset: CheckStateFits) and at a world size and batch
// size it resumes at (ReshardFor); the error names the loader.
gpufeed::Result<gpufeed::LoaderState> StateFor(const gpufeed_loader& l, const void* bytes, size_t size) {
  if (bytes == nullptr && size > 0) return gpufeed::Status::InvalidArgument("loader state: NULL bytes");
  auto st = gpufeed::LoaderState::Deserialize(std::string_view(static_cast<const char*>(bytes), size));
  if (!st.ok()) return st.status().WithContext(l.core->name);
  const gpufeed::BatchSource& src = l.core->opened->source();
  const gpufeed::LoaderOptions o = src.sharding();
  if (gpufeed::Status fits = gpufeed::CheckStateFits(*st, src.info().num_samples, o); !fits.ok()) {
    return fits.WithContext(l.core->name);
  }
  if (auto r = gpufeed::ReshardFor(*st, o); !r.ok()) return r.status().WithContext(l.core->name);
  return st;
}

}  // namespace

extern "C" {

// ---- loader ------------------------------------------------------------------

gpufeed_loader* gpufeed_loader_open(const char* data, const gpufeed_options* options, gpufeed_error** error) {
  gpufeed_loader* out = nullptr;
  Guard(error, [&]() -> gpufeed_code {
    if (data == nullptr || options == nullptr)
      return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_loader_open: NULL argument");
    if (Status st = gpufeed::capi::CheckIntegerOptions(*options); !st.ok()) return Fail(error, st);
    gpufeed::SourceOptions so = options->source;
    so.data = data;
    auto order = gpufeed::OrderFromName(options->order);
    if (!order.ok()) return Fail(error, order.status());
    so.loader.order = *order;
    if (!options->io.empty()) {
      auto io = gpufeed::ParseIoMode(options->io);
      if (!io.ok()) return Fail(error, io.status());
      so.open.io = *io;
    }
    for (size_t at = 0; at < options->allow_paths.size();) {
      const size_t colon = std::min(options->allow_paths.find(':', at), options->allow_paths.size());
      if (colon > at) so.open.allow_paths.push_back(options->allow_paths.substr(at, colon - at));
      at = colon + 1;
    }
    auto transform = gpufeed::ImageTransformFromName(options->image_transform);
    if (!transform.ok()) return Fail(error, transform.status());
    so.decode.transform = *transform;
    auto share = gpufeed::ShareFromName(options->share);
    if (!share.ok()) return Fail(error, share.status());
    so.share = *share;
    auto core = std::make_shared<Core>();
    core->feed = options->feed;
    core->feed_options = options->feed_options;
    core->seed = so.loader.seed;
    core->pool_slots = static_cast<uint64_t>(std::max(1, so.loader.prefetch)) + 1;
    if (core->feed) {
      auto dt = gpufeed::DTypeFromName(options->dtype);
      if (!dt)
        return Fail(error, GPUFEED_INVALID_ARGUMENT,
                    "feed dtype '" + options->dtype + "': float32, float16 or bfloat16");
      core->feed_options.dtype = *dt;
      for (auto [text, field] : {std::pair{&options->layout, &core->feed_options.layout},
                                 std::pair{&options->input_layout, &core->feed_options.input_layout}}) {
        if (*text == "NCHW") {
          *field = gpufeed::Layout::kNCHW;
        } else if (*text == "NHWC") {
          *field = gpufeed::Layout::kNHWC;
        } else {
          return Fail(error, GPUFEED_INVALID_ARGUMENT, "feed layout '" + *text + "': NCHW or NHWC");
        }
      }
    }
    // Where JPEGs are decoded (encoded image datasets): the GPU's decoder
    // when asked or (auto) when the feed is on a GPU that has one.
    auto where = gpufeed::DecodeDeviceFromName(options->decode);
    if (!where.ok()) return Fail(error, where.status());
    auto placed = gpufeed::PlaceDecode(*where, core->feed && !core->feed_options.force_cpu, core->feed_options.device);
    if (!placed.ok()) {
      return Fail(error, GPUFEED_UNSUPPORTED,
                  "decode=\"gpu\": " + placed.status().message() +
                      " (it needs device=\"cuda\" and libnvjpeg; decode=\"auto\" falls back to the CPU)");
    }
    so.loader.defer_decode = placed->defer;
    so.loader.balance_decode = placed->balance;
    core->feed_options.skip_corrupt = so.decode.skip_corrupt;
    auto opened = gpufeed::OpenBatchSource(so);
    if (!opened.ok()) return Fail(error, opened.status());
    core->opened = std::move(*opened);
    if (core->opened->encoded() == nullptr) {
      core->decode = core->opened->remote() ? "server" : "none";
    } else {
      core->decode = placed->Describe();
    }
    const auto& info = core->opened->source().info();
    core->name = info.name;
    core->dtype_name = std::string(gpufeed::DTypeName(info.dtype));
    core->sample_shape = info.sample_shape;
    if (info.pool_slots > 0) core->pool_slots = info.pool_slots;  // the source's own count (a daemon's pool)
    if (core->feed) {
      // What the first batch would refuse, refused now (a uint32 dataset
      // with dtype float32 on the CPU: 3.8 s later, worded for the GPU).
      if (Status st = gpufeed::CheckFeedInput(info, core->feed_options); !st.ok()) return Fail(error, st);
    }
    if (core->feed && info.encoded_batches) {
      // JPEGs for the feed's decode stage: epoch 0's feeder starts now (its
      // worker makes the GPU's decoder and fills the first upload while
      // the caller builds its model); the first start of epoch 0 takes it.
      auto warm = MakeFeed(*core, 0, 0);
      if (!warm.ok()) return Fail(error, warm.status());
      core->warm_feed = std::move(*warm);
    } else {
      // The batch buffers and epoch 0's plan, made while the caller builds
      // its model (pinned buffers of large samples take seconds: issue 30).
      core->opened->source().Warm();
    }
    out = new gpufeed_loader{std::move(core)};
    return GPUFEED_OK;
  });
  return out;
}

void gpufeed_loader_destroy(gpufeed_loader* l) {
  if (l == nullptr) return;
  try {
    // The handle's reference goes; batches still held keep the Core (and
    // its pipeline, parked on a full pool) until they are released.
    {
      gpufeed::MutexLock lock(&l->core->interrupt_mu);  // an interrupt may be reaching the stream
      l->core->stream.reset();
    }
    delete l;  // the lock is the Core's: released before the Core may go
  } catch (...) {
    // Nothing a destroy call can report; the Core's destructor does not throw.
  }
}

const char* gpufeed_loader_name(const gpufeed_loader* l) { return l->core->name.c_str(); }
uint64_t gpufeed_loader_num_samples(const gpufeed_loader* l) { return l->core->opened->source().info().num_samples; }
uint64_t gpufeed_loader_num_batches(const gpufeed_loader* l) { return l->core->opened->num_batches(); }
uint64_t gpufeed_loader_batch_size(const gpufeed_loader* l) { return l->core->opened->source().info().batch_size; }
int gpufeed_loader_sample_ndim(const gpufeed_loader* l) { return static_cast<int>(l->core->sample_shape.size()); }
uint64_t gpufeed_loader_sample_dim(const gpufeed_loader* l, int i) {
  const auto& s = l->core->sample_shape;
  return i >= 0 && static_cast<size_t>(i) < s.size() ? s[static_cast<size_t>(i)] : 0;
}
const char* gpufeed_dtype_name_of_dlpack(uint8_t code, uint8_t bits) {
  const auto t = gpufeed::DTypeFromDlpack(code, bits);
  return t ? gpufeed::DTypeName(*t).data() : nullptr;
}

const char* gpufeed_loader_dtype(const gpufeed_loader* l) { return l->core->dtype_name.c_str(); }
int gpufeed_loader_has_labels(const gpufeed_loader* l) { return l->core->opened->source().info().has_labels ? 1 : 0; }
const char* gpufeed_loader_share(const gpufeed_loader* l) { return l->core->opened->node_shared() ? "node" : "none"; }
const char* gpufeed_loader_decode(const gpufeed_loader* l) { return l->core->decode.c_str(); }
int gpufeed_loader_started_node_server(const gpufeed_loader* l) {
  return l->core->opened->started_node_server() ? 1 : 0;
}
int gpufeed_loader_on_gpu(const gpufeed_loader* l) {
  const auto& fs = l->core->feed_state;
  return fs && fs->feeder->on_gpu() ? 1 : 0;
}

gpufeed_code gpufeed_loader_start_epoch(gpufeed_loader* l, uint64_t epoch, uint64_t start_batch,
                                        gpufeed_error** error) {
  return Guard(error, [&] {
    // An epoch of its own, not a resumed one (SetReshard may stop the
    // running stream: nothing waits in it, this is the consumer's thread).
    l->core->opened->source().SetReshard({});
    l->core->resumed = false;
    return StartEpoch(*l->core, epoch, start_batch, error);
  });
}

gpufeed_code gpufeed_loader_next(gpufeed_loader* l, int timeout_ms, gpufeed_batch** batch, gpufeed_error** error) {
  if (batch != nullptr) *batch = nullptr;
  return Guard(error, [&]() -> gpufeed_code {
    Core& c = *l->core;
    if (batch == nullptr) return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_loader_next: NULL batch");
    if (!c.started) {
      return Fail(error, GPUFEED_INVALID_ARGUMENT, c.name + ": no epoch started (gpufeed_loader_start_epoch)");
    }
    if (c.next_started) return GPUFEED_END;    // the live stream is the next epoch's, not yet started
    if (c.feed ? !c.feed_state : !c.stream) {  // the last start failed before its stream existed
      return Fail(error, GPUFEED_INVALID_ARGUMENT,
                  c.name + ": the last gpufeed_loader_start_epoch failed (its error said why); start an epoch again");
    }
    const auto timeout = timeout_ms < 0 ? std::chrono::milliseconds::max() : std::chrono::milliseconds(timeout_ms);
    if (!c.feed && c.held_host.load() >= c.pool_slots) {
      // No batch can be assembled until the consumer gives one back: say
      // so rather than wait forever.
      return Fail(error, GPUFEED_INVALID_ARGUMENT,
                  c.name + ": the consumer holds all " + std::to_string(c.pool_slots) +
                      " batches of the pool (prefetch + 1); free batches (their tensors) before asking for "
                      "more, or raise prefetch (LoaderOptions::prefetch)");
    }
    Fetched f;
    gpufeed::WaitResult waited = gpufeed::WaitResult::kReady;
    if (c.feed) {
      std::lock_guard<std::mutex> lock(c.feed_state->mu);
      auto r = c.feed_state->feeder->NextFor(timeout);
      if (!r.ok()) {
        f.status = r.status();
      } else {
        waited = r->wait;
        if (r->batch) {
          f.device = std::move(*r->batch);
          f.feed = c.feed_state;
        }
      }
    } else {
      auto r = c.stream->NextFor(timeout);
      if (!r.ok()) {
        f.status = r.status();
      } else {
        waited = r->wait;
        if (r->batch) f.host = std::move(*r->batch);
      }
    }
    if (waited == gpufeed::WaitResult::kTimeout) return GPUFEED_TIMEOUT;
    if (waited == gpufeed::WaitResult::kInterrupted) return GPUFEED_INTERRUPTED;
    if (!f.status.ok()) return Fail(error, f.status);  // the consumer holding every slot can continue
    if (!f.host && !f.device) {
      c.ended = true;
      StartNextEpochEarly(c);
      return GPUFEED_END;
    }
    ++c.delivered;
    *batch = MakeBatch(l->core, std::move(f));
    return GPUFEED_OK;
  });
}

void gpufeed_loader_interrupt(gpufeed_loader* l) {
  if (l == nullptr) return;
  gpufeed::MutexLock lock(&l->core->interrupt_mu);
  l->core->InterruptLive();
}

void gpufeed_loader_position(const gpufeed_loader* l, uint64_t* epoch, uint64_t* next_batch) {
  if (epoch != nullptr) *epoch = l->core->epoch;
  if (next_batch != nullptr) *next_batch = l->core->Position();
}

gpufeed_code gpufeed_loader_save_state(const gpufeed_loader* l, void** bytes, size_t* size, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    gpufeed::LoaderState st;
    st.seed = l->core->seed;
    st.epoch = l->core->epoch;
    st.next_batch = l->core->Position();
    const gpufeed::BatchSource& src = l->core->opened->source();
    gpufeed::DescribeShard(src.info().num_samples, src.sharding(), &st);
    const std::string s = st.Serialize();
    void* p = std::malloc(s.size());
    if (p == nullptr) return Fail(error, GPUFEED_INTERNAL, "gpufeed_loader_save_state: out of memory");
    std::memcpy(p, s.data(), s.size());
    *bytes = p;
    *size = s.size();
    return GPUFEED_OK;
  });
}

gpufeed_code gpufeed_loader_check_state(const gpufeed_loader* l, const void* bytes, size_t size,
                                        gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    if (l == nullptr) return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_loader_check_state: NULL loader");
    auto st = StateFor(*l, bytes, size);
    return st.ok() ? GPUFEED_OK : Fail(error, st.status());
  });
}

gpufeed_code gpufeed_loader_restore_state(gpufeed_loader* l, const void* bytes, size_t size, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    auto st = StateFor(*l, bytes, size);
    if (!st.ok()) return Fail(error, st.status());
    // At another world size: the epoch's samples its ranks had not
    // received, split among this run's (gpufeed/loader.h, Resharding).
    // A warm feeder made at open goes first: the reshard may stop the
    // loader's stream its worker reads.
    l->core->warm_feed.reset();
    auto start = l->core->opened->source().PrepareResume(*st);
    if (!start.ok()) return Fail(error, start.status().WithContext(l->core->name));
    // An epoch started early is not taken: the reshard may have stopped its
    // stream, and the start below makes the resumed epoch's anew.
    l->core->next_started = false;
    l->core->resumed = true;
    return StartEpoch(*l->core, st->epoch, *start, error);
  });
}

gpufeed_code gpufeed_loader_stats_json(gpufeed_loader* l, char** json, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    Core& c = *l->core;
    // The ended epoch's while the next one runs ahead of its start.
    *json = CopyString(c.next_started ? c.ended_stats : StatsJson(c));
    if (*json == nullptr) return Fail(error, GPUFEED_INTERNAL, "gpufeed_loader_stats_json: out of memory");
    return GPUFEED_OK;
  });
}

}  // extern "C"
