// Conversion from IDX, .npy and HDF5 round-trips every byte and label, and a
// failed conversion leaves nothing behind.
#include "gpufeed/convert.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "gpufeed/dataset.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;
using testing::IndexSamples;

void PutBE32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s += static_cast<char>((v >> (8 * k)) & 0xff);
}

// Writes an IDX file of uint8 with `dims`, gzip'd when path ends in .gz.
void WriteIdx(const std::string& path, const std::vector<uint32_t>& dims, std::span<const std::byte> data) {
  std::string s("\0\0\x08", 3);
  s += static_cast<char>(dims.size());
  for (uint32_t d : dims) PutBE32(s, d);
  s.append(reinterpret_cast<const char*>(data.data()), data.size());
  if (path.ends_with(".gz")) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, s.data(), static_cast<unsigned>(s.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary) << s;
  }
}

std::vector<std::byte> LabelBytes(uint64_t n) {
  std::vector<std::byte> v(n);
  for (uint64_t k = 0; k < n; ++k) v[k] = std::byte(testing::IndexLabel(k));
  return v;
}

void ExpectDatasetEquals(const std::string& path, const std::vector<std::byte>& want, uint64_t n) {
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  ASSERT_EQ(ds->num_samples(), n);
  std::vector<std::byte> got(n * ds->sample_bytes());
  ASSERT_TRUE(ds->ReadSamples(0, n, got).ok());
  ASSERT_EQ(got.size(), want.size());
  for (uint64_t k = 0; k < n; ++k) {
    ASSERT_TRUE(std::equal(got.begin() + k * ds->sample_bytes(), got.begin() + (k + 1) * ds->sample_bytes(),
                           want.begin() + k * ds->sample_bytes()))
        << "sample " << k;
  }
  ASSERT_EQ(ds->labels().size(), n);
  for (uint64_t k = 0; k < n; ++k) ASSERT_EQ(ds->labels()[k], testing::IndexLabel(k)) << k;
}

class ConvertTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("convert"); }
  std::string dir_;
};

TEST_F(ConvertTest, IdxGzipAndPlainEveryCodec) {
  const uint64_t n = 37;
  const auto images = IndexSamples(n, 5 * 6);
  for (const char* ext : {"", ".gz"}) {
    WriteIdx(dir_ + "/img" + ext, {n, 5, 6}, images);
    WriteIdx(dir_ + "/lab" + ext, {n}, LabelBytes(n));
    for (Codec c : {Codec::kNone, Codec::kDeflate, Codec::kZstd}) {
      auto src = OpenSource(dir_ + "/img" + ext, dir_ + "/lab" + ext, {});
      ASSERT_TRUE(src.ok()) << src.status().ToString();
      EXPECT_EQ((*src)->sample_shape(), (std::vector<uint64_t>{1, 5, 6}));
      ConvertOptions o;
      o.write.codec = c;
      o.write.chunk_samples = 8;
      o.threads = 2;
      uint64_t last_progress = 0;
      o.progress = [&](uint64_t done, uint64_t total) {
        EXPECT_GT(done, last_progress);
        EXPECT_EQ(total, n);
        last_progress = done;
      };
      const std::string out = dir_ + "/out_" + std::string(CodecName(c)) + ".h5";
      auto s = Convert(**src, out, o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ(last_progress, n);
      EXPECT_EQ(s->samples, n);
      EXPECT_EQ(s->chunk_samples, 8u);
      EXPECT_EQ(s->raw_bytes, n * 30);
      ExpectDatasetEquals(out, images, n);
      auto ds = Dataset::Open(out);
      EXPECT_EQ(ds->info().layout, "NCHW");
      // One channel: mean/std over every byte.
      double sum = 0, sq = 0;
      for (std::byte b : images) {
        sum += double(b);
        sq += double(b) * double(b);
      }
      const double mean = sum / images.size();
      ASSERT_EQ(ds->info().mean.size(), 1u);
      EXPECT_NEAR(ds->info().mean[0], mean, 1e-9);
      EXPECT_NEAR(ds->info().stddev[0], std::sqrt(sq / images.size() - mean * mean), 1e-9);
    }
  }
}

TEST_F(ConvertTest, PerChannelStatsFollowTheLayout) {
  // 3-channel NCHW samples whose channel c is all (c + 1) * 10.
  const uint64_t n = 5;
  std::vector<std::byte> data(n * 3 * 4);
  for (uint64_t k = 0; k < n; ++k)
    for (int c = 0; c < 3; ++c)
      for (int p = 0; p < 4; ++p) data[(k * 3 + c) * 4 + p] = std::byte((c + 1) * 10);
  ASSERT_TRUE(testing::WriteH5(dir_ + "/c.h5", {n, 3, 2, 2}, H5T_NATIVE_UINT8, data, {.chunk = {1, 3, 2, 2}}));
  auto src = OpenHdf5Source(dir_ + "/c.h5", "");
  ASSERT_TRUE(src.ok());
  EXPECT_EQ((*src)->layout(), "NCHW");  // guessed from the 3 leading the shape
  auto s = Convert(**src, dir_ + "/c2.h5", {});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->mean, (std::vector<double>{10, 20, 30}));
  EXPECT_EQ(s->stddev, (std::vector<double>{0, 0, 0}));
}

