// The fused batch transform: uint8, uint16, int16, float16 or float32
// samples (TransformParams::in_dtype) -> per-channel (x - mean) / std in
// fp32/fp16/bf16, NCHW or NHWC from either, with an optional random crop
// (zero padding) and horizontal flip per sample, and an optional gather
// through a permutation (batch echoing). One pass over the bytes.
//
// TransformCpu (transform_cpu.cc) is the reference; TransformGpu
// (transform.cu) has the same signature plus a stream and must produce the
// same bytes: fp32 exactly (the same float operations, no contraction is
// possible in (x - m) * s), fp16/bf16 exactly too (both round the same fp32
// value to nearest-even), which the tests check on the GPU host.
#ifndef GPUFEED_GPU_TRANSFORM_H_
#define GPUFEED_GPU_TRANSFORM_H_

#include <cstdint>

#include "gpufeed/dtype.h"
#include "gpufeed/status.h"

#ifdef __CUDACC__
#define GPUFEED_HD __host__ __device__ __forceinline__
#else
#define GPUFEED_HD inline
#endif

namespace gpufeed::gpu {

enum class TensorLayout : int { kNCHW = 0, kNHWC = 1 };

// Channels the feed normalizes per channel (DeepCAM has 16).
constexpr int kMaxChannels = 16;

struct TransformParams {
  int batch = 0;  // output samples
  int channels = 0, height = 0, width = 0;
  TensorLayout in_layout = TensorLayout::kNCHW;
  TensorLayout out_layout = TensorLayout::kNCHW;
  // Input elements: kUInt8 (default), kUInt16, kInt16, kFloat16 or kFloat32;
  // each is converted to fp32 exactly before (x - mean) * inv_std.
  DType in_dtype = DType::kUInt8;
  DType out_dtype = DType::kFloat32;  // kFloat32, kFloat16 or kBFloat16
  bool labels_int32 = false;          // else int64
  float mean[kMaxChannels] = {};
  float inv_std[kMaxChannels] = {};  // 1 / std
  int crop_padding = 0;              // 0: no crop
  bool flip = false;
  uint64_t seed = 0;  // augmentation seed of this output batch
  // Output sample i reads input sample perm_offset + i through the
  // permutation (see EchoPermutation) when perm_domain > 0, else sample
  // perm_offset + i itself.
  uint32_t perm_offset = 0;
  uint32_t perm_domain = 0;  // size of the permuted super-batch (0: none)
  uint64_t perm_seed = 0;
};

Status ValidateTransform(const TransformParams& p);

// splitmix64 finalizer: the one hash both sides use.
GPUFEED_HD uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// n / d for n < 2^32 with a multiply and shifts (Granlund and Montgomery's
// round-up method), made on the host: the transform kernel's index
// arithmetic, checked against division by TransformTest.FastDiv*.
struct FastDiv {
  uint32_t d = 1, m = 0;
  int s = 0;  // shift after the first halving step; -1: d == 1
  static FastDiv For(uint32_t d) {
    FastDiv f;
    f.d = d;
    if (d == 1) {
      f.s = -1;
      return f;
    }
    int l = 0;
    while ((uint64_t(1) << l) < d) ++l;  // l = ceil(log2 d) >= 1
    f.m = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << l) - d)) / d + 1);
    f.s = l - 1;
    return f;
  }
  GPUFEED_HD uint32_t Div(uint32_t n) const {
    if (s < 0) return n;
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, m);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t(n) * m) >> 32);
#endif
    return (t + ((n - t) >> 1)) >> s;
  }
};

struct SampleAug {
  int dy = 0, dx = 0;  // crop offset in [-padding, padding]
  bool flip = false;
};

GPUFEED_HD SampleAug AugFor(uint64_t seed, uint32_t i, int padding, bool flip) {
  SampleAug a;
  const uint64_t h = Mix64(seed ^ (0xA24BAED4963EE407ull * (uint64_t(i) + 1)));
  const uint32_t span = 2u * static_cast<uint32_t>(padding) + 1u;
  if (padding > 0) {
    a.dy = static_cast<int>((h & 0xffffu) % span) - padding;
    a.dx = static_cast<int>(((h >> 16) & 0xffffu) % span) - padding;
  }
  a.flip = flip && ((h >> 40) & 1u);
  return a;
}

