// FieldSource: samples made of several named fields (HDF5 datasets sharing
// the sample axis), spread over one file or many. What scientific data looks
// like: DeepCAM's sample is a 16 x 768 x 1152 float32 field plus a 768 x
// 1152 mask in one file per sample; CosmoFlow's is a 4 x 128^3 volume plus 4
// targets, many samples per file.
//
//   gpufeed::OpenOptions o;
//   o.fields = {"data=/climate/data", "mask=/climate/labels_0"};
//   auto src = gpufeed::FieldSource::Open("deepcam/*.h5", o);
//   gpufeed::Loader loader(**src, {.batch_size = 8});
//   for (const gpufeed::Batch& b : loader.Epoch(0)) { use(b.field(0), b.field(1)); }
//
// Files. The input is one file, a glob ("data/*.h5", sorted by name), a
// directory (its *.h5 / *.hdf5 / *.hdf / *.nc files, sorted) or a text file
// (*.txt, *.list) listing one path per line (relative paths are relative to
// the list; '#' starts a comment). Samples are numbered through the files
// in that order. Every file must have every field with the same dtype and
// sample shape as the first file; the fields of one file must have the same
// number of samples. Open checks all of that and names the first file that
// differs.
//
// Reading. Each field is a Dataset (direct path or HDF5 fallback, as
// dataset.h describes). The read unit is the chunking of the largest field
// (by sample bytes), cut so that no unit spans two files: a one-sample file
// is a one-sample unit, so the chunk-aware order reads each file once per
// epoch. At most OpenOptions::max_open_files files hold descriptors at once
// (least recently used closed first); a file reopened later is checked
// against what Open saw, and a file that vanished is an error naming it and
// the unit.
//
// Many files. Open probes every (file, field) in a few processes, which
// report what they saw; it opens only the first file itself, and places the
// others from those reports (a file whose report is missing, or whose field
// is virtual, it opens). Each file is opened by its first read, which checks
// it against what Open saw. Where the report also holds the direct path's
// reads of every field (small files: hdf5io/hdf5/probe.h, DirectPlan), a reader
// opens the file itself with open(2), no HDF5, if it is still the file the
// probe parsed. Otherwise one thread of the source opens files: a reader
// whose file is not open asks it and waits (HDF5 opens one file at a time in
// a process). Between requests that thread opens the files of the units
// WillRead announces, at most max_open_files / 2 ahead of their reads.
//
// Virtual datasets. A field that is an HDF5 virtual dataset (h5py's
// VirtualLayout: sources concatenated or stacked along axis 0) is read from
// its sources (DatasetInfo::virtual_sources), each a Dataset of its own;
// read units are also cut at every source boundary of every field, and the
// descriptor bound counts such runs ("parts") instead of files.
//
// Thread safety: every const member may be called from any number of
// threads at once (ReadChunk included).
#ifndef GPUFEED_FIELDS_H_
#define GPUFEED_FIELDS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dataset.h"
#include "gpufeed/field_spec.h"
#include "gpufeed/file_list.h"
#include "gpufeed/status.h"

namespace gpufeed {

class FieldSource final : public ChunkSource {
 public:
  // Opens `data` (one file, glob, directory or list) with options.fields
  // (empty: images=/images, plus labels=/labels when the first file has it).
  // Errors: NotFound (no files, a missing field: names the file), and
  // InvalidArgument for fields of different lengths (names both) or a file
  // that disagrees with the first (names it, the field and both shapes).
  static Result<std::unique_ptr<FieldSource>> Open(std::string_view data, const OpenOptions& options = {});
  // As above, where some (file, field) specs have been through the probe
  // already (the door's): only the others are probed.
  static Result<std::unique_ptr<FieldSource>> Open(std::string_view data, const OpenOptions& options,
                                                   std::vector<ProbedSpec> probed);
  ~FieldSource() override;

  // A source of some of these fields (by name, in the order given) over the
  // same files, which are not probed again. NotFound for a name not here.
  Result<std::unique_ptr<FieldSource>> Select(const std::vector<std::string>& names) const;
  // Field `field`'s dataset in file `file` (its storage: filters, chunking,
  // layout), opened afresh without a second probe.
  Result<Dataset> OpenField(size_t field, size_t file = 0) const;

  uint64_t num_samples() const override;
  // One field: its shape and dtype. Several: [sample_bytes()] of uint8 (the
  // fields are described by fields()).
  const std::vector<uint64_t>& sample_shape() const override;
  uint64_t sample_bytes() const override;  // every field's sample bytes, summed
  DType dtype() const override;
  uint64_t chunk_samples() const override;
  uint64_t num_chunks() const override;
  uint64_t samples_in_chunk(uint64_t i) const override;
  uint64_t stored_chunk_bytes(uint64_t i) const override;  // decoded size (an estimate)
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override;
  // Opens unit i's files ahead of its read, on a thread of this source's
  // (within max_open_files), and passes the hint on to their datasets.
  void WillRead(uint64_t i) const override;
  const std::vector<int64_t>& labels() const override;  // empty: labels are a field here
  std::string name() const override;
  std::vector<FieldInfo> fields() const override;
  SourceAttributes attributes() const override;  // the first file's first field's

  const std::vector<std::string>& files() const;
  // Which file sample `index` is in, and its index there.
  std::pair<size_t, uint64_t> Locate(uint64_t index) const;
  // Descriptors' files open now (<= max_open_files); for tests.
  size_t open_files() const;
  OpenCosts open_costs() const override;

  struct Impl;

 private:
  explicit FieldSource(std::unique_ptr<Impl> impl);
  // Open, with `seed` holding the specs (and the probe's facts) known already.
  static Result<std::unique_ptr<FieldSource>> OpenSeeded(std::string_view data, const OpenOptions& options,
                                                         std::unique_ptr<Impl> seed);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_FIELDS_H_
