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

// Each sample's output (C x H x W elements in either layout, contiguous) is
// walked flat: a block takes a chunk of one sample (grid.y: the samples),
// each thread kVec consecutive elements a step, so every lane is busy
// whatever the row width (a warp per row left lanes idle: 178-wide rows used
// 70% of them) and every store is 8 or 16 bytes. A vector's first element is
// located with two divisions by multiplication (FastDiv); the rest are
// carried from it.
constexpr int kThreads = 256;
constexpr int kStepsPerBlock = 4;  // vectors a thread takes in its block's chunk
// Elements a thread takes a step: 16 bytes of 16-bit output, 16 of fp32.
template <typename Scalar>
constexpr int kVecOf = sizeof(Scalar) == 2 ? 8 : 4;
constexpr uint32_t kMaxChunk = uint32_t(kThreads) * 8 * kStepsPerBlock;

struct Geometry {
  FastDiv plane;  // NCHW out: H x W; NHWC out: C
  FastDiv row;    // W
  uint32_t per_sample = 0;
  uint32_t chunks = 0;  // blocks a sample
};

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
  static __device__ __forceinline__ void Store8(Scalar* o, const Scalar* v) {
    if ((reinterpret_cast<uintptr_t>(o) & 15) == 0) {
      *reinterpret_cast<uint4*>(o) =
          make_uint4(uint32_t(v[0]) | (uint32_t(v[1]) << 16), uint32_t(v[2]) | (uint32_t(v[3]) << 16),
                     uint32_t(v[4]) | (uint32_t(v[5]) << 16), uint32_t(v[6]) | (uint32_t(v[7]) << 16));
    } else {
      Store4(o, v);
      Store4(o + 4, v + 4);
    }
  }
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

