// FieldSource: named fields of several dtypes, shapes and codecs, over one
// file and many (one sample per file, many per file; glob, directory, list),
// through the Loader in every order and world size: every sample once, every
// field of sample k in the same batch row, and clear errors for mismatched
// files, lengths and files that vanish after Open.
#include "gpufeed/fields.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "gpufeed/loader.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/probe.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using testing::MakeTempDir;

// One field of a test file: element e of sample k is V(k, field, e) cast to
// the field's type, so the bytes name the sample and the field.
struct FieldDef {
  std::string name, path;
  hid_t type;  // native type (or the bool enum)
  std::vector<hsize_t> sample_shape;
  std::vector<hsize_t> chunk_samples_and_more;  // empty: contiguous; else full chunk dims
  int deflate = -1;
  bool shuffle = false;
  int zstd = -1;
  bool is_bool = false;
};

double V(uint64_t k, size_t field, uint64_t e) { return static_cast<double>(k * 1000 + field * 100 + e % 97); }

hid_t BoolType() {
  hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
  int8_t f = 0, tr = 1;
  H5Tenum_insert(t, "FALSE", &f);
  H5Tenum_insert(t, "TRUE", &tr);
  return t;
}

uint64_t Elems(const std::vector<hsize_t>& s) {
  uint64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Sample k of field `fi` as bytes of its type.
std::vector<std::byte> SampleBytes(const FieldDef& fd, size_t fi, uint64_t k) {
  const uint64_t n = Elems(fd.sample_shape);
  const size_t es = fd.is_bool ? 1 : H5Tget_size(fd.type);
  std::vector<std::byte> out(n * es);
  for (uint64_t e = 0; e < n; ++e) {
    const double v = V(k, fi, e);
    std::byte* p = out.data() + e * es;
    auto put = [&](auto x) { std::memcpy(p, &x, sizeof x); };
    if (fd.is_bool)
      put(static_cast<int8_t>((k + e) % 2));
    else if (H5Tequal(fd.type, H5T_NATIVE_UINT8) > 0)
      put(static_cast<uint8_t>(static_cast<uint64_t>(v)));
    else if (H5Tequal(fd.type, H5T_NATIVE_INT8) > 0)
      put(static_cast<int8_t>(static_cast<uint64_t>(v)));
    else if (H5Tequal(fd.type, H5T_NATIVE_UINT16) > 0)
      put(static_cast<uint16_t>(static_cast<uint64_t>(v)));
    else if (H5Tequal(fd.type, H5T_NATIVE_INT16) > 0)
      put(static_cast<int16_t>(static_cast<uint64_t>(v)));
    else if (H5Tequal(fd.type, H5T_NATIVE_INT32) > 0)
      put(static_cast<int32_t>(v));
    else if (H5Tequal(fd.type, H5T_NATIVE_UINT64) > 0)
      put(static_cast<uint64_t>(v));
    else if (H5Tequal(fd.type, H5T_NATIVE_INT64) > 0)
      put(static_cast<int64_t>(-v));
    else if (H5Tequal(fd.type, H5T_NATIVE_FLOAT) > 0)
      put(static_cast<float>(v + 0.25));
    else if (H5Tequal(fd.type, H5T_NATIVE_DOUBLE) > 0)
      put(v + 0.125);
    else
      ADD_FAILURE() << "type not handled";
  }
  return out;
}

// Writes samples [first, first + n) of every field into `path`. no_axis:
// one sample (n == 1) stored without the sample axis (DeepCAM's files), its
// chunk dims those of chunk_samples_and_more past the first.
void WriteFile(const std::string& path, const std::vector<FieldDef>& defs, uint64_t first, uint64_t n,
               const std::map<std::string, uint64_t>& override_n = {}, bool no_axis = false) {
  h5::EnsureZstdFilterRegistered();
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  for (size_t fi = 0; fi < defs.size(); ++fi) {
    const FieldDef& fd = defs[fi];
    const uint64_t count = override_n.count(fd.name) ? override_n.at(fd.name) : n;
    std::vector<hsize_t> dims{count};
    if (no_axis) {
      ASSERT_EQ(count, 1u);
      dims.clear();
    }
    dims.insert(dims.end(), fd.sample_shape.begin(), fd.sample_shape.end());
    std::vector<std::byte> data;
    for (uint64_t k = first; k < first + count; ++k) {
      auto s = SampleBytes(fd, fi, k);
      data.insert(data.end(), s.begin(), s.end());
    }
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (!fd.chunk_samples_and_more.empty()) {
      std::vector<hsize_t> c = fd.chunk_samples_and_more;
      c[0] = std::min<hsize_t>(c[0], std::max<hsize_t>(1, count));
      if (no_axis) c.erase(c.begin());
      H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
      if (fd.shuffle) H5Pset_shuffle(dcpl);
      if (fd.deflate >= 0) H5Pset_deflate(dcpl, static_cast<unsigned>(fd.deflate));
      if (fd.zstd >= 0) {
        const unsigned level = static_cast<unsigned>(fd.zstd);
        H5Pset_filter(dcpl, 32015, H5Z_FLAG_OPTIONAL, 1, &level);
      }
    }
    hid_t space =
        dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t type = fd.is_bool ? BoolType() : H5Tcopy(fd.type);
    hid_t ds = H5Dcreate2(file, fd.path.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << fd.path;
    ASSERT_GE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    H5Dclose(ds);
    H5Tclose(type);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
  }
  H5Fclose(file);
}

std::vector<FieldDef> MixedFields() {
  return {
      {"img", "/images", H5T_NATIVE_UINT8, {3, 4, 5}, {7, 3, 4, 5}, 4},         // gzip, chunk 7
      {"mask", "/seg/mask", H5T_NATIVE_INT16, {4, 5}, {5, 4, 5}, -1, true, 3},  // shuffle+zstd, chunk 5
      {"target", "/y", H5T_NATIVE_FLOAT, {2}, {}},                              // contiguous
      {"id", "/meta/id", H5T_NATIVE_INT64, {}, {16}, 1},                        // scalar per sample
      {"w", "/w", H5T_NATIVE_DOUBLE, {3}, {4, 3}},                              // raw chunks
      {"flag", "/flag", 0, {2}, {8, 2}, -1, false, -1, true},                   // h5py bool
      {"u16", "/u16", H5T_NATIVE_UINT16, {2, 2}, {3, 2, 2}, 2, true},           // shuffle+gzip
  };
}

std::vector<std::string> Specs(const std::vector<FieldDef>& defs) {
  std::vector<std::string> s;
  for (const auto& d : defs) s.push_back(d.name + "=" + d.path);
  return s;
}

// Runs every epoch variant and checks: each sample of the epoch once over all
// ranks, every field of row i equal to the file's bytes of sample indices[i].
void ExpectEveryFieldOfEverySampleOnce(const FieldSource& src, const std::vector<FieldDef>& defs) {
  const auto fields = src.fields();
  ASSERT_EQ(fields.size(), defs.size());
  for (Order order : {Order::kSequential, Order::kRandom, Order::kBlock}) {
    for (int world : {1, 3}) {
      std::vector<int> seen(src.num_samples(), 0);
      for (int rank = 0; rank < world; ++rank) {
        LoaderOptions lo;
        lo.batch_size = 5;
        lo.order = order;
        lo.seed = 7;
        lo.threads = 2;
        lo.prefetch = 2;
        lo.shuffle_window = 2;
        lo.cache_bytes = 4096;  // small: chunks are read again and evicted
        lo.rank = rank;
        lo.world_size = world;
        lo.drop_last = true;
        lo.pin_memory = false;
        Loader loader(src, lo);
        auto stream = loader.Epoch(1);
        while (true) {
          auto b = stream.Next();
          ASSERT_TRUE(b.ok()) << b.status().ToString();
          if (!b->has_value()) break;
          const Batch& batch = **b;
          ASSERT_EQ(batch.fields().size(), defs.size());
          for (uint64_t i = 0; i < batch.size(); ++i) {
            const uint64_t k = batch.indices()[i];
            ++seen[k];
            for (size_t f = 0; f < defs.size(); ++f) {
              const auto want = SampleBytes(defs[f], f, k);
              ASSERT_EQ(batch.fields()[f].sample_bytes, want.size());
              ASSERT_EQ(0, std::memcmp(batch.field(f).data() + i * want.size(), want.data(), want.size()))
                  << "field " << defs[f].name << " of sample " << k << " at row " << i << " order " << OrderName(order)
                  << " world " << world;
            }
          }
        }
      }
      // drop_last: each rank floor(N / world) rounded to batches; no sample twice.
      uint64_t total = 0;
      for (uint64_t k = 0; k < seen.size(); ++k) {
        ASSERT_LE(seen[k], 1) << "sample " << k << " delivered twice";
        total += seen[k];
      }
      const uint64_t per_rank = (src.num_samples() / world) / 5 * 5;
      EXPECT_EQ(total, per_rank * world) << OrderName(order) << " world " << world;
    }
  }
}

TEST(FieldSourceTest, OneFileManyDtypesShapesAndCodecs) {
  const std::string dir = MakeTempDir("fields_one");
  const auto defs = MixedFields();
  WriteFile(dir + "/a.h5", defs, 0, 53);
  OpenOptions o;
  o.fields = Specs(defs);
  o.trust_files = true;
  auto src = FieldSource::Open(dir + "/a.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->num_samples(), 53u);
  EXPECT_EQ((*src)->chunk_samples(), 7u);  // the largest field's (img) chunking
  const auto f = (*src)->fields();
  EXPECT_EQ(f[0].dtype, DType::kUInt8);
  EXPECT_EQ(f[1].dtype, DType::kInt16);
  EXPECT_EQ(f[3].sample_shape.size(), 0u);
  EXPECT_TRUE(f[5].is_bool);
  EXPECT_EQ(f[5].dtype, DType::kUInt8);
  ExpectEveryFieldOfEverySampleOnce(**src, defs);
}

TEST(FieldSourceTest, OneSamplePerFileByGlobDirectoryAndList) {
  const std::string dir = MakeTempDir("fields_per_file");
  std::vector<FieldDef> defs = {{"data", "/climate/data", H5T_NATIVE_FLOAT, {2, 3, 4}, {}},
                                {"labels", "/climate/labels_0", H5T_NATIVE_INT32, {3, 4}, {}}};
  std::ofstream list(dir + "/files.txt");
  for (int k = 0; k < 23; ++k) {
    char name[32];
    std::snprintf(name, sizeof name, "s_%03d.h5", k);
    WriteFile(dir + "/" + name, defs, k, 1);
    list << name << "\n";
  }
  list.close();
  OpenOptions o;
  o.fields = Specs(defs);
  for (const std::string& data : {dir + "/s_*.h5", dir, dir + "/files.txt"}) {
    SCOPED_TRACE(data);
    auto src = FieldSource::Open(data, o);  // probed: untrusted files
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    EXPECT_EQ((*src)->files().size(), 23u);
    EXPECT_EQ((*src)->chunk_samples(), 1u);  // a file is a unit
    EXPECT_EQ((*src)->num_chunks(), 23u);
    ExpectEveryFieldOfEverySampleOnce(**src, defs);
    // What opening cost: the probe ran (untrusted files), every file was
    // opened at least once, and both took time.
    const ChunkSource::OpenCosts c = (*src)->open_costs();
    EXPECT_GE(c.opens, 23u);
    EXPECT_GT(c.probe_seconds, 0.0);
    EXPECT_GT(c.open_seconds, 0.0);
  }
}

TEST(FieldSourceTest, ManySamplesPerFileUnitsNeverSpanFiles) {
  const std::string dir = MakeTempDir("fields_many");
  std::vector<FieldDef> defs = {{"x", "/x", H5T_NATIVE_INT16, {2, 3, 3, 3}, {4, 2, 3, 3, 3}, 4},
                                {"y", "/y", H5T_NATIVE_FLOAT, {4}, {12, 4}, 4}};
  WriteFile(dir + "/u0.h5", defs, 0, 12);
  WriteFile(dir + "/u1.h5", defs, 12, 12);
  WriteFile(dir + "/u2.h5", defs, 24, 10);  // the last file may end in a short unit
  OpenOptions o;
  o.fields = Specs(defs);
  o.trust_files = true;
  o.max_open_files = 1;  // every file switch closes and reopens
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->num_samples(), 34u);
  EXPECT_EQ((*src)->chunk_samples(), 4u);  // gcd(4, 12, 12); the last file ends in a unit of 2
  EXPECT_LE((*src)->open_files(), 1u);
  const uint64_t opened_at_open = (*src)->open_costs().opens;
  ExpectEveryFieldOfEverySampleOnce(**src, defs);
  EXPECT_LE((*src)->open_files(), 1u);
  EXPECT_GT((*src)->open_costs().opens, opened_at_open);  // files reopened as the reads moved on
  EXPECT_EQ((*src)->open_costs().probe_seconds, 0.0);     // trusted: no probe
}

// DeepCAM's reference files hold one sample and no sample axis
// (/climate/data is [768, 1152, 16]): with no_sample_axis each file is one
// sample, whatever its storage: one deflate chunk (direct path), chunks that
// split the sample (HDF5's path), contiguous, a scalar.
TEST(FieldSourceTest, FilesWithoutASampleAxisAreOneSampleEach) {
  const std::string dir = MakeTempDir("fields_no_axis");
  std::vector<FieldDef> defs = {{"data", "/climate/data", H5T_NATIVE_FLOAT, {6, 4, 3}, {1, 6, 4, 3}, 4},
                                {"mask", "/climate/labels_0", H5T_NATIVE_INT32, {6, 4}, {1, 3, 2}},
                                {"target", "/target", H5T_NATIVE_DOUBLE, {}, {}},
                                {"u16", "/u16", H5T_NATIVE_UINT16, {5}, {}}};
  for (int k = 0; k < 17; ++k) {
    char name[32];
    std::snprintf(name, sizeof name, "s_%03d.h5", k);
    WriteFile(dir + "/" + name, defs, k, 1, {}, /*no_axis=*/true);
  }
  OpenOptions o;
  o.fields = Specs(defs);
  o.no_sample_axis = true;
  auto src = FieldSource::Open(dir + "/s_*.h5", o);  // probed: the probe opens them the same way
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->num_samples(), 17u);
  EXPECT_EQ((*src)->chunk_samples(), 1u);
  const auto f = (*src)->fields();
  EXPECT_EQ(f[0].sample_shape, (std::vector<uint64_t>{6, 4, 3}));
  EXPECT_EQ(f[1].sample_shape, (std::vector<uint64_t>{6, 4}));
  EXPECT_TRUE(f[2].sample_shape.empty());
  ExpectEveryFieldOfEverySampleOnce(**src, defs);
  for (auto [path, want] : {std::pair{"/climate/data", "direct"}, std::pair{"/climate/labels_0", "hdf5"}}) {
    OpenOptions one;
    one.no_sample_axis = true;
    one.trust_files = true;
    auto ds = Dataset::Open(dir + "/s_003.h5:" + path, one);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ReadPathName(ds->info().read_path), want) << path << ": " << ds->info().read_path_reason;
    EXPECT_TRUE(ds->info().no_sample_axis);
    EXPECT_EQ(ds->num_samples(), 1u);
  }
  // Without the option a scalar field cannot be a field of samples: the
  // error says what to do.
  o.no_sample_axis = false;
  auto plain = FieldSource::Open(dir + "/s_*.h5", o);
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.status().message().find("no-sample-axis"), std::string::npos) << plain.status().ToString();
}

