// RemoteFile (hdf5io/io/http_file.h): ranged GETs through one curl multi
// handle per object, driven by its transfer thread.
#include "hdf5io/io/http_file.h"

#include <curl/curl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/cancel.h"
#include "common/mutex.h"
#include "hdf5io/io/object_store.h"
#include "hdf5io/io/remote_window.h"

namespace gpufeed::io {
namespace {

using Clock = std::chrono::steady_clock;

// How often the transfer thread looks at the cancel flags of its requests
// (common/cancel.h) while any has one: a cancelled read ends within it.
constexpr int kCancelCheckMs = 50;

// S3's empty payload hash: what a GET signs (and S3 requires the header).
constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr size_t kMaxErrorBody = 4096;

// The sized window's share of the open-file limit: each request in flight
// holds a connection (a descriptor), and the process needs others.
unsigned OpenFileShare() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1024;
  return static_cast<unsigned>(std::clamp<rlim_t>(r.rlim_cur / 4, 16, 1024));
}

std::string TrimHeader(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r' || s[b - 1] == '\n')) --b;
  return std::string(s.substr(a, b - a));
}

bool HeaderIs(std::string_view line, std::string_view name) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  }
  return true;
}

// <Code>X</Code> and <Message>Y</Message> of an S3 error body.
std::string XmlField(const std::string& body, const std::string& tag) {
  const size_t a = body.find("<" + tag + ">");
  if (a == std::string::npos) return {};
  const size_t s = a + tag.size() + 2;
  const size_t b = body.find("</" + tag + ">", s);
  if (b == std::string::npos) return {};
  return body.substr(s, std::min<size_t>(b - s, 200));
}

// One ranged GET, retried in place until it succeeds or fails for good.
struct Request {
  uint64_t off = 0;
  size_t n = 0;
  std::byte* dst = nullptr;
  bool probe = false;  // the open's bytes=0-0: learns the size and version
  // per attempt
  size_t got = 0;
  std::string etag, last_modified, content_range, body;
  bool overflow = false;
  CURL* easy = nullptr;
  char errbuf[CURL_ERROR_SIZE] = {};
  // across attempts
  int attempt = 0;
  Clock::time_point not_before{};
  // The flag of the thread that asked for it (common/cancel.h): once set,
  // the request ends at once, cancelled, and is not retried.
  CancelFlag cancel;
  // the outcome (guarded by Impl::mu)
  bool done = false;
  bool cancelled = false;  // ended by its flag: never a statement about the object
  Status status;
};

}  // namespace

Result<long> EnvLong(const char* name, long def, long lo, long hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return def;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || x < lo || x > hi) {
    return Status::InvalidArgument(std::string(name) + "='" + v + "': expected " + what + " from " +
                                   std::to_string(lo) + " to " + std::to_string(hi));
  }
  return x;
}

Status RemoteInit() {
  static CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) return Status::Internal(std::string("libcurl: global init: ") + curl_easy_strerror(rc));
  return Status::Ok();
}

struct RemoteFile::Impl {
  ObjectTarget target;
  RemoteOptions options;
  uint64_t size = 0;
  std::string version;  // ETag, else Last-Modified
  bool version_is_etag = false;
  bool stats_on_close = false;
  pid_t owner_pid = ::getpid();  // the process whose transfer thread this is

  CURLM* multi = nullptr;
  curl_slist* headers = nullptr;  // shared by every request: x-amz-*, If-Match
  std::thread driver;

  mutable Mutex mu;
  mutable CondVar cv;
  mutable std::deque<Request*> queued GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;

  struct Ahead {
    uint64_t off = 0;
    size_t n = 0;
    std::vector<std::byte> buf;
    Request req;
    bool claimed = false;
    Clock::time_point started;
  };
  mutable std::unordered_map<uint64_t, std::unique_ptr<Ahead>> ahead GUARDED_BY(mu);

