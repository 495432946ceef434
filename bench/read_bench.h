// `gpufeed bench read`: decodes every chunk of a dataset with N threads on the
// direct path and, in the same run, with HDF5's H5Dread on one thread (the
// baseline: what h5py does with a well-sized chunk cache). Every sample's
// bytes are hashed on both paths and must match before a figure is printed.
#ifndef GPUFEED_BENCH_READ_BENCH_H_
#define GPUFEED_BENCH_READ_BENCH_H_

#include <cstdint>
#include <string>

#include "gpufeed/status.h"

namespace gpufeed::bench {

struct ReadBenchOptions {
  std::string data;  // dataset spec
  int threads = 0;   // 0: all hardware threads
  int repeats = 3;   // timed passes of the direct path; the median is reported
};

struct ReadBenchResult {
  std::string read_path;  // path the dataset takes
  uint64_t samples = 0;
  uint64_t raw_bytes = 0;     // decoded bytes per pass
  uint64_t stored_bytes = 0;  // bytes read from the file per pass
  int threads = 0;
  double direct_seconds = 0;    // median of the timed passes
  double baseline_seconds = 0;  // HDF5 H5Dread, one thread, one pass
  uint64_t checksum = 0;        // combined per-sample hash, equal on both paths
  double direct_samples_per_s() const { return samples / direct_seconds; }
  double baseline_samples_per_s() const { return samples / baseline_seconds; }
  double direct_gb_per_s() const { return raw_bytes / direct_seconds / 1e9; }
  double speedup() const { return baseline_seconds / direct_seconds; }
};

// Fails (Corrupt) if any sample differs between the two paths.
Result<ReadBenchResult> RunReadBench(const ReadBenchOptions& options);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_READ_BENCH_H_
