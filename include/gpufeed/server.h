// Server: the loader daemon behind `gpufeed serve`. It opens each dataset
// once and streams batches to trainer processes over a Unix socket or TCP,
// each client with its own stream (batch size, order, seed, epoch, rank,
// world size, start batch), so decoding happens in one place for several
// trainers. Clients are RemoteLoaders (remote_loader.h); the wire format is
// docs/protocol.md.
//
//   gpufeed::ServerOptions o;
//   o.data = {"train.h5"};
//   o.listen = "unix:/run/user/1000/gpufeed.sock";
//   auto server = gpufeed::Server::Start(o);   // binds, then serves on its own threads
//   if (!server.ok()) { report(server.status()); }
//   ... (*server)->Stop(); (*server)->Wait();  // or a SIGINT/SIGTERM with handle_signals
//
// What is shared. One source per dataset, opened once (its file
// descriptors, chunk index and labels; the OS page cache under it); an
// encoded dataset has one per distinct set of clients' decode options (at
// most 8, each opened on the first HELLO that asks for it). Each stream runs its
// own Loader — its own TBB pipeline, decoded-chunk cache of `cache_bytes` and
// batch pool — because the cache is managed with the stream's own future
// order (loader/chunk_cache.h); but the caches of one file's streams take
// decoded chunks from each other (loader::SharedChunks): a chunk another
// stream has decoded, or is decoding, is not read again. The loader threads
// are the daemon's: a stream starting while k others run gets
// loader_threads / (k + 1) of them (at least 2), so concurrent streams do not
// each ask TBB for every core.
//
// Transport. A RemoteLoader on the daemon's host (a Unix socket) shares its
// batch pool with the daemon (a sealed memfd passed with the HELLO); the
// stream's Loader assembles batches straight into it and the socket carries
// only which slot holds which samples (docs/protocol.md). Over TCP, batches
// travel in frames.
//
// Memory. A stream holds at most
//   stream_bytes = cache_bytes + (prefetch + 1) x batch bytes
//                  + (2 x its threads + 4) x chunk bytes
// (with shared memory, prefetch + 1 is the client's slot count: the slots are
// the client's memory, mapped by the daemon, and counted here too; a batch
// is every field's bytes, and an encoded dataset's sample is what the
// client's decode options make of it, 3 x height x width; a chunk is the
// largest read unit: every field's, or an encoded run of files)
// (the Loader's bound, loader.h), and the frames it has queued for the
// socket are batches of that pool (uncompressed) or at most 2 compressed
// copies. A stream's Loader exists only once its client has granted credit;
// a stream is admitted only while the sum of admitted streams' bounds (and
// of parked Loaders' holdings, which are evicted first to make room) stays
// within `memory_bytes` (otherwise the client gets an error frame naming the
// budget). Idle connections hold a few KiB. A session ends when its client
// does: a closed connection, or a protocol violation (the connection is
// closed at once), frees its stream and reservation. A client that stops reading
// stalls only its own stream: the server never queues more than
// min(credits, 2) batches for a client, and the Loader's pipeline then
// blocks on its pool.
//
// Threads. Start() returns once the sockets are bound; `io_threads` threads
// run Asio, and each streaming client has one producer thread pulling from
// its Loader. Stop() and every const member are thread-safe.
#ifndef GPUFEED_SERVER_H_
#define GPUFEED_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed {

