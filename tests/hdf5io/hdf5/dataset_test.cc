// Dataset reads every storage layout HDF5 (and so h5py) writes, on both read
// paths, and returns exactly the bytes that were written.
#include "gpufeed/dataset.h"

#include <gtest/gtest.h>

#include <thread>

#include "gpufeed/writer.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using testing::H5Layout;
using testing::IndexSamples;
using testing::WriteH5;

struct Case {
  const char* name;
  H5Layout layout;
  hid_t type = H5T_NATIVE_UINT8;
  ReadPath expected_path = ReadPath::kDirect;
};

// [N=53, 3, 5, 4] samples; chunk counts chosen so the last chunk is partial.
constexpr hsize_t kN = 53;
const std::vector<hsize_t> kShape = {kN, 3, 5, 4};

std::vector<Case> Cases() {
  std::vector<Case> c;
  c.push_back({"contiguous", {}});
  c.push_back({"chunk1_raw", {.chunk = {1, 3, 5, 4}}});
  c.push_back({"chunk7_raw", {.chunk = {7, 3, 5, 4}}});
  c.push_back({"one_chunk_raw", {.chunk = {kN, 3, 5, 4}}});
  c.push_back({"chunk7_gzip", {.chunk = {7, 3, 5, 4}, .deflate = 4}});
  c.push_back({"chunk7_shuffle_gzip_u16", {.chunk = {7, 3, 5, 4}, .shuffle = true, .deflate = 4}, H5T_NATIVE_UINT16});
  c.push_back({"chunk7_zstd", {.chunk = {7, 3, 5, 4}, .zstd = 3}});
  c.push_back({"chunk7_shuffle_zstd_f32", {.chunk = {7, 3, 5, 4}, .shuffle = true, .zstd = 3}, H5T_NATIVE_FLOAT});
  c.push_back({"chunk16_gzip_f64", {.chunk = {16, 3, 5, 4}, .deflate = 1}, H5T_NATIVE_DOUBLE});
  c.push_back({"userblock_gzip", {.chunk = {7, 3, 5, 4}, .deflate = 4, .userblock = 512}});
  c.push_back({"userblock_contiguous", {.userblock = 1024}});
  // The hdf5 path: chunks that split samples, an unhandled filter, big-endian.
  c.push_back({"split_samples_gzip", {.chunk = {4, 2, 5, 3}, .deflate = 4}, H5T_NATIVE_UINT8, ReadPath::kHdf5});
  c.push_back({"fletcher32", {.chunk = {7, 3, 5, 4}, .fletcher32 = true}, H5T_NATIVE_UINT8, ReadPath::kHdf5});
  c.push_back({"big_endian_u16",
               {.chunk = {7, 3, 5, 4}, .deflate = 4, .big_endian = true},
               H5T_NATIVE_UINT16,
               ReadPath::kHdf5});
  return c;
}

class DatasetLayoutTest : public ::testing::TestWithParam<Case> {};

void ExpectAllChunks(const Dataset& ds, const std::vector<std::byte>& want) {
  std::vector<std::byte> got(ds.num_samples() * ds.sample_bytes(), std::byte{0xEE});
  for (uint64_t i = 0; i < ds.num_chunks(); ++i) {
    const uint64_t n = ds.samples_in_chunk(i);
    ASSERT_TRUE(
        ds.ReadChunk(i, std::span(got.data() + i * ds.chunk_samples() * ds.sample_bytes(), n * ds.sample_bytes()))
            .ok());
  }
  for (uint64_t k = 0; k < ds.num_samples(); ++k) {
    ASSERT_TRUE(std::equal(got.begin() + k * ds.sample_bytes(), got.begin() + (k + 1) * ds.sample_bytes(),
                           want.begin() + k * ds.sample_bytes()))
        << "sample " << k;
  }
}

