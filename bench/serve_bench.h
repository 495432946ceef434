// `gpufeed bench serve`: the daemon against the local Loader in one run, on
// one host over a Unix socket. Local Loader, then an in-process daemon with
// one RemoteLoader client (shared memory, then batches on the socket for
// comparison), then 4 clients (ranks 0-3 of 4) at once; every
// run is checked (every sample exactly once, labels, spot-checked bytes)
// before its samples/s is reported with its ratio to the local Loader. Then
// 16 idle and 16 stalled clients (CREDIT granted, nothing read) are attached
// to a daemon with a memory budget, and its resident memory is compared
// with the budget.
#ifndef GPUFEED_BENCH_SERVE_BENCH_H_
#define GPUFEED_BENCH_SERVE_BENCH_H_

#include <string>

#include "gpufeed/loader.h"

namespace gpufeed::bench {

struct ServeBenchOptions {
  std::string data;
  LoaderOptions loader;       // the stream: batch size, order, seed, threads, prefetch, cache
  int epochs = 2;             // per run; the last is timed
  int clients = 4;            // the concurrent run: ranks 0..clients-1 of clients
  bool compress = false;      // zstd payloads (socket transport)
  bool shared_memory = true;  // clients' pools shared with the daemon (no copy)
  int idle_clients = 16, stalled_clients = 16;
  uint64_t memory_bytes = 4ull << 30;  // the daemon's budget in the memory check
  uint64_t stall_batch_size = 64;      // stream options of the stalled clients
  uint64_t stall_cache_bytes = 32ull << 20;
  std::string socket_dir = "/tmp";
  std::string server_log;  // the in-process daemon's log lines go to this file; empty: dropped
};

struct ServeBenchResult {
  uint64_t samples = 0;  // per epoch (all ranks)
  double local_sps = 0, remote1_sps = 0, remote4_sps = 0;
  double remote1_socket_sps = 0;  // 1 client, batches on the socket (the copy path)
  uint64_t spot_checked = 0;
  // Memory check.
  uint64_t rss_before = 0, rss_attached = 0, rss_later = 0;  // bytes
  uint64_t reserved_bytes = 0, budget_bytes = 0;
  uint64_t stalled_streams = 0, stalled_batches_sent = 0;
  double remote1_ratio() const { return remote1_sps / local_sps; }
  double remote4_ratio() const { return remote4_sps / local_sps; }
  double remote1_socket_ratio() const { return remote1_socket_sps / local_sps; }
};

Result<ServeBenchResult> RunServeBench(const ServeBenchOptions& options);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_SERVE_BENCH_H_
