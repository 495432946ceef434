// GpuFeeder: the upload / transform / echo state machine over DeviceOps.
//
// Two input slots on the device, each holding one super-batch (super_batch
// loader batches): while the consumer works on batches cut from one, the
// other is filled by the copy stream. An input slot yields echo x
// (batches in it) output batches; pass 0 in the loader's order, pass p > 0
// through EchoPermutation(seed, epoch, upload, p) over the whole slot.
//
// Fills: the consumer's thread fills the next slot inside Next(), except for
// a source whose batches come encoded (BatchSourceInfo::encoded_batches):
// there one fill worker, a thread for the feeder's life, runs every fill and
// the decode stage in it while the consumer works, since nvJPEG's call
// blocks its thread until the engine's work has run (about half a ResNet-18
// step beside the model). GPUFEED_FEED_FILL_WORKER=0 fills on the consumer's
// thread there too (for A/B runs).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "common/classes.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "gpu/device_ops.h"
#include "gpu/image_decoder.h"
#include "gpufeed/gpu_feed.h"

namespace gpufeed {
namespace {

constexpr int kInSlots = 2;
constexpr int kAutoEchoProbeUploads = 4;  // uploads measured before echo = 0 picks a factor
constexpr int kMaxAutoEcho = 4;

// Moves a handle DeviceOps made into *out, or returns why it was not made.
template <typename T>
Status Take(Result<T> made, T* out) {
  if (!made.ok()) return made.status();
  *out = std::move(*made);
  return Status::Ok();
}

// What the feed takes of a source, and the geometry it reads (Impl's
// fields of the same names).
struct InputGeometry {
  bool named = false;   // several named fields: the first is the image
  bool volume = false;  // rank-4 samples
  DType image_dtype = DType::kUInt8;
  std::vector<uint64_t> shape;  // the image's sample shape as stored
  int C = 0, H = 0, W = 0;      // channels and the rows and columns normalized
};

// The image's element type is one the feed converts, or the refusal is
// worded for the device asked for (the CPU twins convert too).
Status CheckInputDType(const std::string& name, DType image_dtype, const FeedOptions& o) {
  if (gpu::InputElementBytes(image_dtype) != 0) return Status::Ok();
  const std::string dtype(DTypeName(image_dtype));
  if (o.force_cpu) {
    return Status::Unsupported(name + ": converting samples to " + std::string(DTypeName(o.dtype)) +
                               " on the CPU takes uint8, uint16, int16, float16 or float32 ones; the dataset's are " +
                               dtype + " (for them as stored, read without FeedOptions::dtype, crop_padding or flip)");
  }
  return Status::Unsupported(name + ": the GPU feed (CUDA device " + std::to_string(o.device) +
                             ") takes uint8, uint16, int16, float16 or float32 samples; the dataset's are " + dtype +
                             " (read them as stored on the CPU, without FeedOptions::dtype, or convert the dataset)");
}

// The checks of a feed over `src` with options `o` that need no device: its
// input dtype and shape, channels, mean and std (taken into *options from the
// dataset's attributes where unset), crop and pool. CheckFeedInput and Init.
Status CheckInput(const BatchSourceInfo& src, FeedOptions* options, InputGeometry* g) {
  FeedOptions& o = *options;
  // Named fields: the first is the image; the others are classes, masks or
  // passed through (ClassifyFields, after the image's shape is known).
  g->named = src.fields.size() >= 2;
  const bool named = g->named;
  g->image_dtype = named ? src.fields[0].dtype : src.dtype;
  GPUFEED_RETURN_IF_ERROR(CheckInputDType(src.name, g->image_dtype, o));
  const auto& shape = named ? src.fields[0].sample_shape : src.sample_shape;
  if (shape.size() != 3 && shape.size() != 4) {
    return Status::InvalidArgument(src.name +
                                   ": the GPU feed needs [C, H, W] or [H, W, C] samples (or volumes [C, D, H, W] or "
                                   "[D, H, W, C]), got rank " +
                                   std::to_string(shape.size()));
  }
  for (uint64_t dim : shape) {
    if (dim == 0 || dim > (1ull << 30)) {
      return Status::InvalidArgument(src.name + ": a sample dimension of " + std::to_string(dim));
    }
  }
  const bool nchw = o.input_layout == Layout::kNCHW;
  g->shape = shape;
  // A volume is normalized as C planes of D x H rows: the same bytes, in
  // either layout, as a [C, D*H, W] or [D*H, W, C] image.
  g->volume = shape.size() == 4;
  const bool volume = g->volume;
  const uint64_t rows = volume ? (nchw ? shape[1] * shape[2] : shape[0] * shape[1]) : (nchw ? shape[1] : shape[0]);
  if (volume && (o.crop_padding > 0 || o.flip)) {
    return Status::InvalidArgument(src.name +
                                   ": volume samples (rank 4) are normalized but not cropped or flipped (the "
                                   "feed's augmentation is 2-D); turn crop_padding and flip off (--crop-padding 0, "
                                   "no --flip)");
  }
  if (uint64_t(shape[0]) * shape[1] * shape[2] * (volume ? shape[3] : 1) >= (1ull << 32) || rows > INT32_MAX) {
    return Status::InvalidArgument(src.name +
                                   ": samples of 2^32 elements or more (or 2^31 rows), which the feed's "
                                   "32-bit offsets cannot address");
  }
  const int C = g->C = static_cast<int>(volume ? (nchw ? shape[0] : shape[3]) : (nchw ? shape[0] : shape[2]));
  const int H = g->H = static_cast<int>(rows);
  const int W = g->W = static_cast<int>(volume ? (nchw ? shape[3] : shape[2]) : (nchw ? shape[2] : shape[1]));
  if (C > gpu::kMaxChannels) {
    return Status::Unsupported(src.name + ": " + std::to_string(C) + " channels, the feed normalizes at most " +
                               std::to_string(gpu::kMaxChannels) + " (is input_layout right?)");
  }
  if (o.mean.empty() && o.stddev.empty()) {
    // The dataset's attributes, as the local Loader or the daemon reports them.
    if (src.mean.size() == static_cast<size_t>(C) && src.stddev.size() == static_cast<size_t>(C)) {
      o.mean = src.mean;
      o.stddev = src.stddev;
      for (double& sd : o.stddev) sd = sd > 0 ? sd : 1.0;  // a constant channel: do not divide by 0
    }
  }
  if (!o.mean.empty() && o.mean.size() != static_cast<size_t>(C)) {
    return Status::InvalidArgument("feed: " + std::to_string(o.mean.size()) + " means for " + std::to_string(C) +
                                   " channels");
  }
  if (!o.stddev.empty() && o.stddev.size() != static_cast<size_t>(C)) {
    return Status::InvalidArgument("feed: " + std::to_string(o.stddev.size()) + " stds for " + std::to_string(C) +
                                   " channels");
  }
  for (double s : o.stddev) {
    if (!(s > 0)) return Status::InvalidArgument("feed: std must be > 0");
  }
  if (o.dtype != DType::kFloat32 && o.dtype != DType::kFloat16 && o.dtype != DType::kBFloat16) {
    return Status::Unsupported("feed: output dtype " + std::string(DTypeName(o.dtype)) + " (fp32, fp16 or bf16)");
  }
  if (o.echo < 0 || o.super_batch < 1 || o.slots < 1) {
    return Status::InvalidArgument("feed: echo >= 0, super_batch >= 1 and slots >= 1 required");
  }
  if (o.crop_padding < 0 || o.crop_padding >= std::min(H, W)) {
    return Status::InvalidArgument("feed: crop padding " + std::to_string(o.crop_padding) + " for " +
                                   std::to_string(H) + "x" + std::to_string(W) + " images; it must be in 0.." +
                                   std::to_string(std::min(H, W) - 1) +
                                   " (--crop-padding), or a crop could hold no image at all");
  }
  // The feeder holds the host batches of both input slots until their copies
  // are done: up to 2 x super_batch loader batches, while the loader needs a
  // free buffer to fill the next. Refused now rather than found as a hang.
  const uint64_t held = 2 * static_cast<uint64_t>(o.super_batch);
  if (src.pool_slots != 0 && src.pool_slots < held) {
    return Status::InvalidArgument("feed: super_batch " + std::to_string(o.super_batch) + " holds up to " +
                                   std::to_string(held) + " loader batches, but the loader's pool has " +
                                   std::to_string(src.pool_slots) +
                                   " (prefetch + 1); raise the loader's prefetch to at least " +
                                   std::to_string(held - 1) + " (--prefetch) or lower super_batch (--super-batch)");
  }
  return Status::Ok();
}

}  // namespace

struct GpuFeeder::Impl {
  BatchSource& loader;
  FeedOptions o;
  uint64_t epoch;
  // Reset before the next epoch's starts (Restart). Changed by the consumer
  // under stream_mu, which Interrupt() (any thread) takes to reach it.
  std::optional<EpochStream> stream;
  Mutex stream_mu;
  // Makes and frees every stream, event and buffer below: declared before
  // them, so destroyed after them (Teardown also resets it last).
  std::unique_ptr<gpu::DeviceOps> ops;
  Status init_status;
  Status error;
  bool error_returned = false;
  // Produce refused because the consumer holds every output slot: nothing
  // was taken, so the stream goes on once the consumer frees one.
  bool refused_held = false;
  Status restart_error;  // a failed Restart's, returned by the next Next()

