// Tests for the image-folder source (listing, JPEG/PNG decode, resize + crop,
// layouts, corrupt files) and for ConvertEncodedImageFolder (exact bytes back;
// its reader and decoder are tested in encoded_source_test.cc).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <png.h>
#include <stdlib.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpufeed/convert.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/image/image_ops.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;

using Bytes = std::vector<unsigned char>;

// A smooth synthetic RGB image (h x w x 3): JPEG keeps smooth content nearly
// intact, so decoded pixels can be compared with a tight tolerance. `seed`
// makes images distinguishable.
std::vector<uint8_t> Gradient(int h, int w, int seed) {
  std::vector<uint8_t> px(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &px[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(30 + 180 * x / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>(30 + 180 * y / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>(40 + 20 * seed + 100 * (x + y) / std::max(1, w + h - 2));
    }
  }
  return px;
}

Bytes EncodeJpeg(const std::vector<uint8_t>& rgb, int h, int w) {
  tjhandle tj = tjInitCompress();
  EXPECT_NE(tj, nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_444, 95, 0), 0) << tjGetErrorStr2(tj);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

void WriteFile(const fs::path& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

Bytes ReadFile(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void WritePng(const fs::path& path, const std::vector<uint8_t>& rgb, int h, int w) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = PNG_FORMAT_RGB;
  ASSERT_TRUE(png_image_write_to_file(&img, path.c_str(), 0, rgb.data(), 0, nullptr)) << img.message;
}

double MeanAbsError(const uint8_t* a, const uint8_t* b, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
  return sum / static_cast<double>(n);
}

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gpufeed_imgXXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // root/images/{cat,dog}: cat holds a.jpg (seed 0) and b.JPEG (seed 1), dog
  // holds c.png (seed 2) and d.jpg (seed 3), all kH x kW, plus files that
  // must be ignored. Returns the folder.
  fs::path MakeFolder(bool with_png = true) {
    const fs::path dir = root_ / "images";
    fs::create_directories(dir / "cat");
    fs::create_directories(dir / "dog");
    fs::create_directories(dir / ".hidden_class");
    WriteFile(dir / "cat" / "a.jpg", EncodeJpeg(Gradient(kH, kW, 0), kH, kW));
    WriteFile(dir / "cat" / "b.JPEG", EncodeJpeg(Gradient(kH, kW, 1), kH, kW));
    if (with_png) {
      WritePng(dir / "dog" / "c.png", Gradient(kH, kW, 2), kH, kW);
    } else {
      WriteFile(dir / "dog" / "c.jpeg", EncodeJpeg(Gradient(kH, kW, 2), kH, kW));
    }
    WriteFile(dir / "dog" / "d.jpg", EncodeJpeg(Gradient(kH, kW, 3), kH, kW));
    WriteFile(dir / "dog" / "notes.txt", {'h', 'i'});
    WriteFile(dir / "dog" / "._d.jpg", {0, 5, 22, 7});  // macOS AppleDouble junk
    WriteFile(dir / "README", {'x'});
    return dir;
  }

  static constexpr int kH = 16, kW = 24;
  fs::path root_;
};

std::unique_ptr<SampleSource> Open(const fs::path& dir, uint32_t h, uint32_t w, const std::string& layout) {
  auto src = OpenImageFolderSource(dir.string(), {.height = h, .width = w, .layout = layout});
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  return src.ok() ? std::move(src).value() : nullptr;
}

std::vector<uint8_t> ReadAll(const SampleSource& src) {
  uint64_t sample_bytes = 1;
  for (uint64_t d : src.sample_shape()) sample_bytes *= d;
  std::vector<uint8_t> out(src.num_samples() * sample_bytes);
  Status st = src.Read(0, src.num_samples(), std::as_writable_bytes(std::span(out)));
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

TEST_F(ImageFolderTest, ListsClassesLabelsAndShape) {
  const fs::path dir = MakeFolder();
  auto src = Open(dir, kH, kW, "NHWC");
  ASSERT_NE(src, nullptr);
  EXPECT_EQ(src->num_samples(), 4u);
  EXPECT_EQ(src->labels(), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(src->class_names(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(src->sample_shape(), (std::vector<uint64_t>{kH, kW, 3}));
  EXPECT_EQ(src->dtype(), DType::kUInt8);
  EXPECT_EQ(src->layout(), "NHWC");
  const uint64_t bytes = fs::file_size(dir / "cat/a.jpg") + fs::file_size(dir / "cat/b.JPEG") +
                         fs::file_size(dir / "dog/c.png") + fs::file_size(dir / "dog/d.jpg");
  EXPECT_EQ(src->input_bytes(), bytes);
  EXPECT_EQ(src->description(), "image folder " + dir.string() + " (4 images, 2 classes)");

  auto nchw = Open(dir, 8, 10, "NCHW");
  ASSERT_NE(nchw, nullptr);
  EXPECT_EQ(nchw->sample_shape(), (std::vector<uint64_t>{3, 8, 10}));
}

TEST_F(ImageFolderTest, SameSizeDecodeMatchesSource) {
  const fs::path dir = MakeFolder();
  auto src = Open(dir, kH, kW, "NHWC");
  ASSERT_NE(src, nullptr);
  const std::vector<uint8_t> all = ReadAll(*src);
  const size_t n = static_cast<size_t>(kH) * kW * 3;
  for (int k = 0; k < 4; ++k) {
    const std::vector<uint8_t> want = Gradient(kH, kW, k);
    const uint8_t* got = all.data() + k * n;
    if (k == 2) {  // the PNG: lossless and no resize, so exact
      EXPECT_EQ(std::memcmp(got, want.data(), n), 0) << "sample " << k;
    } else {
      EXPECT_LT(MeanAbsError(got, want.data(), n), 2.0) << "sample " << k;
    }
  }
}

TEST_F(ImageFolderTest, NchwIsTransposeOfNhwc) {
  const fs::path dir = MakeFolder();
  for (auto [h, w] : {std::pair{kH, kW}, std::pair{7, 5}, std::pair{40, 30}}) {
    auto nhwc = Open(dir, h, w, "NHWC");
    auto nchw = Open(dir, h, w, "NCHW");
    ASSERT_NE(nhwc, nullptr);
    ASSERT_NE(nchw, nullptr);
    const std::vector<uint8_t> a = ReadAll(*nhwc), b = ReadAll(*nchw);
    ASSERT_EQ(a.size(), b.size());
    const size_t plane = static_cast<size_t>(h) * w;
    for (size_t s = 0; s < nhwc->num_samples(); ++s) {
      for (size_t p = 0; p < plane; ++p) {
        for (size_t c = 0; c < 3; ++c) {
          ASSERT_EQ(a[s * plane * 3 + p * 3 + c], b[s * plane * 3 + c * plane + p])
              << "sample " << s << " pixel " << p << " channel " << c << " at " << h << "x" << w;
        }
      }
    }
  }
}

TEST_F(ImageFolderTest, ReadsSubrangeLikeFullRead) {
  const fs::path dir = MakeFolder();
  auto src = Open(dir, 12, 12, "NCHW");
  ASSERT_NE(src, nullptr);
  const std::vector<uint8_t> all = ReadAll(*src);
  const size_t n = 3 * 12 * 12;
  std::vector<uint8_t> two(2 * n);
  ASSERT_TRUE(src->Read(1, 2, std::as_writable_bytes(std::span(two))).ok());
  EXPECT_EQ(std::memcmp(two.data(), all.data() + n, 2 * n), 0);
  EXPECT_FALSE(src->Read(3, 2, std::as_writable_bytes(std::span(two))).ok());
}

TEST_F(ImageFolderTest, ConcurrentReadsMatchSequential) {
  const fs::path dir = MakeFolder();
  auto src = Open(dir, 9, 13, "NCHW");
  ASSERT_NE(src, nullptr);
  const std::vector<uint8_t> want = ReadAll(*src);
  const size_t n = want.size() / src->num_samples();
  std::vector<std::vector<uint8_t>> got(8, std::vector<uint8_t>(want.size()));
  std::vector<Status> status(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20 && status[t].ok(); ++rep) {
        for (uint64_t i = 0; i < src->num_samples() && status[t].ok(); ++i) {
          const uint64_t k = (i + t) % src->num_samples();  // threads start on different files
          status[t] = src->Read(k, 1, std::as_writable_bytes(std::span(got[t]).subspan(k * n, n)));
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_TRUE(status[t].ok()) << status[t].ToString();
    EXPECT_EQ(got[t], want) << "thread " << t;
  }
}

TEST_F(ImageFolderTest, DownscaledJpegTracksReferenceResize) {
  // A 64x96 JPEG to 16x16: the decoder scales by 1/4 in the DCT, then crops;
  // the result must stay close to resizing the source pixels directly.
  const fs::path dir = root_ / "big";
  fs::create_directories(dir / "only");
  const std::vector<uint8_t> rgb = Gradient(64, 96, 1);
  WriteFile(dir / "only" / "x.jpg", EncodeJpeg(rgb, 64, 96));
  WritePng(dir / "only" / "y.png", rgb, 64, 96);
  auto src = Open(dir, 16, 16, "NHWC");
  ASSERT_NE(src, nullptr);
  const std::vector<uint8_t> got = ReadAll(*src);
  std::vector<uint8_t> want(16 * 16 * 3);
  image::ResizeCoverCrop(rgb, 64, 96, 3, want, 16, 16);
  EXPECT_LT(MeanAbsError(got.data(), want.data(), want.size()), 3.0);
  // The PNG takes ResizeCoverCrop's path on the exact pixels.
  EXPECT_EQ(std::memcmp(got.data() + want.size(), want.data(), want.size()), 0);
}

TEST_F(ImageFolderTest, CorruptFilesFailNamingTheFile) {
  const fs::path dir = root_ / "bad";
  fs::create_directories(dir / "c");
  const Bytes good = EncodeJpeg(Gradient(32, 32, 0), 32, 32);
  WriteFile(dir / "c" / "a_truncated.jpg", Bytes(good.begin(), good.begin() + good.size() / 2));
  WriteFile(dir / "c" / "b_garbage.jpg", Bytes(300, 0x5A));
  Bytes bad_header = good;
  std::fill(bad_header.begin() + 4, bad_header.begin() + 200, 0xEE);
  WriteFile(dir / "c" / "c_header.jpg", bad_header);
  WriteFile(dir / "c" / "d_empty.png", {});
  // Cut inside the entropy-coded data: libjpeg only warns and fills in grey,
  // which must still be an error.
  const Bytes big = EncodeJpeg(Gradient(128, 128, 0), 128, 128);
  WriteFile(dir / "c" / "e_cut_scan.jpg", Bytes(big.begin(), big.end() - big.size() / 5));
  WritePng(dir / "c" / "f_cut.png", Gradient(64, 64, 0), 64, 64);
  const Bytes whole_png = ReadFile(dir / "c" / "f_cut.png");
  WriteFile(dir / "c" / "f_cut.png", Bytes(whole_png.begin(), whole_png.end() - whole_png.size() / 3));

  auto src = Open(dir, 32, 32, "NCHW");
  ASSERT_NE(src, nullptr);
  const char* names[] = {"a_truncated.jpg", "b_garbage.jpg",  "c_header.jpg",
                         "d_empty.png",     "e_cut_scan.jpg", "f_cut.png"};
  std::vector<uint8_t> one(3 * 32 * 32);
  for (uint64_t i = 0; i < 6; ++i) {
    Status st = src->Read(i, 1, std::as_writable_bytes(std::span(one)));
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find(names[i]), std::string::npos) << st.ToString();
  }
}

TEST_F(ImageFolderTest, GrayCmykAndAlphaBecomeRgb) {
  const fs::path dir = root_ / "kinds";
  fs::create_directories(dir / "k");
  constexpr int kS = 16;
  tjhandle tj = tjInitCompress();
  ASSERT_NE(tj, nullptr);
  auto compress = [&](const std::vector<uint8_t>& px, TJPF pf, int subsamp) {
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    EXPECT_EQ(tjCompress2(tj, px.data(), kS, 0, kS, pf, &buf, &size, subsamp, 95, 0), 0) << tjGetErrorStr2(tj);
    Bytes out(buf, buf + size);
    tjFree(buf);
    return out;
  };
  WriteFile(dir / "k" / "a_gray.jpg", compress(std::vector<uint8_t>(kS * kS, 90), TJPF_GRAY, TJSAMP_GRAY));
  // Stored (Adobe-inverted) CMYK 200,100,50,255 reads as RGB 200,100,50.
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < kS * kS; ++i) cmyk.insert(cmyk.end(), {200, 100, 50, 255});
  WriteFile(dir / "k" / "b_cmyk.jpg", compress(cmyk, TJPF_CMYK, TJSAMP_444));
  tjDestroy(tj);
  // RGBA: left half opaque red, right half fully transparent (onto white).
  std::vector<uint8_t> rgba;
  for (int y = 0; y < kS; ++y) {
    for (int x = 0; x < kS; ++x) {
      rgba.insert(rgba.end(), {255, 0, 0, static_cast<uint8_t>(x < kS / 2 ? 255 : 0)});
    }
  }
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = img.height = kS;
  img.format = PNG_FORMAT_RGBA;
  ASSERT_TRUE(png_image_write_to_file(&img, (dir / "k" / "c_alpha.png").c_str(), 0, rgba.data(), 0, nullptr));

  auto src = Open(dir, kS, kS, "NHWC");
  ASSERT_NE(src, nullptr);
  const std::vector<uint8_t> all = ReadAll(*src);
  const size_t n = kS * kS * 3;
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(all[i], 90, 1) << "gray byte " << i;
  for (size_t p = 0; p < kS * kS; ++p) {
    ASSERT_NEAR(all[n + p * 3 + 0], 200, 3) << "cmyk pixel " << p;
    ASSERT_NEAR(all[n + p * 3 + 1], 100, 3) << "cmyk pixel " << p;
    ASSERT_NEAR(all[n + p * 3 + 2], 50, 3) << "cmyk pixel " << p;
  }
  for (int y = 0; y < kS; ++y) {
    for (int x = 0; x < kS; ++x) {
      const uint8_t* p = &all[2 * n + (y * kS + x) * 3];
      const std::vector<uint8_t> want =
          x < kS / 2 ? std::vector<uint8_t>{255, 0, 0} : std::vector<uint8_t>{255, 255, 255};
      ASSERT_EQ(std::vector<uint8_t>(p, p + 3), want) << y << "," << x;
    }
  }
}

TEST_F(ImageFolderTest, BadFoldersAndOptionsAreErrors) {
  fs::create_directories(root_ / "empty");
  EXPECT_FALSE(OpenImageFolderSource((root_ / "empty").string(), {.height = 8, .width = 8}).ok());
  fs::create_directories(root_ / "no_images" / "cls");
  WriteFile(root_ / "no_images" / "cls" / "readme.txt", {'x'});
  auto none = OpenImageFolderSource((root_ / "no_images").string(), {.height = 8, .width = 8});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no_images"), std::string::npos);
  auto missing = OpenImageFolderSource((root_ / "missing").string(), {.height = 8, .width = 8});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  WriteFile(root_ / "plain_file", {'x'});
  EXPECT_FALSE(OpenImageFolderSource((root_ / "plain_file").string(), {.height = 8, .width = 8}).ok());

  const fs::path dir = MakeFolder();
  EXPECT_EQ(OpenImageFolderSource(dir.string(), {.height = 0, .width = 8}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenImageFolderSource(dir.string(), {.height = 8, .width = 8, .layout = "CHW"}).status().code(),
            StatusCode::kInvalidArgument);
}

// --- ResizeCoverCrop ------------------------------------------------------

TEST(ResizeCoverCropTest, SameSizeIsACopy) {
  const std::vector<uint8_t> src = Gradient(5, 7, 0);
  std::vector<uint8_t> dst(src.size());
  image::ResizeCoverCrop(src, 5, 7, 3, dst, 5, 7);
  EXPECT_EQ(dst, src);
}

TEST(ResizeCoverCropTest, CropsTheCenterWithoutScaling) {
  // 4x8 to 4x4: scale is 1, so output column x is source column x + 2.
  std::vector<uint8_t> src(4 * 8);
  for (int i = 0; i < 32; ++i) src[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> dst(16);
  image::ResizeCoverCrop(src, 4, 8, 1, dst, 4, 4);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) EXPECT_EQ(dst[y * 4 + x], src[y * 8 + x + 2]) << y << "," << x;
  }
}

TEST(ResizeCoverCropTest, ConstantStaysConstant) {
  const std::vector<uint8_t> src(37 * 53 * 3, 77);
  for (auto [h, w] : {std::pair{10, 10}, std::pair{100, 40}, std::pair{3, 50}, std::pair{200, 300}}) {
    std::vector<uint8_t> dst(static_cast<size_t>(h) * w * 3);
    image::ResizeCoverCrop(src, 37, 53, 3, dst, h, w);
    for (uint8_t v : dst) ASSERT_EQ(v, 77) << h << "x" << w;
  }
}

TEST(ResizeCoverCropTest, HalvingAveragesPairs) {
  // 1x8 ramp 0,10,..,70 to 1x4: 2x2 boxes (rows clamp to the single row)
  // give the pair means 5, 25, 45, 65.
  std::vector<uint8_t> src(2 * 8);
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 8; ++x) src[y * 8 + x] = static_cast<uint8_t>(10 * x);
  }
  std::vector<uint8_t> dst(4);
  image::ResizeCoverCrop(src, 2, 8, 1, dst, 1, 4);
  EXPECT_EQ(dst, (std::vector<uint8_t>{5, 25, 45, 65}));
}

TEST(ResizeCoverCropTest, DoublingInterpolatesWithCenterAlignment) {
  // 1x4 ramp 0,40,80,120 to 2x8: output x samples source (x + 0.5) / 2 - 0.5,
  // i.e. -0.25 (clamped to 0), 0.25, 0.75, ... 3.25 (clamped to 3).
  const std::vector<uint8_t> src = {0, 40, 80, 120};
  std::vector<uint8_t> dst(16);
  image::ResizeCoverCrop(src, 1, 4, 1, dst, 2, 8);
  const std::vector<uint8_t> row = {0, 10, 30, 50, 70, 90, 110, 120};
  EXPECT_EQ(std::vector<uint8_t>(dst.begin(), dst.begin() + 8), row);
  EXPECT_EQ(std::vector<uint8_t>(dst.begin() + 8, dst.end()), row);
}

// --- ConvertEncodedImageFolder ------------------------------------------

TEST_F(ImageFolderTest, EncodedConvertRoundTripsFileBytes) {
  const fs::path dir = MakeFolder(/*with_png=*/false);
  const fs::path out = root_ / "encoded.h5";
  std::vector<std::pair<uint64_t, uint64_t>> progress;
  ConvertOptions options;
  options.progress = [&](uint64_t done, uint64_t total) { progress.emplace_back(done, total); };
  auto summary = ConvertEncodedImageFolder(dir.string(), out.string(), options);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->samples, 4u);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), (std::pair<uint64_t, uint64_t>{4, 4}));
  EXPECT_EQ(summary->output_bytes, fs::file_size(out));

  const std::vector<fs::path> files = {dir / "cat/a.jpg", dir / "cat/b.JPEG", dir / "dog/c.jpeg", dir / "dog/d.jpg"};
  uint64_t input_bytes = 0;
  for (const fs::path& f : files) input_bytes += fs::file_size(f);
  EXPECT_EQ(summary->input_bytes, input_bytes);
  EXPECT_EQ(summary->raw_bytes, input_bytes);

  // docs/format.md "Encoded images": /images/{bytes, offsets, sizes}.
  h5::QuietErrors();
  h5::Id file(H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(file.valid());
  h5::Id group(H5Gopen2(file.get(), "images", H5P_DEFAULT));
  ASSERT_TRUE(group.valid());
  EXPECT_EQ(h5::ReadStringAttr(group.get(), "gpufeed_encoded"), "1");
  EXPECT_EQ(h5::ReadStringArrayAttr(group.get(), "class_names"), (std::vector<std::string>{"cat", "dog"}));
  std::vector<uint64_t> offsets(5);
  h5::Id off(H5Dopen2(file.get(), "images/offsets", H5P_DEFAULT));
  ASSERT_GE(H5Dread(off.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()), 0);
  h5::Id bytes(H5Dopen2(file.get(), "images/bytes", H5P_DEFAULT));
  Bytes all(offsets[4]);
  ASSERT_GE(H5Dread(bytes.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, all.data()), 0);
  for (size_t i = 0; i < files.size(); ++i) {
    const Bytes want = ReadFile(files[i]);
    EXPECT_EQ(Bytes(all.begin() + offsets[i], all.begin() + offsets[i + 1]), want) << files[i];
  }

  h5::Id labels(H5Dopen2(file.get(), "labels", H5P_DEFAULT));
  ASSERT_TRUE(labels.valid());
  h5::Id label_type(H5Dget_type(labels.get()));
  EXPECT_EQ(H5Tget_size(label_type.get()), 1u);  // narrowest type for 2 classes
  std::vector<int64_t> got(4);
  ASSERT_GE(H5Dread(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0);
  EXPECT_EQ(got, (std::vector<int64_t>{0, 0, 1, 1}));
}

// PNGs are stored too (the loader decodes them with libpng).
TEST_F(ImageFolderTest, EncodedConvertStoresPngToo) {
  const fs::path dir = MakeFolder(/*with_png=*/true);
  const fs::path out = root_ / "encoded.h5";
  auto summary = ConvertEncodedImageFolder(dir.string(), out.string(), {});
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_TRUE(fs::exists(out));
}

TEST_F(ImageFolderTest, EncodedConvertFailsOnCorruptJpegAndCleansUp) {
  const fs::path dir = MakeFolder(/*with_png=*/false);
  WriteFile(dir / "dog" / "e.jpg", Bytes(100, 0x11));
  const fs::path out = root_ / "encoded.h5";
  WriteFile(out, {'o', 'l', 'd'});  // a previous file must survive the failure
  auto summary = ConvertEncodedImageFolder(dir.string(), out.string(), {});
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(summary.status().message().find("e.jpg"), std::string::npos);
  EXPECT_EQ(ReadFile(out), (Bytes{'o', 'l', 'd'}));
  for (const auto& entry : fs::directory_iterator(root_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace gpufeed

namespace gpufeed {
namespace {

// 16-bit PNGs keep their values scaled to 8 bits (32768 -> 128), not
// gamma-encoded as if linear light (it was 186).
TEST(ImageFolderBitDepthTest, SixteenBitPngIsScaledWithoutGamma) {
  const fs::path dir = fs::path(testing::MakeTempDir("png16")) / "images";
  fs::create_directories(dir / "g");
  for (auto [name, value, want] : {std::tuple{"a.png", 32768, 128}, std::tuple{"b.png", 65535, 255},
                                   std::tuple{"c.png", 0, 0}, std::tuple{"d.png", 16384, 64}}) {
    png_image img;
    std::memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    img.width = 4;
    img.height = 4;
    img.format = PNG_FORMAT_LINEAR_Y;  // 16-bit grey, values stored as given
    std::vector<uint16_t> px(16, static_cast<uint16_t>(value));
    ASSERT_TRUE(png_image_write_to_file(&img, (dir / "g" / name).c_str(), 0, px.data(), 0, nullptr)) << img.message;
    (void)want;
  }
  auto src = OpenImageFolderSource(dir.string(), {.height = 4, .width = 4, .layout = "NHWC"});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  std::vector<uint8_t> out(4 * 4 * 4 * 3);
  ASSERT_TRUE((*src)->Read(0, 4, std::as_writable_bytes(std::span(out))).ok());
  const int want[] = {128, 255, 0, 64};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 48; ++i) ASSERT_EQ(out[k * 48 + i], want[k]) << "image " << k << " byte " << i;
  }
}

// Images in nested subfolders of a class folder belong to that class (as
// torchvision's ImageFolder finds them); they were silently ignored.
TEST(ImageFolderNestingTest, NestedSubfoldersAreFound) {
  const fs::path dir = fs::path(testing::MakeTempDir("nested")) / "images";
  fs::create_directories(dir / "a" / "2024" / "jan");
  fs::create_directories(dir / "a" / ".cache");
  fs::create_directories(dir / "b");
  std::vector<uint8_t> px(4 * 4 * 3, 7);
  WritePng(dir / "a" / "top.png", px, 4, 4);
  WritePng(dir / "a" / "2024" / "jan" / "deep.png", px, 4, 4);
  WritePng(dir / "a" / ".cache" / "thumb.png", px, 4, 4);  // hidden: skipped
  WritePng(dir / "b" / "x.png", px, 4, 4);
  auto src = OpenImageFolderSource(dir.string(), {.height = 4, .width = 4, .layout = "NCHW"});
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->num_samples(), 3u);
  EXPECT_EQ((*src)->labels(), (std::vector<int64_t>{0, 0, 1}));
}

}  // namespace
}  // namespace gpufeed

namespace gpufeed {
namespace {

// A corrupt image fails the folder naming the file; with skip_corrupt it is
// left out and named, and the rest keep their labels.
TEST(ImageFolderCorruptTest, SkipCorruptLeavesOutAndNamesBadImages) {
  const fs::path dir = fs::path(testing::MakeTempDir("skipcorrupt")) / "images";
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  std::vector<uint8_t> px(4 * 4 * 3, 9);
  WritePng(dir / "a" / "good.png", px, 4, 4);
  Bytes jpeg = EncodeJpeg(Gradient(16, 16, 1), 16, 16);
  jpeg.resize(jpeg.size() / 2);  // truncated
  WriteFile(dir / "a" / "half.jpg", jpeg);
  WriteFile(dir / "b" / "text.jpg", {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  WritePng(dir / "b" / "fine.png", px, 4, 4);
  auto strict = OpenImageFolderSource(dir.string(), {.height = 4, .width = 4, .layout = "NCHW"});
  ASSERT_TRUE(strict.ok());
  std::vector<uint8_t> out(4 * 48);
  Status st = (*strict)->Read(0, 4, std::as_writable_bytes(std::span(out)));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("half.jpg"), std::string::npos) << st.ToString();

  std::vector<std::string> skipped;
  auto lenient = OpenImageFolderSource(
      dir.string(), {.height = 4, .width = 4, .layout = "NCHW", .skip_corrupt = true, .skipped_files = &skipped});
  ASSERT_TRUE(lenient.ok()) << lenient.status().ToString();
  EXPECT_EQ((*lenient)->num_samples(), 2u);
  EXPECT_EQ((*lenient)->labels(), (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("half.jpg"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("text.jpg"), std::string::npos) << skipped[1];
  EXPECT_TRUE((*lenient)->Read(0, 2, std::as_writable_bytes(std::span(out).first(2 * 48))).ok());
}

}  // namespace
}  // namespace gpufeed

#include "hdf5io/formats/image_folder_listing.h"

namespace gpufeed {
namespace {

// The listing (hdf5io/formats/image_folder_listing.h): one class folder of
// more files than one stat task takes (sizes are taken in parallel batches
// of 256), file k holding k + 1 bytes, names that sort differently as
// strings than as numbers, a nested folder, and entries that are no images.
TEST(ImageFolderListingTest, SizesAndOrderAcrossParallelStats) {
  const fs::path dir = fs::path(testing::MakeTempDir("listing_sizes")) / "images";
  const int n = 700;
  fs::create_directories(dir / "b" / "deep");
  fs::create_directories(dir / "a");
  std::vector<std::pair<std::string, uint64_t>> want_b;  // name under b, size
  for (int k = 0; k < n; ++k) {
    const std::string name = std::to_string(k) + (k % 3 == 0 ? ".JPG" : k % 3 == 1 ? ".jpeg" : ".png");
    WriteFile(dir / "b" / name, Bytes(static_cast<size_t>(k) + 1, static_cast<unsigned char>(k)));
    want_b.emplace_back(name, k + 1);
  }
  WriteFile(dir / "b" / "deep" / "x.jpg", Bytes(5000, 1));
  want_b.emplace_back("deep/x.jpg", 5000);
  fs::create_directories(dir / "b" / "1");  // "1/z.jpg" sorts after "1.jpeg", before "10.jpeg"
  WriteFile(dir / "b" / "1" / "z.jpg", Bytes(6000, 1));
  want_b.emplace_back("1/z.jpg", 6000);
  WriteFile(dir / "b" / "notes.txt", Bytes(9, 1));  // not an image
  WriteFile(dir / "b" / "._0.jpg", Bytes(9, 1));    // hidden
  WriteFile(dir / "a" / "only.jpg", Bytes(3, 2));
  std::sort(want_b.begin(), want_b.end());

  auto listed = image_folder::ListImageFolder(dir.string());
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  const image_folder::FolderListing& l = *listed;
  EXPECT_EQ(l.class_names, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(l.files.size(), static_cast<size_t>(n) + 3);
  ASSERT_EQ(l.sizes.size(), l.files.size());
  EXPECT_EQ(l.files[0], (dir / "a" / "only.jpg").string());
  EXPECT_EQ(l.sizes[0], 3u);
  EXPECT_EQ(l.labels[0], 0);
  uint64_t total = 3;
  for (size_t i = 0; i < want_b.size(); ++i) {
    ASSERT_EQ(l.files[i + 1], (dir / "b" / want_b[i].first).string()) << i;
    ASSERT_EQ(l.sizes[i + 1], want_b[i].second) << l.files[i + 1];
    ASSERT_EQ(l.labels[i + 1], 1) << i;
    total += want_b[i].second;
  }
  EXPECT_EQ(l.total_bytes, total);
  std::vector<std::string> dirs = l.image_dirs;
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<std::string>{(dir / "a").string(), (dir / "b").string(), (dir / "b" / "1").string(),
                                            (dir / "b" / "deep").string()}));
  EXPECT_TRUE(l.linked_files.empty());
}

// Symbolic links: a linked image is listed with its target's size and
// marked as a link; a dangling one is no file; a folder linked back to one
// above it is a loop, said (not walked until the path is too long).
TEST(ImageFolderListingTest, LinksAreFollowedAndLoopsSaid) {
  const fs::path dir = fs::path(testing::MakeTempDir("listing_links")) / "images";
  fs::create_directories(dir / "c" / "sub");
  WriteFile(dir / "c" / "real.jpg", Bytes(11, 1));
  fs::create_symlink(dir / "c" / "real.jpg", dir / "c" / "sub" / "link.jpg");
  fs::create_symlink(dir / "c" / "missing.jpg", dir / "c" / "dangling.jpg");
  fs::create_directories(dir / "linked_class_target");
  WriteFile(dir / "linked_class_target" / "t.png", Bytes(4, 1));
  fs::create_directory_symlink(dir / "linked_class_target", dir / "d");
  auto listed = image_folder::ListImageFolder(dir.string());
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->class_names, (std::vector<std::string>{"c", "d", "linked_class_target"}));
  EXPECT_EQ(listed->files, (std::vector<std::string>{
                               (dir / "c" / "real.jpg").string(), (dir / "c" / "sub" / "link.jpg").string(),
                               (dir / "d" / "t.png").string(), (dir / "linked_class_target" / "t.png").string()}));
  EXPECT_EQ(listed->sizes, (std::vector<uint64_t>{11, 11, 4, 4}));
  EXPECT_EQ(listed->labels, (std::vector<int64_t>{0, 0, 1, 2}));
  EXPECT_EQ(listed->linked_files, (std::vector<uint64_t>{1}));

  fs::create_directory_symlink(dir / "c", dir / "c" / "sub" / "back");
  auto loop = image_folder::ListImageFolder(dir.string());
  ASSERT_FALSE(loop.ok());
  EXPECT_EQ(loop.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loop.status().message().find("loop"), std::string::npos) << loop.status().ToString();
  EXPECT_NE(loop.status().message().find((dir / "c" / "sub" / "back").string()), std::string::npos)
      << loop.status().ToString();
}

}  // namespace
}  // namespace gpufeed

namespace gpufeed {
namespace {

// A link in a class to the image folder or to a folder above it (here the
// one holding the image folder) is a loop, said where the link is: not
// walked down to a class folder again first (through the other classes, or
// from "/" through the whole file system).
TEST(ImageFolderListingTest, ALinkToAFolderAboveTheImageFolderIsALoopAtTheLink) {
  const fs::path top = fs::path(testing::MakeTempDir("listing_up"));
  const fs::path dir = top / "images";
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b" / "sub");
  WriteFile(dir / "a" / "0.jpg", Bytes(3, 1));
  WriteFile(dir / "b" / "1.jpg", Bytes(4, 2));
  for (const fs::path& target : {top, dir}) {
    SCOPED_TRACE(target.string());
    const fs::path link = dir / "b" / "sub" / "up";
    fs::create_directory_symlink(target, link);
    auto loop = image_folder::ListImageFolder(dir.string());
    ASSERT_FALSE(loop.ok());
    EXPECT_EQ(loop.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(loop.status().message().rfind(link.string() + ": ", 0), 0u) << loop.status().ToString();
    fs::remove(link);
  }
  ASSERT_TRUE(image_folder::ListImageFolder(dir.string()).ok());
}

}  // namespace
}  // namespace gpufeed
