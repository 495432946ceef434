// The benchmarks' checks refuse a wrong result: each is handed a delivery
// with one fault (a missing or doubled index, a wrong hash, an echo pass that
// is not a permutation, a corrupted or shifted fed sample) and must fail,
// and the right delivery must pass.
#include "bench/bench_checks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

#include "bench/read_bench.h"
#include "gpufeed/writer.h"
#include "hdf5io/hdf5/probe.h"

namespace gpufeed::bench {
namespace {

IndexTally Tally(uint64_t n, const std::vector<uint64_t>& idx) {
  IndexTally t(n);
  EXPECT_TRUE(t.Add(idx).ok());
  return t;
}

TEST(BenchChecksTest, EveryIndexOnceCatchesAMissingAndADoubledSample) {
  EXPECT_TRUE(CheckCoverage(Tally(4, {2, 0, 3, 1}), {Coverage::kEveryIndexOnce}, "e").ok());
  Status doubled = CheckCoverage(Tally(4, {2, 0, 3, 3}), {Coverage::kEveryIndexOnce}, "e");
  EXPECT_EQ(doubled.code(), StatusCode::kCorrupt);
  EXPECT_NE(doubled.message().find("first missing 1"), std::string::npos) << doubled.message();
  EXPECT_FALSE(CheckCoverage(Tally(4, {2, 0, 3}), {Coverage::kEveryIndexOnce}, "e").ok());
  IndexTally t(4);
  EXPECT_EQ(t.Add(4).code(), StatusCode::kCorrupt);  // outside the dataset
}

TEST(BenchChecksTest, APartialEpochChecksNoDoubleAndTheCount) {
  EXPECT_TRUE(CheckCoverage(Tally(10, {5, 1, 7}), {Coverage::kNoIndexDoubled, 3}, "p").ok());
  EXPECT_FALSE(CheckCoverage(Tally(10, {5, 1, 5}), {Coverage::kNoIndexDoubled, 3}, "p").ok());
  EXPECT_FALSE(CheckCoverage(Tally(10, {5, 1}), {Coverage::kNoIndexDoubled, 3}, "p").ok());  // one lost
  EXPECT_EQ(DescribeCoverage(Tally(10, {5, 1, 7}), {Coverage::kNoIndexDoubled, 3}),
            "no index doubled (3 of 10 samples)");
}

TEST(BenchChecksTest, TheUnionOfRanksHasExactlyThePadding) {
  // 7 samples on 3 ranks: 3 each, 2 repeats.
  EXPECT_TRUE(CheckCoverage(Tally(7, {0, 1, 2, 3, 4, 5, 6, 0, 1}), {Coverage::kPadded, 3}, "u").ok());
  EXPECT_FALSE(CheckCoverage(Tally(7, {0, 1, 2, 3, 4, 5, 0, 0, 1}), {Coverage::kPadded, 3}, "u").ok());  // 6 lost
  EXPECT_FALSE(CheckCoverage(Tally(7, {0, 1, 2, 3, 4, 5, 6, 0}), {Coverage::kPadded, 3}, "u").ok());  // a repeat short
}

TEST(BenchChecksTest, AWrongHashInATimedPassFails) {
  std::vector<uint64_t> want = {11, 22, 33}, got = want;
  EXPECT_TRUE(CompareHashes(got, want, "pass").ok());
  got[1] ^= 1;
  Status s = CompareHashes(got, want, "pass");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("sample 1"), std::string::npos);
  EXPECT_FALSE(CompareHashes(std::vector<uint64_t>{11, 22}, want, "pass").ok());
}

TEST(BenchChecksTest, EchoPassesMustBePermutationsOfTheirUpload) {
  EchoCheck ok(2, true);
  ASSERT_TRUE(ok.Add(0, 0, std::vector<uint64_t>{4, 5}).ok());
  ASSERT_TRUE(ok.Add(0, 0, std::vector<uint64_t>{6}).ok());
  ASSERT_TRUE(ok.Add(0, 1, std::vector<uint64_t>{6, 4}).ok());
  ASSERT_TRUE(ok.Add(0, 1, std::vector<uint64_t>{5}).ok());
  ASSERT_TRUE(ok.Add(1, 0, std::vector<uint64_t>{1, 2}).ok());
  ASSERT_TRUE(ok.Add(1, 1, std::vector<uint64_t>{2, 1}).ok());
  EXPECT_TRUE(ok.Finish().ok());
  EXPECT_EQ(ok.uploads(), 2u);

  EchoCheck wrong(2, true);
  ASSERT_TRUE(wrong.Add(0, 0, std::vector<uint64_t>{4, 5}).ok());
  ASSERT_TRUE(wrong.Add(0, 1, std::vector<uint64_t>{4, 4}).ok());
  EXPECT_EQ(wrong.Finish().code(), StatusCode::kCorrupt);

  EchoCheck short_echo(2, true);  // an upload used once with echo 2
  ASSERT_TRUE(short_echo.Add(0, 0, std::vector<uint64_t>{4, 5}).ok());
  EXPECT_FALSE(short_echo.Finish().ok());
  EchoCheck auto_echo(4, false);  // auto echo: at most 4 uses
  ASSERT_TRUE(auto_echo.Add(0, 0, std::vector<uint64_t>{4, 5}).ok());
  EXPECT_TRUE(auto_echo.Finish().ok());
}

// Auto echo (0) uses an upload once while it measures, then more: upload 0's
// fresh pass is followed by upload 1's fresh pass, and only upload 1 is
// echoed. Telling uploads apart by "pass 0 after a later pass" merged the
// two (`bench feed --echo 0 --super-batch 2` failed a correct feed).
TEST(BenchChecksTest, AutoEchoUploadsAreToldApartByTheirIndex) {
  EchoCheck check(4, false);
  ASSERT_TRUE(check.Add(0, 0, std::vector<uint64_t>{4, 5}).ok());
  ASSERT_TRUE(check.Add(0, 0, std::vector<uint64_t>{6, 7}).ok());
  ASSERT_TRUE(check.Add(1, 0, std::vector<uint64_t>{0, 1}).ok());
  ASSERT_TRUE(check.Add(1, 0, std::vector<uint64_t>{2, 3}).ok());
  ASSERT_TRUE(check.Add(1, 1, std::vector<uint64_t>{3, 0}).ok());
  ASSERT_TRUE(check.Add(1, 1, std::vector<uint64_t>{1, 2}).ok());
  EXPECT_TRUE(check.Finish().ok());
  EXPECT_EQ(check.uploads(), 2u);

  EchoCheck partial(4, false);  // an echo pass that misses one of its upload's samples
  ASSERT_TRUE(partial.Add(0, 0, std::vector<uint64_t>{0, 1, 2}).ok());
  ASSERT_TRUE(partial.Add(0, 1, std::vector<uint64_t>{2, 0}).ok());
  const Status next = partial.Add(1, 0, std::vector<uint64_t>{3});  // upload 0 is checked here
  EXPECT_EQ(next.code(), StatusCode::kCorrupt);
  EXPECT_NE(next.message().find("not a permutation"), std::string::npos) << next.ToString();

  EchoCheck backwards(4, false);
  ASSERT_TRUE(backwards.Add(1, 0, std::vector<uint64_t>{0}).ok());
  EXPECT_EQ(backwards.Add(0, 0, std::vector<uint64_t>{1}).code(), StatusCode::kCorrupt);
  EchoCheck echo_first(4, false);
  EXPECT_EQ(echo_first.Add(0, 1, std::vector<uint64_t>{1}).code(), StatusCode::kCorrupt);
}

// A small uint8 CHW image with distinct values, and the feed's output of it
// made here by hand for a given crop and flip.
struct Image {
  FeedSampleSpec spec;
  std::vector<uint8_t> stored;
};
Image MakeImage(DType dtype, int padding, bool flip) {
  Image im;
  im.spec.channels = 2;
  im.spec.height = 5;
  im.spec.width = 6;
  im.spec.dtype = dtype;
  im.spec.crop_padding = padding;
  im.spec.flip = flip;
  im.spec.mean = {10.0f, 20.0f};
  im.spec.inv_std = {1.0f / 50, 1.0f / 60};
  im.stored.resize(2 * 5 * 6);
  for (size_t i = 0; i < im.stored.size(); ++i) im.stored[i] = static_cast<uint8_t>(7 * i + 3);
  return im;
}
uint16_t Bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
std::vector<uint8_t> Output(const Image& im, int dy, int dx, bool flip) {
  const FeedSampleSpec& s = im.spec;
  std::vector<uint8_t> out(s.out_sample_bytes());
  uint64_t e = 0;
  for (int c = 0; c < s.channels; ++c) {
    for (int y = 0; y < s.height; ++y) {
      for (int x = 0; x < s.width; ++x, ++e) {
        const int sy = y + dy, sx = (flip ? s.width - 1 - x : x) + dx;
        float v = 0;
        if (sy >= 0 && sy < s.height && sx >= 0 && sx < s.width) v = im.stored[(c * s.height + sy) * s.width + sx];
        const float f = (v - s.mean[c]) * s.inv_std[c];
        if (s.dtype == DType::kFloat32) {
          std::memcpy(out.data() + e * 4, &f, 4);
        } else {
          const uint16_t h = Bf16(f);
          std::memcpy(out.data() + e * 2, &h, 2);
        }
      }
    }
  }
  return out;
}

TEST(BenchChecksTest, AFedSampleMatchesTheReferenceUnderItsCropAndFlip) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Image im = MakeImage(dt, 2, true);
    std::string crop;
    ASSERT_TRUE(CheckFeedSample(im.spec, im.stored.data(), Output(im, -1, 2, true).data(), "s", &crop).ok());
    EXPECT_EQ(crop, "dy -1 dx 2 flipped");
    EXPECT_TRUE(CheckFeedSample(im.spec, im.stored.data(), Output(im, 0, 0, false).data(), "s").ok());
  }
}