  // The read-ahead's window (hdf5io/io/remote_window.h): re-sized by the
  // transfer thread as requests complete, unless GPUFEED_REMOTE_IN_FLIGHT
  // fixed it; read by WillRead and read_ahead() from any thread.
  WindowSizer sizer{WindowPolicy{}};  // the transfer thread's
  std::atomic<unsigned> window{64};
  std::atomic<double> latency_s{0};  // the sizer's last period's mean, for stats()
  std::atomic<unsigned> peak_window{64};
  // The window bounds the read-aheads in the link (asked, not yet done);
  // finished ones the reader has not taken yet (out of order, or a reader
  // behind) may hold as many buffers again, within the bytes budget. Fixed
  // (GPUFEED_REMOTE_IN_FLIGHT): that many buffers, done or not, as always.
  // Room: how many read-aheads of n bytes WillRead keeps; LinkFull: the
  // window's requests are all in the link.
  size_t Room(size_t n) const;
  bool LinkFull() const REQUIRES(mu);
  size_t Pending() const REQUIRES(mu);

  // Counters (the transfer thread writes; stats() reads).
  mutable std::atomic<uint64_t> requests{0}, retries{0}, bytes{0}, peak{0};
  // The driver's: seconds with a request in flight, and the sum of requests x seconds.
  std::atomic<double> busy_seconds{0}, weighted_seconds{0};

  // The driver's own.
  std::vector<CURL*> idle_easy;
  std::vector<Request*> waiting;  // retries not yet due
  std::unordered_set<Request*> inflight;
  std::mt19937 rng{std::random_device{}()};

  ~Impl();
  void Submit(Request* r) const EXCLUDES(mu);
  // Until r ends; or, when `caller` (the waiting thread's flag) is set
  // first, the cancelled status at once (r stays with the transfer thread).
  Status Wait(Request* r, const CancelFlag& caller = nullptr) const EXCLUDES(mu);
  void Run();
  void Start(Request* r);
  // The attempt's outcome: Ok, a Status to fail with, or retry (true).
  bool Finish(Request* r, CURLcode rc, Status* out);
  void Complete(Request* r, Status s) EXCLUDES(mu);
  // Run's steps: the attempts that ended (completed, or retried later), and
  // the requests whose flag is set ended, cancelled (in flight, waiting for
  // a retry, or `start`ing).
  void Reap();
  void EndCancelled(std::vector<Request*>* start);
  void CompleteCancelled(Request* r) EXCLUDES(mu);
  Status CancelledStatus(const Request& r) const;
  Status CheckVersion(const Request& r) const;
};

namespace {

size_t OnBody(char* p, size_t size, size_t nmemb, void* user) {
  auto* r = static_cast<Request*>(user);
  const size_t len = size * nmemb;
  long code = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
  if (code < 200 || code >= 300) {
    if (r->body.size() < kMaxErrorBody) r->body.append(p, std::min(len, kMaxErrorBody - r->body.size()));
    return len;
  }
  if (r->got + len > r->n) {
    // More than asked: a server that ignored the Range header (200 with the
    // whole object) or one that sent too much. Stop it here.
    r->overflow = true;
    return 0;
  }
  std::memcpy(r->dst + r->got, p, len);
  r->got += len;
  return len;
}

size_t OnHeader(char* p, size_t size, size_t nmemb, void* user) {
  auto* r = static_cast<Request*>(user);
  const std::string_view line(p, size * nmemb);
  if (line.starts_with("HTTP/")) {  // a new response (after a redirect or 100)
    r->etag.clear();
    r->last_modified.clear();
    r->content_range.clear();
  } else if (HeaderIs(line, "etag")) {
    r->etag = TrimHeader(line.substr(5));
  } else if (HeaderIs(line, "last-modified")) {
    r->last_modified = TrimHeader(line.substr(14));
  } else if (HeaderIs(line, "content-range")) {
    r->content_range = TrimHeader(line.substr(14));
  }
  return line.size();
}

}  // namespace

RemoteFile::Impl::~Impl() {
  {
    MutexLock lock(&mu);
    stop = true;
  }
  if (multi != nullptr) curl_multi_wakeup(multi);
  if (driver.joinable()) driver.join();
  for (CURL* e : idle_easy) curl_easy_cleanup(e);
  if (multi != nullptr) curl_multi_cleanup(multi);
  curl_slist_free_all(headers);
}

void RemoteFile::Impl::Submit(Request* r) const {
  {
    MutexLock lock(&mu);
    queued.push_back(r);
  }
  curl_multi_wakeup(multi);
}

