// Loader benchmark: time a do-nothing consumer, then verify what it got.
#include "bench/loader_bench.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "bench/bench_checks.h"
#include "bench/jpeg_workload.h"
#include "gpufeed/dataset.h"
#include "gpufeed/encoded.h"
#include "gpufeed/fields.h"
#include "gpufeed/local_source.h"
#include "gpufeed/page_cache.h"

namespace gpufeed::bench {

uint64_t CurrentRss() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

const Dataset* VerificationFile(const OpenedSource& source, const std::string& dataset,
                                std::optional<Dataset>* holder) {
  if (source.dataset() != nullptr) return source.dataset();
  const std::string& name = source.source().info().name;
  const size_t space = name.find(' ');
  // Through the door (probed once); a file this host cannot open as one
  // HDF5 dataset is not checked byte for byte.
  const std::string spec = space == std::string::npos ? dataset : name.substr(space + 1);
  auto decided = DecideSourceKind(spec, {});
  if (!decided.ok() || decided->kind != SourceKind::kDataset || !decided->probed) return nullptr;
  auto f = Dataset::Open(*decided->probed, decided->open);
  if (!f.ok()) return nullptr;
  holder->emplace(std::move(*f));
  return &**holder;
}

Result<std::unique_ptr<OpenedSource>> OpenBenchSource(const std::string& data, const std::string& dataset,
                                                      const LoaderOptions& loader, const std::string& token_file,
                                                      const std::string& client_name, const OpenOptions& open,
                                                      const DecodeOptions& decode) {
  SourceOptions so;
  so.open = open;
  so.decode = decode;
  so.data = data;
  so.dataset = dataset;
  so.loader = loader;
  so.remote.token_file = token_file;
  so.remote.client_name = client_name;
  return OpenBatchSource(so);
}

Result<double> DirectReadCeiling(const std::string& path) {
  GPUFEED_RETURN_IF_ERROR(EvictFromPageCache(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) return Status::IOError(path + ": O_DIRECT open refused: " + std::strerror(errno));
  struct stat st;
  ::fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  constexpr uint64_t kReq = 8u << 20;
  constexpr int kInFlight = 2;
  std::atomic<uint64_t> next{0}, total{0};
  std::atomic<int> err{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kInFlight; ++t) {
    threads.emplace_back([&] {
      void* p = nullptr;
      if (posix_memalign(&p, kDirectIoAlignment, kReq) != 0) {
        err = ENOMEM;
        return;
      }
      std::unique_ptr<void, decltype(&std::free)> buf(p, &std::free);
      for (uint64_t off = next.fetch_add(kReq); off < size; off = next.fetch_add(kReq)) {
        const ssize_t r = ::pread(fd, buf.get(), kReq, static_cast<off_t>(off));
        if (r < 0) {
          err = errno;
          return;
        }
        total += static_cast<uint64_t>(r);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  if (err != 0) return Status::IOError(path + ": O_DIRECT read failed: " + std::strerror(err));
  if (total != size)
    return Status::IOError(path + ": O_DIRECT read " + std::to_string(total.load()) + " of " + std::to_string(size) +
                           " bytes");
  return size / secs / 1e9;
}

namespace {

// A sample's bytes, field by field (one field: XXH3 of the sample).
uint64_t SampleHash(const Batch& b, uint64_t i) {
  uint64_t h = 0;
  for (size_t f = 0; f < b.fields().size(); ++f) {
    const uint64_t fb = b.fields()[f].sample_bytes;
    h += XXH3_64bits(b.field(f).data() + i * fb, fb) * (f + 1);
  }
  return h;
}

// The same hash of sample `idx` read independently of the loader: each field
// opened afresh from its file.
Result<uint64_t> FieldSampleHash(const FieldSource& fs, uint64_t idx) {
  const auto [file, local] = fs.Locate(idx);
  const std::vector<FieldInfo> fields = fs.fields();
  uint64_t h = 0;
  for (size_t f = 0; f < fields.size(); ++f) {
    auto ds = fs.OpenField(f, file);
    if (!ds.ok()) return ds.status();
    std::vector<std::byte> buf(fields[f].sample_bytes);
    GPUFEED_RETURN_IF_ERROR(ds->ReadSamples(local, 1, buf));
    h += XXH3_64bits(buf.data(), buf.size()) * (f + 1);
  }
  return h;
}

// What an epoch of `loader` promises (bench_checks.h): a whole epoch of one
// rank, every index once; a partial one (--batches) or one rank's share, no
// index twice and as many samples as its batches hold.
CoverageClaim ClaimFor(bool full_epoch, int world, uint64_t batches, const BatchSource& loader) {
  if (full_epoch && world == 1) return {Coverage::kEveryIndexOnce, 0};
  const uint64_t n = loader.info().num_samples, b = loader.info().batch_size;
  const LoaderOptions sh = loader.sharding();
  // A rank's share (loader.h, drop_last): ceil(N / W), or floor(N / W) cut
  // to whole batches.
  uint64_t share = world == 1 ? n : (n + world - 1) / world;
  if (world > 1 && sh.drop_last) share = n / world / b * b;
  return {Coverage::kNoIndexDoubled, full_epoch ? share : std::min(share, batches * b)};
}

}  // namespace

Result<LoaderBenchResult> RunLoaderBench(const LoaderBenchOptions& o) {
  const auto open_t0 = std::chrono::steady_clock::now();
  auto opened = OpenBenchSource(o.data, o.dataset, o.loader, o.token_file, "bench-loader", o.open, o.decode);
  if (!opened.ok()) return opened.status();
  const double open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - open_t0).count();
  const uint64_t rss_before = CurrentRss();  // the loader exists, its pool and cache do not yet
  BatchSource& loader = (*opened)->source();
  const BatchSourceInfo& info = loader.info();
  // Bytes and labels are checked against the file: the one read, or for a
  // daemon the file its stream names ("unix:/s file.h5:/images") when this
  // host can open it (a daemon on another host: indices are checked only).
  std::optional<Dataset> remote_file;
  const auto* fields = dynamic_cast<const FieldSource*>((*opened)->chunk_source());
  const Dataset* ds = fields != nullptr ? nullptr : VerificationFile(**opened, o.dataset, &remote_file);
  if (ds != nullptr && (ds->num_samples() != info.num_samples || ds->sample_bytes() != info.sample_bytes)) {
    return Status::InvalidArgument(o.data + ": the daemon's dataset is not " + ds->name() + " as this host sees it");
  }
  const uint64_t sb = info.sample_bytes;
  const uint64_t n = info.num_samples;
  // An encoded dataset is checked against its own labels and an independent
  // decode of the stored bytes with the same (seed, epoch, sample) crop.
  const EncodedImageSource* enc = (*opened)->encoded();
  const std::vector<int64_t>* file_labels = ds != nullptr ? &ds->labels() : enc != nullptr ? &enc->labels() : nullptr;
  const bool labels = file_labels != nullptr && !file_labels->empty();
  LoaderBenchResult r;
  r.open_seconds = open_seconds;
  r.sample_bytes = sb;
  r.bytes_verified = ds != nullptr || fields != nullptr || enc != nullptr;
  r.encoded = enc != nullptr;
  r.warnings = loader.info().warnings;
  r.batch_size = loader.info().batch_size;

  if (o.cold) {
    if (ds == nullptr) return Status::InvalidArgument("--cold needs a file this host reads (not a remote daemon's)");
    r.file = ds->info().file;
    r.io = (*opened)->dataset() != nullptr ? ds->info().io : "daemon";
    r.io_note = ds->info().io_note;
    struct stat st;
    if (::stat(r.file.c_str(), &st) == 0) r.file_bytes = static_cast<uint64_t>(st.st_size);
  }
  // --cold: drop the file's pages before an epoch; returns the share left.
  auto evict = [&]() -> Result<double> {
    GPUFEED_RETURN_IF_ERROR(EvictFromPageCache(r.file));
    return PageCacheResidentFraction(r.file);
  };
  double resident0 = -1;
  double ceiling_before = 0;
  if (o.cold) {
    // The device's ceiling before and after the epochs (a shared or virtual
    // disk varies): the figures are compared with the larger.
    auto c = DirectReadCeiling(r.file);
    if (c.ok()) ceiling_before = *c;
    auto f = evict();
    if (!f.ok()) return f.status();
    resident0 = *f;
  }

  constexpr uint64_t kSpotEvery = 61;  // prime: lands on every batch position over time
  // The first epoch starts before the bench sizes its checks by the
  // dataset: options or a shape the loader refuses are reported as such.
  const auto first_t0 = std::chrono::steady_clock::now();
  EpochStream first = loader.Epoch(o.epoch);
  if (first.num_batches() == 0) {
    auto e = first.Next();
    if (!e.ok()) return e.status();
  }
  // What each epoch is checked for (bench_checks.h): a whole epoch of one
  // rank, every index once and the index/label checksum; --batches, no index
  // twice and the count; ranks, this rank's share without a repeat, and
  // after the timed epochs the union over every rank's share of the same
  // epoch (the other ranks run then, untimed).
  const int world = std::max(1, o.loader.world_size);
  std::vector<IndexTally> rank_tallies;  // this rank's, per epoch, for the union
  IndexTally tally(n);
  uint64_t want_hash = 0;
  for (uint64_t idx = 0; idx < n; ++idx) {
    want_hash += XXH3_64bits_withSeed(&idx, sizeof(idx), static_cast<uint64_t>(labels ? (*file_labels)[idx] : 0));
  }
  std::vector<std::byte> buf(sb);
  for (int ep = 0; ep < std::max(1, o.epochs); ++ep) {
    tally = IndexTally(n);
    std::vector<std::pair<uint64_t, uint64_t>> spots;  // (index, XXH3 of delivered bytes)
    uint64_t label_mismatch = 0, sum_hash = 0, delivered = 0;
    const uint64_t epoch = o.epoch + static_cast<uint64_t>(ep);
    double resident_before = resident0;
    if (o.cold && ep > 0) {
      auto f = evict();
      if (!f.ok()) return f.status();
      resident_before = *f;
    }
    const auto t0 = ep == 0 ? first_t0 : std::chrono::steady_clock::now();
    EpochStream stream = ep == 0 ? std::move(first) : loader.Epoch(epoch);
    const uint64_t want_batches = o.batches ? std::min(o.batches, stream.num_batches()) : stream.num_batches();
    for (uint64_t nb = 0; nb < want_batches; ++nb) {
      auto b = stream.Next();
      if (!b.ok()) return b.status();
      if (!b->has_value())
        return Status::Internal(o.data + ": the epoch ended after " + std::to_string(nb) + " batches");
      const Batch& batch = **b;
      if (nb == 0) {
        r.first_batch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (ep == 0) r.first_epoch_first_batch_seconds = r.first_batch_seconds;
      }
      for (uint64_t i = 0; i < batch.size(); ++i) {
        const uint64_t idx = batch.indices()[i];
        GPUFEED_RETURN_IF_ERROR(tally.Add(idx).WithContext(o.data));
        if (labels && batch.labels()[i] != (*file_labels)[idx]) ++label_mismatch;
        sum_hash += XXH3_64bits_withSeed(&idx, sizeof(idx), static_cast<uint64_t>(labels ? batch.labels()[i] : 0));
        if (++delivered % kSpotEvery == 0 && r.bytes_verified) {
          spots.emplace_back(idx, SampleHash(batch, i));
        }
      }
    }
    if (want_batches == stream.num_batches()) {
      // The end of the epoch (or the error that ended it before it began:
      // a stream refused at its start has no batches to loop over).
      auto end = stream.Next();
      if (!end.ok()) return end.status();
      if (end->has_value()) return Status::Corrupt(o.data + ": the epoch has more batches than num_batches()");
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (ep == 0) r.first_epoch_seconds = secs;
    r.seconds = secs;
    r.stats = stream.stats();
    r.skipped += r.stats.skipped_samples;
    r.samples = delivered;
    r.epochs.push_back({epoch, delivered, secs, r.stats});
    if (o.cold) {
      auto after = PageCacheResidentFraction(r.file);
      r.epochs.back().resident_before = resident_before;
      r.epochs.back().resident_after = after.ok() ? *after : -1;
    }
    r.full_epoch = want_batches == stream.num_batches();

    // Verify before anything is printed.
    const std::string what = o.data + ": epoch " + std::to_string(epoch);
    GPUFEED_RETURN_IF_ERROR(CheckCoverage(tally, ClaimFor(r.full_epoch, world, want_batches, loader), what));
    if (r.full_epoch && world == 1 && want_hash != sum_hash) {
      return Status::Corrupt(what + ": the index/label checksum differs from the file's");
    }
    if (label_mismatch) {
      return Status::Corrupt(what + ": the loader delivered " + std::to_string(label_mismatch) +
                             " wrong labels; no figure is printed for a wrong loader");
    }
    r.coverage = (world > 1 ? "rank " + std::to_string(o.loader.rank) + " of " + std::to_string(world) + ": " : "") +
                 DescribeCoverage(tally, ClaimFor(r.full_epoch, world, want_batches, loader));
    r.checksum_checked = r.full_epoch && world == 1;
    if (world > 1 && r.full_epoch) rank_tallies.push_back(tally);
    std::vector<uint8_t> stored;
    for (const auto& [idx, hash] : spots) {
      uint64_t want = 0;
      if (fields != nullptr) {
        auto h = FieldSampleHash(*fields, idx);
        if (!h.ok()) return h.status();
        want = *h;
      } else {
        if (enc != nullptr) {
          GPUFEED_RETURN_IF_ERROR(enc->ReadEncoded(idx, &stored));
          GPUFEED_RETURN_IF_ERROR(
              DecodeImage(stored, o.decode, o.loader.seed, epoch, idx, reinterpret_cast<uint8_t*>(buf.data())));
        } else {
          GPUFEED_RETURN_IF_ERROR(ds->ReadSamples(idx, 1, buf));
        }
        want = XXH3_64bits(buf.data(), sb);
      }
      if (want != hash) {
        return Status::Corrupt(o.data + ": sample " + std::to_string(idx) + " delivered with wrong bytes");
      }
    }
    r.spot_checked += spots.size();
    if (enc != nullptr) {
      r.stored_bytes = 0;
      for (uint64_t k = 0; k < n; ++k) r.stored_bytes += tally.counts()[k] * enc->sample_stored_bytes(k);
    }
  }
  if (!rank_tallies.empty()) {
    // The other ranks' shares of the same epochs, untimed: with this rank's,
    // every index once (padded as drop_last says).
    for (int rank = 0; rank < world; ++rank) {
      if (rank == o.loader.rank) continue;
      LoaderOptions lo = o.loader;
      lo.rank = rank;
      auto other = OpenBenchSource(o.data, o.dataset, lo, o.token_file, "bench-loader-rank-" + std::to_string(rank),
                                   o.open, o.decode);
      if (!other.ok()) return other.status();
      for (size_t e = 0; e < rank_tallies.size(); ++e) {
        EpochStream stream = (*other)->source().Epoch(o.epoch + e);
        for (;;) {
          auto b = stream.Next();
          if (!b.ok()) return b.status();
          if (!*b) break;
          GPUFEED_RETURN_IF_ERROR(rank_tallies[e].Add((*b)->indices()).WithContext(o.data));
        }
      }
    }
    const CoverageClaim claim = o.loader.drop_last
                                    ? CoverageClaim{Coverage::kNoIndexDoubled, rank_tallies[0].delivered()}
                                    : CoverageClaim{Coverage::kPadded, static_cast<uint64_t>(world)};
    for (size_t e = 0; e < rank_tallies.size(); ++e) {
      // drop_last: every rank delivers as many as this one.
      CoverageClaim c = claim;
      if (o.loader.drop_last) c.expected = r.epochs[e].samples * static_cast<uint64_t>(world);
      GPUFEED_RETURN_IF_ERROR(
          CheckCoverage(rank_tallies[e], c, o.data + ": epoch " + std::to_string(o.epoch + e) + ", all ranks"));
    }
    r.coverage +=
        "; all " + std::to_string(world) + " ranks: " +
        DescribeCoverage(
            rank_tallies.back(),
            o.loader.drop_last ? CoverageClaim{Coverage::kNoIndexDoubled, rank_tallies.back().delivered()} : claim);
  }
  const uint64_t threads = o.loader.threads > 0 ? o.loader.threads : std::thread::hardware_concurrency();
  if (enc != nullptr) {
    auto c = MeasureDecodeCeiling(*enc, 1000, o.loader.seed);
    if (!c.ok()) return c.status();
    r.decode_one_core_per_s = c->samples_per_s();
    r.transform_one_core_per_s = c->transform_per_s();
    auto p = MeasureParallelDecode(*enc, 2000, static_cast<int>(threads));
    if (!p.ok()) return p.status();
    r.parallel_decode_per_s = *p;
    r.ceiling_samples = c->samples;
  }
  if (o.cold) {
    // After the loader's figures are verified: the device's ceiling, same file, same run.
    auto c = DirectReadCeiling(r.file);
    if (c.ok()) {
      r.ceiling_runs_gb_per_s = {ceiling_before, *c};
      r.ceiling_gb_per_s = std::max(ceiling_before, *c);
    } else {
      r.ceiling_note = c.status().message();
    }
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  r.max_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  r.rss_before_bytes = rss_before;
  // Direct I/O adds its read-ahead's chunk buffers (Dataset's io_uring ring).
  const uint64_t read_ahead = (*opened)->dataset() != nullptr ? ds->info().read_ahead_chunks : 0;
  const uint64_t chunk = ds != nullptr       ? ds->chunk_bytes_max()
                         : fields != nullptr ? fields->chunk_samples() * sb
                         : enc != nullptr    ? enc->max_chunk_buffer_bytes()
                                             : 0;
  r.memory_bound_bytes = CacheBoundBytes(o.loader, chunk) + (o.loader.prefetch + 1) * loader.info().batch_size * sb +
                         (2 * threads + 4 + read_ahead) * chunk;
  return r;
}

}  // namespace gpufeed::bench