TEST(BenchChecksTest, ACorruptedOrForeignFedSampleFails) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Image im = MakeImage(dt, 1, true);
    // One element off by one level of 255.
    std::vector<uint8_t> got = Output(im, 1, 0, false);
    Image off = im;
    off.stored[17] += 1;
    EXPECT_EQ(CheckFeedSample(im.spec, off.stored.data(), got.data(), "s").code(), StatusCode::kCorrupt)
        << DTypeName(dt);
    // A crop the options do not allow (padding 1, offset 2).
    EXPECT_FALSE(CheckFeedSample(im.spec, im.stored.data(), Output(im, 2, 0, false).data(), "s").ok());
    // A flip with flip off.
    im.spec.flip = false;
    EXPECT_FALSE(CheckFeedSample(im.spec, im.stored.data(), Output(im, 0, 0, true).data(), "s").ok());
  }
}

TEST(BenchChecksTest, ADecodedImageFarFromTheCpuDecodeFails) {
  Image im = MakeImage(DType::kBFloat16, 0, false);
  const std::vector<uint8_t> got = Output(im, 0, 0, false);
  double levels = -1;
  EXPECT_TRUE(CheckDecodedSample(im.spec, im.stored.data(), got.data(), 2.0, "d", &levels).ok());
  EXPECT_LT(levels, 1.0);
  std::vector<uint8_t> other = im.stored;
  for (uint8_t& v : other) v = static_cast<uint8_t>(v + 9);  // another image, 9 levels away
  EXPECT_EQ(CheckDecodedSample(im.spec, other.data(), got.data(), 2.0, "d").code(), StatusCode::kCorrupt);
}

