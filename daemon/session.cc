// A daemon connection: handshake -> credits -> batches, on one strand, with a
// producer thread per streaming client (see session.h).
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

Session::Session(ServerCore& server, Socket socket, uint64_t id, std::string peer)
    : server_(server),
      socket_(std::move(socket)),
      handshake_timer_(socket_.get_executor()),
      idle_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      grace_timer_(socket_.get_executor()),
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
  if (reserved_bytes_ > 0) {
    server_.streams_active -= 1;
    if (loader_ && loader_ok_ && !server_.stopping) {
      // Warm for this client's next epoch or reconnect; its reservation (and
      // shared memory) goes along.
      server_.Park(stream_key_, std::move(loader_), reserved_bytes_, std::move(shm_pool_));
    } else {
      loader_.reset();
      shm_pool_.reset();
      server_.Unreserve(reserved_bytes_);
    }
  }
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
    Fail(h.status(), true);
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
  auto ds = server_.FindDataset(hello->dataset);
  if (!ds.ok()) {
    Fail(ds.status(), false);
    return;
  }
  const Dataset& d = *ds->second;
  LoaderOptions lo = hello->loader;
  lo.threads = server_.loader_threads;
  lo.prefetch = std::max(server_.options.prefetch, kMaxQueued + 1);  // the pipeline keeps a slot while frames wait
  lo.cache_bytes = server_.options.cache_bytes;
  lo.pin_memory = false;
  auto plan = loader::MakeEpochPlan(d.num_samples(), d.chunk_samples(), d.num_chunks(), lo, hello->epoch);
  if (!plan.ok()) {
    Fail(plan.status().WithContext(ds->first), false);
    return;
  }
  if (hello->start_batch > plan->num_batches) {
    Fail(Status::InvalidArgument(ds->first + ": resume at batch " + std::to_string(hello->start_batch) +
                                 " past the epoch's " + std::to_string(plan->num_batches)),
         false);
    return;
  }
  if (hello->shm_slots > 0 && !hello->describe_only) {
    if (!AcceptSharedMemory(*hello, lo.batch_size * d.sample_bytes())) return;
    if (shm_) {
      lo.prefetch = static_cast<int>(hello->shm_slots);  // the pipeline may fill every slot granted
      hello->compress = false;                           // nothing travels to compress
    }
  }
  if (!shm_) hello_fd_.Reset();
  hello_ = std::move(*hello);
  hello_.loader = lo;
  hello_.token.clear();
  dataset_ = &d;
  num_batches_ = plan->num_batches;
  if (!hello_.client_name.empty()) {
    std::string n;
    for (char c : hello_.client_name.substr(0, 64)) n += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
    MutexLock lock(&name_mu_);
    client_name_ = n;
  }
  handshake_timer_.cancel();

  HelloOk ok;
  ok.info.name = ds->first;
  ok.info.dtype = d.dtype();
  ok.info.sample_shape = d.sample_shape();
  ok.info.sample_bytes = d.sample_bytes();
  ok.info.num_samples = d.num_samples();
  ok.info.batch_size = lo.batch_size;
  ok.info.has_labels = d.has_labels();
  ok.info.mean = d.info().mean;
  ok.info.stddev = d.info().stddev;
  ok.num_batches = num_batches_;
  ok.client_id = id_;
  ok.compress = hello_.compress;
  ok.shm = shm_;
  Log("info", hello_.describe_only ? "describe" : "stream",
      Kv("name", client_name()) + " " + Kv("dataset", ds->first) + " " + Kv("epoch", hello_.epoch) + " " +
          Kv("start_batch", hello_.start_batch) + " " + Kv("batch_size", lo.batch_size) + " " +
          Kv("order", std::string(OrderName(lo.order))) + " " + Kv("rank", lo.rank) + " " +
          Kv("world_size", lo.world_size) + " " + Kv("compress", hello_.compress ? "zstd" : "none") + " " +
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
                                 std::to_string(h.shm_stride) + " bytes for batches of " +
                                 std::to_string(batch_bytes) + " (at least 2 slots, page-aligned, a batch each)"),
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

