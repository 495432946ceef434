// Loader benchmark: time a do-nothing consumer, then verify what it got.
#include "bench/loader_bench.h"

#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench/jpeg_workload.h"
#include "gpufeed/dataset.h"
#include "hdf5io/image_decode.h"

namespace gpufeed::bench {

uint64_t CurrentRss() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

const Dataset* VerificationFile(const OpenedSource& source, const std::string& dataset, std::optional<Dataset>* holder) {
  if (source.dataset() != nullptr) return source.dataset();
  const std::string& name = source.source().info().name;
  const size_t space = name.find(' ');
  auto f = Dataset::Open(space == std::string::npos ? dataset : name.substr(space + 1));
  if (!f.ok()) return nullptr;
  holder->emplace(std::move(*f));
  return &**holder;
}

Result<std::unique_ptr<OpenedSource>> OpenBenchSource(const std::string& data, const std::string& dataset,
                                                      const LoaderOptions& loader, const std::string& token_file,
                                                      const std::string& client_name,
                                                      const DecodeOptions& decode) {
  SourceOptions so;
  so.decode = decode;
  so.data = data;
  so.dataset = dataset;
  so.loader = loader;
  so.remote.token_file = token_file;
  so.remote.client_name = client_name;
  return OpenBatchSource(so);
}

Result<LoaderBenchResult> RunLoaderBench(const LoaderBenchOptions& o) {
  auto opened = OpenBenchSource(o.data, o.dataset, o.loader, o.token_file, "bench-loader", o.decode);
  if (!opened.ok()) return opened.status();
  const uint64_t rss_before = CurrentRss();  // the loader exists, its pool and cache do not yet
  BatchSource& loader = (*opened)->source();
  const BatchSourceInfo& info = loader.info();
  // Bytes and labels are checked against the file: the one read, or for a
  // daemon the file its stream names ("unix:/s file.h5:/images") when this
  // host can open it (a daemon on another host: indices are checked only).
  std::optional<Dataset> remote_file;
  const Dataset* ds = VerificationFile(**opened, o.dataset, &remote_file);
  if (ds != nullptr && (ds->num_samples() != info.num_samples || ds->sample_bytes() != info.sample_bytes)) {
    return Status::InvalidArgument(o.data + ": the daemon's dataset is not " + ds->name() + " as this host sees it");
  }
  const uint64_t sb = info.sample_bytes;
  const uint64_t n = info.num_samples;
  // An encoded dataset is checked against its own labels and an independent
  // decode of the stored bytes with the same (seed, epoch, sample) crop.
  const EncodedImageSource* enc = (*opened)->encoded();
  const std::vector<int64_t>* file_labels =
      ds != nullptr ? &ds->labels() : enc != nullptr ? &enc->labels() : nullptr;
  const bool labels = file_labels != nullptr && !file_labels->empty();
  LoaderBenchResult r;
  r.sample_bytes = sb;
  r.bytes_verified = ds != nullptr || enc != nullptr;
  r.encoded = enc != nullptr;
  r.warnings = loader.info().warnings;
  r.batch_size = loader.info().batch_size;

  constexpr uint64_t kSpotEvery = 61;  // prime: lands on every batch position over time
  // The first epoch starts before the bench sizes its checks by the
  // dataset: options or a shape the loader refuses are reported as such.
  const auto first_t0 = std::chrono::steady_clock::now();
  EpochStream first = loader.Epoch(o.epoch);
  if (first.num_batches() == 0) {
    auto e = first.Next();
    if (!e.ok()) return e.status();
  }
  std::vector<uint64_t> seen_count(n);
  uint64_t want_hash = 0;
  for (uint64_t idx = 0; idx < n; ++idx) {
    want_hash += XXH3_64bits_withSeed(&idx, sizeof(idx), static_cast<uint64_t>(labels ? (*file_labels)[idx] : 0));
  }
  std::vector<std::byte> buf(sb);
  for (int ep = 0; ep < std::max(1, o.epochs); ++ep) {
    std::fill(seen_count.begin(), seen_count.end(), 0);
    std::vector<std::pair<uint64_t, uint64_t>> spots;  // (index, XXH3 of delivered bytes)
    uint64_t label_mismatch = 0, sum_hash = 0, delivered = 0;
    const uint64_t epoch = o.epoch + static_cast<uint64_t>(ep);
    const auto t0 = ep == 0 ? first_t0 : std::chrono::steady_clock::now();
    EpochStream stream = ep == 0 ? std::move(first) : loader.Epoch(epoch);
    const uint64_t want_batches = o.batches ? std::min(o.batches, stream.num_batches()) : stream.num_batches();
    for (uint64_t nb = 0; nb < want_batches; ++nb) {
      auto b = stream.Next();
      if (!b.ok()) return b.status();
      if (!b->has_value()) return Status::Internal(o.data + ": the epoch ended after " + std::to_string(nb) + " batches");
      const Batch& batch = **b;
      if (nb == 0) r.first_batch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (uint64_t i = 0; i < batch.size(); ++i) {
        const uint64_t idx = batch.indices()[i];
        if (idx >= n) return Status::Corrupt(o.data + ": sample index " + std::to_string(idx) + " out of range");
        ++seen_count[idx];
        if (labels && batch.labels()[i] != (*file_labels)[idx]) ++label_mismatch;
        sum_hash += XXH3_64bits_withSeed(&idx, sizeof(idx), static_cast<uint64_t>(labels ? batch.labels()[i] : 0));
        if (++delivered % kSpotEvery == 0 && r.bytes_verified) {
          spots.emplace_back(idx, XXH3_64bits(batch.images().data() + i * sb, sb));
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
    r.samples = delivered;
    r.epochs.push_back({epoch, delivered, secs, r.stats});
    r.full_epoch = want_batches == stream.num_batches();

    // Verify before anything is printed.
    uint64_t doubled = 0, missing = 0;
    for (uint64_t c : seen_count) {
      if (c > 1) doubled += c - 1;
    }
    if (r.full_epoch && o.loader.world_size == 1) {
      for (uint64_t c : seen_count) missing += c == 0;
      if (want_hash != sum_hash) {
        return Status::Corrupt(o.data + ": index/label checksum of epoch " + std::to_string(epoch) +
                               " differs from the file's");
      }
    }
    if (doubled || missing || label_mismatch) {
      return Status::Corrupt(o.data + ": epoch " + std::to_string(epoch) + ": the loader delivered " +
                             std::to_string(doubled) + " doubled and " + std::to_string(missing) +
                             " missing samples, " + std::to_string(label_mismatch) +
                             " wrong labels; no figure is printed for a wrong loader");
    }
    std::vector<uint8_t> stored;
    for (const auto& [idx, hash] : spots) {
      if (enc != nullptr) {
        GPUFEED_RETURN_IF_ERROR(enc->ReadEncoded(idx, &stored));
        GPUFEED_RETURN_IF_ERROR(image::DecodeTransform(stored, o.decode, image::RandomKey(o.loader.seed, epoch, idx),
                                                       reinterpret_cast<uint8_t*>(buf.data())));
      } else {
        GPUFEED_RETURN_IF_ERROR(ds->ReadSamples(idx, 1, buf));
      }
      if (XXH3_64bits(buf.data(), sb) != hash) {
        return Status::Corrupt(o.data + ": sample " + std::to_string(idx) + " delivered with wrong bytes");
      }
    }
    r.spot_checked += spots.size();
    if (enc != nullptr) {
      r.stored_bytes = 0;
      for (uint64_t k = 0; k < n; ++k) r.stored_bytes += seen_count[k] * enc->sample_stored_bytes(k);
    }
  }
  const uint64_t threads = o.loader.threads > 0 ? o.loader.threads : std::thread::hardware_concurrency();
  if (enc != nullptr) {
    r.skipped = enc->skipped();
    auto c = MeasureDecodeCeiling(*enc, 1000, o.loader.seed);
    if (!c.ok()) return c.status();
    r.decode_one_core_per_s = c->samples_per_s();
    r.transform_one_core_per_s = c->transform_per_s();
    auto p = MeasureParallelDecode(*enc, 2000, static_cast<int>(threads));
    if (!p.ok()) return p.status();
    r.parallel_decode_per_s = *p;
    r.ceiling_samples = c->samples;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  r.max_rss_bytes = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  r.rss_before_bytes = rss_before;
  r.memory_bound_bytes = o.loader.cache_bytes + (o.loader.prefetch + 1) * loader.info().batch_size * sb +
                         (2 * threads + 4) * (ds != nullptr ? ds->chunk_bytes_max() : enc != nullptr ? enc->max_chunk_buffer_bytes() : 0);
  return r;
}

}  // namespace gpufeed::bench
