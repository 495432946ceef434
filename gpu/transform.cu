// The fused transform kernel and its launcher. Memory-bound: each element is
// one uint8 read (through L1/L2, reused by neighbours) and one 2- or 4-byte
// write; consecutive threads write consecutive output elements.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "gpu/cuda_check.h"
#include "gpu/transform.h"

namespace gpufeed::gpu {
namespace {

// Grid: blockIdx.y is the output sample, so its source sample and
// augmentation are computed once per block; x strides over the sample's
// elements in output order (coalesced writes), with 32-bit index math.
template <DType kOut>
__global__ void TransformKernel(TransformParams p, const uint8_t* __restrict__ src,
                                const int64_t* __restrict__ src_labels, void* __restrict__ dst,
                                void* __restrict__ dst_labels) {
  const uint32_t i = blockIdx.y;
  const uint32_t hw = uint32_t(p.height) * p.width;
  const uint32_t per_sample = hw * p.channels;
  const uint32_t s = SourceSample(p, i);
  const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
  const uint8_t* sample = src + uint64_t(s) * per_sample;
  const uint64_t base = uint64_t(i) * per_sample;
  for (uint32_t r = blockIdx.x * blockDim.x + threadIdx.x; r < per_sample; r += gridDim.x * blockDim.x) {
    int c, y, x;
    if (p.out_layout == TensorLayout::kNCHW) {
      c = static_cast<int>(r / hw);
      const uint32_t q = r - uint32_t(c) * hw;
      y = static_cast<int>(q / p.width);
      x = static_cast<int>(q - uint32_t(y) * p.width);
    } else {
      const uint32_t pix = r / p.channels;
      c = static_cast<int>(r - pix * p.channels);
      y = static_cast<int>(pix / p.width);
      x = static_cast<int>(pix - uint32_t(y) * p.width);
    }
    const float v = ElementValue(p, sample, a, c, y, x);
    if constexpr (kOut == DType::kFloat32) {
      static_cast<float*>(dst)[base + r] = v;
    } else if constexpr (kOut == DType::kFloat16) {
      static_cast<uint16_t*>(dst)[base + r] = FloatToHalfBits(v);
    } else {
      static_cast<uint16_t*>(dst)[base + r] = FloatToBf16Bits(v);
    }
  }
  if (src_labels != nullptr && dst_labels != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.labels_int32) {
      static_cast<int32_t*>(dst_labels)[i] = static_cast<int32_t>(src_labels[s]);
    } else {
      static_cast<int64_t*>(dst_labels)[i] = src_labels[s];
    }
  }
}

}  // namespace

Status TransformGpu(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
                    void* dst_labels, void* stream) {
  GPUFEED_RETURN_IF_ERROR(ValidateTransform(p));
  nvtxRangePushA("gpufeed transform");
  if (p.batch > 65535) return Status::InvalidArgument("transform: at most 65535 samples a batch");
  const uint64_t per_sample = uint64_t(p.channels) * p.height * p.width;
  if (per_sample >= (1ull << 32)) return Status::InvalidArgument("transform: a sample of 4 GiB or more");
  constexpr unsigned kThreads = 256;
  // Per sample, enough blocks to cover it with a few elements per thread
  // (the loop covers the rest); samples along y.
  const unsigned x_blocks = static_cast<unsigned>(std::clamp<uint64_t>((per_sample + kThreads * 4 - 1) / (kThreads * 4), 1, 1024));
  const dim3 grid(x_blocks, static_cast<unsigned>(p.batch));
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.out_dtype) {
    case DType::kFloat32: TransformKernel<DType::kFloat32><<<grid, kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels); break;
    case DType::kFloat16: TransformKernel<DType::kFloat16><<<grid, kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels); break;
    default: TransformKernel<DType::kBFloat16><<<grid, kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels); break;
  }
  nvtxRangePop();
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

}  // namespace gpufeed::gpu
