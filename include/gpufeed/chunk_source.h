// ChunkSource: what the loader reads from. Dataset (HDF5) implements it in
// production; tests implement it in memory, slowly, or failing on purpose, so
// back-pressure, cancellation and error paths are tested deterministically.
#ifndef GPUFEED_CHUNK_SOURCE_H_
#define GPUFEED_CHUNK_SOURCE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/dtype.h"
#include "gpufeed/sample_decoder.h"
#include "gpufeed/status.h"

namespace gpufeed {

// One named field of a sample: an HDF5 dataset whose first dimension is the
// sample axis ("data" = /climate/data), or the single array of a one-field
// source ("images"). Byte offsets place the field in a read unit and in a
// batch buffer (planar layout, below).
struct FieldInfo {
  std::string name;                    // "images", "data", "mask": the batch array's name
  std::string path;                    // HDF5 dataset path ("/climate/data"); "" when not from HDF5
  DType dtype = DType::kUInt8;         // element type as stored (an HDF5 bool reads as uint8 0/1)
  bool is_bool = false;                // stored as h5py's bool (enum of int8 FALSE/TRUE)
  std::vector<uint64_t> sample_shape;  // shape of one sample of this field
  uint64_t sample_bytes = 0;           // product of sample_shape x DTypeSize(dtype)
  uint64_t offset = 0;                 // sum of the sample_bytes of the fields before it
};

// What a source carries besides its samples: optional attributes that the
// loader and the trainer pass on (gpufeed convert writes them).
struct SourceAttributes {
  std::string layout;  // "NCHW", "NHWC", ... ("" unknown)
  std::vector<std::string> class_names;
  std::vector<double> mean, stddev;  // per channel, in stored units
};

// A sequence of samples stored in chunks of chunk_samples() consecutive
// samples (the last chunk possibly shorter). Every const member must be
// thread-safe: the loader calls ReadChunk from many threads at once.
//
// Fields. A sample is one or more named fields (fields(): in order, their
// sample_bytes summing to sample_bytes()). Read units and batches are
// *planar*: a buffer made for `capacity` samples holds field f's samples
// contiguously from byte capacity x f.offset (capacity = chunk_samples() for
// a read unit, batch_size for a batch). With one field (the default) this is
// the plain [n, sample] array.
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
  // Decodes chunk i into dst (at least chunk_samples() * sample_bytes() when
  // the source has several fields, else samples_in_chunk(i) *
  // sample_bytes()), field by field as described above. A failure names the
  // source and the chunk.
  virtual Status ReadChunk(uint64_t i, std::span<std::byte> dst) const = 0;
  // A hint that chunk i will be read soon, in the order of the calls (the
  // loader calls it as it schedules reads in its plan's order). A file
  // source may start reading it ahead; the default does nothing.
  virtual void WillRead(uint64_t /*i*/) const {}
  // How many chunks' reads the source keeps in flight ahead of its readers
  // (O_DIRECT's io_uring read-ahead, a remote object's window; 0: none,
  // WillRead then at most tells the kernel). The loader then hints that many
  // chunks of its plan ahead, not only those its cache can admit yet
  // (ChunkCache::HintReads); it may change (a remote object's follows its
  // link), so the loader asks at each batch.
  virtual uint32_t read_ahead_chunks() const { return 0; }
  // One label per sample; empty when the source has none.
  virtual const std::vector<int64_t>& labels() const = 0;
  // "file.h5:/images", for messages.
  virtual std::string name() const = 0;
  // Sample k, for messages: "file.h5:/images sample k" by default; a source
  // of one file a sample names the file.
  virtual std::string sample_name(uint64_t k) const { return name() + " sample " + std::to_string(k); }
  // The sample's fields. Default: one field "images" of dtype() and
  // sample_shape() (what every single-array source is).
  virtual std::vector<FieldInfo> fields() const {
    FieldInfo f;
    f.name = "images";
    f.dtype = dtype();
    f.sample_shape = sample_shape();
    f.sample_bytes = sample_bytes();
    return {f};
  }
  // Layout, class names, mean/std; default: none known.
  virtual SourceAttributes attributes() const { return {}; }
  // What opening the source's files has cost so far (since it was opened):
  // HDF5's parser in the forked probe, and the opens themselves (at open
  // and, for many files, as reads need them). Default: nothing counted.
  struct OpenCosts {
    double probe_seconds = 0;
    double open_seconds = 0;
    uint64_t opens = 0;  // files (or a virtual dataset's parts) opened
    // Of those, opened from the probe's plan (hdf5io/hdf5/probe.h): with open(2),
    // no HDF5 in this process.
    uint64_t planned_opens = 0;
  };
  virtual OpenCosts open_costs() const { return {}; }

  // --- Sources whose chunks hold encoded samples (EncodedImageSource). ---
  // The default is a plain source: chunk i is samples_in_chunk(i) *
  // sample_bytes() bytes and the loader copies each sample out of it.
  //
  // Bytes ReadChunk(i) writes: the buffer the loader's cache gives chunk i.
  virtual uint64_t chunk_buffer_bytes(uint64_t i) const { return samples_in_chunk(i) * sample_bytes(); }
  // The largest chunk_buffer_bytes over all chunks (the cache's buffer size).
  virtual uint64_t max_chunk_buffer_bytes() const { return chunk_samples() * sample_bytes(); }
  // True: a chunk holds encoded samples; the loader's decode stage turns
  // each into sample_bytes() with sample_decoder() (gpufeed/sample_decoder.h)
  // instead of copying it out of the chunk.
  virtual bool decodes_samples() const { return false; }
  // Where sample `sample` (global index) of chunk `chunk` lies in the bytes
  // ReadChunk wrote to chunk_bytes. Thread-safe. Only called when
  // decodes_samples().
  virtual Result<std::span<const std::byte>> EncodedBytes(std::span<const std::byte> chunk_bytes, uint64_t chunk,
                                                          uint64_t sample) const {
    (void)chunk_bytes, (void)chunk, (void)sample;
    return Status::Internal(name() + ": EncodedBytes on a source of plain samples");
  }
  // The decoder of the samples this source was opened for (their output
  // size, layout and crop). Null when !decodes_samples().
  virtual std::shared_ptr<const SampleDecoder> sample_decoder() const { return nullptr; }
};

}  // namespace gpufeed

#endif  // GPUFEED_CHUNK_SOURCE_H_
