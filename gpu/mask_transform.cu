// The mask transform kernel and its launcher: a grid-stride loop over output
// elements, each computed by MaskElement (shared with the CPU twin). Masks
// are a small share of a batch's bytes; this favours plainness over the
// image kernel's row tiling.
#include <algorithm>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/mask_transform.h"

namespace gpufeed::gpu {
namespace {

__global__ void MaskKernel(TransformParams p, MaskParams m, const uint8_t* __restrict__ src, void* __restrict__ dst) {
  const uint64_t plane = uint64_t(p.height) * p.width;
  const uint64_t per_sample = plane * m.planes;
  const uint64_t total = per_sample * p.batch;
  const uint64_t in_bytes = per_sample * MaskElementBytes(m.in_dtype);
  for (uint64_t o = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; o < total; o += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t i = static_cast<uint32_t>(o / per_sample);
    const uint64_t r = o - uint64_t(i) * per_sample;
    const int c = static_cast<int>(r / plane);
    const uint64_t r2 = r - uint64_t(c) * plane;
    const int y = static_cast<int>(r2 / p.width), x = static_cast<int>(r2 - uint64_t(y) * p.width);
    const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
    const int64_t v = MaskElement(p, m, src + uint64_t(SourceSample(p, i)) * in_bytes, a, c, y, x);
    if (m.out_int64) {
      static_cast<int64_t*>(dst)[o] = v;
    } else {
      static_cast<int32_t*>(dst)[o] = static_cast<int32_t>(v);
    }
  }
}

}  // namespace

Status MaskTransformGpu(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst, void* stream) {
  GPUFEED_RETURN_IF_ERROR(ValidateMask(p, m));
  TraceRange trace("gpufeed mask transform");
  const uint64_t total = uint64_t(m.planes) * p.height * p.width * p.batch;
  constexpr unsigned kThreads = 256;
  const uint64_t blocks = std::clamp<uint64_t>((total + kThreads - 1) / kThreads, 1, 65535);
  MaskKernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, m, src, dst);
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

}  // namespace gpufeed::gpu
