// Dataset: read access to a sample array stored in HDF5, in units of "chunks"
// (runs of whole consecutive samples), without taking the HDF5 global lock on
// the hot path.
//
// The common case (a dataset chunked along axis 0 only, filtered by any of
// shuffle / deflate / zstd, or stored contiguously) takes the *direct* path:
// Open() reads the chunk index once through HDF5; ReadChunk() then pread()s the
// raw chunk bytes and runs the filters in the calling thread, so N threads
// decode N chunks at once. Anything else (chunks that split samples, other
// filters, big-endian data, unallocated chunks) takes the *hdf5* path: H5Dread
// through a chunk cache sized for the access. Both return identical bytes; the
// path taken is reported by info().read_path with its reason.
//
// Example:
//   auto ds = gpufeed::Dataset::Open("train.h5");          // /images, /labels
//   if (!ds.ok()) { fprintf(stderr, "%s\n", ds.status().ToString().c_str()); }
//   std::vector<std::byte> buf(ds->chunk_bytes_max());
//   gpufeed::Status s = ds->ReadChunk(0, buf);
#ifndef GPUFEED_DATASET_H_
#define GPUFEED_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dtype.h"
#include "gpufeed/logger.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// Where the samples live. Parsed from "file.h5" or "file.h5:/path/to/images".
struct DatasetSpec {
  std::string file;
  std::string images = "/images";  // default dataset path

  // Splits at the last ':' that is followed by '/', so "C:/x.h5" style paths
  // and paths with ':' in a file name keep working. Fails on an empty file.
  static Result<DatasetSpec> Parse(std::string_view spec);
};

// ReadPath and IoMode, and their names: gpufeed/names.h.

struct OpenOptions {
  // Labels dataset. Empty: "/labels" if the file has it, else no labels.
  // Named explicitly: it must exist. "none": ignore labels.
  std::string labels_path;
  // Byte budget for HDF5's chunk cache on the hdf5 path (per dataset). The
  // cache is grown if one read unit's chunks would not fit, since a cache
  // smaller than that re-decodes every chunk for every sample (h5py's
  // 1 MiB default is what makes it ~100x slower on 11 MB chunks).
  size_t hdf5_cache_bytes = 64u << 20;
  // Forces the hdf5 path even where the direct path applies (for tests and
  // for comparing the two).
  bool force_hdf5_path = false;
  // HDF5's metadata parser can crash or hang on damaged or hostile files, so
  // Open first opens the file in a forked probe process with a time limit;
  // a crash or timeout there becomes a Corrupt status ("HDF5 crashed reading
  // this file's metadata") instead of taking this process down. The probe
  // costs a fork and a second open (milliseconds); true skips it, for files
  // you trust (CLI: --trust-files; environment: GPUFEED_TRUST_FILES=1).
  bool trust_files = false;
  int probe_timeout_ms = 10000;
  // Direct-path I/O (IoMode above). The environment variable GPUFEED_IO
  // (auto|direct|buffered) overrides kAuto, so the C API, Python and the
  // daemon take it without an option of their own (CLI: --io).
  IoMode io = IoMode::kAuto;
  // Named fields, "NAME=/hdf5/path", in the order batches carry them (CLI:
  // --field NAME=/path, repeatable). Empty: the single images array of the
  // spec (and /labels) as before. Non-empty, or a data spec naming many
  // files, opens a FieldSource (fields.h) instead of a Dataset.
  std::vector<std::string> fields;
  // FieldSource: files whose descriptors may be open at once (with virtual
  // fields: runs of samples read from one dataset per field, fields.h); the
  // least recently used one is closed beyond it (and reopened when read again).
  // Lowered to what half the free room under RLIMIT_NOFILE allows (each open
  // field holds about 2 descriptors).
  int max_open_files = 256;
  // Each file holds one sample and its datasets have no sample axis
  // (DeepCAM's reference files: /climate/data is [768, 1152, 16] float32,
  // one sample). The whole dataset is then the sample, behind an axis 0 of
  // extent 1; /labels is not looked for (name a label as a field, or
  // labels_path a one-element dataset). CLI: --no-sample-axis.
  bool no_sample_axis = false;
  // Directories, besides the dataset file's own, that the files a dataset
  // names may lie in: its external raw-data files (HDF5's H5Pset_external),
  // its virtual-dataset sources and the file an external link leads to. Each
  // is judged by its real path (symbolic links by their target); one
  // outside every allowed directory fails Open with InvalidArgument naming
  // it and this option, before any byte is read. Default: none, so a
  // hostile file cannot make gpufeed (or a daemon serving it) read
  // /etc/passwd. "/" allows everything. Also taken from the environment
  // variable GPUFEED_ALLOW_PATHS (DIR:DIR...), which the CLI's
  // --allow-paths sets for every command (docs/reliability.md, "Security").
  std::vector<std::string> allow_paths;
  // Where opening says what is no error (direct I/O unavailable, a stats
  // sidecar that does not match the file); null: stderr (gpufeed/logger.h).
  std::shared_ptr<Logger> logger;
};

