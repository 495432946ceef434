// SampleSource: samples in the formats gpufeed converts from (formats/):
// IDX (MNIST), NumPy .npy, folders of JPEG/PNG images; and .npy files as
// named fields of a ChunkSource. gpufeed/convert.h writes them to HDF5.
#ifndef GPUFEED_SAMPLE_SOURCE_H_
#define GPUFEED_SAMPLE_SOURCE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dtype.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// Samples to convert. Read() must be thread-safe: the converter calls it from
// many threads at once, each for its own chunk.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual uint64_t num_samples() const = 0;
  virtual const std::vector<uint64_t>& sample_shape() const = 0;
  virtual DType dtype() const = 0;
  virtual std::string layout() const = 0;  // "" when unknown
  virtual std::vector<std::string> class_names() const { return {}; }
  virtual const std::vector<int64_t>& labels() const = 0;  // empty: no labels
  virtual uint64_t input_bytes() const = 0;                // bytes the source occupies
  virtual std::string description() const = 0;             // for messages
  // Decodes samples [first, first + count) into dst (count * sample bytes).
  virtual Status Read(uint64_t first, uint64_t count, std::span<std::byte> dst) const = 0;
  // The samples the source decodes at once (an HDF5 dataset's chunk), 0
  // when any count costs the same. Convert writes chunks of this many by
  // default (WriteOptions::chunk_samples 0), so that each source chunk is
  // decoded once: cutting 100-sample deflate chunks into 12-sample ones
  // inflated each source chunk 8 times (14.6 MB/s against 53.8).
  virtual uint64_t read_unit_samples() const { return 0; }
};

// The layout a [C, H, W] or [H, W, C] sample shape most likely has: "NCHW"
// when 1 or 3 channels lead, "NHWC" when they trail, "" when unclear.
std::string GuessLayout(const std::vector<uint64_t>& sample_shape);

// IDX files (the MNIST format), gzip-compressed or plain. 3-D image files
// become [N, 1, H, W] with layout NCHW. `labels_path` may be empty.
Result<std::unique_ptr<SampleSource>> OpenIdxSource(const std::string& images_path, const std::string& labels_path);
// A NumPy .npy array (C order, little-endian numeric) and optional labels .npy.
Result<std::unique_ptr<SampleSource>> OpenNpySource(const std::string& path, const std::string& labels_path);

struct ImageFolderOptions {
  uint32_t height = 0, width = 0;                 // required: output size (resize + center crop)
  std::string layout{LayoutName(Layout::kNCHW)};  // a Layout's name (gpufeed/names.h)
  // false: a corrupt image fails the conversion, naming the file. true: every
  // image is decoded once when the folder is opened (an extra pass), and
  // those that fail are left out; each is named, with why, in
  // *skipped_files when given (the CLI's --skip-corrupt prints and counts them).
  bool skip_corrupt = false;
  std::vector<std::string>* skipped_files = nullptr;  // optional: receives "path: why" per skipped image
};
// A folder of class subfolders (sorted names become labels 0..C-1) of JPEG
// (libjpeg-turbo) and PNG (libpng) files, decoded to RGB, resized so the
// shorter side fits and center-cropped to height x width.
Result<std::unique_ptr<SampleSource>> OpenImageFolderSource(const std::string& dir, const ImageFolderOptions& options);

// .npy files as named fields: each spec is "NAME=PATTERN" (a glob, sorted,
// or a *.txt / *.list of paths), e.g. "data=dir/*_data.npy". Every field
// must name as many files; file i of every field holds the same samples.
// Each file is [n, sample dims...] (a shard of n samples), or with
// no_sample_axis the sample itself (no sample axis). Every file of a
// field must have the first file's dtype and sample shape, and file i of
// every field the same n; the error names the first file that disagrees.
// The result is a ChunkSource whose fields are NAME at path "/NAME". The
// files are memory-mapped (no descriptor held); headers are checked against
// the file sizes (hostile input) before anything is sized by them.
Result<std::unique_ptr<ChunkSource>> OpenNpyFields(const std::vector<std::string>& specs, bool no_sample_axis);

}  // namespace gpufeed

#endif  // GPUFEED_SAMPLE_SOURCE_H_