  int C = 0, H = 0, W = 0;
  uint64_t B = 0, sample_bytes = 0;  // the image field's sample bytes
  DType image_dtype = DType::kUInt8;
  bool named = false;   // a source of several named fields
  bool volume = false;  // rank-4 image samples, normalized as [C, D*H, W]
  std::vector<uint64_t> image_shape_in;
  // Its fields after the image (fields[1..]): how each travels. A class
  // travels as the labels do (int64 staging, int32/int64 out); a mask and a
  // field passed through have device buffers of their own in every slot.
  struct Extra {
    size_t field = 0;  // index in the source's fields
    FeedFieldRole role = FeedFieldRole::kPassThrough;
    DType dtype = DType::kUInt8;  // stored
    uint64_t in_bytes = 0;        // stored bytes a sample
    uint64_t out_bytes = 0;       // delivered bytes a sample (a class: in the labels)
    gpu::MaskParams mask;         // a mask's
  };
  std::vector<Extra> extras;
  std::vector<FeedField> fields;  // what fields() reports
  int class_extra = -1;           // the class among extras, if any
  int first_mask = -1;            // the first mask among extras (DeviceBatch::mask())
  size_t out_elem = 4;
  int echo = 1;

  struct InSlot {
    gpu::DeviceBuffer images;
    std::vector<gpu::DeviceBuffer> extra;  // per extras: [super_batch x B] stored rows (empty for a class)
    gpu::DeviceBuffer labels;              // int64 [super_batch x B]
    gpu::PinnedBuffer labels_staging;      // pinned host copy source
    gpu::Event uploaded;                   // after the copy
    gpu::Event consumed;                   // after the last transform reading it
    bool consumed_recorded = false;
    std::vector<Batch> host;        // kept until the copy is done
    std::vector<uint64_t> indices;  // the samples' dataset indices, in upload order
    uint64_t samples = 0;
    uint64_t batches = 0;  // output batches per pass
    uint64_t upload_index = 0;
    // What the fill did, accounted by the consumer when it takes the slot
    // (AfterFill): so a fill on the worker writes nothing the consumer reads.
    double waited = 0;  // the fill's host wait for the loader
    uint64_t bytes = 0;
    int pass = 0;
    uint64_t next = 0;  // next output batch within the pass
    bool filled = false;
    // Returns the host batches to the loader's pool and frees the device
    // state, once no queued work uses them (Teardown).
    void Free() {
      host.clear();
      images.reset();
      extra.clear();
      labels.reset();
      labels_staging.reset();
      uploaded.reset();
      consumed.reset();
    }
  };
  struct OutSlot {
    gpu::DeviceBuffer images;
    std::vector<gpu::DeviceBuffer> extra;  // per extras: [B] delivered rows (empty for a class)
    std::vector<const void*> field_ptrs;   // per source field: what DeviceBatch::field(i) returns
    std::vector<uint64_t> indices;         // DeviceBatch::indices() of the batch it holds
    gpu::DeviceBuffer labels;
    gpu::Event ready;
    gpu::Event free_event;
    bool free_recorded = false;
    bool held = false;
    void Free() {  // as InSlot's
      images.reset();
      extra.clear();
      labels.reset();
      ready.reset();
      free_event.reset();
    }
  };
  // Declared before the slots, so that the implicit destruction order is
  // Teardown's too: the slots, then the streams, then ops.
  gpu::Stream copy_stream;
  gpu::Stream compute_stream;
  InSlot in[kInSlots];
  std::vector<OutSlot> out;
  int cur = 0;
  bool started = false, loader_done = false;
  uint64_t uploads = 0, out_index = 0;
  FeedStats st;
  double start_time = 0;
  // echo = 0: time the consumer spends between Next() calls, and waits.
  double last_return = 0, step_seconds = 0, probe_wait = 0;
  uint64_t steps = 0;

