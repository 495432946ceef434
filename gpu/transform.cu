// The fused transform kernel and its launcher. Memory-bound: each element is
// one input read (uint8 to float32, templated on the input type) (through L1/L2, reused by neighbours) and one 2- or
// 4-byte write; consecutive threads write consecutive output elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/transform.h"

namespace gpufeed::gpu {
namespace {

// A persistent grid: each warp takes output rows (one (c, y) of NCHW, one y
// of NHWC) of the whole batch in turn — no tail of short-lived blocks — and
// its lanes take kVec consecutive output elements each: no division per
// element, a row's reads are contiguous, writes are 8- or 16-byte stores
// where aligned. An NHWC row (W x C elements) is walked flat the same way,
// its channel and x carried from element to element (one division a
// vector), so its stores are as wide as NCHW's (they were one element a
// lane, C apart).
constexpr int kVec = 4;
constexpr int kWarps = 8;

template <DType kOut>
struct OutT;
template <>
struct OutT<DType::kFloat32> {
  using Scalar = float;
  static __device__ __forceinline__ Scalar Cvt(float v) { return v; }
  static __device__ __forceinline__ void Store4(Scalar* o, const Scalar* v) {
    if ((reinterpret_cast<uintptr_t>(o) & 15) == 0) {
      *reinterpret_cast<float4*>(o) = make_float4(v[0], v[1], v[2], v[3]);
    } else {  // rows of even width are always 8-byte aligned
      reinterpret_cast<float2*>(o)[0] = make_float2(v[0], v[1]);
      reinterpret_cast<float2*>(o)[1] = make_float2(v[2], v[3]);
    }
  }
};
struct Out16 {
  using Scalar = uint16_t;
  static __device__ __forceinline__ void Store4(Scalar* o, const Scalar* v) {
    const uint32_t lo = uint32_t(v[0]) | (uint32_t(v[1]) << 16), hi = uint32_t(v[2]) | (uint32_t(v[3]) << 16);
    if ((reinterpret_cast<uintptr_t>(o) & 7) == 0) {
      *reinterpret_cast<uint2*>(o) = make_uint2(lo, hi);
    } else {
      reinterpret_cast<uint32_t*>(o)[0] = lo;
      reinterpret_cast<uint32_t*>(o)[1] = hi;
    }
  }
};
// The hardware's round-to-nearest-even conversions (one instruction each);
// FloatToHalfBits / FloatToBf16Bits are their bit-exact CPU twins, which the
// GPU test checks on every value it produces.
template <>
struct OutT<DType::kFloat16> : Out16 {
  static __device__ __forceinline__ Scalar Cvt(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct OutT<DType::kBFloat16> : Out16 {
  static __device__ __forceinline__ Scalar Cvt(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

// Input element types: the stored type and its exact fp32 value.
template <DType kIn>
struct InT;
template <>
struct InT<DType::kUInt8> {
  using Type = uint8_t;
  static __device__ __forceinline__ float Load(const Type* p) { return float(*p); }
};
template <>
struct InT<DType::kUInt16> {
  using Type = uint16_t;
  static __device__ __forceinline__ float Load(const Type* p) { return float(*p); }
};
template <>
struct InT<DType::kInt16> {
  using Type = int16_t;
  static __device__ __forceinline__ float Load(const Type* p) { return float(*p); }
};
template <>
struct InT<DType::kFloat16> {
  using Type = __half;
  static __device__ __forceinline__ float Load(const Type* p) { return __half2float(*p); }
};
template <>
struct InT<DType::kFloat32> {
  using Type = float;
  static __device__ __forceinline__ float Load(const Type* p) { return *p; }
};

// Per-sample constants, computed once per block into shared memory (a hash
// and two modulos per sample, instead of per row).
struct SampleInfo {
  uint32_t src;
  int16_t dy, dx;
  int32_t flip;
};
constexpr int kMaxSharedSamples = 2048;  // 24 KiB; larger batches compute it per row

template <DType kOut, DType kIn>
__global__ void __launch_bounds__(32 * kWarps)
    TransformKernel(TransformParams p, const uint8_t* __restrict__ src_bytes, const int64_t* __restrict__ src_labels,
                    void* __restrict__ dst, void* __restrict__ dst_labels) {
  using T = OutT<kOut>;
  using Scalar = typename T::Scalar;
  using In = typename InT<kIn>::Type;
  const In* __restrict__ src = reinterpret_cast<const In*>(src_bytes);
  // Per-channel constants in shared memory: indexing the by-value parameter
  // struct with a runtime channel would copy it to local memory.
  __shared__ float s_mean[kMaxChannels], s_inv_std[kMaxChannels];
  __shared__ SampleInfo s_info[kMaxSharedSamples];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kMaxChannels; ++k) {  // constant indices: stays in the parameter bank
      s_mean[k] = p.mean[k];
      s_inv_std[k] = p.inv_std[k];
    }
  }
  const bool shared_info = p.batch <= kMaxSharedSamples;
  auto info_of = [&](uint32_t i) {
    const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
    return SampleInfo{SourceSample(p, i), static_cast<int16_t>(a.dy), static_cast<int16_t>(a.dx), a.flip ? 1 : 0};
  };
  if (shared_info) {
    for (uint32_t i = threadIdx.x; i < uint32_t(p.batch); i += blockDim.x) s_info[i] = info_of(i);
  }
  __syncthreads();
  const int C = p.channels, H = p.height, W = p.width;
  const uint32_t per_sample = uint32_t(C) * H * W;
  const bool nchw_out = p.out_layout == TensorLayout::kNCHW;
  const bool nchw_in = p.in_layout == TensorLayout::kNCHW;
  const uint32_t rows_per_sample = nchw_out ? uint32_t(C) * H : uint32_t(H);
  const int lane = threadIdx.x & 31;
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const uint32_t warps = (gridDim.x * blockDim.x) >> 5;
  // Walk rows g = warp, warp + warps, ... as (i, row), updated without a
  // division per step.
  uint32_t i = warp / rows_per_sample, row = warp - i * rows_per_sample;
  const uint32_t step_i = warps / rows_per_sample, step_row = warps - step_i * rows_per_sample;
  for (; i < uint32_t(p.batch);) {
    const SampleInfo si = shared_info ? s_info[i] : info_of(i);
    const In* sample = src + uint64_t(si.src) * per_sample;
    Scalar* out = static_cast<Scalar*>(dst) + uint64_t(i) * per_sample;
    if (nchw_out) {
      const int c = static_cast<int>(row / H), y = static_cast<int>(row) - c * H;
      const int sy = y + si.dy;
      const bool row_in = sy >= 0 && sy < H;
      const float m = s_mean[c], is = s_inv_std[c];
      const In* srow =
          nchw_in ? sample + (uint32_t(c) * H + (row_in ? sy : 0)) * W : sample + uint32_t(row_in ? sy : 0) * W * C + c;
      const int sstride = nchw_in ? 1 : C;
      Scalar* orow = out + row * W;
      for (int x0 = lane * kVec; x0 < W; x0 += 32 * kVec) {
        Scalar v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int x = x0 + j;
          const int sx = (si.flip ? (W - 1 - x) : x) + si.dx;
          const float px = (row_in && x < W && sx >= 0 && sx < W) ? InT<kIn>::Load(srow + sx * sstride) : 0.0f;
          v[j] = T::Cvt((px - m) * is);
        }
        Scalar* o = orow + x0;
        if (x0 + kVec <= W && (W & 1) == 0) {
          T::Store4(o, v);
        } else {
          for (int j = 0; j < kVec && x0 + j < W; ++j) o[j] = v[j];
        }
      }
    } else {  // NHWC out: a row is W pixels x C channels, contiguous: walked flat, as NCHW's rows
      const int y = static_cast<int>(row), sy = y + si.dy;
      const bool row_in = sy >= 0 && sy < H;
      Scalar* orow = out + uint32_t(y) * W * C;
      const int n = W * C;
      for (int e0 = lane * kVec; e0 < n; e0 += 32 * kVec) {
        Scalar v[kVec];
        int x = e0 / C, c = e0 - x * C;  // one division a vector
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int sx = (si.flip ? (W - 1 - x) : x) + si.dx;
          const bool in = row_in && e0 + j < n && sx >= 0 && sx < W;
          const uint32_t off = nchw_in ? (uint32_t(c) * H + sy) * W + sx : (uint32_t(sy) * W + sx) * C + c;
          const float px = in ? InT<kIn>::Load(sample + off) : 0.0f;
          v[j] = T::Cvt((px - s_mean[c]) * s_inv_std[c]);
          if (++c == C) {
            c = 0;
            ++x;
          }
        }
        Scalar* o = orow + e0;
        if (e0 + kVec <= n && (n & 1) == 0) {
          T::Store4(o, v);
        } else {
          for (int j = 0; j < kVec && e0 + j < n; ++j) o[j] = v[j];
        }
      }
    }
    i += step_i;
    row += step_row;
    if (row >= rows_per_sample) {
      row -= rows_per_sample;
      ++i;
    }
  }
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (src_labels != nullptr && dst_labels != nullptr && t < uint32_t(p.batch)) {
    const uint32_t s = SourceSample(p, t);
    if (p.labels_int32) {
      static_cast<int32_t*>(dst_labels)[t] = static_cast<int32_t>(src_labels[s]);
    } else {
      static_cast<int64_t*>(dst_labels)[t] = src_labels[s];
    }
  }
}

using KernelFn = void (*)(TransformParams, const uint8_t*, const int64_t*, void*, void*);

// Persistent grid: exactly the blocks that are resident at once on every SM
// (a second, partial wave would double the time of the rows it holds), no
// more than there are rows, and enough threads for the labels.
Status Launch(KernelFn kernel, const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
              void* dst_labels, cudaStream_t s) {
  constexpr unsigned kThreads = 32 * kWarps;
  int device = 0, sms = 0, per_sm = 0;
  GPUFEED_CUDA_RETURN(cudaGetDevice(&device));
  GPUFEED_CUDA_RETURN(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GPUFEED_CUDA_RETURN(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  const uint64_t rows = (p.out_layout == TensorLayout::kNCHW ? uint64_t(p.channels) * p.height : p.height) * p.batch;
  uint64_t blocks = std::min<uint64_t>(uint64_t(std::max(sms, 1)) * std::max(per_sm, 1), (rows + kWarps - 1) / kWarps);
  blocks = std::max<uint64_t>(blocks, (uint64_t(p.batch) + kThreads - 1) / kThreads);
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p, src, src_labels, dst, dst_labels);
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

template <DType kIn>
Status LaunchOut(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst, void* dst_labels,
                 cudaStream_t s) {
  switch (p.out_dtype) {
    case DType::kFloat32:
      return Launch(TransformKernel<DType::kFloat32, kIn>, p, src, src_labels, dst, dst_labels, s);
    case DType::kFloat16:
      return Launch(TransformKernel<DType::kFloat16, kIn>, p, src, src_labels, dst, dst_labels, s);
    default:
      return Launch(TransformKernel<DType::kBFloat16, kIn>, p, src, src_labels, dst, dst_labels, s);
  }
}

}  // namespace

Status TransformGpu(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
                    void* dst_labels, void* stream) {
  GPUFEED_RETURN_IF_ERROR(ValidateTransform(p));
  const uint64_t per_sample = uint64_t(p.channels) * p.height * p.width;
  if (per_sample >= (1ull << 32)) return Status::InvalidArgument("transform: a sample of 4 GiB or more");
  TraceRange trace("gpufeed transform");
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.in_dtype) {
    case DType::kUInt16:
      return LaunchOut<DType::kUInt16>(p, src, src_labels, dst, dst_labels, s);
    case DType::kInt16:
      return LaunchOut<DType::kInt16>(p, src, src_labels, dst, dst_labels, s);
    case DType::kFloat16:
      return LaunchOut<DType::kFloat16>(p, src, src_labels, dst, dst_labels, s);
    case DType::kFloat32:
      return LaunchOut<DType::kFloat32>(p, src, src_labels, dst, dst_labels, s);
    default:
      return LaunchOut<DType::kUInt8>(p, src, src_labels, dst, dst_labels, s);
  }
}

}  // namespace gpufeed::gpu
