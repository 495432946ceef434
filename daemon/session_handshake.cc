// A daemon connection, part 1: reading frames and the handshake — HELLO
// (options, dataset, token) and the shared-memory region's checks.
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

namespace {

// What HELLO_OK says of a stream of `d` (named `name`) with the options `lo`
// the daemon's Loader runs with.
HelloOk DescribeStream(const ChunkSource& d, const std::string& name, const LoaderOptions& lo, uint64_t num_batches,
                       uint64_t slot_sample_bytes) {
  HelloOk ok;
  const SourceAttributes attrs = d.attributes();
  ok.info.name = name;
  ok.info.dtype = d.dtype();
  ok.info.sample_shape = d.sample_shape();
  ok.info.sample_bytes = d.sample_bytes();
  ok.info.num_samples = d.num_samples();
  ok.info.batch_size = lo.batch_size;
  ok.info.has_labels = !d.labels().empty();
  ok.info.mean = attrs.mean;
  ok.info.stddev = attrs.stddev;
  ok.info.fields = d.fields();
  ok.info.encoded_batches = lo.defer_decode;
  ok.slot_sample_bytes = lo.defer_decode ? slot_sample_bytes : 0;
  ok.num_batches = num_batches;
  return ok;
}

}  // namespace

void Session::ReadHeader() {
  if (state_ == State::kHandshake) {
    ReadHelloHeader(0);
    return;
  }
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(in_header_), [self](const boost::system::error_code& ec, size_t) {
    if (self->state_ != State::kHandshake && self->state_ != State::kStreaming) return;
    if (ec) {
      const bool clean = ec == asio::error::eof || ec == asio::error::connection_reset;
      self->CloseNow(clean ? "client closed the connection" : "read failed: " + ec.message());
      return;
    }
    self->OnHeader();
  });
}

// The HELLO's header is read with recvmsg, since a client that wants shared
// memory attaches its memfd (SCM_RIGHTS) to the frame's first bytes. At most
// one descriptor is kept; any other is closed at once.
void Session::ReadHelloHeader(size_t got) {
  auto self = shared_from_this();
  socket_.async_wait(Socket::wait_read, [self, got](const boost::system::error_code& ec) {
    if (self->state_ != State::kHandshake) return;
    if (ec) {
      self->CloseNow("read failed: " + ec.message());
      return;
    }
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    iovec iov{self->in_header_.data() + got, kHeaderBytes - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(self->socket_.native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    const int err = errno;
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < fds; ++i) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          if (!self->hello_fd_.valid()) {
            self->hello_fd_ = UniqueFd(fd);
          } else {
            UniqueFd extra(fd);  // closed here
          }
        }
      }
    }
    if (n == 0) {
      self->CloseNow("client closed the connection");
      return;
    }
    if (n < 0) {
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
        self->ReadHelloHeader(got);
      } else {
        self->CloseNow("read failed: " + std::string(std::strerror(err)));
      }
      return;
    }
    if (got + static_cast<size_t>(n) < kHeaderBytes) {
      self->ReadHelloHeader(got + static_cast<size_t>(n));
      return;
    }
    self->OnHeader();
  });
}

void Session::OnHeader() {
  auto h = ParseHeader(in_header_, kMaxControlPayload, kMaxControlPayload, "client " + peer_);
  if (!h.ok()) {
    // A client of another protocol version reads the ERROR in its own
    // version (the header and ERROR layouts are the same in every version).
    const uint16_t theirs = HeaderVersion(in_header_);
    if (theirs == 0 || theirs == kVersion) {
      Fail(h.status(), true);
      return;
    }
    // Its frame's payload is read (within the control limit): closing a TCP
    // socket with unread bytes resets it, and the client could lose the
    // ERROR before reading it. In the handshake the ERROR waits for it (the
    // handshake deadline bounds the wait); while streaming, the stream
    // stops at once and the payload is read meanwhile (the close after the
    // ERROR, or the 2 s grace, bounds it). Either way the session ends:
    // before, a streaming session read no further and kept its stream and
    // reservation until the idle timeout.
    uint32_t declared = 0;
    std::memcpy(&declared, in_header_.data() + 12, 4);
    in_payload_.resize(std::min(declared, kMaxControlPayload));
    auto self = shared_from_this();
    const Status mismatch = h.status();
    const bool streaming = state_ == State::kStreaming;
    if (streaming) Fail(mismatch, true, theirs);
    asio::async_read(socket_, asio::buffer(in_payload_),
                     [self, mismatch, theirs, streaming](const boost::system::error_code& ec, size_t) {
                       if (streaming) {  // failed already; a client gone meanwhile is closed now
                         if (ec && ec != asio::error::operation_aborted) self->CloseNow("client closed the connection");
                         return;
                       }
                       if (self->state_ != State::kHandshake) return;
                       self->Fail(mismatch, true, theirs);
                     });
    return;
  }
  in_ = *h;
  in_payload_.resize(h->payload_bytes);  // at most kMaxControlPayload: checked above
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(in_payload_), [self](const boost::system::error_code& ec, size_t) {
    if (self->state_ != State::kHandshake && self->state_ != State::kStreaming) return;
    if (ec) {
      self->CloseNow("connection lost in the middle of a frame: " + ec.message());
      return;
    }
    self->OnFrame();
  });
}