void Session::HandleCredit(std::span<const std::byte> payload) {
  auto n = DecodeCredit(payload);
  if (!n.ok()) {
    Fail(n.status(), true);
    return;
  }
  uint64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  cv_.notify_all();
  if (!producer_running_ && !loader_ && !draining_) StartProducer();
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
  if (!producer_running_ && !loader_ && !draining_) StartProducer();  // maps the memory
  if (state_ != State::kStreaming || !shm_pool_) return;
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

// The daemon's loader threads, divided equally among the open streams: k
// streams would otherwise each ask TBB for every core, and unequal shares
// make the ranks of one job wait for the slowest (docs/benchmarks.md). The
// recent peak of open streams, not the running ones: the ranks of a job
// reconnect one by one each epoch, and the first must not take every core
// (the first epoch of a job may still be uneven).
int Session::ThreadShare(uint64_t* divided_among) const {
  const uint64_t open = server_.RecentPeakStreams();  // this one included
  *divided_among = open;
  const auto all = static_cast<uint64_t>(server_.loader_threads);
  const int share = static_cast<int>(std::max<uint64_t>(2, (all + open - 1) / std::max<uint64_t>(1, open)));
  return std::min(share, server_.loader_threads);
}

void Session::StartProducer() {
  const uint64_t sb = dataset_->sample_bytes(), bb = hello_.loader.batch_size * sb;
  const LoaderOptions& lo = hello_.loader;
  // The stream's bound (server.h) for `t` loader threads.
  const uint64_t fixed = lo.cache_bytes + (lo.prefetch + 1) * bb + (hello_.compress ? kMaxQueued * bb : 0);
  auto bound_for = [&](int t) { return fixed + (2 * static_cast<uint64_t>(t) + 4) * dataset_->chunk_bytes_max(); };
  uint64_t divided_among = 1;
  int threads = ThreadShare(&divided_among);
  stream_key_ = dataset_->name() + "|" + std::to_string(lo.batch_size) + "|" + std::string(OrderName(lo.order)) + "|" +
                std::to_string(lo.seed) + "|" + std::to_string(lo.shuffle_window) + "|" + std::to_string(lo.rank) +
                "|" + std::to_string(lo.world_size) + "|" + (lo.drop_last ? "1" : "0") + "|" +
                (hello_.compress ? "z" : "-") +
                (shm_ ? "|shm" + std::to_string(hello_.shm_slots) + "x" + std::to_string(shm_stride_) : "");
  uint64_t parked_bytes = 0;
  std::unique_ptr<ShmPool> parked_shm;
  if (auto warm = server_.Take(stream_key_, &parked_bytes, &parked_shm, shm_inode_)) {
    loader_ = std::move(warm);
    reserved_bytes_ = parked_bytes;
    if (parked_bytes < bound_for(threads)) {  // more threads than it had: more room, or fewer threads
      uint64_t after = 0;
      if (server_.Reserve(bound_for(threads) - parked_bytes, &after)) {
        reserved_bytes_ = bound_for(threads);
      } else {
        while (threads > 1 && bound_for(threads) > parked_bytes) --threads;
      }
    }
    server_.streams_active += 1;
    Log("info", "stream_start", Kv("reserved_bytes", reserved_bytes_) + " loader=warm");
  } else {
    const uint64_t bound = bound_for(threads);
    uint64_t after = 0;
    if (!server_.Reserve(bound, &after)) {
      Fail(Status::Unsupported("the daemon's memory budget (" + std::to_string(server_.options.memory_bytes) +
                               " bytes, " + std::to_string(server_.reserved()) + " reserved by " +
                               std::to_string(server_.streams_active.load()) +
                               " streams) has no room for a stream of " + std::to_string(bound) +
                               " bytes; retry later or raise --memory-bytes"),
           false);
      return;
    }
    reserved_bytes_ = bound;
    server_.streams_active += 1;
    Log("info", "stream_start", Kv("reserved_bytes", bound) + " " + Kv("daemon_reserved_bytes", after) + " loader=new");
    // Built for all the loader threads (its cache then keeps that many spare
    // chunk buffers; built with its share, 4 ranks of celeba-raw ran ~20%
    // slower in one run: docs/benchmarks.md), run with its share (SetThreads
    // below), which bounds the buffers it ever has at once.
    loader_ = std::make_unique<Loader>(*dataset_, hello_.loader);
    LoaderInternal::ShareChunks(*loader_, server_.SharedChunksOf(dataset_));  // one cache per file, in effect
  }
  if (shm_) {
    const bool reuse = parked_shm && parked_shm->region.inode() == shm_inode_ && parked_shm->Reclaim();
    if (reuse) {
      shm_pool_ = std::move(parked_shm);  // this client's memory, mapped already
    } else {
      auto p = ShmPool::Map(std::move(hello_fd_), static_cast<uint32_t>(shm_client_holds_.size()), shm_stride_,
                            hello_.loader.batch_size, dataset_->sample_bytes(), "client " + peer_);
      if (!p.ok()) {
        LoaderInternal::UsePool(*loader_, nullptr);
        Fail(p.status(), false);
        return;
      }
      shm_pool_ = std::move(*p);
    }
    hello_fd_.Reset();
    LoaderInternal::UsePool(*loader_, &shm_pool_->pool);
    Log("info", "shm", Kv("slots", shm_client_holds_.size()) + " " + Kv("stride", shm_stride_) + " " +
                           Kv("mapping", reuse ? "reused" : "new"));
  }
  parked_shm.reset();  // someone else's (the Loader no longer points into it)
  LoaderInternal::SetThreads(*loader_, threads);
  Log("info", "stream_threads", Kv("threads", static_cast<uint64_t>(threads)) + " " +
                                    Kv("divided_among", divided_among));
  producer_running_ = true;
  keep_alive_ = shared_from_this();
  work_.emplace(server_.io.get_executor());
  producer_ = std::thread([this] { Produce(); });
}

void Session::Produce() {
  // Exceptions must not leave this thread (STYLE.md): the Loader reports
  // failures as Status; anything else becomes an error frame.
  std::shared_ptr<OutFrame> final_frame;
  bool loader_ok = true;
  try {
    EpochStream stream = loader_->Epoch(hello_.epoch, hello_.start_batch);
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Shared memory: the Loader waits for slots the client grants; the
        // frames are small, so nothing else bounds them.
        while (!stop_producer_ && !(shm_ || (credits_ > 0 && queued_ < kMaxQueued))) {
          cv_.wait_for(lock, milliseconds(100));
        }
        if (stop_producer_) break;
      }
      auto r = stream.Next();
      if (!r.ok()) {
        loader_ok = false;
        final_frame = std::make_shared<OutFrame>();
        final_frame->body = EncodeError({r.status().code(), r.status().message()});
        final_frame->header = MakeHeader(FrameType::kError, 0, static_cast<uint32_t>(final_frame->body.size()),
                                         {final_frame->body});
        final_frame->close_after = true;
        break;
      }
      if (!r->has_value()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (stop_producer_) break;  // the pool was cancelled to stop the stream: not its end
        }
        final_frame = std::make_shared<OutFrame>();
        final_frame->body = EncodeEnd({hello_.epoch, num_batches_});
        final_frame->header =
            MakeHeader(FrameType::kEnd, 0, static_cast<uint32_t>(final_frame->body.size()), {final_frame->body});
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_producer_) break;  // the batch is not sent; a resuming client asks for it again
      }
      Batch b = std::move(**r);
      auto f = std::make_shared<OutFrame>();
      f->is_batch = true;
      f->samples = b.size();
      if (shm_) {
        // The images are in the client's slot already; only the head travels.
        const auto off = static_cast<uint64_t>(b.images().data() - shm_pool_->region.bytes().data());
        f->shm_slot = static_cast<int64_t>(off / shm_stride_);
        f->body = EncodeBatchRef(b, static_cast<uint32_t>(f->shm_slot));
        f->header = MakeHeader(FrameType::kBatchRef, 0, static_cast<uint32_t>(f->body.size()), {f->body});
        f->batch = std::move(b);
      } else if (f->body = EncodeBatchHead(b); hello_.compress) {
        const uint32_t raw = static_cast<uint32_t>(f->body.size() + b.images().size());
        f->body = Compress({f->body, b.images()});
        f->header = MakeHeader(FrameType::kBatch, kFlagZstd, raw, {f->body});
      } else {
        const uint32_t raw = static_cast<uint32_t>(f->body.size() + b.images().size());
        f->header = MakeHeader(FrameType::kBatch, 0, raw, {f->body, b.images()});
        f->batch = std::move(b);
      }
      const LoaderStats st = stream.stats();
      metrics_.loader_samples_per_s = st.samples_per_second();
      metrics_.cache_hit_rate = st.hit_rate();
      metrics_.shared_chunk_hits = st.chunk_shared_hits;
      metrics_.loader_queue_depth = st.mean_queue_depth();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!shm_) --credits_;
        ++queued_;
        metrics_.credits = credits_;
        metrics_.queued = static_cast<uint64_t>(queued_);
      }
      server_.queued += 1;
      asio::post(socket_.get_executor(), [self = shared_from_this(), f] { self->Enqueue(f); });
    }
  } catch (const std::exception& e) {
    loader_ok = false;
    final_frame = std::make_shared<OutFrame>();
    final_frame->body = EncodeError({StatusCode::kInternal, std::string("daemon stream: ") + e.what()});
    final_frame->header =
        MakeHeader(FrameType::kError, 0, static_cast<uint32_t>(final_frame->body.size()), {final_frame->body});
    final_frame->close_after = true;
  } catch (...) {
    loader_ok = false;
    final_frame.reset();
  }
  asio::post(socket_.get_executor(), [self = shared_from_this(), final_frame, loader_ok] {
    self->loader_ok_ = loader_ok;
    if (final_frame) self->Enqueue(final_frame);
    self->OnProducerDone();
  });
}

