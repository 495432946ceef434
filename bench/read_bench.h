// `gpufeed bench read`: decodes every chunk of a dataset on the direct path,
// on one thread and on N, and in the same run with HDF5's H5Dread on one
// thread (the baseline: what h5py does with a well-sized chunk cache). Every
// pass, timed or not, hashes every sample's bytes, and each pass's hashes
// must equal the HDF5 reference's before a figure is printed. Each figure is
// the median of `repeats` passes; the like-for-like ratio is one thread
// against one thread, the other says its thread counts.
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
  double direct_seconds = 0;             // `threads` threads, median of the timed passes
  double direct_one_thread_seconds = 0;  // one thread, median
  double baseline_seconds = 0;           // HDF5 H5Dread, one thread, median
  uint64_t checksum = 0;                 // combined per-sample hash, equal on every pass
  int verified_passes = 0;               // passes whose every sample's hash was compared
  double direct_samples_per_s() const { return samples / direct_seconds; }
  double baseline_samples_per_s() const { return samples / baseline_seconds; }
  double direct_gb_per_s() const { return raw_bytes / direct_seconds / 1e9; }
  double speedup() const { return baseline_seconds / direct_seconds; }                        // N threads vs HDF5's one
  double one_thread_speedup() const { return baseline_seconds / direct_one_thread_seconds; }  // like for like
};

// Fails (Corrupt) if any pass's sample differs from HDF5's.
Result<ReadBenchResult> RunReadBench(const ReadBenchOptions& options);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_READ_BENCH_H_
