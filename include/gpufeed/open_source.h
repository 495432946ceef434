// OpenBatchSource: one call for "where the batches come from" — an HDF5
// dataset read by a local Loader, or a `gpufeed serve` daemon read by a
// RemoteLoader — so the CLI, the C API and Python take either form of --data
// and treat the result as a BatchSource.
//
//   auto src = gpufeed::OpenBatchSource({.data = "unix:/tmp/gpufeed.sock", .dataset = "train.h5",
//                                        .loader = {.batch_size = 256}});
//   for (const gpufeed::Batch& b : (*src)->source().Epoch(0)) use(b);
#ifndef GPUFEED_OPEN_SOURCE_H_
#define GPUFEED_OPEN_SOURCE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gpufeed/dataset.h"
#include "gpufeed/encoded.h"
#include "gpufeed/loader.h"
#include "gpufeed/local_source.h"
#include "gpufeed/names.h"
#include "gpufeed/remote_loader.h"
#include "gpufeed/status.h"

namespace gpufeed {

// True for "unix:..." and "tcp://..." (a daemon), false for a dataset spec.
bool IsDaemonAddress(std::string_view data);

// Where a file's batches are made when a job runs several ranks on one host.
// kNode: the host's ranks read through one node-local `gpufeed serve` that
// the first of them starts (one reader, one decoded-chunk cache, one set of
// decode threads; each rank its own shard and stream) and that ends after
// the last; kNone: a Loader in this process; kAuto: kNode under torchrun with
// more than one local rank (LOCAL_WORLD_SIZE > 1) unless an option only a
// local Loader takes is set (open.labels_path, open.io, open.max_open_files)
// or the file holds encoded images for this process's GPU decoder
// (loader.defer_decode), else kNone. For those, kNode gives each rank the
// JPEGs its GPU takes encoded (the server reads and caches them once for the
// node, each rank decodes on its own GPU's engine), as a loader per rank
// does; kAuto keeps a loader per rank there until kNode is measured on a GPU
// host to be at least as good (the server decodes no share of the engine's
// JPEGs on its CPU, as balance_decode does in a rank). docs/python.md,
// "Many GPUs".
// Share and its names ("auto", "node", "none"): gpufeed/names.h.

class NodeLease;  // loader/door/node_share.h

struct SourceOptions {
  std::string data;     // "file.h5[:/path]", "unix:PATH" or "tcp://HOST:PORT"
  std::string dataset;  // daemon: the dataset to read there (empty: its first)
  LoaderOptions loader;
  OpenOptions open;  // dataset only
  // Encoded image datasets only (gpufeed/encoded.h): output size, layout,
  // transform, skip_corrupt; a daemon serving one decodes with them too.
  // Ignored for other datasets.
  DecodeOptions decode;
  // Daemon only: token, token_file, client_name, timeouts, compression and
  // shared memory; its address, dataset and loader fields are ignored (the
  // ones above are used).
  RemoteLoaderOptions remote;
  // Files only (a daemon address is read as it is): see Share.
  Share share = Share::kAuto;
  // Files only: what the door decided about `data` already
  // (DecideSourceKind(data, open), gpufeed/local_source.h), for a caller that
  // needed the decision first: taken as it is, the file not probed again
  // (its `open` is the decision's). Empty: decided here.
  std::optional<SourceDecision> decided;
};

// Owns what OpenBatchSource opened: a Dataset and its Loader, or a
// RemoteLoader. Not thread-safe (as the Loader).
class OpenedSource {
 public:
  OpenedSource(std::unique_ptr<Dataset> dataset, std::unique_ptr<Loader> loader);
  // A FieldSource (named fields, many files) or any other local source.
  OpenedSource(std::unique_ptr<ChunkSource> source, std::unique_ptr<Loader> loader);
  // An encoded image dataset (decoded by the loader).
  OpenedSource(std::unique_ptr<EncodedImageSource> encoded, std::unique_ptr<Loader> loader);
  explicit OpenedSource(std::unique_ptr<RemoteLoader> remote);
  ~OpenedSource();

  BatchSource& source() { return *source_; }
  const BatchSource& source() const { return *source_; }
  // The local dataset; nullptr for a daemon, a FieldSource or encoded images.
  const Dataset* dataset() const { return dataset_.get(); }
  // The local source (a Dataset, a FieldSource, encoded images); nullptr for a daemon.
  const ChunkSource* chunk_source() const { return dataset_ ? dataset_.get() : other_.get(); }
  // The local encoded image dataset (decoded by the loader); nullptr otherwise.
  const EncodedImageSource* encoded() const { return encoded_; }
  bool remote() const { return remote_ != nullptr; }
  uint64_t num_batches() const;  // per epoch, for this rank
  // Share::kNode: read through the node's server (remote() too), and
  // whether this process started it.
  bool node_shared() const { return lease_ != nullptr; }
  bool started_node_server() const;
  void HoldLease(std::unique_ptr<NodeLease> lease);  // released after the connection closes

 private:
  std::unique_ptr<Dataset> dataset_;
  const EncodedImageSource* encoded_ = nullptr;  // other_, when it holds encoded images
  std::unique_ptr<ChunkSource> other_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<RemoteLoader> remote_;
  std::unique_ptr<NodeLease> lease_;
  BatchSource* source_ = nullptr;
};

// Opens the dataset (errors as Dataset::Open; an encoded image field, found
// by DetectEncoded, is opened with OpenEncodedImages and options.decode), the
// FieldSource when options.open.fields names fields or options.data names
// many files (errors as FieldSource::Open), a FieldSource of fields images
// (and labels, when the file has them) when the dataset is an HDF5 virtual
// dataset (its sources read directly), or connects to the daemon (errors
// as RemoteLoader::Connect, naming the address). A daemon's fields are its
// own (gpufeed serve --field): with a daemon address, options.open.fields
// (when given) must equal them, in order, or InvalidArgument names both.
// options.share resolved to kNode: attaches to (or starts) the node's server
// and reads it as a daemon (errors as ResolveShare / AttachNodeServer,
// loader/door/node_share.h).
Result<std::unique_ptr<OpenedSource>> OpenBatchSource(const SourceOptions& options);

}  // namespace gpufeed

#endif  // GPUFEED_OPEN_SOURCE_H_