void Session::OnFrame() {
  if (Status st = VerifyChecksum(in_, in_header_, in_payload_, "client " + peer_); !st.ok()) {
    Fail(st, true);
    return;
  }
  if (in_.flags & kFlagZstd) {
    Fail(Status::InvalidArgument("compressed " + std::string(FrameTypeName(in_.type)) +
                                 " frame (clients send control frames uncompressed)"),
         true);
    return;
  }
  if (state_ == State::kHandshake) {
    if (in_.type != FrameType::kHello) {
      Fail(Status::InvalidArgument("expected HELLO, got " + std::string(FrameTypeName(in_.type))), true);
      return;
    }
    HandleHello(in_payload_);
  } else if (in_.type == FrameType::kCredit && !shm_) {
    HandleCredit(in_payload_);
  } else if (in_.type == FrameType::kSlots && shm_) {
    HandleSlots(in_payload_);
  } else if (in_.type == FrameType::kPing && in_payload_.empty()) {
    // Alive: the idle timer is re-armed below.
  } else {
    Fail(Status::InvalidArgument("unexpected " + std::string(FrameTypeName(in_.type)) + " frame while streaming" +
                                 (shm_ ? " (a shared-memory stream is granted SLOTS)" : "")),
         true);
    return;
  }
  if (state_ == State::kHandshake || state_ == State::kStreaming) {
    if (state_ == State::kStreaming) ArmIdle();
    ReadHeader();
  }
}

