// A daemon connection: handshake -> credits -> batches, on one strand, with a
// producer thread per streaming client (see session.h). This file: its life
// (start, timers, failure, close, drain); session_handshake.cc,
// session_flow.cc, session_producer.cc and session_writer.cc the rest.
#include "daemon/session.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "daemon/server_core.h"
#include "loader/sampler.h"

namespace gpufeed::daemon {

namespace asio = boost::asio;
using std::chrono::milliseconds;

Session::Session(ServerCore& server, Socket socket, uint64_t id, std::string peer)
    : server_(server),
      socket_(std::move(socket)),
      handshake_timer_(socket_.get_executor()),
      idle_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      grace_timer_(socket_.get_executor()),
      park_timer_(socket_.get_executor()),
      id_(id),
      peer_(std::move(peer)),
      client_name_("client-" + std::to_string(id)) {}

std::string Session::client_name() const {
  MutexLock lock(&name_mu_);
  return client_name_;
}

Session::~Session() {
  // OnProducerDone joined the producer before the last reference could go.
  if (producer_.joinable()) producer_.join();
  out_.clear();  // batches back to the Loader's pool before the Loader goes
  shm_sent_.clear();
  bool parked = false;
  if (pending_) server_.LeavePending(id_);
  if (admitted_) server_.Unadmit();
  if (reserved_bytes_ > 0) {
    server_.streams_active -= 1;
    if (loader_ && loader_ok_ && !no_park_ && !server_.stopping) {
      // Warm for this client's next epoch or reconnect, keeping in the
      // budget what it holds (and its shared memory); the rest of the
      // stream's bound (in-flight chunk buffers, compressed copies) goes back.
      const uint64_t keep = std::min(reserved_bytes_, held_bytes_);
      if (keep < reserved_bytes_) server_.Unreserve(reserved_bytes_ - keep);
      server_.Park(stream_key_, std::move(loader_), keep, std::move(shm_pool_), park_expected_);
      parked = true;
    } else {
      loader_.reset();
      shm_pool_.reset();
      server_.Unreserve(reserved_bytes_);
    }
  }
  if (park_expected_ && !parked) server_.ParkAbandoned(stream_key_);
  if (counted_open_) server_.StreamClosed();
  server_.Unregister(id_);
  server_.open -= 1;
}

void Session::Log(const char* level, const std::string& event, const std::string& fields) {
  server_.Log(level, event, Kv("client", id_) + " " + Kv("peer", peer_) + (fields.empty() ? "" : " " + fields));
}

void Session::Start() {
  Log("info", "accept", "");
  auto self = shared_from_this();
  handshake_timer_.expires_after(milliseconds(server_.options.handshake_timeout_ms));
  handshake_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec && self->state_ == State::kHandshake) {
      self->Fail(Status::InvalidArgument("no valid HELLO within " +
                                         std::to_string(self->server_.options.handshake_timeout_ms) + " ms"),
                 true);
    }
  });
  ReadHeader();
}

void Session::ArmIdle() {
  auto self = shared_from_this();
  idle_timer_.expires_after(milliseconds(server_.options.idle_timeout_ms));
  idle_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec && self->state_ == State::kStreaming) {
      self->Fail(Status::IOError("idle for " + std::to_string(self->server_.options.idle_timeout_ms) +
                                 " ms (no frame from the client)"),
                 false);
    }
  });
}

void Session::Fail(const Status& st, bool protocol_error, uint16_t version) {
  if (state_ == State::kClosed || state_ == State::kClosing) return;
  if (protocol_error) server_.protocol_errors += 1;
  no_park_ = true;
  Log(protocol_error ? "warn" : "info", "error",
      Kv("code", std::string(StatusCodeName(st.code()))) + " " + Kv("message", st.message()));
  state_ = State::kClosing;
  StopProducer();
  // Frames not yet on the wire are dropped so the error goes out next.
  while (out_.size() > (writing_ ? 1u : 0u)) {
    if (out_.back()->is_batch) {
      MutexLock lock(&mu_);
      --queued_;
      server_.queued -= 1;
    }
    out_.pop_back();
  }
  EnqueueControl(FrameType::kError, EncodeError({st.code(), st.message()}), true, version);
  // A client that does not read its error frame is closed anyway.
  auto self = shared_from_this();
  grace_timer_.expires_after(milliseconds(std::min(2000, server_.options.write_timeout_ms)));
  grace_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec) self->CloseNow("error frame not read in time");
  });
}

void Session::CloseNow(const std::string& reason) {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  if (pending_) {
    pending_ = false;
    server_.LeavePending(id_);
  }
  if (admitted_) {
    admitted_ = false;
    server_.Unadmit();
  }
  if (counted_open_) {
    counted_open_ = false;
    server_.StreamClosed();
  }
  char sps[32];
  std::snprintf(sps, sizeof sps, "%.0f", metrics_.loader_samples_per_s.load());
  Log("info", "close",
      Kv("reason", reason) + " " + Kv("batches_sent", metrics_.batches_sent.load()) + " " +
          Kv("bytes_sent", metrics_.bytes_sent.load()) + " " + Kv("loader_samples_per_s", sps) + " " +
          Kv("shared_chunk_hits", metrics_.shared_chunk_hits.load()));
  handshake_timer_.cancel();
  idle_timer_.cancel();
  write_timer_.cancel();
  grace_timer_.cancel();
  park_timer_.cancel();
  boost::system::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_both, ec);
  socket_.close(ec);
  StopProducer();
  while (out_.size() > (writing_ ? 1u : 0u)) {  // the one being written goes in its handler
    if (out_.back()->is_batch) {
      MutexLock lock(&mu_);
      --queued_;
      server_.queued -= 1;
    }
    out_.pop_back();
  }
}

void Session::BeginShutdown() {
  if (state_ == State::kClosed) return;
  if (state_ == State::kHandshake || state_ == State::kClosing) {
    CloseNow("daemon shutting down");
    return;
  }
  if (draining_) return;
  draining_ = true;
  StopProducer();
  auto self = shared_from_this();
  grace_timer_.expires_after(milliseconds(server_.options.shutdown_grace_ms));
  grace_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec) self->CloseNow("shutdown grace expired before the client took its frames");
  });
  MaybeFinishDrain();
}

void Session::DropPending(const std::string& why) {
  pending_ = false;  // ServerCore::AddPending took it off its list
  if (state_ != State::kHandshake) return;
  server_.handshakes_dropped += 1;
  Fail(Status::Unsupported(why), false);
}

void Session::MaybeFinishDrain() {
  if (!draining_ || shutdown_sent_ || state_ != State::kStreaming || producer_running_) return;
  // Every frame the producer made is queued ahead of this one (the strand
  // runs posts in order), so the client gets them all, then SHUTDOWN.
  shutdown_sent_ = true;
  state_ = State::kClosing;
  EnqueueControl(FrameType::kShutdown, EncodeError({StatusCode::kIOError, "daemon stopping"}), true);
}

}  // namespace gpufeed::daemon