Status RemoteFile::Impl::Wait(Request* r, const CancelFlag& caller) const {
  // Every request ends: its attempts have a time limit and are bounded in
  // number; the bound below only guards against a driver that stopped.
  const auto limit = std::chrono::milliseconds(
      int64_t{options.timeout_ms + options.connect_timeout_ms + 5000} * (options.retries + 1) + 60000);
  const auto deadline = Clock::now() + limit;
  MutexLock lock(&mu);
  while (!r->done) {
    if (IsCancelled(caller)) return CancelledStatus(*r);
    if (Clock::now() >= deadline) {
      return Status::IOError(target.named + ": a read of " + std::to_string(r->n) + " bytes at " +
                             std::to_string(r->off) + " did not end in " + std::to_string(limit.count() / 1000) +
                             " s (the transfer thread is stuck)");
    }
    cv.WaitFor(&mu, std::chrono::milliseconds(caller != nullptr ? kCancelCheckMs : 500));
  }
  return r->status;
}

Status RemoteFile::Impl::CancelledStatus(const Request& r) const {
  return Status::IOError(target.named + ": the read of " + std::to_string(r.n) + " bytes at " + std::to_string(r.off) +
                         " was cancelled: what read it stopped (a loader closed, an epoch ended)");
}

void RemoteFile::Impl::CompleteCancelled(Request* r) {
  MutexLock lock(&mu);
  r->status = CancelledStatus(*r);
  r->cancelled = true;
  r->done = true;
  cv.SignalAll();
}

void RemoteFile::Impl::Complete(Request* r, Status s) {
  MutexLock lock(&mu);
  r->status = std::move(s);
  r->done = true;
  cv.SignalAll();
}

void RemoteFile::Impl::Start(Request* r) {
  CURL* e = nullptr;
  if (!idle_easy.empty()) {
    e = idle_easy.back();
    idle_easy.pop_back();
    curl_easy_reset(e);
  } else {
    e = curl_easy_init();
  }
  r->easy = e;
  r->got = 0;
  r->overflow = false;
  r->etag.clear();
  r->last_modified.clear();
  r->content_range.clear();
  r->body.clear();
  r->errbuf[0] = '\0';
  const std::string range = std::to_string(r->off) + "-" + std::to_string(r->off + std::max<size_t>(r->n, 1) - 1);
  curl_easy_setopt(e, CURLOPT_URL, target.url.c_str());
  curl_easy_setopt(e, CURLOPT_RANGE, range.c_str());  // copied by libcurl
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(e, CURLOPT_PRIVATE, r);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(options.timeout_ms));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout_ms));
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  if (!options.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.ca_dir.empty()) curl_easy_setopt(e, CURLOPT_CAPATH, options.ca_dir.c_str());
  if (headers != nullptr) curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  if (target.sign) {
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, target.sigv4.c_str());
    curl_easy_setopt(e, CURLOPT_USERPWD, target.userpwd.c_str());
  } else {
    // A plain URL may redirect (a CDN, a mirror); a signed request must not.
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  }
  requests += 1;
}

Status RemoteFile::Impl::CheckVersion(const Request& r) const {
  const std::string& seen = version_is_etag ? r.etag : r.last_modified;
  if (version.empty() || seen.empty() || seen == version) return Status::Ok();
  return Status::Corrupt(target.named + ": the object changed while it was read (" +
                         (version_is_etag ? "ETag " : "Last-Modified ") + version + " when opened, " + seen +
                         " now): reopen it to read the new version; bytes of two versions are never mixed");
}

