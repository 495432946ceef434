// (A .cc in the module's CUDA sources: host code that calls the CUDA
// runtime, built by the C++ compiler, as the loader's headers need C++20.)
// The image decode stage on the GPU: nvJPEG's batched decoder (hardware
// engine, else GPU hybrid) to full-size interleaved RGB in a scratch buffer,
// then ResizeCropGpu from each crop box into the batch. libnvjpeg is loaded
// at run time (nvjpeg_api.h).
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/image_decoder.h"
#include "gpu/nvjpeg_api.h"
#include "gpu/resize_crop.h"

namespace gpufeed::gpu {
namespace {

struct NvjpegLib {
  void* so = nullptr;
  std::string error;  // why it is not usable
  nvj::CreateExFn create_ex = nullptr;
  nvj::DestroyFn destroy = nullptr;
  nvj::StateCreateFn state_create = nullptr;
  nvj::StateDestroyFn state_destroy = nullptr;
  nvj::BatchedInitializeFn batched_initialize = nullptr;
  nvj::DecodeBatchedFn decode_batched = nullptr;
  nvj::GetHardwareDecoderInfoFn hardware_info = nullptr;  // optional: said in the backend's name where present
};

const NvjpegLib& Lib() {
  static const NvjpegLib lib = [] {
    NvjpegLib l;
    std::string tried;
    for (const char* name : {"libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"}) {
      l.so = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (l.so) break;
      tried += std::string(tried.empty() ? "" : ", ") + name;
    }
    if (!l.so) {
      l.error = "libnvjpeg not found (tried " + tried + "; it comes with the CUDA toolkit's libraries)";
      return l;
    }
    auto sym = [&](const char* n) { return dlsym(l.so, n); };
    l.create_ex = reinterpret_cast<nvj::CreateExFn>(sym("nvjpegCreateEx"));
    l.destroy = reinterpret_cast<nvj::DestroyFn>(sym("nvjpegDestroy"));
    l.state_create = reinterpret_cast<nvj::StateCreateFn>(sym("nvjpegJpegStateCreate"));
    l.state_destroy = reinterpret_cast<nvj::StateDestroyFn>(sym("nvjpegJpegStateDestroy"));
    l.batched_initialize = reinterpret_cast<nvj::BatchedInitializeFn>(sym("nvjpegDecodeBatchedInitialize"));
    l.decode_batched = reinterpret_cast<nvj::DecodeBatchedFn>(sym("nvjpegDecodeBatched"));
    l.hardware_info = reinterpret_cast<nvj::GetHardwareDecoderInfoFn>(sym("nvjpegGetHardwareDecoderInfo"));
    if (!l.create_ex || !l.destroy || !l.state_create || !l.state_destroy || !l.batched_initialize ||
        !l.decode_batched) {
      l.error = "libnvjpeg lacks the batched decode entry points";
    }
    return l;
  }();
  return lib;
}

std::string NvjpegError(const std::string& what, nvj::Status s) {
  return std::string("nvJPEG: ") + what + " failed (nvjpegStatus_t " + std::to_string(s) + ")";
}

// A handle on the current device: the hardware backend where the device has
// the engine, else GPU hybrid. *backend names it, with the hardware's engines
// as the device reports them ("hardware: N engines x C cores").
// The hardware backend runs without its pipeline: with it, each image's
// bitstream copy and colour conversion go to 14 internal streams whose work
// waits behind a training model's queued kernels. Beside ResNet-18
// on an H100 a batch of 256 took 76 ms a call with the pipeline and 13 ms
// without it (9 and 10 ms alone; bench/peer/nvjpeg_wait.py, 2026-11-26).
Status CreateHandle(nvj::Handle* h, std::string* backend) {
  const NvjpegLib& l = Lib();
  if (!l.error.empty()) return Status::Unsupported(l.error);
  nvj::Status s = l.create_ex(nvj::kBackendHardware, nullptr, nullptr, nvj::kFlagsHwDecodeNoPipeline, h);
  if (s == nvj::kSuccess) {
    *backend = "hardware";
    unsigned engines = 0, cores = 0;
    if (l.hardware_info != nullptr && l.hardware_info(*h, &engines, &cores) == nvj::kSuccess && engines > 0) {
      *backend += ": " + std::to_string(engines) + (engines == 1 ? " engine x " : " engines x ") +
                  std::to_string(cores) + (cores == 1 ? " core" : " cores");
    }
    return Status::Ok();
  }
  const nvj::Status hw = s;
  s = l.create_ex(nvj::kBackendGpuHybrid, nullptr, nullptr, 0, h);
  if (s == nvj::kSuccess) {
    *backend = "gpu-hybrid";
    return Status::Ok();
  }
  return Status::Unsupported(NvjpegError("nvjpegCreateEx (hardware: " + std::to_string(hw) + ", gpu hybrid)", s));
}

// Streams. nvJPEG decodes on the decoder's own stream into a scratch
// buffer of a ring of kRing; the resample into the feed's input slot runs on
// a second one after the decode's event and what the caller's stream held
// (both at the device's highest priority), and the caller's stream waits for
// it. Before a decode, the host waits only for the resample that last read
// its ring buffer (kRing batches back, long done), never for the feed's input
// slot, whose reuse follows the consumer's training steps.
class NvjpegDecoder final : public ImageBatchDecoder {
 public:
  NvjpegDecoder(const ImageDecodeShape& shape, int device, DeviceOps* ops)
      : shape_(shape), device_(device), ops_(ops) {}
  ~NvjpegDecoder() override {
    const NvjpegLib& l = Lib();
    if (const char* e = std::getenv("GPUFEED_NVJPEG_STATS"); e != nullptr && std::string_view(e) == "1") {
      std::fprintf(stderr,
                   "gpufeed nvjpeg: %llu calls, %llu images; seconds: ring waits %.3f, initialize %.3f (%llu), "
                   "nvjpegDecodeBatched %.3f, the rest %.3f, all %.3f\n",
                   static_cast<unsigned long long>(t_.calls), static_cast<unsigned long long>(c_.device_samples),
                   t_.ring_wait, t_.init, static_cast<unsigned long long>(t_.inits), t_.call,
                   c_.decode_seconds - t_.ring_wait - t_.init - t_.call, c_.decode_seconds);
    }
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (resample_) cudaStreamSynchronize(resample_);
    // The buffers are freed here, after the syncs and before the streams,
    // events and nvJPEG handle go (the members' destructors would run after).
    for (Ring& r : ring_) {
      if (r.consumed) cudaEventSynchronize(r.consumed);
      r.scratch.reset();
      r.jobs_dev.reset();
      r.jobs_host.reset();
      if (r.decoded) cudaEventDestroy(r.decoded);
      if (r.consumed) cudaEventDestroy(r.consumed);
    }
    fallback_.reset();
    if (stream_) cudaStreamDestroy(stream_);
    if (resample_) cudaStreamDestroy(resample_);
    if (slot_free_) cudaEventDestroy(slot_free_);
    if (state_) l.state_destroy(state_);
    if (handle_) l.destroy(handle_);
  }

