// A daemon connection, part 3: the producer thread that runs the stream's
// Loader and turns its batches into frames, within the client's credits.
#include "daemon/session.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/sizes.h"
#include "daemon/server_core.h"
#include "loader/sampler.h"

namespace gpufeed::daemon {

namespace asio = boost::asio;
using std::chrono::milliseconds;

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

// The stream's identity: a parked Loader (Server::Take) serves it only if
// all of this is the same (the order, the rank's share, compression, the
// shared memory's geometry, an encoded dataset's decode options).
std::string Session::StreamKey() const {
  const ChunkSource& src = *served_.source;
  const LoaderOptions& lo = hello_.loader;
  std::string key = src.name() + "|" + std::to_string(lo.batch_size) + "|" + std::string(OrderName(lo.order)) + "|" +
                    std::to_string(lo.seed) + "|" + std::to_string(lo.shuffle_window) + "|" + std::to_string(lo.rank) +
                    "|" + std::to_string(lo.world_size) + "|" + (lo.drop_last ? "1" : "0") + "|" +
                    (lo.reshard.world_size > 0
                         ? "reshard " + std::to_string(lo.reshard.epoch) + "/" + std::to_string(lo.reshard.world_size) +
                               "/" + std::to_string(lo.reshard.share) + "/" + std::to_string(lo.reshard.consumed) + "|"
                         : std::string()) +
                    (hello_.compress ? "z" : "-") +
                    (shm_ ? "|shm" + std::to_string(hello_.shm_slots) + "x" + std::to_string(shm_stride_) : "");
  // An encoded dataset's decode options (its decoded samples) too.
  if (served_.encoded) key += "|decode " + served_.decode_key + (lo.defer_decode ? "|defer" : "");
  return key;
}

bool Session::MapSharedMemory(std::unique_ptr<ShmPool>& parked_shm) {
  const bool reuse = parked_shm && parked_shm->region.inode() == shm_inode_ && parked_shm->Reclaim();
  if (reuse) {
    shm_pool_ = std::move(parked_shm);  // this client's memory, mapped already
  } else {
    auto p = ShmPool::Map(std::move(hello_fd_), static_cast<uint32_t>(shm_client_holds_.size()), shm_stride_,
                          hello_.loader.batch_size, slot_sample_bytes_, "client " + peer_);
    if (!p.ok()) {
      LoaderInternal::UsePool(*loader_, nullptr);
      Fail(p.status(), false);
      return false;
    }
    shm_pool_ = std::move(*p);
  }
  hello_fd_.Reset();
  LoaderInternal::UsePool(*loader_, &shm_pool_->pool);
  for (uint32_t k = 0; k < shm_client_holds_.size(); ++k) {  // granted so far: the Loader's to fill
    if (!shm_client_holds_[k]) shm_pool_->pool.Release(shm_pool_->pool.slot(k));
  }
  Log("info", "shm",
      Kv("slots", shm_client_holds_.size()) + " " + Kv("stride", shm_stride_) + " " +
          Kv("mapping", reuse ? "reused" : "new"));
  return true;
}

void Session::StartProducer() {
  const ChunkSource& src = *served_.source;
  const LoaderOptions& lo = hello_.loader;
  // The stream's bound (server.h) for `t` loader threads, of what this
  // stream can actually hold: a cache no larger than every chunk of the
  // source, batches no larger than the rank's share, no more chunk buffers
  // than chunks (a 2,000-sample file reserved 436 MB against 85 MB used when
  // the options' figures were taken as they are). Saturating: sizes come
  // from the client.
  // A slot's bytes per sample: the decoded sample, or room for encoded ones.
  const uint64_t sb = slot_sample_bytes_, chunk = src.max_chunk_buffer_bytes();
  const uint64_t world = static_cast<uint64_t>(std::max(1, lo.world_size));
  const uint64_t share = (src.num_samples() + world - 1) / world;
  const uint64_t bb = SaturatingMul(std::min<uint64_t>(lo.batch_size, std::max<uint64_t>(1, share)), sb);
  const uint64_t all_chunks = SaturatingMul(src.num_chunks(), chunk);
  // The cache holds its budget, or the epoch's working set where larger.
  const uint64_t cache = std::min(CacheBoundBytes(lo, chunk), all_chunks);
  const uint64_t fixed = SaturatingAdd(SaturatingAdd(cache, SaturatingMul(static_cast<uint64_t>(lo.prefetch) + 1, bb)),
                                       hello_.compress ? SaturatingMul(kMaxQueued, bb) : 0);
  // sb is a slot's share of the decoded sample (an encoded dataset's: its
  // decode options' output, or with deferred decoding room for the encoded
  // bytes); a chunk buffer, encoded bytes or decoded samples of every field.
  auto bound_for = [&](int t) {
    const uint64_t buffers =
        std::min<uint64_t>(2 * static_cast<uint64_t>(t) + 4, std::max<uint64_t>(1, src.num_chunks()));
    return SaturatingAdd(fixed, SaturatingMul(buffers, chunk));
  };
  // What the Loader still holds once its stream has ended (what a parked
  // one keeps in the budget): its cache and pool (or the mapped slots), and
  // the spare chunk buffers its cache keeps (the loader's threads + 4, no
  // more than the stream ever had); not the compressed copies.
  auto held_for = [&](int t) {
    const uint64_t pool = SaturatingAdd(cache, SaturatingMul(static_cast<uint64_t>(lo.prefetch) + 1, bb));
    const uint64_t spares =
        std::min<uint64_t>({2 * static_cast<uint64_t>(t) + 4, std::max<uint64_t>(1, src.num_chunks()),
                            static_cast<uint64_t>(server_.loader_threads) + 4});
    return SaturatingAdd(pool, SaturatingMul(spares, chunk));
  };
  uint64_t divided_among = 1;
  int threads = ThreadShare(&divided_among);
  stream_key_ = StreamKey();
  uint64_t parked_bytes = 0;
  std::unique_ptr<ShmPool> parked_shm;
  auto warm = server_.Take(stream_key_, &parked_bytes, &parked_shm, shm_inode_);
  if (!warm && server_.ParkExpected(stream_key_) && AwaitPark()) return;
  awaiting_park_ = false;
  if (warm) {
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
      Fail(
          Status::Unsupported("the daemon's memory budget (" + std::to_string(server_.options.memory_bytes) +
                              " bytes, " + std::to_string(server_.reserved()) + " reserved by " +
                              std::to_string(server_.streams_active.load()) + " streams) has no room for a stream of " +
                              std::to_string(bound) + " bytes; retry later or raise --memory-bytes"),
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
    LoaderOptions lo = hello_.loader;
    lo.logger = server_.library_logger;  // its notes go to the event log
    loader_ = std::make_unique<Loader>(src, lo);
    // One cache per file, in effect; an encoded file's samples read one a
    // chunk (random order) apart from its runs (DatasetRegistry::Stream).
    LoaderInternal::ShareChunks(*loader_, LoaderInternal::ReadsSampleUnits(*loader_) && served_.shared_samples
                                              ? served_.shared_samples
                                              : served_.shared);
  }
  if (shm_ && !MapSharedMemory(parked_shm)) return;
  parked_shm.reset();  // someone else's (the Loader no longer points into it)
  held_bytes_ = held_for(threads);
  LoaderInternal::SetThreads(*loader_, threads);
  Log("info", "stream_threads",
      Kv("threads", static_cast<uint64_t>(threads)) + " " + Kv("divided_among", divided_among));
  producer_running_ = true;
  keep_alive_ = shared_from_this();
  work_.emplace(server_.io.get_executor());
  producer_ = std::thread([this] { Produce(); });
}

// This client's previous connection with the same stream identity (its last
// epoch) queued END and is closing: its Loader is parked in a moment. Rather
// than build a cold Loader (and a second reservation) beside it, try again
// every few milliseconds, for at most kParkWait; then go on without it.
bool Session::AwaitPark() {
  constexpr auto kParkWait = milliseconds(2000), kRetry = milliseconds(5);
  const auto now = std::chrono::steady_clock::now();
  if (!awaiting_park_) {
    awaiting_park_ = true;
    park_deadline_ = now + kParkWait;
  }
  if (now >= park_deadline_) {
    Log("warn", "park_wait", Kv("waited_ms", static_cast<uint64_t>(kParkWait.count())) + " outcome=cold_loader");
    return false;
  }
  park_timer_.expires_after(kRetry);
  park_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->state_ != State::kStreaming || self->draining_ || self->loader_) return;
    self->StartProducer();
  });
  return true;
}

