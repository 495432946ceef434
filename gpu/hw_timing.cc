// The testing hooks of gpufeed/hw_timing.h. CUDA runtime calls are used
// directly here (they measure the hardware), checked through
// GPUFEED_CUDA_RETURN.
#include "gpufeed/hw_timing.h"
#include "gpufeed/names.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "common/host_buffer.h"
#include "gpu/transform.h"

#ifdef GPUFEED_WITH_CUDA
#include <cuda_runtime.h>

#include "gpu/cuda_check.h"
#endif

namespace gpufeed {
namespace {

#ifdef GPUFEED_WITH_CUDA
Status NeedGpu() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Status::Unsupported(std::string("no CUDA device (") + cudaGetErrorName(e) + ")");
  }
  return Status::Ok();
}

// Median seconds of `reps` runs of `f` on `s`, timed with events after a warm-up.
template <typename F>
Result<double> TimeOnStream(cudaStream_t s, int reps, F f) {
  cudaEvent_t a, b;
  GPUFEED_CUDA_RETURN(cudaEventCreate(&a));
  GPUFEED_CUDA_RETURN(cudaEventCreate(&b));
  GPUFEED_RETURN_IF_ERROR(f());
  GPUFEED_CUDA_RETURN(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    GPUFEED_CUDA_RETURN(cudaEventRecord(a, s));
    GPUFEED_RETURN_IF_ERROR(f());
    GPUFEED_CUDA_RETURN(cudaEventRecord(b, s));
    GPUFEED_CUDA_RETURN(cudaEventSynchronize(b));
    float ms = 0;
    GPUFEED_CUDA_RETURN(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
#endif

}  // namespace

#ifdef GPUFEED_WITH_CUDA

Result<H2dTiming> MeasureH2d(uint64_t batch_bytes, int slots) {
  GPUFEED_RETURN_IF_ERROR(NeedGpu());
  H2dTiming r;
  r.batch_bytes = batch_bytes;
  const int n = std::max(2, slots);
  const uint64_t total = batch_bytes * n;
  cudaStream_t s;
  GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* dev = nullptr;
  GPUFEED_CUDA_RETURN(cudaMalloc(&dev, total));
  // Ceiling: one large pinned buffer.
  auto big = HostBuffer::Allocate(total, true);
  if (!big.pinned()) return Status::Internal("h2d: could not pin " + std::to_string(total) + " bytes");
  std::memset(big.data(), 7, total);
  auto t = TimeOnStream(s, 10, [&] {
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dev, big.data(), total, cudaMemcpyHostToDevice, s));
    return Status::Ok();
  });
  if (!t.ok()) return t.status();
  r.pinned_gb_per_s = total / *t / 1e9;
  // The feeder's pattern: batch-sized pinned slots (as the loader's pool
  // allocates them), one cudaMemcpyAsync each, into rotating device slots.
  std::vector<HostBuffer> pool;
  for (int i = 0; i < n; ++i) {
    pool.push_back(HostBuffer::Allocate(batch_bytes, true));
    std::memset(pool.back().data(), i, batch_bytes);
  }
  t = TimeOnStream(s, 10, [&] {
    for (int i = 0; i < n; ++i) {
      GPUFEED_CUDA_RETURN(cudaMemcpyAsync(static_cast<std::byte*>(dev) + (i % 2) * batch_bytes, pool[i].data(),
                                          batch_bytes, cudaMemcpyHostToDevice, s));
    }
    return Status::Ok();
  });
  if (!t.ok()) return t.status();
  r.pool_gb_per_s = total / *t / 1e9;
  // Verify the last copy landed.
  std::vector<uint8_t> back(16);
  GPUFEED_CUDA_RETURN(
      cudaMemcpy(back.data(), static_cast<std::byte*>(dev) + ((n - 1) % 2) * batch_bytes, 16, cudaMemcpyDeviceToHost));
  for (uint8_t b : back) {
    if (b != uint8_t(n - 1)) return Status::Internal("h2d: copied bytes differ from the source");
  }
  // Pageable, for reference.
  std::vector<std::byte> pageable(batch_bytes);
  std::memset(pageable.data(), 1, batch_bytes);
  t = TimeOnStream(s, 5, [&] {
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dev, pageable.data(), batch_bytes, cudaMemcpyHostToDevice, s));
    return Status::Ok();
  });
  if (!t.ok()) return t.status();
  r.pageable_gb_per_s = batch_bytes / *t / 1e9;
  cudaFree(dev);
  cudaStreamDestroy(s);
  return r;
}