TEST_P(DatasetLayoutTest, ReadsBackExactlyOnBothPaths) {
  const Case& c = GetParam();
  const std::string dir = testing::MakeTempDir("layout");
  const std::string path = dir + "/d.h5";
  const size_t elem = H5Tget_size(c.type);
  const uint64_t sample_bytes = 3 * 5 * 4 * elem;
  const std::vector<std::byte> data = IndexSamples(kN, sample_bytes);
  ASSERT_TRUE(WriteH5(path, kShape, c.type, data, c.layout));

  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->info().read_path, c.expected_path) << ds->info().read_path_reason;
  EXPECT_EQ(ds->num_samples(), kN);
  EXPECT_EQ(ds->sample_shape(), (std::vector<uint64_t>{3, 5, 4}));
  EXPECT_EQ(ds->sample_bytes(), sample_bytes);
  EXPECT_EQ(DTypeSize(ds->dtype()), elem);
  if (c.expected_path == ReadPath::kDirect && !c.layout.chunk.empty()) {
    EXPECT_EQ(ds->chunk_samples(), c.layout.chunk[0]);
  }
  ASSERT_EQ(ds->labels().size(), kN);
  for (uint64_t k = 0; k < kN; ++k) ASSERT_EQ(ds->labels()[k], testing::IndexLabel(k));
  ExpectAllChunks(*ds, data);

  // Any sample range, crossing chunk boundaries.
  std::vector<std::byte> part(9 * sample_bytes);
  ASSERT_TRUE(ds->ReadSamples(5, 9, part).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + 5 * sample_bytes));
  // Each sample alone (a raw chunk's part is read by itself), the last
  // chunk's partial tail included.
  std::vector<std::byte> one(sample_bytes);
  for (uint64_t k = 0; k < kN; ++k) {
    ASSERT_TRUE(ds->ReadSamples(k, 1, one).ok()) << k;
    ASSERT_TRUE(std::equal(one.begin(), one.end(), data.begin() + k * sample_bytes)) << "sample " << k;
  }

  OpenOptions forced;
  forced.force_hdf5_path = true;
  auto via_hdf5 = Dataset::Open(path, forced);
  ASSERT_TRUE(via_hdf5.ok()) << via_hdf5.status().ToString();
  EXPECT_EQ(via_hdf5->info().read_path, ReadPath::kHdf5);
  ExpectAllChunks(*via_hdf5, data);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DatasetLayoutTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Encodes and writes the n samples of `data` (sample_bytes each), chunk by
// chunk, in order.
void WriteAllChunks(DatasetWriter& w, const std::vector<std::byte>& data, uint64_t n, uint64_t sample_bytes) {
  for (uint64_t i = 0; i < w.num_chunks(); ++i) {
    const uint64_t first = i * w.chunk_samples();
    const uint64_t cnt = std::min(w.chunk_samples(), n - first);
    DatasetWriter::EncodedChunk enc;
    ASSERT_TRUE(w.EncodeChunk(i, std::span(data.data() + first * sample_bytes, cnt * sample_bytes), &enc).ok());
    ASSERT_TRUE(w.WriteChunk(i, enc).ok());
  }
}

// gpufeed's writer, every codec and chunk size, read back by gpufeed and by
// HDF5 itself (its own filters, our zstd filter registered in-process).
class WriterRoundTripTest : public ::testing::TestWithParam<std::tuple<Codec, bool, uint64_t>> {};

TEST_P(WriterRoundTripTest, WritesWhatHdf5AndTheDirectPathReadBack) {
  const auto [codec, shuffle, chunk] = GetParam();
  const std::string path = testing::MakeTempDir("writer") + "/w.h5";
  const uint64_t n = 41, sample_bytes = 2 * 6 * 6 * sizeof(uint16_t);
  const std::vector<std::byte> data = IndexSamples(n, sample_bytes);
  WriteOptions o;
  o.codec = codec;
  o.shuffle_filter = shuffle;
  o.chunk_samples = chunk;
  o.layout = "NCHW";
  auto w = DatasetWriter::Create(path, {2, 6, 6}, DType::kUInt16, n, o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  WriteAllChunks(*w, data, n, sample_bytes);
  std::vector<int64_t> labels(n);
  for (uint64_t k = 0; k < n; ++k) labels[k] = testing::IndexLabel(k);
  ASSERT_TRUE(w->WriteLabels(labels).ok());
  ASSERT_TRUE(w->Commit().ok());

  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->info().read_path, ReadPath::kDirect);
  EXPECT_EQ(ds->info().layout, "NCHW");
  EXPECT_EQ(ds->dtype(), DType::kUInt16);
  EXPECT_EQ(ds->labels(), labels);
  ExpectAllChunks(*ds, data);
  OpenOptions forced;
  forced.force_hdf5_path = true;
  auto h = Dataset::Open(path, forced);
  ASSERT_TRUE(h.ok());
  ExpectAllChunks(*h, data);
}

INSTANTIATE_TEST_SUITE_P(Codecs, WriterRoundTripTest,
                         ::testing::Combine(::testing::Values(Codec::kNone, Codec::kDeflate, Codec::kZstd),
                                            ::testing::Bool(), ::testing::Values(1, 8, 41, 0)));