  uint64_t start_batch = 0;
  // The decode stage for batches the loader left encoded; made at the first
  // and, with the fill worker, touched only in fills.
  std::unique_ptr<gpu::ImageBatchDecoder> decoder;
  Status EnsureDecoder();
  double decode_rate = 0;  // device samples a second in Decode(), smoothed
  // The decoder's counters when this epoch started (it outlives Restart),
  // and after the last fill the consumer took (what stats() reports).
  gpu::ImageDecodeCounters decode_base, decode_counters;

  // The fill worker (encoded batches): StartFill hands it a slot, JoinFill
  // waits for it. Between the two the consumer touches neither that slot,
  // the copy stream, the loader stream's Next, the decoder nor loader_done;
  // the worker touches nothing else.
  struct FillWorker {
    Mutex mu;
    CondVar cv;
    std::thread thread;
    int slot GUARDED_BY(mu) = -1;  // to fill; -1: none asked
    bool busy GUARDED_BY(mu) = false;
    bool stop GUARDED_BY(mu) = false;
    bool interrupted GUARDED_BY(mu) = false;  // Interrupt() for the next WaitFill
    Status status GUARDED_BY(mu);
  } fw;
  bool fill_worker = false;   // fills run on fw (set in Init)
  bool fill_pending = false;  // the consumer's: StartFill without its JoinFill yet
  int fill_slot = -1;         // the consumer's: the slot of the pending fill
  void FillLoop();
  void StartFill(int k);
  Status JoinFill(double* waited);
  // NextFor's wait for the pending fill: kReady once it is done.
  WaitResult WaitFill(std::chrono::milliseconds timeout);
  void StopFillWorker();
  // Fills slot k now: on the worker (and waits for it) or here.
  Status FillNow(int k);
  // The consumer's side of a finished fill of slot k: stats, the echo probe.
  void AfterFill(int k, double waited);
  Impl(BatchSource& l, const FeedOptions& opt, uint64_t e, uint64_t start)
      : loader(l), o(opt), epoch(e), stream(l.Epoch(e, start)), start_batch(start) {}