TEST_F(ConvertTest, Hdf5RechunkAndRecompress) {
  const uint64_t n = 60;
  const auto data = IndexSamples(n, 2 * 7 * 7 * sizeof(uint16_t));
  ASSERT_TRUE(testing::WriteH5(dir_ + "/in.h5", {n, 2, 7, 7}, H5T_NATIVE_UINT16, data,
                               {.chunk = {1, 2, 7, 7}, .shuffle = true, .deflate = 6}));
  auto src = OpenSource(dir_ + "/in.h5", "", {});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ConvertOptions o;
  o.write.codec = Codec::kZstd;
  o.write.shuffle_filter = true;
  o.write.chunk_samples = 16;
  ASSERT_TRUE(Convert(**src, dir_ + "/out.h5", o).ok());
  auto ds = Dataset::Open(dir_ + "/out.h5");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->chunk_samples(), 16u);
  EXPECT_EQ(ds->dtype(), DType::kUInt16);
  EXPECT_EQ(ds->info().read_path, ReadPath::kDirect);
  ExpectDatasetEquals(dir_ + "/out.h5", data, n);

  // By default the source's chunks are kept: each is decoded once.
  ASSERT_TRUE(
      testing::WriteH5(dir_ + "/in7.h5", {n, 2, 7, 7}, H5T_NATIVE_UINT16, data, {.chunk = {7, 2, 7, 7}, .deflate = 4}));
  auto src7 = OpenSource(dir_ + "/in7.h5", "", {});
  ASSERT_TRUE(src7.ok()) << src7.status().ToString();
  auto kept = Convert(**src7, dir_ + "/kept.h5", ConvertOptions{});
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->chunk_samples, 7u);
  ExpectDatasetEquals(dir_ + "/kept.h5", data, n);
}

// The filter ids of `path`:/images, in pipeline order, read by HDF5 itself.
std::vector<int> FiltersOf(const std::string& path) {
  std::vector<int> ids;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, "/images", H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(d);
  for (int k = 0; k < H5Pget_nfilters(dcpl); ++k) {
    unsigned flags = 0;
    size_t n = 0;
    ids.push_back(
        static_cast<int>(H5Pget_filter2(dcpl, static_cast<unsigned>(k), &flags, &n, nullptr, 0, nullptr, nullptr)));
  }
  H5Pclose(dcpl);
  H5Dclose(d);
  H5Fclose(f);
  return ids;
}

