// The door (gpufeed/local_source.h, gpufeed/open_source.h): every kind a
// local spec can name is decided in one place (DecideSourceKind), one HDF5
// file probed there once, and opened from that decision without a second
// probe: by OpenBatchSource (SourceOptions::decided) for what the loader
// reads, by convert's OpenSource and ConvertEncodedHdf5 for what convert
// reads, by OpenDecidedFields for what reads fields of numbers (inspect
// --stats). What only convert reads is refused by the loader, saying to
// convert it. Every sample's bytes encode its index.
#include <gtest/gtest.h>
#include <png.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpufeed/convert.h"
#include "gpufeed/local_source.h"
#include "gpufeed/open_source.h"
#include "hdf5io/hdf5/probe.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;
using testing::IndexLabel;
using testing::MakeTempDir;
using testing::SampleIndexOf;

constexpr hsize_t kN = 24, kH = 4, kW = 4;
constexpr uint64_t kSampleBytes = kH * kW;
constexpr uint64_t kImages = 6;  // in the image folder (and the encoded file made of it)

// Samples [first, first + n) of uint8 [n, 4, 4], chunked by 8, deflated, with /labels (IndexLabel of the
// position in the file).
void WriteIndexFile(const std::string& path, uint64_t first, uint64_t n) {
  std::vector<std::byte> data(n * kSampleBytes);
  testing::FillIndexSamples(first, n, kSampleBytes, data);
  testing::H5Layout layout;
  layout.chunk = {8, kH, kW};
  layout.deflate = 1;
  ASSERT_TRUE(testing::WriteH5(path, {n, kH, kW}, H5T_NATIVE_UINT8, data, layout)) << path;
}

// Image k of the folder: one colour, (k * 40 + 5) in every channel (a PNG:
// lossless, and any resize or crop of it is the same colour).
uint8_t ColourOf(uint64_t k) { return static_cast<uint8_t>(k * 40 + 5); }

void WritePng(const fs::path& path, uint8_t colour) {
  std::vector<uint8_t> px(8 * 8 * 3, colour);
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = 8;
  img.height = 8;
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  ASSERT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr));
  std::vector<unsigned char> out(size);
  ASSERT_TRUE(png_image_write_to_memory(&img, out.data(), &size, 0, px.data(), 0, nullptr));
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(size));
  ASSERT_TRUE(f.good()) << path;
}