bool RemoteFile::Impl::Finish(Request* r, CURLcode rc, Status* out) {
  long code = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
  const std::string where = target.named + ": GET bytes " + std::to_string(r->off) + "+" + std::to_string(r->n);
  const std::string tries = r->attempt > 0 ? " (after " + std::to_string(r->attempt + 1) + " attempts)" : "";
  auto transient = [&](const std::string& why) {
    if (r->attempt < options.retries) return true;
    *out = Status::IOError(where + ": " + why + tries + "; GPUFEED_REMOTE_RETRIES and GPUFEED_REMOTE_TIMEOUT_MS " +
                           "set how many retries and how long each may take");
    return false;
  };
  if (rc != CURLE_OK && !(rc == CURLE_WRITE_ERROR && r->overflow)) {
    const std::string detail =
        std::string(curl_easy_strerror(rc)) + (r->errbuf[0] ? std::string(": ") + r->errbuf : "");
    switch (rc) {
      case CURLE_COULDNT_CONNECT:
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_PARTIAL_FILE:
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        return transient(detail);
      case CURLE_PEER_FAILED_VERIFICATION:
        *out = Status::InvalidArgument(target.named + ": " + detail + "; " + UntrustedCertificateHint(options));
        return false;
      default:
        *out = Status::IOError(where + ": " + detail);
        return false;
    }
  }
  if (code == 429 || code == 408 || code >= 500) {
    const std::string s3 = XmlField(r->body, "Code");
    return transient("HTTP " + std::to_string(code) + (s3.empty() ? "" : " " + s3));
  }
  if (code == 412 || code == 416) {
    *out = Status::Corrupt(target.named + ": the object changed since it was opened (HTTP " + std::to_string(code) +
                           (code == 412 ? ": If-Match " + version + " failed" : ": the range is past its end now") +
                           "): reopen it to read the new version; bytes of two versions are never mixed");
    return false;
  }
  if (code < 200 || code >= 300) {
    const std::string s3 = XmlField(r->body, "Code"), msg = XmlField(r->body, "Message");
    std::string text = target.named + ": HTTP " + std::to_string(code);
    if (!s3.empty()) text += " " + s3;
    if (!msg.empty()) text += " (" + msg + ")";
    if (code == 403 || code == 401) {
      text += "; access denied with credentials from " + target.credentials_from +
              " (docs/object_storage.md lists what is read)";
      *out = Status::InvalidArgument(text);
    } else if (code == 404) {
      *out = Status::NotFound(text + "; no such " + (target.sign ? "bucket or key" : "object"));
    } else if (code == 301 || code == 307) {
      *out = Status::InvalidArgument(text + "; the bucket is elsewhere: set AWS_REGION to its region");
    } else {
      *out = Status::IOError(text);
    }
    return false;
  }
  if (r->probe) {
    *out = Status::Ok();
    return false;
  }
  if (r->overflow || (code == 200 && r->off != 0)) {
    *out = Status::Unsupported(where + ": the server ignored the Range header (HTTP " + std::to_string(code) +
                               " with more than the range): gpufeed reads objects by ranges");
    return false;
  }
  if (Status v = CheckVersion(*r); !v.ok()) {
    *out = v;
    return false;
  }
  const uint64_t expect = r->off >= size ? 0 : std::min<uint64_t>(r->n, size - r->off);
  if (r->got != expect) {
    // A connection cut mid-body that curl did not see as one: retried.
    return transient("got " + std::to_string(r->got) + " of " + std::to_string(expect) + " bytes");
  }
  bytes += r->got;
  if (!options.in_flight_fixed) {
    curl_off_t us = 0;  // this attempt, start to end
    curl_easy_getinfo(r->easy, CURLINFO_TOTAL_TIME_T, &us);
    if (sizer.Completed(static_cast<double>(us) / 1e6, r->got, busy_seconds.load())) {
      window.store(sizer.window());
      latency_s.store(sizer.latency_s());
      peak_window.store(std::max(peak_window.load(), sizer.window()));
    }
  }
  *out = Status::Ok();
  return false;
}

void RemoteFile::Impl::Reap() {
  int left = 0;
  while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
    if (m->msg != CURLMSG_DONE) continue;
    CURL* e = m->easy_handle;
    const CURLcode rc = m->data.result;
    Request* r = nullptr;
    curl_easy_getinfo(e, CURLINFO_PRIVATE, reinterpret_cast<char**>(&r));
    Status s;
    const bool retry = Finish(r, rc, &s);
    curl_multi_remove_handle(multi, e);
    idle_easy.push_back(e);
    r->easy = nullptr;
    inflight.erase(r);
    if (retry && IsCancelled(r->cancel)) {
      CompleteCancelled(r);  // what asked for it stopped: no retry
    } else if (retry) {
      retries += 1;
      const int base = std::min(5000, options.backoff_ms << std::min(r->attempt, 10));
      r->attempt += 1;
      r->not_before = Clock::now() + std::chrono::milliseconds(base / 2 + static_cast<int>(rng() % (base / 2 + 1)));
      waiting.push_back(r);
    } else {
      Complete(r, std::move(s));
    }
  }
}

