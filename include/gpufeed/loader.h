// Loader: turns a ChunkSource (usually a Dataset) into a stream of uint8
// batches {images [B, sample dims...], labels [B]} in recycled host buffers,
// prefetched by a TBB pipeline: plan -> fetch/decode chunks through a cache
// that knows the epoch's order -> assemble -> deliver in order.
//
//   auto ds = gpufeed::Dataset::Open("train.h5");
//   gpufeed::Loader loader(*ds, {.batch_size = 256, .order = gpufeed::Order::kBlock, .seed = 1});
//   for (const gpufeed::Batch& b : loader.Epoch(0)) { use(b.images(), b.labels()); }
//
// Order. The sample order of an epoch is a pure function of (seed, epoch,
// rank, world_size, order, shuffle_window, batch_size, drop_last) and the
// source's shape — never of thread counts or timing — so a run resumes from
// (epoch, next_batch) with any number of threads and gets identical batches.
//
// Memory. At most `prefetch` batches are in flight; buffers come from a pool
// of prefetch + 1 batches allocated once (pinned when a CUDA device is
// present), fewer where batches are so large that prefetch + 1 of them
// would pass pool_bytes (never fewer than 3). Resident memory is bounded by
//   CacheBoundBytes() + pool slots x batch bytes + (2 x threads + 4) x chunk bytes
// plus the chunks whose last use is a batch still in flight (they have left
// the cache's budget: at most a shuffle window at a block-order window
// boundary, a few chunks otherwise). Decoded-chunk buffers are touched once
// and reused: one given back (evicted, or copied at its last use) is kept
// for the next chunk up to this bound, or the most in use at once, so the
// chunk memory stays at its peak instead of being unmapped and zeroed afresh
// (LoaderStats::chunk_bytes_mapped, chunk_bytes_held). A Dataset read with
// direct I/O (IoMode::kDirect) adds its read-ahead, DatasetInfo's
// read_ahead_chunks (one per hardware thread, 4 to 32) x chunk bytes, plus
// one aligned chunk buffer per reading thread. An object in S3 or over
// HTTP(S) adds its read-ahead's buffers: at most GPUFEED_REMOTE_IN_FLIGHT_MB
// (128 MiB; GPUFEED_REMOTE_IN_FLIGHT x chunk bytes where that is set).
//
// Threads. A Loader may run one epoch stream at a time; its methods are not
// thread-safe with respect to each other. The stream is consumed from one
// thread. Destroying a stream (or the loader) mid-epoch stops the pipeline,
// waits for its tasks and frees everything: no leak, no stray thread.
#ifndef GPUFEED_LOADER_H_
#define GPUFEED_LOADER_H_

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/crop_rect.h"
#include "gpufeed/dtype.h"
#include "gpufeed/logger.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// Order, OrderName and OrderFromName: gpufeed/names.h.

// Half the memory this process can still use now (MemAvailable, lowered to
// the cgroup limit's room): what `--cache-bytes auto` gives the cache.
uint64_t AutoCacheBytes();

