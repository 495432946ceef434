// `gpufeed bench loader`: runs the Loader over a dataset as a consumer that
// does nothing, then checks what it delivered — a whole epoch: every sample
// exactly once (indices and an index/label checksum); --batches: no index
// twice and the count; a rank of several: its share without a repeat and the
// union of every rank's share (the others run after the timed epochs) —,
// labels equal to the file's, spot-checked bytes equal to a direct read, and
// only then reports samples/s, GB/s, the stage breakdown and the cache
// figures.
#ifndef GPUFEED_BENCH_LOADER_BENCH_H_
#define GPUFEED_BENCH_LOADER_BENCH_H_

#include <optional>
#include <string>
#include <vector>

#include "gpufeed/dataset.h"
#include "gpufeed/loader.h"
#include "gpufeed/open_source.h"

namespace gpufeed::bench {

struct LoaderBenchOptions {
  // A dataset spec, or a daemon address ("unix:PATH", "tcp://HOST:PORT")
  // with the dataset to read there (empty: the daemon's first) and its token.
  std::string data;
  std::string dataset, token_file;
  LoaderOptions loader;
  OpenOptions open;      // named fields, many files (a local --data)
  DecodeOptions decode;  // an encoded image dataset's output (gpufeed/encoded.h)
  uint64_t batches = 0;  // 0: the whole epoch
  uint64_t epoch = 0;    // the first epoch run
  // Epochs run back to back on one Loader; the figures are the last one's
  // (the first pays for threads, the pool's first touch and cold caches).
  int epochs = 2;
  // Cold data (--cold): before each epoch the file's pages are dropped from
  // the page cache (posix_fadvise DONTNEED, checked with mincore), and after
  // the last epoch the device's sequential O_DIRECT read rate of the same
  // file is measured: the ceiling the cold figures are compared with.
  bool cold = false;
};

struct LoaderBenchEpoch {
  uint64_t epoch = 0;
  uint64_t samples = 0;
  double seconds = 0;  // Epoch() to its last batch
  LoaderStats stats;   // this epoch's: chunk reads, reads ahead, hits, bytes decoded
  // --cold: the share of the file in the page cache when the epoch started
  // (after eviction) and when it ended (growth: what the epoch cached).
  double resident_before = -1, resident_after = -1;
};

struct LoaderBenchResult {
  std::vector<LoaderBenchEpoch> epochs;  // every epoch run, in order
  LoaderStats stats;
  uint64_t samples = 0;
  uint64_t sample_bytes = 0;
  uint64_t batch_size = 0;                     // as the loader ran it (clamped to the dataset)
  double seconds = 0;                          // the last epoch: Epoch() to its last batch
  double first_epoch_seconds = 0;              // the first epoch, start-up included
  double first_batch_seconds = 0;              // the last epoch: Epoch() to its first batch
  double open_seconds = 0;                     // opening the data (the files' probe and opens, the loader made)
  double first_epoch_first_batch_seconds = 0;  // the first epoch: Epoch() to its first batch
  uint64_t spot_checked = 0;                   // samples whose bytes were compared with a direct read (or decode)
  bool encoded = false;                        // an encoded image dataset, decoded by the loader
  uint64_t stored_bytes = 0;                   // encoded: the files' bytes the epoch decoded from
  uint64_t skipped = 0;                        // encoded: corrupt samples replaced (--skip-corrupt)
  // encoded: the ceiling, measured in the same run after the epochs:
  // libjpeg-turbo's full-size decode on one core (samples/s) x threads.
  double decode_one_core_per_s = 0;
  double transform_one_core_per_s = 0;
  double parallel_decode_per_s = 0;  // full-size decodes on `threads` threads at once, right after the epochs  //
                                     // gpufeed's decode + transform, same files, same core, interleaved
  uint64_t ceiling_samples = 0;
  double ceiling_per_s(int threads) const { return decode_one_core_per_s * threads; }
  bool bytes_verified = false;  // false: a daemon whose file this host cannot read (indices checked only)
  bool full_epoch = false;
  // What the last epoch's indices were checked for, in words
  // (DescribeCoverage): "every index once", "no index doubled (250 of 2000
  // samples)", with ranks "...; the union of 4 ranks: every index, 2 padded
  // repeats" (bench_checks.h).
  std::string coverage;
  bool checksum_checked = false;      // the index/label checksum against the file's (a whole epoch of one rank)
  std::vector<std::string> warnings;  // options the loader adjusted (Loader::info().warnings)
  uint64_t max_rss_bytes = 0;         // peak resident memory of the process
  uint64_t rss_before_bytes = 0;      // resident before the Loader existed (code, libraries, the index)
  uint64_t memory_bound_bytes = 0;    // CacheBoundBytes + (prefetch + 1) x batch + threads x chunk (docs: loader.h)
  // --cold: the file read, its size, the dataset's I/O mode ("direct" or
  // "buffered", with the fallback note) and the O_DIRECT sequential ceiling.
  std::string file, io, io_note;
  uint64_t file_bytes = 0;
  double ceiling_gb_per_s = 0;                // 0: not measured (O_DIRECT refused: see ceiling_note)
  std::vector<double> ceiling_runs_gb_per_s;  // before and after the epochs; the ceiling is the larger
  std::string ceiling_note;
  double samples_per_s() const { return samples / seconds; }
  double gb_per_s() const { return samples * double(sample_bytes) / seconds / 1e9; }
};

Result<LoaderBenchResult> RunLoaderBench(const LoaderBenchOptions& options);

// The benches' source: a file or a daemon address (--data, --dataset,
// --token-file), the stream named `client_name` in the daemon's logs.
Result<std::unique_ptr<OpenedSource>> OpenBenchSource(const std::string& data, const std::string& dataset,
                                                      const LoaderOptions& loader, const std::string& token_file,
                                                      const std::string& client_name, const OpenOptions& open = {},
                                                      const DecodeOptions& decode = {});

// The file to verify a source's batches against: the dataset it reads, or
// for a daemon the file its stream names (info().name is "ADDRESS SPEC"),
// opened into *holder when this host can read it; nullptr otherwise.
const Dataset* VerificationFile(const OpenedSource& source, const std::string& dataset, std::optional<Dataset>* holder);

// Sequential read of the whole of `path` with O_DIRECT in 8 MiB requests,
// two in flight (threads): GB/s. The file is evicted first. Fails where
// O_DIRECT is refused.
Result<double> DirectReadCeiling(const std::string& path);

// This process's resident memory in bytes (/proc/self/statm; 0 if unreadable).
uint64_t CurrentRss();

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_LOADER_BENCH_H_
