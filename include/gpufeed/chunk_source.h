// ChunkSource: what the loader reads from. Dataset (HDF5) implements it in
// production; tests implement it in memory, slowly, or failing on purpose, so
// back-pressure, cancellation and error paths are tested deterministically.
#ifndef GPUFEED_CHUNK_SOURCE_H_
#define GPUFEED_CHUNK_SOURCE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/dtype.h"
#include "gpufeed/status.h"

namespace gpufeed {

// A sequence of samples stored in chunks of chunk_samples() consecutive
// samples (the last chunk possibly shorter). Every const member must be
// thread-safe: the loader calls ReadChunk from many threads at once.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  virtual uint64_t num_samples() const = 0;
  virtual const std::vector<uint64_t>& sample_shape() const = 0;
  virtual uint64_t sample_bytes() const = 0;
  virtual DType dtype() const = 0;
  virtual uint64_t chunk_samples() const = 0;
  virtual uint64_t num_chunks() const = 0;
  virtual uint64_t samples_in_chunk(uint64_t i) const = 0;
  virtual uint64_t stored_chunk_bytes(uint64_t i) const = 0;
  // Decodes chunk i into dst (at least samples_in_chunk(i) * sample_bytes()).
  // A failure names the source and the chunk.
  virtual Status ReadChunk(uint64_t i, std::span<std::byte> dst) const = 0;
  // One label per sample; empty when the source has none.
  virtual const std::vector<int64_t>& labels() const = 0;
  // "file.h5:/images", for messages.
  virtual std::string name() const = 0;

  // --- Sources whose chunks hold encoded samples (EncodedImageSource). ---
  // The default is a plain source: chunk i is samples_in_chunk(i) *
  // sample_bytes() bytes and the loader copies each sample out of it.
  //
  // Bytes ReadChunk(i) writes: the buffer the loader's cache gives chunk i.
  virtual uint64_t chunk_buffer_bytes(uint64_t i) const { return samples_in_chunk(i) * sample_bytes(); }
  // The largest chunk_buffer_bytes over all chunks (the cache's buffer size).
  virtual uint64_t max_chunk_buffer_bytes() const { return chunk_samples() * sample_bytes(); }
  // True: the loader calls DecodeSample for each sample instead of copying
  // sample_bytes() out of the chunk.
  virtual bool decodes_samples() const { return false; }
  // What a decoding source may depend on besides the sample: the loader's
  // seed and the epoch (random augmentation is a pure function of
  // (seed, epoch, sample), never of threads or timing).
  struct SampleContext {
    uint64_t seed = 0;
    uint64_t epoch = 0;
  };
  // Decodes sample `sample` (global index) of chunk `chunk`, whose bytes
  // ReadChunk wrote to `chunk_bytes`, into dst (sample_bytes()). Sets
  // *delivered to the sample actually written: `sample`, or, when the source
  // skips corrupt samples, the one that replaced it (its label is the one
  // the batch must carry). Thread-safe. Only called when decodes_samples().
  virtual Status DecodeSample(std::span<const std::byte> chunk_bytes, uint64_t chunk, uint64_t sample,
                              const SampleContext& context, std::span<std::byte> dst, uint64_t* delivered) const {
    (void)chunk_bytes, (void)chunk, (void)sample, (void)context, (void)dst, (void)delivered;
    return Status::Internal(name() + ": DecodeSample on a source that does not decode samples");
  }
};

}  // namespace gpufeed

#endif  // GPUFEED_CHUNK_SOURCE_H_
