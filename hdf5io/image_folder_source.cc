// Image folders (DIR/<class>/<image>): a SampleSource that decodes JPEG
// (TurboJPEG) and PNG (libpng) files to fixed-size RGB uint8 samples, and
// ConvertEncodedImageFolder, which stores the files' bytes untouched in the
// encoded-images group (docs/format.md) that EncodedImageSource reads.
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
#include <functional>
#include <system_error>

#include "common/atomic_file.h"
#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "hdf5io/h5_util.h"
#include "hdf5io/image_decode.h"
#include "hdf5io/image_ops.h"

namespace gpufeed {

// ---------------------------------------------------------------------------
// Resize + center crop (declared in hdf5io/image_ops.h).

namespace image {
namespace {

// Averages k x k blocks of `src` into `out` (ceil(h/k) x ceil(w/k)). Edge
// blocks average only the pixels that exist; their centers are then off by
// under half a block, which nobody can see at the scales where this runs.
void BoxShrink(std::span<const uint8_t> src, int h, int w, int channels, int k, std::vector<uint8_t>* out,
               int* out_h, int* out_w) {
  const int oh = (h + k - 1) / k, ow = (w + k - 1) / k;
  out->resize(static_cast<size_t>(oh) * ow * channels);
  std::vector<uint32_t> sums(static_cast<size_t>(ow) * channels);
  for (int by = 0; by < oh; ++by) {
    std::fill(sums.begin(), sums.end(), 0u);
    const int y_end = std::min(h, (by + 1) * k);
    for (int y = by * k; y < y_end; ++y) {
      const uint8_t* row = src.data() + static_cast<size_t>(y) * w * channels;
      for (int x = 0; x < w; ++x) {
        uint32_t* s = &sums[static_cast<size_t>(x / k) * channels];
        for (int c = 0; c < channels; ++c) s[c] += row[x * channels + c];
      }
    }
    const int rows = y_end - by * k;
    uint8_t* orow = out->data() + static_cast<size_t>(by) * ow * channels;
    for (int bx = 0; bx < ow; ++bx) {
      const uint32_t n = static_cast<uint32_t>(rows * (std::min(w, (bx + 1) * k) - bx * k));
      for (int c = 0; c < channels; ++c) {
        orow[bx * channels + c] = static_cast<uint8_t>((sums[bx * channels + c] + n / 2) / n);
      }
    }
  }
  *out_h = oh;
  *out_w = ow;
}

// One output coordinate's two source taps and the weight of the second.
struct Tap {
  int i0, i1;
  float frac;
};

// Taps for an output axis of dst_n pixels over a (possibly k-shrunk) source
// axis of src_n pixels whose unshrunk length was full_n. See image_ops.h for
// the mapping; dividing by k converts original to shrunk pixel units.
std::vector<Tap> AxisTaps(int dst_n, int src_n, int full_n, double scale, int k) {
  std::vector<Tap> taps(dst_n);
  for (int o = 0; o < dst_n; ++o) {
    double s = ((o + 0.5 - dst_n / 2.0) / scale + full_n / 2.0) / k - 0.5;
    s = std::clamp(s, 0.0, static_cast<double>(src_n - 1));
    const int i0 = static_cast<int>(s);
    taps[o] = {i0, std::min(i0 + 1, src_n - 1), static_cast<float>(s - i0)};
  }
  return taps;
}

}  // namespace

void ResizeCoverCrop(std::span<const uint8_t> src, int src_h, int src_w, int channels, std::span<uint8_t> dst,
                     int dst_h, int dst_w) {
  assert(src_h > 0 && src_w > 0 && dst_h > 0 && dst_w > 0 && channels > 0);
  assert(src.size() == static_cast<size_t>(src_h) * src_w * channels);
  assert(dst.size() == static_cast<size_t>(dst_h) * dst_w * channels);
  if (src_h == dst_h && src_w == dst_w) {
    std::memcpy(dst.data(), src.data(), dst.size());
    return;
  }
  const double scale = std::max(static_cast<double>(dst_h) / src_h, static_cast<double>(dst_w) / src_w);
  thread_local std::vector<uint8_t> shrunk;
  std::span<const uint8_t> s = src;
  int h = src_h, w = src_w, k = 1;
  if (scale <= 0.5) {
    k = static_cast<int>(1.0 / scale);
    BoxShrink(src, src_h, src_w, channels, k, &shrunk, &h, &w);
    s = shrunk;
  }
  const std::vector<Tap> xs = AxisTaps(dst_w, w, src_w, scale, k);
  const std::vector<Tap> ys = AxisTaps(dst_h, h, src_h, scale, k);
  const size_t src_row = static_cast<size_t>(w) * channels;
  for (int oy = 0; oy < dst_h; ++oy) {
    const uint8_t* r0 = s.data() + ys[oy].i0 * src_row;
    const uint8_t* r1 = s.data() + ys[oy].i1 * src_row;
    const float fy = ys[oy].frac;
    uint8_t* out = dst.data() + static_cast<size_t>(oy) * dst_w * channels;
    for (int ox = 0; ox < dst_w; ++ox) {
      const int a = xs[ox].i0 * channels, b = xs[ox].i1 * channels;
      const float fx = xs[ox].frac;
      for (int c = 0; c < channels; ++c) {
        const float top = r0[a + c] + (r0[b + c] - r0[a + c]) * fx;
        const float bottom = r1[a + c] + (r1[b + c] - r1[a + c]) * fx;
        const float v = top + (bottom - top) * fy;
        out[ox * channels + c] = static_cast<uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
      }
    }
  }
}

}  // namespace image

namespace {

constexpr int kChannels = 3;  // every sample is RGB, whatever the file holds
// Larger outputs are almost surely a typo, and int pixel math must not overflow.
constexpr uint32_t kMaxSide = 1u << 15;

// ---------------------------------------------------------------------------
// Listing the folder.

struct FolderListing {
  std::vector<std::string> class_names;
  std::vector<std::string> files;  // class by class, sorted within a class
  std::vector<int64_t> labels;     // parallel to files
  uint64_t total_bytes = 0;
};

std::string LowerExtension(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext;
}

bool IsImageExtension(const std::string& ext) { return ext == ".jpg" || ext == ".jpeg" || ext == ".png"; }

// Hidden entries are skipped: macOS leaves "._name.jpg" AppleDouble files and
// tools leave ".ipynb_checkpoints" folders; neither is a sample or a class.
bool IsHidden(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

Result<FolderListing> ListImageFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) {
    return Status::NotFound(dir + ": no such directory" + (ec ? " (" + ec.message() + ")" : ""));
  }
  if (!fs::is_directory(st)) {
    return Status::InvalidArgument(dir + ": not a directory (an image folder holds one subfolder per class)");
  }
  FolderListing out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (IsHidden(it->path()) || !it->is_directory(ec)) continue;
    out.class_names.push_back(it->path().filename().string());
  }
  if (ec) return Status::IOError(dir + ": cannot list: " + ec.message());
  if (out.class_names.empty()) {
    return Status::InvalidArgument(dir + ": no class subfolders (expected " + dir + "/<class>/<image>.jpg)");
  }
  std::sort(out.class_names.begin(), out.class_names.end());

