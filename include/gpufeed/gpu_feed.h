// GpuFeeder: takes the Loader's batches (uint8, uint16, int16, float16 or
// float32 samples as stored, their named fields, or JPEGs left encoded for
// the GPU's decoder) to the GPU and hands the consumer ready batches: normalized, converted to fp32/fp16/bf16, in NCHW
// or NHWC, optionally cropped and flipped per sample, and optionally *echoed* (each upload used `echo` times,
// reshuffled on the GPU for every pass).
//
//   gpufeed::GpuFeeder feeder(loader, {.dtype = gpufeed::DType::kBFloat16, .echo = 2,
//                                      .crop_padding = 4, .flip = true});
//   for (;;) {
//     auto b = feeder.Next();                 // Result<std::optional<DeviceBatch>>
//     if (!b.ok()) { report(b.status()); break; }
//     if (!*b) break;                         // end of the epoch
//     cudaStreamWaitEvent(my_stream, (cudaEvent_t)(*b)->ready_event());
//     train_step((*b)->images(), (*b)->labels(), my_stream);
//     (*b)->Release(my_stream);               // or let it go out of scope
//   }
//
// Copies. Host batches come from the loader's pinned pool; each super-batch is
// copied with cudaMemcpyAsync on a copy stream into one of two device input
// slots, the transform runs on a compute stream after the copy's event, and
// writes one of `slots` output slots. A slot is reused only after the work
// reading it has finished — input slots after their last transform's event,
// output slots after the event Release() records on the consumer's stream —
// never through a device-wide synchronize. The copy of the next super-batch
// is queued before the current one's batches are handed out, so it overlaps
// the consumer's compute.
//
// Without a GPU (or with force_cpu), the same state machine runs on the CPU
// twins of every step (memcpy, TransformCpu): the whole chain works on a
// laptop, slowly, and the CPU tests exercise the feeder's logic.
//
// Errors (no device, out of memory, a failed launch, a loader failure) come
// back from Next() as a Status carrying the CUDA error name or the loader's
// message; nothing throws or aborts. Not thread-safe: one consumer thread.
#ifndef GPUFEED_GPU_FEED_H_
#define GPUFEED_GPU_FEED_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/dtype.h"
#include "gpufeed/loader.h"
#include "gpufeed/logger.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// Layout and its names: gpufeed/names.h.

struct FeedOptions {
  int device = 0;
  DType dtype = DType::kFloat32;  // kFloat32, kFloat16 or kBFloat16
  Layout layout = Layout::kNCHW;  // output layout
  // How samples are stored: [C,H,W] or [H,W,C]; volumes (CosmoFlow's 4 x 128^3)
  // [C,D,H,W] or [D,H,W,C], normalized per channel as images of D*H rows,
  // delivered in `layout` ([C,D,H,W] or [D,H,W,C]), never cropped or flipped.
  Layout input_layout = Layout::kNCHW;
  // Per-channel mean and std in stored units (0..255 for uint8). Empty: the
  // dataset's `mean`/`std` attributes when the loader reads a Dataset that
  // has them (gpufeed convert writes them), else 0 and 255 (x / 255) for
  // uint8 samples and 0 and 1 (as stored) for uint16, int16, float16 and
  // float32 ones (the input dtypes the feed takes; one images field).
  std::vector<double> mean, stddev;
  int echo = 1;               // uses of each upload; 0 = auto (measured, at most 4)
  int super_batch = 1;        // loader batches per upload; echo passes reshuffle all of them
  int crop_padding = 0;       // random crop with this zero padding (0: none)
  bool flip = false;          // random horizontal flip, probability 1/2
  uint64_t seed = 0;          // augmentation and echo permutations: same seed, epoch, batch -> same bytes
  int slots = 3;              // output slots on the device
  bool labels_int32 = false;  // labels (and a mask field) as int32 (else int64)
  // A source of several named fields (fields.h): the first is the image
  // (transformed as above); each later one is, in this order of tests
  // (GpuFeeder::fields() says which each became):
  //  - a class: the first field of one integer a sample (shape [] or [1],
  //    any integer dtype), delivered as labels() (int32/int64) in place of
  //    the source's labels;
  //  - a mask: an integer field [H, W] or [P, H, W] of the image's pixels,
  //    given the image's crop and flip, as int32/int64 (labels_int32);
  //    pixels a crop pulls in from outside read mask_fill;
  //  - passed through: anything else (CosmoFlow's float32 [4] targets, a
  //    weight, a float map), its rows delivered as stored, same dtype and
  //    shape. A field of the image's H x W that is no integer mask would come
  //    out unaligned with a cropped or flipped image: with crop_padding or
  //    flip it is refused (turn them off to take it as stored).
  // Every field gets the same echo gather: row i of every field is the same
  // dataset sample.
  int64_t mask_fill = 0;
  bool force_cpu = false;  // use the CPU twins even where a GPU exists
  // Encoded images: batches the loader left encoded
  // (LoaderOptions::defer_decode) are decoded here, by nvJPEG on the GPU
  // (its hardware engine where the device has one; GpuImageDecoder says
  // whether it is there) or by the CPU twin on the CPU path. A sample that
  // does not decode fails Next() naming it, or with skip_corrupt is
  // replaced by its batch's next sample (its label with it).
  bool skip_corrupt = false;
  // Where the feed says what is no error (a corrupt sample replaced); null:
  // stderr (gpufeed/logger.h).
  std::shared_ptr<Logger> logger;
};

