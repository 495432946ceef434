// The fused transform kernel and its launcher. Each output element is one
// input read (uint8 to float32, templated on the input type; through L1/L2,
// reused by neighbours) and one 2- or 4-byte write; consecutive threads write
// consecutive vectors. On an H100 it is bound by its instructions an element
// (Nsight Compute, docs/benchmarks.md), not by DRAM: hence the compile-time
// read forms below.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/transform.h"

namespace gpufeed::gpu {
namespace {

// Each output row (an NCHW row of W elements, an NHWC row of W x C) is cut
// into vectors of kVec consecutive elements, and a sample's vectors are
// walked flat: a block takes a chunk of one sample's vectors (grid.y: the
// samples), a thread one vector a step. A vector never straddles two rows,
// so every lane runs the same instructions: the elements past a row's end or
// reading the crop's zero padding are predicated off, not branched around
// (ncu found 13 of 32 lanes active when vectors straddled rows and took a
// checked path of their own). A vector is located with two divisions by
// multiplication (FastDiv).
constexpr int kThreads = 256;
constexpr int kStepsPerBlock = 4;  // vectors a thread takes in its block's chunk
// Elements a thread takes a step: 16 bytes of 16-bit output, 16 of fp32.
template <typename Scalar>
constexpr int kVecOf = sizeof(Scalar) == 2 ? 8 : 4;

// A read form's parameter: compile-time (Const) for uint8 inputs, the
// common case, each form a loop of its own; a run-time value (Runtime) for
// the other input types, one loop for all forms (the bundle's size).
template <typename T, T kValue>
struct Const {
  static constexpr T value = kValue;
};
template <typename T>
struct Runtime {
  T value;
};

// Calls read(direction, planar input) in its form: one of four compile-time
// forms, or the run-time one.
template <bool kCompileTime, typename F>
__device__ __forceinline__ void ReadInForm(bool flip, bool planar, F& read) {
  if constexpr (!kCompileTime) {
    read(Runtime<int>{flip ? -1 : 1}, Runtime<bool>{planar});
  } else if (planar) {
    flip ? read(Const<int, -1>(), Const<bool, true>()) : read(Const<int, 1>(), Const<bool, true>());
  } else {
    flip ? read(Const<int, -1>(), Const<bool, false>()) : read(Const<int, 1>(), Const<bool, false>());
  }
}

struct Geometry {
  FastDiv vectors;          // vectors a row
  FastDiv rows;             // NCHW out: rows a channel plane (H)
  FastDiv channels;         // C
  uint32_t row_len = 0;     // elements a row: W (NCHW out) or W x C (NHWC out)
  uint32_t per_sample = 0;  // vectors a sample
  uint32_t chunks = 0;      // blocks a sample
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
// 16-bit outputs: the vector is kept in fp32 and converted two at a time at
// the store (one packing conversion, F2FP, for each pair).
template <typename Derived>
struct Out16 {
  using Scalar = uint16_t;
  static __device__ __forceinline__ void Store8(Scalar* o, const float* f) {
    const uint32_t w0 = Derived::Pack2(f[0], f[1]), w1 = Derived::Pack2(f[2], f[3]);
    const uint32_t w2 = Derived::Pack2(f[4], f[5]), w3 = Derived::Pack2(f[6], f[7]);
    if ((reinterpret_cast<uintptr_t>(o) & 15) == 0) {
      *reinterpret_cast<uint4*>(o) = make_uint4(w0, w1, w2, w3);
    } else if ((reinterpret_cast<uintptr_t>(o) & 7) == 0) {
      reinterpret_cast<uint2*>(o)[0] = make_uint2(w0, w1);
      reinterpret_cast<uint2*>(o)[1] = make_uint2(w2, w3);
    } else {  // rows of even width are always 4-byte aligned
      reinterpret_cast<uint32_t*>(o)[0] = w0;
      reinterpret_cast<uint32_t*>(o)[1] = w1;
      reinterpret_cast<uint32_t*>(o)[2] = w2;
      reinterpret_cast<uint32_t*>(o)[3] = w3;
    }
  }
};
// The hardware's round-to-nearest-even conversions (one instruction each);
// FloatToHalfBits / FloatToBf16Bits are their bit-exact CPU twins, which the
// GPU test checks on every value it produces.
template <>
struct OutT<DType::kFloat16> : Out16<OutT<DType::kFloat16>> {
  static __device__ __forceinline__ Scalar Cvt(float v) { return __half_as_ushort(__float2half_rn(v)); }
  static __device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
template <>
struct OutT<DType::kBFloat16> : Out16<OutT<DType::kBFloat16>> {
  static __device__ __forceinline__ Scalar Cvt(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
  static __device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
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

// kLayout: the output layout a kernel writes. uint8 inputs get a kernel a
// layout, so that each gets the registers its own path needs (with both
// paths in one kernel, the NCHW read forms cost the NHWC path 4 points); the
// other input types, one kernel for either layout (the bundle's size).
// kNhwc3Out: NHWC output of 3 channels (RGB) from uint8. Element 3k + r of
// a vector is channel (c0 + r) % 3 of the pixel k + (c0 + r) / 3 past the
// vector's first, c0 its first element's channel: three pointers, columns
// and channel constants set once a vector (one per r), then every element a
// compile-time offset from its r's, with no channel carried element by
// element (the generic NHWC path's cost: docs/benchmarks.md). Vectors and
// stores are the generic path's (consecutive lanes, consecutive 16 bytes).
constexpr int kNchwOut = 0, kNhwcOut = 1, kAnyOut = 2, kNhwc3Out = 3;
// long: not split yet (issue 47, item 6): one fused CUDA kernel; a split needs a GPU host to check its speed
template <DType kOut, DType kIn, int kLayout>
__global__ void __launch_bounds__(kThreads)
    TransformKernel(TransformParams p, Geometry g, const uint8_t* __restrict__ src_bytes,
                    const int64_t* __restrict__ src_labels, void* __restrict__ dst, void* __restrict__ dst_labels) {
  using T = OutT<kOut>;
  using Scalar = typename T::Scalar;
  using In = typename InT<kIn>::Type;
  constexpr int kVec = kVecOf<Scalar>;
  constexpr uint32_t kChunk = uint32_t(kThreads) * kStepsPerBlock;  // vectors a block
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
  const uint32_t sample_elems = uint32_t(C) * uint32_t(H) * uint32_t(W);
  const uint32_t base = blockIdx.x * kChunk;
  for (uint32_t i = blockIdx.y; i < uint32_t(p.batch); i += gridDim.y) {
    const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
    const In* sample = src + uint64_t(SourceSample(p, i)) * sample_elems;
    Scalar* out = static_cast<Scalar*>(dst) + uint64_t(i) * sample_elems;
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
      const uint32_t vec = base + uint32_t(step) * kThreads + threadIdx.x;
      if (vec >= g.per_sample) break;
      const uint32_t row = g.vectors.Div(vec);
      const uint32_t e0 = (vec - row * g.vectors.d) * kVec;  // the vector's first element in its row
      float v[kVec];                                         // converted to the output type at the store
      // The NCHW and NHWC rows; a kernel runs one (kLayout) or either.
      auto nchw_row = [&] {
        const int c = static_cast<int>(g.rows.Div(row)), y = static_cast<int>(row) - c * H;
        const int sy = y + a.dy;
        const bool row_in = sy >= 0 && sy < H;
        const In* srow = sample + (nchw_in ? (uint32_t(c) * H + uint32_t(row_in ? sy : 0)) * W
                                           : uint32_t(row_in ? sy : 0) * W * C + uint32_t(c));
        const float m = s_mean[c], is = s_inv_std[c];
        const uint32_t w_in = row_in ? uint32_t(W) : 0u;  // sx < w_in: inside the image, in a row inside it
        // Source column of element j: sx0 + j * kDir. The direction and
        // (for an NCHW input, stride 1) the step are compile-time in each
        // of the four forms, so a load is the vector's base pointer plus a
        // constant offset: no address arithmetic an element. Which form
        // runs is the same for a whole block (one sample, one layout).
        const int sx0 = (a.flip ? W - 1 - int(e0) : int(e0)) + a.dx;
        auto read = [&](auto dir_c, auto unit_c) {
          const int kDir = dir_c.value;
          const bool kUnit = unit_c.value;
          const int step = kUnit ? kDir : kDir * C;
          const In* q = srow + sx0 * (kUnit ? 1 : C);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            // sx < 0 wraps past w_in. An element past the row's end (the
            // last vector of a row) is never stored: it may read any pixel
            // of its source row, so its load is not tested for the row.
            const bool in = uint32_t(sx0 + j * kDir) < w_in;
            const float px = in ? InT<kIn>::Load(q + j * step) : 0.0f;
            v[j] = (px - m) * is;
          }
        };
        ReadInForm<kIn == DType::kUInt8>(a.flip, nchw_in, read);
      };
      auto nhwc_row = [&] {  // (x, c) carried along the row
        const int y = static_cast<int>(row), sy = y + a.dy;
        const bool row_in = sy >= 0 && sy < H;
        const In* srow = sample + (nchw_in ? uint32_t(row_in ? sy : 0) * W : uint32_t(row_in ? sy : 0) * W * C);
        const int x = static_cast<int>(g.channels.Div(e0)), c0 = static_cast<int>(e0) - x * C;
        const uint32_t w_in = row_in ? uint32_t(W) : 0u;
        const int sx0 = (a.flip ? W - 1 - x : x) + a.dx;  // the source column of the vector's first pixel
        // The source column carried from pixel to pixel in the direction,
        // and the input layout, compile-time in each of the four forms.
        auto read = [&](auto dir_c, auto planar_c) {
          const int kDir = dir_c.value;
          const bool kPlanar = planar_c.value;
          const uint32_t plane = uint32_t(H) * uint32_t(W);
          int c = c0, sx = sx0;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const bool in = uint32_t(sx) < w_in;  // past the row's end: never stored (nchw_row)
            const uint32_t off = kPlanar ? uint32_t(c) * plane + uint32_t(sx) : uint32_t(sx) * C + uint32_t(c);
            const float px = in ? InT<kIn>::Load(srow + off) : 0.0f;
            v[j] = (px - s_mean[c]) * s_inv_std[c];
            if (++c == C) {
              c = 0;
              sx += kDir;
            }
          }
        };
        ReadInForm<kIn == DType::kUInt8>(a.flip, nchw_in, read);
      };
      auto nhwc3_row = [&] {
        const int y = static_cast<int>(row), sy = y + a.dy;
        const bool row_in = sy >= 0 && sy < H;
        const uint32_t sy_row = uint32_t(row_in ? sy : 0);
        const In* srow = sample + (nchw_in ? sy_row * W : sy_row * W * 3u);
        const int x = static_cast<int>(g.channels.Div(e0)), c0 = static_cast<int>(e0) - x * 3;
        const uint32_t w_in = row_in ? uint32_t(W) : 0u;
        const int sx0 = (a.flip ? W - 1 - x : x) + a.dx;
        int ch[3], ahead[3];  // per r: the channel, and the pixels past the first
#pragma unroll
        for (int r = 0; r < 3; ++r) {
          ch[r] = c0 + r >= 3 ? c0 + r - 3 : c0 + r;
          ahead[r] = c0 + r >= 3 ? 1 : 0;
        }
        const float m[3] = {s_mean[ch[0]], s_mean[ch[1]], s_mean[ch[2]]};
        const float is[3] = {s_inv_std[ch[0]], s_inv_std[ch[1]], s_inv_std[ch[2]]};
        auto read = [&](auto dir_c, auto planar_c) {
          const int kDir = dir_c.value;
          const bool kPlanar = planar_c.value;
          const uint32_t plane = uint32_t(H) * uint32_t(W);
          const int pixel_step = kPlanar ? kDir : 3 * kDir;
          int sx[3];
          const In* q[3];
#pragma unroll
          for (int r = 0; r < 3; ++r) {
            sx[r] = sx0 + kDir * ahead[r];
            q[r] = srow + (kPlanar ? ptrdiff_t(uint32_t(ch[r]) * plane) + sx[r] : ptrdiff_t(3 * sx[r] + ch[r]));
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const int r = j % 3, k = j / 3;
            const bool in = uint32_t(sx[r] + k * kDir) < w_in;  // past the row's end: never stored (nchw_row)
            const float px = in ? InT<kIn>::Load(q[r] + k * pixel_step) : 0.0f;
            v[j] = (px - m[r]) * is[r];
          }
        };
        ReadInForm<true>(a.flip, nchw_in, read);
      };
      if constexpr (kLayout == kNhwc3Out) {
        nhwc3_row();
      } else if constexpr (kLayout == kAnyOut) {
        nchw_out ? nchw_row() : nhwc_row();
      } else if constexpr (kLayout == kNchwOut) {
        nchw_row();
      } else {
        nhwc_row();
      }
      Scalar* o = out + row * g.row_len + e0;
      if (e0 + kVec <= g.row_len && (g.row_len & 1) == 0) {
        if constexpr (kVec == 8) {
          T::Store8(o, v);
        } else {
          T::Store4(o, v);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          if (e0 + j < g.row_len) o[j] = T::Cvt(v[j]);
        }
      }
    }
  }
}

using KernelFn = void (*)(TransformParams, Geometry, const uint8_t*, const int64_t*, void*, void*);

// A block per chunk of kThreads x kStepsPerBlock vectors of a sample
// (grid.x), the samples along grid.y (strided past 65,535).
Status Launch(KernelFn kernel, const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
              void* dst_labels, cudaStream_t s) {
  const bool nchw_out = p.out_layout == TensorLayout::kNCHW;
  const uint32_t vec = p.out_dtype == DType::kFloat32 ? 4 : 8;  // kVecOf the output
  Geometry g;
  g.row_len = nchw_out ? uint32_t(p.width) : uint32_t(p.width) * uint32_t(p.channels);
  const uint32_t per_row = (g.row_len + vec - 1) / vec;
  g.vectors = FastDiv::For(per_row);
  g.rows = FastDiv::For(uint32_t(p.height));
  g.channels = FastDiv::For(uint32_t(p.channels));
  g.per_sample = per_row * (nchw_out ? uint32_t(p.channels) * uint32_t(p.height) : uint32_t(p.height));
  const uint32_t chunk = uint32_t(kThreads) * kStepsPerBlock;
  g.chunks = (g.per_sample + chunk - 1) / chunk;
  const dim3 grid(g.chunks, static_cast<unsigned>(std::min(p.batch, 65535)));
  kernel<<<grid, kThreads, 0, s>>>(p, g, src, src_labels, dst, dst_labels);
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

// The kernel for the output layout: one a layout for uint8 inputs (and one
// for 3-channel NHWC output), one for either otherwise (kLayout above).
template <DType kOut, DType kIn>
KernelFn KernelFor(bool nchw, bool rgb_nhwc) {
  if constexpr (kIn == DType::kUInt8) {
    if (rgb_nhwc) return TransformKernel<kOut, kIn, kNhwc3Out>;
    return nchw ? TransformKernel<kOut, kIn, kNchwOut> : TransformKernel<kOut, kIn, kNhwcOut>;
  } else {
    (void)nchw;
    (void)rgb_nhwc;
    return TransformKernel<kOut, kIn, kAnyOut>;
  }
}

template <DType kIn>
Status LaunchOut(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst, void* dst_labels,
                 cudaStream_t s) {
  const bool nchw = p.out_layout == TensorLayout::kNCHW;
  const bool rgb_nhwc = kIn == DType::kUInt8 && !nchw && p.channels == 3;
  switch (p.out_dtype) {
    case DType::kFloat32:
      return Launch(KernelFor<DType::kFloat32, kIn>(nchw, rgb_nhwc), p, src, src_labels, dst, dst_labels, s);
    case DType::kFloat16:
      return Launch(KernelFor<DType::kFloat16, kIn>(nchw, rgb_nhwc), p, src, src_labels, dst, dst_labels, s);
    default:
      return Launch(KernelFor<DType::kBFloat16, kIn>(nchw, rgb_nhwc), p, src, src_labels, dst, dst_labels, s);
  }
}

}  // namespace

Status TransformGpu(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
                    void* dst_labels, void* stream) {
  GPUFEED_RETURN_IF_ERROR(ValidateTransform(p));
  const uint64_t per_sample = uint64_t(p.channels) * p.height * p.width;
  // The kernel's element offsets within a sample are 32-bit.
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