// By default convert writes what every HDF5 build decodes (issue 50: zstd
// files read as "required filter 'zstd' is not registered" in Debian's
// h5py, and as an empty DATA {} in h5dump): deflate, shuffled first for
// dtypes of 2 bytes or more, where shuffling shrinks them.
TEST_F(ConvertTest, TheDefaultIsDeflateShuffledForWideTypesReadableByStockHdf5) {
  EXPECT_EQ(WriteOptions{}.codec, Codec::kDeflate);
  const uint64_t n = 40;
  const auto wide = IndexSamples(n, 2 * 7 * 7 * sizeof(uint16_t));
  ASSERT_TRUE(testing::WriteH5(dir_ + "/u16.h5", {n, 2, 7, 7}, H5T_NATIVE_UINT16, wide, {.chunk = {8, 2, 7, 7}}));
  const auto narrow = IndexSamples(n, 3 * 5 * 5);
  ASSERT_TRUE(testing::WriteH5(dir_ + "/u8.h5", {n, 3, 5, 5}, H5T_NATIVE_UINT8, narrow, {.chunk = {8, 3, 5, 5}}));
  for (const auto& [in, data, want] :
       {std::tuple{"u16", &wide, std::vector<int>{H5Z_FILTER_SHUFFLE, H5Z_FILTER_DEFLATE}},
        std::tuple{"u8", &narrow, std::vector<int>{H5Z_FILTER_DEFLATE}}}) {
    auto src = OpenSource(dir_ + "/" + in + ".h5", "", {});
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    const std::string out = dir_ + "/" + in + "_out.h5";
    ASSERT_TRUE(Convert(**src, out, ConvertOptions{}).ok());
    EXPECT_EQ(FiltersOf(out), want) << in;  // no 32015 (zstd), no shuffle where it changes nothing
    ExpectDatasetEquals(out, *data, n);
  }
}

// A v1.0 .npy file of `descr` with `shape`.
void WriteNpy(const std::string& path, const std::string& descr, const std::string& shape,
              std::span<const std::byte> data) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  std::ofstream f(path, std::ios::binary);
  f << header << dict;
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

TEST_F(ConvertTest, NpyWithNpyLabels) {
  const uint64_t n = 23;
  const auto data = IndexSamples(n, 4 * 4 * 3 * 4);
  WriteNpy(dir_ + "/x.npy", "<f4", "(23, 4, 4, 3)", data);
  std::vector<int64_t> labels(n);
  for (uint64_t k = 0; k < n; ++k) labels[k] = testing::IndexLabel(k);
  WriteNpy(dir_ + "/y.npy", "<i8", "(23,)", std::as_bytes(std::span(labels)));
  auto src = OpenSource(dir_ + "/x.npy", dir_ + "/y.npy", {});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->dtype(), DType::kFloat32);
  EXPECT_EQ((*src)->layout(), "NHWC");
  ConvertOptions o;
  o.write.codec = Codec::kDeflate;
  o.write.shuffle_filter = true;
  ASSERT_TRUE(Convert(**src, dir_ + "/x.h5", o).ok());
  ExpectDatasetEquals(dir_ + "/x.h5", data, n);

  WriteNpy(dir_ + "/bad.npy", "<u1", "(23, 100)", std::span(data).first(500));
  auto bad = OpenSource(dir_ + "/bad.npy", "", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(bad.status().message().find("truncated"), std::string::npos) << bad.status().ToString();
}

