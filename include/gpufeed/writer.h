// DatasetWriter: writes a gpufeed dataset (docs/format.md) — /images chunked
// along axis 0 only, compressed by gpufeed's own codecs in the caller's
// threads and stored with H5Dwrite_chunk, plus /labels and attributes.
//
// Atomicity: everything is written to "<path>.tmp-<pid>" and renamed onto
// `path` by Commit(). A writer destroyed without a successful Commit() (an
// error, an exception, a signal-free interruption) removes its temporary file,
// so `path` is either the old file or the complete new one, never half.
#ifndef GPUFEED_WRITER_H_
#define GPUFEED_WRITER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/dtype.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// Codec and its names ("none", "deflate", "zstd"): gpufeed/names.h.

struct WriteOptions {
  // Deflate: every HDF5 build decodes it (h5py, h5dump, MATLAB, ...), so a
  // file a user shares opens anywhere. zstd (filter 32015) writes and reads
  // faster (Fashion-MNIST, 2 threads: the direct path decodes 2.4 GB/s of
  // zstd, 1.2 of deflate; the same size on disk), but a reader then needs
  // a plugin (Debian's h5py: "required filter 'zstd' is not registered").
  Codec codec = Codec::kDeflate;
  // Compression level; -1 picks the codec's default (deflate 4, zstd 3: both
  // decode at the same speed whatever the level, and these are where higher
  // levels stop paying for their encode time).
  int level = -1;
  // HDF5 shuffle filter before the compressor, for dtypes of 2 bytes or
  // more (for 1-byte ones it would change nothing, and is not written).
  // With deflate 4 it shrinks a uint16 ramp-and-noise image 1.83x where
  // plain deflate does 1.26x, smooth float32 fields 1.27x against 1.07x,
  // and writes and reads faster besides (h5py, 64 samples of 128 x 128).
  bool shuffle_filter = true;
  // Samples per chunk; 0 picks (in Convert) the source's own chunk where it
  // has one of at most 64 MiB (SampleSource::read_unit_samples), else
  // AutoChunkSamples: at most 2 MiB a chunk (pread
  // and the codecs are at full speed well before; a shuffle window of 16
  // chunks stays small), at least 64 KiB, and otherwise N / 256 samples, so
  // that even a small dataset has enough chunks for block-order shuffling.
  uint64_t chunk_samples = 0;
  std::string layout;                    // "NCHW", "NHWC", ... (attribute)
  std::vector<std::string> class_names;  // attribute, optional
  // Path of the first dataset (Create's). Named fields keep theirs
  // ("/climate/data"); intermediate groups are created.
  std::string dataset_path = "/images";
};

// Chunk size `WriteOptions::chunk_samples == 0` resolves to.
uint64_t AutoChunkSamples(uint64_t sample_bytes, uint64_t num_samples);

// Not thread-safe: one thread calls WriteChunk in chunk order or any order;
// EncodeChunk (static) is the part meant to run in parallel.
class DatasetWriter {
 public:
  // Creates the temporary file with /images [num_samples, sample_shape...].
  static Result<DatasetWriter> Create(const std::string& path, const std::vector<uint64_t>& sample_shape, DType dtype,
                                      uint64_t num_samples, const WriteOptions& options);

  DatasetWriter(DatasetWriter&&) noexcept;
  DatasetWriter& operator=(DatasetWriter&&) noexcept;
  ~DatasetWriter();  // removes the temporary file unless committed

  uint64_t chunk_samples() const;
  uint64_t num_chunks() const;
  uint64_t sample_bytes() const;  // of dataset 0

  // Adds another dataset (a named field) of the same num_samples, chunking
  // (chunk_samples() samples a chunk, so chunk i of every dataset holds the
  // same samples) and filters; `layout` becomes its attribute when not
  // empty. Returns its index (1, 2, ...) for the calls below.
  Result<size_t> AddDataset(const std::string& path, const std::vector<uint64_t>& sample_shape, DType dtype,
                            const std::string& layout);
  uint64_t sample_bytes(size_t dataset) const;

  // An encoded chunk, ready for WriteChunk.
  struct EncodedChunk {
    std::vector<std::byte> bytes;
    uint32_t filter_mask = 0;
  };
  // Encodes chunk i's samples (samples_in_chunk * sample_bytes bytes; a short
  // last chunk is zero-padded to the full chunk as HDF5 stores it).
  // Thread-safe: call from many threads at once.
  Status EncodeChunk(uint64_t i, std::span<const std::byte> samples, EncodedChunk* out, size_t dataset = 0) const;
  // Stores an encoded chunk. Returns IOError/Internal naming the file.
  // Reopens the temporary file after Close().
  Status WriteChunk(uint64_t i, const EncodedChunk& chunk, size_t dataset = 0);

  // Writes /labels (int64 widened values stored as the narrowest of uint8,
  // int16, int32, int64 that holds them). Requires labels.size() == samples.
  Status WriteLabels(std::span<const int64_t> labels);
  // Per-channel mean and std attributes of /images, in stored units.
  Status WriteChannelStats(const std::vector<double>& mean, const std::vector<double>& stddev, size_t dataset = 0);

  // Closes the temporary file's HDF5 handles (and descriptor) without
  // committing: a writer with many shards in flight holds no descriptors for
  // those it is not writing. A later write reopens it.
  Status Close();
  // Closes the file and renames it onto the target path.
  Status Commit();
  uint64_t bytes_written() const;  // stored chunk bytes so far

 private:
  struct Impl;
  explicit DatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_WRITER_H_
