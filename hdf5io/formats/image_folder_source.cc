// Image folders (DIR/<class>/<image>): a SampleSource that decodes JPEG and
// PNG files (image_decode.cc, the decoder encoded samples use) to fixed-size
// RGB uint8 samples for `gpufeed convert DIR --size HxW`. The listing is image_folder_listing.cc,
// the resize image_ops.cc, the encoded converter encoded_convert.cc.
#include <fcntl.h>
#include <tbb/parallel_for.h>
#include <sys/stat.h>
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

#include "gpufeed/names.h"
#include "gpufeed/sample_source.h"
#include "hdf5io/image/image_decode.h"
#include "hdf5io/formats/image_folder_listing.h"
#include "hdf5io/image/image_ops.h"

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

struct RgbImage {
  std::vector<uint8_t> pixels;  // height x width x 3, packed
  int height = 0, width = 0;
};

// Decodes by content, not extension (image sets in the wild have PNGs named
// .jpg: ImageNet has some), with the encoded path's decoder: a JPEG at the
// smallest DCT scale that still covers target_h x target_w (the scaled IDCT
// is both faster and a better low-pass than resampling the full image).
// Corrupt, naming `path`, when it does not decode.
Status DecodeImage(const std::string& path, std::span<const unsigned char> bytes, int target_h, int target_w,
                   RgbImage* out) {
  Status st = image::DecodeCovering(bytes, target_h, target_w, &out->pixels, &out->height, &out->width);
  if (!st.ok()) return Status::Corrupt(path + ": " + st.message());
  return Status::Ok();
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
        nhwc_(LayoutOr(options.layout, Layout::kNCHW) == Layout::kNHWC),
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
  if (!kLayoutNames.Find(options.layout)) {
    return Status::InvalidArgument(dir + ": image layout '" + options.layout + "' is not " + kLayoutNames.List());
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
        kept.sizes.push_back(l.sizes[i]);
        kept.total_bytes += l.sizes[i];
      } else if (options.skipped_files != nullptr) {
        options.skipped_files->push_back(why[i].message());
      }
    }
    if (kept.files.empty()) {
      return Status::InvalidArgument(dir + ": every one of its " + std::to_string(l.files.size()) +
                                     " images is corrupt");
    }
    *listing = std::move(kept);
  }
  return std::unique_ptr<SampleSource>(std::make_unique<ImageFolderSource>(dir, std::move(listing).value(), options));
}

}  // namespace gpufeed
