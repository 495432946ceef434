// The metadata probe: HDF5's own parser can crash or hang on damaged or
// hostile files (the HDF Group's CVE corpus has dozens), and gpufeed cannot
// fix HDF5. So the first open of a file runs in forked probe processes with a
// time limit: a child opens it exactly as Dataset::Open does (metadata,
// attributes gpufeed reads, labels, chunk index, and the first chunk when
// HDF5 itself would decode it) and exits. A child that dies of a signal or
// overruns the limit becomes a Status naming the file, and the caller's
// process never touches it. docs/practices.md, practice 19.
//
// Many files are probed in one pass by a few processes (not a fork per
// file): each child walks a share of the list and reports each file's start
// and end on a pipe, so a crash names its file and a fresh child continues
// after it. A child restarts HDF5 only at the end of its share (a restart
// costs as much as opening a small file); when one crashes or hangs after
// other files, the files it had probed are probed again with HDF5 restarted
// after each, so that the file named is the one HDF5 failed on, not one
// that follows what an earlier file left in the library (a file whose
// handles crash HDF5 only at its shutdown, cve-2025-6269-1, is caught so).
// A hang after other files therefore costs the time limit twice.
#ifndef GPUFEED_HDF5_PROBE_H_
#define GPUFEED_HDF5_PROBE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hdf5io/codec/codec.h"
#include "gpufeed/dataset.h"
#include "gpufeed/status.h"
#include "hdf5io/io/file.h"

namespace gpufeed {

// The direct path's reads of a dataset as the probe child that opened it
// planned them: where each chunk is, its stored size and filter mask, and
// the filters. With it the caller reads the dataset with pread alone
// (Dataset::OpenPlanned), while the file is still `identity`.
struct DirectPlan {
  io::FileIdentity identity;  // the file the child parsed
  bool contiguous = false;
  uint64_t contiguous_addr = 0;  // contiguous: the data's first byte
  uint64_t chunk_samples = 1;    // chunked: the file's chunk extent on axis 0
  std::vector<codec::FilterStep> pipeline;
  std::vector<uint64_t> chunk_addr, chunk_size;  // chunked: absolute offsets, stored bytes
  std::vector<uint32_t> chunk_mask;              // chunked: HDF5's filter masks
};

// What a probe child saw of a spec it opened as a Dataset: enough for
// FieldSource to place a file's samples without opening the file itself
// (it checks them again when it does open it, before reading).
struct SpecFacts {
  DType dtype = DType::kUInt8;
  bool is_bool = false;
  bool is_virtual = false;  // a virtual dataset: its sources are opened by the caller
  uint64_t num_samples = 0;
  std::vector<uint64_t> sample_shape;
  // The direct path's plan, for a dataset whose chunks fit in the child's
  // report (a small file: where opening through HDF5 costs more than
  // reading it); null otherwise. Checked for form, order and bounds by the
  // parent before it is kept.
  std::shared_ptr<const DirectPlan> plan;
};

struct ProbeOptions {
  OpenOptions open;        // how the children open each spec (and whether the caller trusts files)
  int timeout_ms = 10000;  // per file
  int processes = 4;       // children at once (at most one per file)
};

// One Status per spec, in order: Ok when HDF5 survived the file (its own
// errors, if any, are left for the real Open to report), Corrupt when the
// child crashed or hung on it.
// facts (when given): one per spec, set for each spec a child opened as a
// Dataset (an encoded image group, or a file HDF5 or gpufeed refuses, has
// none: the caller's own open reports it).
std::vector<Status> ProbeFiles(const std::vector<std::string>& specs, const ProbeOptions& options = {},
                               std::vector<std::optional<SpecFacts>>* facts = nullptr);

// Specs this process has sent through ProbeFiles so far (for the tests that
// check a file is probed once).
uint64_t SpecsProbed();

// Whether the caller trusts HDF5 files: OpenOptions::trust_files, or
// GPUFEED_TRUST_FILES=1 in the environment (what `gpufeed --trust-files`
// sets). Every probe site asks this one function.
bool TrustFiles(const OpenOptions& open);

// One spec through one probe process (none when TrustFiles(open)): the
// ProbedSpec the trusted opens take, or the probe's Corrupt error.
Result<ProbedSpec> Probe(const std::string& spec, const OpenOptions& open);

// Many specs through the probe processes in one pass (ProbeFiles; none when
// TrustFiles(options.open)): one result per spec, in order; facts as
// ProbeFiles's (none at all when the files are trusted: nothing probed).
std::vector<Result<ProbedSpec>> ProbeAll(const std::vector<std::string>& specs, const ProbeOptions& options,
                                         std::vector<std::optional<SpecFacts>>* facts = nullptr);

// The datasets of `file` ("/a", "/g/b"), listed by HDF5 in a forked child
// with a time limit: a listing walks every object header of the file, which
// the probe's open never does, and HDF5's own link decoding has overflowed
// the heap on hostile files (CVE-2018-13869, -13870, -13871, -16438) without crashing the
// probe but aborting a later free. Only error messages use it. Corrupt, naming
// the file, when the child crashed or hung; at most `max_bytes` of names.
Result<std::vector<std::string>> ListDatasetsIsolated(const std::string& file, int timeout_ms,
                                                      size_t max_bytes = 64 << 10);

}  // namespace gpufeed

#endif  // GPUFEED_HDF5_PROBE_H_
