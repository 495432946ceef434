// Encoded image datasets (JPEG/PNG files stored as they are, docs/format.md
// "Encoded images"): a ChunkSource whose chunks hold the files' bytes and
// whose samples the loader decodes in its own threads, straight into the
// batch, at a fixed output size: random-resized-crop for training, resize +
// center crop for evaluation.
//
//   gpufeed::DecodeOptions d{.height = 224, .width = 224};
//   auto src = gpufeed::OpenEncodedImages("train.h5", {}, d);
//   gpufeed::Loader loader(**src, {.batch_size = 256, .seed = 1});
//   for (const gpufeed::Batch& b : loader.Epoch(0)) use(b.images());  // uint8 [B, 3, 224, 224]
//
// Two storages are read:
//   - gpufeed's (`gpufeed convert DIR --keep-encoded`): a group holding a
//     flat chunked uint8 `bytes` dataset and `offsets` [N+1]; a sample's
//     bytes are a byte range read through Dataset's direct path (pread +
//     no HDF5 lock), so N threads read N ranges at once.
//   - h5py's variable-length uint8 (`h5py.vlen_dtype(np.uint8)`): read with
//     H5Dread under HDF5's global lock (correct, slower: one thread reads at
//     a time) after a first pass at open that measures every entry.
#ifndef GPUFEED_ENCODED_H_
#define GPUFEED_ENCODED_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dataset.h"
#include "gpufeed/decode_options.h"
#include "gpufeed/status.h"

namespace gpufeed {

// How the file stores the encoded samples at `spec`.
enum class EncodedStorage {
  kNone,     // not an encoded field (a plain Dataset, or nothing)
  kOffsets,  // gpufeed's group: bytes + offsets (direct path)
  kVlen,     // h5py variable-length uint8 (HDF5 path, under its lock)
  kFolder,   // no HDF5: an image folder's files, read as they are (the door's kImageFolder)
};
// Looks at spec ("file.h5" = "file.h5:/images", or "file.h5:/path") without
// reading samples. Errors only for files HDF5 cannot open (or that crash
// HDF5 in the probe); a missing path is kNone. open.trust_files false (the
// default) first runs HDF5's metadata parser in the forked probe
// (dataset.h), as Dataset::Open does.
Result<EncodedStorage> DetectEncoded(std::string_view spec, const OpenOptions& open = {});
// As above, for a spec through the probe already (no second probe).
Result<EncodedStorage> DetectEncoded(const ProbedSpec& spec, const OpenOptions& open = {});

// The ChunkSource over an encoded field. sample_bytes() is the decoded
// output (3 x height x width, uint8) and sample_shape() [3, H, W] or
// [H, W, 3]; each loader chunk holds a run of consecutive samples' bytes.
class EncodedImageSource : public ChunkSource {
 public:
  ~EncodedImageSource() override = default;
  virtual EncodedStorage storage() const = 0;
  virtual const DecodeOptions& decode_options() const = 0;
  virtual std::vector<std::string> class_names() const = 0;
  // Stored (encoded) bytes of the whole field.
  virtual uint64_t stored_bytes() const = 0;
  // Stored bytes of sample k, k < num_samples().
  virtual uint64_t sample_stored_bytes(uint64_t k) const = 0;
  // The stored bytes of sample k (for tests, export and checks). Thread-safe.
  virtual Status ReadEncoded(uint64_t k, std::vector<uint8_t>* out) const = 0;
  // A source over the same stored samples decoded with `decode` (size,
  // layout, transform, skip_corrupt): exactly what OpenEncodedImages(spec,
  // open, decode) would give, without reading the file again (the index,
  // labels and file handles are shared). For a
  // server decoding one dataset for clients that ask for different options.
  // InvalidArgument as ValidateDecodeOptions. Thread-safe; either source may
  // be destroyed first.
  virtual Result<std::unique_ptr<EncodedImageSource>> WithDecodeOptions(const DecodeOptions& decode) const = 0;
  // A source over the same stored samples and decoder whose loader chunks
  // (read units) hold `samples` consecutive samples (at least 1; 1: each
  // sample is its own read, of its own bytes only). The default groups
  // about 4 MiB of consecutive samples: one read serves a block-order
  // window's samples; a uniform shuffle (Order::kRandom) touches one sample
  // of a run at a time, and there a run costs its whole 4 MiB for one
  // sample (the Loader takes units of one sample then). Shares the index
  // as WithDecodeOptions does. Thread-safe.
  virtual std::unique_ptr<EncodedImageSource> WithReadUnit(uint64_t samples) const = 0;
};

// Opens the encoded field at spec (DetectEncoded must not say kNone:
// NotFound otherwise). Sizes from the file (offsets, N) are checked against
// the byte dataset before anything is allocated; Corrupt names the dataset.
// open.trust_files false runs HDF5's parser in the forked probe first.
Result<std::unique_ptr<EncodedImageSource>> OpenEncodedImages(std::string_view spec, const OpenOptions& open,
                                                              const DecodeOptions& decode);
// As above, for a spec through the probe already (no second probe).
Result<std::unique_ptr<EncodedImageSource>> OpenEncodedImages(const ProbedSpec& spec, const OpenOptions& open,
                                                              const DecodeOptions& decode);

// Decodes one encoded image (JPEG or PNG, by signature) exactly as the
// loader does for sample `sample` of epoch `epoch` under `seed`: options'
// transform, its random crop drawn from that triple; writes 3 x image_height
// x image_width bytes in options.layout to dst. For checks and tools (the
// benchmarks verify what the loader delivered with it). Thread-safe.
Status DecodeImage(std::span<const uint8_t> bytes, const DecodeOptions& options, uint64_t seed, uint64_t epoch,
                   uint64_t sample, uint8_t* dst);

}  // namespace gpufeed

#endif  // GPUFEED_ENCODED_H_
