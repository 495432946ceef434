// Image folders (DIR/<class>/<image>): a SampleSource that decodes JPEG
// (TurboJPEG) and PNG (libpng) files to fixed-size RGB uint8 samples for
// `gpufeed convert DIR --size HxW`. The listing is image_folder_listing.cc,
// the resize image_ops.cc, the encoded converter encoded_convert.cc.
#include <fcntl.h>
#include <tbb/parallel_for.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "gpufeed/convert.h"
#include "hdf5io/image_folder_listing.h"
#include "hdf5io/image_ops.h"

namespace gpufeed {

using image_folder::FolderListing;
using image_folder::ListImageFolder;
using image_folder::ReadWholeFile;

namespace {

constexpr int kChannels = 3;  // every sample is RGB, whatever the file holds
// Larger outputs are almost surely a typo, and int pixel math must not overflow.
constexpr uint32_t kMaxSide = 1u << 15;

// ---------------------------------------------------------------------------
// Decoding.

// One TurboJPEG decompressor per thread: handles are not thread-safe, and
// creating one per image costs more than decoding a thumbnail.
tjhandle ThreadDecompressor() {
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h != nullptr) tjDestroy(h);
    }
  };
  thread_local Handle handle;
  return handle.h;
}

bool LooksLikeJpeg(std::span<const unsigned char> b) {
  return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}
bool LooksLikePng(std::span<const unsigned char> b) {
  static constexpr unsigned char kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return b.size() >= 8 && std::memcmp(b.data(), kSig, 8) == 0;
}

struct RgbImage {
  std::vector<uint8_t> pixels;  // height x width x 3, packed
  int height = 0, width = 0;
};

// Parses a JPEG's header; Corrupt (naming `path`) if it is not one.
Status JpegHeader(tjhandle tj, const std::string& path, std::span<const unsigned char> bytes, int* width, int* height,
                  int* colorspace) {
  int subsamp = 0;
  if (tjDecompressHeader3(tj, bytes.data(), bytes.size(), width, height, &subsamp, colorspace) != 0) {
    return Status::Corrupt(path + ": not a decodable JPEG: " + tjGetErrorStr2(tj));
  }
  // A damaged header can end the stream early, which then parses as a
  // tables-only datastream: a "valid" header of a 0x0 image.
  if (*width <= 0 || *height <= 0) {
    return Status::Corrupt(path + ": JPEG header holds no image size (damaged header or tables-only stream)");
  }
  return Status::Ok();
}

// Decodes a JPEG to RGB, letting the DCT scale it down as far as it can while
// staying >= target_h x target_w (the scaled IDCT is both faster and a better
// low-pass than resampling the full image).
Status DecodeJpeg(const std::string& path, std::span<const unsigned char> bytes, int target_h, int target_w,
                  RgbImage* out) {
  tjhandle tj = ThreadDecompressor();
  if (tj == nullptr) return Status::Internal(path + ": tjInitDecompress failed: " + tjGetErrorStr2(nullptr));
  int w = 0, h = 0, cs = 0;
  GPUFEED_RETURN_IF_ERROR(JpegHeader(tj, path, bytes, &w, &h, &cs));

  int num_factors = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&num_factors);
  tjscalingfactor best = {1, 1};
  for (int i = 0; factors != nullptr && i < num_factors; ++i) {
    const tjscalingfactor f = factors[i];
    if (f.num > f.denom) continue;  // upscaling is left to the bilinear resize
    if (TJSCALED(w, f) < target_w || TJSCALED(h, f) < target_h) continue;
    if (static_cast<int64_t>(f.num) * best.denom < static_cast<int64_t>(best.num) * f.denom) best = f;
  }
  const int sw = TJSCALED(w, best), sh = TJSCALED(h, best);

  // libjpeg cannot convert CMYK/YCCK to RGB, so those decode to CMYK and are
  // converted below.
  const bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
  const TJPF pf = cmyk ? TJPF_CMYK : TJPF_RGB;
  thread_local std::vector<uint8_t> cmyk_buf;
  std::vector<uint8_t>& buf = cmyk ? cmyk_buf : out->pixels;
  buf.resize(static_cast<size_t>(sw) * sh * tjPixelSize[pf]);
  // Warnings are fatal: libjpeg warns on truncated or damaged entropy data and
  // then makes up the missing pixels (grey), which must not become a sample.
  if (tjDecompress2(tj, bytes.data(), bytes.size(), buf.data(), sw, 0, sh, pf, TJFLAG_STOPONWARNING) != 0) {
    return Status::Corrupt(path + ": JPEG decode failed: " + tjGetErrorStr2(tj));
  }
  if (cmyk) {
    // Photoshop (the source of nearly all CMYK JPEGs) stores inverted CMYK,
    // so a stored value is 255 - ink and R = (255 - C)(255 - K) / 255 reads
    // as stored C * stored K / 255 (as OpenCV and Pillow do).
    out->pixels.resize(static_cast<size_t>(sw) * sh * kChannels);
    for (size_t i = 0, n = static_cast<size_t>(sw) * sh; i < n; ++i) {
      const unsigned k = cmyk_buf[i * 4 + 3];
      for (int c = 0; c < kChannels; ++c) {
        out->pixels[i * kChannels + c] = static_cast<uint8_t>((cmyk_buf[i * 4 + c] * k + 127) / 255);
      }
    }
  }
  out->height = sh;
  out->width = sw;
  return Status::Ok();
}

