// Tests for encoded image datasets: convert --keep-encoded, EncodedImageSource
// (direct bytes+offsets and the h5py vlen fallback) and the loader's
// decode-time transforms. Image k is a flat color that encodes k, so every
// delivered sample names its index whatever the crop.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <png.h>
#include <turbojpeg.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "gpufeed/loader.h"
#include "gpufeed/local_source.h"
#include "gpufeed/open_source.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/image/image_decode.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

// The color of image k (well inside 0..255, far apart for small k).
std::array<int, 3> ColorOf(uint64_t k) {
  return {int(30 + (k * 53) % 190), int(30 + (k * 97) % 190), int(30 + (k * 29) % 190)};
}

enum class Kind { kBaseline, kProgressive, kGrey, kCmyk, kPng };

Bytes Encode(uint64_t k, int h, int w, Kind kind) {
  const auto c = ColorOf(k);
  if (kind == Kind::kPng) {
    std::vector<uint8_t> px(size_t(h) * w * 3);
    for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t(c[i % 3]);
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = w;
    img.height = h;
    img.format = PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    EXPECT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr));
    Bytes out(size);
    EXPECT_TRUE(png_image_write_to_memory(&img, out.data(), &size, 0, px.data(), 0, nullptr));
    out.resize(size);
    return out;
  }
  const int comps = kind == Kind::kGrey ? 1 : kind == Kind::kCmyk ? 4 : 3;
  std::vector<uint8_t> px(size_t(h) * w * comps);
  for (size_t i = 0; i < size_t(h) * w; ++i) {
    if (kind == Kind::kGrey)
      px[i] = uint8_t(c[0]);
    else if (kind == Kind::kCmyk) {  // Adobe-inverted CMYK with K = 255 reads as RGB = C, M, Y
      px[4 * i] = uint8_t(c[0]), px[4 * i + 1] = uint8_t(c[1]), px[4 * i + 2] = uint8_t(c[2]), px[4 * i + 3] = 255;
    } else {
      for (int ch = 0; ch < 3; ++ch) px[3 * i + ch] = uint8_t(c[ch]);
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const TJPF pf = kind == Kind::kGrey ? TJPF_GRAY : kind == Kind::kCmyk ? TJPF_CMYK : TJPF_RGB;
  const int sub = kind == Kind::kGrey ? TJSAMP_GRAY : TJSAMP_420;
  const int flags = kind == Kind::kProgressive ? TJFLAG_PROGRESSIVE : 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, pf, &buf, &size, sub, 92, flags), 0) << tjGetErrorStr2(tj);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

void WriteFile(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  ASSERT_TRUE(f.good()) << p;
}

// The mean of each channel of an NCHW sample.
std::array<double, 3> MeanColor(const std::byte* s, int h, int w) {
  std::array<double, 3> m{};
  for (int c = 0; c < 3; ++c) {
    double sum = 0;
    for (int i = 0; i < h * w; ++i) sum += double(uint8_t(s[size_t(c) * h * w + i]));
    m[c] = sum / (h * w);
  }
  return m;
}

struct Folder {
  fs::path dir;
  std::vector<Bytes> files;  // in sample order (class folder c0, names sorted)
  std::vector<Kind> kinds;
};

// n images in one class, of kinds and sizes cycling through the cases the
// issue lists: baseline, progressive, greyscale, CMYK, PNG; odd sizes; tiny
// images smaller than the crop.
Folder MakeFolder(const std::string& tag, uint64_t n) {
  Folder f;
  f.dir = fs::path(testing::MakeTempDir(tag)) / "images";
  fs::create_directories(f.dir / "c0");
  fs::create_directories(f.dir / "c1");
  const Kind kinds[] = {Kind::kBaseline, Kind::kProgressive, Kind::kGrey, Kind::kCmyk, Kind::kPng};
  const int sizes[][2] = {{64, 80}, {37, 53}, {5, 3}, {120, 41}, {17, 17}, {90, 160}, {1, 1}};
  for (uint64_t k = 0; k < n; ++k) {
    const Kind kind = kinds[k % 5];
    const auto* hw = sizes[k % 7];
    Bytes b = Encode(k, hw[0], hw[1], kind);
    char name[32];
    std::snprintf(name, sizeof name, "%s/%04llu.%s", k < n / 2 ? "c0" : "c1", (unsigned long long)k,
                  kind == Kind::kPng ? "png" : "jpg");
    WriteFile(f.dir / name, b);
    f.files.push_back(std::move(b));
    f.kinds.push_back(kind);
  }
  return f;
}

std::string Convert(const Folder& f, const std::string& name) {
  const std::string out = (f.dir.parent_path() / name).string();
  auto s = ConvertEncodedImageFolder(f.dir.string(), out, {});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return out;
}