  Status Init();
  // The epoch's counters from start_batch (a resumed epoch continues an
  // uninterrupted one's upload and output counts).
  Status StartAt(uint64_t start);
  Status Restart(uint64_t e, uint64_t start);
  Status ClassifyFields(const BatchSourceInfo& src);
  Status Fill(int k);
  Result<std::optional<DeviceBatch>> Produce(GpuFeeder* owner);
  // Whether the next Produce() pulls loader batches first (the first
  // upload, or the next one queued ahead of this one's outputs).
  bool WillPull() const;
  void Teardown();
};

Status GpuFeeder::Impl::Init() {
  const BatchSourceInfo& src = loader.info();
  InputGeometry g;
  GPUFEED_RETURN_IF_ERROR(CheckInput(src, &o, &g));
  named = g.named;
  volume = g.volume;
  image_dtype = g.image_dtype;
  image_shape_in = g.shape;
  C = g.C;
  H = g.H;
  W = g.W;
  GPUFEED_RETURN_IF_ERROR(StartAt(start_batch));
  B = src.batch_size;
  fill_worker = src.encoded_batches;
  if (const char* v = std::getenv("GPUFEED_FEED_FILL_WORKER"); v != nullptr && std::string(v) == "0") {
    fill_worker = false;
  }
  sample_bytes = named ? src.fields[0].sample_bytes : src.sample_bytes;
  out_elem = DTypeSize(o.dtype);
  GPUFEED_RETURN_IF_ERROR(ClassifyFields(src));

  if (o.force_cpu) {
    ops = gpu::MakeCpuOps();
  } else {
    auto cuda = gpu::MakeCudaOps(o.device);
    if (cuda.ok()) {
      ops = std::move(*cuda);
    } else if (cuda.status().code() == StatusCode::kUnsupported) {
      ops = gpu::MakeCpuOps();  // no GPU here: the CPU twins, documented fallback
    } else {
      return cuda.status();
    }
  }
  st.on_gpu = ops->is_gpu();
  GPUFEED_RETURN_IF_ERROR(Take(ops->NewStream(), &copy_stream));
  GPUFEED_RETURN_IF_ERROR(Take(ops->NewStream(), &compute_stream));
  const uint64_t super = B * static_cast<uint64_t>(o.super_batch);
  for (InSlot& s : in) {
    GPUFEED_RETURN_IF_ERROR(Take(ops->Alloc(super * sample_bytes), &s.images));
    s.extra.clear();
    s.extra.resize(extras.size());
    for (size_t e = 0; e < extras.size(); ++e) {
      if (extras[e].out_bytes > 0) GPUFEED_RETURN_IF_ERROR(Take(ops->Alloc(super * extras[e].in_bytes), &s.extra[e]));
    }
    GPUFEED_RETURN_IF_ERROR(Take(ops->Alloc(super * sizeof(int64_t)), &s.labels));
    GPUFEED_RETURN_IF_ERROR(Take(ops->AllocPinned(super * sizeof(int64_t)), &s.labels_staging));
    GPUFEED_RETURN_IF_ERROR(Take(ops->NewEvent(), &s.uploaded));
    GPUFEED_RETURN_IF_ERROR(Take(ops->NewEvent(), &s.consumed));
  }
  out.resize(static_cast<size_t>(o.slots));
  for (OutSlot& s : out) {
    GPUFEED_RETURN_IF_ERROR(Take(ops->Alloc(B * C * H * W * out_elem), &s.images));
    s.extra.clear();
    s.extra.resize(extras.size());
    for (size_t e = 0; e < extras.size(); ++e) {
      if (extras[e].out_bytes > 0) GPUFEED_RETURN_IF_ERROR(Take(ops->Alloc(B * extras[e].out_bytes), &s.extra[e]));
    }
    GPUFEED_RETURN_IF_ERROR(Take(ops->Alloc(B * (o.labels_int32 ? 4 : 8)), &s.labels));
    s.field_ptrs.assign(fields.size(), nullptr);
    s.field_ptrs[0] = s.images.get();
    for (size_t e = 0; e < extras.size(); ++e) {
      s.field_ptrs[extras[e].field] = extras[e].role == FeedFieldRole::kClass ? s.labels.get() : s.extra[e].get();
    }
    GPUFEED_RETURN_IF_ERROR(Take(ops->NewEvent(), &s.ready));
    GPUFEED_RETURN_IF_ERROR(Take(ops->NewEvent(), &s.free_event));
  }
  return Status::Ok();
}

Status GpuFeeder::Impl::StartAt(uint64_t start) {
  echo = o.echo == 0 ? 1 : o.echo;
  uploads = 0;
  out_index = 0;
  if (start > 0) {
    if (o.echo == 0 || start % static_cast<uint64_t>(o.super_batch) != 0) {
      return Status::InvalidArgument("feed: resuming at loader batch " + std::to_string(start) +
                                     " needs a fixed echo (not 0) and a multiple of super_batch (" +
                                     std::to_string(o.super_batch) + ")");
    }
    // Where an uninterrupted feeder would be: every earlier upload was a
    // full super-batch (only the epoch's last batch can be short), used
    // `echo` times, so the upload and output counters (which seed the echo
    // permutations and augmentation) continue from there.
    uploads = start / static_cast<uint64_t>(o.super_batch);
    out_index = start * static_cast<uint64_t>(echo);
  }
  return Status::Ok();
}

Status GpuFeeder::Impl::Restart(uint64_t e, uint64_t start) {
  if (!init_status.ok()) return init_status;
  GPUFEED_RETURN_IF_ERROR(ops->BindThread());  // the caller's thread queues work here too (Next says why)
  // A fill the worker runs reads the old stream into a slot: done (and
  // dropped, its batches back to the pool below) before either is reset.
  if (fill_pending) (void)JoinFill(nullptr);
  {
    MutexLock lock(&fw.mu);
    fw.interrupted = false;  // as the old stream's interrupt goes with it
  }
  // What is queued reads the input slots (and their loader batches) and
  // writes output slots: done before either is used again.
  GPUFEED_RETURN_IF_ERROR(ops->StreamSync(compute_stream.ref()));
  GPUFEED_RETURN_IF_ERROR(ops->StreamSync(copy_stream.ref()));
  for (InSlot& s : in) {
    s.host.clear();  // back to the loader's pool before its next epoch takes it
    s.consumed_recorded = false;
    s.samples = s.batches = s.upload_index = s.next = s.bytes = 0;
    s.waited = 0;
    s.pass = 0;
    s.filled = false;
  }
  {
    MutexLock lock(&stream_mu);
    stream.reset();
  }
  epoch = e;
  start_batch = start;
  {
    EpochStream next = loader.Epoch(e, start);
    MutexLock lock(&stream_mu);
    stream.emplace(std::move(next));
  }
  cur = 0;
  started = loader_done = false;
  error = Status::Ok();
  error_returned = false;
  restart_error = Status::Ok();
  last_return = step_seconds = probe_wait = 0;
  steps = 0;
  FeedStats fresh;
  fresh.on_gpu = st.on_gpu;
  fresh.decoder = st.decoder;
  st = fresh;
  if (decoder) decode_base = decode_counters = decoder->counters();
  return StartAt(start);
}

// How each named field after the image travels (FeedOptions::mask_fill's
// comment is the contract): the first integer one-a-sample field is the
// class (in place of the source's labels), an integer field of the image's pixels a
// mask, anything else passed through as stored, unless it has the image's
// pixels and would come out unaligned with a cropped or flipped image.
Status GpuFeeder::Impl::ClassifyFields(const BatchSourceInfo& src) {
  const bool augment = o.crop_padding > 0 || o.flip;
  const DType index_type = o.labels_int32 ? DType::kInt32 : DType::kInt64;
  FeedField image;
  image.name = src.fields.empty() ? "images" : src.fields[0].name;  // "images" for a source of /images
  image.role = FeedFieldRole::kImage;
  image.dtype = o.dtype;
  // The stored sample's dimensions in the output layout (a volume's D, H, W
  // stay apart).
  const bool same_layout = o.layout == o.input_layout;
  const auto& in = image_shape_in;
  const size_t r = in.size();
  if (same_layout) {
    image.sample_shape = in;
  } else if (o.input_layout == Layout::kNCHW) {  // [C, ...spatial] -> [...spatial, C]
    image.sample_shape.assign(in.begin() + 1, in.end());
    image.sample_shape.push_back(in[0]);
  } else {  // [...spatial, C] -> [C, ...spatial]
    image.sample_shape.push_back(in[r - 1]);
    image.sample_shape.insert(image.sample_shape.end(), in.begin(), in.end() - 1);
  }
  fields.push_back(image);
  if (!named) return Status::Ok();
  for (size_t j = 1; j < src.fields.size(); ++j) {
    const FieldInfo& f = src.fields[j];
    const auto& ms = f.sample_shape;
    // A mask is aligned with 2-D images only; a volume is never cropped.
    const bool pixels =
        !volume && ms.size() >= 2 && ms[ms.size() - 2] == uint64_t(H) && ms[ms.size() - 1] == uint64_t(W);
    const bool one_per_sample = ms.empty() || (ms.size() == 1 && ms[0] == 1);
    Extra x;
    x.field = j;
    x.dtype = f.dtype;
    x.in_bytes = f.sample_bytes;
    FeedField out;
    out.name = f.name;
    if (DTypeIsInteger(f.dtype) && one_per_sample && class_extra < 0) {
      x.role = FeedFieldRole::kClass;
      class_extra = static_cast<int>(extras.size());
      out.dtype = index_type;
    } else if (gpu::MaskElementBytes(f.dtype) != 0 && pixels && ms.size() <= 3) {
      x.role = FeedFieldRole::kMask;
      x.mask.in_dtype = f.dtype;
      x.mask.planes = ms.size() == 3 ? static_cast<int>(ms[0]) : 1;
      x.mask.out_int64 = !o.labels_int32;
      x.mask.fill = o.mask_fill;
      x.out_bytes = uint64_t(x.mask.planes) * H * W * DTypeSize(index_type);
      if (first_mask < 0) first_mask = static_cast<int>(extras.size());
      out.dtype = index_type;
      out.sample_shape = ms;
    } else if (pixels && augment) {
      return Status::Unsupported(src.name + ": field '" + f.name + "' (" + std::string(DTypeName(f.dtype)) +
                                 ") has the image's " + std::to_string(H) + " x " + std::to_string(W) +
                                 " pixels but is no integer mask ([H, W] or [P, H, W] of int8..int64, uint8..uint32), "
                                 "so the feed cannot crop or flip it with the image; turn crop_padding and flip off "
                                 "(--crop-padding 0, no --flip) to take it as stored, or read it from the loader's "
                                 "host batches (Batch::field)");
    } else {
      x.role = FeedFieldRole::kPassThrough;
      x.out_bytes = x.in_bytes;
      out.dtype = f.dtype;
      out.sample_shape = ms;
    }
    if (x.in_bytes == 0) {
      return Status::InvalidArgument(src.name + ": field '" + f.name + "' has empty samples");
    }
    out.role = x.role;
    extras.push_back(x);
    fields.push_back(std::move(out));
  }
  return Status::Ok();
}

Status GpuFeeder::Impl::EnsureDecoder() {
  if (decoder) return Status::Ok();
  if (volume || C != 3 || image_dtype != DType::kUInt8) {
    return Status::Internal("feed: encoded batches of a source that is no 3-channel uint8 image");
  }
  gpu::ImageDecodeShape shape;
  shape.height = H;
  shape.width = W;
  shape.nchw = o.input_layout == Layout::kNCHW;
  shape.skip_corrupt = o.skip_corrupt;
  shape.source = loader.info().name;
  shape.logger = o.logger;
  if (!ops->is_gpu()) {
    decoder = gpu::MakeCpuImageDecoder(shape);
  } else {
    auto d = gpu::MakeNvjpegDecoder(shape, o.device, ops.get());
    if (!d.ok()) {
      return d.status().WithContext(
          "feed: the loader left JPEGs encoded for the GPU's decoder, which is not available (decode=\"cpu\" "
          "decodes them in the loader's threads)");
    }
    decoder = std::move(*d);
  }
  return Status::Ok();
}

void GpuFeeder::Impl::FillLoop() {
  // CUDA's current device is per thread.
  const Status bound = ops->BindThread();
  fw.mu.Lock();
  for (;;) {
    while (!fw.stop && fw.slot < 0) fw.cv.Wait(&fw.mu);
    if (fw.slot < 0) break;  // stopped, nothing asked
    const int k = std::exchange(fw.slot, -1);
    fw.mu.Unlock();
    Status done = bound.ok() ? Fill(k) : bound;
    fw.mu.Lock();
    fw.status = std::move(done);
    fw.busy = false;
    fw.cv.SignalAll();
  }
  fw.mu.Unlock();
}

void GpuFeeder::Impl::StartFill(int k) {
  MutexLock lock(&fw.mu);
  if (!fw.thread.joinable()) fw.thread = std::thread([this] { FillLoop(); });
  fw.slot = k;
  fw.busy = true;
  fill_pending = true;
  fill_slot = k;
  fw.cv.SignalAll();
}

Status GpuFeeder::Impl::JoinFill(double* waited) {
  const double t0 = NowSeconds();
  MutexLock lock(&fw.mu);
  while (fw.busy) fw.cv.Wait(&fw.mu);
  fill_pending = false;
  fill_slot = -1;
  if (waited != nullptr) *waited = NowSeconds() - t0;
  return std::exchange(fw.status, Status::Ok());
}

WaitResult GpuFeeder::Impl::WaitFill(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&fw.mu);
  while (fw.busy && !fw.interrupted) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    (void)fw.cv.WaitFor(&fw.mu, left);
  }
  if (fw.interrupted) {
    fw.interrupted = false;
    return WaitResult::kInterrupted;
  }
  return fw.busy ? WaitResult::kTimeout : WaitResult::kReady;
}

