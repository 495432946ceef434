// HDF5 virtual datasets (VDS) built as h5py's VirtualLayout builds them:
// sources concatenated (or stacked) along axis 0, in other files and in the
// same file ("."), with different codecs. Through OpenBatchSource and the
// Loader: every sample once per epoch for block/random orders and world
// sizes 1 and 3, each field's bytes identical to HDF5's own read of the
// virtual dataset. Missing sources, gaps and mappings gpufeed cannot read
// as axis-0 ranges are clear errors.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "daemon/datasets.h"
#include "gpufeed/dataset.h"
#include "gpufeed/fields.h"
#include "gpufeed/loader.h"
#include "gpufeed/open_source.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/probe.h"
#include "hdf5io/hdf5/virtual.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using testing::MakeTempDir;

constexpr hsize_t kH = 3, kW = 5;  // images are uint8 [N, 3, 5]
constexpr uint64_t kSampleBytes = kH * kW;

enum class Codec { kNone, kDeflate, kZstd, kShuffleDeflate, kLzf };

int64_t LabelOf(uint64_t k) { return static_cast<int64_t>(k * 7 + 3); }

// Writes `path` with /data uint8 [n, 3, 5] (samples first.., index-valued)
// and /labels int64 [n], chunked along axis 0 by `chunk`, filtered by codec.
void WriteSource(const std::string& path, uint64_t first, uint64_t n, Codec codec, hsize_t chunk = 8) {
  h5::EnsureZstdFilterRegistered();
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0) << path;
  std::vector<std::byte> data(n * kSampleBytes);
  testing::FillIndexSamples(first, n, kSampleBytes, data);
  std::vector<int64_t> labels(n);
  for (uint64_t i = 0; i < n; ++i) labels[i] = LabelOf(first + i);
  auto write = [&](const char* name, hid_t type, std::vector<hsize_t> dims, const void* buf) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    std::vector<hsize_t> c = dims;
    c[0] = std::min<hsize_t>(chunk, n);
    H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
    if (codec == Codec::kShuffleDeflate) H5Pset_shuffle(dcpl);
    if (codec == Codec::kDeflate || codec == Codec::kShuffleDeflate) H5Pset_deflate(dcpl, 4);
    if (codec == Codec::kLzf) H5Pset_filter(dcpl, 32000, H5Z_FLAG_MANDATORY, 0, nullptr);  // Debian's plugin
    if (codec == Codec::kZstd) {
      const unsigned level = 3;
      H5Pset_filter(dcpl, 32015, H5Z_FLAG_OPTIONAL, 1, &level);
    }
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t ds = H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << path << name;
    ASSERT_GE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(dcpl);
  };
  write("data", H5T_NATIVE_UINT8, {n, kH, kW}, data.data());
  write("labels", H5T_NATIVE_INT64, {n}, labels.data());
  H5Fclose(file);
}

// One mapping: virtual samples [first, first + count) from source rows
// [src_first, src_first + count) of file:dset (the name as stored: relative,
// absolute or "."); stacked: one virtual sample from a whole [3, 5] source.
struct Map {
  std::string file, dset;
  hsize_t first, count, src_first = 0, src_rows = 0;  // src_rows: the source's axis 0 (0: first + count)
  bool stacked = false;
};