// Where JPEGs are decoded for a feed: DecodeDevice (gpufeed/names.h, with
// its names "auto", "cpu", "gpu").
// Ok when nvJPEG loads and makes a handle on `device`; *backend "hardware"
// (the JPEG engine) or "gpu-hybrid". Else Unsupported with the reason (no
// libnvjpeg, no device, a build without CUDA). Cached per device.
Status GpuImageDecoder(int device, std::string* backend = nullptr);

// Where a feed's JPEGs are decoded, decided in one place for every caller
// (the C API and Python's decode=, `gpufeed train --decode`, `bench loader
// --decode`): what to set in the loader's options, and what to report.
struct DecodePlacement {
  bool defer = false;      // LoaderOptions::defer_decode: the feed's GPU decoder takes them
  bool balance = false;    // LoaderOptions::balance_decode: kAuto on the GPU
  std::string backend;     // with defer: "hardware" or "gpu-hybrid"
  std::string cpu_reason;  // without: why the loader's threads decode them
  // "gpu (nvjpeg hardware)" or "cpu (<why>)".
  std::string Describe() const;
};
// kGpu where the feed is not on a GPU (`feed_on_gpu`) or `device` has no
// decoder: Unsupported with the reason.
Result<DecodePlacement> PlaceDecode(DecodeDevice where, bool feed_on_gpu, int device);

struct FeedStats {
  uint64_t fresh_batches = 0, echoed_batches = 0;
  uint64_t fresh_samples = 0, echoed_samples = 0;
  uint64_t uploads = 0, bytes_uploaded = 0;
  double data_wait_seconds = 0;  // Next() blocked on the loader (the decode stage's time is decode_seconds)
  double wall_seconds = 0;       // since the feeder started
  int echo = 1;                  // the factor in use (chosen, with echo = 0)
  bool on_gpu = false;
  // Encoded images decoded by the feed (FeedOptions::skip_corrupt): its
  // decoder ("nvjpeg hardware", "nvjpeg gpu-hybrid", "cpu"; "" for none),
  // samples decoded by it, decoded by the loader and copied up, rejected by
  // the device and decoded on the host, replaced as corrupt; host time.
  std::string decoder;
  uint64_t decoded_on_device = 0, decoded_by_loader = 0, decode_fallbacks = 0, decode_skipped = 0;
  double decode_seconds = 0;
  double fresh_samples_per_s() const { return wall_seconds > 0 ? fresh_samples / wall_seconds : 0; }
  double echoed_samples_per_s() const { return wall_seconds > 0 ? echoed_samples / wall_seconds : 0; }
};