void GpuFeeder::Impl::StopFillWorker() {
  {
    MutexLock lock(&fw.mu);
    while (fw.busy) fw.cv.Wait(&fw.mu);
    fw.stop = true;
    fw.cv.SignalAll();
  }
  if (fw.thread.joinable()) fw.thread.join();
}

Status GpuFeeder::Impl::FillNow(int k) {
  double waited = 0;
  if (fill_worker) {
    if (!fill_pending) StartFill(k);
    GPUFEED_RETURN_IF_ERROR(JoinFill(&waited));
  } else {
    GPUFEED_RETURN_IF_ERROR(Fill(k));
    waited = in[k].waited;
  }
  AfterFill(k, waited);
  return Status::Ok();
}

void GpuFeeder::Impl::AfterFill(int k, double waited) {
  InSlot& s = in[k];
  if (decoder) {
    decode_counters = decoder->counters();
    st.decoder = decoder->name();
  }
  // The consumer's wait: for the loader in its own fill; with the worker,
  // for the worker's fill (whose decode and loader wait overlap the
  // consumer's work).
  st.data_wait_seconds += waited;
  st.bytes_uploaded += s.bytes;
  s.bytes = 0;
  if (!s.filled) return;
  st.uploads = uploads;
  if (o.echo == 0 && uploads <= kAutoEchoProbeUploads) {
    probe_wait += waited;
    if (uploads == kAutoEchoProbeUploads && steps > 0) {
      // Echo enough that the GPU's work per upload covers the wait for the
      // next one: e ~ (wait + step) / step, per loader batch.
      const double step = step_seconds / static_cast<double>(steps);
      const double wait = probe_wait / static_cast<double>(uploads * o.super_batch);
      echo = std::clamp(static_cast<int>(std::ceil((wait + step) / std::max(step, 1e-6))), 1, kMaxAutoEcho);
    }
  }
}