// A batch as its frame: BATCH_REF (its fields are in the client's slot
// already; only the head travels), or BATCH (the head, then each field's
// rows: docs/protocol.md), compressed or sent from the Loader's slot.
std::shared_ptr<Session::OutFrame> Session::BatchFrame(Batch b) {
  auto f = std::make_shared<OutFrame>();
  f->is_batch = true;
  f->samples = b.size();
  if (shm_) {
    // The fields are in the client's slot already; only the head travels.
    const auto off = static_cast<uint64_t>(b.images().data() - shm_pool_->region.bytes().data());
    f->shm_slot = static_cast<int64_t>(off / shm_stride_);
    f->body = EncodeBatchRef(b, static_cast<uint32_t>(f->shm_slot));
    f->header = MakeHeader(FrameType::kBatchRef, 0, static_cast<uint32_t>(f->body.size()), {f->body});
    f->batch = std::move(b);
  } else {
    // The head, then each field's rows (docs/protocol.md, BATCH).
    f->body = EncodeBatchHead(b);
    std::vector<std::span<const std::byte>> pieces{f->body};
    for (auto field : BatchFieldBytes(b)) pieces.push_back(field);
    // Each field's rows, or an encoded batch's used bytes of its slot.
    uint64_t raw64 = f->body.size();
    for (size_t k = 1; k < pieces.size(); ++k) raw64 += pieces[k].size();
    const uint32_t raw = static_cast<uint32_t>(raw64);
    if (hello_.compress) {
      f->body = Compress(pieces);
      f->header = MakeHeader(FrameType::kBatch, kFlagZstd, raw, {f->body});
    } else {
      f->header = MakeHeader(FrameType::kBatch, 0, raw, pieces);
      f->batch = std::move(b);
    }
  }
  return f;
}

