// Scientific workloads of docs/benchmarks.md, Workloads, written with HDF5 as the
// reference codes store them:
//   deepcam:   one file per sample, /climate/data [1, 16, H, W] float32 and
//              /climate/labels_0 [1, H, W] int32 in {0, 1, 2}, contiguous
//              (uncompressed, as h5py writes by default). H x W = 768 x 1152
//              divided by `scale`.
//   cosmoflow: `per_file` samples per file, /x [n, 4, D, D, D] int16 (D =
//              128 / scale) chunked one sample a chunk with deflate level 4,
//              and /y [n, 4] float32 targets.
// Deterministic in (seed, sample index); every field of sample k encodes k
// (data[0] == k, labels[0] == k % 3, x[0] == k % 32768, y[0] == k) so a
// reader can check order and alignment.
#ifndef GPUFEED_BENCH_SCI_WORKLOADS_H_
#define GPUFEED_BENCH_SCI_WORKLOADS_H_

#include <cstdint>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed::bench {

struct SciGenOptions {
  std::string workload;  // "deepcam" or "cosmoflow"
  std::string output;    // a directory (created)
  uint64_t samples = 64;
  uint64_t scale = 1;      // spatial size divided by this
  uint64_t per_file = 16;  // cosmoflow: samples per file
  uint64_t seed = 1;
  int threads = 0;  // 0: all cores
};

struct SciGenResult {
  uint64_t files = 0, samples = 0, raw_bytes = 0, file_bytes = 0;
  std::string fields;  // "--field data=/climate/data --field labels=/climate/labels_0"
};

bool IsSciWorkload(const std::string& name);
Result<SciGenResult> GenerateSciWorkload(const SciGenOptions& options);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_SCI_WORKLOADS_H_