// Fills input slot k with the next super-batch: waits (on the device) until
// its last reader is done, pulls loader batches (the host may wait here: that
// is the data wait), queues their copies and records `uploaded`.
Status GpuFeeder::Impl::Fill(int k) {
  InSlot& s = in[k];
  s.filled = false;
  s.waited = 0;
  if (loader_done) return Status::Ok();
  if (s.consumed_recorded) {
    GPUFEED_RETURN_IF_ERROR(ops->StreamWait(copy_stream.ref(), s.consumed.ref()));
    s.consumed_recorded = false;
  }
  if (!s.host.empty()) {  // their copies finished long ago; make it certain
    GPUFEED_RETURN_IF_ERROR(ops->EventSync(s.uploaded.ref()));
    s.host.clear();  // back to the loader's pool
  }
  s.samples = 0;
  s.indices.clear();
  const double t0 = NowSeconds();
  double decoding = 0;
  for (int t = 0; t < o.super_batch; ++t) {
    auto r = stream->Next();
    if (!r.ok()) return r.status();
    if (!r->has_value()) {
      loader_done = true;
      break;
    }
    Batch b = std::move(**r);
    const uint64_t n = b.size();
    // Labels first: a decode stage may rewrite a replaced sample's.
    auto* staging = static_cast<int64_t*>(s.labels_staging.get()) + s.samples;
    if (class_extra >= 0) {
      const Extra& x = extras[static_cast<size_t>(class_extra)];
      GPUFEED_RETURN_IF_ERROR(ClassesToInt64(b.field(x.field), x.dtype, n, staging));
    } else if (b.labels().empty()) {
      std::fill(staging, staging + n, int64_t{-1});
    } else {
      std::memcpy(staging, b.labels().data(), n * sizeof(int64_t));
    }
    if (!b.encoded().empty()) {
      // Left encoded by the loader: the decode stage writes the samples.
      GPUFEED_RETURN_IF_ERROR(EnsureDecoder());
      const double d0 = NowSeconds();
      const uint64_t on_device = decoder->counters().device_samples;
      GPUFEED_RETURN_IF_ERROR(decoder->Decode(b, static_cast<uint8_t*>(s.images.get()) + s.samples * sample_bytes,
                                              staging, copy_stream.ref()));
      const double took = NowSeconds() - d0;
      decoding += took;  // not a wait for the loader
      // The device decoder's rate, for the loader's share
      // (LoaderOptions::balance_decode): smoothed over batches.
      if (const uint64_t m = decoder->counters().device_samples - on_device; m > 0 && took > 0) {
        const double rate = double(m) / took;
        decode_rate = decode_rate > 0 ? 0.7 * decode_rate + 0.3 * rate : rate;
        loader.ReportDeviceDecodeRate(decode_rate);
      }
      for (const EncodedSample& e : b.encoded()) s.bytes += e.bytes ? e.bytes : sample_bytes;
      s.samples += n;
      s.indices.insert(s.indices.end(), b.indices().begin(), b.indices().end());
      s.host.push_back(std::move(b));
      continue;
    }
    // Named fields are planar in the batch: each field is copied whole.
    const std::byte* image = named ? b.field(0).data() : b.images().data();
    GPUFEED_RETURN_IF_ERROR(ops->CopyToDevice(static_cast<std::byte*>(s.images.get()) + s.samples * sample_bytes, image,
                                              n * sample_bytes, copy_stream.ref()));
    for (size_t e = 0; e < extras.size(); ++e) {
      const Extra& x = extras[e];
      if (x.out_bytes == 0) continue;  // the class: staged with the labels
      GPUFEED_RETURN_IF_ERROR(ops->CopyToDevice(static_cast<std::byte*>(s.extra[e].get()) + s.samples * x.in_bytes,
                                                b.field(x.field).data(), n * x.in_bytes, copy_stream.ref()));
      s.bytes += n * x.in_bytes;
    }
    s.bytes += n * sample_bytes;
    s.samples += n;
    s.indices.insert(s.indices.end(), b.indices().begin(), b.indices().end());
    s.host.push_back(std::move(b));
  }
  s.waited = NowSeconds() - t0 - decoding;
  if (s.samples == 0) return Status::Ok();
  GPUFEED_RETURN_IF_ERROR(
      ops->CopyToDevice(s.labels.get(), s.labels_staging.get(), s.samples * sizeof(int64_t), copy_stream.ref()));
  GPUFEED_RETURN_IF_ERROR(ops->Record(copy_stream.ref(), s.uploaded.ref()));
  s.batches = (s.samples + B - 1) / B;
  s.pass = 0;
  s.next = 0;
  s.upload_index = uploads++;
  s.filled = true;
  return Status::Ok();
}

bool GpuFeeder::Impl::WillPull() const {
  if (!init_status.ok() || !restart_error.ok() || !error.ok() || !stream || loader_done) return false;
  return !started || (!in[1 - cur].filled && in[cur].filled);
}

