// The fused transform: CPU reference checked against direct computations;
// the GPU kernel checked against the CPU reference for every dtype, layout,
// normalization, augmentation and echo permutation (on a machine with a GPU;
// skipped with a message elsewhere).
#include "gpu/transform.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gpu/device_ops.h"
#include "tests/testing/gpu_required.h"

namespace gpufeed::gpu {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TransformParams Params(int batch, int c, int h, int w) {
  TransformParams p;
  p.batch = batch;
  p.channels = c;
  p.height = h;
  p.width = w;
  for (int k = 0; k < c; ++k) {
    p.mean[k] = 0;
    p.inv_std[k] = 1;
  }
  return p;
}

TEST(TransformTest, IdentityNormalizationAndLayouts) {
  const int B = 3, C = 3, H = 5, W = 7;
  const auto src = RandomBytes(B * C * H * W, 1);
  std::vector<int64_t> labels = {7, 8, 9};
  TransformParams p = Params(B, C, H, W);
  const float mean[3] = {10, 20, 30}, sd[3] = {2, 4, 8};
  for (int k = 0; k < C; ++k) {
    p.mean[k] = mean[k];
    p.inv_std[k] = 1 / sd[k];
  }
  for (auto in : {TensorLayout::kNCHW, TensorLayout::kNHWC}) {
    for (auto out : {TensorLayout::kNCHW, TensorLayout::kNHWC}) {
      p.in_layout = in;
      p.out_layout = out;
      std::vector<float> dst(src.size());
      std::vector<int64_t> dl(B);
      ASSERT_TRUE(TransformCpu(p, src.data(), labels.data(), dst.data(), dl.data()).ok());
      EXPECT_EQ(dl, labels);
      for (int i = 0; i < B; ++i)
        for (int c = 0; c < C; ++c)
          for (int y = 0; y < H; ++y)
            for (int x = 0; x < W; ++x) {
              const size_t si =
                  in == TensorLayout::kNCHW ? ((i * C + c) * H + y) * W + x : ((i * H + y) * W + x) * C + c;
              const size_t di =
                  out == TensorLayout::kNCHW ? ((i * C + c) * H + y) * W + x : ((i * H + y) * W + x) * C + c;
              ASSERT_EQ(dst[di], (float(src[si]) - mean[c]) * (1 / sd[c])) << i << c << y << x;
            }
    }
  }
}

TEST(TransformTest, CropWithZeroPaddingAndFlipFollowAugFor) {
  const int B = 16, C = 1, H = 6, W = 9;
  const auto src = RandomBytes(B * H * W, 2);
  TransformParams p = Params(B, C, H, W);
  p.crop_padding = 2;
  p.flip = true;
  p.seed = 1234;
  std::vector<float> dst(src.size());
  ASSERT_TRUE(TransformCpu(p, src.data(), nullptr, dst.data(), nullptr).ok());
  int flipped = 0, shifted = 0;
  for (int i = 0; i < B; ++i) {
    const SampleAug a = AugFor(p.seed, i, 2, true);
    flipped += a.flip;
    shifted += a.dx != 0 || a.dy != 0;
    EXPECT_LE(std::abs(a.dx), 2);
    EXPECT_LE(std::abs(a.dy), 2);
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        // Crop the zero-padded image at (2 + dy, 2 + dx), then mirror it.
        const int cx = a.flip ? W - 1 - x : x;
        const int sy = y + a.dy, sx = cx + a.dx;
        const float want = (sy < 0 || sy >= H || sx < 0 || sx >= W) ? 0.f : float(src[(i * H + sy) * W + sx]);
        ASSERT_EQ(dst[(i * H + y) * W + x], want) << "sample " << i;
      }
  }
  EXPECT_GT(flipped, 2);
  EXPECT_LT(flipped, 14);
  EXPECT_GT(shifted, 8);
  // Same seed, same bytes; another seed, other crops.
  std::vector<float> again(src.size()), other(src.size());
  ASSERT_TRUE(TransformCpu(p, src.data(), nullptr, again.data(), nullptr).ok());
  EXPECT_EQ(again, dst);
  p.seed = 99;
  ASSERT_TRUE(TransformCpu(p, src.data(), nullptr, other.data(), nullptr).ok());
  EXPECT_NE(other, dst);
}

