// Conversion of datasets into gpufeed's chunked HDF5 format (docs/format.md):
// IDX (MNIST / Fashion-MNIST, gzip or plain), NumPy .npy, a folder of class
// subfolders of JPEG/PNG images, or an existing HDF5 dataset (rechunk and
// recompress). Chunks are read, compressed and checksummed in parallel (TBB),
// written in order with H5Dwrite_chunk, and committed atomically.
#ifndef GPUFEED_CONVERT_H_
#define GPUFEED_CONVERT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dtype.h"
#include "gpufeed/stats.h"
#include "gpufeed/status.h"
#include "gpufeed/writer.h"

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
};

// The layout a [C, H, W] or [H, W, C] sample shape most likely has: "NCHW"
// when 1 or 3 channels lead, "NHWC" when they trail, "" when unclear.
std::string GuessLayout(const std::vector<uint64_t>& sample_shape);

// IDX files (the MNIST format), gzip-compressed or plain. 3-D image files
// become [N, 1, H, W] with layout NCHW. `labels_path` may be empty.
Result<std::unique_ptr<SampleSource>> OpenIdxSource(const std::string& images_path, const std::string& labels_path);
// A NumPy .npy array (C order, little-endian numeric) and optional labels .npy.
Result<std::unique_ptr<SampleSource>> OpenNpySource(const std::string& path, const std::string& labels_path);
// An HDF5 dataset ("file.h5" or "file.h5:/path"), read through Dataset.
Result<std::unique_ptr<SampleSource>> OpenHdf5Source(const std::string& spec, const std::string& labels_path);

struct ImageFolderOptions {
  uint32_t height = 0, width = 0;  // required: output size (resize + center crop)
  std::string layout = "NCHW";     // "NCHW" or "NHWC"
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

// Picks the reader from the input: a directory, *.npy, an HDF5 file (by its
// signature, or a "file:/path" spec), else IDX (by its magic, gzip or not).
Result<std::unique_ptr<SampleSource>> OpenSource(const std::string& input, const std::string& labels_path,
                                                 const ImageFolderOptions& image_options);

struct ConvertOptions {
  WriteOptions write;
  int threads = 0;  // 0: all hardware threads
  // Called from one thread, in order, after each chunk is written.
  std::function<void(uint64_t samples_done, uint64_t samples_total)> progress;
};

struct ConvertSummary {
  uint64_t samples = 0;
  uint64_t chunk_samples = 0;
  uint64_t input_bytes = 0;   // what the source occupied (e.g. gzip'd IDX)
  uint64_t raw_bytes = 0;     // decoded sample bytes
  uint64_t output_bytes = 0;  // size of the written file
  double seconds = 0;
  std::vector<double> mean, stddev;  // per channel, stored as attributes
};

// Writes `source` to `out_path` (atomically). Fails naming the input and
// output on any error; the target is then left untouched.
Result<ConvertSummary> Convert(const SampleSource& source, const std::string& out_path, const ConvertOptions& options);

// Stores the image folder's files as they are (JPEG or PNG) in the group
// /images (docs/format.md "Encoded images": a flat chunked uint8 `bytes`
// dataset, `offsets` [N + 1], `sizes` [N, 2] and the class names), with
// /labels; EncodedImageSource (gpufeed/encoded.h) reads it and the loader
// decodes it. Every file's header is checked (Corrupt names the file);
// with `skip_corrupt` every file is also decoded (at its smallest DCT scale,
// which still reads all of its data: a truncated file fails) and the files
// that fail are left out, each named with why in *skipped (when given).
// Atomic like Convert().
Result<ConvertSummary> ConvertEncodedImageFolder(const std::string& dir, const std::string& out_path,
                                                 const ConvertOptions& options, bool skip_corrupt = false,
                                                 std::vector<std::string>* skipped = nullptr);
// The same format from an encoded field already in HDF5 (an h5py vlen uint8
// dataset, which only HDF5's locked path reads, or another gpufeed file):
// "file.h5" or "file.h5:/path", its /labels and class names kept.
Result<ConvertSummary> ConvertEncodedHdf5(const std::string& spec, const std::string& out_path,
                                          const ConvertOptions& options);

// ---------------------------------------------------------------------------
// Named fields over many files (docs/format.md "Converting many files").

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

struct FieldConvertOptions {
  ConvertOptions convert;  // codec, level, chunk_samples, threads, progress
  // 0: one output file. Otherwise the decoded sample bytes (every field's)
  // of each shard, rounded down to whole chunks (at least one sample): the
  // output is OUT-00000.h5, OUT-00001.h5, ... (OUT is out_path without
  // ".h5"). Compressed shards come out smaller.
  uint64_t shard_bytes = 0;
  // Per field, its layout attribute; empty: a FieldSource's first file's
  // layout attribute of that field, else GuessLayout of its sample shape.
  std::vector<std::string> layouts;
};

struct FieldConvertSummary {
  ConvertSummary totals;             // mean/stddev: the first field's
  std::vector<std::string> outputs;  // the files written, in sample order
  uint64_t shard_samples = 0;        // samples per shard (the last may hold fewer)
  std::vector<FieldStats> stats;     // per field, over all samples (what every shard's attributes hold)
};

// Writes every field of `source` (a FieldSource over HDF5 files, the
// OpenNpyFields result, any ChunkSource) to `out_path`, or to shards: each
// field a chunked dataset at its path (FieldInfo::path, or "/NAME"), all
// fields chunked alike (the chunk of the largest field, so a read unit is
// one chunk of each), every sample once, in order; each file with
// gpufeed_format, the layouts, and the per-channel mean/std of the whole
// dataset (so any shard read first gives the loader the same
// normalization). Chunks are read, measured and compressed in parallel and
// written in order. All outputs are committed at the end: a failure leaves
// none of them (each shard is renamed into place atomically; a crash during
// the final renames can leave the first shards of a complete set).
Result<FieldConvertSummary> ConvertFields(const ChunkSource& source, const std::string& out_path,
                                          const FieldConvertOptions& options);

}  // namespace gpufeed

#endif  // GPUFEED_CONVERT_H_
