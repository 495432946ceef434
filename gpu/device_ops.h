// The handful of device operations the GpuFeeder needs, behind one
// interface: CUDA (device_ops_cuda.cu) or the CPU twins (device_ops_cpu.cc),
// so the feeder's state machine is the same code on both and the CPU tests
// exercise it. Streams and events are opaque pointers (cudaStream_t /
// cudaEvent_t on the GPU; unused on the CPU, where every call completes
// before it returns).
#ifndef GPUFEED_GPU_DEVICE_OPS_H_
#define GPUFEED_GPU_DEVICE_OPS_H_

#include <cstddef>
#include <memory>

#include "gpu/gather_rows.h"
#include "gpu/mask_transform.h"
#include "gpu/transform.h"
#include "gpufeed/status.h"

namespace gpufeed::gpu {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual bool is_gpu() const = 0;
  virtual Status Alloc(size_t bytes, void** p) = 0;  // device memory
  virtual void Free(void* p) = 0;
  virtual Status AllocPinned(size_t bytes, void** p) = 0;  // host staging memory
  virtual void FreePinned(void* p) = 0;
  virtual Status NewStream(void** s) = 0;
  virtual void FreeStream(void* s) = 0;
  virtual Status NewEvent(void** e) = 0;
  virtual void FreeEvent(void* e) = 0;
  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes, void* stream) = 0;
  // Synchronous, after `event` (may be null): for tests and debugging.
  virtual Status CopyToHost(void* dst, const void* src, size_t bytes, void* event) = 0;
  virtual Status Record(void* event, void* stream) = 0;
  virtual Status StreamWait(void* stream, void* event) = 0;  // device-side wait
  virtual Status EventSync(void* event) = 0;                 // host-side wait
  virtual Status StreamSync(void* stream) = 0;
  virtual Status Transform(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
                           void* dst_labels, void* stream) = 0;
  // The mask transform (mask_transform.h): an integer field cropped and
  // flipped as Transform's images of the same params.
  virtual Status MaskTransform(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst,
                               void* stream) = 0;
  // The pass-through gather (gather_rows.h): rows of row_bytes in the order
  // Transform's samples of the same params.
  virtual Status GatherRows(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst,
                            void* stream) = 0;
  // Runs fn(data) on a runtime thread once the work queued on `stream` so far
  // has run (cudaLaunchHostFunc; on the CPU: now). fn must not call CUDA.
  virtual Status LaunchHostFunc(void* stream, void (*fn)(void*), void* data) = 0;
};

std::unique_ptr<DeviceOps> MakeCpuOps();
// MakeCudaOps' device for "the calling thread's current device", left as it is.
constexpr int kCurrentDevice = -1;
// Fails with a Status naming the CUDA error (no driver, no such device).
// In a build without CUDA: Unsupported.
Result<std::unique_ptr<DeviceOps>> MakeCudaOps(int device);

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_DEVICE_OPS_H_