void RemoteFile::Impl::EndCancelled(std::vector<Request*>* start) {
  auto cancelled = [](Request* r) { return IsCancelled(r->cancel); };
  std::vector<Request*> ended;
  for (std::vector<Request*>* v : {start, &waiting}) {
    auto cut = std::stable_partition(v->begin(), v->end(), [&](Request* r) { return !cancelled(r); });
    ended.insert(ended.end(), cut, v->end());
    v->erase(cut, v->end());
  }
  for (auto it = inflight.begin(); it != inflight.end();) {
    Request* r = *it;
    if (!cancelled(r)) {
      ++it;
      continue;
    }
    // Cut off mid-transfer: libcurl closes its connection.
    curl_multi_remove_handle(multi, r->easy);
    idle_easy.push_back(r->easy);
    r->easy = nullptr;
    it = inflight.erase(it);
    ended.push_back(r);
  }
  for (Request* r : ended) CompleteCancelled(r);
}

void RemoteFile::Impl::Run() {
  std::vector<Request*> start;
  Clock::time_point last = Clock::now();
  for (;;) {
    {
      MutexLock lock(&mu);
      if (stop) break;
      while (!queued.empty()) {
        start.push_back(queued.front());
        queued.pop_front();
      }
    }
    const auto now = Clock::now();
    if (!inflight.empty()) {
      const double dt = std::chrono::duration<double>(now - last).count();
      busy_seconds.store(busy_seconds.load() + dt);
      weighted_seconds.store(weighted_seconds.load() + dt * static_cast<double>(inflight.size()));
    }
    last = now;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if ((*it)->not_before <= now) {
        start.push_back(*it);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
    EndCancelled(&start);
    for (Request* r : start) {
      Start(r);
      if (const CURLMcode mc = curl_multi_add_handle(multi, r->easy); mc != CURLM_OK) {
        idle_easy.push_back(r->easy);
        r->easy = nullptr;
        Complete(r, Status::Internal(target.named + ": libcurl: " + curl_multi_strerror(mc)));
        continue;
      }
      inflight.insert(r);
    }
    start.clear();
    peak = std::max<uint64_t>(peak.load(), static_cast<uint64_t>(inflight.size()));
    int running = 0;
    curl_multi_perform(multi, &running);
    Reap();
    int wait_ms = 1000;
    bool flagged = false;  // a request that may be cancelled: its flag is looked at every kCancelCheckMs
    for (Request* r : waiting) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(r->not_before - Clock::now()).count();
      wait_ms = std::clamp<int>(static_cast<int>(ms), 0, wait_ms);
      flagged = flagged || r->cancel != nullptr;
    }
    for (Request* r : inflight) flagged = flagged || r->cancel != nullptr;
    if (flagged) wait_ms = std::min(wait_ms, kCancelCheckMs);
    curl_multi_poll(multi, nullptr, 0, wait_ms, nullptr);
  }
  // Closing: what is still in flight or waiting fails (only read-aheads can
  // be: the object is destroyed after its last reader returned).
  std::vector<Request*> ended(inflight.begin(), inflight.end());
  for (Request* r : ended) {
    curl_multi_remove_handle(multi, r->easy);
    idle_easy.push_back(r->easy);
    r->easy = nullptr;
  }
  inflight.clear();
  {
    MutexLock lock(&mu);
    for (Request* r : queued) ended.push_back(r);
    queued.clear();
  }
  for (Request* r : waiting) ended.push_back(r);
  waiting.clear();
  for (Request* r : ended) Complete(r, Status::IOError(target.named + ": closed while a read was in flight"));
}

