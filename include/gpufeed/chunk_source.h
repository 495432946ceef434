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
  // A hint that chunk i will be read soon, in the order of the calls (the
  // loader calls it as it schedules reads in its plan's order). A file
  // source may start reading it ahead; the default does nothing.
  virtual void WillRead(uint64_t /*i*/) const {}
  // One label per sample; empty when the source has none.
  virtual const std::vector<int64_t>& labels() const = 0;
  // "file.h5:/images", for messages.
  virtual std::string name() const = 0;
};

}  // namespace gpufeed

#endif  // GPUFEED_CHUNK_SOURCE_H_