Result<std::optional<Batch>> Session::NextBatch(EpochStream& stream, bool* stopped) {
  // In slices: StopProducer() ends the wait (a batch whose reads retry
  // against a dead object store is not waited for).
  for (;;) {
    auto w = stream.NextFor(milliseconds(100));
    if (!w.ok()) return w.status();
    if (w->wait == WaitResult::kReady) return std::move(w->batch);
    MutexLock lock(&mu_);
    if (stop_producer_) {
      *stopped = true;
      return std::optional<Batch>();
    }
  }
}

void Session::Produce() {
  // Exceptions must not leave this thread (docs/practices.md, 17): the Loader reports
  // failures as Status; anything else becomes an error frame.
  std::shared_ptr<OutFrame> final_frame;
  bool loader_ok = true, epoch_end = false;
  try {
    EpochStream stream = loader_->Epoch(hello_.epoch, hello_.start_batch);
    for (;;) {
      {
        MutexLock lock(&mu_);
        // Shared memory: the Loader waits for slots the client grants; the
        // frames are small, so nothing else bounds them.
        while (!stop_producer_ && !(shm_ || (credits_ > 0 && queued_ < kMaxQueued))) {
          cv_.WaitFor(&mu_, milliseconds(100));
        }
        if (stop_producer_) break;
      }
      bool stopped = false;
      auto r = NextBatch(stream, &stopped);
      if (stopped) break;
      if (!r.ok()) {
        loader_ok = false;
        final_frame = std::make_shared<OutFrame>();
        final_frame->body = EncodeError({r.status().code(), r.status().message()});
        final_frame->header =
            MakeHeader(FrameType::kError, 0, static_cast<uint32_t>(final_frame->body.size()), {final_frame->body});
        final_frame->close_after = true;
        break;
      }
      if (!r->has_value()) {
        {
          MutexLock lock(&mu_);
          if (stop_producer_) break;  // the pool was cancelled to stop the stream: not its end
        }
        epoch_end = true;
        final_frame = std::make_shared<OutFrame>();
        final_frame->body = EncodeEnd({hello_.epoch, num_batches_});
        final_frame->header =
            MakeHeader(FrameType::kEnd, 0, static_cast<uint32_t>(final_frame->body.size()), {final_frame->body});
        break;
      }
      {
        MutexLock lock(&mu_);
        if (stop_producer_) break;  // the batch is not sent; a resuming client asks for it again
      }
      std::shared_ptr<OutFrame> f = BatchFrame(std::move(**r));
      const LoaderStats st = stream.stats();
      metrics_.loader_samples_per_s = st.samples_per_second();
      metrics_.cache_hit_rate = st.hit_rate();
      metrics_.shared_chunk_hits = st.chunk_shared_hits;
      metrics_.loader_queue_depth = st.mean_queue_depth();
      {
        MutexLock lock(&mu_);
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
  asio::post(socket_.get_executor(), [self = shared_from_this(), final_frame, loader_ok, epoch_end] {
    self->loader_ok_ = loader_ok;
    if (epoch_end && loader_ok && !self->server_.stopping && !self->park_expected_) {
      // Announced before END can reach the client (see AwaitPark).
      self->server_.ExpectPark(self->stream_key_);
      self->park_expected_ = true;
    }
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

void Session::StopProducer() {
  {
    MutexLock lock(&mu_);
    stop_producer_ = true;
  }
  cv_.SignalAll();
  // A Loader waiting for a slot the client will never grant wakes up.
  if (shm_pool_) shm_pool_->pool.SetCancelled(true);
}

}  // namespace gpufeed::daemon