Result<RemoteOptions> RemoteOptions::FromEnv() {
  RemoteOptions o;
  auto in_flight = EnvLong("GPUFEED_REMOTE_IN_FLIGHT", o.in_flight, 1, 1024, "a number of requests");
  if (!in_flight.ok()) return in_flight.status();
  auto in_flight_mb =
      EnvLong("GPUFEED_REMOTE_IN_FLIGHT_MB", static_cast<long>(o.in_flight_bytes >> 20), 1, 65536, "MiB");
  if (!in_flight_mb.ok()) return in_flight_mb.status();
  auto timeout = EnvLong("GPUFEED_REMOTE_TIMEOUT_MS", o.timeout_ms, 100, 3600000, "milliseconds");
  if (!timeout.ok()) return timeout.status();
  auto retries = EnvLong("GPUFEED_REMOTE_RETRIES", o.retries, 0, 100, "a number of retries");
  if (!retries.ok()) return retries.status();
  auto backoff = EnvLong("GPUFEED_REMOTE_BACKOFF_MS", o.backoff_ms, 1, 60000, "milliseconds");
  if (!backoff.ok()) return backoff.status();
  // The CAs: AWS's variable (what the AWS CLI and boto3 read), curl's, then
  // OpenSSL's (what Python's ssl reads); libcurl reads none of them itself.
  for (const char* name : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || v[0] == '\0') continue;
    if (::access(v, R_OK) != 0) {
      return Status::InvalidArgument(std::string(name) + "='" + v + "': cannot read the CA bundle (" +
                                     std::strerror(errno) + "): name a readable PEM file of CA certificates");
    }
    o.ca_file = v;
    o.ca_from = name;
    break;
  }
  if (const char* dir = std::getenv("SSL_CERT_DIR"); dir != nullptr && dir[0] != '\0') {
    o.ca_dir = dir;
    if (o.ca_from.empty()) o.ca_from = "SSL_CERT_DIR";
  }
  o.in_flight = static_cast<unsigned>(*in_flight);
  const char* fixed = std::getenv("GPUFEED_REMOTE_IN_FLIGHT");
  o.in_flight_fixed = fixed != nullptr && fixed[0] != '\0';
  o.in_flight_bytes = static_cast<uint64_t>(*in_flight_mb) << 20;
  o.timeout_ms = static_cast<int>(*timeout);
  o.retries = static_cast<int>(*retries);
  o.backoff_ms = static_cast<int>(*backoff);
  return o;
}

std::string UntrustedCertificateHint(const RemoteOptions& options) {
  const std::string used = options.ca_from.empty()
                               ? std::string("the system's CA store")
                               : options.ca_from + "=" + (options.ca_file.empty() ? options.ca_dir : options.ca_file);
  return "the server's TLS certificate is not signed by a CA in " + used +
         ": set AWS_CA_BUNDLE (or CURL_CA_BUNDLE, SSL_CERT_FILE) to a PEM file holding the CA that signed it";
}

RemoteFile::RemoteFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteFile::~RemoteFile() {
  if (::getpid() != impl_->owner_pid) {
    // A forked child (the probe) closing what its parent opened: the
    // transfer thread is not in this process and the connections are the
    // parent's (closing them here could send on the parent's sockets).
    // Left alone; the child exits soon.
    (void)impl_.release();
    return;
  }
  if (impl_->stats_on_close) {
    const RemoteStats st = stats();
    std::fprintf(stderr,
                 "gpufeed: %s: %llu requests, %llu retries, %llu bytes, in flight: peak %llu, mean %.1f, window %u "
                 "(%s, at most %u, latency %.1f ms)\n",
                 impl_->target.named.c_str(), static_cast<unsigned long long>(st.requests),
                 static_cast<unsigned long long>(st.retries), static_cast<unsigned long long>(st.bytes),
                 static_cast<unsigned long long>(st.peak_in_flight), st.mean_in_flight, st.window,
                 impl_->options.in_flight_fixed ? "GPUFEED_REMOTE_IN_FLIGHT" : "sized", st.peak_window,
                 st.latency_s * 1000);
  }
}

