// The fused transform kernel and its launcher. Memory-bound: each element is
// one uint8 read (through L1/L2, reused by neighbours) and one 2- or 4-byte
// write; consecutive threads write consecutive output elements.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>

#include "gpu/cuda_check.h"
#include "gpu/transform.h"

namespace gpufeed::gpu {
namespace {

// Grid: blockIdx.y is the output sample (its source and augmentation are
// computed once per block); each warp takes output rows (one (c, y) of NCHW,
// one y of NHWC) and its lanes take kVec consecutive x each, so there is no
// division per element, reads of a row are contiguous and writes are vector
// stores where aligned.
constexpr int kVec = 2;
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 8;  // work per block: short-lived blocks cost more than they do

template <DType kOut>
struct OutT;
template <>
struct OutT<DType::kFloat32> {
  using Scalar = float;
  using Pair = float2;
  static __device__ __forceinline__ Scalar Cvt(float v) { return v; }
  static __device__ __forceinline__ Pair Make(Scalar a, Scalar b) { return make_float2(a, b); }
};
template <>
struct OutT<DType::kFloat16> {
  using Scalar = uint16_t;
  using Pair = uint32_t;
  static __device__ __forceinline__ Scalar Cvt(float v) { return FloatToHalfBits(v); }
  static __device__ __forceinline__ Pair Make(Scalar a, Scalar b) { return uint32_t(a) | (uint32_t(b) << 16); }
};
template <>
struct OutT<DType::kBFloat16> {
  using Scalar = uint16_t;
  using Pair = uint32_t;
  static __device__ __forceinline__ Scalar Cvt(float v) { return FloatToBf16Bits(v); }
  static __device__ __forceinline__ Pair Make(Scalar a, Scalar b) { return uint32_t(a) | (uint32_t(b) << 16); }
};

template <DType kOut>
__global__ void TransformKernel(TransformParams p, const uint8_t* __restrict__ src,
                                const int64_t* __restrict__ src_labels, void* __restrict__ dst,
                                void* __restrict__ dst_labels) {
  using T = OutT<kOut>;
  using Scalar = typename T::Scalar;
  const uint32_t i = blockIdx.y;
  const int C = p.channels, H = p.height, W = p.width;
  const uint32_t per_sample = uint32_t(C) * H * W;
  const uint32_t s = SourceSample(p, i);
  const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
  const uint8_t* sample = src + uint64_t(s) * per_sample;
  Scalar* out = static_cast<Scalar*>(dst) + uint64_t(i) * per_sample;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool nchw_out = p.out_layout == TensorLayout::kNCHW;
  const bool nchw_in = p.in_layout == TensorLayout::kNCHW;
  const int rows = nchw_out ? C * H : H;
  for (int row = blockIdx.x * kWarps + warp; row < rows; row += gridDim.x * kWarps) {
    if (nchw_out) {
      const int c = row / H, y = row - c * H;  // one division per row
      const int sy = y + a.dy;
      const bool row_in = sy >= 0 && sy < H;
      const float m = p.mean[c], is = p.inv_std[c];
      const uint8_t* srow = nchw_in ? sample + (uint32_t(c) * H + (row_in ? sy : 0)) * W
                                    : sample + uint32_t(row_in ? sy : 0) * W * C + c;
      const int sstride = nchw_in ? 1 : C;
      Scalar* orow = out + uint32_t(row) * W;
      for (int x0 = lane * kVec; x0 < W; x0 += 32 * kVec) {
        Scalar v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int x = x0 + j;
          const int sx = (a.flip ? (W - 1 - x) : x) + a.dx;
          const float px = (row_in && x < W && sx >= 0 && sx < W) ? float(srow[sx * sstride]) : 0.0f;
          v[j] = T::Cvt((px - m) * is);
        }
        Scalar* o = orow + x0;
        if (x0 + 1 < W && (reinterpret_cast<uintptr_t>(o) % sizeof(typename T::Pair)) == 0) {
          *reinterpret_cast<typename T::Pair*>(o) = T::Make(v[0], v[1]);
        } else {
          o[0] = v[0];
          if (x0 + 1 < W) o[1] = v[1];
        }
      }
    } else {  // NHWC out: a row is W pixels x C channels, contiguous
      const int y = row, sy = y + a.dy;
      const bool row_in = sy >= 0 && sy < H;
      Scalar* orow = out + uint32_t(y) * W * C;
      for (int x = lane; x < W; x += 32) {
        const int sx = (a.flip ? (W - 1 - x) : x) + a.dx;
        const bool in = row_in && sx >= 0 && sx < W;
        for (int c = 0; c < C; ++c) {
          const uint32_t off = nchw_in ? (uint32_t(c) * H + sy) * W + sx : (uint32_t(sy) * W + sx) * C + c;
          const float px = in ? float(sample[off]) : 0.0f;
          orow[x * C + c] = T::Cvt((px - p.mean[c]) * p.inv_std[c]);
        }
      }
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
  constexpr unsigned kThreads = 32 * kWarps;
  // Per sample, a block per kWarps x kRowsPerWarp rows (the loop covers the
  // rest); samples along y.
  const uint64_t rows = p.out_layout == TensorLayout::kNCHW ? uint64_t(p.channels) * p.height : p.height;
  const uint64_t per_block = uint64_t(kWarps) * kRowsPerWarp;
  const unsigned x_blocks = static_cast<unsigned>(std::clamp<uint64_t>((rows + per_block - 1) / per_block, 1, 65535));
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