// Decodes a PNG of any bit depth / color type to 8-bit sRGB RGB. Transparent
// pixels are composited onto white: images with alpha are overwhelmingly
// logos and cut-outs drawn to be seen on a white page.
Status DecodePng(const std::string& path, std::span<const unsigned char> bytes, RgbImage* out) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size())) {
    png_image_free(&img);
    return Status::Corrupt(path + ": not a decodable PNG: " + img.message);
  }
  if (img.format & PNG_FORMAT_FLAG_LINEAR) {
    // 16-bit samples. libpng's 8-bit output would treat them as linear light
    // and gamma-encode them (a grey of 32768 became 186); scale the stored
    // values instead (32768 -> 128), as every other reader does.
    img.format = PNG_FORMAT_LINEAR_RGB_ALPHA;  // alpha is premultiplied in linear formats
    std::vector<uint16_t> wide(PNG_IMAGE_SIZE(img) / sizeof(uint16_t));
    if (!png_image_finish_read(&img, nullptr, wide.data(), 0, nullptr)) {
      png_image_free(&img);
      return Status::Corrupt(path + ": PNG decode failed: " + img.message);
    }
    const size_t pixels = static_cast<size_t>(img.width) * img.height;
    out->pixels.resize(pixels * 3);
    for (size_t i = 0; i < pixels; ++i) {
      const uint32_t a = wide[4 * i + 3];
      for (int c = 0; c < 3; ++c) {
        const uint32_t v = std::min<uint32_t>(65535, wide[4 * i + c] + (65535 - a));  // over white
        out->pixels[3 * i + c] = static_cast<uint8_t>((v * 255 + 32767) / 65535);
      }
    }
  } else {
    img.format = PNG_FORMAT_RGB;
    out->pixels.resize(PNG_IMAGE_SIZE(img));
    const png_color white = {255, 255, 255};
    if (!png_image_finish_read(&img, &white, out->pixels.data(), 0, nullptr)) {
      png_image_free(&img);
      return Status::Corrupt(path + ": PNG decode failed: " + img.message);
    }
  }
  // Warnings (PNG_IMAGE_WARNING) are accepted: libpng's are about metadata
  // such as a mismatched iCCP profile, not about pixels.
  out->height = static_cast<int>(img.height);
  out->width = static_cast<int>(img.width);
  return Status::Ok();
}

// Decodes by content, not extension: image sets in the wild have PNGs named
// .jpg (ImageNet has some).
Status DecodeImage(const std::string& path, std::span<const unsigned char> bytes, int target_h, int target_w,
                   RgbImage* out) {
  if (LooksLikeJpeg(bytes)) return DecodeJpeg(path, bytes, target_h, target_w, out);
  if (LooksLikePng(bytes)) return DecodePng(path, bytes, out);
  return Status::Corrupt(path + ": neither a JPEG nor a PNG (" + std::to_string(bytes.size()) +
                         " bytes, unknown signature)");
}

// ---------------------------------------------------------------------------
// The source.

class ImageFolderSource : public SampleSource {
 public:
  ImageFolderSource(std::string dir, FolderListing listing, const ImageFolderOptions& options)
      : dir_(std::move(dir)),
        listing_(std::move(listing)),
        height_(static_cast<int>(options.height)),
        width_(static_cast<int>(options.width)),
        nhwc_(options.layout == "NHWC"),
        layout_(options.layout) {
    shape_ = nhwc_ ? std::vector<uint64_t>{options.height, options.width, kChannels}
                   : std::vector<uint64_t>{kChannels, options.height, options.width};
    sample_bytes_ = static_cast<uint64_t>(kChannels) * options.height * options.width;
  }