struct LoaderOptions {
  // Samples per batch. Larger than this rank's share of the dataset (and
  // drop_last false): clamped to the share, with a warning in info().
  uint64_t batch_size = 256;
  Order order = Order::kBlock;
  uint64_t seed = 0;
  int threads = 0;   // TBB threads; 0: all hardware threads
  int prefetch = 8;  // batches in flight ahead of the consumer
  // The batch pool's budget: prefetch + 1 buffers, or as many as fit in
  // pool_bytes where that is fewer (3 at least: two batches in flight, one
  // with the consumer). Batches of 8 DeepCAM samples are 480 MB: 9 of them
  // took 4.3 GB to pin or fault in before the first epoch could run at
  // speed (issue 30). 0: prefetch + 1 whatever their size.
  uint64_t pool_bytes = 2ull << 30;
  // Decoded-chunk cache budget. A budget of the whole decoded dataset makes
  // every epoch after the first read and decode nothing (the cache's future
  // spans epochs); AutoCacheBytes() is a sensible share of this machine.
  uint64_t cache_bytes = 1ull << 30;
  uint64_t shuffle_window = 16;  // chunks per shuffle window (kBlock)
  int rank = 0;                  // this process's shard
  int world_size = 1;            // number of shards
  // false (default): ranks get ceil(N / world_size) samples each, the short
  // ones padded with samples from the start of the epoch's order (as
  // PyTorch's DistributedSampler does), and the last batch may be short.
  // true: each rank gets floor(N / world_size) samples rounded down to whole
  // batches; nothing is repeated, every batch is full.
  bool drop_last = false;
  // Allocate batch buffers with cudaHostAlloc when a CUDA device is present.
  bool pin_memory = true;
  // Sources of encoded images only (ChunkSource::decodes_samples): leave the
  // JPEGs a device decoder takes encoded in the batch (Batch::encoded()) for
  // the GpuFeeder to decode on the GPU; the others (PNG, progressive, CMYK,
  // truncated, ...) are decoded here as without it. Set by whoever pairs the
  // Loader with a feed that decodes (FeedOptions::decode); ignored for other
  // sources.
  bool defer_decode = false;
  // With defer_decode: decode a share of the samples the device decoder
  // takes here as well, chosen from this loader's measured decode time per
  // sample and the rate the feed's decoder reports
  // (BatchSource::ReportDeviceDecodeRate), so that neither the device
  // decoder nor these threads wait for the other: share = host rate / (host
  // rate + device rate). Which samples: a hash of (seed, epoch, sample)
  // against the share. decode="auto" sets it; decode="gpu" leaves every
  // sample the device takes to it.
  bool balance_decode = false;
  // Epoch reshard.epoch continues a run saved at another world size
  // (Reshard, below); world_size 0: none. Set by a resume, not by hand.
  struct Reshard {
    uint64_t epoch = 0;
    uint32_t world_size = 0;  // the saved run's ranks
    uint64_t share = 0;       // samples in each of its ranks' shares that epoch
    uint64_t consumed = 0;    // samples each of them had received
  } reshard;
  // Where the loader says what is no error (a corrupt sample replaced);
  // null: stderr (gpufeed/logger.h).
  std::shared_ptr<Logger> logger;
};

// The most decoded bytes a Loader's chunk cache holds, for these options
// and a source whose largest chunk buffer is `max_chunk_bytes`: cache_bytes,
// or the epoch's working set where that is larger but at most
// shuffle_window + 2 chunks (a block window's chunks serve several batches;
// they are kept whatever the budget, so each is decoded once an epoch, even
// with cache_bytes 0). Random order over whole chunks has the data as its
// working set: there the budget alone rules.
uint64_t CacheBoundBytes(const LoaderOptions& o, uint64_t max_chunk_bytes);

// Resuming at another world size. A state saved at W ranks, each having
// received `consumed` samples of its contiguous share of the epoch's order,
// resumes at W' ranks (any rank's state will do: ranks of one run move in
// step) with the samples none of them received, in the order they had, cut
// into W' contiguous shares (padded or dropped as drop_last says): in that
// epoch no sample is lost or repeated, and later epochs are the W' ranks'
// own. A state saved mid-way through such an epoch resumes at the same
// world size only (InvalidArgument otherwise: resume at its world size, or
// from a state saved at an epoch's end).
//
// The samples left of `r`'s epoch, in order (positions < num_samples only:
// the saved run's padding repeats samples that are there already).
uint64_t ReshardRemaining(uint64_t num_samples, const LoaderOptions::Reshard& r);

// The order of all `num_samples` samples in an epoch before sharding, as
// every rank computes it (each rank's share is cut from it): a pure function
// of its arguments. For tools and tests (`gpufeed bench order`).
std::vector<uint64_t> EpochOrder(uint64_t num_samples, uint64_t chunk_samples, Order order, uint64_t seed,
                                 uint64_t epoch, uint64_t shuffle_window);

// Where a run is: resume with BatchSource::Resume(state) (at the same world
// size: Epoch(state.epoch, state.next_batch)). Serialized with a magic and a
// version (version 1, without the shard fields, is still read: it resumes
// at the same world size only; versions 1 and 2, without the run's order
// and dataset size, are not checked for those).
struct LoaderState {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t next_batch = 0;  // batches the consumer has received this epoch
  // The shard the position is in (DescribeShard): 0 when unknown.
  uint32_t world_size = 0;
  uint64_t share = 0;     // samples of this rank's share in this epoch
  uint64_t consumed = 0;  // of them received: min(next_batch x batch size, share)
  // The reshard this epoch itself ran under (world_size 0: none).
  LoaderOptions::Reshard base;
  // The run's order and the dataset it read (version 3; DescribeShard):
  // a resume into another order or dataset is refused (CheckStateFits).
  std::optional<Order> order;   // nullopt: unknown (an older state)
  uint64_t shuffle_window = 0;  // 0: unknown
  uint64_t num_samples = 0;     // the whole dataset's samples; 0: unknown
  std::string Serialize() const;
  static Result<LoaderState> Deserialize(std::string_view bytes);
};

