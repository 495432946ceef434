// The datasets a daemon serves (`gpufeed serve --data ... [--field ...]
// [--no-sample-axis]`):
// each opened once at Start as the local Loader would open it — a Dataset, a
// FieldSource (named fields, many files), or encoded images — with the
// decoded-chunk sharing of its streams. Internal to daemon/.
//
// Encoded images are decoded by each stream's Loader with the client's
// DecodeOptions (HELLO), and an EncodedImageSource carries its decode
// options; so an encoded dataset holds one source per distinct set of
// options its clients asked for (the first opened at Start with the
// defaults, the others made from it, sharing its index and file handles, on
// a client's first HELLO naming them, at most kMaxDecodeVariants), each with
// its own chunk sharing. Sources live until the daemon stops: parked Loaders
// may read them.
#ifndef GPUFEED_DAEMON_DATASETS_H_
#define GPUFEED_DAEMON_DATASETS_H_

#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "gpufeed/chunk_source.h"
#include "gpufeed/dataset.h"
#include "gpufeed/encoded.h"
#include "gpufeed/status.h"

namespace gpufeed {
namespace loader {
class SharedChunks;
}

namespace daemon {

// A key that is equal exactly when two DecodeOptions decode alike
// ("224x224|NCHW|center_crop|0.08,1,...|skip"): part of a stream's identity.
std::string DecodeKey(const DecodeOptions& d);

class DatasetRegistry {
 public:
  static constexpr size_t kMaxDecodeVariants = 8;  // per encoded dataset

  DatasetRegistry();
  ~DatasetRegistry();
  DatasetRegistry(const DatasetRegistry&) = delete;
  DatasetRegistry& operator=(const DatasetRegistry&) = delete;

  // At Start, before any Find: opens `spec` (its name for clients) with
  // `open` as the local Loader would (OpenBatchSource): named fields
  // (open.fields, "NAME=/path"; empty: the single array, or encoded images),
  // open.no_sample_axis. Errors as Dataset::Open / FieldSource::Open /
  // OpenEncodedImages.
  Status Add(const std::string& spec, OpenOptions open);

  // What one stream reads.
  struct Stream {
    std::string name;                              // the dataset as clients name it
    const ChunkSource* source = nullptr;           // lives as long as the registry
    std::shared_ptr<loader::SharedChunks> shared;  // the chunks its streams share
    // Encoded datasets: what streams that read one sample a chunk share
    // (LoaderInternal::ReadsSampleUnits, random order): their chunk k is
    // sample k, not the k-th run of the file, so the two never mix (a run
    // read as a sample decodes as garbage). Null for other datasets.
    std::shared_ptr<loader::SharedChunks> shared_samples;
    bool encoded = false;
    std::string decode_key;  // DecodeKey of the source's options ("" unless encoded)
  };
  // The dataset `name` (empty: the first), or NotFound listing them. An
  // encoded dataset's source for `decode`, made now (no I/O:
  // EncodedImageSource::WithDecodeOptions) if no client asked for these
  // options before; InvalidArgument for options out of range or samples
  // larger than the protocol describes (kMaxSampleBytes). More than
  // kMaxDecodeVariants distinct options: Unsupported naming the limit.
  // Thread-safe.
  Result<Stream> Find(const std::string& name, const DecodeOptions& decode);

  // At Start, after every Add: each dataset's streams share one cache of up
  // to `bytes` decoded chunks (loader::SharedChunks::Retain; no more than
  // the dataset's chunks; 0: none), so the ranks of a job, whose shards move
  // every epoch, do not decode again what another rank's stream had.
  // Encoded datasets keep none (their chunks are the encoded files). Returns
  // the bytes it may hold, for the memory budget.
  uint64_t ShareCaches(uint64_t bytes);

  std::string Names() const;  // "a.h5,b.h5", for the log
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry;
  std::vector<std::unique_ptr<Entry>> entries_;  // fixed after Start
};

}  // namespace daemon
}  // namespace gpufeed

#endif  // GPUFEED_DAEMON_DATASETS_H_