  for (size_t label = 0; label < out.class_names.size(); ++label) {
    const fs::path class_dir = fs::path(dir) / out.class_names[label];
    // Images in nested subfolders belong to the class too (as torchvision's
    // ImageFolder walks them); hidden folders are skipped.
    std::vector<std::pair<std::string, uint64_t>> files;  // path relative to the class folder, size
    for (fs::recursive_directory_iterator it(class_dir, fs::directory_options::follow_directory_symlink, ec), end;
         !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      if (IsHidden(p)) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (!IsImageExtension(LowerExtension(p))) continue;
      std::error_code fec;
      if (!it->is_regular_file(fec)) continue;  // follows symlinks
      const uintmax_t size = it->file_size(fec);
      if (fec) return Status::IOError(p.string() + ": cannot stat: " + fec.message());
      files.emplace_back(fs::relative(p, class_dir, fec).string(), size);
      if (fec) return Status::IOError(p.string() + ": " + fec.message());
    }
    if (ec) return Status::IOError(class_dir.string() + ": cannot list: " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& [name, size] : files) {
      out.files.push_back((class_dir / name).string());
      out.labels.push_back(static_cast<int64_t>(label));
      out.total_bytes += size;
    }
  }
  if (out.files.empty()) {
    return Status::InvalidArgument(dir + ": no .jpg, .jpeg or .png files in its " +
                                   std::to_string(out.class_names.size()) + " class subfolders");
  }
  return out;
}

