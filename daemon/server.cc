// Server: binds the listening socket, accepts sessions (pending ones
// capped by dropping the oldest, admitted ones capped at their HELLO:
// ServerOptions), renders /metrics (served by daemon/metrics_http.cc), and
// stops gracefully on Stop() or a signal. The registry of datasets, sessions
// and parked Loaders and the memory budget are ServerCore
// (daemon/server_core.cc); sessions do the rest (daemon/session*.cc).
#include "gpufeed/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/cores.h"
#include "common/mutex.h"
#include "loader/remote/address.h"
#include "loader/remote/conn.h"
#include "daemon/metrics_http.h"
#include "daemon/server_core.h"
#include "daemon/session.h"
#include "loader/remote/token.h"
#include "gpufeed/dataset.h"

namespace gpufeed {

namespace asio = boost::asio;
using daemon::ServerCore;
using daemon::Session;
using GenericProto = asio::generic::stream_protocol;

// ---------------------------------------------------------------------------
// Server::Impl

struct Server::Impl {
  explicit Impl(const ServerOptions& o)
      : core(o),
        acceptor(core.io),
        signals(core.io),
        control(asio::make_strand(core.io)),
        metrics(
            core.io, control, [this] { return Metrics(); },
            [this](const std::string& what) { core.Log("warn", "metrics_request", daemon::Kv("error", what)); }) {}

  ServerCore core;
  daemon::Address address;
  std::string endpoint;
  asio::basic_socket_acceptor<GenericProto> acceptor;
  asio::signal_set signals;
  // Serializes everything that touches the acceptors and the signal set:
  // their completion handlers and DoStop (Asio objects are not thread-safe;
  // TSan caught close() racing a re-armed async_accept).
  asio::strand<asio::io_context::executor_type> control;
  daemon::MetricsHttp metrics;  // GET /metrics (Boost.Beast), when --metrics is given
  std::vector<std::thread> threads;
  uint64_t next_id = 1;  // accept handler only (serialized: one accept at a time)
  std::atomic<bool> stop_requested{false};
  Mutex wait_mu;
  bool waited GUARDED_BY(wait_mu) = false;
  // The lease (ServerOptions::lease_file): its descriptor, held open (and,
  // once taken exclusively, locked) until the server is destroyed; the
  // timer that polls it runs on `control`.
  int lease_fd = -1;
  asio::steady_timer lease_timer{control};
  std::atomic<bool> lease_ended{false};  // stopped because no client held the lease

  ~Impl() {
    if (lease_fd >= 0) ::close(lease_fd);
  }

  Status Bind();
  Status OpenLease(const std::string& path);
  void PollLease();  // on `control`
  void RemoveLeaseFiles();
  void Accept();
  void Reject(GenericProto::socket socket, const std::string& why);
  void DoStop();  // on `control`
  std::string Metrics() const;
};

Status Server::Impl::Bind() {
  boost::system::error_code ec;
  if (address.kind == daemon::Address::Kind::kUnix) {
    const std::string& path = address.path;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return Status::InvalidArgument(path + " exists and is not a socket; choose another --listen path");
      }
      // A live daemon answers a connect; a stale socket file does not.
      // One of another user's (refused by the peer check) is live too.
      auto probe = daemon::Conn::Connect(address, 200);
      if (probe.ok()) return Status::InvalidArgument("another daemon is listening on " + path);
      if (probe.status().code() == StatusCode::kInvalidArgument) return probe.status();
      ::unlink(path.c_str());
    }
    GenericProto::endpoint ep{asio::local::stream_protocol::endpoint(path)};
    acceptor.open(ep.protocol(), ec);
    if (!ec) {
      // Mode 0600 from the moment the file exists: umask covers bind();
      // chmod below repeats it whatever the umask did.
      const mode_t old = ::umask(0177);
      acceptor.bind(ep, ec);
      ::umask(old);
      if (!ec) ::chmod(path.c_str(), 0600);
    }
    endpoint = address.ToString();
  } else {
    boost::system::error_code aec;
    const auto ip = asio::ip::make_address(address.host, aec);
    if (aec) return Status::InvalidArgument("--listen: '" + address.host + "' is not an IP address");
    GenericProto::endpoint ep{asio::ip::tcp::endpoint(ip, address.port)};
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(acceptor.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len);
      const uint16_t port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      address.port = port;
    }
    endpoint = address.ToString();
  }
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::IOError(address.ToString() + ": cannot listen: " + ec.message());
  return Status::Ok();
}

