// One client connection of the daemon: handshake, credits, and the stream
// that runs a Loader for it. Internal to daemon/; the public face is
// gpufeed/server.h.
//
// Threads. Everything but the producer runs on the connection's strand (the
// socket's executor). The producer thread pulls batches from the stream's
// Loader, encodes frames and posts them to the strand; it waits (100 ms
// slices, woken by credit, a finished write or shutdown) until the client has
// credit and fewer than kMaxQueued frames are waiting for the socket. So a
// client that stops reading holds at most kMaxQueued frames plus its
// Loader's pool.
//
// Lifetime. Pending Asio handlers hold the session (shared_ptr); while the
// producer runs, the session also holds itself and a work guard on the
// io_context, released by OnProducerDone() once the thread is joined. A read
// is pending for as long as the session streams (a closed client is seen at
// once, even mid-write); a protocol violation fails the session on the spot
// (error frame, producer stopped, close once the frame is written or after
// at most 2 s). The destructor gives back the reservation, or parks the
// Loader with only what it holds (not after an error: no_park_).
#ifndef GPUFEED_DAEMON_SESSION_H_
#define GPUFEED_DAEMON_SESSION_H_

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "daemon/datasets.h"
#include "loader/remote/protocol.h"
#include "loader/remote/shm.h"
#include "loader/batch_pool.h"
#include "gpufeed/dataset.h"
#include "gpufeed/loader.h"
#include "gpufeed/status.h"

namespace gpufeed::daemon {

class ServerCore;

// What /metrics shows of one client (read from any thread).
struct SessionMetrics {
  std::atomic<uint64_t> batches_sent{0}, bytes_sent{0}, samples_sent{0};
  std::atomic<uint64_t> credits{0}, queued{0};
  std::atomic<double> loader_samples_per_s{0}, cache_hit_rate{0}, loader_queue_depth{0};
  std::atomic<uint64_t> shared_chunk_hits{0};  // this epoch's chunks taken from other streams' caches
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Socket = boost::asio::generic::stream_protocol::socket;
  static constexpr int kMaxQueued = 2;  // frames waiting for the socket, per client

  Session(ServerCore& server, Socket socket, uint64_t id, std::string peer);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void Start();          // call on the strand (post)
  void BeginShutdown();  // call on the strand (post): drain, SHUTDOWN, close
  // Call on the strand (post): the server dropped this pending connection
  // for a newer one (ServerCore::AddPending). Error frame, close; nothing if
  // it got past its HELLO meanwhile.
  void DropPending(const std::string& why);
  uint64_t id() const { return id_; }
  // Any thread (the /metrics handler reads it while the strand sets it at
  // the handshake).
  std::string client_name() const;
  const SessionMetrics& metrics() const { return metrics_; }
  boost::asio::any_io_executor executor() { return socket_.get_executor(); }

 private:
  enum class State { kHandshake, kStreaming, kClosing, kClosed };
  struct OutFrame {
    HeaderBytes header;
    std::vector<std::byte> body;  // control payload, batch head, or a compressed batch
    Batch batch;                  // its fields sent from the Loader's slot (uncompressed BATCH)
    uint64_t samples = 0;
    int64_t shm_slot = -1;  // BATCH_REF: the slot its fields are in (not sent)
    bool is_batch = false;
    bool close_after = false;
  };

  void ReadHeader();
  void ReadHelloHeader(size_t got);  // recvmsg: the HELLO may carry a memfd
  void OnHeader();
  void OnFrame();
  void HandleHello(std::span<const std::byte> payload);
  bool AcceptSharedMemory(const Hello& h, uint64_t batch_bytes);
  void HandleCredit(std::span<const std::byte> payload);
  void HandleSlots(std::span<const std::byte> payload);
  int ThreadShare(uint64_t* divided_among) const;  // this stream's loader threads
  void StartProducer();
  std::string StreamKey() const;  // what identifies a parked Loader this stream may take
  // The client's memory mapped as the Loader's pool (or a parked mapping of
  // it reused); false: failed, and Fail was called.
  bool MapSharedMemory(std::unique_ptr<ShmPool>& parked_shm);
  bool AwaitPark();  // true: StartProducer runs again in a moment
  void Produce();    // the producer thread
  // The producer thread: the stream's next batch, or *stopped when the
  // producer is stopped while it waits (the stream's end then cancels its
  // reads in flight: an object store's retries are not waited out).
  Result<std::optional<Batch>> NextBatch(EpochStream& stream, bool* stopped);
  std::shared_ptr<OutFrame> BatchFrame(Batch b);  // the producer thread: a batch as the frame that carries it
  void OnProducerDone();
  void Enqueue(std::shared_ptr<OutFrame> f);
  void EnqueueControl(FrameType type, std::vector<std::byte> payload, bool close_after, uint16_t version = kVersion);
  void WriteNext();
  // Error frame, then close. `version`: the header's (a client of another
  // protocol version gets its ERROR in its own, so it can read why).
  void Fail(const Status& st, bool protocol_error, uint16_t version = kVersion);
  void CloseNow(const std::string& reason);
  void StopProducer();
  void ArmIdle();
  void MaybeFinishDrain();
  void Log(const char* level, const std::string& event, const std::string& fields);