  uint64_t num_samples() const override { return listing_.files.size(); }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  DType dtype() const override { return DType::kUInt8; }
  std::string layout() const override { return layout_; }
  std::vector<std::string> class_names() const override { return listing_.class_names; }
  const std::vector<int64_t>& labels() const override { return listing_.labels; }
  uint64_t input_bytes() const override { return listing_.total_bytes; }
  std::string description() const override {
    return "image folder " + dir_ + " (" + std::to_string(listing_.files.size()) + " images, " +
           std::to_string(listing_.class_names.size()) + " classes)";
  }

  // Thread-safe: touches only const members and per-thread scratch.
  Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const override {
    const uint64_t n = num_samples();
    if (first > n || count > n - first || dst.size() != count * sample_bytes_) {
      return Status::InvalidArgument(description() + ": Read(" + std::to_string(first) + ", " + std::to_string(count) +
                                     ") into " + std::to_string(dst.size()) + " bytes is out of range or mis-sized");
    }
    thread_local std::vector<unsigned char> file;
    thread_local RgbImage decoded;
    thread_local std::vector<uint8_t> hwc;
    for (uint64_t i = 0; i < count; ++i) {
      const std::string& path = listing_.files[first + i];
      GPUFEED_RETURN_IF_ERROR(ReadWholeFile(path, &file));
      GPUFEED_RETURN_IF_ERROR(DecodeImage(path, file, height_, width_, &decoded));
      auto* out = reinterpret_cast<uint8_t*>(dst.data() + i * sample_bytes_);
      std::span<uint8_t> out_span(out, sample_bytes_);
      if (nhwc_) {
        image::ResizeCoverCrop(decoded.pixels, decoded.height, decoded.width, kChannels, out_span, height_, width_);
        continue;
      }
      hwc.resize(sample_bytes_);
      image::ResizeCoverCrop(decoded.pixels, decoded.height, decoded.width, kChannels, hwc, height_, width_);
      const size_t plane = static_cast<size_t>(height_) * width_;
      for (size_t p = 0; p < plane; ++p) {
        for (int c = 0; c < kChannels; ++c) out[c * plane + p] = hwc[p * kChannels + c];
      }
    }
    return Status::Ok();
  }

 private:
  const std::string dir_;
  const FolderListing listing_;
  const int height_, width_;
  const bool nhwc_;
  const std::string layout_;
  std::vector<uint64_t> shape_;
  uint64_t sample_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<SampleSource>> OpenImageFolderSource(const std::string& dir, const ImageFolderOptions& options) {
  if (options.height == 0 || options.width == 0 || options.height > kMaxSide || options.width > kMaxSide) {
    return Status::InvalidArgument(dir + ": image folder output size " + std::to_string(options.height) + "x" +
                                   std::to_string(options.width) + " is invalid; set height and width to 1.." +
                                   std::to_string(kMaxSide));
  }
  if (options.layout != "NCHW" && options.layout != "NHWC") {
    return Status::InvalidArgument(dir + ": image layout '" + options.layout + "' is not NCHW or NHWC");
  }
  Result<FolderListing> listing = ListImageFolder(dir);
  if (!listing.ok()) return listing.status();
  if (options.skip_corrupt) {
    // Decode every image once; keep those that decode.
    FolderListing& l = *listing;
    std::vector<Status> why(l.files.size());
    tbb::parallel_for(size_t{0}, l.files.size(), [&](size_t i) {
      thread_local std::vector<unsigned char> bytes;
      thread_local RgbImage img;
      why[i] = ReadWholeFile(l.files[i], &bytes);
      if (why[i].ok()) {
        why[i] =
            DecodeImage(l.files[i], bytes, static_cast<int>(options.height), static_cast<int>(options.width), &img);
      }
    });
    FolderListing kept;
    kept.class_names = l.class_names;
    for (size_t i = 0; i < l.files.size(); ++i) {
      if (why[i].ok()) {
        kept.files.push_back(l.files[i]);
        kept.labels.push_back(l.labels[i]);
      } else if (options.skipped_files != nullptr) {
        options.skipped_files->push_back(why[i].message());
      }
    }
    std::error_code ec;
    for (const std::string& f : kept.files) kept.total_bytes += std::filesystem::file_size(f, ec);
    if (kept.files.empty()) {
      return Status::InvalidArgument(dir + ": every one of its " + std::to_string(l.files.size()) +
                                     " images is corrupt");
    }
    *listing = std::move(kept);
  }
  return std::unique_ptr<SampleSource>(std::make_unique<ImageFolderSource>(dir, std::move(listing).value(), options));
}

}  // namespace gpufeed