// Adds virtual dataset `name` of `n` samples with `sample` dims to the open
// file, mapped by `maps`.
void AddVds(hid_t file, const char* name, hid_t type, hsize_t n, std::vector<hsize_t> sample,
            const std::vector<Map>& maps) {
  std::vector<hsize_t> dims{n};
  dims.insert(dims.end(), sample.begin(), sample.end());
  const int rank = static_cast<int>(dims.size());
  hid_t vspace = H5Screate_simple(rank, dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  for (const Map& m : maps) {
    std::vector<hsize_t> start(rank, 0), count = dims;
    start[0] = m.first;
    count[0] = m.count;
    H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    hid_t sspace;
    if (m.stacked) {
      sspace = H5Screate_simple(rank - 1, sample.data(), nullptr);
    } else {
      std::vector<hsize_t> sdims = dims;
      sdims[0] = m.src_rows ? m.src_rows : m.src_first + m.count;
      sspace = H5Screate_simple(rank, sdims.data(), nullptr);
      std::vector<hsize_t> sstart(rank, 0), scount = count;
      sstart[0] = m.src_first;
      H5Sselect_hyperslab(sspace, H5S_SELECT_SET, sstart.data(), nullptr, scount.data(), nullptr);
    }
    ASSERT_GE(H5Pset_virtual(dcpl, vspace, m.file.c_str(), m.dset.c_str(), sspace), 0);
    H5Sclose(sspace);
  }
  H5Sselect_all(vspace);
  hid_t ds = H5Dcreate2(file, name, type, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0) << name;
  H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(vspace);
}

// The h5py case: /images and /labels of vds.h5 concatenate sources whose
// sizes are given, each source with its codec. Returns the VDS path.
std::string MakeConcatenated(const std::string& dir, const std::vector<uint64_t>& sizes,
                             const std::vector<Codec>& codecs) {
  std::vector<Map> images, labels;
  uint64_t first = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "src" + std::to_string(i) + ".h5";
    WriteSource(dir + "/" + name, first, sizes[i], codecs[i % codecs.size()]);
    images.push_back({name, "/data", first, sizes[i]});
    labels.push_back({name, "/labels", first, sizes[i]});
    first += sizes[i];
  }
  const std::string path = dir + "/vds.h5";
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  AddVds(file, "images", H5T_NATIVE_UINT8, first, {kH, kW}, images);
  AddVds(file, "labels", H5T_NATIVE_INT64, first, {}, labels);
  H5Fclose(file);
  return path;
}

// HDF5's own read of a whole dataset (the virtual one: HDF5 resolves it).
std::vector<std::byte> H5ReadAll(const std::string& file, const std::string& dset, hid_t type, size_t bytes) {
  std::vector<std::byte> out(bytes);
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dset.c_str(), H5P_DEFAULT);
  EXPECT_GE(d, 0) << file << dset;
  EXPECT_GE(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0);
  H5Dclose(d);
  H5Fclose(f);
  return out;
}

// Every epoch variant: each sample once over the ranks, field f of row i
// equal to want[f]'s bytes of sample indices[i] (HDF5's read of the VDS).
void ExpectEverySampleOnce(const ChunkSource& src, const std::vector<std::vector<std::byte>>& want) {
  const auto fields = src.fields();
  ASSERT_EQ(fields.size(), want.size());
  for (Order order : {Order::kBlock, Order::kRandom}) {
    for (int world : {1, 3}) {
      std::vector<int> seen(src.num_samples(), 0);
      for (int rank = 0; rank < world; ++rank) {
        LoaderOptions lo;
        lo.batch_size = 5;
        lo.order = order;
        lo.seed = 11;
        lo.threads = 2;
        lo.prefetch = 2;
        lo.shuffle_window = 2;
        lo.cache_bytes = 2048;  // small: units are read again and evicted
        lo.rank = rank;
        lo.world_size = world;
        lo.pin_memory = false;
        Loader loader(src, lo);
        auto stream = loader.Epoch(2);
        while (true) {
          auto b = stream.Next();
          ASSERT_TRUE(b.ok()) << b.status().ToString();
          if (!b->has_value()) break;
          const Batch& batch = **b;
          for (uint64_t i = 0; i < batch.size(); ++i) {
            const uint64_t k = batch.indices()[i];
            ++seen[k];
            for (size_t f = 0; f < fields.size(); ++f) {
              const uint64_t sb = fields[f].sample_bytes;
              ASSERT_EQ(0, std::memcmp(batch.field(f).data() + i * sb, want[f].data() + k * sb, sb))
                  << "field " << fields[f].name << " of sample " << k << ", " << OrderName(order) << ", world "
                  << world;
            }
          }
        }
      }
      // Every sample, each once but for the padding that evens the ranks'
      // shares (drop_last false: ceil(N / world) each, as DistributedSampler).
      const uint64_t n = seen.size(), pad = (n + world - 1) / world * world - n;
      uint64_t twice = 0;
      for (uint64_t k = 0; k < n; ++k) {
        ASSERT_GE(seen[k], 1) << "sample " << k << " missing, " << OrderName(order) << ", world " << world;
        ASSERT_LE(seen[k], 2) << "sample " << k << ", " << OrderName(order) << ", world " << world;
        twice += seen[k] - 1;
      }
      EXPECT_EQ(twice, pad) << OrderName(order) << ", world " << world;
    }
  }
}