// Reads a whole file into `out` (resized to fit). IOError names the path.
Status ReadWholeFile(const std::string& path, std::vector<unsigned char>* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(path + ": cannot stat: " + std::strerror(err));
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return Status::IOError(path + ": read failed at byte " + std::to_string(done) + ": " +
                             (err ? std::strerror(err) : "file shrank while being read"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

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
Status JpegHeader(tjhandle tj, const std::string& path, std::span<const unsigned char> bytes, int* width,
                  int* height, int* colorspace) {
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
      return Status::InvalidArgument(description() + ": Read(" + std::to_string(first) + ", " +
                                     std::to_string(count) + ") into " + std::to_string(dst.size()) +
                                     " bytes is out of range or mis-sized");
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
        image::ResizeCoverCrop(decoded.pixels, decoded.height, decoded.width, kChannels, out_span, height_,
                               width_);
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

// ---------------------------------------------------------------------------
// Encoded conversion helpers.

// The narrowest integer type holding labels 0..max_label, as
// DatasetWriter::WriteLabels picks it.
hid_t LabelFileType(int64_t max_label) {
  if (max_label <= 255) return H5T_STD_U8LE;
  if (max_label <= INT16_MAX) return H5T_STD_I16LE;
  if (max_label <= INT32_MAX) return H5T_STD_I32LE;
  return H5T_STD_I64LE;
}

// The HDF5 chunk of /images/bytes. A loader chunk (a run of samples, about
// 4 MiB) reads the byte chunks it overlaps whole, so smaller byte chunks
// waste less at its two ends; 256 KiB keeps the chunk index small (4,000
// entries a GiB) and each pread large.
constexpr uint64_t kEncodedByteChunk = 256u << 10;
// Files are written in batches of this many bytes (at least one file).
constexpr uint64_t kEncodedBatchBytes = 64ull << 20;

}  // namespace

Result<std::unique_ptr<SampleSource>> OpenImageFolderSource(const std::string& dir,
                                                            const ImageFolderOptions& options) {
  if (options.height == 0 || options.width == 0 || options.height > kMaxSide || options.width > kMaxSide) {
    return Status::InvalidArgument(dir + ": image folder output size " + std::to_string(options.height) +
                                   "x" + std::to_string(options.width) +
                                   " is invalid; set height and width to 1.." + std::to_string(kMaxSide));
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
        why[i] = DecodeImage(l.files[i], bytes, static_cast<int>(options.height), static_cast<int>(options.width),
                             &img);
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
  return std::unique_ptr<SampleSource>(
      std::make_unique<ImageFolderSource>(dir, std::move(listing).value(), options));
}

namespace {

// Writes the encoded-images format (docs/format.md) from n files that `get`
// yields in order (bytes, and a name for messages), with labels and class
// names. Atomic.
using GetEncoded = std::function<Status(uint64_t k, std::vector<unsigned char>* bytes, std::string* name)>;
Result<ConvertSummary> WriteEncodedImages(const std::string& out_path, uint64_t n, const GetEncoded& get,
                                          const std::vector<int64_t>& label_values,
                                          const std::vector<std::string>& class_names,
                                          const ConvertOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  h5::QuietErrors();
  struct {
    const std::vector<int64_t>& labels;
    const std::vector<std::string>& class_names;
  } listing{label_values, class_names};
  AtomicFile out(out_path);  // before `file`: the file closes first
  const std::string& tmp_path = out.tmp_path();
  auto h5_error = [&](const std::string& what) {
    return Status::IOError(out_path + ": " + what + ": " + h5::LastErrorText());
  };

  // docs/format.md "Encoded images": /images is a group of
  //   bytes    uint8 [total], chunked, the files back to back
  //   offsets  uint64 [N + 1], sample k = bytes[offsets[k], offsets[k + 1])
  //   sizes    uint32 [N, 2], (height, width) of each image
  h5::Id file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!file.valid()) return h5_error("cannot create " + tmp_path);
  h5::Id group(H5Gcreate2(file.get(), "images", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!group.valid()) return h5_error("cannot create /images");
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(group.get(), "gpufeed_encoded", "1"));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(group.get(), "encoding", "jpeg/png by signature"));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringArrayAttr(group.get(), "class_names", listing.class_names));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(file.get(), "gpufeed_format", "1"));

  const hsize_t zero = 0, unlimited = H5S_UNLIMITED, byte_chunk = kEncodedByteChunk;
  h5::Id bytes_space(H5Screate_simple(1, &zero, &unlimited));
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (!bytes_space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl.get(), 1, &byte_chunk) < 0) {
    return h5_error("cannot set up /images/bytes");
  }
  h5::Id bytes_ds(H5Dcreate2(group.get(), "bytes", H5T_STD_U8LE, bytes_space.get(), H5P_DEFAULT, dcpl.get(),
                             H5P_DEFAULT));
  if (!bytes_ds.valid()) return h5_error("cannot create /images/bytes");

  std::vector<uint64_t> offsets(n + 1, 0);
  std::vector<uint32_t> sizes(2 * n, 0);
  std::vector<unsigned char> batch;
  uint64_t written = 0;
  for (uint64_t first = 0; first < n;) {
    // Fill a batch of whole files up to the byte cap (at least one file).
    batch.clear();
    uint64_t k = first;
    thread_local std::vector<unsigned char> bytes;
    while (k < n && (k == first || batch.size() < kEncodedBatchBytes)) {
      std::string path;
      GPUFEED_RETURN_IF_ERROR(get(k, &bytes, &path));
      // Headers only: cheap, and catches files the loader could never decode.
      int w = 0, h = 0;
      Status hs = image::ImageSize(bytes, &h, &w);
      if (!hs.ok()) return Status::Corrupt(path + ": " + hs.message());
      sizes[2 * k] = static_cast<uint32_t>(h);
      sizes[2 * k + 1] = static_cast<uint32_t>(w);
      batch.insert(batch.end(), bytes.begin(), bytes.end());
      offsets[k + 1] = offsets[k] + bytes.size();
      ++k;
    }
    const hsize_t at = written, count = batch.size(), new_size = written + batch.size();
    if (count > 0) {
      if (H5Dset_extent(bytes_ds.get(), &new_size) < 0) return h5_error("growing /images/bytes");
      h5::Id mem_space(H5Screate_simple(1, &count, nullptr));
      h5::Id file_space(H5Dget_space(bytes_ds.get()));
      if (!mem_space.valid() || !file_space.valid() ||
          H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &at, nullptr, &count, nullptr) < 0 ||
          H5Dwrite(bytes_ds.get(), H5T_NATIVE_UINT8, mem_space.get(), file_space.get(), H5P_DEFAULT, batch.data()) <
              0) {
        return h5_error("writing /images/bytes for samples " + std::to_string(first) + ".." + std::to_string(k - 1));
      }
    }
    written += count;
    first = k;
    if (options.progress) options.progress(first, n);
  }
  batch = {};

  const hsize_t off_dims = n + 1, size_dims[2] = {n, 2};
  h5::Id off_space(H5Screate_simple(1, &off_dims, nullptr));
  h5::Id off_ds(H5Dcreate2(group.get(), "offsets", H5T_STD_U64LE, off_space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT));
  if (!off_ds.valid() ||
      H5Dwrite(off_ds.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0) {
    return h5_error("writing /images/offsets");
  }
  h5::Id size_space(H5Screate_simple(2, size_dims, nullptr));
  h5::Id size_ds(H5Dcreate2(group.get(), "sizes", H5T_STD_U32LE, size_space.get(), H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT));
  if (!size_ds.valid() || H5Dwrite(size_ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, sizes.data()) < 0) {
    return h5_error("writing /images/sizes");
  }

  const hsize_t dims = n;
  h5::Id space(H5Screate_simple(1, &dims, nullptr));
  if (!listing.labels.empty()) {
    int64_t max_label = *std::max_element(listing.labels.begin(), listing.labels.end());
    h5::Id labels(H5Dcreate2(file.get(), "labels", LabelFileType(max_label), space.get(), H5P_DEFAULT,
                             H5P_DEFAULT, H5P_DEFAULT));
    if (!labels.valid() ||
        H5Dwrite(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, listing.labels.data()) < 0) {
      return h5_error("writing /labels");
    }
  }
  off_ds.Reset();
  size_ds.Reset();
  bytes_ds.Reset();
  group.Reset();
  if (H5Fclose(file.Release()) < 0) return h5_error("closing " + tmp_path);
  GPUFEED_RETURN_IF_ERROR(out.Commit());

  ConvertSummary summary;
  summary.samples = n;
  summary.chunk_samples = 0;  // byte chunks, not sample chunks
  summary.input_bytes = written;
  summary.raw_bytes = written;  // stored as they came
  struct stat st;
  if (::stat(out_path.c_str(), &st) == 0) summary.output_bytes = static_cast<uint64_t>(st.st_size);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace

Result<ConvertSummary> ConvertEncodedImageFolder(const std::string& dir, const std::string& out_path,
                                                 const ConvertOptions& options) {
  h5::QuietErrors();
  Result<FolderListing> listed = ListImageFolder(dir);
  if (!listed.ok()) return listed.status();
  const FolderListing& listing = *listed;
  return WriteEncodedImages(
      out_path, listing.files.size(),
      [&](uint64_t k, std::vector<unsigned char>* bytes, std::string* name) {
        *name = listing.files[k];
        return ReadWholeFile(*name, bytes);
      },
      listing.labels, listing.class_names, options);
}

Result<ConvertSummary> ConvertEncodedHdf5(const std::string& spec, const std::string& out_path,
                                          const ConvertOptions& options) {
  auto src = OpenEncodedImages(spec, {}, {});
  if (!src.ok()) return src.status();
  const EncodedImageSource& s = **src;
  std::vector<uint8_t> tmp;
  return WriteEncodedImages(
      out_path, s.num_samples(),
      [&](uint64_t k, std::vector<unsigned char>* bytes, std::string* name) {
        *name = s.name() + " sample " + std::to_string(k);
        Status st = s.ReadEncoded(k, &tmp);
        bytes->assign(tmp.begin(), tmp.end());
        return st;
      },
      s.labels(), s.class_names(), options);
}

}  // namespace gpufeed
