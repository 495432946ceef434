// A daemon connection, part 2: flow control — CREDIT (batches the client
// grants) and SLOTS (shared-memory slots it returns).
#include "daemon/session.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "daemon/server_core.h"
#include "loader/sampler.h"

namespace gpufeed::daemon {

namespace asio = boost::asio;
using std::chrono::milliseconds;

void Session::HandleCredit(std::span<const std::byte> payload) {
  auto n = DecodeCredit(payload);
  if (!n.ok()) {
    Fail(n.status(), true);
    return;
  }
  uint64_t total = 0;
  {
    MutexLock lock(&mu_);
    credits_ += *n;
    total = credits_;
  }
  if (total > kMaxCredits) {
    Fail(Status::InvalidArgument("granted " + std::to_string(total) + " outstanding batches (limit " +
                                 std::to_string(kMaxCredits) + ")"),
         true);
    return;
  }
  metrics_.credits = total;
  cv_.SignalAll();
  if (!producer_running_ && !loader_ && !draining_ && !awaiting_park_) StartProducer();
}

// A shared-memory client hands slots back (or grants them the first time):
// the batch it held there goes back to the pool, where the Loader fills it.
void Session::HandleSlots(std::span<const std::byte> payload) {
  auto slots = DecodeSlots(payload);
  if (!slots.ok()) {
    Fail(slots.status(), true);
    return;
  }
  for (uint32_t k : *slots) {
    if (k >= shm_client_holds_.size()) {
      Fail(Status::InvalidArgument("SLOTS names slot " + std::to_string(k) + " of " +
                                   std::to_string(shm_client_holds_.size())),
           true);
      return;
    }
    if (!shm_client_holds_[k]) {
      Fail(Status::InvalidArgument("SLOTS grants slot " + std::to_string(k) + ", which the daemon holds already"),
           true);
      return;
    }
    shm_client_holds_[k] = false;  // a duplicate within this frame fails above
  }
  // The first grant maps the memory; StartProducer hands the pool every slot
  // granted until then (this frame's, and any granted while it waited).
  const bool mapped = shm_pool_ != nullptr;
  if (!producer_running_ && !loader_ && !draining_ && !awaiting_park_) StartProducer();
  if (!mapped || state_ != State::kStreaming || !shm_pool_) return;
  for (uint32_t k : *slots) {
    if (shm_sent_[k].has_value()) {
      shm_sent_[k].reset();  // Batch's destructor: back to the pool
    } else {
      shm_pool_->pool.Release(shm_pool_->pool.slot(k));  // granted for the first time
    }
  }
  uint64_t daemon_holds = 0;
  for (bool c : shm_client_holds_) daemon_holds += c ? 0 : 1;
  metrics_.credits = daemon_holds;
}

}  // namespace gpufeed::daemon