Result<std::unique_ptr<OpenedSource>> OpenLoader(const std::string& data, std::vector<std::string> fields = {},
                                                 int max_open_files = 256) {
  SourceOptions so;
  so.data = data;
  so.open.fields = std::move(fields);
  so.open.max_open_files = max_open_files;
  so.loader.pin_memory = false;
  return OpenBatchSource(so);
}

TEST(VdsTest, ConcatenatedSourcesOfEveryCodecReadDirectly) {
  const std::string dir = MakeTempDir("vds_concat");
  const std::vector<uint64_t> sizes = {24, 16, 24, 32, 13};
  // LZF (a plugin filter, as scientific files use) where HDF5 finds Debian's
  // plugin to write it (scripts/setup installs it); deflate elsewhere.
  const bool lzf = H5Zfilter_avail(32000) > 0;
  H5Eclear2(H5E_DEFAULT);
  if (!lzf) std::fprintf(stderr, "note: no LZF plugin for HDF5 here; source 4 is deflate\n");
  const std::string vds = MakeConcatenated(
      dir, sizes,
      {Codec::kNone, Codec::kDeflate, Codec::kZstd, Codec::kShuffleDeflate, lzf ? Codec::kLzf : Codec::kDeflate});
  {  // each source on the direct path, whatever its codec
    OpenOptions o;
    o.trust_files = true;
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto s = Dataset::Open(dir + "/src" + std::to_string(i) + ".h5:/data", o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ(s->info().read_path, ReadPath::kDirect) << i << ": " << s->info().read_path_reason;
      if (i == 4 && lzf) {
        EXPECT_EQ(s->info().filters.at(0).name, "lzf");
      }
    }
  }
  const uint64_t n = 109;
  const auto images = H5ReadAll(vds, "/images", H5T_NATIVE_UINT8, n * kSampleBytes);
  const auto labels = H5ReadAll(vds, "/labels", H5T_NATIVE_INT64, n * 8);
  for (uint64_t k = 0; k < n; ++k) {  // HDF5's read is the index-valued data: the files are what we think
    ASSERT_EQ(testing::SampleIndexOf(std::span(images).subspan(k * kSampleBytes, kSampleBytes)), int64_t(k));
  }

  // The Dataset: the mapping resolved, read through HDF5.
  auto ds = Dataset::Open(vds);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->info().storage, "virtual");
  ASSERT_EQ(ds->info().virtual_sources.size(), sizes.size());
  EXPECT_EQ(ds->info().virtual_sources[1].file, dir + "/src1.h5");  // relative to the VDS's directory
  EXPECT_EQ(ds->info().virtual_sources[1].first, 24u);
  EXPECT_EQ(ds->info().virtual_sources[1].count, 16u);
  EXPECT_EQ(ds->info().read_path, ReadPath::kHdf5);
  EXPECT_NE(ds->info().read_path_reason.find("virtual dataset of 5 sources"), std::string::npos);
  std::vector<std::byte> all(n * kSampleBytes);
  ASSERT_TRUE(ds->ReadSamples(0, n, all).ok());
  EXPECT_EQ(all, images);

  // The loader: sources read directly, units of the sources' chunks.
  auto opened = OpenLoader(vds);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const ChunkSource& src = *(*opened)->chunk_source();
  ASSERT_NE(dynamic_cast<const FieldSource*>(&src), nullptr);
  EXPECT_EQ(src.num_samples(), n);
  EXPECT_EQ(src.chunk_samples(), 8u);  // the sources' chunking; gcd with 24, 16, 24, 32
  ASSERT_EQ(src.fields().size(), 2u);
  EXPECT_EQ(src.fields()[1].name, "labels");
  ExpectEverySampleOnce(src, {images, labels});
}