// Writes the same files as h5py does: /images vlen uint8, /labels.
void WriteVlen(const std::string& path, const std::vector<Bytes>& files, const std::vector<int64_t>& labels) {
  h5::Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  const hsize_t n = files.size();
  h5::Id space(H5Screate_simple(1, &n, nullptr));
  h5::Id type(H5Tvlen_create(H5T_STD_U8LE));
  h5::Id mem(H5Tvlen_create(H5T_NATIVE_UINT8));
  h5::Id ds(H5Dcreate2(file.get(), "images", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  std::vector<hvl_t> refs;
  for (const Bytes& b : files) refs.push_back({b.size(), const_cast<unsigned char*>(b.data())});
  ASSERT_GE(H5Dwrite(ds.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, refs.data()), 0);
  h5::Id lds(H5Dcreate2(file.get(), "labels", H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_GE(H5Dwrite(lds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()), 0);
}

// Every batch of one epoch, as (index -> sample bytes), checking each index once.
std::map<uint64_t, std::vector<std::byte>> RunEpoch(const ChunkSource& src, LoaderOptions lo, uint64_t epoch,
                                                    Status* error = nullptr) {
  Loader loader(src, lo);
  std::map<uint64_t, std::vector<std::byte>> got;
  EpochStream stream = loader.Epoch(epoch);
  for (;;) {
    auto b = stream.Next();
    if (!b.ok()) {
      if (error)
        *error = b.status();
      else
        ADD_FAILURE() << b.status().ToString();
      return got;
    }
    if (!b->has_value()) break;
    const Batch& batch = **b;
    for (uint64_t i = 0; i < batch.size(); ++i) {
      const uint64_t k = batch.indices()[i];
      auto bytes = batch.images().subspan(i * batch.sample_bytes(), batch.sample_bytes());
      if (error == nullptr) {
        EXPECT_EQ(got.count(k), 0u) << "sample " << k << " twice";
      }
      if (!src.labels().empty()) {
        EXPECT_EQ(batch.labels()[i], src.labels()[k]);
      }
      got[k].assign(bytes.begin(), bytes.end());
    }
  }
  return got;
}

LoaderOptions Opts(int threads, uint64_t seed = 7) {
  LoaderOptions lo;
  lo.batch_size = 5;
  lo.threads = threads;
  lo.seed = seed;
  lo.pin_memory = false;
  lo.order = Order::kRandom;
  return lo;
}

TEST(EncodedSourceTest, ConvertAndLoaderRoundTripEveryKind) {
  const uint64_t n = 35;  // each of 5 kinds at each of 7 sizes
  Folder f = MakeFolder("enc_round", n);
  const std::string path = Convert(f, "x.h5");
  for (ImageTransform t : {ImageTransform::kRandomResizedCrop, ImageTransform::kCenterCrop}) {
    DecodeOptions d;
    d.height = 24;
    d.width = 32;
    d.transform = t;
    auto src = OpenEncodedImages(path, {}, d);
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    EXPECT_EQ((*src)->storage(), EncodedStorage::kOffsets);
    EXPECT_EQ((*src)->num_samples(), n);
    EXPECT_EQ((*src)->sample_shape(), (std::vector<uint64_t>{3, 24, 32}));
    EXPECT_EQ((*src)->class_names(), (std::vector<std::string>{"c0", "c1"}));
    for (uint64_t k = 0; k < n; ++k) {
      std::vector<uint8_t> stored;
      ASSERT_TRUE((*src)->ReadEncoded(k, &stored).ok());
      ASSERT_EQ(Bytes(stored.begin(), stored.end()), f.files[k]) << k;
    }
    auto got = RunEpoch(**src, Opts(2), 0);
    ASSERT_EQ(got.size(), n);
    for (const auto& [k, bytes] : got) {
      const auto m = MeanColor(bytes.data(), 24, 32);
      const auto c = ColorOf(k);
      for (int ch = 0; ch < 3; ++ch) {
        // Greyscale JPEGs hold the red value in every channel; JPEG's
        // chroma of flat colors is exact to a few levels.
        const double want = f.kinds[k] == Kind::kGrey ? c[0] : c[ch];
        EXPECT_NEAR(m[ch], want, 4.0) << "sample " << k << " channel " << ch << " kind " << int(f.kinds[k]);
      }
    }
  }
}

// A uniform shuffle reads each sample's own bytes: the loader takes read
// units of one sample (EncodedImageSource::WithReadUnit), so a cache far
// smaller than the data costs no sample more than its stored bytes, where
// runs of consecutive samples would be read again for every batch.
TEST(EncodedSourceTest, RandomOrderReadsEachSampleItsOwnBytes) {
  const uint64_t n = 35;
  Folder f = MakeFolder("enc_units", n);
  const std::string path = Convert(f, "x.h5");
  DecodeOptions d;
  d.height = 24;
  d.width = 32;
  d.transform = ImageTransform::kCenterCrop;
  auto src = OpenEncodedImages(path, {}, d);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_GT((*src)->chunk_samples(), 7u) << "the files must share a run for this test to mean anything";

  // The view: sample k is chunk k, its bytes alone, decoded as before.
  auto one = (*src)->WithReadUnit(1);
  ASSERT_EQ(one->num_chunks(), n);
  ASSERT_EQ(one->chunk_samples(), 1u);
  EXPECT_EQ(one->sample_bytes(), (*src)->sample_bytes());
  EXPECT_EQ((*src)->WithReadUnit(4)->num_chunks(), (n + 3) / 4);
  for (uint64_t k = 0; k < n; ++k) {
    ASSERT_EQ(one->chunk_buffer_bytes(k), f.files[k].size());
    std::vector<std::byte> buf(one->chunk_buffer_bytes(k));
    ASSERT_TRUE(one->ReadChunk(k, buf).ok());
    auto bytes = one->EncodedBytes(buf, k, k);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(std::equal(bytes->begin(), bytes->end(), reinterpret_cast<const std::byte*>(f.files[k].data())))
        << "sample " << k;
  }

  auto epoch_stats = [&](Order order, uint64_t cache_bytes) {
    LoaderOptions lo = Opts(2);
    lo.order = order;
    lo.cache_bytes = cache_bytes;
    Loader loader(**src, lo);
    EpochStream stream = loader.Epoch(0);
    std::set<uint64_t> seen;
    for (;;) {
      auto b = stream.Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok() || !b->has_value()) break;
      for (uint64_t i = 0; i < (*b)->size(); ++i) {
        const uint64_t k = (*b)->indices()[i];
        EXPECT_TRUE(seen.insert(k).second) << "sample " << k << " twice";
        const auto m = MeanColor((*b)->images().data() + i * (*b)->sample_bytes(), 24, 32);
        const auto c = ColorOf(k);
        EXPECT_NEAR(m[0], c[0], 4.0) << "sample " << k;  // red: greyscale JPEGs hold it too
      }
    }
    EXPECT_EQ(seen.size(), n);
    return stream.stats();
  };
  const LoaderStats random = epoch_stats(Order::kRandom, 1);  // nothing kept: every use is a read
  EXPECT_EQ(random.chunk_reads, n);
  EXPECT_EQ(random.bytes_read, (*src)->stored_bytes());
  // Block order keeps its runs: one read serves a window's samples.
  const LoaderStats block = epoch_stats(Order::kBlock, 64 << 20);
  EXPECT_EQ(block.chunk_reads, (*src)->num_chunks());
  EXPECT_EQ(block.bytes_read, (*src)->stored_bytes());
}

TEST(EncodedSourceTest, CropIsAPureFunctionOfSeedEpochAndSample) {
  // Textured images, so different crops give different bytes.
  const fs::path dir = fs::path(testing::MakeTempDir("enc_det")) / "images";
  fs::create_directories(dir / "a");
  for (uint64_t k = 0; k < 12; ++k) {
    const int h = 90 + int(k), w = 120;
    std::vector<uint8_t> px(size_t(h) * w * 3);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) px[(size_t(y) * w + x) * 3 + c] = uint8_t((x * 7 + y * 3 * (c + 1) + k * 11) % 256);
    tjhandle tj = tjInitCompress();
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    ASSERT_EQ(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0), 0);
    char name[32];
    std::snprintf(name, sizeof name, "a/%02llu.jpg", (unsigned long long)k);
    WriteFile(dir / name, Bytes(buf, buf + size));
    tjFree(buf);
    tjDestroy(tj);
  }
  const std::string path = (dir.parent_path() / "x.h5").string();
  ASSERT_TRUE(ConvertEncodedImageFolder(dir.string(), path, {}).ok());
  DecodeOptions d;
  d.height = d.width = 32;
  auto src = OpenEncodedImages(path, {}, d);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const auto one = RunEpoch(**src, Opts(1), 3);
  const auto two = RunEpoch(**src, Opts(2), 3);
  const auto four = RunEpoch(**src, Opts(4), 3);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, four);
  // And it is the (seed, epoch, sample) crop an independent decode computes.
  for (const auto& [k, bytes] : one) {
    std::vector<uint8_t> stored, out(3 * 32 * 32);
    ASSERT_TRUE((*src)->ReadEncoded(k, &stored).ok());
    ASSERT_TRUE(image::DecodeTransform(stored, d, image::RandomKey(7, 3, k), out.data()).ok());
    EXPECT_EQ(std::memcmp(out.data(), bytes.data(), out.size()), 0) << k;
  }
  const auto other_epoch = RunEpoch(**src, Opts(2), 4);
  const auto other_seed = RunEpoch(**src, Opts(2, 8), 3);
  int same_epoch = 0, same_seed = 0;
  for (const auto& [k, bytes] : one) {
    same_epoch += other_epoch.at(k) == bytes;
    same_seed += other_seed.at(k) == bytes;
  }
  EXPECT_LT(same_epoch, 3);
  EXPECT_LT(same_seed, 3);
}