// The writer's file types come from the dtype table's kind and size: each
// is HDF5's standard little-endian type (what h5py and NumPy write), and
// the dataset reads back as the dtype it was written as, with its bytes.
TEST(DatasetTest, EveryDtypeIsWrittenAsHdf5sStandardTypeAndReadsBack) {
  const std::string dir = testing::MakeTempDir("dtypes");
  const std::pair<DType, hid_t> cases[] = {
      {DType::kUInt8, H5T_STD_U8LE},     {DType::kInt8, H5T_STD_I8LE},       {DType::kUInt16, H5T_STD_U16LE},
      {DType::kInt16, H5T_STD_I16LE},    {DType::kUInt32, H5T_STD_U32LE},    {DType::kInt32, H5T_STD_I32LE},
      {DType::kUInt64, H5T_STD_U64LE},   {DType::kInt64, H5T_STD_I64LE},     {DType::kFloat32, H5T_IEEE_F32LE},
      {DType::kFloat64, H5T_IEEE_F64LE}, {DType::kFloat16, H5I_INVALID_HID},
  };
  for (const auto& [dtype, standard] : cases) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const std::string path = dir + "/" + std::string(DTypeName(dtype)) + ".h5";
    const uint64_t n = 5, sample_bytes = 3 * DTypeSize(dtype);
    const std::vector<std::byte> data = IndexSamples(n, sample_bytes);
    WriteOptions o;
    o.codec = Codec::kNone;
    auto w = DatasetWriter::Create(path, {3}, dtype, n, o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    WriteAllChunks(*w, data, n, sample_bytes);
    ASSERT_TRUE(w->Commit().ok());
    {
      const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      ASSERT_GE(f, 0);
      const hid_t d = H5Dopen2(f, "/images", H5P_DEFAULT);
      const hid_t t = H5Dget_type(d);
      EXPECT_EQ(H5Tget_size(t), DTypeSize(dtype));
      EXPECT_EQ(H5Tget_precision(t), 8 * DTypeSize(dtype));
      if (standard != H5I_INVALID_HID) {
        EXPECT_GT(H5Tequal(t, standard), 0);
      }
      H5Tclose(t);
      H5Dclose(d);
      H5Fclose(f);
    }
    auto ds = Dataset::Open(path);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->dtype(), dtype);
    ExpectAllChunks(*ds, data);
  }
}

TEST(DatasetTest, ConcurrentReadsReturnTheRightChunks) {
  const std::string path = testing::MakeTempDir("concurrent") + "/c.h5";
  const uint64_t n = 400, sb = 256;
  const std::vector<std::byte> data = IndexSamples(n, sb);
  ASSERT_TRUE(WriteH5(path, {n, sb}, H5T_NATIVE_UINT8, data, {.chunk = {10, sb}, .deflate = 3}));
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(ds->chunk_bytes_max());
      for (int rep = 0; rep < 20; ++rep) {
        for (uint64_t i = (t + rep) % ds->num_chunks(); i < ds->num_chunks(); i += 3) {
          if (!ds->ReadChunk(i, buf).ok()) ++bad;
          for (uint64_t k = 0; k < ds->samples_in_chunk(i); ++k) {
            if (testing::SampleIndexOf(std::span(buf.data() + k * sb, sb)) != static_cast<int64_t>(i * 10 + k)) ++bad;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(DatasetTest, SpecNamesDatasetAndLabels) {
  auto spec = DatasetSpec::Parse("/data/x.h5:/group/imgs");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->file, "/data/x.h5");
  EXPECT_EQ(spec->images, "/group/imgs");
  spec = DatasetSpec::Parse("plain.h5");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->images, "/images");
  EXPECT_FALSE(DatasetSpec::Parse("").ok());

  const std::string path = testing::MakeTempDir("spec") + "/s.h5";
  const std::vector<std::byte> data = IndexSamples(10, 16);
  ASSERT_TRUE(WriteH5(path, {10, 16}, H5T_NATIVE_UINT8, data, {.chunk = {4, 16}}));
  auto ds = Dataset::Open(path + ":/images", {.labels_path = "none"});
  ASSERT_TRUE(ds.ok());
  EXPECT_FALSE(ds->has_labels());
  EXPECT_TRUE(ds->labels().empty());
}

}  // namespace
}  // namespace gpufeed