// long: not split yet (issue 47, item 6): the feed's producer loop (only a GPU host can test a split)
Result<std::optional<DeviceBatch>> GpuFeeder::Impl::Produce(GpuFeeder* owner) {
  if (!started) {
    started = true;
    start_time = NowSeconds();
    cur = 0;
    GPUFEED_RETURN_IF_ERROR(FillNow(0));  // with the worker: started when made (or restarted)
  } else if (fill_worker) {
    // The slot switched to last time may still be filling: take it.
    if (fill_pending && fill_slot == cur) GPUFEED_RETURN_IF_ERROR(FillNow(cur));
  } else if (!in[1 - cur].filled && !loader_done && in[cur].filled) {
    // Queue the next upload now: the consumer's work on the previous batch
    // is already on the GPU, so this host-side wait overlaps it.
    GPUFEED_RETURN_IF_ERROR(FillNow(1 - cur));
  }
  InSlot* s = &in[cur];
  if (!s->filled) return std::optional<DeviceBatch>();
  // Pick an output slot the consumer does not hold.
  int slot = -1;
  for (int t = 0; t < static_cast<int>(out.size()); ++t) {
    const int c = static_cast<int>((out_index + t) % out.size());
    if (!out[c].held) {
      slot = c;
      break;
    }
  }
  if (slot < 0) {
    refused_held = true;
    return Status::InvalidArgument("feed: the consumer holds all " + std::to_string(out.size()) +
                                   " output slots; release batches (or raise FeedOptions::slots)");
  }
  OutSlot& os = out[slot];
  GPUFEED_RETURN_IF_ERROR(ops->StreamWait(compute_stream.ref(), s->uploaded.ref()));
  if (os.free_recorded) GPUFEED_RETURN_IF_ERROR(ops->StreamWait(compute_stream.ref(), os.free_event.ref()));

  gpu::TransformParams p;
  p.channels = C;
  p.height = H;
  p.width = W;
  p.in_layout = o.input_layout == Layout::kNCHW ? gpu::TensorLayout::kNCHW : gpu::TensorLayout::kNHWC;
  p.out_layout = o.layout == Layout::kNCHW ? gpu::TensorLayout::kNCHW : gpu::TensorLayout::kNHWC;
  p.in_dtype = image_dtype;
  p.out_dtype = o.dtype;
  p.labels_int32 = o.labels_int32;
  for (int c = 0; c < C; ++c) {
    p.mean[c] = static_cast<float>(o.mean.empty() ? 0.0 : o.mean[c]);
    // Default scale: uint8 to [0, 1]; other dtypes as stored.
    const double default_std = image_dtype == DType::kUInt8 ? 255.0 : 1.0;
    p.inv_std[c] = static_cast<float>(1.0 / (o.stddev.empty() ? default_std : o.stddev[c]));
  }
  p.crop_padding = o.crop_padding;
  p.flip = o.flip;
  const uint64_t first = s->next * B;
  p.batch = static_cast<int>(std::min<uint64_t>(B, s->samples - first));
  p.perm_offset = static_cast<uint32_t>(first);
  if (s->pass > 0) {
    p.perm_domain = static_cast<uint32_t>(s->samples);
    p.perm_seed = gpu::Mix64(o.seed ^ gpu::Mix64(epoch * 0x100000001B3ull + s->upload_index) ^
                             (0xD1B54A32D192ED03ull * static_cast<uint64_t>(s->pass)));
  }
  // Fresh augmentation for every output batch, reproducible from
  // (seed, epoch, output batch index).
  p.seed = gpu::Mix64(o.seed ^ gpu::Mix64((epoch << 32) ^ out_index));
  GPUFEED_RETURN_IF_ERROR(ops->Transform(p, static_cast<const uint8_t*>(s->images.get()),
                                         static_cast<const int64_t*>(s->labels.get()), os.images.get(), os.labels.get(),
                                         compute_stream.ref()));
  for (size_t e = 0; e < extras.size(); ++e) {  // the same params: the same crop, flip and gather
    const Extra& x = extras[e];
    const auto* rows = static_cast<const uint8_t*>(s->extra[e].get());
    if (x.role == FeedFieldRole::kMask) {
      GPUFEED_RETURN_IF_ERROR(ops->MaskTransform(p, x.mask, rows, os.extra[e].get(), compute_stream.ref()));
    } else if (x.role == FeedFieldRole::kPassThrough) {
      GPUFEED_RETURN_IF_ERROR(ops->GatherRows(p, rows, x.in_bytes, os.extra[e].get(), compute_stream.ref()));
    }
  }
  GPUFEED_RETURN_IF_ERROR(ops->Record(compute_stream.ref(), os.ready.ref()));
  // The rows' dataset indices, through the same gather (host side: the
  // permutation is a pure function of its index).
  os.indices.resize(static_cast<size_t>(p.batch));
  for (int i = 0; i < p.batch; ++i) {
    const uint32_t src = gpu::SourceSample(p, static_cast<uint32_t>(i));
    os.indices[static_cast<size_t>(i)] = src < s->indices.size() ? s->indices[src] : UINT64_MAX;
  }
  os.held = true;
  os.free_recorded = false;

  DeviceBatch b;
  b.owner_ = owner;
  b.slot_ = slot;
  b.images_ = os.images.get();
  b.labels_ = os.labels.get();
  b.mask_ = first_mask >= 0 ? os.extra[static_cast<size_t>(first_mask)].get() : nullptr;
  b.fields_ = &os.field_ptrs;
  b.indices_ = os.indices.data();
  b.ready_event_ = ops->is_gpu() ? os.ready.ref().raw : nullptr;  // the public API's cudaEvent_t
  b.size_ = p.batch;
  b.pass_ = s->pass;
  b.upload_ = s->upload_index;
  b.index_ = out_index++;
  if (s->pass == 0) {
    ++st.fresh_batches;
    st.fresh_samples += p.batch;
  } else {
    ++st.echoed_batches;
    st.echoed_samples += p.batch;
  }

  // The worker fills the other slot while the consumer works on this one.
  if (fill_worker && !fill_pending && !loader_done && !in[1 - cur].filled) StartFill(1 - cur);
  if (++s->next == s->batches) {
    s->next = 0;
    if (++s->pass >= echo) {
      // Last reader of this input slot: its refill waits on this event.
      GPUFEED_RETURN_IF_ERROR(ops->Record(compute_stream.ref(), s->consumed.ref()));
      s->consumed_recorded = true;
      s->filled = false;
      const int other = 1 - cur;
      // With the worker the other slot is filled, filling (taken at the
      // next Produce) or past the loader's end.
      if (!fill_worker && !in[other].filled) GPUFEED_RETURN_IF_ERROR(FillNow(other));
      cur = other;
    }
  }
  return std::optional<DeviceBatch>(std::move(b));
}

// Order matters here: both streams are drained before anything their work
// reads or writes is freed (the input slots and their loader batches, the
// output slots); the decoder goes next (it frees its buffers through ops);
// then the slots, the streams, and last ops, which frees them all.
void GpuFeeder::Impl::Teardown() {
  StopFillWorker();
  if (!ops) return;
  if (compute_stream) (void)ops->StreamSync(compute_stream.ref());
  if (copy_stream) (void)ops->StreamSync(copy_stream.ref());
  decoder.reset();  // frees its device buffers through ops
  for (InSlot& s : in) s.Free();
  for (OutSlot& s : out) s.Free();
  compute_stream.reset();
  copy_stream.reset();
  ops.reset();
}

GpuFeeder::GpuFeeder(BatchSource& loader, const FeedOptions& options, uint64_t epoch, uint64_t start_batch)
    : impl_(std::make_unique<Impl>(loader, options, epoch, start_batch)) {
  impl_->init_status = impl_->Init();
  if (!impl_->init_status.ok()) {
    impl_->fields.clear();  // a feed that did not start delivers nothing
    return;
  }
  // With the fill worker the first slot's fill (and the decoder's start)
  // begins now, while the consumer gets ready.
  if (impl_->fill_worker) impl_->StartFill(0);
}

GpuFeeder::~GpuFeeder() { impl_->Teardown(); }

Status GpuFeeder::Restart(uint64_t epoch, uint64_t start_batch) {
  Status s = impl_->Restart(epoch, start_batch);
  if (!s.ok()) {
    impl_->restart_error = s;  // nothing half-started is delivered: Next() says why
    return s;
  }
  if (impl_->fill_worker) impl_->StartFill(0);  // the new epoch's first fill, at once
  return s;
}

bool GpuFeeder::on_gpu() const { return impl_->st.on_gpu; }

LoaderStats GpuFeeder::loader_stats() const { return impl_->stream->stats(); }

FeedStats GpuFeeder::stats() const {
  FeedStats s = impl_->st;
  s.echo = impl_->echo;
  {
    // As of the last fill the consumer took (the worker may be decoding the
    // next one now).
    const gpu::ImageDecodeCounters& c = impl_->decode_counters;
    const gpu::ImageDecodeCounters& b = impl_->decode_base;
    s.decoded_on_device = c.device_samples - b.device_samples;
    s.decoded_by_loader = c.host_samples - b.host_samples;
    s.decode_fallbacks = c.fallback_samples - b.fallback_samples;
    s.decode_skipped = c.skipped - b.skipped;
    s.decode_seconds = c.decode_seconds - b.decode_seconds;
  }
  s.wall_seconds = impl_->started ? NowSeconds() - impl_->start_time : 0;
  return s;
}