struct FilterInfo {
  int id = 0;                    // HDF5 filter id: 1 deflate, 2 shuffle, 32015 zstd
  std::string name;              // "deflate", "shuffle", "zstd", or HDF5's name
  std::vector<unsigned> params;  // the filter's client data (level, element size)
};

// One source of an HDF5 virtual dataset (VDS) as gpufeed reads it: a range
// of the virtual dataset's sample axis (axis 0) mapped from a range of the
// source dataset's axis 0, every other axis whole (docs/format.md, "Virtual
// datasets").
struct VirtualSource {
  std::string file;           // resolved as HDF5 does ("." is the virtual dataset's own file)
  std::string dataset;        // path of the source dataset in `file`
  uint64_t first = 0;         // first sample of the virtual dataset it holds
  uint64_t count = 0;         // samples it holds (>= 1)
  uint64_t source_first = 0;  // where they start on the source's axis 0 (0 when stacked)
  // The source has no sample axis: it is one whole sample (h5py's
  // VirtualLayout stacking files along a new axis 0); count is then 1.
  bool stacked = false;
};

// A spec whose file HDF5's parser has met in the forked probe of this
// process and survived (or whose files the user trusts:
// OpenOptions::trust_files). Only the probe issues one (hdf5io/hdf5/probe.h:
// Probe, ProbeAll), so "already probed" is a value that cannot be forged by
// setting an option: the opens that take one (Dataset::Open,
// OpenEncodedImages, FieldSource::Open) do not probe again.
class ProbedSpec {
 public:
  const std::string& text() const { return text_; }
  // The dataset `name` inside the probed group: an encoded image field's
  // byte dataset, which the probe opens with the field.
  ProbedSpec Member(std::string_view name) const;

 private:
  friend struct ProbedSpecIssuer;  // hdf5io/hdf5/probe.cc
  explicit ProbedSpec(std::string text) : text_(std::move(text)) {}
  std::string text_;
};

// Everything `gpufeed inspect` shows about a dataset; fixed at Open().
struct DatasetInfo {
  std::string file;
  std::string images_path;
  std::string labels_path;      // empty when the dataset has no labels
  std::vector<uint64_t> shape;  // [N, sample dims...]
  std::string storage;          // "chunked", "contiguous", "compact" or "virtual"
  // A virtual dataset's sources, in sample order, tiling [0, N) exactly
  // (checked at Open; every source file exists and agrees in dtype and
  // shape). Empty for a dataset that is not virtual. The Dataset itself
  // reads a virtual dataset through HDF5 (the hdf5 path); the loader reads
  // each source directly (FieldSource).
  std::vector<VirtualSource> virtual_sources;
  std::vector<uint64_t> hdf5_chunk_shape;  // empty unless chunked
  std::vector<FilterInfo> filters;         // in pipeline (write) order
  uint64_t stored_bytes = 0;               // bytes on disk for the images
  uint64_t raw_bytes = 0;                  // N * sample bytes
  ReadPath read_path = ReadPath::kDirect;
  std::string read_path_reason;  // why the hdf5 path was taken, if it was
  // Non-empty when no sample can be read: a filter neither the direct path
  // nor any HDF5 plugin here decodes ("filter 32000 (lzf) is not
  // available: ..."). Open still describes the dataset; every read returns
  // Unsupported with this text.
  std::string unreadable;
  // The direct path's I/O as resolved at Open ("direct" or "buffered"; empty
  // on the hdf5 path), and why when it is not what was asked (auto's choice,
  // or O_DIRECT refused and the fallback to pread).
  std::string io;
  // Opened with OpenOptions::no_sample_axis: shape[0] (1) is not in the file.
  bool no_sample_axis = false;
  std::string io_note;
  // Direct I/O's io_uring read-ahead: chunks read ahead of the loader, each
  // in a buffer of the largest chunk's size (0: none). One per hardware
  // thread (4 to 32), so every decoding thread finds its next chunk read.
  // A remote object: its window when opened (it moves with the link;
  // Dataset::read_ahead_chunks() says what it is now).
  uint32_t read_ahead_chunks = 0;
  bool big_endian = false;
  // An HDF5 enum's members, "NAME=value" (the samples are its integer base
  // type, as h5py reads them); empty for other types. h5py's bool (an enum
  // FALSE/TRUE) reads as uint8 with Dataset::is_bool().
  std::vector<std::string> enum_members;
  // Optional attributes of the images dataset (empty when absent).
  std::string layout;  // "NCHW", "NHWC", ...
  std::vector<std::string> class_names;
  std::vector<double> mean;  // per channel, in stored units (0..255)
  std::vector<double> stddev;
  // Where mean/std came from: "attributes", the sidecar's path (a read-only
  // file's statistics: gpufeed/stats.h), or "" (none).
  std::string stats_from;
};