// Fills state's shard fields for its (epoch, next_batch) under `options`
// (batch_size as delivered), for a source of `num_samples`, and the run's
// order, shuffle window and dataset size.
void DescribeShard(uint64_t num_samples, const LoaderOptions& options, LoaderState* state);

// Whether `state` is one of a run this loader continues: the same seed and,
// where the state says (version 3), the same order, shuffle window and
// dataset size. InvalidArgument naming the option (LoaderOptions::seed) and
// both values otherwise: another run's position would resume other
// batches than those that remained. Resume and PrepareResume check it.
Status CheckStateFits(const LoaderState& state, uint64_t num_samples, const LoaderOptions& options);

// The reshard that resuming `state` at `options`' world size and batch size
// needs, or world_size 0 when Epoch(state.epoch, state.next_batch) resumes
// it (the same world size, share and batch size, or a state without shard
// fields). Another batch size resumes by samples received, not batches (the
// epoch's samples left, split among the same ranks). InvalidArgument for a
// state saved mid-way through a resharded epoch at another world size or
// batch size.
Result<LoaderOptions::Reshard> ReshardFor(const LoaderState& state, const LoaderOptions& options);

// One delivered batch. Move-only; its buffer returns to the loader's pool when
// the Batch is destroyed (the range-for iterator does that when it advances).
// Valid only while its Loader lives.
// A sample of a batch whose decoding the loader left to a device decoder
// (LoaderOptions::defer_decode).
struct EncodedSample {
  uint64_t offset = 0;  // in Batch::buffer()
  // Encoded bytes at offset; 0: the loader decoded the sample itself, and
  // its sample_bytes() of pixels lie at offset.
  uint64_t bytes = 0;
  int32_t height = 0, width = 0;  // the encoded image's size
  // The box to resample to the output size, in the image's pixels: the crop
  // the CPU decoder would take for this (seed, epoch, sample).
  CropRect crop;
};

class Batch {
 public:
  Batch() = default;
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  ~Batch();

  uint64_t epoch() const { return epoch_; }
  uint64_t index() const { return index_; }          // batch index within the epoch
  uint64_t size() const { return indices_.size(); }  // samples (<= batch_size)
  uint64_t sample_bytes() const { return sample_bytes_; }
  const std::vector<uint64_t>& sample_shape() const { return *sample_shape_; }
  // size() x sample_bytes() bytes, sample after sample (pinned when pinned()).
  std::span<const std::byte> images() const { return {data_, size() * sample_bytes_}; }
  std::span<const int64_t> labels() const { return labels_; }     // empty if the source has none
  std::span<const uint64_t> indices() const { return indices_; }  // global sample indices
  bool pinned() const { return pinned_; }

  // The sample's named fields (ChunkSource::fields()); one "images" field
  // for a single-array source. Field f of the batch is contiguous:
  // size() x fields()[f].sample_bytes bytes, sample k of every field at
  // position k (the fields of one sample stay aligned). With one field,
  // field(0) is images().
  // (Empty for a default-constructed or moved-from Batch.) Requires
  // f < fields().size().
  const std::vector<FieldInfo>& fields() const {
    static const std::vector<FieldInfo> kNone;
    return fields_ != nullptr ? *fields_ : kNone;
  }
  std::span<const std::byte> field(size_t f) const {
    const FieldInfo& fi = fields()[f];
    return {data_ + capacity_ * fi.offset, size() * fi.sample_bytes};
  }

  // Deferred decoding (LoaderOptions::defer_decode): one entry per sample,
  // and the buffer they point into; images() is then not pixels. Empty for
  // a batch of decoded samples.
  std::span<const EncodedSample> encoded() const { return encoded_; }
  std::span<const std::byte> buffer() const { return {data_, buffer_bytes_}; }