class GpuFeeder;

// What the feed delivers for one named field of the source.
enum class FeedFieldRole { kImage, kClass, kMask, kPassThrough };
struct FeedField {
  std::string name;
  FeedFieldRole role = FeedFieldRole::kPassThrough;
  DType dtype = DType::kUInt8;         // of the output: FeedOptions::dtype for the image, int32/int64 for
                                       // a class or mask, the stored dtype for a field passed through
  std::vector<uint64_t> sample_shape;  // of one output sample: the image's in the output layout, [] for a class
};

// One transformed batch in an output slot. Move-only; valid until released,
// and must be released (or destroyed) before its GpuFeeder is.
class DeviceBatch {
 public:
  DeviceBatch() = default;
  DeviceBatch(DeviceBatch&&) noexcept;
  DeviceBatch& operator=(DeviceBatch&&) noexcept;
  ~DeviceBatch();  // Release(nullptr)

  const void* images() const { return images_; }  // device pointer (host memory on the CPU path)
  // int32 or int64 per FeedOptions: the source's labels, or its class field
  const void* labels() const { return labels_; }
  // The first mask field, [size, P, H, W] int32/int64 (labels_int32),
  // aligned with images(); nullptr without one.
  const void* mask() const { return mask_; }
  // Array i of GpuFeeder::fields(): images() for the image, labels() for a
  // class field, else the field's [size, *sample_shape] rows. nullptr past
  // the fields.
  const void* field(size_t i) const { return fields_ && i < fields_->size() ? (*fields_)[i] : nullptr; }
  int size() const { return size_; }
  int pass() const { return pass_; }  // 0: fresh, >0: an echo of an earlier upload
  bool echoed() const { return pass_ > 0; }
  uint64_t index() const { return index_; }  // output batch index within the epoch
  // The upload (a fill of super_batch loader batches) it was made from, counted
  // from 0 within the epoch: its fresh pass and every echo pass share it. With
  // echo 0 (auto) the factor changes between uploads, so a pass-0 batch does
  // not by itself say an upload ended.
  uint64_t upload() const { return upload_; }
  // The dataset index of each of its size() rows (host memory, valid as the
  // batch): the loader's Batch::indices() gathered as the images were, so an
  // echo pass lists its permutation of the upload. For logging and checks
  // (`gpufeed bench feed` verifies every epoch it times with them). A sample
  // replaced as corrupt (skip_corrupt) keeps its own index.
  std::span<const uint64_t> indices() const { return {indices_, static_cast<size_t>(size_)}; }
  // A cudaEvent_t recorded after the transform: make your stream wait on it.
  // nullptr on the CPU path (the data is ready when Next() returns).
  void* ready_event() const { return ready_event_; }
  // Returns the slot to the feeder after the work queued on `consumer_stream`
  // (a cudaStream_t; nullptr = the legacy default stream) so far.
  void Release(void* consumer_stream = nullptr);

 private:
  friend class GpuFeeder;
  GpuFeeder* owner_ = nullptr;
  int slot_ = -1;
  const void* images_ = nullptr;
  const void* labels_ = nullptr;
  const void* mask_ = nullptr;
  const std::vector<const void*>* fields_ = nullptr;  // the output slot's, per field
  const uint64_t* indices_ = nullptr;                 // the output slot's, host memory
  void* ready_event_ = nullptr;
  int size_ = 0, pass_ = 0;
  uint64_t index_ = 0;
  uint64_t upload_ = 0;
};

// Whether a feed with `options` takes the samples `source` describes: the
// checks a GpuFeeder makes when it starts that need no device (input dtype
// and shape, channels, mean and std, crop padding, the pool against
// super_batch), worded for the device asked for (the CPU twins with
// force_cpu, else the GPU). For callers that open a source now and start
// the feed at the first batch (the C API's loader): a dtype the feed cannot
// convert is refused when the loader is made, not seconds later.
Status CheckFeedInput(const BatchSourceInfo& source, const FeedOptions& options);

