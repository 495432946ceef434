// ServerCore: what the daemon's connections share — the datasets, the
// registry of sessions and parked Loaders, the memory budget, the log.
#include "daemon/server_core.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "daemon/session.h"

namespace gpufeed::daemon {

namespace {

class EventLogger final : public Logger {
 public:
  explicit EventLogger(ServerCore* core) : core_(core) {}
  void Log(LogLevel level, std::string_view event, std::string_view message) override {
    core_->Log(std::string(LogLevelName(level)).c_str(), std::string(event), Kv("message", std::string(message)));
  }

 private:
  ServerCore* const core_;
};

}  // namespace

ServerCore::ServerCore(const ServerOptions& o) : library_logger(std::make_shared<EventLogger>(this)), options(o) {}

void ServerCore::Log(const char* level, const std::string& event, const std::string& fields) {
  if (log_) log_->Log(level, event, fields);
}

void ServerCore::StreamOpened() {
  const uint64_t now_open = streams_open.fetch_add(1) + 1;
  MutexLock lock(&peak_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now_open >= peak_streams_ || now - peak_time_ > kPeakWindow) {
    peak_streams_ = now_open;
    peak_time_ = now;
  }
}

void ServerCore::StreamClosed() { streams_open -= 1; }

uint64_t ServerCore::RecentPeakStreams() {
  const uint64_t now_open = streams_open.load();
  MutexLock lock(&peak_mu_);
  if (std::chrono::steady_clock::now() - peak_time_ > kPeakWindow) return std::max<uint64_t>(1, now_open);
  return std::max<uint64_t>({1, now_open, peak_streams_});
}

bool ServerCore::Reserve(uint64_t bytes, uint64_t* after) {
  std::vector<Parked> evicted;  // destroyed outside the lock
  bool ok = false;
  {
    MutexLock lock(&mu_);
    while (reserved_ + bytes > options.memory_bytes && !parked_.empty()) EvictOldestLocked(&evicted);
    if (reserved_ + bytes <= options.memory_bytes) {
      reserved_ += bytes;
      *after = reserved_;
      ok = true;
    }
  }
  return ok;
}

void ServerCore::Park(const std::string& key, std::unique_ptr<Loader> loader, uint64_t reserved_bytes,
                      std::unique_ptr<ShmPool> shm, bool expected) {
  std::vector<Parked> evicted;
  {
    MutexLock lock(&mu_);
    if (expected) EndExpectedLocked(key);
    parked_.push_back({key, std::move(shm), std::move(loader), reserved_bytes});
    parked_bytes_ += reserved_bytes;
    const size_t max_count = static_cast<size_t>(std::max(0, options.max_parked));
    const uint64_t max_bytes = ParkedBytesLimit();
    while (!parked_.empty() && (parked_.size() > max_count || parked_bytes_ > max_bytes)) {
      EvictOldestLocked(&evicted);
    }
  }
}

void ServerCore::EvictOldestLocked(std::vector<Parked>* out) {
  reserved_ -= parked_.front().reserved_bytes;
  parked_bytes_ -= parked_.front().reserved_bytes;
  parked_evicted += 1;
  out->push_back(std::move(parked_.front()));
  parked_.erase(parked_.begin());
}

uint64_t ServerCore::ParkedBytesLimit() const {
  return options.max_parked_bytes > 0 ? options.max_parked_bytes : options.memory_bytes / 2;
}

std::unique_ptr<Loader> ServerCore::Take(const std::string& key, uint64_t* reserved_bytes,
                                         std::unique_ptr<ShmPool>* shm, uint64_t shm_inode) {
  MutexLock lock(&mu_);
  auto pick = parked_.rend();
  for (auto it = parked_.rbegin(); it != parked_.rend(); ++it) {
    if (it->key != key) continue;
    if (pick == parked_.rend()) pick = it;
    if (shm_inode != 0 && it->shm && it->shm->region.inode() == shm_inode) {  // this client's own memory
      pick = it;
      break;
    }
  }
  if (pick == parked_.rend()) return nullptr;
  std::unique_ptr<Loader> l = std::move(pick->loader);
  *reserved_bytes = pick->reserved_bytes;
  parked_bytes_ -= pick->reserved_bytes;
  if (shm != nullptr) *shm = std::move(pick->shm);
  parked_.erase(std::next(pick).base());
  return l;
}

void ServerCore::ExpectPark(const std::string& key) {
  MutexLock lock(&mu_);
  parks_expected_[key] += 1;
}

void ServerCore::ParkAbandoned(const std::string& key) {
  MutexLock lock(&mu_);
  EndExpectedLocked(key);
}

void ServerCore::EndExpectedLocked(const std::string& key) {
  auto it = parks_expected_.find(key);
  if (it != parks_expected_.end() && --it->second <= 0) parks_expected_.erase(it);
}

bool ServerCore::ParkExpected(const std::string& key) const {
  MutexLock lock(&mu_);
  return parks_expected_.count(key) != 0;
}

size_t ServerCore::parked() const {
  MutexLock lock(&mu_);
  return parked_.size();
}

uint64_t ServerCore::parked_bytes() const {
  MutexLock lock(&mu_);
  return parked_bytes_;
}

void ServerCore::DropParked() {
  std::vector<Parked> dropped;  // destroyed outside the lock
  MutexLock lock(&mu_);
  for (Parked& p : parked_) reserved_ -= p.reserved_bytes;
  parked_bytes_ = 0;
  dropped = std::move(parked_);
  parked_.clear();
}
void ServerCore::Unreserve(uint64_t bytes) {
  MutexLock lock(&mu_);
  reserved_ -= bytes;
}
uint64_t ServerCore::reserved() const {
  MutexLock lock(&mu_);
  return reserved_;
}

void ServerCore::Register(const std::shared_ptr<Session>& s) {
  MutexLock lock(&mu_);
  sessions_[s->id()] = s;
}
void ServerCore::Unregister(uint64_t id) {
  MutexLock lock(&mu_);
  sessions_.erase(id);
}
std::shared_ptr<Session> ServerCore::AddPending(const std::shared_ptr<Session>& s) {
  MutexLock lock(&mu_);
  pending_[s->id()] = s;
  const auto cap = static_cast<size_t>(std::max(1, options.max_pending_handshakes));
  while (pending_.size() > cap) {
    auto oldest = pending_.begin();
    std::shared_ptr<Session> drop = oldest->second.lock();
    pending_.erase(oldest);
    if (drop) return drop;  // one gone already is not counted: look further
  }
  return nullptr;
}

void ServerCore::LeavePending(uint64_t id) {
  MutexLock lock(&mu_);
  pending_.erase(id);
}

size_t ServerCore::pending() const {
  MutexLock lock(&mu_);
  return pending_.size();
}

bool ServerCore::Admit() {
  const auto cap = static_cast<uint64_t>(options.max_connections);
  uint64_t now = admitted.load();
  while (now < cap) {
    if (admitted.compare_exchange_weak(now, now + 1)) return true;
  }
  return false;
}

std::vector<std::shared_ptr<Session>> ServerCore::Sessions() const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Session>> v;
  for (const auto& [id, w] : sessions_) {
    if (auto s = w.lock()) v.push_back(std::move(s));
  }
  return v;
}

}  // namespace gpufeed::daemon