  struct Slot;  // a pool buffer; defined in loader.cc

 private:
  friend class EpochStream;
  Slot* slot_ = nullptr;
  const std::byte* data_ = nullptr;
  std::span<const int64_t> labels_;
  std::span<const uint64_t> indices_;
  std::span<const EncodedSample> encoded_;
  uint64_t buffer_bytes_ = 0;
  const std::vector<uint64_t>* sample_shape_ = nullptr;
  const std::vector<FieldInfo>* fields_ = nullptr;
  uint64_t capacity_ = 0;  // samples the buffer is laid out for (planar fields)
  uint64_t epoch_ = 0, index_ = 0, sample_bytes_ = 0;
  bool pinned_ = false;
};

struct LoaderStats {
  uint64_t batches = 0, samples = 0;
  uint64_t bytes_delivered = 0;    // image bytes handed to the consumer
  uint64_t chunk_reads = 0;        // chunks read and decoded
  uint64_t bytes_read = 0;         // stored bytes read from the source
  uint64_t bytes_decoded = 0;      // decoded bytes produced
  uint64_t chunk_hits = 0;         // chunk uses served by the cache
  uint64_t chunk_misses = 0;       // chunk uses that needed a read
  uint64_t prefetched = 0;         // reads started ahead of their batch
  uint64_t chunk_shared_hits = 0;  // chunks taken from another stream's cache (the daemon's streams of a file)
  // Chunks read near this epoch's end for the next epoch's first batches
  // (not in chunk_reads: they are the next epoch's, served there as hits).
  uint64_t chunk_reads_ahead = 0;
  // Deferred decoding: samples left encoded for the device, and those the
  // loader decoded itself (the reason of the last such, e.g. "progressive").
  uint64_t deferred_samples = 0, host_decoded_samples = 0;
  std::string host_decode_reason;
  // LoaderOptions::balance_decode: the device-decodable samples decoded here
  // by the share, and the share the last batch used (0..1).
  uint64_t balanced_samples = 0;
  double host_decode_share = 0;
  // Encoded samples that did not decode, replaced (DecodeOptions::skip_corrupt).
  uint64_t skipped_samples = 0;
  // Page faults of the whole process since the stream started (getrusage):
  // minor ones are mostly fresh pages zeroed at first touch (the cost of
  // keeping chunks in a cache in epoch 1), major ones reads from disk.
  uint64_t minor_faults = 0, major_faults = 0;
  // The chunk cache's memory: bytes of decoded-chunk buffers mapped fresh
  // this epoch (each page zeroed by the kernel at its first touch: the
  // first epoch's cost of a cache, and a later epoch's only where buffers
  // are not reused), and the bytes of them mapped now (chunks cached,
  // chunks in flight, buffers kept for reuse). With cache_bytes 0 they stay
  // within the working set's cap and the threads' chunks in flight
  // (CacheBoundBytes): nothing is reserved for a cache.
  uint64_t chunk_bytes_mapped = 0, chunk_bytes_held = 0;
  // The source's ChunkSource::open_costs(), since it was opened (not this
  // epoch's alone): the probe's and the opens' seconds, and the opens (of
  // them, those made from the probe's plan, without HDF5).
  double source_probe_seconds = 0, source_open_seconds = 0;
  uint64_t source_opens = 0, source_planned_opens = 0;
  double plan_seconds = 0;           // busy time per stage, summed over threads
  double fetch_seconds = 0;          // read + decode
  double assemble_seconds = 0;       // copying samples into batches
  double consumer_wait_seconds = 0;  // time Next() waited for a batch
  double wall_seconds = 0;           // since the stream started
  uint64_t queue_depth_sum = 0;      // ready batches seen at each Next()
  double hit_rate() const {
    return chunk_hits + chunk_misses ? double(chunk_hits) / double(chunk_hits + chunk_misses) : 0;
  }
  // Bytes read and decoded per byte delivered (1.0: every chunk once).
  double read_amplification() const { return bytes_delivered ? double(bytes_decoded) / bytes_delivered : 0; }
  double samples_per_second() const { return wall_seconds > 0 ? samples / wall_seconds : 0; }
  double mean_queue_depth() const { return batches ? double(queue_depth_sum) / batches : 0; }
};

class Loader;