void Server::Impl::Accept() {
  acceptor.async_accept(
      asio::make_strand(core.io),
      asio::bind_executor(control, [this](const boost::system::error_code& ec, GenericProto::socket socket) {
        if (ec == asio::error::operation_aborted || core.stopping) return;
        if (ec) {
          core.Log("warn", "accept_failed", daemon::Kv("error", ec.message()));
          Accept();
          return;
        }
        // Admitted connections are capped at their HELLO and pending ones
        // by dropping the oldest (below); this bounds the descriptors of
        // both, with room for those closing (each within its 2 s grace).
        const uint64_t hard_cap = static_cast<uint64_t>(core.options.max_connections) +
                                  2 * static_cast<uint64_t>(core.options.max_pending_handshakes);
        if (core.open.load() >= hard_cap) {
          Reject(std::move(socket), "too many connections (" + std::to_string(hard_cap) +
                                        " open, --max-connections and --max-pending-handshakes); retry later");
        } else {
          boost::system::error_code oec;
          if (address.kind == daemon::Address::Kind::kTcp) {
            socket.set_option(asio::ip::tcp::no_delay(true), oec);
          }
          socket.set_option(asio::socket_base::send_buffer_size(4 << 20), oec);
          core.open += 1;
          core.accepted += 1;
          const uint64_t id = next_id++;
          std::string peer = address.kind == daemon::Address::Kind::kUnix ? "unix" : [&] {
            sockaddr_storage ss{};
            socklen_t len = sizeof ss;
            if (::getpeername(socket.native_handle(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
              return std::string("tcp");
            char host[64] = "?";
            if (ss.ss_family == AF_INET) {
              auto* in = reinterpret_cast<sockaddr_in*>(&ss);
              return asio::ip::address_v4(ntohl(in->sin_addr.s_addr)).to_string() + ":" +
                     std::to_string(ntohs(in->sin_port));
            }
            return std::string(host);
          }();
          auto session = std::make_shared<Session>(core, std::move(socket), id, std::move(peer));
          core.Register(session);
          // Pending until its HELLO is valid. Over the cap, the oldest
          // pending connection makes room: connections that never send a
          // valid HELLO cannot keep out one that does (server.h).
          std::shared_ptr<Session> drop = core.AddPending(session);
          asio::post(session->executor(), [session] { session->Start(); });
          if (drop) {
            const std::string why = std::to_string(core.options.max_pending_handshakes) +
                                    " connections were waiting for a HELLO (--max-pending-handshakes); this one, "
                                    "the oldest, is dropped for a newer one";
            asio::post(drop->executor(), [drop, why] { drop->DropPending(why); });
          }
        }
        Accept();
      }));
}

void Server::Impl::Reject(GenericProto::socket socket, const std::string& why) {
  core.rejected += 1;
  core.Log("warn", "reject", daemon::Kv("reason", why));
  auto s = std::make_shared<GenericProto::socket>(std::move(socket));
  auto frame = std::make_shared<std::vector<std::byte>>(
      daemon::MakeFrame(daemon::FrameType::kError, daemon::EncodeError({StatusCode::kUnsupported, why})));
  // The frame is tiny and the socket fresh: this write completes at once
  // (into the socket buffer) or fails; either way the socket is then closed.
  asio::async_write(*s, asio::buffer(*frame), [s, frame](const boost::system::error_code&, size_t) {
    boost::system::error_code ec;
    s->shutdown(asio::socket_base::shutdown_both, ec);
    s->close(ec);
  });
}

std::string Server::Impl::Metrics() const {
  std::string m;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& value) {
    m +=
        std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + value + "\n";
  };
  auto u = [](uint64_t v) { return std::to_string(v); };
  auto d = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", v);
    return std::string(b);
  };
  metric("gpufeed_connections_open", "gauge", "Connections open now.", u(core.open));
  metric("gpufeed_connections_accepted_total", "counter", "Connections accepted.", u(core.accepted));
  metric("gpufeed_connections_rejected_total", "counter", "Connections refused at the cap.", u(core.rejected));
  metric("gpufeed_connections_admitted", "gauge", "Connections past a valid HELLO (capped by --max-connections).",
         u(core.admitted));
  metric("gpufeed_handshakes_pending", "gauge",
         "Connections not yet past a valid HELLO (capped by --max-pending-handshakes).", u(core.pending()));
  metric("gpufeed_handshakes_dropped_total", "counter",
         "Pending connections dropped, the oldest first, to admit newer ones.", u(core.handshakes_dropped));
  metric("gpufeed_protocol_errors_total", "counter", "Malformed frames, wrong tokens, handshake timeouts.",
         u(core.protocol_errors));
  metric("gpufeed_streams_active", "gauge", "Streams with a running Loader.", u(core.streams_active));
  metric("gpufeed_loaders_parked", "gauge", "Warm Loaders kept for a client's next epoch or reconnect.",
         u(core.parked()));
  metric("gpufeed_loaders_parked_bytes", "gauge", "What the parked Loaders hold, within the memory reserved.",
         u(core.parked_bytes()));
  metric("gpufeed_loaders_parked_max", "gauge", "--max-parked.",
         u(static_cast<uint64_t>(std::max(0, core.options.max_parked))));
  metric("gpufeed_loaders_parked_max_bytes", "gauge", "--max-parked-bytes (0 given: half the memory budget).",
         u(core.ParkedBytesLimit()));
  metric("gpufeed_loaders_parked_evicted_total", "counter",
         "Parked Loaders dropped, the oldest first: beyond the bounds or for a new stream's room.",
         u(core.parked_evicted));
  metric("gpufeed_memory_reserved_bytes", "gauge",
         "Sum of admitted streams' memory bounds and parked Loaders' holdings.", u(core.reserved()));
  metric("gpufeed_memory_budget_bytes", "gauge", "--memory-bytes.", u(core.options.memory_bytes));
  metric("gpufeed_queued_frames", "gauge", "Batch frames waiting for client sockets.", u(core.queued));
  metric("gpufeed_batches_sent_total", "counter", "Batches written to clients.", u(core.batches_sent));
  metric("gpufeed_bytes_sent_total", "counter", "Bytes written to clients.", u(core.bytes_sent));
  const auto sessions = core.Sessions();
  struct Per {
    const char* name;
    const char* type;
    const char* help;
    std::string (*value)(const daemon::SessionMetrics&);
  };
  static const Per per[] = {
      {"gpufeed_client_batches_sent_total", "counter", "Batches sent to this client.",
       [](const daemon::SessionMetrics& s) { return std::to_string(s.batches_sent.load()); }},
      {"gpufeed_client_samples_sent_total", "counter", "Samples sent to this client.",
       [](const daemon::SessionMetrics& s) { return std::to_string(s.samples_sent.load()); }},
      {"gpufeed_client_bytes_sent_total", "counter", "Bytes sent to this client.",
       [](const daemon::SessionMetrics& s) { return std::to_string(s.bytes_sent.load()); }},
      {"gpufeed_client_credits", "gauge",
       "Batches the client has granted and not yet received (shared memory: slots the daemon holds).",
       [](const daemon::SessionMetrics& s) { return std::to_string(s.credits.load()); }},
      {"gpufeed_client_queued_frames", "gauge", "Frames waiting for this client's socket (at most 2 BATCH frames).",
       [](const daemon::SessionMetrics& s) { return std::to_string(s.queued.load()); }},
      {"gpufeed_client_loader_samples_per_second", "gauge", "This client's Loader throughput since its stream began.",
       [](const daemon::SessionMetrics& s) {
         char b[32];
         std::snprintf(b, sizeof b, "%.6g", s.loader_samples_per_s.load());
         return std::string(b);
       }},
      {"gpufeed_client_cache_hit_rate", "gauge", "This client's decoded-chunk cache hit rate.",
       [](const daemon::SessionMetrics& s) {
         char b[32];
         std::snprintf(b, sizeof b, "%.6g", s.cache_hit_rate.load());
         return std::string(b);
       }},
      {"gpufeed_client_shared_chunk_hits", "gauge",
       "Chunks this client's stream took this epoch from other streams of the same file instead of reading them.",
       [](const daemon::SessionMetrics& s) { return std::to_string(s.shared_chunk_hits.load()); }},
      {"gpufeed_client_loader_queue_depth", "gauge", "Mean ready batches in this client's Loader at each pull.",
       [](const daemon::SessionMetrics& s) {
         char b[32];
         std::snprintf(b, sizeof b, "%.6g", s.loader_queue_depth.load());
         return std::string(b);
       }},
  };
  for (const Per& p : per) {
    m += std::string("# HELP ") + p.name + " " + p.help + "\n# TYPE " + p.name + " " + p.type + "\n";
    for (const auto& s : sessions) {
      m += std::string(p.name) + "{client=\"" + std::to_string(s->id()) + "\",name=\"" + s->client_name() + "\"} " +
           p.value(s->metrics()) + "\n";
    }
  }
  (void)d;
  return m;
}

Status Server::Impl::OpenLease(const std::string& path) {
  lease_fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (lease_fd < 0) {
    return Status::InvalidArgument("serve: lease file " + path + ": " + std::strerror(errno) +
                                   " (--lease-file names a file the clients hold a shared lock on; create it first)");
  }
  return Status::Ok();
}

// ServerOptions::lease_lock_file: the lease is held exclusively here (no
// client holds it, and one that asks waits until this process exits), the
// socket is gone. A client holding the start-up lock is starting a server
// that will use these files: they stay. Otherwise they go while the lock is
// held; a client blocked on the lock then holds a removed file, sees that
// its path names another file or none, and makes them anew (node_share.cc).
void Server::Impl::RemoveLeaseFiles() {
  const ServerOptions& o = core.options;
  if (o.lease_lock_file.empty()) return;
  const int fd = ::open(o.lease_lock_file.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat held {};
  struct stat now {};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    core.Log("info", "lease_files_kept", daemon::Kv("reason", "a client is starting a server"));
  } else if (::fstat(fd, &held) == 0 && ::lstat(o.lease_lock_file.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
             held.st_ino == now.st_ino) {
    ::unlink(o.lease_file.c_str());
    for (const std::string& f : o.lease_remove) ::unlink(f.c_str());
    ::unlink(o.lease_lock_file.c_str());
  }
  ::close(fd);
}

// No client holds the lease when an exclusive lock is granted at once: then
// the server stops, keeping the lock until the process exits (a client that
// asks for the lease meanwhile waits, then finds no server and starts one).
void Server::Impl::PollLease() {
  if (stop_requested) return;
  if (::flock(lease_fd, LOCK_EX | LOCK_NB) == 0) {
    core.Log("info", "lease_released", daemon::Kv("sessions", core.Sessions().size()));
    lease_ended = true;
    stop_requested = true;
    DoStop();
    return;
  }
  lease_timer.expires_after(std::chrono::milliseconds(std::max(1, core.options.lease_poll_ms)));
  lease_timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) PollLease();
  });
}