// A source made from another with other decode options (the daemon's way
// of serving clients that ask for different ones) decodes as one opened
// with them, for both storages, and outlives the one it came from.
TEST(EncodedSourceTest, WithDecodeOptionsEqualsOpeningWithThem) {
  Folder f = MakeFolder("enc_with", 17);
  const std::string conv = Convert(f, "x.h5");
  const std::string vlen = (f.dir.parent_path() / "v.h5").string();
  std::vector<int64_t> labels(17);
  for (int64_t k = 0; k < 17; ++k) labels[size_t(k)] = k % 3;
  WriteVlen(vlen, f.files, labels);
  DecodeOptions other;
  other.height = 12;
  other.width = 20;
  other.layout = "NHWC";
  other.transform = ImageTransform::kCenterCrop;
  for (const std::string& path : {conv, vlen}) {
    auto base = OpenEncodedImages(path, {}, {});
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    auto derived = (*base)->WithDecodeOptions(other);
    ASSERT_TRUE(derived.ok()) << derived.status().ToString();
    auto opened = OpenEncodedImages(path, {}, other);
    ASSERT_TRUE(opened.ok());
    base->reset();  // the derived source keeps what it shares
    EXPECT_EQ((*derived)->sample_shape(), (std::vector<uint64_t>{12, 20, 3}));
    EXPECT_EQ((*derived)->labels(), (*opened)->labels());
    EXPECT_EQ((*derived)->decode_options().transform, ImageTransform::kCenterCrop);
    const auto want = RunEpoch(**opened, Opts(2), 1);
    ASSERT_EQ(want.size(), 17u);
    EXPECT_EQ(RunEpoch(**derived, Opts(2), 1), want) << path;
  }
  auto base = OpenEncodedImages(conv, {}, {});
  ASSERT_TRUE(base.ok());
  DecodeOptions bad;
  bad.height = 0;
  EXPECT_EQ((*base)->WithDecodeOptions(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(EncodedSourceTest, VlenFallbackEqualsDirectPath) {
  Folder f = MakeFolder("enc_vlen", 21);
  const std::string direct = Convert(f, "x.h5");
  const std::string vlen = (f.dir.parent_path() / "v.h5").string();
  std::vector<int64_t> labels;
  for (uint64_t k = 0; k < 21; ++k) labels.push_back(k < 10 ? 0 : 1);
  WriteVlen(vlen, f.files, labels);
  auto kind = DetectEncoded(vlen);
  ASSERT_TRUE(kind.ok());
  EXPECT_EQ(*kind, EncodedStorage::kVlen);
  DecodeOptions d;
  d.height = 16;
  d.width = 20;
  d.layout = "NHWC";
  auto a = OpenEncodedImages(direct, {}, d);
  auto b = OpenEncodedImages(vlen, {}, d);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->storage(), EncodedStorage::kVlen);
  EXPECT_EQ((*a)->labels(), (*b)->labels());
  EXPECT_EQ((*a)->stored_bytes(), (*b)->stored_bytes());
  EXPECT_EQ(RunEpoch(**a, Opts(2), 1), RunEpoch(**b, Opts(2), 1));
  // OpenBatchSource finds the encoded field by itself.
  SourceOptions so;
  so.data = vlen;
  so.decode = d;
  so.loader = Opts(2);
  auto opened = OpenBatchSource(so);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_NE((*opened)->encoded(), nullptr);
  EXPECT_EQ((*opened)->source().info().sample_shape, (std::vector<uint64_t>{16, 20, 3}));
}

// share="auto" under torchrun (LOCAL_WORLD_SIZE > 1) takes the node's
// server; for encoded images this rank's GPU decoder takes
// (loader.defer_decode) it reads the file here instead, so each rank
// decodes on its own GPU (the node's server would too, but that is not yet
// measured against a loader per rank: include/gpufeed/open_source.h).
TEST(EncodedSourceTest, AutoShareReadsImagesHereForThisRanksGpuDecoder) {
  Folder f = MakeFolder("enc_share", 12);
  const std::string path = Convert(f, "x.h5");
  const char* old = getenv("LOCAL_WORLD_SIZE");
  const std::string saved = old ? old : "";
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  SourceOptions so;
  so.data = path;
  so.decode.height = 24;
  so.decode.width = 32;
  so.loader = Opts(2);
  so.loader.defer_decode = true;
  auto opened = OpenBatchSource(so);
  if (old) {
    setenv("LOCAL_WORLD_SIZE", saved.c_str(), 1);
  } else {
    unsetenv("LOCAL_WORLD_SIZE");
  }
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_FALSE((*opened)->node_shared());
  ASSERT_NE((*opened)->encoded(), nullptr);
}

TEST(EncodedSourceTest, CorruptSamplesNameTheSampleOrAreReplaced) {
  Folder f = MakeFolder("enc_bad", 10);
  // A truncated JPEG passes convert's header check; the loader finds it.
  // Progressive: libjpeg reads every scan before the first row, so any cut
  // is seen whatever the crop (a baseline file cut below the crop decodes).
  Bytes truncated = Encode(3, 64, 80, Kind::kProgressive);
  truncated.resize(truncated.size() / 2);
  WriteFile(f.dir / "c0/0003.jpg", truncated);
  f.files[3] = truncated;
  const std::string path = Convert(f, "x.h5");
  // Non-image bytes only get in through a file gpufeed did not write.
  f.files[7] = Bytes(300, 0x42);
  const std::string vlen = (f.dir.parent_path() / "v.h5").string();
  WriteVlen(vlen, f.files, std::vector<int64_t>(10, 0));
  DecodeOptions d;
  d.height = d.width = 16;
  for (const std::string& p : {path, vlen}) {
    auto src = OpenEncodedImages(p, {}, d);
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    Status error;
    LoaderOptions lo = Opts(2);
    lo.batch_size = 10;
    RunEpoch(**src, lo, 0, &error);
    ASSERT_FALSE(error.ok()) << p;
    EXPECT_EQ(error.code(), StatusCode::kCorrupt);
    EXPECT_TRUE(error.message().find("sample 3:") != std::string::npos ||
                (p == vlen && error.message().find("sample 7:") != std::string::npos))
        << error.ToString();
    EXPECT_NE(error.message().find("--skip-corrupt"), std::string::npos) << error.ToString();
  }
  d.skip_corrupt = true;
  auto src = OpenEncodedImages(vlen, {}, d);
  ASSERT_TRUE(src.ok());
  Loader loader(**src, Opts(2));
  uint64_t delivered = 0;
  std::set<uint64_t> seen;
  EpochStream epoch = loader.Epoch(0);
  for (const Batch& b : epoch) {
    delivered += b.size();
    for (uint64_t k : b.indices()) seen.insert(k);
  }
  EXPECT_EQ(delivered, 10u);  // batch sizes kept
  EXPECT_EQ(seen.count(3), 0u);
  EXPECT_EQ(seen.count(7), 0u);
  EXPECT_EQ(epoch.stats().skipped_samples, 2u);
}

// convert --keep-encoded --skip-corrupt: files that do not decode (bytes
// that are no image; a truncated JPEG, whose header is fine) are left out and
// named, the others keep their bytes and labels; without it the first one
// that is no image fails the conversion naming it.
TEST(EncodedSourceTest, ConvertSkipCorruptLeavesOutFilesThatDoNotDecode) {
  Folder f = MakeFolder("enc_skip", 10);
  Bytes truncated = Encode(3, 64, 80, Kind::kProgressive);
  truncated.resize(truncated.size() / 2);
  WriteFile(f.dir / "c0/0003.jpg", truncated);
  WriteFile(f.dir / "c1/0007.jpg", Bytes(300, 0x42));
  const std::string out = (f.dir.parent_path() / "skip.h5").string();
  auto strict = ConvertEncodedImageFolder(f.dir.string(), out, {});
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("0007.jpg"), std::string::npos) << strict.status().ToString();
  EXPECT_NE(strict.status().message().find("--skip-corrupt"), std::string::npos) << strict.status().ToString();
  EXPECT_FALSE(fs::exists(out));

  std::vector<std::string> skipped;
  auto lenient = ConvertEncodedImageFolder(f.dir.string(), out, {}, true, &skipped);
  ASSERT_TRUE(lenient.ok()) << lenient.status().ToString();
  EXPECT_EQ(lenient->samples, 8u);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("0003.jpg"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("0007.jpg"), std::string::npos) << skipped[1];
  auto src = OpenEncodedImages(out, {}, {});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ((*src)->num_samples(), 8u);
  EXPECT_EQ((*src)->labels(), (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  const uint64_t kept[] = {0, 1, 2, 4, 5, 6, 8, 9};
  std::vector<uint8_t> stored;
  for (uint64_t j = 0; j < 8; ++j) {
    ASSERT_TRUE((*src)->ReadEncoded(j, &stored).ok());
    EXPECT_EQ(Bytes(stored.begin(), stored.end()), f.files[kept[j]]) << "sample " << j;
  }
}

TEST(EncodedSourceTest, BadOffsetsAreCorruptNotACrash) {
  Folder f = MakeFolder("enc_off", 6);
  const std::string path = Convert(f, "x.h5");
  {
    h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    h5::Id off(H5Dopen2(file.get(), "images/offsets", H5P_DEFAULT));
    std::vector<uint64_t> o(7);
    ASSERT_GE(H5Dread(off.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.data()), 0);
    o[6] += 1ull << 40;  // past the bytes dataset
    ASSERT_GE(H5Dwrite(off.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.data()), 0);
  }
  auto src = OpenEncodedImages(path, {}, {});
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(src.status().message().find("offsets"), std::string::npos) << src.status().ToString();
}

TEST(ImageDecodeTest, CropPlansFollowTorchvision) {
  DecodeOptions d;
  for (uint64_t k = 0; k < 2000; ++k) {
    const CropRect b = image::PlanCrop(375, 500, d, image::RandomKey(1, 0, k));
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 375);
    ASSERT_LE(b.left + b.width, 500);
    const double area = double(b.height) * b.width / (375.0 * 500);
    EXPECT_GE(area, 0.08 * 0.97);
    EXPECT_LE(area, 1.0);
    const double ratio = double(b.width) / b.height;
    EXPECT_GE(ratio, 0.75 * 0.95);
    EXPECT_LE(ratio, 4.0 / 3 * 1.05);
  }
  d.transform = ImageTransform::kCenterCrop;
  // Resize(256) then CenterCrop(224) of 500x375: a 328 x 328 center box.
  const CropRect c = image::PlanCrop(375, 500, d, 0);
  EXPECT_EQ(c.height, 328);
  EXPECT_EQ(c.width, 328);
  EXPECT_EQ(c.top, (375 - 328 + 1) / 2);
  EXPECT_EQ(c.left, (500 - 328) / 2);
  EXPECT_FALSE(ValidateDecodeOptions({.height = 0}).ok());
  DecodeOptions bad;
  bad.scale_min = 0;
  EXPECT_FALSE(ValidateDecodeOptions(bad).ok());
}

// Partial decoding (crop columns, skip rows) and DCT scaling give what a
// full-size decode followed by the same resample gives, within a stated
// tolerance: exact but for the crop's edge rows and columns (fancy
// upsampling's neighbors) when unscaled; mean error under 2 levels when the
// DCT scales.
TEST(ImageDecodeTest, PartialAndScaledDecodeTrackAFullDecode) {
  const int h = 480, w = 640;
  std::vector<uint8_t> px(size_t(h) * w * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(size_t(y) * w + x) * 3 + c] =
            uint8_t(128 + 60 * std::sin(x * 0.05 + c) * std::cos(y * 0.04) + 30 * std::sin((x + y) * 0.011 * (c + 1)));
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, 0), 0);
  const std::vector<uint8_t> jpeg(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  std::vector<uint8_t> full;
  int fh = 0, fw = 0;
  ASSERT_TRUE(image::DecodeFull(jpeg, &full, &fh, &fw).ok());
  for (int out : {224, 64}) {
    DecodeOptions d;
    d.height = d.width = uint32_t(out);
    d.layout = "NHWC";
    double worst_mean = 0;
    for (uint64_t k = 0; k < 20; ++k) {
      const uint64_t key = image::RandomKey(3, 0, k);
      const CropRect b = image::PlanCrop(h, w, d, key);
      std::vector<uint8_t> got(3 * out * out), want(3 * out * out);
      image::DecodeStats st;
      ASSERT_TRUE(image::DecodeTransform(jpeg, d, key, got.data(), &st).ok());
      EXPECT_TRUE(st.partial);
      image::ResampleBox(full.data(), fh, fw, b.top, b.left, b.height, b.width, want.data(), out, out, false);
      double sum = 0;
      for (size_t i = 0; i < got.size(); ++i) sum += std::abs(int(got[i]) - int(want[i]));
      worst_mean = std::max(worst_mean, sum / got.size());
      if (st.scale_num == 8) {
        EXPECT_LT(sum / got.size(), 0.25) << "crop " << k;
      }
    }
    EXPECT_LT(worst_mean, 2.0) << "output " << out;
  }
}

// ResampleBox against a direct, double-precision transcription of PIL's
// antialiased bilinear (ImagingResample: triangle filter of support
// max(1, scale), taps clipped to the image and renormalized), separable.
TEST(ImageDecodeTest, ResampleMatchesPilReference) {
  const int h = 53, w = 71;
  std::vector<uint8_t> src(size_t(h) * w * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t((i * 2654435761u) >> 13);
  auto axis = [](int n, double b0, double extent, int out) {
    std::vector<std::vector<std::pair<int, double>>> taps(out);
    const double scale = extent / out, fs = std::max(1.0, scale);
    for (int i = 0; i < out; ++i) {
      const double c = b0 + (i + 0.5) * scale;
      double total = 0;
      for (int x = std::max(0, int(std::floor(c - fs + 0.5))); x < std::min(n, int(std::floor(c + fs + 0.5))); ++x) {
        const double t = std::abs((x + 0.5 - c) / fs), v = t < 1 ? 1 - t : 0;
        taps[i].push_back({x, v});
        total += v;
      }
      for (auto& [x, v] : taps[i]) v /= total;
    }
    return taps;
  };
  struct Case {
    double by, bx, bh, bw;
    int oh, ow;
  };
  for (const Case& c : {Case{0, 0, 53, 71, 53, 71}, Case{3, 5, 40, 60, 17, 23}, Case{10.5, 7.25, 20, 9, 31, 44},
                        Case{0, 0, 53, 71, 8, 5}, Case{50, 68, 3, 3, 12, 12}}) {
    const auto ys = axis(h, c.by, c.bh, c.oh), xs = axis(w, c.bx, c.bw, c.ow);
    std::vector<uint8_t> got(size_t(c.oh) * c.ow * 3);
    image::ResampleBox(src.data(), h, w, c.by, c.bx, c.bh, c.bw, got.data(), c.oh, c.ow, /*nchw=*/true);
    int worst = 0;
    for (int oy = 0; oy < c.oh; ++oy) {
      for (int ox = 0; ox < c.ow; ++ox) {
        for (int ch = 0; ch < 3; ++ch) {
          double v = 0;
          for (auto [y, wy] : ys[oy])
            for (auto [x, wx] : xs[ox]) v += wy * wx * src[(size_t(y) * w + x) * 3 + ch];
          const int want = int(std::floor(v + 0.5));
          worst = std::max(worst, std::abs(want - int(got[(size_t(ch) * c.oh + oy) * c.ow + ox])));
        }
      }
    }
    EXPECT_LE(worst, 1) << "box " << c.by << "," << c.bx << " " << c.bh << "x" << c.bw << " -> " << c.oh << "x" << c.ow;
  }
}

TEST(ImageDecodeTest, NonImagesAndTruncatedJpegsAreCorrupt) {
  DecodeOptions d;
  d.height = d.width = 8;
  std::vector<uint8_t> out(3 * 64);
  const std::vector<uint8_t> junk(100, 7);
  Status s = image::DecodeTransform(junk, d, 0, out.data());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("neither a JPEG nor a PNG"), std::string::npos);
  Bytes j = Encode(1, 50, 50, Kind::kProgressive);
  for (size_t cut : {size_t(3), size_t(20), j.size() / 3, j.size() - 2}) {
    std::vector<uint8_t> part(j.begin(), j.begin() + cut);
    EXPECT_EQ(image::DecodeTransform(part, d, 0, out.data()).code(), StatusCode::kCorrupt) << cut;
  }
}

// Encoded 16-bit PNGs decode as the image folder's do: stored values scaled
// to 8 bits (32768 -> 128), not gamma-encoded as linear light (186 before the
// two decoders became one); a half-transparent black pixel is composited
// over white.
TEST(ImageDecodeTest, SixteenBitAndAlphaPngsDecodeLikeTheImageFolder) {
  for (auto [value, want] : {std::pair{32768, 128}, std::pair{65535, 255}, std::pair{16384, 64}, std::pair{0, 0}}) {
    png_image img;
    std::memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    img.width = 8;
    img.height = 8;
    img.format = PNG_FORMAT_LINEAR_Y;  // 16-bit grey, values stored as given
    std::vector<uint16_t> px(64, static_cast<uint16_t>(value));
    png_alloc_size_t size = 0;
    ASSERT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr)) << img.message;
    std::vector<uint8_t> bytes(size);
    ASSERT_TRUE(png_image_write_to_memory(&img, bytes.data(), &size, 0, px.data(), 0, nullptr)) << img.message;
    std::vector<uint8_t> rgb;
    int h = 0, w = 0;
    ASSERT_TRUE(image::DecodeFull(bytes, &rgb, &h, &w).ok());
    ASSERT_EQ(h * w, 64);
    for (uint8_t v : rgb) ASSERT_EQ(v, want) << "stored " << value;
    DecodeOptions d;
    d.height = d.width = 8;
    d.transform = ImageTransform::kCenterCrop;
    d.center_fraction = 1.0;  // the whole 8x8 image, resampled 1:1
    std::vector<uint8_t> out(3 * 64, 1);
    ASSERT_TRUE(image::DecodeTransform(bytes, d, 0, out.data()).ok());
    for (uint8_t v : out) ASSERT_EQ(v, want) << "stored " << value;
  }
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = img.height = 2;
  img.format = PNG_FORMAT_GA;  // 8-bit grey + alpha: black at alpha 128
  const std::vector<uint8_t> ga = {0, 128, 0, 128, 0, 128, 0, 128};
  png_alloc_size_t size = 0;
  ASSERT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, ga.data(), 0, nullptr)) << img.message;
  std::vector<uint8_t> bytes(size);
  ASSERT_TRUE(png_image_write_to_memory(&img, bytes.data(), &size, 0, ga.data(), 0, nullptr)) << img.message;
  std::vector<uint8_t> rgb;
  int h = 0, w = 0;
  ASSERT_TRUE(image::DecodeCovering(bytes, 2, 2, &rgb, &h, &w).ok());
  // Half black over white, composited in linear light (libpng's simplified
  // API does that): 0.5 linear is 186 in sRGB.
  for (uint8_t v : rgb) EXPECT_NEAR(v, 186, 2);
}