// How a bounded wait for a batch ended (EpochStream::NextFor, GpuFeeder::NextFor).
enum class WaitResult {
  kReady,        // a batch, the end of the epoch, or an error is there
  kTimeout,      // the time ran out first; nothing was taken: call again
  kInterrupted,  // Interrupt() ended the wait; nothing was taken
};

// One epoch (from a start batch to its end) of batches, in order.
class EpochStream {
 public:
  EpochStream(EpochStream&&) noexcept;
  EpochStream& operator=(EpochStream&&) noexcept;
  ~EpochStream();  // stops the pipeline if it is still running

  // The next batch; nullopt at the end of the epoch; a Status naming the
  // source, chunk and cause if any stage failed (the stream then ends).
  // Never waits without end: when the consumer holds every batch of the pool
  // (info().pool_slots) and asks for another, which cannot be filled until
  // one is released, it returns InvalidArgument naming the option to raise
  // (prefetch); releasing batches and calling Next() again continues.
  Result<std::optional<Batch>> Next();
  // As Next(), waiting at most `timeout` for the batch: `wait` says whether
  // it came (kReady: `batch`, or nullopt at the end) or the wait ended
  // first (kTimeout, kInterrupted: nothing taken, no batch lost). Errors as
  // Next(). Ends a wait a consumer thread cannot otherwise leave.
  struct Waited {
    WaitResult wait = WaitResult::kReady;
    std::optional<Batch> batch;
  };
  Result<Waited> NextFor(std::chrono::milliseconds timeout);
  // Waits as NextFor and takes nothing: kReady when Next() would return at
  // once.
  WaitResult WaitFor(std::chrono::milliseconds timeout);
  // From any thread: the wait of the current NextFor / WaitFor, or of the
  // next one if none is waiting, ends with kInterrupted (once). Next() is
  // not interrupted.
  void Interrupt();
  uint64_t num_batches() const;  // in the whole epoch, for this rank
  LoaderStats stats() const;

  // Opaque to users: the stream's implementation (a local pipeline, or a
  // RemoteLoader's connection). Declared public only so that gpufeed's own
  // stream kinds can derive from it (loader/stream_impl.h).
  struct Impl;

  // Range-for support. The iterator throws gpufeed::LoaderError (carrying
  // the Status) on failure; use Next() to handle errors as values.
  class Iterator {
   public:
    const Batch& operator*() const { return batch_; }
    const Batch* operator->() const { return &batch_; }
    Iterator& operator++();
    bool operator!=(const Iterator& o) const { return stream_ != o.stream_; }

   private:
    friend class EpochStream;
    EpochStream* stream_ = nullptr;
    Batch batch_;
  };
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  explicit EpochStream(std::unique_ptr<Impl> impl);
  // Builds the Batch view of a filled pool slot (for Impl's kinds).
  // `fields` (may be null: one field of sample_shape) must outlive the batch.
  static Batch MakeBatch(Batch::Slot* slot, uint64_t epoch, uint64_t index, uint64_t count, uint64_t sample_bytes,
                         bool has_labels, const std::vector<uint64_t>* sample_shape,
                         const std::vector<FieldInfo>* fields = nullptr);
  std::unique_ptr<Impl> impl_;
};