void Server::Impl::DoStop() {
  core.stopping = true;
  lease_timer.cancel();
  core.Log("info", "shutdown", daemon::Kv("sessions", core.Sessions().size()));
  boost::system::error_code ec;
  acceptor.close(ec);
  metrics.Close();
  signals.cancel(ec);
  for (auto& s : core.Sessions()) {
    asio::post(s->executor(), [s] { s->BeginShutdown(); });
  }
  core.DropParked();
}

// ---------------------------------------------------------------------------
// Server

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Stop();
  (void)Wait();
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& o) {
  if (o.data.empty()) return Status::InvalidArgument("serve: no dataset (--data FILE)");
  if (o.io_threads < 1 || o.prefetch < 1 || o.max_connections < 1 || o.max_pending_handshakes < 1 ||
      o.handshake_timeout_ms < 1 || o.idle_timeout_ms < 1 || o.write_timeout_ms < 1 || o.shutdown_grace_ms < 0) {
    return Status::InvalidArgument(
        "serve: threads, prefetch, max connections, max pending handshakes and timeouts must be positive");
  }
  if (o.max_parked < 0) return Status::InvalidArgument("serve: --max-parked must be 0 or more");
  auto addr = daemon::ParseAddress(o.listen);
  if (!addr.ok()) return addr.status().WithContext("--listen");
  auto log = daemon::EventLog::Create(o.log_format, o.log_level, o.log);
  if (!log.ok()) return log.status();
  auto impl = std::make_unique<Impl>(o);
  impl->core.SetLog(std::move(*log));
  impl->address = *addr;
  ServerCore& core = impl->core;
  core.loader_threads = o.loader_threads > 0 ? o.loader_threads : AvailableCores();
  if (!o.token_file.empty()) {
    auto t = daemon::ReadTokenFile(o.token_file);
    if (!t.ok()) return t.status();
    core.token = *t;
  } else if (addr->kind == daemon::Address::Kind::kTcp) {
    return Status::InvalidArgument("serve: TCP (" + o.listen +
                                   ") needs --token-file: a shared secret clients must send");
  }
  if (o.fields.size() > o.data.size()) {
    return Status::InvalidArgument("serve: named fields (--field) given before any --data they would belong to");
  }
  if (o.no_sample_axis.size() > o.data.size()) {
    return Status::InvalidArgument("serve: --no-sample-axis given before any --data it would belong to");
  }
  for (size_t i = 0; i < o.data.size(); ++i) {
    OpenOptions open;
    open.logger = core.library_logger;
    if (i < o.fields.size()) open.fields = o.fields[i];
    open.no_sample_axis = i < o.no_sample_axis.size() && o.no_sample_axis[i];
    GPUFEED_RETURN_IF_ERROR(core.datasets.Add(o.data[i], std::move(open)));
  }
  if (!o.lease_file.empty()) GPUFEED_RETURN_IF_ERROR(impl->OpenLease(o.lease_file));
  // Each dataset's one cache, shared by its streams (loader::SharedChunks),
  // is reserved once; a budget too small for it serves without it.
  if (const uint64_t shared = core.datasets.ShareCaches(o.cache_bytes); shared > 0) {
    uint64_t after = 0;
    if (!core.Reserve(shared, &after)) {
      core.datasets.ShareCaches(0);
      core.Log("warn", "shared_cache_off",
               daemon::Kv("wanted_bytes", shared) + " " + daemon::Kv("memory_bytes", o.memory_bytes));
    }
  }
  GPUFEED_RETURN_IF_ERROR(impl->Bind());
  if (o.metrics_require_token) impl->metrics.RequireToken(core.token);  // empty: none to require
  Status st = o.metrics_listen.empty() ? Status::Ok() : impl->metrics.Bind(o.metrics_listen);
  if (!st.ok()) {
    if (addr->kind == daemon::Address::Kind::kUnix) ::unlink(addr->path.c_str());
    return st;
  }
  Impl* raw = impl.get();
  if (o.handle_signals) {
    raw->signals.add(SIGINT);
    raw->signals.add(SIGTERM);
    raw->signals.async_wait(asio::bind_executor(raw->control, [raw](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      raw->core.Log("info", "signal", daemon::Kv("signal", static_cast<uint64_t>(sig)));
      raw->stop_requested = true;
      raw->DoStop();
    }));
  }
  raw->Accept();
  if (!raw->metrics.endpoint().empty()) raw->metrics.Accept();  // no io thread runs yet
  if (raw->lease_fd >= 0) asio::post(raw->control, [raw] { raw->PollLease(); });
  const std::string data = core.datasets.Names();
  core.Log("info", "listen",
           daemon::Kv("endpoint", raw->endpoint) + " " + daemon::Kv("metrics", raw->metrics.endpoint()) + " " +
               daemon::Kv("data", data) + " " + daemon::Kv("io_threads", static_cast<uint64_t>(o.io_threads)) + " " +
               daemon::Kv("loader_threads", static_cast<uint64_t>(core.loader_threads)) + " " +
               daemon::Kv("memory_bytes", o.memory_bytes) + " " +
               daemon::Kv("token", core.token.empty() ? "no" : "yes") + " " +
               daemon::Kv("metrics_token",
                          !raw->metrics.endpoint().empty() && raw->metrics.requires_token() ? "yes" : "no"));
  for (int i = 0; i < o.io_threads; ++i) {
    raw->threads.emplace_back([raw] {
      // Handlers catch what they can; anything escaping is logged, and the
      // thread keeps serving (no exception crosses the thread root).
      for (;;) {
        try {
          raw->core.io.run();
          return;
        } catch (const std::exception& e) {
          raw->core.Log("error", "handler_exception", daemon::Kv("what", e.what()));
        } catch (...) {
          raw->core.Log("error", "handler_exception", "");
        }
      }
    });
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

const std::string& Server::endpoint() const { return impl_->endpoint; }
const std::string& Server::metrics_endpoint() const { return impl_->metrics.endpoint(); }

void Server::Stop() {
  if (impl_->stop_requested.exchange(true)) return;
  asio::post(impl_->control, [impl = impl_.get()] { impl->DoStop(); });
}

Status Server::Wait() {
  MutexLock lock(&impl_->wait_mu);
  if (impl_->waited) return Status::Ok();
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
  impl_->waited = true;
  if (impl_->address.kind == daemon::Address::Kind::kUnix) ::unlink(impl_->address.path.c_str());
  if (impl_->lease_ended) impl_->RemoveLeaseFiles();
  impl_->core.Log("info", "stopped",
                  daemon::Kv("batches_sent", impl_->core.batches_sent.load()) + " " +
                      daemon::Kv("bytes_sent", impl_->core.bytes_sent.load()));
  return Status::Ok();
}

ServerStats Server::stats() const {
  const ServerCore& c = impl_->core;
  ServerStats s;
  s.connections_accepted = c.accepted;
  s.connections_rejected = c.rejected;
  s.connections_open = c.open;
  s.handshakes_pending = c.pending();
  s.handshakes_dropped = c.handshakes_dropped;
  s.loaders_parked = c.parked();
  s.parked_bytes = c.parked_bytes();
  s.streams_active = c.streams_active;
  s.batches_sent = c.batches_sent;
  s.bytes_sent = c.bytes_sent;
  s.protocol_errors = c.protocol_errors;
  s.reserved_bytes = c.reserved();
  s.queued_frames = c.queued;
  return s;
}

std::string Server::MetricsText() const { return impl_->Metrics(); }

}  // namespace gpufeed