TEST(TransformTest, FastDivEqualsDivision) {
  std::mt19937 rng(5);
  for (uint32_t d : {1u, 2u, 3u, 5u, 7u, 29u, 30u, 64u, 178u, 534u, 38804u, 65535u, 65537u, 0x7FFFFFFFu, 0x80000000u,
                     0x80000001u, 0xFFFFFFFFu}) {
    const FastDiv f = FastDiv::For(d);
    std::vector<uint32_t> ns = {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u};
    for (int k = 0; k < 20000; ++k) ns.push_back(rng());
    for (uint32_t n : ns) ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
  }
  for (int k = 0; k < 20000; ++k) {
    const uint32_t d = 1 + rng() % 100000, n = rng();
    ASSERT_EQ(FastDiv::For(d).Div(n), n / d) << n << " / " << d;
  }
}

TEST(TransformTest, EchoPermutationIsABijection) {
  for (uint32_t n : {1u, 2u, 3u, 5u, 100u, 256u, 257u, 1000u, 4097u}) {
    for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
      std::set<uint32_t> seen;
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t v = EchoPermutation(i, n, seed);
        ASSERT_LT(v, n);
        seen.insert(v);
      }
      ASSERT_EQ(seen.size(), n) << "n " << n;
    }
  }
  int moved = 0;
  for (uint32_t i = 0; i < 1000; ++i) moved += EchoPermutation(i, 1000, 5) != i;
  EXPECT_GT(moved, 900);
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(TransformTest, HalfAndBf16RoundToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalfBits(0.1f), 0x2E66);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalfBits(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7C00);              // rounds to inf
  EXPECT_EQ(FloatToHalfBits(FromBits(0x33800000)), 0x0001);  // 2^-24, smallest subnormal
  EXPECT_EQ(FloatToHalfBits(FromBits(0x33000000)), 0x0000);  // 2^-25: tie, to even (0)
  EXPECT_EQ(FloatToHalfBits(1.0f + 1.0f / 2048), 0x3C00);    // tie between 1 and 1+2^-10: even
  EXPECT_EQ(FloatToHalfBits(1.0f + 3.0f / 2048), 0x3C02);    // tie: up to even
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3F808000)), 0x3F80);  // tie: even
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3F818000)), 0x3F82);  // tie: up to even
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3F808001)), 0x3F81);
}

// Input elements of every input dtype, as the bytes a dataset stores them:
// element e of the batch is `Value(dt, e)` (negative, fractional, large and
// subnormal values where the dtype has them).
double InputValue(DType dt, size_t e) {
  switch (dt) {
    case DType::kUInt16:
      return double((e * 2654435761u) % 65536);
    case DType::kInt16:
      return double(int64_t((e * 2654435761u) % 65536) - 32768);
    case DType::kFloat16:
      return (double(int64_t(e % 257) - 128) / 8.0);  // exact in half
    case DType::kFloat32:
      return double(float(e % 1000) * 0.37f - 150.0f);
    default:
      return double(e % 256);
  }
}

std::vector<uint8_t> InputBytes(DType dt, size_t n) {
  std::vector<uint8_t> out(n * InputElementBytes(dt));
  for (size_t e = 0; e < n; ++e) {
    const double v = InputValue(dt, e);
    uint8_t* o = out.data() + e * InputElementBytes(dt);
    if (dt == DType::kUInt16) {
      const uint16_t x = uint16_t(v);
      std::memcpy(o, &x, 2);
    } else if (dt == DType::kInt16) {
      const int16_t x = int16_t(v);
      std::memcpy(o, &x, 2);
    } else if (dt == DType::kFloat16) {
      const uint16_t x = FloatToHalfBits(float(v));
      std::memcpy(o, &x, 2);
    } else if (dt == DType::kFloat32) {
      const float x = float(v);
      std::memcpy(o, &x, 4);
    } else {
      *o = uint8_t(v);
    }
  }
  return out;
}

