// ConvertFields (convert.h): named fields of many HDF5 files or .npy pairs
// into one file or shards: every sample once, in order, fields aligned,
// bytes identical; per-channel stats in every shard; files that disagree
// named; a failure leaves no output.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>

#include "gpufeed/convert.h"
#include "gpufeed/dataset.h"
#include "gpufeed/fields.h"
#include "tests/testing/sources.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;
using testing::IndexSamples;
using testing::MakeTempDir;

constexpr uint64_t kDataBytes = 2 * 3 * 4;  // data: uint8 [3, 2, 4]
constexpr uint64_t kMaskBytes = 10;         // mask: uint8 [10]

// Samples [first, first + n) of `sample_bytes` index-valued bytes, as uint8 [n, shape...].
std::vector<std::byte> Slice(uint64_t first, uint64_t n, uint64_t sample_bytes) {
  std::vector<std::byte> v(n * sample_bytes);
  testing::FillIndexSamples(first, n, sample_bytes, v);
  return v;
}

void WriteDataset(hid_t file, const char* path, hid_t type, const std::vector<hsize_t>& dims, hsize_t chunk0,
                  const void* data) {
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::vector<hsize_t> chunk = dims;
  chunk[0] = std::min(chunk0, dims[0]);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t ds = H5Dcreate2(file, path, type, space, lcpl, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0) << path;
  ASSERT_GE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  H5Dclose(ds);
  H5Sclose(space);
  H5Pclose(dcpl);
  H5Pclose(lcpl);
}

// /climate/data uint8 [n, 3, 2, 4] and /climate/mask uint8 [n, 10] of samples [first, first + n).
void WriteH5Fields(const std::string& path, uint64_t first, uint64_t n, bool mask_int16 = false) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  WriteDataset(f, "/climate/data", H5T_NATIVE_UINT8, {n, 3, 2, 4}, 3, Slice(first, n, kDataBytes).data());
  if (mask_int16) {
    std::vector<int16_t> m(n * kMaskBytes, 1);
    WriteDataset(f, "/climate/mask", H5T_NATIVE_INT16, {n, kMaskBytes}, 3, m.data());
  } else {
    WriteDataset(f, "/climate/mask", H5T_NATIVE_UINT8, {n, kMaskBytes}, 3, Slice(first, n, kMaskBytes).data());
  }
  H5Fclose(f);
}

// A .npy of uint8 with `shape` holding `data`.
void WriteNpy(const std::string& path, const std::vector<uint64_t>& shape, std::span<const std::byte> data,
              const char* descr = "|u1") {
  std::string dims;
  for (uint64_t d : shape) dims += std::to_string(d) + ",";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(dict.size() & 0xff));
  out.put(static_cast<char>(dict.size() >> 8));
  out << dict;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// Reads outputs as a many-file dataset with the given fields and checks