void Session::HandleHello(std::span<const std::byte> payload) {
  auto hello = DecodeHello(payload);
  if (!hello.ok()) {
    Fail(hello.status(), true);
    return;
  }
  if (!server_.token.empty() && !ConstantTimeEquals(server_.token, hello->token)) {
    Fail(Status::InvalidArgument("wrong token (see --token-file)"), true);
    return;
  }
  // Past a valid HELLO: out of the pending handshakes, into the capped
  // admitted connections (ServerOptions::max_connections).
  pending_ = false;
  server_.LeavePending(id_);
  if (!server_.Admit()) {
    server_.rejected += 1;
    Fail(Status::Unsupported("too many connections (cap " + std::to_string(server_.options.max_connections) +
                             ", --max-connections); retry later"),
         false);
    return;
  }
  admitted_ = true;
  auto ds = server_.datasets.Find(hello->dataset, hello->decode);
  if (!ds.ok()) {
    Fail(ds.status(), false);
    return;
  }
  const ChunkSource& d = *ds->source;
  LoaderOptions lo = hello->loader;
  lo.threads = server_.loader_threads;
  lo.prefetch = std::max(server_.options.prefetch, kMaxQueued + 1);  // the pipeline keeps a slot while frames wait
  lo.cache_bytes = server_.options.cache_bytes;
  lo.pin_memory = false;
  // Deferred decoding (version 5): the JPEGs the client's device decoder
  // takes leave here encoded, read and cached once for every stream of the
  // file, and each client decodes its own on its GPU; the rest (PNG,
  // progressive, CMYK, ...) are decoded here as for a client that does not
  // defer, as a local Loader that defers would decode them in the rank. No
  // host share of the device's samples (balance_decode): the daemon's
  // threads serve every rank of the node, so each rank's device takes all
  // of its own.
  lo.defer_decode = hello->loader.defer_decode && ds->encoded;
  lo.balance_decode = false;
  slot_sample_bytes_ = SlotSampleBytes(d, lo.defer_decode);
  auto plan = loader::MakeEpochPlan(d.num_samples(), d.chunk_samples(), d.num_chunks(), lo, hello->epoch);
  if (!plan.ok()) {
    Fail(plan.status().WithContext(ds->name), false);
    return;
  }
  if (hello->start_batch > plan->num_batches) {
    Fail(Status::InvalidArgument(ds->name + ": resume at batch " + std::to_string(hello->start_batch) +
                                 " past the epoch's " + std::to_string(plan->num_batches)),
         false);
    return;
  }
  if (hello->shm_slots > 0 && !hello->describe_only) {
    if (!AcceptSharedMemory(*hello, lo.batch_size * slot_sample_bytes_)) return;
    if (shm_) {
      lo.prefetch = static_cast<int>(hello->shm_slots);  // the pipeline may fill every slot granted
      hello->compress = false;                           // nothing travels to compress
    }
  }
  if (!shm_) hello_fd_.Reset();
  hello_ = std::move(*hello);
  hello_.loader = lo;
  hello_.token.clear();
  served_ = *ds;
  num_batches_ = plan->num_batches;
  if (!hello_.client_name.empty()) {
    std::string n;
    for (char c : hello_.client_name.substr(0, 64))
      n += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
    MutexLock lock(&name_mu_);
    client_name_ = n;
  }
  handshake_timer_.cancel();

  HelloOk ok = DescribeStream(d, ds->name, lo, num_batches_, slot_sample_bytes_);
  ok.client_id = id_;
  ok.compress = hello_.compress;
  ok.shm = shm_;
  Log("info", hello_.describe_only ? "describe" : "stream",
      Kv("name", client_name()) + " " + Kv("dataset", ds->name) + " " +
          (ds->encoded
               ? Kv("decode", ds->decode_key) + " " + Kv("defer_decode", lo.defer_decode ? "client" : "no") + " "
               : std::string()) +
          Kv("epoch", hello_.epoch) + " " + Kv("start_batch", hello_.start_batch) + " " +
          Kv("batch_size", lo.batch_size) + " " + Kv("order", std::string(OrderName(lo.order))) + " " +
          Kv("rank", lo.rank) + " " + Kv("world_size", lo.world_size) + " " +
          Kv("compress", hello_.compress ? "zstd" : "none") + " " +
          Kv("transport", shm_ ? "shm:" + std::to_string(hello_.shm_slots) + "_slots" : "socket"));
  state_ = State::kStreaming;
  if (!hello_.describe_only) {
    counted_open_ = true;
    server_.StreamOpened();
  }
  EnqueueControl(FrameType::kHelloOk, EncodeHelloOk(ok), hello_.describe_only);
  if (hello_.describe_only) state_ = State::kClosing;
}

// On a Unix socket, checks the memfd the HELLO carried (mapped when the
// stream starts, or a parked mapping of it reused); elsewhere (TCP) declines,
// and batches travel in BATCH frames. False when the session failed.
bool Session::AcceptSharedMemory(const Hello& h, uint64_t batch_bytes) {
  boost::system::error_code ec;
  const auto local = socket_.local_endpoint(ec);
  if (ec || local.protocol().family() != AF_UNIX) {
    hello_fd_.Reset();
    return true;  // declined: HELLO_OK says shm = false
  }
  if (!hello_fd_.valid()) {
    Fail(Status::InvalidArgument("HELLO asks for shared memory but carries no memfd"), true);
    return false;
  }
  if (h.shm_slots < 2 || h.shm_stride < batch_bytes || h.shm_stride % 4096 != 0) {
    Fail(Status::InvalidArgument("HELLO: " + std::to_string(h.shm_slots) + " shared-memory slots of " +
                                 std::to_string(h.shm_stride) + " bytes for batches of " + std::to_string(batch_bytes) +
                                 " (at least 2 slots, page-aligned, a batch each)"),
         true);
    return false;
  }
  auto inode = SharedRegion::Inspect(hello_fd_.get(), uint64_t{h.shm_slots} * h.shm_stride, "client " + peer_);
  if (!inode.ok()) {
    Fail(inode.status(), true);
    return false;
  }
  shm_inode_ = *inode;
  shm_stride_ = h.shm_stride;
  shm_client_holds_.assign(h.shm_slots, true);  // every slot is the client's until SLOTS grants it
  shm_sent_.resize(h.shm_slots);
  shm_ = true;
  return true;
}

}  // namespace gpufeed::daemon