void Session::OnProducerDone() {
  producer_.join();  // it posted this as its last act: returns at once
  producer_running_ = false;
  work_.reset();
  MaybeFinishDrain();
  keep_alive_.reset();  // may drop the last reference only after this handler: asio holds `self`
}

void Session::Enqueue(std::shared_ptr<OutFrame> f) {
  if (state_ != State::kStreaming) {  // closing: the frame is dropped (and its batch released)
    if (f->is_batch) {
      std::lock_guard<std::mutex> lock(mu_);
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

void Session::EnqueueControl(FrameType type, std::vector<std::byte> payload, bool close_after) {
  auto f = std::make_shared<OutFrame>();
  f->header = MakeHeader(type, 0, static_cast<uint32_t>(payload.size()), {payload});
  f->body = std::move(payload);
  f->close_after = close_after;
  out_.push_back(std::move(f));
  WriteNext();
}

void Session::WriteNext() {
  if (writing_ || out_.empty() || state_ == State::kClosed) return;
  writing_ = true;
  const OutFrame& f = *out_.front();
  std::array<asio::const_buffer, 3> bufs = {
      asio::buffer(f.header), asio::buffer(f.body),
      asio::buffer(f.batch.images().data(), f.batch.images().size())};  // empty unless a BATCH's images
  auto self = shared_from_this();
  const uint64_t seq = ++write_seq_;
  write_timer_.expires_after(milliseconds(server_.options.write_timeout_ms));
  write_timer_.async_wait([self, seq](const boost::system::error_code& ec) {
    if (!ec && self->writing_ && self->write_seq_ == seq) {
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
        std::lock_guard<std::mutex> lock(self->mu_);
        --self->queued_;
        self->metrics_.queued = static_cast<uint64_t>(self->queued_);
      }
      self->server_.queued -= 1;
      self->cv_.notify_all();
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

void Session::Fail(const Status& st, bool protocol_error) {
  if (state_ == State::kClosed || state_ == State::kClosing) return;
  if (protocol_error) server_.protocol_errors += 1;
  Log(protocol_error ? "warn" : "info", "error",
      Kv("code", std::string(StatusCodeName(st.code()))) + " " + Kv("message", st.message()));
  state_ = State::kClosing;
  StopProducer();
  // Frames not yet on the wire are dropped so the error goes out next.
  while (out_.size() > (writing_ ? 1u : 0u)) {
    if (out_.back()->is_batch) {
      std::lock_guard<std::mutex> lock(mu_);
      --queued_;
      server_.queued -= 1;
    }
    out_.pop_back();
  }
  EnqueueControl(FrameType::kError, EncodeError({st.code(), st.message()}), true);
  // A client that does not read its error frame is closed anyway.
  auto self = shared_from_this();
  grace_timer_.expires_after(milliseconds(std::min(2000, server_.options.write_timeout_ms)));
  grace_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec) self->CloseNow("error frame not read in time");
  });
}

void Session::StopProducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_producer_ = true;
  }
  cv_.notify_all();
  // A Loader waiting for a slot the client will never grant wakes up.
  if (shm_pool_) shm_pool_->pool.SetCancelled(true);
}

void Session::CloseNow(const std::string& reason) {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  if (counted_open_) {
    counted_open_ = false;
    server_.StreamClosed();
  }
  char sps[32];
  std::snprintf(sps, sizeof sps, "%.0f", metrics_.loader_samples_per_s.load());
  Log("info", "close", Kv("reason", reason) + " " + Kv("batches_sent", metrics_.batches_sent.load()) + " " +
                           Kv("bytes_sent", metrics_.bytes_sent.load()) + " " + Kv("loader_samples_per_s", sps) +
                           " " + Kv("shared_chunk_hits", metrics_.shared_chunk_hits.load()));
  handshake_timer_.cancel();
  idle_timer_.cancel();
  write_timer_.cancel();
  grace_timer_.cancel();
  boost::system::error_code ec;
  socket_.shutdown(asio::socket_base::shutdown_both, ec);
  socket_.close(ec);
  StopProducer();
  while (out_.size() > (writing_ ? 1u : 0u)) {  // the one being written goes in its handler
    if (out_.back()->is_batch) {
      std::lock_guard<std::mutex> lock(mu_);
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

void Session::MaybeFinishDrain() {
  if (!draining_ || shutdown_sent_ || state_ != State::kStreaming || producer_running_) return;
  // Every frame the producer made is queued ahead of this one (the strand
  // runs posts in order), so the client gets them all, then SHUTDOWN.
  shutdown_sent_ = true;
  state_ = State::kClosing;
  EnqueueControl(FrameType::kShutdown, EncodeError({StatusCode::kIOError, "daemon stopping"}), true);
}

}  // namespace gpufeed::daemon
