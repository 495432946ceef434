// Daemon benchmark: verify, then time, local against remote (serve_bench.h).
#include "bench/serve_bench.h"

#include <xxhash.h>

#include <chrono>
#include <thread>

#include "bench/loader_bench.h"
#include "common/mutex.h"
#include "gpufeed/dataset.h"
#include "gpufeed/local_source.h"
#include "gpufeed/open_source.h"
#include "gpufeed/remote_loader.h"
#include "gpufeed/daemon_testing.h"
#include "gpufeed/server.h"

namespace gpufeed::bench {
namespace {

using Clock = std::chrono::steady_clock;

// What one consumer saw in an epoch: per-sample counts and spot hashes.
struct Seen {
  std::vector<uint32_t> count;
  std::vector<std::pair<uint64_t, uint64_t>> spots;  // (index, XXH3 of its bytes)
  uint64_t label_mismatch = 0, samples = 0;
  Status status;
};

// The Seen that the consumers of one epoch fill together.
struct SharedSeen {
  Mutex mu;
  Seen seen GUARDED_BY(mu);
};

// Consumes a whole epoch of `src` into `shared` (shared across ranks), like
// a trainer that does nothing else.
void Consume(BatchSource& src, uint64_t epoch, const Dataset& ds, SharedSeen* shared) {
  constexpr uint64_t kSpotEvery = 61;
  EpochStream s = src.Epoch(epoch);
  std::vector<uint64_t> local_idx;
  std::vector<std::pair<uint64_t, uint64_t>> spots;
  uint64_t mismatch = 0, n = 0;
  for (;;) {
    auto b = s.Next();
    if (!b.ok()) {
      MutexLock lock(&shared->mu);
      shared->seen.status = b.status();
      return;
    }
    if (!b->has_value()) break;
    const Batch& batch = **b;
    for (uint64_t i = 0; i < batch.size(); ++i) {
      const uint64_t idx = batch.indices()[i];
      local_idx.push_back(idx);
      if (ds.has_labels() && batch.labels()[i] != ds.labels()[idx]) ++mismatch;
      if (++n % kSpotEvery == 0) {
        spots.emplace_back(idx, XXH3_64bits(batch.images().data() + i * batch.sample_bytes(), batch.sample_bytes()));
      }
    }
  }
  MutexLock lock(&shared->mu);
  Seen& seen = shared->seen;
  for (uint64_t idx : local_idx) ++seen.count[idx];
  seen.spots.insert(seen.spots.end(), spots.begin(), spots.end());
  seen.label_mismatch += mismatch;
  seen.samples += n;
}

// Every sample exactly once, labels right, spot-checked bytes equal a direct read.
Status Verify(const std::string& what, const Dataset& ds, const Seen& seen, uint64_t* spot_checked) {
  if (!seen.status.ok()) return seen.status.WithContext(what);
  uint64_t missing = 0, doubled = 0;
  for (uint32_t c : seen.count) {
    missing += c == 0;
    doubled += c > 1 ? c - 1 : 0;
  }
  if (missing || doubled || seen.label_mismatch) {
    return Status::Corrupt(what + ": " + std::to_string(missing) + " samples missing, " + std::to_string(doubled) +
                           " doubled, " + std::to_string(seen.label_mismatch) +
                           " wrong labels; no figure is printed for a wrong run");
  }
  std::vector<std::byte> buf(ds.sample_bytes());
  for (const auto& [idx, hash] : seen.spots) {
    GPUFEED_RETURN_IF_ERROR(ds.ReadSamples(idx, 1, buf));
    if (XXH3_64bits(buf.data(), buf.size()) != hash) {
      return Status::Corrupt(what + ": sample " + std::to_string(idx) + " delivered with wrong bytes");
    }
  }
  *spot_checked += seen.spots.size();
  return Status::Ok();
}

// Runs `epochs` epochs of `sources` concurrently (one thread each), verifies
// each and returns the last epoch's samples/s over all of them.
Result<double> TimedRun(const std::string& what, std::vector<BatchSource*> sources, const Dataset& ds, int epochs,
                        uint64_t* spot_checked) {
  double sps = 0;
  for (int ep = 0; ep < std::max(1, epochs); ++ep) {
    SharedSeen shared;
    {
      MutexLock lock(&shared.mu);  // no consumer yet: for the analysis
      shared.seen.count.assign(ds.num_samples(), 0);
    }
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (BatchSource* s : sources) {
      threads.emplace_back([&, s] { Consume(*s, static_cast<uint64_t>(ep), ds, &shared); });
    }
    for (auto& t : threads) t.join();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    Seen seen;
    {
      MutexLock lock(&shared.mu);  // every consumer has ended: for the analysis
      seen = std::move(shared.seen);
    }
    GPUFEED_RETURN_IF_ERROR(Verify(what + " epoch " + std::to_string(ep), ds, seen, spot_checked));
    sps = static_cast<double>(seen.samples) / secs;
  }
  return sps;
}

}  // namespace

Result<ServeBenchResult> RunServeBench(const ServeBenchOptions& o) {
  LoaderOptions lo = o.loader;
  lo.rank = 0;
  lo.world_size = 1;
  // The door decides what the spec names and probes the file, once: every
  // run is checked against its dataset, and the local Loader below opens
  // the same decision.
  auto decided = DecideSourceKind(o.data, {});
  if (!decided.ok()) return decided.status();
  if (decided->kind != SourceKind::kDataset || !decided->probed) {
    return Status::InvalidArgument(o.data + ": " + std::string(SourceKindName(decided->kind)) +
                                   ": bench serve checks every run against one HDF5 dataset; measure this with "
                                   "bench loader --data " +
                                   o.data);
  }
  auto ds = Dataset::Open(*decided->probed, decided->open);
  if (!ds.ok()) return ds.status();
  if (o.clients < 1 || ds->num_samples() % static_cast<uint64_t>(o.clients) != 0) {
    return Status::InvalidArgument("bench serve: N = " + std::to_string(ds->num_samples()) + " must divide among " +
                                   std::to_string(o.clients) + " clients for the every-sample-once check");
  }
  ServeBenchResult r;
  r.samples = ds->num_samples();

  {  // 1. the local Loader, through the door every caller uses (in this process: share none)
    SourceOptions local_options;
    local_options.data = o.data;
    local_options.loader = lo;
    local_options.share = Share::kNone;
    local_options.decided = *decided;
    auto local = OpenBatchSource(local_options);
    if (!local.ok()) return local.status();
    auto sps = TimedRun("local loader", {&(*local)->source()}, *ds, o.epochs, &r.spot_checked);
    if (!sps.ok()) return sps.status();
    r.local_sps = *sps;
  }

  const std::string sock = o.socket_dir + "/gpufeed-bench-" + std::to_string(::getpid()) + ".sock";
  ServerOptions so;
  so.data = {o.data};
  so.listen = "unix:" + sock;
  so.io_threads = 2;
  so.loader_threads = lo.threads;
  so.prefetch = lo.prefetch;
  so.cache_bytes = lo.cache_bytes;
  so.memory_bytes = 1ull << 40;  // throughput runs: not the subject
  std::shared_ptr<std::FILE> log_file;
  if (!o.server_log.empty()) {
    log_file.reset(std::fopen(o.server_log.c_str(), "w"), [](std::FILE* f) {
      if (f != nullptr) std::fclose(f);
    });
    if (!log_file) return Status::IOError("bench serve: cannot write the server log '" + o.server_log + "'");
  }
  so.log = [log_file](std::string_view line) {
    if (log_file) std::fprintf(log_file.get(), "%.*s\n", static_cast<int>(line.size()), line.data());
  };
  // The clients through the door too (a daemon address: a RemoteLoader).
  auto client_opts = [&](int rank, int world) {
    SourceOptions c;
    c.data = "unix:" + sock;
    c.loader = lo;
    c.loader.rank = rank;
    c.loader.world_size = world;
    c.remote.compress = o.compress;
    c.remote.shared_memory = o.shared_memory;
    c.remote.client_name = "bench-" + std::to_string(rank);
    return c;
  };
  {  // 2. one remote client, 3. `clients` remote clients at once
    auto server = Server::Start(so);
    if (!server.ok()) return server.status();
    auto one = OpenBatchSource(client_opts(0, 1));
    if (!one.ok()) return one.status();
    auto sps = TimedRun("1 remote client", {&(*one)->source()}, *ds, o.epochs, &r.spot_checked);
    if (!sps.ok()) return sps.status();
    r.remote1_sps = *sps;
    one->reset();
    r.remote1_socket_sps = r.remote1_sps;
    if (o.shared_memory) {  // the same client with batches on the socket, for comparison
      SourceOptions c = client_opts(0, 1);
      c.remote.shared_memory = false;
      auto copy = OpenBatchSource(c);
      if (!copy.ok()) return copy.status();
      sps = TimedRun("1 remote client (socket)", {&(*copy)->source()}, *ds, o.epochs, &r.spot_checked);
      if (!sps.ok()) return sps.status();
      r.remote1_socket_sps = *sps;
    }
    std::vector<std::unique_ptr<OpenedSource>> many;
    std::vector<BatchSource*> ptrs;
    for (int k = 0; k < o.clients; ++k) {
      auto c = OpenBatchSource(client_opts(k, o.clients));
      if (!c.ok()) return c.status();
      ptrs.push_back(&(*c)->source());
      many.push_back(std::move(*c));
    }
    sps = TimedRun(std::to_string(o.clients) + " remote clients", ptrs, *ds, o.epochs, &r.spot_checked);
    if (!sps.ok()) return sps.status();
    r.remote4_sps = *sps;
    many.clear();
    (*server)->Stop();
    GPUFEED_RETURN_IF_ERROR((*server)->Wait());
  }

  {  // 4. memory with idle and stalled clients attached
    ServerOptions mo = so;
    mo.memory_bytes = o.memory_bytes;
    mo.cache_bytes = o.stall_cache_bytes;
    mo.prefetch = 3;
    mo.write_timeout_ms = 600000;  // keep the stalled ones attached for the measurement
    mo.max_connections = o.idle_clients + o.stalled_clients + 4;
    r.budget_bytes = mo.memory_bytes;
    r.rss_before = CurrentRss();
    auto server = Server::Start(mo);
    if (!server.ok()) return server.status();
    LoaderOptions stall_lo = lo;
    stall_lo.batch_size = o.stall_batch_size;
    std::vector<testing::RawDaemonClient> conns;
    for (int k = 0; k < o.idle_clients + o.stalled_clients; ++k) {
      auto c = testing::RawDaemonClient::Connect(
          "unix:" + sock, stall_lo,
          k >= o.idle_clients ? testing::RawDaemonClient::Kind::kStalled : testing::RawDaemonClient::Kind::kIdle);
      if (!c.ok()) return c.status();
      conns.push_back(std::move(*c));
    }
    // Wait (bounded) until the stalled streams stop making progress.
    uint64_t last = UINT64_MAX;
    for (int i = 0; i < 120; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const uint64_t now = (*server)->stats().batches_sent;
      if (now == last && (*server)->stats().streams_active == static_cast<uint64_t>(o.stalled_clients)) break;
      last = now;
    }
    r.rss_attached = CurrentRss();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    r.rss_later = CurrentRss();
    const ServerStats st = (*server)->stats();
    r.reserved_bytes = st.reserved_bytes;
    r.stalled_streams = st.streams_active;
    r.stalled_batches_sent = st.batches_sent;
    conns.clear();
    (*server)->Stop();
    GPUFEED_RETURN_IF_ERROR((*server)->Wait());
  }
  return r;
}

}  // namespace gpufeed::bench