// `gpufeed serve` opens its datasets as the local loader does
// (OpenLocalSource): a virtual dataset's sources are read directly (a
// FieldSource), not through H5Dread under HDF5's lock, and deliver the same
// samples.
TEST(VdsTest, TheDaemonReadsAVirtualDatasetsSourcesDirectly) {
  const std::string dir = MakeTempDir("vds_daemon");
  const std::vector<uint64_t> sizes = {24, 16, 13};
  const std::string vds = MakeConcatenated(dir, sizes, {Codec::kNone, Codec::kDeflate, Codec::kZstd});
  const uint64_t n = 53;
  const auto images = H5ReadAll(vds, "/images", H5T_NATIVE_UINT8, n * kSampleBytes);
  const auto labels = H5ReadAll(vds, "/labels", H5T_NATIVE_INT64, n * 8);
  daemon::DatasetRegistry registry;
  ASSERT_TRUE(registry.Add(vds, {}).ok());
  auto stream = registry.Find("", {});
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  const auto* fields = dynamic_cast<const FieldSource*>(stream->source);
  ASSERT_NE(fields, nullptr) << "the daemon reads a virtual dataset through HDF5";
  EXPECT_EQ(fields->num_samples(), n);
  ExpectEverySampleOnce(*fields, {images, labels});
  // The one door both use.
  auto local = OpenLocalSource(vds, {}, {});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_NE(local->fields, nullptr);
  EXPECT_EQ(local->dataset, nullptr);
  EXPECT_EQ(local->encoded, nullptr);
}