TEST(FieldSourceTest, DefaultFieldsAreImagesAndLabels) {
  const std::string dir = MakeTempDir("fields_default");
  std::vector<FieldDef> defs = {{"images", "/images", H5T_NATIVE_UINT8, {2, 2}, {3, 2, 2}},
                                {"labels", "/labels", H5T_NATIVE_INT64, {}, {}}};
  WriteFile(dir + "/a.h5", defs, 0, 9);
  WriteFile(dir + "/b.h5", defs, 9, 9);
  auto src = FieldSource::Open(dir + "/*.h5", {});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ((*src)->fields().size(), 2u);
  EXPECT_EQ((*src)->fields()[1].name, "labels");
  ExpectEveryFieldOfEverySampleOnce(**src, defs);
}

TEST(FieldSourceTest, FieldsOfDifferentLengthsNameBoth) {
  const std::string dir = MakeTempDir("fields_len");
  std::vector<FieldDef> defs = {{"data", "/data", H5T_NATIVE_FLOAT, {2}, {}},
                                {"mask", "/mask", H5T_NATIVE_UINT8, {2}, {}}};
  WriteFile(dir + "/a.h5", defs, 0, 10, {{"mask", 9}});
  OpenOptions o;
  o.fields = Specs(defs);
  auto src = FieldSource::Open(dir + "/a.h5", o);
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kInvalidArgument);
  const std::string m = src.status().message();
  EXPECT_NE(m.find("'mask' (/mask) has 9"), std::string::npos) << m;
  EXPECT_NE(m.find("'data' (/data) has 10"), std::string::npos) << m;
}