// sample k of every field is index k, bytes exactly: every sample once, in
// order, fields aligned.
void ExpectIndexValued(const std::string& data, const std::vector<std::string>& fields, uint64_t n) {
  OpenOptions o;
  o.fields = fields;
  auto src = FieldSource::Open(data, o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ((*src)->num_samples(), n);
  const std::vector<FieldInfo> info = (*src)->fields();
  ASSERT_EQ(info.size(), 2u);
  const uint64_t k = (*src)->chunk_samples();
  std::vector<std::byte> unit(k * (*src)->sample_bytes());
  uint64_t next = 0;
  for (uint64_t u = 0; u < (*src)->num_chunks(); ++u) {
    ASSERT_TRUE((*src)->ReadChunk(u, unit).ok());
    for (uint64_t s = 0; s < (*src)->samples_in_chunk(u); ++s, ++next) {
      for (const FieldInfo& f : info) {
        const std::vector<std::byte> want = Slice(next, 1, f.sample_bytes);
        ASSERT_EQ(0, std::memcmp(unit.data() + k * f.offset + s * f.sample_bytes, want.data(), f.sample_bytes))
            << f.name << " of sample " << next;
      }
    }
  }
  EXPECT_EQ(next, n);
}

void ExpectNoTempFiles(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

Result<std::unique_ptr<FieldSource>> OpenInput(const std::string& dir) {
  OpenOptions o;
  o.fields = {"data=/climate/data", "mask=/climate/mask"};
  return FieldSource::Open(dir + "/in*.h5", o);
}

TEST(ConvertFieldsTest, GlobOfHdf5FilesToOneFileAndToShards) {
  const std::string dir = MakeTempDir("convert_fields_h5");
  const uint64_t counts[] = {5, 4, 7};
  uint64_t n = 0;
  for (int f = 0; f < 3; ++f) {
    WriteH5Fields(dir + "/in" + std::to_string(f) + ".h5", n, counts[f]);
    n += counts[f];
  }
  auto src = OpenInput(dir);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const std::vector<std::string> fields = {"data=/climate/data", "mask=/climate/mask"};

  FieldConvertOptions one;
  one.convert.threads = 2;
  auto s1 = ConvertFields(**src, dir + "/out.h5", one);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  ASSERT_EQ(s1->outputs, std::vector<std::string>{dir + "/out.h5"});
  ExpectIndexValued(dir + "/out.h5", fields, n);
  // Writing over an input is refused (and leaves it).
  const uintmax_t in1_size = fs::file_size(dir + "/in1.h5");
  auto over = ConvertFields(**src, dir + "/in1.h5", one);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("is one of the inputs"), std::string::npos) << over.status().ToString();
  EXPECT_EQ(fs::file_size(dir + "/in1.h5"), in1_size);

  FieldConvertOptions sharded;
  sharded.convert.threads = 3;
  sharded.convert.write.chunk_samples = 2;
  sharded.shard_bytes = 5 * (kDataBytes + kMaskBytes);  // 5 samples -> 4 (whole chunks of 2)
  auto s2 = ConvertFields(**src, dir + "/shard.h5", sharded);
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  EXPECT_EQ(s2->shard_samples, 4u);
  ASSERT_EQ(s2->outputs.size(), 4u);  // 16 samples: 4 + 4 + 4 + 4
  for (size_t i = 0; i < s2->outputs.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/shard-%05zu.h5", i);
    EXPECT_EQ(s2->outputs[i], dir + name);
    // Self-contained: each shard has both fields, the format attribute and
    // the whole dataset's per-channel statistics.
    auto ds = Dataset::Open(s2->outputs[i] + ":/climate/data");
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->info().layout, "NCHW");  // guessed from [3, 2, 4]
    ASSERT_EQ(ds->info().mean.size(), 3u);
    EXPECT_EQ(ds->info().mean, s2->stats[0].means());
    auto mask = Dataset::Open(s2->outputs[i] + ":/climate/mask");
    ASSERT_TRUE(mask.ok());
    EXPECT_EQ(mask->info().mean.size(), 1u);
  }
  ExpectIndexValued(dir + "/shard-*.h5", fields, n);
  // The sharded and the single file agree on the statistics (to rounding:
  // the chunks, so the merge order, differ).
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(s1->stats[0].channels[c].mean, s2->stats[0].channels[c].mean, 1e-12);
    EXPECT_NEAR(s1->stats[0].channels[c].stddev, s2->stats[0].channels[c].stddev, 1e-12);
  }
  ExpectNoTempFiles(dir);
}