struct SpecFacts;   // hdf5io/hdf5/probe.h: what a probe child saw of a spec
struct DirectPlan;  // hdf5io/hdf5/probe.h: the direct path's reads, as a probe child planned them

// A read-only view of one images dataset and its labels.
//
// Thread safety: every const member may be called from any number of threads
// at once, ReadChunk included. A Dataset is movable, not copyable; it owns
// its file descriptor and HDF5 handles and closes them on destruction.
class Dataset final : public ChunkSource {
 public:
  // Opens `spec` ("file.h5" or "file.h5:/path"). Fails with NotFound (no file,
  // no dataset — the message lists the datasets the file has), Corrupt (not
  // HDF5, truncated), Unsupported (non-numeric dtype, rank < 1) or
  // InvalidArgument (labels count != samples, labels not integers).
  static Result<Dataset> Open(std::string_view spec, const OpenOptions& options = {});
  // As above, for a spec through the probe already: no second probe.
  static Result<Dataset> Open(const ProbedSpec& spec, const OpenOptions& options = {});
  // Opens `spec` from what a probe child saw and planned of it (facts.plan):
  // the file with open(2), no HDF5 in this process, when it is still the
  // file the child parsed (FileIdentity: device, inode, size, times). When
  // it is not, *changed is set and an error returned: the caller opens it
  // with Open instead. No labels (OpenOptions::labels_path is not read).
  static Result<Dataset> OpenPlanned(const ProbedSpec& spec, const SpecFacts& facts, const OpenOptions& options,
                                     bool* changed);
  // What OpenPlanned reads by, for the probe child to hand over; false when
  // there is none: the hdf5 path, a virtual or unreadable dataset.
  bool Plan(DirectPlan* out) const;

  Dataset(Dataset&&) noexcept;
  Dataset& operator=(Dataset&&) noexcept;
  ~Dataset() override;

  uint64_t num_samples() const override;
  const std::vector<uint64_t>& sample_shape() const override;  // shape without axis 0
  uint64_t sample_bytes() const override;                      // product of sample_shape * dtype size
  DType dtype() const override;                                // element type as stored (native byte order)

  // The read unit: chunk i holds samples [i * chunk_samples(), ...), the last
  // one possibly fewer. On the direct path of a chunked file this is the
  // file's own chunking; for a contiguous file, about 4 MiB of samples.
  uint64_t chunk_samples() const override;
  uint64_t num_chunks() const override;
  uint64_t samples_in_chunk(uint64_t i) const override;
  uint64_t chunk_bytes_max() const { return chunk_samples() * sample_bytes(); }
  // Bytes the chunk occupies in the file (compressed size); for read
  // amplification figures. On the hdf5 path, an estimate (raw size).
  uint64_t stored_chunk_bytes(uint64_t i) const override;

  // Decodes chunk i into dst[0, samples_in_chunk(i) * sample_bytes()).
  // Requires i < num_chunks() and dst large enough. Returns Corrupt naming the
  // file, dataset and chunk when bytes are missing (short read) or fail to
  // decompress, or decompress to the wrong size. Thread-safe.
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override;
  // Buffered I/O: posix_fadvise(WILLNEED) over chunk i's stored bytes, so the
  // kernel reads it while earlier chunks decode. Direct I/O: starts its read
  // in the io_uring read-ahead (info().read_ahead_chunks deep), which
  // ReadChunk(i) then takes.
  void WillRead(uint64_t i) const override;
  uint32_t read_ahead_chunks() const override;

  // Decodes samples [first, first + count) into dst (count * sample_bytes()),
  // crossing chunk boundaries as needed. Thread-safe. For rechunking.
  Status ReadSamples(uint64_t first, uint64_t count, std::span<std::byte> dst) const;

  bool has_labels() const;
  // One label per sample, widened to int64; empty when !has_labels().
  const std::vector<int64_t>& labels() const override;
  std::string name() const override;  // "file.h5:/images"

  const DatasetInfo& info() const;
  // info()'s layout, class names, mean and std.
  SourceAttributes attributes() const override;
  // True when the images dataset is h5py's bool (an int8 enum FALSE/TRUE),
  // read as uint8 0/1.
  bool is_bool() const;

 private:
  struct Impl;
  explicit Dataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_DATASET_H_