  ServerCore& server_;
  Socket socket_;
  boost::asio::steady_timer handshake_timer_, idle_timer_, write_timer_, grace_timer_, park_timer_;
  const uint64_t id_;
  const std::string peer_;
  mutable Mutex name_mu_;
  std::string client_name_ GUARDED_BY(name_mu_);
  SessionMetrics metrics_;

  // Strand only.
  State state_ = State::kHandshake;
  HeaderBytes in_header_{};
  FrameHeader in_;
  std::vector<std::byte> in_payload_;
  bool writing_ = false;
  uint64_t write_seq_ = 0;
  bool draining_ = false, shutdown_sent_ = false, producer_running_ = false;
  bool loader_ok_ = false;      // the stream ended without a Loader error: the Loader may be parked
  bool park_expected_ = false;  // announced to server_ (ExpectPark) when END was queued
  bool awaiting_park_ = false;  // StartProducer waits for another session's Loader (AwaitPark)
  std::chrono::steady_clock::time_point park_deadline_;
  bool counted_open_ = false;  // in server_.streams_open
  bool pending_ = true;        // in server_'s pending handshakes (until a valid HELLO or the close)
  bool admitted_ = false;      // holds one of server_'s max_connections slots (from a valid HELLO to the close)
  // Ended by an error frame (a protocol violation, a timeout, a refusal) or
  // a write timeout: the client is hostile or dead, its Loader is not parked.
  bool no_park_ = false;
  uint64_t reserved_bytes_ = 0;
  // Of reserved_bytes_, what the Loader holds once its stream has ended
  // (cache, pool or mapping, spare chunk buffers): what a parked Loader
  // keeps in the budget. Set with reserved_bytes_ in StartProducer.
  uint64_t held_bytes_ = 0;
  std::shared_ptr<Session> keep_alive_;  // while the producer runs
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;

  // Set on the strand before the producer starts; read-only afterwards.
  Hello hello_;
  DatasetRegistry::Stream served_;  // the dataset's source for this stream (decode options applied)
  uint64_t num_batches_ = 0;
  // A batch slot's bytes per sample (SlotSampleBytes): the source's sample,
  // or with deferred decoding room for encoded ones.
  uint64_t slot_sample_bytes_ = 0;
  std::string stream_key_;  // dataset, decode options and stream parameters: which parked Loader fits

  // Shared memory (set on the strand; declared before loader_ so it
  // outlives it). The Loader assembles into shm_pool_, whose slots are views
  // of the client's memfd.
  UniqueFd hello_fd_;  // a descriptor that came with the HELLO, until mapped or closed
  bool shm_ = false;   // HELLO_OK said so: BATCH_REF and SLOTS
  uint64_t shm_stride_ = 0, shm_inode_ = 0;
  std::unique_ptr<ShmPool> shm_pool_;  // from the first SLOTS on (mapped, or a parked one reused)

  std::unique_ptr<Loader> loader_;  // declared before out_: queued batches go back to its pool first

  // Strand only (shm): which slots the client holds (granted by no SLOTS
  // since their BATCH_REF), and the batch in each until it is granted back.
  std::vector<bool> shm_client_holds_;
  std::vector<std::optional<Batch>> shm_sent_;
  std::thread producer_;

  std::deque<std::shared_ptr<OutFrame>> out_;  // strand only

  Mutex mu_;
  CondVar cv_;
  uint64_t credits_ GUARDED_BY(mu_) = 0;
  int queued_ GUARDED_BY(mu_) = 0;  // batch frames produced and not yet written
  bool stop_producer_ GUARDED_BY(mu_) = false;
};

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_SESSION_H_