// A .npy of uint8 [n, 4, 4], index-valued.
void WriteNpy(const std::string& path, uint64_t n) {
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + std::to_string(n) + ", 4, 4), }";
  dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string header("\x93NUMPY\x01\x00", 8);
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  std::vector<std::byte> data(n * kSampleBytes);
  testing::FillIndexSamples(0, n, kSampleBytes, data);
  std::ofstream f(path, std::ios::binary);
  f << header << dict;
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// An IDX file of uint8 [n, 4, 4], index-valued (MNIST's format, not gzip'd).
void WriteIdx(const std::string& path, uint64_t n) {
  std::ofstream f(path, std::ios::binary);
  const unsigned char magic[4] = {0, 0, 0x08, 3};
  f.write(reinterpret_cast<const char*>(magic), 4);
  for (uint32_t d : {static_cast<uint32_t>(n), 4u, 4u}) {
    const unsigned char be[4] = {static_cast<unsigned char>(d >> 24), static_cast<unsigned char>(d >> 16),
                                 static_cast<unsigned char>(d >> 8), static_cast<unsigned char>(d)};
    f.write(reinterpret_cast<const char*>(be), 4);
  }
  std::vector<std::byte> data(n * kSampleBytes);
  testing::FillIndexSamples(0, n, kSampleBytes, data);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// One of each kind, in one directory.
struct Corpus {
  std::string dir;
  std::string one, parts, folder, encoded, npy, idx;
};

Corpus MakeCorpus(const std::string& tag) {
  Corpus c;
  c.dir = MakeTempDir(tag);
  c.one = c.dir + "/one.h5";
  WriteIndexFile(c.one, 0, kN);
  fs::create_directories(c.dir + "/parts");
  WriteIndexFile(c.dir + "/parts/p0.h5", 0, 16);
  WriteIndexFile(c.dir + "/parts/p1.h5", 16, kN - 16);
  c.parts = c.dir + "/parts";
  c.folder = c.dir + "/folder";
  for (uint64_t k = 0; k < kImages; ++k) {
    const fs::path cls = fs::path(c.folder) / (k < kImages / 2 ? "a" : "b");
    fs::create_directories(cls);
    WritePng(cls / ("img" + std::to_string(k) + ".png"), ColourOf(k));
  }
  c.encoded = c.dir + "/encoded.h5";
  auto converted = ConvertEncodedImageFolder(c.folder, c.encoded, {});
  EXPECT_TRUE(converted.ok()) << converted.status().ToString();
  c.npy = c.dir + "/x.npy";
  WriteNpy(c.npy, kN);
  c.idx = c.dir + "/images-idx3-ubyte";
  WriteIdx(c.idx, kN);
  return c;
}

DecodeOptions SmallDecode() {
  DecodeOptions d;
  d.height = 4;
  d.width = 4;
  d.transform = ImageTransform::kCenterCrop;
  return d;
}

// Reads epoch 0 of `src`: every index once, each sample's bytes (field 0)
// its index's (numbers) or its image's colour (images), its label right.
void ExpectEverySampleOnce(BatchSource& src, uint64_t n, bool images, const std::string& what) {
  std::vector<int> seen(n, 0);
  EpochStream s = src.Epoch(0);
  for (;;) {
    auto b = s.Next();
    ASSERT_TRUE(b.ok()) << what << ": " << b.status().ToString();
    if (!b->has_value()) break;
    const Batch& batch = **b;
    const uint64_t sb = batch.fields()[0].sample_bytes;
    for (uint64_t i = 0; i < batch.size(); ++i) {
      const uint64_t idx = batch.indices()[i];
      ASSERT_LT(idx, n) << what;
      ++seen[idx];
      const auto sample = batch.field(0).subspan(i * sb, sb);
      if (images) {
        for (std::byte v : sample) ASSERT_NEAR(static_cast<int>(v), ColourOf(idx), 1) << what << " sample " << idx;
        ASSERT_EQ(batch.labels()[i], idx < kImages / 2 ? 0 : 1) << what << " sample " << idx;
      } else {
        ASSERT_EQ(SampleIndexOf(sample), static_cast<int64_t>(idx)) << what;
      }
    }
  }
  for (uint64_t k = 0; k < n; ++k) EXPECT_EQ(seen[k], 1) << what << ": sample " << k;
}

// Every kind a spec can name: decided (one HDF5 file probed there, once;
// nothing else probed), then opened from that decision without another
// probe, delivering every sample once with its own bytes.
TEST(DoorTest, EveryKindASpecNamesIsDecidedOnceAndOpened) {
  const Corpus c = MakeCorpus("door_kinds_all");
  OpenOptions both;
  both.fields = {"images=/images", "labels=/labels"};
  OpenOptions npy_fields;
  npy_fields.fields = {"x=" + c.dir + "/*.npy"};
  struct Case {
    std::string spec;
    OpenOptions open;
    SourceKind kind;
    uint64_t samples;  // 0: what only convert reads
    bool images;
  } cases[] = {
      {c.one, {}, SourceKind::kDataset, kN, false},
      {c.one + ":/images", {}, SourceKind::kDataset, kN, false},
      {c.one, both, SourceKind::kFields, kN, false},
      {c.parts, {}, SourceKind::kFields, kN, false},
      {c.parts + "/*.h5", {}, SourceKind::kFields, kN, false},
      {c.encoded, {}, SourceKind::kEncodedImages, kImages, true},
      {c.folder, {}, SourceKind::kImageFolder, kImages, true},
      {c.npy, {}, SourceKind::kNpy, 0, false},
      {c.idx, {}, SourceKind::kIdx, 0, false},
      {"", npy_fields, SourceKind::kNpyFields, 0, false},
  };
  for (const Case& k : cases) {
    const std::string what = k.spec + " (" + std::string(SourceKindName(k.kind)) + ")";
    const bool one_hdf5 = k.kind == SourceKind::kDataset || k.kind == SourceKind::kEncodedImages;
    uint64_t before = SpecsProbed();
    auto decided = DecideSourceKind(k.spec, k.open);
    ASSERT_TRUE(decided.ok()) << what << ": " << decided.status().ToString();
    EXPECT_EQ(decided->kind, k.kind) << what << ": decided " << SourceKindName(decided->kind);
    EXPECT_EQ(decided->probed.has_value(), one_hdf5) << what;
    EXPECT_EQ(SpecsProbed() - before, one_hdf5 ? 1u : 0u) << what << ": the door probes one HDF5 file, once";

    SourceOptions so;
    so.data = k.spec;
    so.open = k.open;
    so.decode = SmallDecode();
    so.share = Share::kNone;
    so.loader.batch_size = 5;
    so.loader.order = Order::kRandom;
    so.loader.threads = 2;
    so.decided = *decided;
    before = SpecsProbed();
    auto opened = OpenBatchSource(so);
    if (k.samples == 0) {
      ASSERT_FALSE(opened.ok()) << what << ": the loader reads HDF5";
      EXPECT_EQ(opened.status().code(), StatusCode::kInvalidArgument) << what;
      EXPECT_NE(opened.status().message().find("gpufeed convert"), std::string::npos) << opened.status().ToString();
      EXPECT_EQ(SpecsProbed(), before) << what;
      continue;
    }
    ASSERT_TRUE(opened.ok()) << what << ": " << opened.status().ToString();
    if (one_hdf5) {
      EXPECT_EQ(SpecsProbed(), before) << what << ": opened from the door's probe, not probed again";
    }
    EXPECT_EQ((*opened)->chunk_source()->num_samples(), k.samples) << what;
    EXPECT_EQ((*opened)->encoded() != nullptr, k.images) << what;
    ExpectEverySampleOnce((*opened)->source(), k.samples, k.images, what);
  }
}

// What only convert reads, opened by convert from the door's decision
// (nothing probed: no HDF5 in them), index-valued as written.
TEST(DoorTest, ConvertOpensWhatTheDoorDecidedForIt) {
  const Corpus c = MakeCorpus("door_convert_kinds");
  for (const std::string& spec : {c.npy, c.idx, c.one}) {
    auto decided = DecideSourceKind(spec, {});
    ASSERT_TRUE(decided.ok()) << spec << ": " << decided.status().ToString();
    const uint64_t before = SpecsProbed();
    auto src = OpenSource(spec, *decided, {});
    ASSERT_TRUE(src.ok()) << spec << ": " << src.status().ToString();
    EXPECT_EQ(SpecsProbed(), before) << spec;
    ASSERT_EQ((*src)->num_samples(), kN) << spec;
    std::vector<std::byte> all(kN * kSampleBytes);
    ASSERT_TRUE((*src)->Read(0, kN, all).ok()) << spec;
    for (uint64_t k = 0; k < kN; ++k) {
      EXPECT_EQ(SampleIndexOf(std::span(all).subspan(k * kSampleBytes, kSampleBytes)), static_cast<int64_t>(k)) << spec;
    }
  }
  // Named .npy fields: the door names them; the loader says to convert them.
  OpenOptions npy;
  npy.fields = {"x=" + c.dir + "/*.npy"};
  auto decided = DecideSourceKind("", npy);
  ASSERT_TRUE(decided.ok()) << decided.status().ToString();
  EXPECT_EQ(decided->kind, SourceKind::kNpyFields);
  Status refused = RefuseConvertOnly("", *decided);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("gpufeed convert --field"), std::string::npos) << refused.ToString();
  // Mixed fields (an HDF5 path among .npy ones) are named fields of HDF5 files.
  npy.fields.push_back("y=/labels");
  auto mixed = DecideSourceKind(c.one, npy);
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_EQ(mixed->kind, SourceKind::kFields);
  // An encoded image file is not what Convert (decoded samples) reads; a
  // dataset is not what ConvertEncodedHdf5 reads: each said as what it is.
  auto enc = DecideSourceKind(c.encoded, {});
  ASSERT_TRUE(enc.ok());
  auto as_samples = OpenSource(c.encoded, *enc, {});
  ASSERT_FALSE(as_samples.ok());
  EXPECT_EQ(as_samples.status().code(), StatusCode::kUnsupported) << as_samples.status().ToString();
  auto plain = DecideSourceKind(c.one, {});
  ASSERT_TRUE(plain.ok());
  auto as_encoded = ConvertEncodedHdf5(c.one, *plain, c.dir + "/never.h5", {});
  ASSERT_FALSE(as_encoded.ok());
  EXPECT_EQ(as_encoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(as_encoded.status().message().find("dataset, not an encoded image field"), std::string::npos)
      << as_encoded.status().ToString();
  EXPECT_FALSE(fs::exists(c.dir + "/never.h5"));
}

// Each caller that needs a decision and then a source probes a file once:
// convert --keep-encoded, convert's sample sources, inspect --stats, and a
// caller that needs the decision and the batches (bench serve: the
// verification file and the loader over one decision). (bench read, which
// probed twice, is tested with the benches: ReadBenchTest.)
TEST(DoorTest, EachCallerProbesAFileOnce) {
  const Corpus c = MakeCorpus("door_probe_once");
  uint64_t before = SpecsProbed();
  auto kept = ConvertEncodedHdf5(c.encoded, c.dir + "/kept.h5", {});
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->samples, kImages);
  EXPECT_EQ(SpecsProbed() - before, 1u) << "convert --keep-encoded of an HDF5 file";

  before = SpecsProbed();
  auto sample_source = OpenSource(c.one, "", {});
  ASSERT_TRUE(sample_source.ok()) << sample_source.status().ToString();
  EXPECT_EQ(SpecsProbed() - before, 1u) << "convert of one HDF5 file";

  before = SpecsProbed();
  auto decided = DecideSourceKind(c.one, {});
  ASSERT_TRUE(decided.ok()) << decided.status().ToString();
  auto fields = OpenDecidedFields(c.one, *decided);
  ASSERT_TRUE(fields.ok()) << fields.status().ToString();
  EXPECT_EQ(SpecsProbed() - before, 1u) << "inspect --stats of one HDF5 file";
  ASSERT_EQ((*fields)->fields().size(), 1u);
  EXPECT_EQ((*fields)->fields()[0].name, "images");
  EXPECT_EQ((*fields)->num_samples(), kN);
  std::vector<std::byte> chunk((*fields)->chunk_buffer_bytes(0));
  ASSERT_TRUE((*fields)->ReadChunk(0, chunk).ok());
  for (uint64_t k = 0; k < (*fields)->samples_in_chunk(0); ++k) {
    EXPECT_EQ(SampleIndexOf(std::span(chunk).subspan(k * kSampleBytes, kSampleBytes)), static_cast<int64_t>(k));
  }

  // The decision's dataset and a Loader over the same decision: one probe.
  before = SpecsProbed();
  auto again = DecideSourceKind(c.one, {});
  ASSERT_TRUE(again.ok());
  auto ds = Dataset::Open(*again->probed, again->open);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  SourceOptions so;
  so.data = c.one;
  so.share = Share::kNone;
  so.loader.batch_size = 8;
  so.loader.threads = 1;
  so.decided = *again;
  auto opened = OpenBatchSource(so);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(SpecsProbed() - before, 1u) << "a dataset and its batches";
  ASSERT_NE((*opened)->dataset(), nullptr);
  EXPECT_EQ((*opened)->dataset()->labels(), ds->labels());
  for (uint64_t k = 0; k < kN; ++k) EXPECT_EQ(ds->labels()[k], IndexLabel(k));
}

// Not a dataset spec: a file named like HDF5 without its signature is
// Corrupt, a missing one NotFound, and a directory of images an image
// folder even when it holds nothing the loader can read (said when it is
// opened); none of them meets HDF5's parser.
TEST(DoorTest, TheDoorNamesWhatIsNotHdf5WithoutAProbe) {
  const std::string dir = MakeTempDir("door_kinds");
  std::filesystem::create_directories(dir + "/folder/cat");
  std::ofstream(dir + "/x.npy") << "\x93NUMPY not really";
  std::ofstream(dir + "/train-images-idx3-ubyte") << "not really IDX either";
  std::ofstream(dir + "/text.h5") << "not HDF5";
  const uint64_t before = SpecsProbed();
  struct Case {
    std::string path;
    SourceKind kind;
    std::string says;
  } cases[] = {{dir + "/x.npy", SourceKind::kNpy, "a .npy file"},
               {dir + "/train-images-idx3-ubyte", SourceKind::kIdx, "an MNIST IDX file"}};
  for (const Case& c : cases) {
    auto decided = DecideSourceKind(c.path, {});
    ASSERT_TRUE(decided.ok()) << decided.status().ToString();
    EXPECT_EQ(decided->kind, c.kind) << c.path;
    EXPECT_FALSE(decided->probed.has_value());
    auto local = OpenLocalSource(c.path, {}, {});
    ASSERT_FALSE(local.ok());
    EXPECT_EQ(local.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(local.status().message().find(c.says), std::string::npos) << local.status().message();
    EXPECT_NE(local.status().message().find("gpufeed convert " + c.path), std::string::npos);
  }
  // A folder is read as it is (hdf5io/sources/folder_images.h): one without
  // images is said as such.
  auto folder = DecideSourceKind(dir + "/folder", {});
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_EQ(folder->kind, SourceKind::kImageFolder);
  EXPECT_FALSE(folder->probed.has_value());
  auto empty = OpenLocalSource(dir + "/folder", {}, {});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no .jpg, .jpeg or .png files"), std::string::npos)
      << empty.status().ToString();
  EXPECT_EQ(SpecsProbed(), before);  // none of them met HDF5's parser
  auto text = DecideSourceKind(dir + "/text.h5", {});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(text.status().message().find("no HDF5 signature"), std::string::npos);
  auto missing = DecideSourceKind(dir + "/nope.h5", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SpecsProbed(), before);
}

}  // namespace
}  // namespace gpufeed