// Shapes from the header that a reader must not trust: a 0 dimension (samples
// of 0 bytes, read into an empty buffer; UBSan checks the copy), a dimension
// past 64 bits, and a product that wraps to the bytes present (found by the
// npy fuzzer and by review).
TEST_F(ConvertTest, NpyShapesThatAreEmptyOrWrapAreHandled) {
  WriteNpy(dir_ + "/zero.npy", "<u1", "(10, 0)", {});
  auto zero = OpenSource(dir_ + "/zero.npy", "", {});
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ((*zero)->num_samples(), 10u);
  EXPECT_TRUE((*zero)->Read(9, 1, {}).ok());

  WriteNpy(dir_ + "/huge.npy", "<u1", "(99999999999999999999999, 2)", {});
  auto huge = OpenSource(dir_ + "/huge.npy", "", {});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kCorrupt) << huge.status().ToString();

  // 8 x 2^62 x 4 wraps to 0 bytes, which an empty payload "holds".
  WriteNpy(dir_ + "/wrap.npy", "<i8", "(4611686018427387904, 4)", {});
  auto wrap = OpenSource(dir_ + "/wrap.npy", "", {});
  ASSERT_FALSE(wrap.ok());
  EXPECT_NE(wrap.status().message().find("2^64"), std::string::npos) << wrap.status().ToString();
}

// IDX dimensions whose product wraps, also behind a 0 sample count (found by
// the IDX fuzzer): refused, not a source whose sample size is wrong.
TEST_F(ConvertTest, IdxDimensionsThatWrapAreRefused) {
  for (const std::vector<uint32_t>& dims : {std::vector<uint32_t>{0, 1u << 31, 1u << 31, 1u << 31},
                                            std::vector<uint32_t>{1u << 16, 1u << 16, 1u << 16, 1u << 16}}) {
    WriteIdx(dir_ + "/wrap", dims, {});
    auto r = OpenIdxSource(dir_ + "/wrap", "");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("2^64"), std::string::npos) << r.status().ToString();
  }
}