Result<std::optional<DeviceBatch>> GpuFeeder::Next() {
  Impl& d = *impl_;
  if (!d.init_status.ok()) {
    if (d.error_returned) return std::optional<DeviceBatch>();
    d.error_returned = true;
    return d.init_status;
  }
  if (!d.restart_error.ok()) {
    d.error = std::exchange(d.restart_error, Status::Ok());
    return d.error;
  }
  if (!d.error.ok()) return std::optional<DeviceBatch>();  // the stream ended with that error
  // The consumer's thread queues the transform into this feed's streams, so
  // the feed's device must be its current one; one process may feed several
  // GPUs (gpufeed.jax makes a feed per device of a mesh), so it is made so at
  // each call (it stays current after, as the feed's construction left it).
  if (Status bound = d.ops->BindThread(); !bound.ok()) {
    d.error = bound;
    return bound;
  }
  const double t = NowSeconds();
  if (d.last_return > 0) {
    d.step_seconds += t - d.last_return;
    ++d.steps;
  }
  auto r = d.Produce(this);
  d.last_return = NowSeconds();
  // Every output slot held is the consumer's to end (it frees a batch and
  // asks again); any other error ends the stream.
  if (!r.ok() && !std::exchange(d.refused_held, false)) d.error = r.status();
  return r;
}

Result<GpuFeeder::Waited> GpuFeeder::NextFor(std::chrono::milliseconds timeout) {
  Impl& d = *impl_;
  Waited out;
  if (d.fill_worker && d.init_status.ok() && d.restart_error.ok() && d.error.ok()) {
    // The fill the next Produce takes runs on the worker (the first one
    // started when the feeder was made or restarted): wait for it here.
    if (d.fill_pending && d.fill_slot == d.cur) {
      const double t0 = NowSeconds();
      out.wait = d.WaitFill(timeout);
      d.st.data_wait_seconds += NowSeconds() - t0;  // JoinFill's own wait is then short
      if (out.wait != WaitResult::kReady) return out;
    }
  } else if (d.WillPull()) {
    const double t0 = NowSeconds();
    out.wait = d.stream->WaitFor(timeout);
    d.st.data_wait_seconds += NowSeconds() - t0;  // Fill's own wait is then short
    if (out.wait != WaitResult::kReady) return out;
  }
  auto r = Next();
  if (!r.ok()) return r.status();
  out.batch = std::move(*r);
  return out;
}

void GpuFeeder::Interrupt() {
  if (impl_->fill_worker) {  // NextFor waits on the worker's fill, not the stream
    MutexLock lock(&impl_->fw.mu);
    impl_->fw.interrupted = true;
    impl_->fw.cv.SignalAll();
    return;
  }
  MutexLock lock(&impl_->stream_mu);
  if (impl_->stream) impl_->stream->Interrupt();
}

Status GpuFeeder::CopyToHost(const DeviceBatch& b, void* images, void* labels) const {
  const Impl& d = *impl_;
  if (b.owner_ != this) return Status::InvalidArgument("feed: the batch is released or from another feeder");
  const Impl::OutSlot& os = d.out[static_cast<size_t>(b.slot_)];
  const uint64_t n = static_cast<uint64_t>(b.size());
  if (images != nullptr) {
    GPUFEED_RETURN_IF_ERROR(
        d.ops->CopyToHost(images, os.images.get(), n * d.C * d.H * d.W * d.out_elem, os.ready.ref()));
  }
  if (labels != nullptr) {
    GPUFEED_RETURN_IF_ERROR(d.ops->CopyToHost(labels, os.labels.get(), n * (d.o.labels_int32 ? 4 : 8), os.ready.ref()));
  }
  return Status::Ok();
}

Status GpuFeeder::CopyMaskToHost(const DeviceBatch& b, void* mask) const {
  const Impl& d = *impl_;
  if (d.first_mask < 0) return Status::InvalidArgument("feed: the source has no mask field");
  return CopyFieldToHost(b, d.extras[static_cast<size_t>(d.first_mask)].field, mask);
}

Status GpuFeeder::CopyFieldToHost(const DeviceBatch& b, size_t i, void* dst) const {
  const Impl& d = *impl_;
  if (b.owner_ != this) return Status::InvalidArgument("feed: the batch is released or from another feeder");
  if (i >= d.fields.size()) {
    return Status::InvalidArgument("feed: no field " + std::to_string(i) + "; the feed delivers " +
                                   std::to_string(d.fields.size()) + " named fields");
  }
  const FeedField& f = d.fields[i];
  uint64_t bytes = DTypeSize(f.dtype);
  for (uint64_t dim : f.sample_shape) bytes *= dim;
  const Impl::OutSlot& os = d.out[static_cast<size_t>(b.slot_)];
  return d.ops->CopyToHost(dst, os.field_ptrs[i], static_cast<uint64_t>(b.size()) * bytes, os.ready.ref());
}

const std::vector<FeedField>& GpuFeeder::fields() const { return impl_->fields; }

void GpuFeeder::ReleaseSlot(int slot, void* consumer_stream) {
  Impl::OutSlot& os = impl_->out[static_cast<size_t>(slot)];
  if (!os.held) return;
  const gpu::StreamRef consumer{consumer_stream};  // the public API's cudaStream_t
  // The next transform into this slot waits for what the consumer queued.
  Status s = impl_->ops->Record(consumer, os.free_event.ref());
  if (!s.ok()) {
    // Without the event we cannot order reuse on the device: wait on the host.
    (void)impl_->ops->StreamSync(consumer);
    os.free_recorded = false;
  } else {
    os.free_recorded = true;
  }
  os.held = false;
}

DeviceBatch::DeviceBatch(DeviceBatch&& o) noexcept { *this = std::move(o); }
DeviceBatch& DeviceBatch::operator=(DeviceBatch&& o) noexcept {
  if (this != &o) {
    Release(nullptr);
    owner_ = std::exchange(o.owner_, nullptr);
    slot_ = std::exchange(o.slot_, -1);
    images_ = o.images_;
    labels_ = o.labels_;
    mask_ = o.mask_;
    fields_ = o.fields_;
    indices_ = o.indices_;
    ready_event_ = o.ready_event_;
    size_ = o.size_;
    pass_ = o.pass_;
    index_ = o.index_;
    upload_ = o.upload_;
  }
  return *this;
}
DeviceBatch::~DeviceBatch() { Release(nullptr); }

void DeviceBatch::Release(void* consumer_stream) {
  if (owner_ == nullptr) return;
  owner_->ReleaseSlot(slot_, consumer_stream);
  owner_ = nullptr;
  slot_ = -1;
}

Status CheckFeedInput(const BatchSourceInfo& src, const FeedOptions& options) {
  FeedOptions o = options;
  InputGeometry g;
  return CheckInput(src, &o, &g);
}

}  // namespace gpufeed
