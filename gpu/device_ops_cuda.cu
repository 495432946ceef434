// DeviceOps through the CUDA runtime. Every call is checked and mapped to a
// Status carrying the CUDA error name; destructors never throw.
#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/device_ops.h"

namespace gpufeed::gpu {
namespace {

cudaStream_t ToCuda(StreamRef s) { return static_cast<cudaStream_t>(s.raw); }
cudaEvent_t ToCuda(EventRef e) { return static_cast<cudaEvent_t>(e.raw); }

// The null stream is the legacy default stream of the calling thread's
// current device, which need not be the feed's: a consumer releasing a batch
// of device 0 after asking a feed of device 1 for its batch (gpufeed.jax, a
// feed per device of one thread) would record device 0's event on device 1's
// stream (cudaErrorInvalidResourceHandle). For the null stream, the call is
// made with the feed's device current, and the caller's put back after.
class NullStreamOnDevice {
 public:
  NullStreamOnDevice(StreamRef s, int device) {
    if (s.raw != nullptr || cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) return;
    switched_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~NullStreamOnDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  NullStreamOnDevice(const NullStreamOnDevice&) = delete;
  NullStreamOnDevice& operator=(const NullStreamOnDevice&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

class CudaOps final : public DeviceOps {
 public:
  explicit CudaOps(int device) : device_(device) {}
  bool is_gpu() const override { return true; }
  Status BindThread() override {
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    return Status::Ok();
  }
  Status CopyToDevice(void* dst, const void* src, size_t bytes, StreamRef stream) override {
    TraceRange trace("gpufeed copy h2d");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ToCuda(stream));
    GPUFEED_CUDA_RETURN(e);
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes, EventRef event) override {
    if (event.raw != nullptr) GPUFEED_CUDA_RETURN(cudaEventSynchronize(ToCuda(event)));
    GPUFEED_CUDA_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return Status::Ok();
  }
  Status Record(StreamRef stream, EventRef event) override {
    NullStreamOnDevice on(stream, device_);
    GPUFEED_CUDA_RETURN(cudaEventRecord(ToCuda(event), ToCuda(stream)));
    return Status::Ok();
  }
  Status StreamWait(StreamRef stream, EventRef event) override {
    NullStreamOnDevice on(stream, device_);
    GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(ToCuda(stream), ToCuda(event), 0));
    return Status::Ok();
  }
  Status EventSync(EventRef event) override {
    GPUFEED_CUDA_RETURN(cudaEventSynchronize(ToCuda(event)));
    return Status::Ok();
  }
  Status StreamSync(StreamRef stream) override {
    NullStreamOnDevice on(stream, device_);
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(ToCuda(stream)));
    return Status::Ok();
  }
  Status Transform(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst, void* dst_labels,
                   StreamRef stream) override {
    return TransformGpu(p, src, src_labels, dst, dst_labels, stream.raw);
  }
  Status MaskTransform(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst,
                       StreamRef stream) override {
    return MaskTransformGpu(p, m, src, dst, stream.raw);
  }
  Status GatherRows(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst,
                    StreamRef stream) override {
    return GatherRowsGpu(p, src, row_bytes, dst, stream.raw);
  }
  Status LaunchHostFunc(StreamRef stream, void (*fn)(void*), void* data) override {
    GPUFEED_CUDA_RETURN(cudaLaunchHostFunc(ToCuda(stream), fn, data));
    return Status::Ok();
  }

 protected:
  Status AllocRaw(size_t bytes, void** p) override {
    GPUFEED_CUDA_RETURN(cudaMalloc(p, std::max<size_t>(bytes, 1)));
    return Status::Ok();
  }
  void FreeRaw(void* p) noexcept override { cudaFree(p); }
  Status AllocPinnedRaw(size_t bytes, void** p) override {
    GPUFEED_CUDA_RETURN(cudaHostAlloc(p, std::max<size_t>(bytes, 1), cudaHostAllocPortable));
    return Status::Ok();
  }
  void FreePinnedRaw(void* p) noexcept override { cudaFreeHost(p); }
  Status NewStreamRaw(void** s) override {
    cudaStream_t st;
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *s = st;
    return Status::Ok();
  }
  void FreeStreamRaw(void* s) noexcept override { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  Status NewEventRaw(void** e) override {
    cudaEvent_t ev;
    GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *e = ev;
    return Status::Ok();
  }
  void FreeEventRaw(void* e) noexcept override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

 private:
  int device_;
};

}  // namespace

Result<std::unique_ptr<DeviceOps>> MakeCudaOps(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unsupported(std::string("no CUDA device: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                               ")");
  }
  if (device == kCurrentDevice) {
    GPUFEED_CUDA_RETURN(cudaGetDevice(&device));
    return std::unique_ptr<DeviceOps>(std::make_unique<CudaOps>(device));
  }
  if (device < 0 || device >= n) {
    return Status::InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                                   " present)");
  }
  GPUFEED_CUDA_RETURN(cudaSetDevice(device));
  return std::unique_ptr<DeviceOps>(std::make_unique<CudaOps>(device));
}

}  // namespace gpufeed::gpu