TEST_F(ConvertTest, BadIdxInputsAreNamed) {
  const auto images = IndexSamples(10, 16);
  WriteIdx(dir_ + "/img", {10, 4, 4}, images);
  WriteIdx(dir_ + "/lab9", {9}, LabelBytes(9));
  auto r = OpenIdxSource(dir_ + "/img", dir_ + "/lab9");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("9 labels"), std::string::npos) << r.status().ToString();

  // Truncated payload, plain and gzip.
  WriteIdx(dir_ + "/short", {10, 4, 4}, std::span(images).first(100));
  r = OpenIdxSource(dir_ + "/short", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  WriteIdx(dir_ + "/full.gz", {10, 4, 4}, images);
  fs::copy_file(dir_ + "/full.gz", dir_ + "/cut.gz");
  fs::resize_file(dir_ + "/cut.gz", fs::file_size(dir_ + "/full.gz") - 20);
  r = OpenIdxSource(dir_ + "/cut.gz", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().ToString();
  EXPECT_NE(r.status().message().find("cut.gz"), std::string::npos);

  r = OpenIdxSource(dir_ + "/missing", "");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST_F(ConvertTest, FailedConversionLeavesTargetUntouched) {
  // A source whose chunk 3 fails to read, mid-conversion.
  class Failing final : public SampleSource {
   public:
    uint64_t num_samples() const override { return 100; }
    const std::vector<uint64_t>& sample_shape() const override { return shape_; }
    DType dtype() const override { return DType::kUInt8; }
    std::string layout() const override { return ""; }
    const std::vector<int64_t>& labels() const override { return labels_; }
    uint64_t input_bytes() const override { return 0; }
    std::string description() const override { return "failing source"; }
    Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
      if (first == 30) return Status::Corrupt("failing source: sample 30 is damaged");
      testing::FillIndexSamples(first, count, 16, dst);
      return Status::Ok();
    }

   private:
    std::vector<uint64_t> shape_{16};
    std::vector<int64_t> labels_;
  };
  const std::string out = dir_ + "/target.h5";
  std::ofstream(out) << "previous contents";
  ConvertOptions o;
  o.write.chunk_samples = 10;
  auto s = Convert(Failing(), out, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("sample 30 is damaged"), std::string::npos) << s.status().ToString();
  std::ifstream in(out);
  std::string content((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(content, "previous contents");
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  }
}

// Levels outside a codec's range are refused (99 was stored as zstd(99), -3
// as 3), as are too few class names for the labels.
TEST_F(ConvertTest, OutOfRangeLevelsAndTooFewClassNamesAreRefused) {
  const std::vector<uint64_t> shape{16};
  struct Case {
    Codec codec;
    int level;
    const char* says;
  };
  for (const Case& c :
       {Case{Codec::kZstd, 99, "zstd level 99 is outside 1..22"},
        Case{Codec::kZstd, -3, "zstd level -3 is outside 1..22"},
        Case{Codec::kDeflate, 10, "deflate level 10 is outside 0..9"}, Case{Codec::kNone, 3, "not to codec none"}}) {
    WriteOptions w;
    w.codec = c.codec;
    w.level = c.level;
    auto wr = DatasetWriter::Create(dir_ + "/l.h5", shape, DType::kUInt8, 10, w);
    ASSERT_FALSE(wr.ok()) << c.says;
    EXPECT_NE(wr.status().message().find(c.says), std::string::npos) << wr.status().ToString();
  }
  WriteOptions ok;
  ok.codec = Codec::kZstd;
  ok.level = 22;
  EXPECT_TRUE(DatasetWriter::Create(dir_ + "/l.h5", shape, DType::kUInt8, 10, ok).ok());

  class Labelled final : public SampleSource {
   public:
    uint64_t num_samples() const override { return 10; }
    const std::vector<uint64_t>& sample_shape() const override { return shape_; }
    DType dtype() const override { return DType::kUInt8; }
    std::string layout() const override { return ""; }
    const std::vector<int64_t>& labels() const override { return labels_; }
    uint64_t input_bytes() const override { return 0; }
    std::string description() const override { return "labelled source"; }
    Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
      testing::FillIndexSamples(first, count, 16, dst);
      return Status::Ok();
    }

   private:
    std::vector<uint64_t> shape_{16};
    std::vector<int64_t> labels_{0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  };
  ConvertOptions o;
  o.write.class_names = {"a", "b", "c"};
  auto r = Convert(Labelled(), dir_ + "/c.h5", o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 class names (--class-names) for labels up to 4"), std::string::npos)
      << r.status().ToString();
}

TEST(FashionMnistTest, ConversionMatchesTheIdxSourceByteForByte) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(root + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << root << " missing: install Debian's dataset-fashion-mnist (scripts/setup does)";
  }
  const std::string dir = testing::MakeTempDir("fmnist");
  for (const char* split : {"train", "t10k"}) {
    const std::string img = root + "/" + split + "-images-idx3-ubyte.gz";
    const std::string lab = root + "/" + split + "-labels-idx1-ubyte.gz";
    auto src = OpenIdxSource(img, lab);
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    const uint64_t n = (*src)->num_samples();
    EXPECT_EQ(n, std::string(split) == "train" ? 60000u : 10000u);
    ConvertOptions o;
    o.write.codec = Codec::kZstd;
    auto s = Convert(**src, dir + "/" + split + ".h5", o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto ds = Dataset::Open(dir + "/" + split + ".h5");
    ASSERT_TRUE(ds.ok());
    EXPECT_EQ(ds->sample_shape(), (std::vector<uint64_t>{1, 28, 28}));
    std::vector<std::byte> want(n * 784), got(n * 784);
    ASSERT_TRUE((*src)->Read(0, n, want).ok());
    ASSERT_TRUE(ds->ReadSamples(0, n, got).ok());
    EXPECT_TRUE(want == got) << split << ": converted bytes differ from the IDX source";
    EXPECT_EQ(ds->labels(), (*src)->labels());
    // The dataset's published statistics: mean 0.2860, std 0.3530 (x255).
    if (std::string(split) == "train") {
      EXPECT_NEAR(ds->info().mean[0] / 255, 0.2860, 0.0005);
      EXPECT_NEAR(ds->info().stddev[0] / 255, 0.3530, 0.0005);
    }
  }
}

}  // namespace
}  // namespace gpufeed