TEST(TransformTest, HalfBitsToFloatIsExact) {
  EXPECT_EQ(HalfBitsToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfBitsToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfBitsToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfBitsToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfBitsToFloat(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfBitsToFloat(0x8000), -0.0f);
  EXPECT_TRUE(std::isinf(HalfBitsToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7E00)));
  for (uint32_t h = 0; h < 0x7C00; ++h) {  // every finite half round-trips
    ASSERT_EQ(FloatToHalfBits(HalfBitsToFloat(uint16_t(h))), h) << h;
  }
}

// The CPU twin over every input dtype against a direct computation.
TEST(TransformTest, InputDtypesNormalizeTheirExactValues) {
  const int B = 2, C = 2, H = 3, W = 5;
  const size_t n = size_t(B) * C * H * W;
  for (DType in : {DType::kUInt8, DType::kUInt16, DType::kInt16, DType::kFloat16, DType::kFloat32}) {
    const auto src = InputBytes(in, n);
    TransformParams p = Params(B, C, H, W);
    p.in_dtype = in;
    p.mean[0] = 3.5f;
    p.mean[1] = -1.25f;
    p.inv_std[0] = 0.5f;
    p.inv_std[1] = 0.25f;
    std::vector<float> dst(n);
    ASSERT_TRUE(TransformCpu(p, src.data(), nullptr, dst.data(), nullptr).ok()) << DTypeName(in);
    for (size_t e = 0; e < n; ++e) {
      const int c = int((e / (H * W)) % C);
      const float want = (float(InputValue(in, e)) - p.mean[c]) * p.inv_std[c];
      ASSERT_EQ(dst[e], want) << DTypeName(in) << " element " << e;
    }
  }
  TransformParams bad = Params(1, 1, 1, 1);
  bad.in_dtype = DType::kFloat64;
  float out = 0;
  uint8_t in[8] = {};
  const Status s = TransformCpu(bad, in, nullptr, &out, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("float64"), std::string::npos) << s.ToString();
}

// Round-to-nearest-even of a float to bf16 and fp16, computed apart from the
// transform's bit tricks: the two representable neighbours found by
// truncation (bf16) or by a search over every finite half (whose values
// HalfBitsToFloat gives exactly: HalfBitsToFloatIsExact), and the nearer
// taken, ties to the even one.
uint16_t ReferenceBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
  const double dlo = std::fabs(double(FromBits(lo)) - double(f));
  const double dhi = std::isinf(FromBits(hi)) ? std::fabs(std::ldexp(1.0, 128) - std::fabs(double(f)))
                                              : std::fabs(double(FromBits(hi)) - double(f));
  if (dlo < dhi) return uint16_t(lo >> 16);
  if (dhi < dlo) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1) == 0 ? uint16_t(lo >> 16) : uint16_t(hi >> 16);
}
uint16_t ReferenceHalf(float f) {
  if (std::isnan(f)) return 0x7E00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7C00;  // 65504 + half its last step and up: infinity (65504 is odd)
  uint32_t lo = 0, hi = 0x7BFF;            // the largest half at most a: values grow with the bits
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (double(HalfBitsToFloat(uint16_t(mid))) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo == 0x7BFF) return sign | 0x7BFF;
  const double below = a - double(HalfBitsToFloat(uint16_t(lo)));
  const double above = double(HalfBitsToFloat(uint16_t(lo + 1))) - a;
  const uint32_t pick = below < above ? lo : above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return uint16_t(sign | pick);
}

