// The pass-through gather: output row i is the row the image transform's
// sample i reads (SourceSample), bytes untouched, for every row width the
// kernel's word sizes split on; the GPU kernel against the CPU reference (on
// a machine with a GPU).
#include "gpu/gather_rows.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu/device_ops.h"
#include "tests/testing/gpu_required.h"

namespace gpufeed::gpu {
namespace {

// Row k of `rows` rows of `width` bytes: byte j is (k * 131 + j * 7 + 1) mod 251,
// so a row moved, shifted or cut short does not compare equal.
std::vector<uint8_t> IndexRows(int rows, uint64_t width) {
  std::vector<uint8_t> v(size_t(rows) * width);
  for (int k = 0; k < rows; ++k)
    for (uint64_t j = 0; j < width; ++j) v[k * width + j] = uint8_t((k * 131 + j * 7 + 1) % 251);
  return v;
}

TransformParams Gathered(int batch, int domain, uint32_t offset, uint64_t seed) {
  TransformParams p;
  p.batch = batch;
  p.perm_offset = offset;
  p.perm_domain = static_cast<uint32_t>(domain);
  p.perm_seed = seed;
  return p;
}

TEST(GatherRowsTest, RowKOfTheOutputIsTheTransformsSourceSample) {
  const int domain = 23, batch = 8;
  for (uint64_t width : {1u, 3u, 4u, 8u, 12u, 16u, 48u, 1000u}) {
    const auto src = IndexRows(domain, width);
    for (int perm = 0; perm < 2; ++perm) {
      TransformParams p = perm ? Gathered(batch, domain, 8, 99) : Gathered(batch, 0, 8, 0);
      std::vector<uint8_t> got(batch * width, 0xEE);
      ASSERT_TRUE(GatherRowsCpu(p, src.data(), width, got.data()).ok());
      std::vector<bool> seen(domain, false);
      for (int i = 0; i < batch; ++i) {
        const uint32_t k = SourceSample(p, uint32_t(i));
        if (!perm) {
          EXPECT_EQ(k, uint32_t(8 + i));
        }
        ASSERT_LT(k, uint32_t(domain));
        EXPECT_FALSE(seen[k]) << "row " << k << " twice";
        seen[k] = true;
        ASSERT_EQ(0, std::memcmp(got.data() + i * width, src.data() + k * width, width)) << "width " << width;
      }
    }
  }
  // Every echo pass over the whole super-batch is a permutation of it.
  std::vector<int> count(23, 0);
  for (uint32_t off = 0; off < 23; off += 8) {
    TransformParams p = Gathered(std::min(8, 23 - int(off)), 23, off, 5);
    for (int i = 0; i < p.batch; ++i) ++count[SourceSample(p, uint32_t(i))];
  }
  for (int c : count) EXPECT_EQ(c, 1);
}

TEST(GatherRowsTest, EmptyRowsAndOverrunsAreRefused) {
  uint8_t b[4] = {};
  EXPECT_EQ(GatherRowsCpu(Gathered(1, 0, 0, 0), b, 0, b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherRowsCpu(Gathered(0, 0, 0, 0), b, 4, b).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherRowsCpu(Gathered(4, 6, 4, 1), b, 1, b).code(), StatusCode::kInvalidArgument);
}

TEST(GatherRowsGpuTest, MatchesTheCpuReference) {
  auto ops = MakeCudaOps(0);
  if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << ops.status().ToString() << ")");
  DeviceOps& d = **ops;
  const int domain = 37, batch = 16;
  auto stream = d.NewStream();  // outlives the buffers its work uses
  ASSERT_TRUE(stream.ok());
  for (uint64_t width : {1u, 2u, 4u, 6u, 8u, 16u, 24u, 4096u + 16u, 3u * 65536u + 5u}) {
    const auto src = IndexRows(domain, width);
    auto dsrc = d.Alloc(src.size());
    ASSERT_TRUE(dsrc.ok());
    auto ddst = d.Alloc(batch * width);
    ASSERT_TRUE(ddst.ok());
    ASSERT_TRUE(d.CopyToDevice(dsrc->get(), src.data(), src.size(), stream->ref()).ok());
    for (int perm = 0; perm < 2; ++perm) {
      TransformParams p = perm ? Gathered(batch, domain, 16, 7) : Gathered(batch, 0, 3, 0);
      std::vector<uint8_t> want(batch * width), got(batch * width, 0xEE);
      ASSERT_TRUE(GatherRowsCpu(p, src.data(), width, want.data()).ok());
      ASSERT_TRUE(d.GatherRows(p, static_cast<const uint8_t*>(dsrc->get()), width, ddst->get(), stream->ref()).ok());
      ASSERT_TRUE(d.StreamSync(stream->ref()).ok());
      ASSERT_TRUE(d.CopyToHost(got.data(), ddst->get(), got.size(), EventRef{}).ok());
      ASSERT_EQ(got, want) << "width " << width << " perm " << perm;
    }
  }
}

}  // namespace
}  // namespace gpufeed::gpu