template <DType kOut, DType kIn>
__global__ void __launch_bounds__(kThreads)
    TransformKernel(TransformParams p, Geometry g, const uint8_t* __restrict__ src_bytes,
                    const int64_t* __restrict__ src_labels, void* __restrict__ dst, void* __restrict__ dst_labels) {
  using T = OutT<kOut>;
  using Scalar = typename T::Scalar;
  using In = typename InT<kIn>::Type;
  constexpr int kVec = kVecOf<Scalar>;
  constexpr uint32_t kChunk = uint32_t(kThreads) * kVec * kStepsPerBlock;
  const In* __restrict__ src = reinterpret_cast<const In*>(src_bytes);
  // Per-channel constants in shared memory: indexing the by-value parameter
  // struct with a runtime channel would copy it to local memory.
  __shared__ float s_mean[kMaxChannels], s_inv_std[kMaxChannels];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kMaxChannels; ++k) {  // constant indices: stays in the parameter bank
      s_mean[k] = p.mean[k];
      s_inv_std[k] = p.inv_std[k];
    }
  }
  __syncthreads();
  const int C = p.channels, H = p.height, W = p.width;
  const bool nchw_out = p.out_layout == TensorLayout::kNCHW;
  const bool nchw_in = p.in_layout == TensorLayout::kNCHW;
  const uint32_t base = blockIdx.x * kChunk;
  for (uint32_t i = blockIdx.y; i < uint32_t(p.batch); i += gridDim.y) {
    const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
    const In* sample = src + uint64_t(SourceSample(p, i)) * g.per_sample;
    Scalar* out = static_cast<Scalar*>(dst) + uint64_t(i) * g.per_sample;
    if (blockIdx.x == 0 && threadIdx.x == 0 && src_labels != nullptr && dst_labels != nullptr) {
      const uint32_t s = SourceSample(p, i);
      if (p.labels_int32) {
        static_cast<int32_t*>(dst_labels)[i] = static_cast<int32_t>(src_labels[s]);
      } else {
        static_cast<int64_t*>(dst_labels)[i] = src_labels[s];
      }
    }
#pragma unroll 1
    for (int step = 0; step < kStepsPerBlock; ++step) {
      const uint32_t e0 = base + (uint32_t(step) * kThreads + threadIdx.x) * kVec;
      if (e0 >= g.per_sample) break;
      // The vector's first element: (c, y, x), carried from there.
      int c, y, x;
      if (nchw_out) {
        c = static_cast<int>(g.plane.Div(e0));
        const uint32_t r = e0 - uint32_t(c) * g.plane.d;
        y = static_cast<int>(g.row.Div(r));
        x = static_cast<int>(r - uint32_t(y) * g.row.d);
      } else {
        const uint32_t pix = g.plane.Div(e0);
        c = static_cast<int>(e0 - pix * g.plane.d);
        y = static_cast<int>(g.row.Div(pix));
        x = static_cast<int>(pix - uint32_t(y) * g.row.d);
      }
      Scalar v[kVec];
      // The interior (most vectors): the vector's pixels lie in one output
      // row and read source pixels inside the image, so no element needs a
      // bounds check, and an NCHW row's read steps by a constant.
      const int sy = y + a.dy;
      const int last_x = nchw_out ? x + kVec - 1 : x + static_cast<int>(g.plane.Div(uint32_t(c) + kVec - 1));
      const int lo = a.flip ? W - 1 - last_x + a.dx : x + a.dx;
      const int hi = a.flip ? W - 1 - x + a.dx : last_x + a.dx;
      const bool interior = e0 + kVec <= g.per_sample && sy >= 0 && sy < H && last_x < W && lo >= 0 && hi < W;
      if (interior && nchw_out) {
        const int sx = a.flip ? hi : lo;
        const In* q = sample + (nchw_in ? (uint32_t(c) * H + uint32_t(sy)) * W + uint32_t(sx)
                                        : (uint32_t(sy) * W + uint32_t(sx)) * C + uint32_t(c));
        const int stride = (a.flip ? -1 : 1) * (nchw_in ? 1 : C);
        const float m = s_mean[c], is = s_inv_std[c];
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = T::Cvt((InT<kIn>::Load(q + j * stride) - m) * is);
      } else if (interior) {
        const In* row = sample + (nchw_in ? uint32_t(sy) * W : uint32_t(sy) * W * C);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int sx = (a.flip ? (W - 1 - x) : x) + a.dx;
          const uint32_t off = nchw_in ? uint32_t(c) * H * W + uint32_t(sx) : uint32_t(sx) * C + uint32_t(c);
          v[j] = T::Cvt((InT<kIn>::Load(row + off) - s_mean[c]) * s_inv_std[c]);
          if (++c == C) {
            c = 0;
            ++x;
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int sy = y + a.dy;
          const int sx = (a.flip ? (W - 1 - x) : x) + a.dx;
          const bool in = e0 + j < g.per_sample && sy >= 0 && sy < H && sx >= 0 && sx < W;
          const uint32_t off = nchw_in ? (uint32_t(c) * H + uint32_t(sy)) * W + uint32_t(sx)
                                       : (uint32_t(sy) * W + uint32_t(sx)) * C + uint32_t(c);
          const float px = in ? InT<kIn>::Load(sample + off) : 0.0f;
          v[j] = T::Cvt((px - s_mean[c]) * s_inv_std[c]);
          if (nchw_out) {
            if (++x == W) {
              x = 0;
              if (++y == H) {
                y = 0;
                ++c;
              }
            }
          } else if (++c == C) {
            c = 0;
            if (++x == W) {
              x = 0;
              ++y;
            }
          }
        }
      }
      Scalar* o = out + e0;
      if (e0 + kVec <= g.per_sample && (g.per_sample & 1) == 0) {
        if constexpr (kVec == 8) {
          T::Store8(o, v);
        } else {
          T::Store4(o, v);
        }
      } else {
        for (int j = 0; j < kVec && e0 + j < g.per_sample; ++j) o[j] = v[j];
      }
    }
  }
}

using KernelFn = void (*)(TransformParams, Geometry, const uint8_t*, const int64_t*, void*, void*);

// A block per chunk of kThreads x kStepsPerBlock vectors of a sample (grid.x), the samples
// along grid.y (strided past 65,535).
Status Launch(KernelFn kernel, const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
              void* dst_labels, cudaStream_t s) {
  Geometry g;
  g.per_sample = uint32_t(p.channels) * uint32_t(p.height) * uint32_t(p.width);
  g.plane =
      FastDiv::For(p.out_layout == TensorLayout::kNCHW ? uint32_t(p.height) * uint32_t(p.width) : uint32_t(p.channels));
  g.row = FastDiv::For(uint32_t(p.width));
  const uint32_t chunk = uint32_t(kThreads) * kStepsPerBlock * (p.out_dtype == DType::kFloat32 ? 4 : 8);
  g.chunks = (g.per_sample + chunk - 1) / chunk;
  const dim3 grid(g.chunks, static_cast<unsigned>(std::min(p.batch, 65535)));
  kernel<<<grid, kThreads, 0, s>>>(p, g, src, src_labels, dst, dst_labels);
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
  // The kernel's element offsets within a sample (and a chunk past its end) are 32-bit.
  if (per_sample >= (1ull << 32) - kMaxChunk) return Status::InvalidArgument("transform: a sample of 4 GiB or more");
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