// DecodeCovering (the image folder's decoder) picks the smallest DCT scale
// that keeps the whole image at least the size asked for.
TEST(ImageDecodeTest, CoveringDecodeUsesTheSmallestScaleThatCovers) {
  const Bytes j = Encode(3, 160, 200, Kind::kBaseline);  // 160 rows x 200 columns
  std::vector<uint8_t> rgb;
  int h = 0, w = 0;
  for (auto [min_h, min_w, want_h, want_w] :
       {std::array{0, 0, 160, 200}, std::array{20, 25, 20, 25}, std::array{21, 25, 40, 50}, std::array{60, 60, 80, 100},
        std::array{81, 10, 160, 200}}) {
    ASSERT_TRUE(image::DecodeCovering(j, min_h, min_w, &rgb, &h, &w).ok());
    EXPECT_EQ(h, want_h) << min_h << "x" << min_w;
    EXPECT_EQ(w, want_w) << min_h << "x" << min_w;
    EXPECT_EQ(rgb.size(), size_t(3) * h * w);
  }
  Status s = image::DecodeCovering(std::vector<uint8_t>(j.begin(), j.begin() + 20), 8, 8, &rgb, &h, &w);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace gpufeed

namespace gpufeed {
namespace {

// An image folder read as it is (the door's kImageFolder): the same
// samples, labels and classes as the file `convert --keep-encoded` makes of
// it, decoded to the same bytes in either order; a file whose bytes change
// after the open is Corrupt; a symbolic link out of the folder is refused
// unless its directory is allowed.
TEST(FolderImagesTest, AFolderReadsAsTheFileConvertMakesOfIt) {
  const uint64_t n = 35;
  Folder f = MakeFolder("folder_as_is", n);
  const std::string path = Convert(f, "x.h5");
  DecodeOptions d;
  d.height = 24;
  d.width = 32;
  auto file = OpenLocalSource(path, {}, d);
  auto folder = OpenLocalSource(f.dir.string(), {}, d);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  const EncodedImageSource& a = *file->encoded;
  const EncodedImageSource& b = *folder->encoded;
  EXPECT_EQ(b.storage(), EncodedStorage::kFolder);
  EXPECT_EQ(b.num_samples(), n);
  EXPECT_EQ(b.class_names(), a.class_names());
  EXPECT_EQ(b.labels(), a.labels());
  EXPECT_EQ(b.stored_bytes(), a.stored_bytes());
  EXPECT_EQ(b.sample_shape(), a.sample_shape());
  for (uint64_t k = 0; k < n; ++k) {
    std::vector<uint8_t> stored;
    ASSERT_TRUE(b.ReadEncoded(k, &stored).ok());
    ASSERT_EQ(Bytes(stored.begin(), stored.end()), f.files[k]) << k;
  }
  for (Order order : {Order::kRandom, Order::kBlock}) {
    LoaderOptions lo = Opts(2);
    lo.order = order;
    auto from_file = RunEpoch(a, lo, 1);
    auto from_folder = RunEpoch(b, lo, 1);
    ASSERT_EQ(from_folder.size(), n);
    EXPECT_TRUE(from_folder == from_file) << "order " << OrderName(order);
  }

  // A file rewritten after the open: said, not read as another size.
  {
    auto again = OpenLocalSource(f.dir.string(), {}, d);
    ASSERT_TRUE(again.ok());
    const std::string victim = (f.dir / "c0" / "0000.jpg").string();
    WriteFile(victim, Bytes(f.files[0].begin(), f.files[0].end() - 10));
    std::vector<uint8_t> stored;
    Status st = again->encoded->ReadEncoded(0, &stored);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find("rewritten"), std::string::npos) << st.ToString();
    WriteFile(victim, f.files[0]);
  }

  // A symbolic link out of the folder: judged by its target.
  const fs::path outside = fs::path(testing::MakeTempDir("folder_outside"));
  WriteFile(outside / "secret.jpg", f.files[1]);
  fs::create_symlink(outside / "secret.jpg", f.dir / "c1" / "zz-link.jpg");
  auto refused = OpenLocalSource(f.dir.string(), {}, d);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("zz-link.jpg"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("allow_paths"), std::string::npos) << refused.status().ToString();
  OpenOptions allowed;
  allowed.allow_paths = {outside.string()};
  auto taken = OpenLocalSource(f.dir.string(), allowed, d);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_EQ(taken->encoded->num_samples(), n + 1);

  // A class folder that is a link out of the folder: its files are judged
  // by where the folder resolves (once, not file by file).
  fs::remove(f.dir / "c1" / "zz-link.jpg");
  fs::create_directories(outside / "cls");
  WriteFile(outside / "cls" / "a.jpg", f.files[2]);
  WriteFile(outside / "cls" / "b.jpg", f.files[3]);
  fs::create_directory_symlink(outside / "cls", f.dir / "c2");
  auto refused_dir = OpenLocalSource(f.dir.string(), {}, d);
  ASSERT_FALSE(refused_dir.ok());
  EXPECT_EQ(refused_dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused_dir.status().message().find((f.dir / "c2").string() + "'"), std::string::npos)
      << refused_dir.status().ToString();
  EXPECT_NE(refused_dir.status().message().find("allow_paths"), std::string::npos);
  auto taken_dir = OpenLocalSource(f.dir.string(), allowed, d);
  ASSERT_TRUE(taken_dir.ok()) << taken_dir.status().ToString();
  EXPECT_EQ(taken_dir->encoded->num_samples(), n + 2);
  EXPECT_EQ(taken_dir->encoded->labels().back(), 2);
  std::vector<uint8_t> stored;
  ASSERT_TRUE(taken_dir->encoded->ReadEncoded(n + 1, &stored).ok());
  EXPECT_EQ(Bytes(stored.begin(), stored.end()), f.files[3]);

  // A link inside a class to a folder outside is refused at the link,
  // before the walk goes in: here what lies beyond it is a loop, which a
  // walk that went in first would report instead (as it would list all of
  // "/" for a link to it).
  fs::remove(f.dir / "c2");
  fs::create_directories(outside / "deep");
  fs::create_directory_symlink(outside / "deep", outside / "deep" / "again");
  fs::create_directory_symlink(outside / "deep", f.dir / "c0" / "escape");
  auto refused_walk = OpenLocalSource(f.dir.string(), {}, d);
  ASSERT_FALSE(refused_walk.ok());
  EXPECT_EQ(refused_walk.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused_walk.status().message().find("allow_paths"), std::string::npos) << refused_walk.status().ToString();
  EXPECT_NE(refused_walk.status().message().find((f.dir / "c0" / "escape").string()), std::string::npos)
      << refused_walk.status().ToString();
  EXPECT_EQ(refused_walk.status().message().find("loop"), std::string::npos) << refused_walk.status().ToString();
}

}  // namespace
}  // namespace gpufeed

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "hdf5io/sources/folder_images.h"