// The door probes each (file, dataset) once: a plain file's dataset once; a
// virtual dataset's own once (not again by the FieldSource over it), its
// labels and each source's once; a classifier's two fields are selected
// from that source, not probed again; trusted files not at all.
TEST(VdsTest, TheDoorProbesEachSpecOnce) {
  const std::string dir = MakeTempDir("vds_probe_once");
  const std::string vds = MakeConcatenated(dir, {10, 20, 5}, {Codec::kNone, Codec::kDeflate});
  uint64_t before = SpecsProbed();
  auto plain = OpenLocalSource(dir + "/src0.h5:/data", {}, {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_NE(plain->dataset, nullptr);
  EXPECT_EQ(SpecsProbed() - before, 1u);
  before = SpecsProbed();
  auto local = OpenLocalSource(vds, {}, {});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(SpecsProbed() - before, 8u);  // vds.h5:/images, vds.h5:/labels, 3 x (srcK.h5:/data, srcK.h5:/labels)
  before = SpecsProbed();
  auto classifier = OpenClassifierSource(vds, {}, {});
  ASSERT_TRUE(classifier.ok()) << classifier.status().ToString();
  EXPECT_EQ(SpecsProbed() - before, 8u);
  OpenOptions trusted;
  trusted.trust_files = true;
  before = SpecsProbed();
  ASSERT_TRUE(OpenLocalSource(vds, trusted, {}).ok());
  EXPECT_EQ(SpecsProbed(), before);
}

// `gpufeed train`'s door (OpenClassifierSource): a virtual dataset's and
// many files' images field is the samples, their labels field the labels();
// a plain file stays a Dataset; a source without an integer labels field
// is refused, naming what it has.
TEST(VdsTest, AClassifierReadsTheImagesFieldWithItsLabels) {
  const std::string dir = MakeTempDir("vds_classifier");
  const std::vector<uint64_t> sizes = {24, 16, 13};
  const std::string vds = MakeConcatenated(dir, sizes, {Codec::kNone, Codec::kDeflate, Codec::kZstd});
  const uint64_t n = 53;
  const auto images = H5ReadAll(vds, "/images", H5T_NATIVE_UINT8, n * kSampleBytes);
  const auto labels = H5ReadAll(vds, "/labels", H5T_NATIVE_INT64, n * 8);
  auto src = OpenClassifierSource(vds, {}, {});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ((*src)->num_samples(), n);
  ASSERT_EQ((*src)->fields().size(), 1u);
  EXPECT_EQ((*src)->fields()[0].name, "images");
  ASSERT_EQ((*src)->labels().size(), n);
  for (uint64_t k = 0; k < n; ++k) {
    int64_t want;
    std::memcpy(&want, labels.data() + k * 8, 8);
    EXPECT_EQ((*src)->labels()[k], want) << "sample " << k;
  }
  ExpectEverySampleOnce(**src, {images});

  // Many files (a glob), int32 labels: the same samples and labels as the
  // files hold, in file order.
  const std::string many = MakeTempDir("classifier_glob");
  std::vector<std::byte> all;
  std::vector<int64_t> all_labels;
  uint64_t first = 0;
  for (int f = 0; f < 3; ++f) {
    const uint64_t count = 10 + 7 * f;
    std::vector<std::byte> data(count * kSampleBytes);
    testing::FillIndexSamples(first, count, kSampleBytes, data);
    const std::string path = many + "/part" + std::to_string(f) + ".h5";
    ASSERT_TRUE(testing::WriteH5(path, {count, kH, kW}, H5T_NATIVE_UINT8, data, {.chunk = {4, kH, kW}}, false));
    hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hsize_t dims[1] = {count};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t dset = H5Dcreate2(file, "/labels", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<int32_t> lab(count);
    for (uint64_t k = 0; k < count; ++k) lab[k] = int32_t((first + k) % 7), all_labels.push_back(lab[k]);
    ASSERT_GE(H5Dwrite(dset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, lab.data()), 0);
    H5Dclose(dset), H5Sclose(space), H5Fclose(file);
    all.insert(all.end(), data.begin(), data.end());
    first += count;
  }
  auto glob = OpenClassifierSource(many + "/*.h5", {}, {});
  ASSERT_TRUE(glob.ok()) << glob.status().ToString();
  EXPECT_EQ((*glob)->num_samples(), first);
  EXPECT_EQ((*glob)->labels(), all_labels);
  ExpectEverySampleOnce(**glob, {all});

  // A plain file stays the Dataset; images without labels are named.
  auto plain = OpenClassifierSource(many + "/part0.h5", {}, {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_NE(dynamic_cast<const Dataset*>(plain->get()), nullptr);
  OpenOptions only;
  only.fields = {"images=/images"};
  auto missing = OpenClassifierSource(many + "/*.h5", only, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--field labels=/path"), std::string::npos) << missing.status().ToString();
  only.fields = {"images=/images", "labels=/images"};
  auto wrong = OpenClassifierSource(many + "/*.h5", only, {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("one integer class a sample"), std::string::npos)
      << wrong.status().ToString();
}

TEST(VdsTest, NamedFieldsWithOtherBoundariesAndTheSameFile) {
  // /x concatenates three files; /y maps two ranges of a plain dataset in
  // the VDS's own file ("."), cut elsewhere: parts at every boundary.
  const std::string dir = MakeTempDir("vds_fields");
  std::vector<Map> xs;
  uint64_t first = 0;
  for (uint64_t i = 0; i < 3; ++i) {
    const std::string name = "part" + std::to_string(i) + ".h5";
    WriteSource(dir + "/" + name, first, 20, Codec::kDeflate, 5);
    xs.push_back({name, "/data", first, 20});
    first += 20;
  }
  const std::string vds = dir + "/fields.h5";
  hid_t file = H5Fcreate(vds.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  std::vector<float> y(70);
  for (size_t k = 0; k < y.size(); ++k) y[k] = 0.5f + static_cast<float>(k);
  hsize_t ydims[1] = {70};
  hid_t space = H5Screate_simple(1, ydims, nullptr);
  hid_t store = H5Dcreate2(file, "store_y", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(store, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data());
  H5Dclose(store);
  H5Sclose(space);
  AddVds(file, "x", H5T_NATIVE_UINT8, 60, {kH, kW}, xs);
  // y[k] of the VDS is store_y[k + 10]: rows [10, 45) then [45, 70).
  AddVds(file, "y", H5T_NATIVE_FLOAT, 60, {}, {{".", "/store_y", 0, 35, 10, 70}, {".", "/store_y", 35, 25, 45, 70}});
  H5Fclose(file);

  const auto want_x = H5ReadAll(vds, "/x", H5T_NATIVE_UINT8, 60 * kSampleBytes);
  const auto want_y = H5ReadAll(vds, "/y", H5T_NATIVE_FLOAT, 60 * 4);
  float y0;
  std::memcpy(&y0, want_y.data(), 4);
  ASSERT_EQ(y0, 10.5f);
  auto opened = OpenLoader(vds, {"x=/x", "y=/y"}, /*max_open_files=*/1);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const auto& fs = dynamic_cast<const FieldSource&>(*(*opened)->chunk_source());
  EXPECT_EQ(fs.num_samples(), 60u);
  EXPECT_EQ(fs.chunk_samples(), 5u);  // parts of 20, 15, 5, 20: gcd with the chunking of 5
  ExpectEverySampleOnce(fs, {want_x, want_y});
  EXPECT_LE(fs.open_files(), 1u);
}

TEST(VdsTest, StackedSourcesAreOneSampleEach) {
  // h5py: layout = VirtualLayout((F, 3, 5)); layout[i] = VirtualSource(file_i["data"]) with data [3, 5].
  const std::string dir = MakeTempDir("vds_stacked");
  std::vector<Map> maps;
  constexpr uint64_t kFiles = 7;
  for (uint64_t i = 0; i < kFiles; ++i) {
    const std::string name = dir + "/one" + std::to_string(i) + ".h5";  // absolute names
    hid_t file = H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    std::vector<std::byte> data(kSampleBytes);
    testing::FillIndexSamples(i, 1, kSampleBytes, data);
    hsize_t dims[2] = {kH, kW};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t ds = H5Dcreate2(file, "data", H5T_NATIVE_UINT8, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(file);
    maps.push_back({name, "data", i, 1, 0, 0, true});
  }
  const std::string vds = dir + "/stack.h5";
  hid_t file = H5Fcreate(vds.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  AddVds(file, "images", H5T_NATIVE_UINT8, kFiles, {kH, kW}, maps);
  H5Fclose(file);
  const auto want = H5ReadAll(vds, "/images", H5T_NATIVE_UINT8, kFiles * kSampleBytes);
  auto opened = OpenLoader(vds);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const ChunkSource& src = *(*opened)->chunk_source();
  EXPECT_EQ(src.chunk_samples(), 1u);
  ExpectEverySampleOnce(src, {want});
}

TEST(VdsTest, MissingSourceFileIsNamed) {
  const std::string dir = MakeTempDir("vds_missing");
  const std::string vds = MakeConcatenated(dir, {10, 10, 10}, {Codec::kNone});
  std::filesystem::remove(dir + "/src1.h5");
  for (bool loader : {false, true}) {
    Status st = loader ? OpenLoader(vds).status() : Dataset::Open(vds).status();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
    EXPECT_NE(st.message().find("src1.h5"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(vds + ":/images"), std::string::npos) << st.ToString();
  }
}

TEST(VdsTest, GapInTheMappingIsRefused) {
  const std::string dir = MakeTempDir("vds_gap");
  WriteSource(dir + "/a.h5", 0, 10, Codec::kNone);
  WriteSource(dir + "/b.h5", 10, 10, Codec::kNone);
  const std::string vds = dir + "/gap.h5";
  hid_t file = H5Fcreate(vds.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  AddVds(file, "images", H5T_NATIVE_UINT8, 24, {kH, kW}, {{"a.h5", "/data", 0, 10}, {"b.h5", "/data", 14, 10}});
  AddVds(file, "tail", H5T_NATIVE_UINT8, 24, {kH, kW}, {{"a.h5", "/data", 0, 10}, {"b.h5", "/data", 10, 10}});
  H5Fclose(file);
  auto ds = Dataset::Open(vds);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ds.status().message().find("samples [10, 14)"), std::string::npos) << ds.status().ToString();
  auto tail = OpenLoader(vds, {"t=/tail"});
  ASSERT_FALSE(tail.ok());
  EXPECT_NE(tail.status().message().find("samples [20, 24)"), std::string::npos) << tail.status().ToString();
}

TEST(VdsTest, MappingsThatAreNotAxisZeroRangesAreRefused) {
  const std::string dir = MakeTempDir("vds_unsupported");
  WriteSource(dir + "/a.h5", 0, 20, Codec::kNone);
  const std::string vds = dir + "/odd.h5";
  hid_t file = H5Fcreate(vds.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  {  // strided: every other virtual sample from a.h5
    hsize_t dims[3] = {20, kH, kW}, sdims[3] = {20, kH, kW};
    hid_t vspace = H5Screate_simple(3, dims, nullptr);
    hid_t sspace = H5Screate_simple(3, sdims, nullptr);
    hsize_t start[3] = {0, 0, 0}, stride[3] = {2, 1, 1}, count[3] = {10, 1, 1}, block[3] = {1, kH, kW};
    H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, stride, count, block);
    hsize_t sstart[3] = {0, 0, 0}, scount[3] = {10, kH, kW};
    H5Sselect_hyperslab(sspace, H5S_SELECT_SET, sstart, nullptr, scount, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_virtual(dcpl, vspace, "a.h5", "/data", sspace), 0);
    H5Sselect_all(vspace);
    H5Dclose(H5Dcreate2(file, "strided", H5T_NATIVE_UINT8, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(sspace);
    H5Sclose(vspace);
  }
  {  // part of axis 1: rows [0, 2) of each sample from a.h5, row 2 from nowhere
    hsize_t dims[3] = {20, kH, kW};
    hid_t vspace = H5Screate_simple(3, dims, nullptr);
    hid_t sspace = H5Screate_simple(3, dims, nullptr);
    hsize_t start[3] = {0, 0, 0}, count[3] = {20, 2, kW};
    H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
    H5Sselect_hyperslab(sspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_virtual(dcpl, vspace, "a.h5", "/data", sspace), 0);
    H5Dclose(H5Dcreate2(file, "partial", H5T_NATIVE_UINT8, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(sspace);
    H5Sclose(vspace);
  }
  AddVds(file, "overlap", H5T_NATIVE_UINT8, 20, {kH, kW}, {{"a.h5", "/data", 0, 12}, {"a.h5", "/data", 8, 12}});
  AddVds(file, "short", H5T_NATIVE_UINT8, 30, {kH, kW}, {{"a.h5", "/data", 0, 30}});  // a.h5 has 20
  {  // unlimited, printf-named: a%b.h5 holds samples [10 b, 10 b + 10)
    hsize_t dims[3] = {20, kH, kW}, maxdims[3] = {H5S_UNLIMITED, kH, kW}, sdims[3] = {10, kH, kW};
    hid_t vspace = H5Screate_simple(3, dims, maxdims);
    hid_t sspace = H5Screate_simple(3, sdims, nullptr);
    hsize_t start[3] = {0, 0, 0}, stride[3] = {10, 1, 1}, count[3] = {H5S_UNLIMITED, 1, 1}, block[3] = {10, kH, kW};
    H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, stride, count, block);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ASSERT_GE(H5Pset_virtual(dcpl, vspace, "a%b.h5", "/data", sspace), 0);
    H5Sselect_all(vspace);
    H5Dclose(H5Dcreate2(file, "unlimited", H5T_NATIVE_UINT8, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(sspace);
    H5Sclose(vspace);
  }
  AddVds(file, "float", H5T_NATIVE_FLOAT, 20, {kH, kW}, {{"a.h5", "/data", 0, 20}});
  AddVds(file, "inner", H5T_NATIVE_UINT8, 20, {kH, kW}, {{"a.h5", "/data", 0, 20}});
  AddVds(file, "nested", H5T_NATIVE_UINT8, 20, {kH, kW}, {{".", "/inner", 0, 20}});
  H5Fclose(file);
  struct Want {
    const char* dset;
    StatusCode code;
    const char* text;
  };
  for (const Want& w : {Want{"/strided", StatusCode::kUnsupported, "strided along axis 0"},
                        Want{"/partial", StatusCode::kUnsupported, "virtual box [0:20, 0:2, 0:5] of [20, 3, 5]"},
                        Want{"/overlap", StatusCode::kUnsupported, "overlaps"},
                        Want{"/short", StatusCode::kInvalidArgument, "needs >= 30 samples"},
                        Want{"/unlimited", StatusCode::kUnsupported, "unlimited"},
                        Want{"/float", StatusCode::kInvalidArgument, "the source is uint8"},
                        Want{"/nested", StatusCode::kUnsupported, "itself a virtual dataset"}}) {
    auto ds = Dataset::Open(vds + ":" + w.dset);
    ASSERT_FALSE(ds.ok()) << w.dset;
    EXPECT_EQ(ds.status().code(), w.code) << ds.status().ToString();
    EXPECT_NE(ds.status().message().find(w.text), std::string::npos) << ds.status().ToString();
    EXPECT_NE(ds.status().message().find(vds + ":" + w.dset), std::string::npos) << ds.status().ToString();
  }
}

TEST(VdsTest, SourceFilesAreFoundWhereHdf5LooksForThem) {
  const std::string dir = MakeTempDir("vds_names");
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/here.h5") << "x";
  std::ofstream(dir + "/sub/there.h5") << "x";
  const std::string vds = dir + "/v.h5", what = vds + ":/images";
  EXPECT_EQ(*h5::ResolveVirtualSourceFile(".", vds, what), vds);
  EXPECT_EQ(*h5::ResolveVirtualSourceFile("here.h5", vds, what), dir + "/here.h5");  // the VDS's directory
  EXPECT_EQ(*h5::ResolveVirtualSourceFile("sub/there.h5", vds, what), dir + "/sub/there.h5");
  // An absolute name that moved: its base name, next to the VDS.
  EXPECT_EQ(*h5::ResolveVirtualSourceFile("/elsewhere/gone/here.h5", vds, what), dir + "/here.h5");
  ::setenv("HDF5_VDS_PREFIX", "/nonexistent:${ORIGIN}/sub", 1);
  EXPECT_EQ(*h5::ResolveVirtualSourceFile("there.h5", vds, what), dir + "/sub/there.h5");
  ::unsetenv("HDF5_VDS_PREFIX");
  auto missing = h5::ResolveVirtualSourceFile("nowhere.h5", vds, what);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nowhere.h5'"), std::string::npos) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find(what), std::string::npos) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find(dir + "/nowhere.h5"), std::string::npos) << missing.status().ToString();
}

}  // namespace
}  // namespace gpufeed
