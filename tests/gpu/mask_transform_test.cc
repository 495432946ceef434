// The mask transform: an integer mask gets exactly the crop, flip and echo
// gather of its image (checked on the CPU twins with pixels that encode their
// position), every integer dtype in, int32/int64 out, fill outside; the GPU
// kernel against the CPU reference (on a machine with a GPU).
#include "gpu/mask_transform.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu/device_ops.h"
#include "tests/testing/gpu_required.h"

namespace gpufeed::gpu {
namespace {

TransformParams AugParams(int batch, int h, int w, uint64_t seed) {
  TransformParams p;
  p.batch = batch;
  p.channels = 1;
  p.height = h;
  p.width = w;
  p.in_dtype = DType::kFloat32;  // the image's; the mask's is MaskParams::in_dtype
  p.mean[0] = 0;
  p.inv_std[0] = 1;
  p.crop_padding = 3;
  p.flip = true;
  p.seed = seed;
  return p;
}

// Sample k's pixel (y, x) is k * 10000 + y * 100 + x + 1 (never 0: 0 is the
// padding of both transforms).
std::vector<int32_t> PositionPixels(int samples, int h, int w) {
  std::vector<int32_t> v(size_t(samples) * h * w);
  for (int k = 0; k < samples; ++k)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) v[(size_t(k) * h + y) * w + x] = k * 10000 + y * 100 + x + 1;
  return v;
}

TEST(MaskTransformTest, MaskStaysAlignedWithItsImage) {
  const int B = 12, H = 9, W = 14;
  const auto pixels = PositionPixels(2 * B, H, W);
  const auto* bytes = reinterpret_cast<const uint8_t*>(pixels.data());
  const std::vector<float> image_pixels(pixels.begin(), pixels.end());  // exact: < 2^24
  const auto* image_bytes = reinterpret_cast<const uint8_t*>(image_pixels.data());
  for (int perm = 0; perm < 2; ++perm) {
    TransformParams p = AugParams(B, H, W, 31 + perm);
    if (perm) {  // an echo pass: both gather through the same permutation
      p.perm_domain = 2 * B;
      p.perm_offset = B;
      p.perm_seed = 99;
    }
    std::vector<float> image(size_t(B) * H * W);
    std::vector<int32_t> mask(size_t(B) * H * W, -1);
    ASSERT_TRUE(TransformCpu(p, image_bytes, nullptr, image.data(), nullptr).ok());
    MaskParams m;
    m.in_dtype = DType::kInt32;
    m.fill = 0;
    ASSERT_TRUE(MaskTransformCpu(p, m, bytes, mask.data()).ok());
    int moved = 0, padded = 0;
    for (size_t e = 0; e < image.size(); ++e) {
      ASSERT_EQ(static_cast<int32_t>(image[e]), mask[e]) << "element " << e << " perm " << perm;
      const int y = int(e / W) % H, x = int(e % W);
      if (mask[e] == 0) {
        ++padded;
      } else if (mask[e] % 10000 != y * 100 + x + 1) {
        ++moved;
      }
    }
    EXPECT_GT(moved, 0) << "no sample was cropped or flipped: the test checks nothing";
    EXPECT_GT(padded, 0);
  }
}

TEST(MaskTransformTest, EveryIntegerDtypeAndFill) {
  const int B = 3, H = 4, W = 5, P = 2;
  const size_t n = size_t(B) * P * H * W;
  for (DType in :
       {DType::kInt8, DType::kUInt8, DType::kInt16, DType::kUInt16, DType::kInt32, DType::kUInt32, DType::kInt64}) {
    const uint32_t es = MaskElementBytes(in);
    std::vector<uint8_t> src(n * es);
    std::vector<int64_t> want(n);
    for (size_t e = 0; e < n; ++e) {
      int64_t v = int64_t(e % 50) -
                  (in == DType::kInt8 || in == DType::kInt16 || in == DType::kInt32 || in == DType::kInt64 ? 20 : 0);
      if (in == DType::kUInt32) v += 3000000000ll;  // above int32: int64 output keeps it
      if (in == DType::kInt64) v *= 1000000000000ll;
      want[e] = v;
      std::memcpy(src.data() + e * es, &v, es);  // little-endian: the low bytes
    }
    TransformParams p = AugParams(B, H, W, 0);
    p.crop_padding = 0;
    p.flip = false;
    MaskParams m;
    m.in_dtype = in;
    m.planes = P;
    m.out_int64 = true;
    std::vector<int64_t> got(n);
    ASSERT_TRUE(MaskTransformCpu(p, m, src.data(), got.data()).ok()) << DTypeName(in);
    EXPECT_EQ(got, want) << DTypeName(in);
  }
  // Fill: a crop of everything out of range reads the fill value.
  TransformParams p = AugParams(1, 1, 1, 5);
  p.crop_padding = 2;
  p.flip = false;
  int32_t one = 7, out = 0;
  MaskParams m;
  m.fill = -100;
  int hits = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    p.seed = seed;
    ASSERT_TRUE(MaskTransformCpu(p, m, reinterpret_cast<const uint8_t*>(&one), &out).ok());
    const SampleAug a = AugFor(seed, 0, 2, false);
    EXPECT_EQ(out, a.dx == 0 && a.dy == 0 ? 7 : -100);
    hits += out == -100;
  }
  EXPECT_GT(hits, 0);
  m.in_dtype = DType::kFloat32;
  EXPECT_EQ(MaskTransformCpu(p, m, reinterpret_cast<const uint8_t*>(&one), &out).code(), StatusCode::kUnsupported);
}

TEST(MaskTransformGpuTest, MatchesTheCpuReference) {
  auto ops = MakeCudaOps(0);
  if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << ops.status().ToString() << ")");
  DeviceOps& d = **ops;
  const int B = 7, H = 13, W = 17;
  const auto pixels = PositionPixels(2 * B, H, W);
  auto stream = d.NewStream();  // first: it outlives the buffers its work uses
  ASSERT_TRUE(stream.ok());
  auto dsrc = d.Alloc(pixels.size() * 4);
  ASSERT_TRUE(dsrc.ok());
  auto ddst = d.Alloc(size_t(B) * H * W * 8);
  ASSERT_TRUE(ddst.ok());
  ASSERT_TRUE(d.CopyToDevice(dsrc->get(), pixels.data(), pixels.size() * 4, stream->ref()).ok());
  for (int out64 = 0; out64 < 2; ++out64) {
    for (int perm = 0; perm < 2; ++perm) {
      TransformParams p = AugParams(B, H, W, 5 + perm);
      if (perm) {
        p.perm_domain = 2 * B;
        p.perm_offset = B;
        p.perm_seed = 12;
      }
      MaskParams m;
      m.out_int64 = out64;
      m.fill = -1;
      const size_t bytes = size_t(B) * H * W * (out64 ? 8 : 4);
      std::vector<uint8_t> want(bytes), got(bytes, 0xEE);
      ASSERT_TRUE(MaskTransformCpu(p, m, reinterpret_cast<const uint8_t*>(pixels.data()), want.data()).ok());
      ASSERT_TRUE(d.MaskTransform(p, m, static_cast<const uint8_t*>(dsrc->get()), ddst->get(), stream->ref()).ok());
      ASSERT_TRUE(d.StreamSync(stream->ref()).ok());
      ASSERT_TRUE(d.CopyToHost(got.data(), ddst->get(), bytes, EventRef{}).ok());
      ASSERT_EQ(got, want) << "int64 " << out64 << " perm " << perm;
    }
  }
}

}  // namespace
}  // namespace gpufeed::gpu
