// Inspect report and one-sample export.
#include "gpufeed/inspect.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(InspectTest, ReportCountsLabelsAndChunks) {
  const std::string dir = testing::MakeTempDir("inspect");
  const auto data = testing::IndexSamples(25, 3 * 4 * 5);
  ASSERT_TRUE(
      testing::WriteH5(dir + "/a.h5", {25, 3, 4, 5}, H5T_NATIVE_UINT8, data, {.chunk = {10, 3, 2, 5}, .deflate = 1}));
  auto ds = Dataset::Open(dir + "/a.h5");
  ASSERT_TRUE(ds.ok());
  const InspectReport r = Inspect(*ds);
  EXPECT_EQ(r.hdf5_chunks, 3u * 2u);  // ceil(25/10) x ceil(4/2)
  ASSERT_EQ(r.label_histogram.size(), 10u);
  EXPECT_EQ(r.label_histogram.at(0), 3u);  // labels k % 10 over 25 samples
  EXPECT_EQ(r.label_histogram.at(9), 2u);
  EXPECT_GT(r.recommended_cache_bytes, 0u);
  EXPECT_LE(r.recommended_cache_bytes, ds->info().raw_bytes);
}

TEST(InspectTest, ExportsNpyPgmAndPpm) {
  const std::string dir = testing::MakeTempDir("export");
  // NCHW RGB samples and one-channel samples.
  const auto rgb = testing::IndexSamples(4, 3 * 6 * 5);
  ASSERT_TRUE(testing::WriteH5(dir + "/rgb.h5", {4, 3, 6, 5}, H5T_NATIVE_UINT8, rgb, {.chunk = {2, 3, 6, 5}}));
  auto ds = Dataset::Open(dir + "/rgb.h5");
  ASSERT_TRUE(ds.ok());

  ASSERT_TRUE(ExportSample(*ds, 2, dir + "/s.npy").ok());
  const std::string npy = Slurp(dir + "/s.npy");
  ASSERT_EQ(npy.substr(0, 6), "\x93NUMPY");
  EXPECT_NE(npy.find("'shape': (3, 6, 5, )"), std::string::npos);
  const size_t header = 10 + (uint8_t(npy[8]) | (uint8_t(npy[9]) << 8));
  EXPECT_EQ(header % 64, 0u);
  EXPECT_EQ(npy.substr(header), std::string(reinterpret_cast<const char*>(rgb.data()) + 2 * 90, 90));

  ASSERT_TRUE(ExportSample(*ds, 1, dir + "/s.ppm").ok());
  const std::string ppm = Slurp(dir + "/s.ppm");
  ASSERT_EQ(ppm.substr(0, 11), "P6\n5 6\n255\n");
  // Pixel (y=2, x=3), channel 1 comes from NCHW offset (1*6 + 2)*5 + 3.
  EXPECT_EQ(uint8_t(ppm[11 + (2 * 5 + 3) * 3 + 1]), uint8_t(rgb[90 + (1 * 6 + 2) * 5 + 3]));

  Status s = ExportSample(*ds, 0, dir + "/s.pgm");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(ExportSample(*ds, 4, dir + "/x.npy").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportSample(*ds, 0, dir + "/x.bmp").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpufeed
