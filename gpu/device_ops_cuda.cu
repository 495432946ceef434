// DeviceOps through the CUDA runtime. Every call is checked and mapped to a
// Status carrying the CUDA error name; destructors never throw.
#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/device_ops.h"

namespace gpufeed::gpu {
namespace {

class CudaOps final : public DeviceOps {
 public:
  explicit CudaOps(int device) : device_(device) {}
  bool is_gpu() const override { return true; }
  Status Alloc(size_t bytes, void** p) override {
    GPUFEED_CUDA_RETURN(cudaMalloc(p, std::max<size_t>(bytes, 1)));
    return Status::Ok();
  }
  void Free(void* p) override { cudaFree(p); }
  Status AllocPinned(size_t bytes, void** p) override {
    GPUFEED_CUDA_RETURN(cudaHostAlloc(p, std::max<size_t>(bytes, 1), cudaHostAllocPortable));
    return Status::Ok();
  }
  void FreePinned(void* p) override { cudaFreeHost(p); }
  Status NewStream(void** s) override {
    cudaStream_t st;
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *s = st;
    return Status::Ok();
  }
  void FreeStream(void* s) override { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  Status NewEvent(void** e) override {
    cudaEvent_t ev;
    GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *e = ev;
    return Status::Ok();
  }
  void FreeEvent(void* e) override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  Status CopyToDevice(void* dst, const void* src, size_t bytes, void* stream) override {
    TraceRange trace("gpufeed copy h2d");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream));
    GPUFEED_CUDA_RETURN(e);
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes, void* event) override {
    if (event != nullptr) GPUFEED_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    GPUFEED_CUDA_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return Status::Ok();
  }
  Status Record(void* event, void* stream) override {
    GPUFEED_CUDA_RETURN(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }
  Status StreamWait(void* stream, void* event) override {
    GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
    return Status::Ok();
  }
  Status EventSync(void* event) override {
    GPUFEED_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    return Status::Ok();
  }
  Status StreamSync(void* stream) override {
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }
  Status Transform(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst, void* dst_labels,
                   void* stream) override {
    return TransformGpu(p, src, src_labels, dst, dst_labels, stream);
  }
  Status MaskTransform(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst,
                       void* stream) override {
    return MaskTransformGpu(p, m, src, dst, stream);
  }
  Status GatherRows(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst,
                    void* stream) override {
    return GatherRowsGpu(p, src, row_bytes, dst, stream);
  }
  Status LaunchHostFunc(void* stream, void (*fn)(void*), void* data) override {
    GPUFEED_CUDA_RETURN(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), fn, data));
    return Status::Ok();
  }

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
