// Read benchmark: verify (per-sample hashes, direct vs HDF5), then time.
#include "bench/read_bench.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/first_error.h"
#include "gpufeed/dataset.h"
#include "gpufeed/open_source.h"

namespace gpufeed::bench {
namespace {

// Reads every chunk of `ds` with `threads` threads; when `hashes` is given,
// stores each sample's XXH3 there. Returns the first error.
Status ReadAll(const Dataset& ds, int threads, std::vector<uint64_t>* hashes) {
  FirstError first;
  tbb::task_arena arena(threads);
  arena.execute([&] {
    tbb::parallel_for(uint64_t{0}, ds.num_chunks(), [&](uint64_t i) {
      if (first.failed()) return;
      thread_local std::vector<std::byte> buf;
      buf.resize(ds.chunk_bytes_max());
      Status s = ds.ReadChunk(i, buf);
      if (!s.ok()) {
        first.Set(std::move(s));
        return;
      }
      if (hashes != nullptr) {
        const uint64_t n = ds.samples_in_chunk(i), sb = ds.sample_bytes();
        for (uint64_t k = 0; k < n; ++k) {
          (*hashes)[i * ds.chunk_samples() + k] = XXH3_64bits(buf.data() + k * sb, sb);
        }
      }
    });
  });
  return first.Get();
}

}  // namespace

Result<ReadBenchResult> RunReadBench(const ReadBenchOptions& options) {
  if (IsDaemonAddress(options.data)) {
    return Status::Unsupported(options.data +
                               ": bench read decodes a file's chunks, and a daemon serves batches, not "
                               "chunks: measure it with bench loader --data " +
                               options.data);
  }
  auto direct = Dataset::Open(options.data);
  if (!direct.ok()) return direct.status();
  OpenOptions hdf5_opts;
  hdf5_opts.force_hdf5_path = true;
  auto baseline = Dataset::Open(options.data, hdf5_opts);
  if (!baseline.ok()) return baseline.status();

  ReadBenchResult r;
  r.threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  r.read_path = std::string(ReadPathName(direct->info().read_path));
  r.samples = direct->num_samples();
  r.raw_bytes = direct->info().raw_bytes;
  for (uint64_t i = 0; i < direct->num_chunks(); ++i) r.stored_bytes += direct->stored_chunk_bytes(i);

  // Verify: the first direct pass (which also warms the page cache) and the
  // timed baseline pass both hash every sample.
  std::vector<uint64_t> got(r.samples), want(r.samples);
  GPUFEED_RETURN_IF_ERROR(ReadAll(*direct, r.threads, &got));
  auto t0 = std::chrono::steady_clock::now();
  GPUFEED_RETURN_IF_ERROR(ReadAll(*baseline, 1, &want));
  r.baseline_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (uint64_t k = 0; k < r.samples; ++k) {
    if (got[k] != want[k]) {
      return Status::Corrupt(options.data + ": sample " + std::to_string(k) +
                             " differs between the direct path and HDF5's H5Dread; refusing to time a wrong reader");
    }
  }
  r.checksum = XXH3_64bits(got.data(), got.size() * sizeof(uint64_t));

  std::vector<double> times;
  for (int rep = 0; rep < std::max(1, options.repeats); ++rep) {
    t0 = std::chrono::steady_clock::now();
    // Hashing stays in the timed passes so both paths do the same work.
    GPUFEED_RETURN_IF_ERROR(ReadAll(*direct, r.threads, &got));
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  r.direct_seconds = times[times.size() / 2];
  return r;
}

}  // namespace gpufeed::bench