  Status Init() {
    if (device_ < 0) GPUFEED_CUDA_RETURN(cudaGetDevice(&device_));  // kCurrentDevice
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    GPUFEED_RETURN_IF_ERROR(CreateHandle(&handle_, &backend_));
    const nvj::Status s = Lib().state_create(handle_, &state_);
    if (s != nvj::kSuccess) return Status::Unsupported(NvjpegError("nvjpegJpegStateCreate", s));
    // The highest priority the device has: the decode's kernels (nvJPEG's
    // colour conversion, the resample) are short and on the feed's critical
    // path; beside a model's kernels at the default priority they would
    // queue behind a whole training step, and nvJPEG's call waits for them.
    int least = 0, greatest = 0;
    GPUFEED_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithPriority(&resample_, cudaStreamNonBlocking, greatest));
    GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&slot_free_, cudaEventDisableTiming));
    for (Ring& r : ring_) {
      GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&r.decoded, cudaEventDisableTiming));
      GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&r.consumed, cudaEventDisableTiming));
    }
    return Status::Ok();
  }

  // long: not split yet (issue 47, item 6): nvJPEG's batch decode (only a GPU host can test a split)
  Status Decode(const Batch& b, uint8_t* dst, int64_t* labels, StreamRef stream) override {
    TraceRange trace("gpufeed nvjpeg decode");
    const double t0 = NowSeconds();
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    const auto cs = static_cast<cudaStream_t>(stream.raw);
    const uint64_t sb = uint64_t(3) * shape_.height * shape_.width;
    const size_t n = b.size();
    if (b.encoded().size() != n) return Status::Internal("image decode: a batch without its encoded entries");
    const auto* buf = reinterpret_cast<const unsigned char*>(b.buffer().data());
    // The samples the loader decoded: copied up as they are.
    std::vector<size_t> on_device;
    uint64_t scratch_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const EncodedSample& e = b.encoded()[i];
      if (e.bytes == 0) {
        GPUFEED_RETURN_IF_ERROR(ops_->CopyToDevice(dst + i * sb, buf + e.offset, sb, stream));
        ++c_.host_samples;
      } else {
        on_device.push_back(i);
        scratch_bytes += uint64_t(3) * e.height * e.width;
      }
    }
    std::vector<Status> failed(n);
    if (!on_device.empty()) {
      const int m = static_cast<int>(on_device.size());
      Ring& r = ring_[turn_];
      turn_ = (turn_ + 1) % kRing;
      // The resample that last read this ring buffer (kRing batches back),
      // waited for on the host: the hardware backend writes its output when
      // nvjpegDecodeBatched is called, not when the work queued before it
      // on its stream has run, so a stream wait would not keep it off a
      // buffer still being read (seen by torchvision and TorchCodec on H100,
      // pytorch/vision#9606, meta-pytorch/torchcodec#1634).
      double tw = NowSeconds();
      if (r.consumed_recorded) GPUFEED_CUDA_RETURN(cudaEventSynchronize(r.consumed));
      t_.ring_wait += NowSeconds() - tw;
      if (scratch_bytes > r.scratch_capacity || size_t(m) > r.jobs_capacity) {
        // The old buffer is freed before the larger one is made.
        if (scratch_bytes > r.scratch_capacity) {
          r.scratch.reset();
          r.scratch_capacity = scratch_bytes + scratch_bytes / 4;
          auto scratch = ops_->Alloc(r.scratch_capacity);
          if (!scratch.ok()) return scratch.status();
          r.scratch = std::move(*scratch);
        }
        if (size_t(m) > r.jobs_capacity) {
          r.jobs_dev.reset();
          r.jobs_host.reset();
          r.jobs_capacity = std::max<size_t>(m, 256);
          auto jobs_dev = ops_->Alloc(r.jobs_capacity * sizeof(ResizeJob));
          if (!jobs_dev.ok()) return jobs_dev.status();
          r.jobs_dev = std::move(*jobs_dev);
          auto jobs_host = ops_->AllocPinned(r.jobs_capacity * sizeof(ResizeJob));
          if (!jobs_host.ok()) return jobs_host.status();
          r.jobs_host = std::move(*jobs_host);
        }
      } else if (r.decoded_recorded) {
        // jobs_host fed the copy recorded by `decoded` kRing batches back.
        tw = NowSeconds();
        GPUFEED_CUDA_RETURN(cudaEventSynchronize(r.decoded));
        t_.ring_wait += NowSeconds() - tw;
      }
      data_.resize(m);
      lengths_.resize(m);
      images_.assign(m, nvj::Image{});
      auto* jobs = static_cast<ResizeJob*>(r.jobs_host.get());
      uint64_t at = 0;
      for (int k = 0; k < m; ++k) {
        const size_t i = on_device[k];
        const EncodedSample& e = b.encoded()[i];
        data_[k] = buf + e.offset;
        lengths_[k] = e.bytes;
        auto* out = static_cast<unsigned char*>(r.scratch.get()) + at;
        images_[k].channel[0] = out;
        images_[k].pitch[0] = size_t(3) * e.width;
        ResizeJob& j = jobs[k];
        j = ResizeJobFor(e, out, static_cast<uint32_t>(i));
        GPUFEED_RETURN_IF_ERROR(
            ValidateResizeJob(j).WithContext(shape_.source + " sample " + std::to_string(b.indices()[i])));
        at += uint64_t(3) * e.height * e.width;
      }
      const NvjpegLib& l = Lib();
      nvj::Status s = nvj::kSuccess;
      if (initialized_batch_ != m) {
        tw = NowSeconds();
        s = l.batched_initialize(handle_, state_, m, 1, nvj::kOutputRgbi);
        initialized_batch_ = s == nvj::kSuccess ? m : -1;
        t_.init += NowSeconds() - tw;
        ++t_.inits;
      }
      if (s == nvj::kSuccess) {
        tw = NowSeconds();
        s = l.decode_batched(handle_, state_, data_.data(), lengths_.data(), images_.data(), stream_);
        t_.call += NowSeconds() - tw;
        ++t_.calls;
      }
      if (s == nvj::kSuccess) {
        c_.device_samples += m;
        GPUFEED_CUDA_RETURN(cudaMemcpyAsync(r.jobs_dev.get(), r.jobs_host.get(), m * sizeof(ResizeJob),
                                            cudaMemcpyHostToDevice, stream_));
        GPUFEED_CUDA_RETURN(cudaEventRecord(r.decoded, stream_));
        r.decoded_recorded = true;
        // The resample writes the feed's input slot: after what the caller
        // queued on its stream (the slot's last reader) and the decode; the
        // caller's stream then waits for it.
        GPUFEED_CUDA_RETURN(cudaEventRecord(slot_free_, cs));
        GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(resample_, slot_free_, 0));
        GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(resample_, r.decoded, 0));
        GPUFEED_RETURN_IF_ERROR(ResizeCropGpu(static_cast<const ResizeJob*>(r.jobs_dev.get()), m, shape_.height,
                                              shape_.width, shape_.nchw, dst, resample_));
        GPUFEED_CUDA_RETURN(cudaEventRecord(r.consumed, resample_));
        r.consumed_recorded = true;
        GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(cs, r.consumed, 0));
      } else {
        // The engine rejected the batch: decode its samples here (which
        // also tells a corrupt stream from one the engine does not take)
        // and start the next batch on a fresh initialization.
        initialized_batch_ = -1;
        GPUFEED_RETURN_IF_ERROR(DecodeOnHostAndUpload(b, on_device, dst, failed, stream));
      }
    }
    Status st = ReplaceCorrupt(b, shape_, failed, labels, &c_.skipped, [&](size_t from, size_t to) -> Status {
      GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dst + to * sb, dst + from * sb, sb, cudaMemcpyDeviceToDevice, cs));
      return Status::Ok();
    });
    c_.decode_seconds += NowSeconds() - t0;
    return st;
  }

  const ImageDecodeCounters& counters() const override { return c_; }
  std::string name() const override { return "nvjpeg " + backend_; }

 private:
  Status DecodeOnHostAndUpload(const Batch& b, const std::vector<size_t>& which, uint8_t* dst,
                               std::vector<Status>& failed, StreamRef stream) {
    const uint64_t sb = uint64_t(3) * shape_.height * shape_.width;
    const auto cs = static_cast<cudaStream_t>(stream.raw);
    // The staging buffer may still feed an earlier fallback's copies.
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(cs));
    if (fallback_capacity_ < b.size() * sb) {
      fallback_.reset();  // before the larger one is made
      fallback_capacity_ = b.size() * sb;
      auto fallback = ops_->AllocPinned(fallback_capacity_);
      if (!fallback.ok()) return fallback.status();
      fallback_ = std::move(*fallback);
    }
    auto* staging = static_cast<uint8_t*>(fallback_.get());
    for (size_t i : which) {
      failed[i] = DecodeOnHost(b, i, shape_, staging + i * sb);
      if (!failed[i].ok()) continue;
      ++c_.fallback_samples;
      GPUFEED_RETURN_IF_ERROR(ops_->CopyToDevice(dst + i * sb, staging + i * sb, sb, stream));
    }
    return Status::Ok();
  }

  // Eight: each ring buffer holds a batch's full-size images (about 144 MB
  // for 256 ImageNet-sized JPEGs), and a deeper ring lets the decode run
  // further ahead of the consumer's steps (ResNet-18 fed at 0.63 of its
  // ceiling with 8 against 0.56-0.61 with 3, docs/benchmarks.md).
  static constexpr int kRing = 8;
  struct Ring {
    DeviceBuffer scratch;  // the batch's full-size decoded images
    uint64_t scratch_capacity = 0;
    DeviceBuffer jobs_dev;   // the resample's jobs
    PinnedBuffer jobs_host;  // their staging
    size_t jobs_capacity = 0;
    cudaEvent_t decoded = nullptr;   // on the decode stream: images and jobs are there
    cudaEvent_t consumed = nullptr;  // on the caller's stream: the resample read them
    bool decoded_recorded = false, consumed_recorded = false;
  };

  ImageDecodeShape shape_;
  int device_;
  DeviceOps* ops_;
  nvj::Handle handle_ = nullptr;
  nvj::State state_ = nullptr;
  cudaStream_t stream_ = nullptr;    // nvJPEG's decodes and the jobs' uploads
  cudaStream_t resample_ = nullptr;  // the resample into the feed's slot
  cudaEvent_t slot_free_ = nullptr;  // on the caller's stream: what it queued before this batch
  std::string backend_;
  int initialized_batch_ = -1;
  Ring ring_[kRing];
  int turn_ = 0;
  PinnedBuffer fallback_;
  uint64_t fallback_capacity_ = 0;
  std::vector<const unsigned char*> data_;
  std::vector<size_t> lengths_;
  std::vector<nvj::Image> images_;
  ImageDecodeCounters c_;
  // Where Decode's time goes (GPUFEED_NVJPEG_STATS=1 prints it at the end).
  struct {
    double ring_wait = 0, init = 0, call = 0;
    uint64_t inits = 0, calls = 0;
  } t_;
};

}  // namespace