TEST(BenchChecksTest, OutputValuesDecodeHalfAndBfloat16) {
  const uint16_t half_one = 0x3c00, half_tiny = 0x0001, bf_minus_two = 0xc000;
  EXPECT_EQ(OutputValue(DType::kFloat16, &half_one, 0), 1.0f);
  EXPECT_EQ(OutputValue(DType::kFloat16, &half_tiny, 0), std::ldexp(1.0f, -24));
  EXPECT_EQ(OutputValue(DType::kBFloat16, &bf_minus_two, 0), -2.0f);
}

// bench read takes its file through the door: probed once (it was twice:
// once for each Dataset::Open, the timed path and HDF5's baseline), and
// what is not one HDF5 dataset is said as such, naming bench loader.
TEST(ReadBenchTest, TheFileIsProbedOnceAndReadsVerified) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("gpufeed-read-bench-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/d.h5";
  constexpr uint64_t kN = 64, kSampleBytes = 16;
  WriteOptions wo;
  wo.chunk_samples = 8;
  auto w = DatasetWriter::Create(path, {4, 4}, DType::kUInt8, kN, wo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (uint64_t c = 0; c < w->num_chunks(); ++c) {
    std::vector<std::byte> samples(8 * kSampleBytes);
    for (size_t i = 0; i < samples.size(); ++i) samples[i] = std::byte(c * 8 + i / kSampleBytes);  // sample k: k
    DatasetWriter::EncodedChunk e;
    ASSERT_TRUE(w->EncodeChunk(c, samples, &e).ok());
    ASSERT_TRUE(w->WriteChunk(c, e).ok());
  }
  ASSERT_TRUE(w->Commit().ok());

  ReadBenchOptions o;
  o.data = path;
  o.threads = 2;
  o.repeats = 1;
  const uint64_t before = SpecsProbed();
  auto r = RunReadBench(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(SpecsProbed() - before, 1u);
  EXPECT_EQ(r->samples, kN);
  EXPECT_EQ(r->read_path, "direct");
  EXPECT_EQ(r->verified_passes, 5);

  o.data = dir;  // a directory of HDF5 files: many files, not one dataset
  auto many = RunReadBench(o);
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(many.status().message().find("bench loader --data " + dir), std::string::npos) << many.status().ToString();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpufeed::bench