Result<std::vector<KernelTiming>> MeasureTransformKernel(int batch) {
  GPUFEED_RETURN_IF_ERROR(NeedGpu());
  const int C = 3, H = 218, W = 178;
  const uint64_t n = uint64_t(batch) * C * H * W;
  std::vector<uint8_t> src(n);
  std::mt19937 rng(1);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  cudaStream_t s;
  GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *dsrc, *ddst, *dcopy;
  GPUFEED_CUDA_RETURN(cudaMalloc(&dsrc, n));
  GPUFEED_CUDA_RETURN(cudaMalloc(&ddst, n * 4));
  GPUFEED_CUDA_RETURN(cudaMalloc(&dcopy, n * 4));
  GPUFEED_CUDA_RETURN(cudaMemcpy(dsrc, src.data(), n, cudaMemcpyHostToDevice));
  // Ceiling: a device-to-device copy of the same size as the fp32 output.
  auto t = TimeOnStream(s, 20, [&] {
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dcopy, ddst, n * 4, cudaMemcpyDeviceToDevice, s));
    return Status::Ok();
  });
  if (!t.ok()) return t.status();
  const double memcpy_gbs = 2.0 * n * 4 / *t / 1e9;
  std::vector<KernelTiming> out;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (auto layout : {gpu::TensorLayout::kNCHW, gpu::TensorLayout::kNHWC}) {
      gpu::TransformParams p;
      p.batch = batch;
      p.channels = C;
      p.height = H;
      p.width = W;
      p.out_dtype = dt;
      p.out_layout = layout;
      for (int c = 0; c < C; ++c) {
        p.mean[c] = 120.f + c;
        p.inv_std[c] = 1.f / (60.f + c);
      }
      p.crop_padding = 4;
      p.flip = true;
      p.seed = 11;
      // Verify: the first 4 samples against the CPU reference, bit for bit.
      gpu::TransformParams v = p;
      v.batch = 4;
      const uint64_t vbytes = uint64_t(4) * C * H * W * DTypeSize(dt);
      std::vector<uint8_t> want(vbytes), got(vbytes);
      GPUFEED_RETURN_IF_ERROR(gpu::TransformCpu(v, src.data(), nullptr, want.data(), nullptr));
      GPUFEED_RETURN_IF_ERROR(gpu::TransformGpu(p, static_cast<uint8_t*>(dsrc), nullptr, ddst, nullptr, s));
      GPUFEED_CUDA_RETURN(cudaStreamSynchronize(s));
      GPUFEED_CUDA_RETURN(cudaMemcpy(got.data(), ddst, vbytes, cudaMemcpyDeviceToHost));
      if (got != want) return Status::Internal("kernel bench: GPU output differs from the CPU reference");
      auto k = TimeOnStream(
          s, 20, [&] { return gpu::TransformGpu(p, static_cast<uint8_t*>(dsrc), nullptr, ddst, nullptr, s); });
      if (!k.ok()) return k.status();
      KernelTiming r;
      r.dtype = std::string(DTypeName(dt));
      r.layout = LayoutName(layout == gpu::TensorLayout::kNCHW ? Layout::kNCHW : Layout::kNHWC);
      r.ms = *k * 1e3;
      r.kernel_gb_per_s = (n + n * DTypeSize(dt)) / *k / 1e9;
      r.memcpy_gb_per_s = memcpy_gbs;
      out.push_back(r);
    }
  }
  cudaFree(dsrc);
  cudaFree(ddst);
  cudaFree(dcopy);
  cudaStreamDestroy(s);
  return out;
}

#else

Result<H2dTiming> MeasureH2d(uint64_t, int) {
  return Status::Unsupported("gpufeed was built without CUDA; bench h2d needs it");
}
Result<std::vector<KernelTiming>> MeasureTransformKernel(int) {
  return Status::Unsupported("gpufeed was built without CUDA; bench kernel needs it");
}

#endif

}  // namespace gpufeed