// Trusted, every file is opened here at Open; probed, the files past the
// first are checked against what the probe's children saw of them, and a
// file the children could not open as a Dataset (a missing field) is opened
// here for its error. The same errors either way.
class FileThatDisagrees : public ::testing::TestWithParam<bool> {};

TEST_P(FileThatDisagrees, IsNamed) {
  const std::string dir = MakeTempDir(GetParam() ? "fields_mismatch_trusted" : "fields_mismatch_probed");
  std::vector<FieldDef> defs = {{"data", "/data", H5T_NATIVE_FLOAT, {2, 3}, {}}};
  std::vector<FieldDef> other = {{"data", "/data", H5T_NATIVE_FLOAT, {3, 2}, {}}};
  std::vector<FieldDef> wrong_type = {{"data", "/data", H5T_NATIVE_DOUBLE, {2, 3}, {}}};
  WriteFile(dir + "/a.h5", defs, 0, 2);
  WriteFile(dir + "/b.h5", other, 2, 2);
  OpenOptions o;
  o.fields = Specs(defs);
  o.trust_files = GetParam();
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.status().message().find(dir + "/b.h5:/data"), std::string::npos) << src.status().message();
  EXPECT_NE(src.status().message().find("[3, 2]"), std::string::npos) << src.status().message();
  WriteFile(dir + "/b.h5", wrong_type, 2, 2);
  src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.status().message().find("float64"), std::string::npos) << src.status().message();
  // A field missing from a later file: NotFound naming that file.
  std::vector<FieldDef> renamed = {{"data", "/other", H5T_NATIVE_FLOAT, {2, 3}, {}}};
  WriteFile(dir + "/b.h5", renamed, 2, 2);
  src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kNotFound);
  EXPECT_NE(src.status().message().find(dir + "/b.h5:/data"), std::string::npos) << src.status().message();
  // An h5py bool where the first file has int8.
  std::vector<FieldDef> as_int8 = {{"data", "/data", H5T_NATIVE_INT8, {2, 3}, {}}};
  std::vector<FieldDef> as_bool = {{"data", "/data", 0, {2, 3}, {}, -1, false, -1, true}};
  WriteFile(dir + "/a.h5", as_int8, 0, 2);
  WriteFile(dir + "/b.h5", as_bool, 2, 2);
  src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.status().message().find(dir + "/b.h5:/data"), std::string::npos) << src.status().message();
  EXPECT_NE(src.status().message().find("(bool)"), std::string::npos) << src.status().message();
}

