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
#include "gpufeed/local_source.h"
#include "gpufeed/sample_source.h"
#include "gpufeed/stats.h"
#include "gpufeed/status.h"
#include "gpufeed/writer.h"

namespace gpufeed {

// An HDF5 dataset ("file.h5" or "file.h5:/path"), read through Dataset.
Result<std::unique_ptr<SampleSource>> OpenHdf5Source(const std::string& spec, const std::string& labels_path);

// Picks the reader from the input: a directory, *.npy, an HDF5 file (by its
// signature, or a "file:/path" spec), else IDX (by its magic, gzip or not).
// The door decides which (DecideSourceKind, gpufeed/local_source.h).
Result<std::unique_ptr<SampleSource>> OpenSource(const std::string& input, const std::string& labels_path,
                                                 const ImageFolderOptions& image_options);
// As above, for what the door decided about `input` (an HDF5 file's probed
// spec taken: not probed again; decided.open.labels_path the labels).
// Named fields, many files and encoded images are InvalidArgument /
// Unsupported (ConvertFields and ConvertEncodedHdf5 read them).
Result<std::unique_ptr<SampleSource>> OpenSource(const std::string& input, const SourceDecision& decided,
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
// As above, for what the door decided about `spec` (probed there, once):
// anything but kEncodedImages is InvalidArgument naming what it is.
Result<ConvertSummary> ConvertEncodedHdf5(const std::string& spec, const SourceDecision& decided,
                                          const std::string& out_path, const ConvertOptions& options);

// ---------------------------------------------------------------------------
// Named fields over many files (docs/format.md "Converting many files").

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
