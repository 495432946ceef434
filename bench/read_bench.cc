// Read benchmark: every pass hashes every sample and is compared with HDF5's
// before its time counts.
#include "bench/read_bench.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/bench_checks.h"
#include "common/first_error.h"
#include "gpufeed/dataset.h"
#include "gpufeed/local_source.h"
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
  // The door decides what the spec names and probes the file, once (the
  // child opens it as the direct path does: metadata and chunk index); both
  // opens below take its probed spec. The baseline's H5Dread then decodes
  // chunks in this process, as it did after its own probe, which read only
  // the first chunk row.
  auto decided = DecideSourceKind(options.data, {});
  if (!decided.ok()) return decided.status();
  if (decided->kind != SourceKind::kDataset || !decided->probed) {
    return Status::InvalidArgument(options.data + ": " + std::string(SourceKindName(decided->kind)) +
                                   ": bench read times one HDF5 dataset's chunk reads against HDF5's; measure this "
                                   "with bench loader --data " +
                                   options.data);
  }
  auto direct = Dataset::Open(*decided->probed, decided->open);
  if (!direct.ok()) return direct.status();
  OpenOptions hdf5_opts = decided->open;
  hdf5_opts.force_hdf5_path = true;
  auto baseline = Dataset::Open(*decided->probed, hdf5_opts);
  if (!baseline.ok()) return baseline.status();

  ReadBenchResult r;
  r.threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  r.read_path = std::string(ReadPathName(direct->info().read_path));
  r.samples = direct->num_samples();
  r.raw_bytes = direct->info().raw_bytes;
  for (uint64_t i = 0; i < direct->num_chunks(); ++i) r.stored_bytes += direct->stored_chunk_bytes(i);

  // The reference: HDF5's H5Dread on one thread, every sample hashed. Every
  // pass of either path, timed or not, hashes every sample and is compared
  // with it (CompareHashes) before its time counts; hashing stays in the
  // timed passes so every path does the same work.
  std::vector<uint64_t> got(r.samples), want(r.samples);
  const int repeats = std::max(1, options.repeats);
  std::vector<double> baseline_times, one_times, direct_times;
  auto timed = [&](const Dataset& ds, int threads, std::vector<uint64_t>* hashes) -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    GPUFEED_RETURN_IF_ERROR(ReadAll(ds, threads, hashes));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Warms the page cache for both paths (not timed), and checks the direct
  // path once before any time is taken.
  GPUFEED_RETURN_IF_ERROR(ReadAll(*direct, r.threads, &got));
  for (int rep = 0; rep < repeats; ++rep) {
    auto t = timed(*baseline, 1, rep == 0 ? &want : &got);
    if (!t.ok()) return t.status();
    if (rep > 0) GPUFEED_RETURN_IF_ERROR(CompareHashes(got, want, options.data + ", HDF5 pass " + std::to_string(rep)));
    baseline_times.push_back(*t);
  }
  GPUFEED_RETURN_IF_ERROR(ReadAll(*direct, r.threads, &got));
  GPUFEED_RETURN_IF_ERROR(CompareHashes(got, want, options.data + ", direct path"));
  r.checksum = XXH3_64bits(want.data(), want.size() * sizeof(uint64_t));
  for (int rep = 0; rep < repeats; ++rep) {
    auto t = timed(*direct, 1, &got);
    if (!t.ok()) return t.status();
    GPUFEED_RETURN_IF_ERROR(
        CompareHashes(got, want, options.data + ", direct path on 1 thread, pass " + std::to_string(rep)));
    one_times.push_back(*t);
    t = timed(*direct, r.threads, &got);
    if (!t.ok()) return t.status();
    GPUFEED_RETURN_IF_ERROR(CompareHashes(
        got, want,
        options.data + ", direct path on " + std::to_string(r.threads) + " threads, pass " + std::to_string(rep)));
    direct_times.push_back(*t);
  }
  r.baseline_seconds = median(baseline_times);
  r.direct_one_thread_seconds = median(one_times);
  r.direct_seconds = median(direct_times);
  r.verified_passes = 2 + 3 * repeats;
  return r;
}

}  // namespace gpufeed::bench