// A bijection of [0, n) keyed by `seed`: a 4-round Feistel network on the
// smallest even power of two >= n, cycle-walking out-of-range values back in.
// Computed per index on either side, so an echo pass needs no sort and no
// upload, and the CPU twin is the same function.
GPUFEED_HD uint32_t EchoPermutation(uint32_t i, uint32_t n, uint64_t seed) {
  int bits = 2;
  while ((1u << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint32_t mask = (1u << half) - 1u;
  uint32_t x = i;
  do {
    uint32_t l = x >> half, r = x & mask;
    for (uint32_t round = 0; round < 4; ++round) {
      const uint32_t f = static_cast<uint32_t>(Mix64(seed + round * 0x632BE59BD9B4E019ull + r)) & mask;
      const uint32_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << half) | r;
  } while (x >= n);
  return x;
}

GPUFEED_HD uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

// Round-to-nearest-even conversions of fp32, bit-exact with CUDA's
// __float2half_rn and __float2bfloat16_rn (which the kernel uses) for every
// finite value; NaN stays NaN.
GPUFEED_HD uint16_t FloatToBf16Bits(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

GPUFEED_HD uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf (>= 65520)
  if (abs < 0x38800000u) {                                               // subnormal half or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);           // < 2^-25 rounds to 0
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));  // rebias exponent 127 -> 15
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// IEEE half bits to fp32, exact for every value (subnormals, inf, NaN): the
// CPU twin of CUDA's __half2float.
GPUFEED_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // +-0
  } else {        // subnormal: normalize
    exp = 113u;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

// Bytes of one input element (in_dtype), 0 for a dtype the transform does not take.
GPUFEED_HD uint32_t InputElementBytes(DType t) {
  switch (t) {
    case DType::kUInt8:
      return 1;
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    default:
      return 0;
  }
}

// Element `off` of a sample of in_dtype `t` starting at `sample`, as fp32.
GPUFEED_HD float LoadInput(DType t, const uint8_t* sample, uint32_t off) {
  switch (t) {
    case DType::kUInt16: {
      uint16_t v;
      __builtin_memcpy(&v, sample + uint64_t(off) * 2, 2);
      return static_cast<float>(v);
    }
    case DType::kInt16: {
      int16_t v;
      __builtin_memcpy(&v, sample + uint64_t(off) * 2, 2);
      return static_cast<float>(v);
    }
    case DType::kFloat16: {
      uint16_t v;
      __builtin_memcpy(&v, sample + uint64_t(off) * 2, 2);
      return HalfBitsToFloat(v);
    }
    case DType::kFloat32: {
      float v;
      __builtin_memcpy(&v, sample + uint64_t(off) * 4, 4);
      return v;
    }
    default:
      return static_cast<float>(sample[off]);
  }
}

// The input sample output sample i reads.
GPUFEED_HD uint32_t SourceSample(const TransformParams& p, uint32_t i) {
  return p.perm_domain ? EchoPermutation(p.perm_offset + i, p.perm_domain, p.perm_seed) : p.perm_offset + i;
}

// The value of output element (c, y, x) of a sample whose bytes start at
// `sample` (of p.in_dtype elements) and whose augmentation is `a`, before
// conversion. The CPU twin
// calls it per element; the kernel computes the same value row by row
// (TransformKernel in transform.cu, vectorized along x), so the two are kept
// equal by the GPU-vs-CPU test (tests/gpu/transform_test.cc), not by sharing
// this function. 32-bit index math: one sample is far below 4 GiB.
GPUFEED_HD float ElementValue(const TransformParams& p, const uint8_t* sample, SampleAug a, int c, int y, int x) {
  const int xs = a.flip ? (p.width - 1 - x) : x;
  const int sy = y + a.dy, sx = xs + a.dx;
  float v = 0.0f;  // zero padding, as torchvision's RandomCrop(padding)
  if (sy >= 0 && sy < p.height && sx >= 0 && sx < p.width) {
    const uint32_t off = p.in_layout == TensorLayout::kNCHW ? (uint32_t(c) * p.height + sy) * uint32_t(p.width) + sx
                                                            : (uint32_t(sy) * p.width + sx) * uint32_t(p.channels) + c;
    v = LoadInput(p.in_dtype, sample, off);
  }
  return (v - p.mean[c]) * p.inv_std[c];
}

// Offset of element (c, y, x) within one output sample.
GPUFEED_HD uint32_t OutputOffset(const TransformParams& p, int c, int y, int x) {
  return p.out_layout == TensorLayout::kNCHW ? (uint32_t(c) * p.height + y) * uint32_t(p.width) + x
                                             : (uint32_t(y) * p.width + x) * uint32_t(p.channels) + c;
}

// CPU reference: writes p.batch samples to dst_images and their labels
// (gathered through the same permutation) to dst_labels.
Status TransformCpu(const TransformParams& p, const uint8_t* src_images, const int64_t* src_labels, void* dst_images,
                    void* dst_labels);

// GPU: the same on `stream` (a cudaStream_t). Returns the CUDA error by name
// on a failed launch. Defined only in CUDA builds.
Status TransformGpu(const TransformParams& p, const uint8_t* src_images, const int64_t* src_labels, void* dst_images,
                    void* dst_labels, void* stream);

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_TRANSFORM_H_
