// The fused transform kernel and its launcher. Memory-bound: each element is
// one uint8 read (through L1/L2, reused by neighbours) and one 2- or 4-byte
// write; consecutive threads write consecutive output elements.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "gpu/cuda_check.h"
#include "gpu/transform.h"

namespace gpufeed::gpu {
namespace {

template <DType kOut>
__global__ void TransformKernel(TransformParams p, const uint8_t* __restrict__ src,
                                const int64_t* __restrict__ src_labels, void* __restrict__ dst,
                                void* __restrict__ dst_labels) {
  const uint64_t hw = uint64_t(p.height) * p.width;
  const uint64_t per_sample = hw * p.channels;
  const uint64_t total = per_sample * p.batch;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t o = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    // Decompose the *output* offset so writes are coalesced.
    const uint32_t i = static_cast<uint32_t>(o / per_sample);
    const uint64_t r = o - uint64_t(i) * per_sample;
    int c, y, x;
    if (p.out_layout == TensorLayout::kNCHW) {
      c = static_cast<int>(r / hw);
      const uint64_t q = r - uint64_t(c) * hw;
      y = static_cast<int>(q / p.width);
      x = static_cast<int>(q - uint64_t(y) * p.width);
    } else {
      const uint64_t pix = r / p.channels;
      c = static_cast<int>(r - pix * p.channels);
      y = static_cast<int>(pix / p.width);
      x = static_cast<int>(pix - uint64_t(y) * p.width);
    }
    const float v = TransformValue(p, src, i, c, y, x);
    if constexpr (kOut == DType::kFloat32) {
      static_cast<float*>(dst)[o] = v;
    } else if constexpr (kOut == DType::kFloat16) {
      static_cast<uint16_t*>(dst)[o] = FloatToHalfBits(v);
    } else {
      static_cast<uint16_t*>(dst)[o] = FloatToBf16Bits(v);
    }
  }
  const uint64_t t = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (src_labels != nullptr && dst_labels != nullptr && t < uint64_t(p.batch)) {
    const uint32_t i = static_cast<uint32_t>(t);
    const uint32_t s = p.perm_domain ? EchoPermutation(p.perm_offset + i, p.perm_domain, p.perm_seed) : p.perm_offset + i;
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
  const uint64_t total = uint64_t(p.batch) * p.channels * p.height * p.width;
  constexpr int kThreads = 256;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // Enough blocks to fill every SM several times; the grid-stride loop covers the rest.
  const uint64_t want = (total + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(std::max<uint64_t>(
      1, std::min<uint64_t>(want, uint64_t(std::max(sms, 1)) * 32)));
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.out_dtype) {
    case DType::kFloat32: TransformKernel<DType::kFloat32><<<blocks, kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels); break;
    case DType::kFloat16: TransformKernel<DType::kFloat16><<<blocks, kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels); break;
    default: TransformKernel<DType::kBFloat16><<<blocks, kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels); break;
  }
  nvtxRangePop();
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

}  // namespace gpufeed::gpu
