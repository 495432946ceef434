// DeviceOps on the CPU: memory is host memory, copies are memcpy, the
// transform is TransformCpu; streams and events are placeholders.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gpu/device_ops.h"

namespace gpufeed::gpu {
namespace {

class CpuOps final : public DeviceOps {
 public:
  bool is_gpu() const override { return false; }
  Status CopyToDevice(void* dst, const void* src, size_t bytes, StreamRef) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, size_t bytes, EventRef) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Record(StreamRef, EventRef) override { return Status::Ok(); }
  Status StreamWait(StreamRef, EventRef) override { return Status::Ok(); }
  Status EventSync(EventRef) override { return Status::Ok(); }
  Status StreamSync(StreamRef) override { return Status::Ok(); }
  Status Transform(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst, void* dst_labels,
                   StreamRef) override {
    return TransformCpu(p, src, src_labels, dst, dst_labels);
  }
  Status MaskTransform(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst,
                       StreamRef) override {
    return MaskTransformCpu(p, m, src, dst);
  }
  Status GatherRows(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst, StreamRef) override {
    return GatherRowsCpu(p, src, row_bytes, dst);
  }
  Status LaunchHostFunc(StreamRef, void (*fn)(void*), void* data) override {
    fn(data);
    return Status::Ok();
  }

 protected:
  Status AllocRaw(size_t bytes, void** p) override {
    *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    return *p ? Status::Ok() : Status::Internal("out of host memory for " + std::to_string(bytes) + " bytes");
  }
  void FreeRaw(void* p) noexcept override { std::free(p); }
  Status AllocPinnedRaw(size_t bytes, void** p) override { return AllocRaw(bytes, p); }
  void FreePinnedRaw(void* p) noexcept override { std::free(p); }
  Status NewStreamRaw(void** s) override {
    *s = this;  // any non-null token
    return Status::Ok();
  }
  void FreeStreamRaw(void*) noexcept override {}
  Status NewEventRaw(void** e) override {
    *e = nullptr;
    return Status::Ok();
  }
  void FreeEventRaw(void*) noexcept override {}
};

}  // namespace

std::unique_ptr<DeviceOps> MakeCpuOps() { return std::make_unique<CpuOps>(); }

#ifndef GPUFEED_WITH_CUDA
Result<std::unique_ptr<DeviceOps>> MakeCudaOps(int) {
  return Status::Unsupported("gpufeed was built without CUDA (GPUFEED_CUDA=OFF or no nvcc found)");
}
#endif

}  // namespace gpufeed::gpu