// The CPU twin's bf16 and fp16 output, every element, equals its own float32
// output rounded to nearest even (by the references above), with
// normalization, crop, flip and an echo permutation on: the values the GPU
// kernel is then compared with bit for bit (TransformGpuTest) are right on
// their own, here, where CI runs.
TEST(TransformTest, HalfOutputsAreTheFloat32OutputRoundedToNearestEven) {
  EXPECT_EQ(ReferenceBf16(FromBits(0x3F808000)), 0x3F80);  // the references' own ties
  EXPECT_EQ(ReferenceBf16(FromBits(0x3F818000)), 0x3F82);
  EXPECT_EQ(ReferenceHalf(1.0f + 1.0f / 2048), 0x3C00);
  EXPECT_EQ(ReferenceHalf(1.0f + 3.0f / 2048), 0x3C02);
  const int B = 6, C = 3, H = 9, W = 11;
  const size_t n = size_t(B) * C * H * W;
  int rounded = 0;  // elements whose float32 value is not exact in the half type
  for (DType in : {DType::kUInt8, DType::kFloat32}) {
    // Two passes' samples: the echo permutation draws the batch from 2 B.
    const auto src = InputBytes(in, 2 * n);
    std::vector<int64_t> labels(2 * B);
    for (int i = 0; i < 2 * B; ++i) labels[i] = i;
    TransformParams p = Params(B, C, H, W);
    p.in_dtype = in;
    const float mean[3] = {125.3f, 122.9f, 113.8f}, sd[3] = {62.99f, 62.08f, 66.7f};
    for (int k = 0; k < C; ++k) {
      p.mean[k] = mean[k];
      p.inv_std[k] = 1 / sd[k];
    }
    p.in_layout = TensorLayout::kNHWC;
    p.out_layout = TensorLayout::kNCHW;
    p.crop_padding = 3;
    p.flip = true;
    p.seed = 5;
    p.perm_domain = 2 * B;
    p.perm_offset = B;
    p.perm_seed = 17;
    std::vector<float> f32(n);
    std::vector<int64_t> l32(B);
    ASSERT_TRUE(TransformCpu(p, src.data(), labels.data(), f32.data(), l32.data()).ok());
    for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
      p.out_dtype = dt;
      std::vector<uint16_t> half(n, 0xEEEE);
      std::vector<int64_t> lh(B, -1);
      ASSERT_TRUE(TransformCpu(p, src.data(), labels.data(), half.data(), lh.data()).ok());
      EXPECT_EQ(lh, l32);
      for (size_t e = 0; e < n; ++e) {
        const uint16_t want = dt == DType::kFloat16 ? ReferenceHalf(f32[e]) : ReferenceBf16(f32[e]);
        ASSERT_EQ(half[e], want) << DTypeName(dt) << " element " << e << " float32 " << f32[e];
        const float back = dt == DType::kFloat16 ? HalfBitsToFloat(half[e]) : FromBits(uint32_t(half[e]) << 16);
        rounded += back != f32[e];
      }
    }
  }
  EXPECT_GT(rounded, int(n));  // the rounding was exercised, not only exact values
}