Result<std::unique_ptr<RemoteFile>> RemoteFile::Open(std::string_view spec, const RemoteOptions& options) {
  GPUFEED_RETURN_IF_ERROR(RemoteInit());
  auto target = ResolveObject(spec);
  if (!target.ok()) return target.status();
  auto impl = std::make_unique<Impl>();
  impl->target = std::move(*target);
  impl->options = options;
  WindowPolicy policy;  // fixed: the cap is the window
  policy.initial = options.in_flight;
  policy.cap = options.in_flight_fixed ? options.in_flight : std::min(policy.cap, OpenFileShare());
  policy.budget_bytes = options.in_flight_bytes;
  impl->sizer = WindowSizer(policy);
  impl->window.store(options.in_flight_fixed ? options.in_flight : impl->sizer.window());
  impl->peak_window.store(impl->window.load());
  const char* st = std::getenv("GPUFEED_REMOTE_STATS");
  impl->stats_on_close = st != nullptr && std::strcmp(st, "1") == 0;
  impl->multi = curl_multi_init();
  if (impl->multi == nullptr) return Status::Internal(impl->target.named + ": libcurl: cannot make a multi handle");
  // Connections kept for reuse: one per request in flight.
  curl_multi_setopt(impl->multi, CURLMOPT_MAXCONNECTS, static_cast<long>(impl->sizer.policy().cap + 8));
  if (impl->target.sign) {
    impl->headers = curl_slist_append(impl->headers, (std::string("x-amz-content-sha256: ") + kEmptySha256).c_str());
    if (!impl->target.token.empty()) {
      impl->headers = curl_slist_append(impl->headers, ("x-amz-security-token: " + impl->target.token).c_str());
    }
  }
  Impl* p = impl.get();
  p->driver = std::thread([p] { p->Run(); });
  // The size and version: a one-byte range.
  std::byte first{};
  Request probe;
  probe.off = 0;
  probe.n = 1;
  probe.dst = &first;
  probe.probe = true;
  p->Submit(&probe);
  GPUFEED_RETURN_IF_ERROR(p->Wait(&probe));
  // Content-Range: bytes 0-0/SIZE (206); a 200 is the whole object.
  const size_t slash = probe.content_range.rfind('/');
  long code = 206;
  if (slash != std::string::npos && probe.content_range.substr(slash + 1) != "*") {
    p->size = std::strtoull(probe.content_range.c_str() + slash + 1, nullptr, 10);
  } else if (probe.content_range.empty()) {
    code = 200;
  }
  if (code == 200) {
    return Status::Unsupported(p->target.named +
                               ": the server ignored the Range header (it sent the whole object): gpufeed reads "
                               "objects by byte ranges, which S3 and most HTTP servers serve");
  }
  if (p->size == 0) return Status::Corrupt(p->target.named + ": the object is empty: not an HDF5 file");
  p->version_is_etag = !probe.etag.empty();
  p->version = p->version_is_etag ? probe.etag : probe.last_modified;
  if (p->version_is_etag) {
    p->headers = curl_slist_append(p->headers, ("If-Match: " + p->version).c_str());
  }
  return std::unique_ptr<RemoteFile>(new RemoteFile(std::move(impl)));
}

Result<size_t> RemoteFile::Read(uint64_t offset, std::byte* dst, size_t n) const {
  if (n == 0 || offset >= impl_->size) return size_t{0};
  Request r;
  r.off = offset;
  r.n = static_cast<size_t>(std::min<uint64_t>(n, impl_->size - offset));
  r.dst = dst;
  r.cancel = CurrentCancel();
  if (IsCancelled(r.cancel)) return impl_->CancelledStatus(r);
  impl_->Submit(&r);
  GPUFEED_RETURN_IF_ERROR(impl_->Wait(&r));
  return r.got;
}

int64_t RemoteFile::ReadAt(uint64_t key, std::byte* dst, size_t n, uint64_t offset) const {
  Impl& d = *impl_;
  std::unique_ptr<Impl::Ahead> taken;
  Impl::Ahead* claimed = nullptr;
  {
    MutexLock lock(&d.mu);
    auto it = d.ahead.find(key);
    if (it != d.ahead.end() && it->second->off == offset && it->second->n == n && !it->second->claimed) {
      claimed = it->second.get();
      claimed->claimed = true;  // now no one else takes or evicts it
    }
  }
  if (claimed != nullptr) {
    // Bounded, as every request's wait; at once when this thread's work is
    // cancelled (the read-ahead may be another stream's, not cancelled).
    const CancelFlag& caller = CurrentCancel();
    const Status waited = d.Wait(&claimed->req, caller);
    MutexLock lock(&d.mu);
    if (!waited.ok() && !claimed->req.done) {
      // The transfer thread still holds the request: the read-ahead stays
      // (claimed, never handed out, unless this thread was cancelled: then
      // it is a read-ahead again), this read fails.
      if (IsCancelled(caller)) claimed->claimed = false;
      SetReadErrorText(waited.message());
      return -EREMOTEIO;
    }
    auto it = d.ahead.find(key);
    taken = std::move(it->second);
    d.ahead.erase(it);
  }
  if (taken && !taken->req.cancelled) {  // a cancelled read-ahead is read again below
    if (!taken->req.status.ok()) {
      SetReadErrorText(taken->req.status.message());
      return -EREMOTEIO;
    }
    std::memcpy(dst, taken->buf.data(), taken->req.got);
    return static_cast<int64_t>(taken->req.got);
  }
  auto got = Read(offset, dst, n);
  if (!got.ok()) {
    SetReadErrorText(got.status().message());
    return -EREMOTEIO;
  }
  return static_cast<int64_t>(*got);
}