class GpuFeeder {
 public:
  // Streams epoch `epoch` of `loader` — a local Loader or a RemoteLoader —
  // which must outlive the feeder and should have prefetch >= 2 x
  // super_batch. Errors surface from Next().
  //
  // start_batch > 0 resumes the epoch at that loader batch with the output
  // batches (augmentation and echo permutations included) an uninterrupted
  // feeder would produce from there: it must be a multiple of super_batch
  // and echo must be fixed (not 0), else Next() fails with InvalidArgument.
  //
  // Where the loader's batches come encoded (BatchSourceInfo::
  // encoded_batches: JPEGs for the GPU's decoder), the feeder fills on a
  // worker thread of its own and starts its first fill here (and in
  // Restart), so the decoder's start and the first upload overlap whatever
  // the consumer does before its first Next().
  GpuFeeder(BatchSource& loader, const FeedOptions& options, uint64_t epoch = 0, uint64_t start_batch = 0);
  ~GpuFeeder();  // waits for the work it queued; releases everything
  GpuFeeder(const GpuFeeder&) = delete;
  GpuFeeder& operator=(const GpuFeeder&) = delete;

  Result<std::optional<DeviceBatch>> Next();
  // As Next(), waiting at most `timeout` for the loader where this output
  // needs an upload (the first, or the next one Next() queues ahead of this
  // one's outputs): kReady with `batch` (nullopt at the end), or kTimeout /
  // kInterrupted with nothing taken. With super_batch > 1 it waits for the
  // first of the upload's loader batches; the others follow as Next() takes
  // them. The device work it queues is not waited for.
  struct Waited {
    WaitResult wait = WaitResult::kReady;
    std::optional<DeviceBatch> batch;
  };
  Result<Waited> NextFor(std::chrono::milliseconds timeout);
  // From any thread: ends the wait of the current NextFor, or of the next one
  // (EpochStream::Interrupt on the loader stream it pulls from; with the fill
  // worker, the wait for the worker's fill, which goes on and is kept).
  void Interrupt();
  // Starts epoch `epoch` at `start_batch` (as the constructor) on this
  // feeder's device state: its buffers, streams and image decoder (with its
  // measured rate) are kept, so an epoch's start costs no allocation, no
  // decoder handle and no driver call but a stream sync. It then delivers
  // what a new GpuFeeder(loader, options, epoch, start_batch) would, batch
  // for batch (with decode="auto", which engine decodes a sample follows the
  // rates measured so far, as ever); stats() start again. Batches of the previous epoch the
  // consumer still holds stay valid (their output slots are skipped until
  // released). A feeder that did not start returns why.
  Status Restart(uint64_t epoch, uint64_t start_batch = 0);
  // Waits for `b` and copies its images (size x C x H x W x dtype bytes) and
  // labels to host memory; either pointer may be null. For tests, debugging
  // and checksums — not for the training loop.
  Status CopyToHost(const DeviceBatch& b, void* images, void* labels) const;
  // Waits for `b` and copies its mask (size x P x H x W, int32 or int64).
  Status CopyMaskToHost(const DeviceBatch& b, void* mask) const;
  // Waits for `b` and copies its field i (size x the field's output sample).
  Status CopyFieldToHost(const DeviceBatch& b, size_t i, void* dst) const;
  // The arrays the feed delivers besides the source's /labels, in order: the
  // image (named "images" for a source of /images, else as its field), then
  // a source's later named fields. Empty after a failed start (Next() says
  // why).
  const std::vector<FeedField>& fields() const;
  FeedStats stats() const;
  // The statistics of the loader stream the feeder pulls from.
  LoaderStats loader_stats() const;
  bool on_gpu() const;

 private:
  friend class DeviceBatch;
  void ReleaseSlot(int slot, void* consumer_stream);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_GPU_FEED_H_