// GPU against CPU over every input dtype (output dtypes, layouts and
// augmentation included). Skips where no GPU is usable.
TEST(TransformGpuTest, InputDtypesMatchTheCpuReferenceBitForBit) {
  auto ops = MakeCudaOps(0);
  if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << ops.status().ToString() << ")");
  DeviceOps& d = **ops;
  const int B = 5, C = 3, H = 11, W = 13;
  const size_t n = size_t(B) * C * H * W;
  int cases = 0;
  for (DType in : {DType::kUInt8, DType::kUInt16, DType::kInt16, DType::kFloat16, DType::kFloat32}) {
    const auto src = InputBytes(in, n);
    // The stream first: it outlives the buffers its work uses.
    auto stream = d.NewStream();
    ASSERT_TRUE(stream.ok());
    auto dsrc = d.Alloc(src.size());
    ASSERT_TRUE(dsrc.ok());
    auto ddst = d.Alloc(n * 4);
    ASSERT_TRUE(ddst.ok());
    ASSERT_TRUE(d.CopyToDevice(dsrc->get(), src.data(), src.size(), stream->ref()).ok());
    for (DType out : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (auto in_layout : {TensorLayout::kNCHW, TensorLayout::kNHWC}) {
        for (int aug = 0; aug < 2; ++aug) {
          TransformParams p = Params(B, C, H, W);
          p.in_dtype = in;
          p.out_dtype = out;
          p.in_layout = in_layout;
          p.out_layout = aug ? TensorLayout::kNHWC : TensorLayout::kNCHW;
          for (int k = 0; k < C; ++k) {
            p.mean[k] = 0.5f * k - 3.0f;
            p.inv_std[k] = 1.0f / (1.5f + k);
          }
          p.crop_padding = aug ? 3 : 0;
          p.flip = aug;
          p.seed = 900 + cases;
          const size_t bytes = n * DTypeSize(out);
          std::vector<uint8_t> want(bytes), got(bytes, 0xEE);
          ASSERT_TRUE(TransformCpu(p, src.data(), nullptr, want.data(), nullptr).ok());
          ASSERT_TRUE(
              d.Transform(p, static_cast<const uint8_t*>(dsrc->get()), nullptr, ddst->get(), nullptr, stream->ref())
                  .ok());
          ASSERT_TRUE(d.StreamSync(stream->ref()).ok());
          ASSERT_TRUE(d.CopyToHost(got.data(), ddst->get(), bytes, EventRef{}).ok());
          ASSERT_EQ(got, want) << DTypeName(in) << " -> " << DTypeName(out) << " in " << int(in_layout) << " aug "
                               << aug;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 60);
}

// GPU against CPU, every combination. Skips where no GPU is usable.
TEST(TransformGpuTest, MatchesTheCpuReferenceBitForBit) {
  auto ops = MakeCudaOps(0);
  if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << ops.status().ToString() << ")");
  DeviceOps& d = **ops;
  int cases = 0;
  // Odd width: scalar stores; even: the kernel's vector stores; 64: rows
  // 16-byte aligned (16-byte stores of 16-bit outputs) and uint8 rows read
  // as aligned words. 3 channels: NHWC output a whole pixel at a time (its
  // own kernel); 4: an element at a time.
  constexpr std::pair<int, int> kShapes[] = {{29, 3}, {30, 3}, {64, 3}, {29, 4}, {30, 4}};  // width, channels
  for (const auto& [W, C] : kShapes) {
    const int B = 9, H = 37;
    const size_t n = size_t(B) * C * H * W;
    const auto src = RandomBytes(n * 2, 3);  // a super-batch of 2B samples, for the echo gather
    std::vector<int64_t> labels(2 * B);
    for (int i = 0; i < 2 * B; ++i) labels[i] = 1000 + i;
    auto stream = d.NewStream();  // first: it outlives the buffers its work uses
    ASSERT_TRUE(stream.ok());
    auto dsrc = d.Alloc(src.size());
    ASSERT_TRUE(dsrc.ok());
    auto dlab = d.Alloc(labels.size() * 8);
    ASSERT_TRUE(dlab.ok());
    auto ddst = d.Alloc(n * 4);
    ASSERT_TRUE(ddst.ok());
    auto ddl = d.Alloc(B * 8);
    ASSERT_TRUE(ddl.ok());
    ASSERT_TRUE(d.CopyToDevice(dsrc->get(), src.data(), src.size(), stream->ref()).ok());
    ASSERT_TRUE(d.CopyToDevice(dlab->get(), labels.data(), labels.size() * 8, stream->ref()).ok());
    ASSERT_TRUE(d.StreamSync(stream->ref()).ok());
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (auto in : {TensorLayout::kNCHW, TensorLayout::kNHWC}) {
        for (auto out : {TensorLayout::kNCHW, TensorLayout::kNHWC}) {
          for (int aug = 0; aug < 2; ++aug) {
            for (int perm = 0; perm < 2; ++perm) {
              TransformParams p = Params(B, C, H, W);
              p.out_dtype = dt;
              p.in_layout = in;
              p.out_layout = out;
              p.labels_int32 = perm;
              const float mean[4] = {125.3f, 122.9f, 113.8f, 101.1f}, sd[4] = {62.99f, 62.08f, 66.7f, 58.3f};
              for (int k = 0; k < C; ++k) {
                p.mean[k] = mean[k];
                p.inv_std[k] = 1 / sd[k];
              }
              p.crop_padding = aug ? 4 : 0;
              p.flip = aug;
              p.seed = 77 + cases;
              if (perm) {
                p.perm_domain = 2 * B;
                p.perm_offset = B;
                p.perm_seed = 4242;
              }
              const size_t bytes = n * DTypeSize(dt);
              std::vector<uint8_t> want(bytes), got(bytes, 0xEE);
              std::vector<int64_t> want_l(B), got_l(B, -7);
              ASSERT_TRUE(TransformCpu(p, src.data(), labels.data(), want.data(), want_l.data()).ok());
              ASSERT_TRUE(d.Transform(p, static_cast<const uint8_t*>(dsrc->get()),
                                      static_cast<const int64_t*>(dlab->get()), ddst->get(), ddl->get(), stream->ref())
                              .ok());
              ASSERT_TRUE(d.StreamSync(stream->ref()).ok());
              ASSERT_TRUE(d.CopyToHost(got.data(), ddst->get(), bytes, EventRef{}).ok());
              ASSERT_TRUE(d.CopyToHost(got_l.data(), ddl->get(), B * (perm ? 4 : 8), EventRef{}).ok());
              ASSERT_EQ(got, want) << DTypeName(dt) << " in " << int(in) << " out " << int(out) << " aug " << aug
                                   << " perm " << perm;
              ASSERT_EQ(0, std::memcmp(got_l.data(), want_l.data(), B * (perm ? 4 : 8)));
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 240);  // 5 shapes x 3 dtypes x 4 layouts x 2 augmentations x 2 permutations
}

// Batches over 65,535 samples: the kernel's grid holds at most that many
// along its sample axis, and its blocks stride past it.
TEST(TransformGpuTest, BatchesPastTheGridsSampleAxisStillMatch) {
  auto ops = MakeCudaOps(0);
  if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << ops.status().ToString() << ")");
  DeviceOps& d = **ops;
  const int B = 70000, C = 3, H = 6, W = 5;
  const size_t n = size_t(B) * C * H * W;
  const auto src = RandomBytes(n, 11);
  std::vector<int64_t> labels(B);
  for (int i = 0; i < B; ++i) labels[i] = i;
  auto stream = d.NewStream();  // first: it outlives the buffers its work uses
  ASSERT_TRUE(stream.ok());
  auto dsrc = d.Alloc(src.size());
  ASSERT_TRUE(dsrc.ok());
  auto dlab = d.Alloc(labels.size() * 8);
  ASSERT_TRUE(dlab.ok());
  auto ddst = d.Alloc(n * 4);
  ASSERT_TRUE(ddst.ok());
  auto ddl = d.Alloc(B * 8);
  ASSERT_TRUE(ddl.ok());
  ASSERT_TRUE(d.CopyToDevice(dsrc->get(), src.data(), src.size(), stream->ref()).ok());
  ASSERT_TRUE(d.CopyToDevice(dlab->get(), labels.data(), labels.size() * 8, stream->ref()).ok());
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    TransformParams p = Params(B, C, H, W);
    p.out_dtype = dt;
    p.crop_padding = 2;
    p.flip = true;
    p.seed = 5;
    const size_t bytes = n * DTypeSize(dt);
    std::vector<uint8_t> want(bytes), got(bytes, 0xEE);
    std::vector<int64_t> want_l(B), got_l(B, -7);
    ASSERT_TRUE(TransformCpu(p, src.data(), labels.data(), want.data(), want_l.data()).ok());
    ASSERT_TRUE(d.Transform(p, static_cast<const uint8_t*>(dsrc->get()), static_cast<const int64_t*>(dlab->get()),
                            ddst->get(), ddl->get(), stream->ref())
                    .ok());
    ASSERT_TRUE(d.StreamSync(stream->ref()).ok());
    ASSERT_TRUE(d.CopyToHost(got.data(), ddst->get(), bytes, EventRef{}).ok());
    ASSERT_TRUE(d.CopyToHost(got_l.data(), ddl->get(), B * 8, EventRef{}).ok());
    EXPECT_EQ(got, want) << DTypeName(dt);
    EXPECT_EQ(got_l, want_l);
  }
}

}  // namespace
}  // namespace gpufeed::gpu