namespace gpufeed {
namespace {

// How many of `path`'s pages are in the page cache (mincore: reads nothing).
size_t ResidentPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* p = size > 0 ? ::mmap(nullptr, size_t(size), PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) return 0;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE)), pages = (size_t(size) + page - 1) / page;
  std::vector<unsigned char> v(pages);
  size_t n = 0;
  if (::mincore(p, size_t(size), v.data()) == 0) {
    for (unsigned char c : v) n += c & 1;
  }
  ::munmap(p, size_t(size));
  return n;
}

// Waits (up to 10 s) until the read-ahead thread has checked `checked` files.
bool WaitChecked(const FolderReadAhead& ra, uint64_t checked) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ra.counts().checked < checked) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::vector<std::string> WriteFiles(const std::string& tag, int n) {
  const fs::path dir = fs::path(testing::MakeTempDir(tag));
  std::vector<std::string> files;
  for (int k = 0; k < n; ++k) {
    files.push_back((dir / (std::to_string(k) + ".jpg")).string());
    WriteFile(files.back(), Bytes(size_t(8192) + size_t(k), uint8_t(k)));  // file k: 8192 + k bytes of k
  }
  return files;
}

// A warm page cache: one hint in kProbeEvery is checked, none is read
// ahead; a hint is taken once until its file is read.
TEST(FolderReadAheadTest, WarmFilesAreProbedNotReadAhead) {
  const int n = 320;
  const std::vector<std::string> files = WriteFiles("readahead_warm", n);
  FolderReadAhead ra(&files);
  for (int k = 0; k < n; ++k) ra.Hint(uint64_t(k));
  ASSERT_TRUE(WaitChecked(ra, n / FolderReadAhead::kProbeEvery));
  for (int k = 0; k < n; ++k) ra.Hint(uint64_t(k));  // hinted already: ignored
  ra.Hint(uint64_t(n));                              // no such file: ignored
  EXPECT_EQ(ra.counts().hints, uint64_t(n));
  ra.Read(3);
  ra.Hint(3);
  EXPECT_EQ(ra.counts().hints, uint64_t(n) + 1);
  EXPECT_EQ(ra.counts().checked, n / FolderReadAhead::kProbeEvery);
  EXPECT_EQ(ra.counts().advised, 0u);
}