struct ServerOptions {
  // Datasets served, each opened as the local Loader opens it: "file.h5" or
  // "file.h5:/images" (a single array, or encoded images, which each client
  // has decoded with its own DecodeOptions), or with named fields (below) or
  // many files (a glob, directory or list: fields.h). Clients name one by
  // this exact string, or get the first when they name none.
  std::vector<std::string> data;
  // fields[i]: data[i]'s named fields, "NAME=/hdf5/path" in the order
  // batches carry them (OpenOptions::fields; CLI: each --field after its
  // --data). Missing or empty: none. Longer than data: refused.
  std::vector<std::vector<std::string>> fields;
  // no_sample_axis[i]: each file of data[i] holds one sample whose datasets
  // have no sample axis, as DeepCAM's reference files do
  // (OpenOptions::no_sample_axis; CLI: --no-sample-axis after its --data).
  // Missing: false. Longer than data: refused.
  std::vector<bool> no_sample_axis;
  // "unix:PATH" (created with mode 0600; a stale socket file is replaced) or
  // "tcp://HOST:PORT" (HOST empty: 127.0.0.1; port 0: any free port).
  std::string listen = "unix:/tmp/gpufeed.sock";
  // A file holding the shared secret (trailing whitespace ignored). Required
  // for TCP; optional for a Unix socket (then checked as well).
  std::string token_file;
  // The Prometheus text endpoint GET /metrics: "PORT" or ":PORT" binds
  // 127.0.0.1 (loopback: the default, since the text names every client);
  // "HOST:PORT" binds HOST as given (0.0.0.0 only when asked for). Empty:
  // none. Plain HTTP, like the daemon's TCP transport: for trusted networks.
  std::string metrics_listen;
  // With a token (token_file), GET /metrics must carry it as
  // "Authorization: Bearer <token>" (Prometheus: `authorization:
  // credentials_file:`), else 401. Not in the URL: query strings end up in
  // logs. false: /metrics answers anyone who can reach its address.
  bool metrics_require_token = true;
  int io_threads = 2;                   // Asio threads
  int loader_threads = 0;               // TBB threads, shared by the streams (see above); 0: all cores
  int prefetch = 4;                     // each stream's Loader prefetch
  uint64_t cache_bytes = 256ull << 20;  // each stream's decoded-chunk cache
  uint64_t memory_bytes = 8ull << 30;   // budget for all admitted streams (see above)
  // Admission. A connection is pending from accept until its HELLO is valid
  // (decoded, the token right); then it is admitted. Pending connections
  // have their own cap and a short deadline, so connections that never
  // authenticate cannot keep out one that does: when a connection arrives
  // and max_pending_handshakes are pending, the oldest pending one gets an
  // error frame and is closed (a client that sends its HELLO at once is the
  // youngest, so it gets in unless that many connections arrive before its
  // HELLO does). Admitted connections beyond max_connections are refused
  // at their HELLO with an error frame ("too many connections").
  int max_connections = 64;         // admitted connections (past a valid HELLO)
  int max_pending_handshakes = 16;  // connections not yet past a valid HELLO
  int handshake_timeout_ms = 2000;  // from accept to a valid HELLO; then an error frame and close
  int idle_timeout_ms = 300000;     // no frame from the client and nothing to send
  int write_timeout_ms = 60000;     // one frame not accepted by the socket for this long: the client is dead
  int shutdown_grace_ms = 10000;    // Stop(): time for frames in flight to drain
  // Loaders of ended streams kept warm for the same client's next epoch or
  // reconnect (a stream that ended in an error, a protocol violation or a
  // timeout is not kept). A parked Loader keeps in the budget only what an
  // idle Loader holds (its cache, batch pool or mapped shared memory, spare
  // chunk buffers), and the parked ones are bounded: beyond max_parked
  // Loaders or max_parked_bytes of them, the oldest go. A new stream that
  // needs room evicts them too. max_parked_bytes 0: memory_bytes / 2.
  int max_parked = 16;
  uint64_t max_parked_bytes = 0;
  bool handle_signals = false;  // SIGINT/SIGTERM call Stop() (the CLI sets it)
  // A node-local server's lifetime (gpufeed.Loader(share="node"); CLI
  // --lease-file): every client process holds a shared flock(2) on this
  // file for as long as it may use the server, and the server stops once
  // none does (it polls for an exclusive lock every lease_poll_ms, and holds
  // that lock until it exits, so a process that takes the lease while it
  // stops waits for it and then starts a new one). A client that dies drops
  // its lock with its last descriptor. The file must exist at Start; empty:
  // no lease, the server runs until Stop() or a signal.
  std::string lease_file;
  int lease_poll_ms = 200;
  // With lease_file, for a server its clients start on demand (CLI
  // --lease-lock, --lease-remove): the file they flock exclusively while they
  // find or start a server (their start-up mutex), and other files of
  // theirs. When the server stops because no client holds the lease, it
  // removes its socket and then, if it takes this lock at once (no client
  // is starting a server meanwhile, which would reuse the files), removes
  // lease_file, the lease_remove files and this one, holding the lock as it
  // does: a finished job leaves nothing behind. A client that opened the
  // lock before and locks it after must check that the path still names the
  // file it locked and open it again if not (loader/door/node_share.cc does).
  // Stopped any other way (Stop(), a signal), the server removes only its
  // socket. Empty: no file is removed.
  std::string lease_lock_file;
  std::vector<std::string> lease_remove;
  // Receives one structured line per event ("ts=... level=info event=accept
  // ..."); called from any thread, one call at a time. Default: stderr.
  std::function<void(std::string_view)> log;
  std::string log_format = "kv";   // "kv" (key=value, logfmt) or "json" (one object a line)
  std::string log_level = "info";  // "debug", "info", "warn" or "error": lower levels are dropped
};

struct ServerStats {
  uint64_t connections_accepted = 0, connections_rejected = 0, connections_open = 0;
  uint64_t handshakes_pending = 0;  // connections not yet past a valid HELLO
  uint64_t handshakes_dropped = 0;  // pending connections closed for a newer one (max_pending_handshakes)
  uint64_t streams_active = 0;      // admitted streams with a Loader
  uint64_t batches_sent = 0, bytes_sent = 0;
  uint64_t protocol_errors = 0;                   // malformed frames, bad tokens, timeouts
  uint64_t reserved_bytes = 0;                    // sum of admitted streams' memory bounds and parked Loaders' holdings
  uint64_t loaders_parked = 0, parked_bytes = 0;  // parked Loaders and their part of reserved_bytes
  uint64_t queued_frames = 0;                     // frames waiting for sockets, all clients
};

class Server {
 public:
  // Checks the options, opens every dataset, binds (and for a Unix socket
  // creates the file), starts the threads. Errors name the option or file.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Stop() + Wait()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Where clients connect: "unix:/path" or "tcp://127.0.0.1:PORT" (the port
  // actually bound).
  const std::string& endpoint() const;
  const std::string& metrics_endpoint() const;  // "HOST:PORT", or empty

  // Graceful stop: no new connections; streams stop taking new batches, the
  // frames already queued are sent, each client gets a SHUTDOWN frame (its
  // RemoteLoader then resumes from where it stopped). Returns at once.
  void Stop();
  // Blocks until the server has stopped (after Stop() or a signal) and every
  // thread has exited. Returns OK after a graceful stop.
  Status Wait();

  ServerStats stats() const;
  std::string MetricsText() const;  // what GET /metrics returns

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_SERVER_H_
