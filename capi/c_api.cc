// The C API (include/gpufeed/c_api.h) over the C++ library: handles, error
// objects and DLPack export. Its options are capi/options.cc.
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
// from any thread through Core::interrupt_mu. Batch releases come from any thread: host slots go back through the
// thread-safe BatchPool; device slots through GpuFeeder::ReleaseSlot, which
// is not thread-safe, so every feeder call holds its FeedState's mutex.
#include "gpufeed/c_api.h"
#include "capi/c_api_internal.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "gpu/device_ops.h"
#include "gpufeed/dtype.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"
#include "gpufeed/open_source.h"
#include "gpufeed/status.h"
#include "gpufeed/version.h"

using gpufeed::Batch;
using gpufeed::DeviceBatch;
using gpufeed::DType;
using gpufeed::Status;

using gpufeed::capi::Fail;
using gpufeed::capi::Guard;

namespace {

// DLPack's type of a dtype: the dtype table's (gpufeed/dtype.h).
DLDataType DlType(DType t) {
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
// The stream callback: no CUDA call here (cudaLaunchHostFunc's rule); the
// pool's Release only takes its mutex.
void RunPendingRelease(void* p) {
  std::unique_ptr<PendingRelease> r(static_cast<PendingRelease*>(p));
  std::shared_ptr<DeferredReleases> gate = r->gate;
  r.reset();  // the slot goes back to its pool
  {
    gpufeed::MutexLock lock(&gate->mu);
    --gate->pending;
  }
  gate->cv.SignalAll();
}
constexpr auto kDeferredReleaseWait = std::chrono::seconds(30);

// What one fetch produced.
struct Fetched {
  Status status;
  std::optional<Batch> host;
  std::optional<DeviceBatch> device;
  std::shared_ptr<FeedState> feed;  // the feeder `device` came from
};

}  // namespace

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

struct gpufeed_loader {
  std::shared_ptr<Core> core;
};

namespace {

struct Array {
  const char* name;
  void* data;
  DLDataType dtype;
  std::vector<int64_t> shape;
};

}  // namespace

struct gpufeed_batch {
  std::atomic<int> refs{1};  // the handle + every live exported tensor
  std::shared_ptr<Core> core;
  std::shared_ptr<FeedState> feed;
  std::optional<Batch> host;
  std::optional<DeviceBatch> device;
  std::atomic<void*> release_stream{nullptr};
  std::atomic<bool> host_release_stream{false};  // set for a host batch: release after the stream
  uint64_t epoch = 0, index = 0, size = 0;
  DLDevice dl_device{kDLCPU, 0};
  std::vector<Array> arrays;

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
    auto r = std::make_unique<PendingRelease>(PendingRelease{std::move(*host), core->deferred});
    host.reset();
    {
      gpufeed::MutexLock lock(&core->deferred->mu);
      ++core->deferred->pending;
    }
    bool launched = false;
    try {
      launched = ops->LaunchHostFunc(gpufeed::gpu::StreamRef{stream}, RunPendingRelease, r.get()).ok();
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
    RunPendingRelease(r.release());
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

namespace {

struct Export {
  DLManagedTensor tensor;
  std::vector<int64_t> shape;
  gpufeed_batch* batch;
};

void DeleteExport(DLManagedTensor* t) {
  auto* e = static_cast<Export*>(t->manager_ctx);
  gpufeed_batch* b = e->batch;
  delete e;
  b->Unref();
}

gpufeed_batch* MakeBatch(const std::shared_ptr<Core>& core, Fetched f) {
  auto* b = new gpufeed_batch();
  b->core = core;
  if (f.host) {
    const Batch& h = *f.host;
    b->epoch = h.epoch();
    b->index = h.index();
    b->size = h.size();
    std::vector<int64_t> shape{static_cast<int64_t>(h.size())};
    for (uint64_t d : h.sample_shape()) shape.push_back(static_cast<int64_t>(d));
    const auto& info = core->opened->source().info();
    const DType dt = info.dtype;
    // Named fields (a FieldSource): one array per field, by its name.
    const bool named = info.fields.size() > 1 || (info.fields.size() == 1 && !info.fields[0].path.empty());
    if (named) {
      for (size_t f = 0; f < info.fields.size(); ++f) {
        const gpufeed::FieldInfo& fi = info.fields[f];
        std::vector<int64_t> fshape{static_cast<int64_t>(h.size())};
        for (uint64_t d : fi.sample_shape) fshape.push_back(static_cast<int64_t>(d));
        b->arrays.push_back({fi.name.c_str(), const_cast<std::byte*>(h.field(f).data()), DlType(fi.dtype), fshape});
      }
    } else {
      b->arrays.push_back({"images", const_cast<std::byte*>(h.images().data()), DlType(dt), shape});
    }
    if (!h.labels().empty()) {
      b->arrays.push_back(
          {"labels", const_cast<int64_t*>(h.labels().data()), DlType(DType::kInt64), {static_cast<int64_t>(h.size())}});
    }
    // Global sample indices (uint64 in the pool, < 2^63): int64, the type
    // every DLPack consumer takes.
    b->arrays.push_back({"indices",
                         const_cast<uint64_t*>(h.indices().data()),
                         DlType(DType::kInt64),
                         {static_cast<int64_t>(h.size())}});
    b->host = std::move(f.host);
    core->held_host.fetch_add(1, std::memory_order_relaxed);
  } else {
    DeviceBatch& d = *f.device;
    const auto& info = core->opened->source().info();
    const int64_t n = d.size();
    b->epoch = core->epoch;
    b->index = d.index();
    b->size = static_cast<uint64_t>(n);
    // One array per field as the feeder delivers it: the image ("images" for
    // a source of /images) transformed, then a source's later named fields (a
    // class as the labels, masks cropped with the image, others as stored).
    const std::vector<gpufeed::FeedField>& fields = f.feed->feeder->fields();
    for (size_t i = 0; i < fields.size(); ++i) {
      std::vector<int64_t> shape{n};
      for (uint64_t dim : fields[i].sample_shape) shape.push_back(static_cast<int64_t>(dim));
      b->arrays.push_back({fields[i].name.c_str(), const_cast<void*>(d.field(i)), DlType(fields[i].dtype), shape});
    }
    // The source's labels, unless a class field took their place.
    const bool class_field = std::any_of(fields.begin(), fields.end(), [](const gpufeed::FeedField& x) {
      return x.role == gpufeed::FeedFieldRole::kClass;
    });
    if (info.has_labels && !class_field) {
      b->arrays.push_back({"labels",
                           const_cast<void*>(d.labels()),
                           DlType(core->feed_options.labels_int32 ? DType::kInt32 : DType::kInt64),
                           {n}});
    }
    if (d.ready_event() != nullptr) b->dl_device = {kDLCUDA, core->feed_options.device};
    b->feed = std::move(f.feed);
    b->device = std::move(f.device);
  }
  return b;
}

gpufeed_code StartEpoch(Core& c, uint64_t epoch, uint64_t start_batch, gpufeed_error** error) {
  std::shared_ptr<FeedState> old_feed;
  {
    gpufeed::MutexLock lock(&c.interrupt_mu);
    old_feed = std::move(c.feed_state);
  }
  c.epoch = epoch;
  c.start_batch = start_batch;
  c.delivered = 0;
  c.ended = false;
  c.started = true;
  // GPUFEED_FEED_RESTART=0 makes a new feeder every epoch, as before
  // Restart existed: the benchmarks' A/B switch (scripts/gpu-host-node).
  static const bool restart = [] {
    const char* v = std::getenv("GPUFEED_FEED_RESTART");
    return v == nullptr || std::string_view(v) != "0";
  }();
  if (restart && c.feed && old_feed && !old_feed->feeder->fields().empty()) {
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
    auto st = std::make_shared<FeedState>();
    st->feeder = std::make_unique<gpufeed::GpuFeeder>(c.opened->source(), c.feed_options, epoch, start_batch);
    if (st->feeder->on_gpu() && !c.device_ops) {
      auto ops = gpufeed::gpu::MakeCudaOps(c.feed_options.device);
      if (!ops.ok()) return Fail(error, ops.status());
      c.device_ops = std::move(*ops);
    }
    gpufeed::MutexLock lock(&c.interrupt_mu);
    c.feed_state = std::move(st);
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

}  // namespace

extern "C" {

const char* gpufeed_version(void) { return GPUFEED_VERSION; }
int gpufeed_c_api_version(void) { return GPUFEED_C_API_VERSION; }

gpufeed_code gpufeed_error_code(const gpufeed_error* e) { return e != nullptr ? e->code : GPUFEED_OK; }
const char* gpufeed_error_message(const gpufeed_error* e) { return e != nullptr ? e->message.c_str() : ""; }
void gpufeed_error_destroy(gpufeed_error* e) { delete e; }
void gpufeed_free(void* p) { std::free(p); }

const char* gpufeed_code_name(gpufeed_code code) {
  switch (code) {
    case GPUFEED_OK:
      return "OK";
    case GPUFEED_INVALID_ARGUMENT:
      return "InvalidArgument";
    case GPUFEED_NOT_FOUND:
      return "NotFound";
    case GPUFEED_UNSUPPORTED:
      return "Unsupported";
    case GPUFEED_CORRUPT:
      return "Corrupt";
    case GPUFEED_IO_ERROR:
      return "IOError";
    case GPUFEED_INTERNAL:
      return "Internal";
    case GPUFEED_END:
      return "End";
    case GPUFEED_TIMEOUT:
      return "Timeout";
    case GPUFEED_INTERRUPTED:
      return "Interrupted";
  }
  return "Unknown";
}

// ---- options: capi/options.cc ----------------------------------------------

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
    gpufeed::MutexLock lock(&l->core->interrupt_mu);
    l->core->stream.reset();
    delete l;
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

gpufeed_code gpufeed_loader_restore_state(gpufeed_loader* l, const void* bytes, size_t size, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    auto st = gpufeed::LoaderState::Deserialize(std::string_view(static_cast<const char*>(bytes), size));
    if (!st.ok()) return Fail(error, st.status());
    if (st->seed != l->core->seed) {
      return Fail(error, GPUFEED_INVALID_ARGUMENT,
                  l->core->name + ": saved state is for seed " + std::to_string(st->seed) + ", the loader has seed " +
                      std::to_string(l->core->seed) + " (open the loader with the run's seed)");
    }
    // At another world size: the epoch's samples its ranks had not
    // received, split among this run's (gpufeed/loader.h, Resharding).
    auto start = l->core->opened->source().PrepareResume(*st);
    if (!start.ok()) return Fail(error, start.status().WithContext(l->core->name));
    return StartEpoch(*l->core, st->epoch, *start, error);
  });
}

gpufeed_code gpufeed_loader_stats_json(gpufeed_loader* l, char** json, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    Core& c = *l->core;
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
    add("host_decode_share", s.host_decode_share);
    add("consumer_wait_seconds", s.consumer_wait_seconds);
    add("wall_seconds", s.wall_seconds);
    add("hit_rate", s.hit_rate());
    add("read_amplification", s.read_amplification());
    add("samples_per_second", s.samples_per_second());
    add("mean_queue_depth", s.mean_queue_depth());
    j += "}";
    *json = CopyString(j);
    if (*json == nullptr) return Fail(error, GPUFEED_INTERNAL, "gpufeed_loader_stats_json: out of memory");
    return GPUFEED_OK;
  });
}

// ---- batches -------------------------------------------------------------------

uint64_t gpufeed_batch_epoch(const gpufeed_batch* b) { return b->epoch; }
uint64_t gpufeed_batch_index(const gpufeed_batch* b) { return b->index; }
uint64_t gpufeed_batch_size(const gpufeed_batch* b) { return b->size; }
int gpufeed_batch_num_arrays(const gpufeed_batch* b) { return static_cast<int>(b->arrays.size()); }
const char* gpufeed_batch_array_name(const gpufeed_batch* b, int i) {
  return i >= 0 && static_cast<size_t>(i) < b->arrays.size() ? b->arrays[static_cast<size_t>(i)].name : nullptr;
}
int gpufeed_batch_find_array(const gpufeed_batch* b, const char* name) {
  for (size_t i = 0; name != nullptr && i < b->arrays.size(); ++i) {
    if (std::strcmp(b->arrays[i].name, name) == 0) return static_cast<int>(i);
  }
  return -1;
}

DLManagedTensor* gpufeed_batch_array_dlpack(gpufeed_batch* b, int i, gpufeed_error** error) {
  DLManagedTensor* out = nullptr;
  Guard(error, [&]() -> gpufeed_code {
    if (b == nullptr || i < 0 || static_cast<size_t>(i) >= b->arrays.size()) {
      return Fail(error, GPUFEED_INVALID_ARGUMENT,
                  "gpufeed_batch_array_dlpack: array " + std::to_string(i) + " of " +
                      std::to_string(b != nullptr ? b->arrays.size() : 0));
    }
    const Array& a = b->arrays[static_cast<size_t>(i)];
    auto e = std::make_unique<Export>();
    e->shape = a.shape;
    e->batch = b;
    DLTensor& t = e->tensor.dl_tensor;
    t.data = a.data;
    t.device = b->dl_device;
    t.ndim = static_cast<int>(e->shape.size());
    t.dtype = a.dtype;
    t.shape = e->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    e->tensor.manager_ctx = e.get();
    e->tensor.deleter = DeleteExport;
    b->refs.fetch_add(1, std::memory_order_relaxed);
    out = &e.release()->tensor;
    return GPUFEED_OK;
  });
  return out;
}

namespace {
// Python's capsule calls, found in the process that loaded this library
// (the interpreter exports them); null where there is no Python.
struct CapsuleCalls {
  int (*is_valid)(void*, const char*) = nullptr;
  void* (*get_pointer)(void*, const char*) = nullptr;
};
const CapsuleCalls& Capsules() {
  static const CapsuleCalls calls = [] {
    CapsuleCalls c;
    c.is_valid = reinterpret_cast<int (*)(void*, const char*)>(::dlsym(RTLD_DEFAULT, "PyCapsule_IsValid"));
    c.get_pointer = reinterpret_cast<void* (*)(void*, const char*)>(::dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer"));
    return c;
  }();
  return calls;
}
}  // namespace

int gpufeed_dlpack_capsule_destructor_available(void) {
  return Capsules().is_valid != nullptr && Capsules().get_pointer != nullptr ? 1 : 0;
}

void gpufeed_dlpack_capsule_destructor(void* capsule) {
  const CapsuleCalls& c = Capsules();
  if (capsule == nullptr || c.is_valid == nullptr || c.get_pointer == nullptr) return;
  if (c.is_valid(capsule, "dltensor") != 0) {
    gpufeed_dlpack_delete(static_cast<DLManagedTensor*>(c.get_pointer(capsule, "dltensor")));
  }
}

void gpufeed_dlpack_delete(DLManagedTensor* t) {
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
}

gpufeed_code gpufeed_batch_wait_stream(gpufeed_batch* b, void* stream, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    if (!b->device || b->device->ready_event() == nullptr) return GPUFEED_OK;
    const Status s = b->core->device_ops->StreamWait(gpufeed::gpu::StreamRef{stream},
                                                     gpufeed::gpu::EventRef{b->device->ready_event()});
    return s.ok() ? GPUFEED_OK : Fail(error, s);
  });
}

void gpufeed_batch_set_release_stream(gpufeed_batch* b, void* stream) {
  b->release_stream.store(stream);
  if (b->host) {
    try {
      b->host_release_stream.store(b->core->ReleaseOps() != nullptr);
    } catch (...) {
      // Without ops the slot is released at once, as without a stream.
    }
  }
}

void gpufeed_batch_destroy(gpufeed_batch* b) {
  if (b == nullptr) return;
  try {
    b->Unref();
  } catch (...) {
    // Release paths do not throw (BatchPool, GpuFeeder::ReleaseSlot); nothing to report here.
  }
}

}  // extern "C"
