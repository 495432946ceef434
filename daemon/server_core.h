// ServerCore: what every session of the daemon shares — options, the opened
// datasets, the memory budget, counters, the session registry and the log.
// Internal to daemon/.
#ifndef GPUFEED_DAEMON_SERVER_CORE_H_
#define GPUFEED_DAEMON_SERVER_CORE_H_

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <boost/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/datasets.h"
#include "daemon/event_log.h"
#include "loader/remote/shm.h"
#include "gpufeed/dataset.h"
#include "loader/chunk_cache.h"
#include "gpufeed/loader.h"
#include "gpufeed/server.h"

namespace gpufeed::daemon {

class Session;

class ServerCore {
 public:
  explicit ServerCore(const ServerOptions& o);

  // Thread-safe. `fields` is "key=value ..." (values quoted where needed).
  void Log(const char* level, const std::string& event, const std::string& fields);
  // The library's Logger (OpenOptions / LoaderOptions::logger) for the
  // datasets and loaders of this server: their notes go to the event log
  // ("message" field) instead of stderr.
  const std::shared_ptr<Logger> library_logger;
  void SetLog(std::unique_ptr<EventLog> log) { log_ = std::move(log); }  // before the first Log
  // Admits `bytes` more within memory_bytes, evicting parked Loaders (oldest
  // first) to make room; false when they still do not fit.
  bool Reserve(uint64_t bytes, uint64_t* reserved_after);
  void Unreserve(uint64_t bytes);
  uint64_t reserved() const;

  // Loaders of ended streams, kept warm (cache, pool) for the next
  // connection with the same stream identity `key` (a client's next epoch,
  // or its reconnect). A parked Loader keeps `reserved_bytes` of the budget
  // (the session passes what an idle Loader holds, having given back the
  // rest); Take() hands both over. At most options.max_parked Loaders and
  // ParkedBytesLimit() bytes are parked: beyond, the oldest go (Park
  // evicts them, counted in parked_evicted). Thread-safe.
  // A shared-memory stream's Loader is parked with its ShmPool (the Loader
  // fills that pool); Take() prefers the one mapping the client's memfd
  // `shm_inode` and hands the ShmPool over through `shm`.
  // `expected`: the session had announced it with ExpectPark.
  void Park(const std::string& key, std::unique_ptr<Loader> loader, uint64_t reserved_bytes,
            std::unique_ptr<ShmPool> shm = nullptr, bool expected = false);
  std::unique_ptr<Loader> Take(const std::string& key, uint64_t* reserved_bytes,
                               std::unique_ptr<ShmPool>* shm = nullptr, uint64_t shm_inode = 0);
  size_t parked() const;
  uint64_t parked_bytes() const;
  uint64_t ParkedBytesLimit() const;  // options.max_parked_bytes, or memory_bytes / 2 when 0
  void DropParked();                  // at shutdown
  // A stream that ends its epoch parks its Loader when its session goes,
  // which is a moment after the END frame is on its way: the client's next
  // epoch may connect in between. The session announces the park when it
  // queues END (ExpectPark) and ends the announcement by parking (Park with
  // expected) or, when it cannot, ParkAbandoned. While a park with `key` is
  // expected, a new session with that key waits for it (bounded) instead of
  // building a cold Loader beside it.
  void ExpectPark(const std::string& key);
  void ParkAbandoned(const std::string& key);
  bool ParkExpected(const std::string& key) const;

  void Register(const std::shared_ptr<Session>& s);
  void Unregister(uint64_t id);
  std::vector<std::shared_ptr<Session>> Sessions() const;

  // Admission (server.h, ServerOptions::max_pending_handshakes). A session
  // is pending from accept (AddPending) until its HELLO is valid or it
  // closes (LeavePending; idempotent). AddPending returns the oldest pending
  // session when there are more than the cap: the caller drops it (it is no
  // longer counted as pending). Admit() takes one of max_connections slots
  // for a session past a valid HELLO (false: full); Unadmit() gives it back.
  std::shared_ptr<Session> AddPending(const std::shared_ptr<Session>& s);
  void LeavePending(uint64_t id);
  size_t pending() const;
  bool Admit();
  void Unadmit() { admitted -= 1; }

  const ServerOptions options;
  boost::asio::io_context io;
  std::string token;  // empty: none required
  int loader_threads = 1;
  // The served datasets (filled at Start) and the chunks their streams share.
  DatasetRegistry datasets;
  std::atomic<bool> stopping{false};

  std::atomic<uint64_t> accepted{0}, rejected{0}, open{0}, streams_active{0};
  std::atomic<uint64_t> streams_open{0};  // connections past a streaming HELLO, not yet closed
  // streams_open, +1 or -1; keeps the peak of the last kPeakWindow.
  void StreamOpened();
  void StreamClosed();
  // The most streams open at once in the last kPeakWindow (at least now's):
  // how many ways the loader threads are divided. The ranks of a job connect
  // one by one at each epoch; the previous epoch says how many there are.
  uint64_t RecentPeakStreams();
  static constexpr std::chrono::seconds kPeakWindow{30};
  std::atomic<uint64_t> batches_sent{0}, bytes_sent{0}, protocol_errors{0}, queued{0};
  std::atomic<uint64_t> admitted{0};            // sessions past a valid HELLO, not yet closed
  std::atomic<uint64_t> handshakes_dropped{0};  // pending sessions dropped for newer ones
  std::atomic<uint64_t> parked_evicted{0};      // parked Loaders dropped by the bounds or for room

 private:
  void EndExpectedLocked(const std::string& key) REQUIRES(mu_);
  mutable Mutex mu_;
  std::map<uint64_t, std::weak_ptr<Session>> sessions_ GUARDED_BY(mu_);
  std::map<uint64_t, std::weak_ptr<Session>> pending_ GUARDED_BY(mu_);  // by id: oldest first
  uint64_t reserved_ GUARDED_BY(mu_) = 0;
  uint64_t parked_bytes_ GUARDED_BY(mu_) = 0;  // the parked_ entries' reserved_bytes, summed
  struct Parked {
    std::string key;
    std::unique_ptr<ShmPool> shm;  // before loader: the Loader (pointing into it) goes first
    std::unique_ptr<Loader> loader;
    uint64_t reserved_bytes = 0;
  };
  std::vector<Parked> parked_ GUARDED_BY(mu_);                 // oldest first
  std::map<std::string, int> parks_expected_ GUARDED_BY(mu_);  // key -> sessions about to park
  // Removes parked_.front() from the budget and the list into `out`.
  void EvictOldestLocked(std::vector<Parked>* out) REQUIRES(mu_);
  Mutex peak_mu_;
  uint64_t peak_streams_ GUARDED_BY(peak_mu_) = 0;
  std::chrono::steady_clock::time_point peak_time_ GUARDED_BY(peak_mu_);  // when last reached
  std::unique_ptr<EventLog> log_;
};

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_SERVER_CORE_H_