size_t RemoteFile::Impl::Room(size_t n) const {
  const size_t w = window.load(std::memory_order_relaxed);
  if (options.in_flight_fixed) return w;
  const uint64_t budget = n == 0 ? w : std::max<uint64_t>(1, options.in_flight_bytes / n);
  return std::min<uint64_t>(2 * w, budget);
}

size_t RemoteFile::Impl::Pending() const {
  size_t pending = 0;
  for (const auto& [key, a] : ahead) pending += a->req.done ? 0 : 1;
  return pending;
}

bool RemoteFile::Impl::LinkFull() const {
  if (options.in_flight_fixed) return false;
  const size_t w = window.load(std::memory_order_relaxed);
  return ahead.size() >= w && Pending() >= w;  // the scan only when it may be
}

void RemoteFile::WillRead(uint64_t key, uint64_t offset, size_t n) const {
  Impl& d = *impl_;
  if (n == 0 || offset >= d.size) return;
  n = static_cast<size_t>(std::min<uint64_t>(n, d.size - offset));
  CancelFlag flag = CurrentCancel();
  if (IsCancelled(flag)) return;
  {
    MutexLock lock(&d.mu);
    if (d.stop) return;
    if (auto it = d.ahead.find(key); it != d.ahead.end()) {
      const Impl::Ahead& was = *it->second;
      if (was.claimed || !was.req.done || !was.req.cancelled) return;
      d.ahead.erase(it);  // cancelled (its stream stopped): asked for again
    }
    if (d.LinkFull()) return;  // hinted again with the next batch
    if (d.ahead.size() >= d.Room(n)) {
      // Full: the oldest finished read nobody claimed gives its place up
      // (hints come in reading order, so it was skipped: a cache hit, an
      // epoch's end); none finished: this hint is dropped.
      auto oldest = d.ahead.end();
      for (auto it = d.ahead.begin(); it != d.ahead.end(); ++it) {
        if (it->second->req.done && !it->second->claimed &&
            (oldest == d.ahead.end() || it->second->started < oldest->second->started)) {
          oldest = it;
        }
      }
      if (oldest == d.ahead.end()) return;
      d.ahead.erase(oldest);
    }
    auto a = std::make_unique<Impl::Ahead>();
    a->off = offset;
    a->n = n;
    a->buf.resize(n);
    a->req.off = offset;
    a->req.n = n;
    a->req.dst = a->buf.data();
    a->req.cancel = std::move(flag);
    a->started = Clock::now();
    d.queued.push_back(&a->req);
    d.ahead.emplace(key, std::move(a));
  }
  curl_multi_wakeup(d.multi);
}

unsigned RemoteFile::read_ahead() const {
  // The loader hints this many chunks: the window's in the link and the
  // finished ones it has not taken yet (up to a window of them).
  const Impl& d = *impl_;
  const unsigned w = d.window.load(std::memory_order_relaxed);
  if (d.options.in_flight_fixed) return w;
  MutexLock lock(&d.mu);
  const size_t done = d.ahead.size() - d.Pending();
  return w + static_cast<unsigned>(std::min<size_t>(done, w));
}
uint64_t RemoteFile::size() const { return impl_->size; }
const std::string& RemoteFile::version() const { return impl_->version; }
const std::string& RemoteFile::named() const { return impl_->target.named; }
const std::string& RemoteFile::address() const { return impl_->target.url; }

RemoteStats RemoteFile::stats() const {
  RemoteStats s;
  s.requests = impl_->requests.load();
  s.retries = impl_->retries.load();
  s.bytes = impl_->bytes.load();
  s.peak_in_flight = impl_->peak.load();
  s.window = impl_->window.load();
  s.peak_window = impl_->peak_window.load();
  s.latency_s = impl_->latency_s.load();
  const double busy = impl_->busy_seconds.load();
  s.mean_in_flight = busy > 0 ? impl_->weighted_seconds.load() / busy : 0;
  return s;
}

}  // namespace gpufeed::io