// Files out of the page cache: the probe finds one, and from then every
// hinted file is checked and read ahead (its pages arrive without a read).
TEST(FolderReadAheadTest, ColdFilesAreReadAhead) {
  const int n = 200;
  const std::vector<std::string> files = WriteFiles("readahead_cold", n);
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << f;
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  for (const std::string& f : files) {
    if (ResidentPages(f) != 0) GTEST_SKIP() << f << " stays in memory here (tmpfs?): no cold file to read ahead";
  }
  FolderReadAhead ra(&files);
  const uint64_t probe = FolderReadAhead::kProbeEvery;
  for (uint64_t k = 0; k < probe; ++k) ra.Hint(k);  // the last is the probe
  ASSERT_TRUE(WaitChecked(ra, 1));
  EXPECT_EQ(ra.counts().advised, 1u);
  for (uint64_t k = probe; k < uint64_t(n); ++k) ra.Hint(k);  // cold now: every one checked
  ASSERT_TRUE(WaitChecked(ra, 1 + n - probe));
  EXPECT_EQ(ra.counts().advised, 1 + n - probe);
  // The files checked were read ahead; those dropped before the probe were not.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  for (uint64_t k = probe - 1; k < uint64_t(n); ++k) {
    const size_t pages = (8192 + k + page - 1) / page;
    while (ResidentPages(files[k]) < pages && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(ResidentPages(files[k]), pages) << files[k];
  }
  EXPECT_EQ(ResidentPages(files[0]), 0u);
}

}  // namespace
}  // namespace gpufeed