TEST(ConvertFieldsTest, NpyPairsPerShardAndPerSample) {
  const std::string dir = MakeTempDir("convert_fields_npy");
  const uint64_t counts[] = {3, 6, 2};
  uint64_t n = 0;
  for (int f = 0; f < 3; ++f) {
    WriteNpy(dir + "/part" + std::to_string(f) + "_data.npy", {counts[f], 3, 2, 4}, Slice(n, counts[f], kDataBytes));
    WriteNpy(dir + "/part" + std::to_string(f) + "_mask.npy", {counts[f], kMaskBytes}, Slice(n, counts[f], kMaskBytes));
    n += counts[f];
  }
  auto src = OpenNpyFields({"data=" + dir + "/*_data.npy", "mask=" + dir + "/*_mask.npy"}, false);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  FieldConvertOptions o;
  o.convert.write.chunk_samples = 4;
  o.shard_bytes = 8 * (kDataBytes + kMaskBytes);
  auto s = ConvertFields(**src, dir + "/out.h5", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->outputs.size(), 2u);  // 11 samples: 8 + 3
  ExpectIndexValued(dir + "/out-*.h5", {"data=/data", "mask=/mask"}, n);

  // One sample per file, no sample axis.
  const std::string one = MakeTempDir("convert_fields_npy_one");
  for (uint64_t k = 0; k < 5; ++k) {
    WriteNpy(one + "/s" + std::to_string(k) + "_data.npy", {2, 3, 4}, Slice(k, 1, kDataBytes));
    WriteNpy(one + "/s" + std::to_string(k) + "_mask.npy", {kMaskBytes}, Slice(k, 1, kMaskBytes));
  }
  auto src1 = OpenNpyFields({"data=" + one + "/*_data.npy", "mask=" + one + "/*_mask.npy"}, true);
  ASSERT_TRUE(src1.ok()) << src1.status().ToString();
  auto s1 = ConvertFields(**src1, one + "/out.h5", {});
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  ExpectIndexValued(one + "/out.h5", {"data=/data", "mask=/mask"}, 5);
}

TEST(ConvertFieldsTest, FilesThatDisagreeAreNamed) {
  const std::string dir = MakeTempDir("convert_fields_disagree");
  WriteH5Fields(dir + "/in0.h5", 0, 3);
  WriteH5Fields(dir + "/in1.h5", 3, 3, /*mask_int16=*/true);
  WriteH5Fields(dir + "/in2.h5", 6, 3, /*mask_int16=*/true);
  auto src = OpenInput(dir);
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.status().message().find("in1.h5"), std::string::npos) << src.status().ToString();
  EXPECT_EQ(src.status().message().find("in2.h5"), std::string::npos) << src.status().ToString();

  WriteNpy(dir + "/a_data.npy", {2, 2, 3, 4}, Slice(0, 2, kDataBytes));
  std::vector<std::byte> wide(2 * kDataBytes * 2);
  WriteNpy(dir + "/b_data.npy", {2, 2, 3, 4}, wide, "<u2");
  WriteNpy(dir + "/c_data.npy", {2, 2, 3, 4}, wide, "<u2");
  auto npy = OpenNpyFields({"data=" + dir + "/*_data.npy"}, false);
  ASSERT_FALSE(npy.ok());
  EXPECT_NE(npy.status().message().find("b_data.npy"), std::string::npos) << npy.status().ToString();
  EXPECT_NE(npy.status().message().find("uint16"), std::string::npos) << npy.status().ToString();

  // A field naming fewer files than the first.
  WriteNpy(dir + "/a_mask.npy", {2, kMaskBytes}, Slice(0, 2, kMaskBytes));
  auto fewer = OpenNpyFields({"data=" + dir + "/a_data.npy", "mask=" + dir + "/*_mask.npy"}, false);
  ASSERT_TRUE(fewer.ok()) << fewer.status().ToString();
  WriteNpy(dir + "/z_mask.npy", {2, kMaskBytes}, Slice(2, 2, kMaskBytes));
  fewer = OpenNpyFields({"data=" + dir + "/a_data.npy", "mask=" + dir + "/*_mask.npy"}, false);
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("names 2 files"), std::string::npos) << fewer.status().ToString();
}

TEST(ConvertFieldsTest, FailureMidwayLeavesNoOutput) {
  const std::string dir = MakeTempDir("convert_fields_fail");
  testing::InMemorySource src(100, 64, 8);
  src.set_fail_chunk(9);
  FieldConvertOptions o;
  o.convert.threads = 2;
  o.convert.write.chunk_samples = 8;
  o.shard_bytes = 16 * 64;  // 7 shards; the failure is in the 5th
  auto s = ConvertFields(src, dir + "/out.h5", o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("injected failure"), std::string::npos) << s.status().ToString();
  EXPECT_TRUE(fs::is_empty(dir)) << "left behind: " << fs::directory_iterator(dir)->path();
  src.set_fail_chunk(-1);
  auto ok = ConvertFields(src, dir + "/out.h5", o);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->outputs.size(), 7u);
}

}  // namespace
}  // namespace gpufeed
