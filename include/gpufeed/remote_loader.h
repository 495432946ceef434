// RemoteLoader: the client of a `gpufeed serve` daemon, with the local
// Loader's iteration interface. Its batches are ordinary gpufeed::Batch
// objects in a pool of prefetch + 1 buffers (the Loader's pool type), so
// GpuFeeder and trainers take either through BatchSource. On a unix: address
// the pool is a sealed memfd the daemon maps and fills in place (page-locked
// with cudaHostRegister where a GPU is present); elsewhere, pinned memory
// that BATCH frames are read into.
//
//   gpufeed::RemoteLoaderOptions o;
//   o.address = "unix:/run/user/1000/gpufeed.sock";
//   o.loader = {.batch_size = 256, .order = gpufeed::Order::kBlock, .seed = 1, .rank = r, .world_size = w};
//   auto remote = gpufeed::RemoteLoader::Connect(o);
//   for (const gpufeed::Batch& b : (*remote)->Epoch(0)) { use(b.images(), b.labels()); }
//
// Order and resume. The daemon runs a Loader with the same (seed, epoch,
// rank, world size, order, window, batch size, drop_last, and an encoded
// dataset's decode options), so a remote stream delivers exactly the
// batches a local Loader would (info().fields and every field of each
// Batch included), and Epoch(e, n)
// after a lost connection or a daemon restart continues exactly where
// state() says the consumer stopped.
//
// Flow control. The client grants the daemon one credit per free pool slot
// (with shared memory: the slots themselves); the daemon never sends more
// batches than granted, so the client's memory is its pool, and the
// daemon's per client is bounded too.
//
// Errors. A daemon that is unreachable, refuses the token, stops answering
// for `io_timeout_ms`, sends a malformed frame or shuts down ends the stream
// with a Status (IOError, InvalidArgument, Corrupt) naming the daemon's
// address; nothing throws from Next(). Threads: one receiver thread per live
// stream; the consumer calls from one thread, as with Loader.
#ifndef GPUFEED_REMOTE_LOADER_H_
#define GPUFEED_REMOTE_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "gpufeed/encoded.h"
#include "gpufeed/loader.h"
#include "gpufeed/status.h"

namespace gpufeed {

struct RemoteLoaderOptions {
  std::string address;                        // "unix:PATH" or "tcp://HOST:PORT"
  std::string token;                          // the daemon's shared secret (or token_file)
  std::string token_file;                     // read when token is empty
  std::string dataset;                        // one of the daemon's --data; empty: its first
  std::string client_name = "remote-loader";  // in the daemon's logs and metrics
  // batch_size, order, seed, shuffle_window, rank, world_size and drop_last
  // define the stream (as for Loader); prefetch and pin_memory size the local
  // pool; threads and cache_bytes are the daemon's business and ignored.
  LoaderOptions loader;
  // An encoded image dataset (gpufeed/encoded.h): how the daemon decodes
  // this client's samples (output size, layout, transform, skip_corrupt),
  // as a local Loader over OpenEncodedImages(..., decode) would; part of
  // the stream's identity. Ignored for other datasets.
  DecodeOptions decode;
  bool compress = false;  // zstd payloads (for links slower than ~1 GB/s)
  // On a unix: address, the pool is a sealed memfd shared with the daemon,
  // whose Loader assembles batches straight into it: no copy, no checksum
  // of images, only a small frame per batch on the socket. Ignored on TCP
  // (and by a daemon that declines: batches then travel on the socket).
  bool shared_memory = true;
  int connect_timeout_ms = 5000;
  int io_timeout_ms = 30000;  // silence from the daemon this long ends a stream
  // While the consumer holds every batch of the pool (a pause: evaluation, a
  // checkpoint), a PING this often keeps the daemon from closing the stream
  // as idle (its --idle-timeout-ms, 300 s by default). 0: never.
  int keepalive_ms = 30000;
};

class RemoteLoader final : public BatchSource {
 public:
  // Connects once to check the address, token and stream options and learn
  // the dataset's shape (the connection is then closed; each Epoch() opens
  // its own). Fails with the daemon's error or IOError naming the address.
  static Result<std::unique_ptr<RemoteLoader>> Connect(const RemoteLoaderOptions& options);
  ~RemoteLoader() override;  // ends the live stream, if any
  RemoteLoader(const RemoteLoader&) = delete;
  RemoteLoader& operator=(const RemoteLoader&) = delete;

  // Opens a connection streaming epoch `epoch` from `start_batch`. Only one
  // stream may be alive at a time; starting another ends the previous one.
  // Connection failures surface from the stream's first Next().
  EpochStream Epoch(uint64_t epoch, uint64_t start_batch = 0) override;
  LoaderState state() const override;
  LoaderOptions sharding() const override;
  void SetReshard(const LoaderOptions::Reshard& r) override;
  const BatchSourceInfo& info() const override;  // as the daemon reported it
  uint64_t num_batches() const override;         // per epoch, for this rank
  const RemoteLoaderOptions& options() const;

 private:
  friend struct RemoteStream;
  struct Impl;
  explicit RemoteLoader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed

#endif  // GPUFEED_REMOTE_LOADER_H_