// Thrown by EpochStream::Iterator only.
class LoaderError : public std::exception {
 public:
  explicit LoaderError(Status s) : status_(std::move(s)), what_(status_.ToString()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const Status& status() const { return status_; }

 private:
  Status status_;
  std::string what_;
};

// What a batch consumer needs to know about the samples, whoever produces them.
struct BatchSourceInfo {
  std::string name;  // "file.h5:/images", or "unix:/run/gpufeed.sock file.h5:/images" for a remote one
  DType dtype = DType::kUInt8;
  std::vector<uint64_t> sample_shape;
  uint64_t sample_bytes = 0;
  uint64_t num_samples = 0;  // in the whole dataset (all ranks)
  uint64_t batch_size = 0;
  // Batches a consumer may hold at once before the producer must wait for
  // one back (the pool: prefetch + 1). A consumer that holds all of them and
  // asks for more gets an error naming the option to raise.
  uint64_t pool_slots = 0;
  bool has_labels = false;
  // Per-channel mean and std in stored units, when the dataset carries them
  // (gpufeed convert writes them); empty otherwise.
  std::vector<double> mean, stddev;
  // The sample's named fields (ChunkSource::fields()): one "images" field
  // unless the source was opened with named fields. Batches are planar
  // (Batch::field).
  std::vector<FieldInfo> fields;
  // Batches may come with samples left encoded (Batch::encoded(): a Loader
  // with LoaderOptions::defer_decode over an encoded source) for the feed's
  // decode stage; the feed then fills on a worker thread of its own.
  bool encoded_batches = false;
  // Options the source adjusted, for the caller to show ("batch size 100000
  // is larger than the 10000 samples of this rank: using 10000").
  std::vector<std::string> warnings;
};

// Anything that produces EpochStreams: the local Loader, or a RemoteLoader
// that receives the same batches from a `gpufeed serve` daemon. GpuFeeder and
// trainers take a BatchSource&, so either works unchanged. The contracts of
// Epoch() and state() are the Loader's (below).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual EpochStream Epoch(uint64_t epoch, uint64_t start_batch = 0) = 0;
  // Continues where `state` was saved, at this source's world size too
  // (ReshardFor): its epoch from its batch, or the samples its run had not
  // received, split among this run's ranks. The stream fails with
  // InvalidArgument for a state that cannot resume here.
  EpochStream Resume(const LoaderState& state);
  // Resume's first half, for callers that start the epoch themselves (the C
  // API's feed): sets the reshard `state` needs and returns the batch its
  // epoch starts at; InvalidArgument as ReshardFor.
  Result<uint64_t> PrepareResume(const LoaderState& state);
  // The state's position (epoch, next_batch) with its shard fields.
  virtual LoaderState state() const = 0;
  // The sharding options (rank, world size, drop_last, batch size as
  // delivered, a pending reshard) the epochs are cut with.
  virtual LoaderOptions sharding() const = 0;
  // Epoch r.epoch continues a run saved at r.world_size ranks (Resume sets
  // it; world_size 0 clears it). Takes effect at the next Epoch(); a change
  // ends a running local stream (its look-ahead reads the next epoch's plan,
  // which the change remakes), setting what is already set changes nothing.
  // Not concurrent with the stream's Next().
  virtual void SetReshard(const LoaderOptions::Reshard& r) = 0;
  virtual const BatchSourceInfo& info() const = 0;
  virtual uint64_t num_batches() const = 0;  // per epoch, for this rank
  // The feed's decode stage reports how many samples a second its device
  // decoder takes (its time in the decode call, per sample), for
  // LoaderOptions::balance_decode. Any thread. Sources that decode nothing
  // for a device ignore it.
  virtual void ReportDeviceDecodeRate(double samples_per_second) { (void)samples_per_second; }
  // Starts making what the first epoch needs before it is asked for, while
  // the caller builds its model: the local Loader's batch buffers (in the
  // background) and epoch 0's plan. The first Epoch() does it anyway; this
  // only moves it earlier. Not concurrent with Epoch().
  virtual void Warm() {}
};

class Loader : public BatchSource {
 public:
  // `source` must outlive the Loader. Options are checked when an epoch
  // starts (Epoch() fails the stream with InvalidArgument on bad options).
  Loader(const ChunkSource& source, const LoaderOptions& options);
  ~Loader() override;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts epoch `epoch` at batch `start_batch` (resume). Only one stream may
  // be alive at a time; starting another ends the previous one.
  EpochStream Epoch(uint64_t epoch, uint64_t start_batch = 0) override;

  // Where the consumer is: the epoch of the last stream and how many of its
  // batches were received.
  LoaderState state() const override;
  LoaderOptions sharding() const override;
  void SetReshard(const LoaderOptions::Reshard& r) override;
  // The source's shape, dtype, labels and (for a Dataset) mean/std, and the
  // batch size; fixed at construction.
  const BatchSourceInfo& info() const override;
  uint64_t num_batches() const override;  // per epoch, for this rank
  void ReportDeviceDecodeRate(double samples_per_second) override;
  void Warm() override;
  const LoaderOptions& options() const;
  const ChunkSource& source() const;
  uint64_t batch_bytes() const;

 private:
  friend struct LocalStream;     // loader.cc: the local pipeline's stream
  friend struct LoaderInternal;  // loader/batch_pool.h: the daemon's shared-memory pool
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_LOADER_H_
