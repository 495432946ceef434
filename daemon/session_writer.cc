// A daemon connection, part 4: the write queue — frames to the socket one at
// a time, with the write deadline.
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

void Session::Enqueue(std::shared_ptr<OutFrame> f) {
  if (state_ != State::kStreaming) {  // closing: the frame is dropped (and its batch released)
    if (f->is_batch) {
      MutexLock lock(&mu_);
      --queued_;
      server_.queued -= 1;
    }
    return;
  }
  if (f->close_after && !f->is_batch) state_ = State::kClosing;
  if (f->shm_slot >= 0) {
    // From here the slot is the client's: it may hand it back as soon as it
    // has read the frame, even before this write's handler runs.
    const auto k = static_cast<size_t>(f->shm_slot);
    shm_client_holds_[k] = true;
    shm_sent_[k] = std::move(f->batch);
  }
  out_.push_back(std::move(f));
  WriteNext();
}

void Session::EnqueueControl(FrameType type, std::vector<std::byte> payload, bool close_after, uint16_t version) {
  auto f = std::make_shared<OutFrame>();
  f->header = MakeHeader(type, 0, static_cast<uint32_t>(payload.size()), {payload}, version);
  f->body = std::move(payload);
  f->close_after = close_after;
  out_.push_back(std::move(f));
  WriteNext();
}

void Session::WriteNext() {
  if (writing_ || out_.empty() || state_ == State::kClosed) return;
  writing_ = true;
  const OutFrame& f = *out_.front();
  // Header, body, then (an uncompressed BATCH) each field's rows of its batch.
  std::vector<asio::const_buffer> bufs = {asio::buffer(f.header), asio::buffer(f.body)};
  if (f.batch.size() > 0) {
    for (auto field : BatchFieldBytes(f.batch)) bufs.push_back(asio::buffer(field.data(), field.size()));
  }
  auto self = shared_from_this();
  const uint64_t seq = ++write_seq_;
  write_timer_.expires_after(milliseconds(server_.options.write_timeout_ms));
  write_timer_.async_wait([self, seq](const boost::system::error_code& ec) {
    if (!ec && self->writing_ && self->write_seq_ == seq) {
      self->no_park_ = true;  // a dead client: its Loader is not kept
      self->CloseNow("write timeout: the client accepted no frame for " +
                     std::to_string(self->server_.options.write_timeout_ms) + " ms");
    }
  });
  asio::async_write(socket_, bufs, [self](const boost::system::error_code& ec, size_t n) {
    self->writing_ = false;
    self->write_timer_.cancel();
    std::shared_ptr<OutFrame> done = std::move(self->out_.front());
    self->out_.pop_front();
    if (done->is_batch) {
      {
        MutexLock lock(&self->mu_);
        --self->queued_;
        self->metrics_.queued = static_cast<uint64_t>(self->queued_);
      }
      self->server_.queued -= 1;
      self->cv_.SignalAll();
      if (!ec) {
        self->metrics_.batches_sent += 1;
        self->metrics_.samples_sent += done->samples;
        self->server_.batches_sent += 1;
      }
    }
    if (!ec) {
      self->metrics_.bytes_sent += n;
      self->server_.bytes_sent += n;
    }
    const bool close_after = done->close_after;
    done.reset();  // the batch's slot goes back to the Loader's pool
    if (self->state_ == State::kClosed) return;
    if (ec) {
      self->CloseNow("write failed: " + ec.message());
      return;
    }
    if (close_after) {
      self->CloseNow(self->shutdown_sent_ ? "shutdown complete" : "closed after the last frame");
      return;
    }
    self->WriteNext();
  });
}

}  // namespace gpufeed::daemon