INSTANTIATE_TEST_SUITE_P(TrustedAndProbed, FileThatDisagrees, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Trusted" : "Probed"; });

// Probed files past the first are placed from what the probe saw, and
// opened by their first read (or ahead of it, by WillRead): Open itself
// opens one file however many there are, every file is opened once when
// they all fit under max_open_files, and the bytes are the files'.
TEST(FieldSourceTest, ProbedFilesAreOpenedByTheirReadsNotByOpen) {
  const std::string dir = MakeTempDir("fields_lazy");
  std::vector<FieldDef> defs = {{"x", "/x", H5T_NATIVE_INT16, {2, 3}, {4, 2, 3}, 4},
                                {"y", "/y", H5T_NATIVE_FLOAT, {}, {}}};
  constexpr int kFiles = 12;
  for (int f = 0; f < kFiles; ++f) WriteFile(dir + "/f" + std::to_string(100 + f) + ".h5", defs, f * 8, 8);
  OpenOptions o;
  o.fields = Specs(defs);
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->num_samples(), 8u * kFiles);
  EXPECT_EQ((*src)->open_costs().opens, 1u);  // the first file, for the fields' types and shapes
  EXPECT_EQ((*src)->open_files(), 1u);
  // Announced units are opened ahead on the source's own thread.
  for (uint64_t i = 0; i < (*src)->num_chunks(); ++i) (*src)->WillRead(i);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((*src)->open_files() < kFiles && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ((*src)->open_files(), size_t{kFiles});
  // Reads from several threads at once, each unit by two threads: what was
  // opened ahead is read, not opened again.
  std::vector<std::thread> readers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      std::vector<std::byte> buf((*src)->chunk_samples() * (*src)->sample_bytes());
      for (uint64_t i = static_cast<uint64_t>(t % 2); i < (*src)->num_chunks(); i += 1) {
        if (!(*src)->ReadChunk(i, buf).ok()) bad.fetch_add(1);
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ((*src)->open_costs().opens, uint64_t{kFiles});
  ExpectEveryFieldOfEverySampleOnce(**src, defs);
  EXPECT_EQ((*src)->open_costs().opens, uint64_t{kFiles});  // still open: nothing reopened
}

// The probe saw one file; the file a read opens later is another (rewritten
// in between): the read's error says what changed, and no bytes of the new
// file are delivered as the old one's.
TEST(FieldSourceTest, AFileChangedAfterTheProbeIsAnErrorAtItsFirstRead) {
  const std::string dir = MakeTempDir("fields_changed");
  std::vector<FieldDef> defs = {{"data", "/data", H5T_NATIVE_FLOAT, {4}, {}}};
  std::vector<FieldDef> as_double = {{"data", "/data", H5T_NATIVE_DOUBLE, {4}, {}}};
  for (int f = 0; f < 4; ++f) WriteFile(dir + "/f" + std::to_string(f) + ".h5", defs, f * 3, 3);
  OpenOptions o;
  o.fields = Specs(defs);
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  WriteFile(dir + "/f2.h5", defs, 6, 5);       // more samples than the probe saw
  WriteFile(dir + "/f3.h5", as_double, 9, 3);  // another dtype
  std::vector<std::byte> buf(3 * 4 * sizeof(float));
  EXPECT_TRUE((*src)->ReadChunk(1, buf).ok());
  Status s = (*src)->ReadChunk(2, buf);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f2.h5"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("now has 5 samples, had 3"), std::string::npos) << s.ToString();
  s = (*src)->ReadChunk(3, buf);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f3.h5"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("float64"), std::string::npos) << s.ToString();
}

TEST(FieldSourceTest, FileThatVanishesAfterOpenIsAnErrorAtItsUnit) {
  const std::string dir = MakeTempDir("fields_vanish");
  std::vector<FieldDef> defs = {{"data", "/data", H5T_NATIVE_FLOAT, {4}, {}}};
  for (int f = 0; f < 4; ++f) WriteFile(dir + "/f" + std::to_string(f) + ".h5", defs, f * 3, 3);
  OpenOptions o;
  o.fields = Specs(defs);
  o.trust_files = true;
  o.max_open_files = 1;
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  std::filesystem::remove(dir + "/f2.h5");
  LoaderOptions lo;
  lo.batch_size = 3;
  lo.order = Order::kSequential;
  lo.threads = 1;
  lo.pin_memory = false;
  Loader loader(**src, lo);
  auto stream = loader.Epoch(0);
  Status failure;
  while (true) {
    auto b = stream.Next();
    if (!b.ok()) {
      failure = b.status();
      break;
    }
    if (!b->has_value()) break;
  }
  ASSERT_FALSE(failure.ok()) << "the epoch ended without reporting the missing file";
  EXPECT_NE(failure.message().find("f2.h5"), std::string::npos) << failure.ToString();
  EXPECT_NE(failure.message().find("unit 2"), std::string::npos) << failure.ToString();
}

// The probe's children report what they saw of each spec they opened as a
// Dataset; a spec they could not open has no facts (and is not a failure of
// the probe: the caller's own open names what is wrong).
TEST(FieldSourceTest, TheProbeReportsWhatItSaw) {
  const std::string dir = MakeTempDir("probe_facts");
  std::vector<FieldDef> defs = {{"data", "/g/data", H5T_NATIVE_FLOAT, {2, 3}, {4, 2, 3}, 4},
                                {"flag", "/flag", 0, {5}, {}, -1, false, -1, true},
                                {"id", "/id", H5T_NATIVE_UINT16, {}, {}}};
  WriteFile(dir + "/a.h5", defs, 0, 7);
  const std::vector<std::string> specs = {dir + "/a.h5:/g/data", dir + "/a.h5:/flag", dir + "/a.h5:/id",
                                          dir + "/a.h5:/missing"};
  ProbeOptions po;
  po.processes = 2;
  std::vector<std::optional<SpecFacts>> facts;
  const std::vector<Status> r = ProbeFiles(specs, po, &facts);
  ASSERT_EQ(r.size(), 4u);
  ASSERT_EQ(facts.size(), 4u);
  for (const Status& s : r) EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(facts[0] && facts[1] && facts[2]);
  EXPECT_EQ(facts[0]->dtype, DType::kFloat32);
  EXPECT_EQ(facts[0]->sample_shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(facts[0]->num_samples, 7u);
  EXPECT_FALSE(facts[0]->is_bool);
  EXPECT_FALSE(facts[0]->is_virtual);
  EXPECT_EQ(facts[1]->dtype, DType::kUInt8);
  EXPECT_TRUE(facts[1]->is_bool);
  EXPECT_EQ(facts[1]->sample_shape, (std::vector<uint64_t>{5}));
  EXPECT_EQ(facts[2]->dtype, DType::kUInt16);
  EXPECT_TRUE(facts[2]->sample_shape.empty());
  EXPECT_EQ(facts[2]->num_samples, 7u);
  EXPECT_FALSE(facts[3].has_value());
  // And how the direct path reads each: deflate chunks of 4 samples (two
  // for 7), a contiguous array, of the file it parsed.
  ASSERT_TRUE(facts[0]->plan && facts[2]->plan);
  const DirectPlan& chunked = *facts[0]->plan;
  EXPECT_FALSE(chunked.contiguous);
  EXPECT_EQ(chunked.chunk_samples, 4u);
  EXPECT_EQ(chunked.chunk_addr.size(), 2u);
  ASSERT_EQ(chunked.pipeline.size(), 1u);
  EXPECT_EQ(chunked.pipeline[0].id, 1);  // deflate
  EXPECT_EQ(chunked.identity.size, std::filesystem::file_size(dir + "/a.h5"));
  EXPECT_TRUE(facts[2]->plan->contiguous);
  EXPECT_TRUE(facts[2]->plan->chunk_addr.empty());
  EXPECT_EQ(facts[2]->plan->identity, chunked.identity);
  // What HDF5 must read itself has no plan (forced here).
  po.open.force_hdf5_path = true;
  ProbeFiles({specs[0]}, po, &facts);
  ASSERT_TRUE(facts[0]);
  EXPECT_FALSE(facts[0]->plan);
}

// Files past the first are opened from the probe's plan: with open(2) in
// this process, no HDF5, for every layout the direct path reads (contiguous,
// raw chunks, deflate, shuffle + zstd, h5py bool), again after each eviction
// (max_open_files 2), and the bytes are the files'. A file of more chunks
// than the probe's report holds is opened through HDF5, as before.
TEST(FieldSourceTest, SmallFilesAreOpenedFromTheProbesPlanWithoutHdf5) {
  const std::string dir = MakeTempDir("fields_planned");
  const std::vector<FieldDef> defs = MixedFields();
  constexpr int kFiles = 6;
  for (int f = 0; f < kFiles; ++f) WriteFile(dir + "/f" + std::to_string(f) + ".h5", defs, f * 10, 10);
  OpenOptions o;
  o.fields = Specs(defs);
  o.max_open_files = 2;
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ExpectEveryFieldOfEverySampleOnce(**src, defs);
  const ChunkSource::OpenCosts c = (*src)->open_costs();
  EXPECT_GT(c.opens, uint64_t{2 * kFiles});  // evicted and opened again
  EXPECT_EQ(c.planned_opens, c.opens - 1);   // all but the first file's at Open

  // Trusted files are all opened through HDF5 at Open (no probe); what is
  // opened again after an eviction is opened by the plan kept from then.
  o.trust_files = true;
  auto trusted = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(trusted.ok()) << trusted.status().ToString();
  EXPECT_EQ((*trusted)->open_costs().opens, uint64_t{kFiles});
  ExpectEveryFieldOfEverySampleOnce(**trusted, defs);
  const ChunkSource::OpenCosts t = (*trusted)->open_costs();
  EXPECT_GT(t.opens, uint64_t{2 * kFiles});
  EXPECT_EQ(t.planned_opens, t.opens - kFiles);

  // 400 chunks of one sample: more than a report holds.
  const std::string many = MakeTempDir("fields_unplanned");
  const std::vector<FieldDef> fine = {{"v", "/v", H5T_NATIVE_INT32, {3}, {1, 3}}};
  for (int f = 0; f < 3; ++f) WriteFile(many + "/f" + std::to_string(f) + ".h5", fine, f * 400, 400);
  OpenOptions m;
  m.fields = Specs(fine);
  auto unplanned = FieldSource::Open(many + "/*.h5", m);
  ASSERT_TRUE(unplanned.ok()) << unplanned.status().ToString();
  std::vector<std::byte> buf((*unplanned)->chunk_samples() * (*unplanned)->sample_bytes());
  for (uint64_t i = 0; i < (*unplanned)->num_chunks(); ++i) {
    ASSERT_TRUE((*unplanned)->ReadChunk(i, buf).ok());
    const uint64_t k = i * (*unplanned)->chunk_samples();
    const auto want = SampleBytes(fine[0], 0, k);
    ASSERT_EQ(0, std::memcmp(buf.data(), want.data(), want.size())) << "sample " << k;
  }
  EXPECT_EQ((*unplanned)->open_costs().opens, 3u);
  EXPECT_EQ((*unplanned)->open_costs().planned_opens, 0u);
}

// A file rewritten after the probe with the same size and layout (only its
// times differ) is not read by the old plan: it is opened through HDF5 and
// its bytes now are what a read delivers.
TEST(FieldSourceTest, AFileRewrittenAfterTheProbeIsNotReadByItsOldPlan) {
  const std::string dir = MakeTempDir("fields_stale_plan");
  const std::vector<FieldDef> defs = {{"x", "/x", H5T_NATIVE_INT16, {2, 3}, {2, 2, 3}, 4, true},
                                      {"y", "/y", H5T_NATIVE_FLOAT, {}, {}}};
  for (int f = 0; f < 3; ++f) WriteFile(dir + "/f" + std::to_string(f) + ".h5", defs, f * 4, 4);
  OpenOptions o;
  o.fields = Specs(defs);
  auto src = FieldSource::Open(dir + "/*.h5", o);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const auto size = std::filesystem::file_size(dir + "/f1.h5");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the file system's time granularity
  WriteFile(dir + "/f1.h5", defs, 100, 4);                     // samples 100..103 in place of 4..7
  ASSERT_EQ(std::filesystem::file_size(dir + "/f1.h5"), size);
  std::vector<std::byte> buf((*src)->chunk_samples() * (*src)->sample_bytes());
  const uint64_t unit = 4 / (*src)->chunk_samples();  // f1's first unit
  ASSERT_TRUE((*src)->ReadChunk(unit, buf).ok());
  const auto want = SampleBytes(defs[0], 0, 100);
  EXPECT_EQ(0, std::memcmp(buf.data(), want.data(), want.size()));
  EXPECT_EQ((*src)->open_costs().planned_opens, 0u);
}

TEST(FieldSourceTest, BadFieldSpecsAndEmptyInputs) {
  EXPECT_FALSE(FieldSpec::Parse("data").ok());
  EXPECT_FALSE(FieldSpec::Parse("=/x").ok());
  EXPECT_FALSE(FieldSpec::Parse("a b=/x").ok());
  EXPECT_FALSE(FieldSpec::Parse("indices=/x").ok());
  auto ok = FieldSpec::Parse("mask=seg/mask");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->path, "/seg/mask");
  const std::string dir = MakeTempDir("fields_empty");
  auto none = FieldSource::Open(dir + "/*.h5", {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(IsMultiFileSpec(dir));
  EXPECT_TRUE(IsMultiFileSpec("x/*.h5"));
  EXPECT_FALSE(IsMultiFileSpec("x.h5"));
}

}  // namespace
}  // namespace gpufeed