Status NvjpegAvailable(int device, std::string* backend) {
  // Each device's answer (and backend), probed once.
  static struct {
    Mutex mu;
    std::map<int, std::pair<Status, std::string>> by_device GUARDED_BY(mu);
  } cache;
  MutexLock lock(&cache.mu);
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  auto it = cache.by_device.find(device);
  if (it == cache.by_device.end()) {
    std::pair<Status, std::string> r;
    int previous = 0;
    cudaGetDevice(&previous);
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      cudaGetLastError();
      r.first = Status::Unsupported(std::string("nvJPEG: no CUDA device ") + std::to_string(device) + " (" +
                                    cudaGetErrorString(e) + ")");
    } else {
      nvj::Handle h = nullptr;
      r.first = CreateHandle(&h, &r.second);
      if (h) Lib().destroy(h);
      cudaSetDevice(previous);
    }
    it = cache.by_device.emplace(device, r).first;
  }
  if (backend) *backend = it->second.second;
  return it->second.first;
}

Result<std::unique_ptr<ImageBatchDecoder>> MakeNvjpegDecoder(const ImageDecodeShape& shape, int device,
                                                             DeviceOps* ops) {
  if (ops == nullptr || !ops->is_gpu()) return Status::InvalidArgument("nvJPEG: needs the CUDA device ops");
  auto d = std::make_unique<NvjpegDecoder>(shape, device, ops);
  GPUFEED_RETURN_IF_ERROR(d->Init());
  return std::unique_ptr<ImageBatchDecoder>(std::move(d));
}

}  // namespace gpufeed::gpu
