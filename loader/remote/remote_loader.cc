// RemoteLoader: a receiver thread per stream reads BATCH frames straight into
// the pool's slots (no copy for uncompressed payloads) and grants one credit
// per slot it holds; the consumer's Next() takes filled slots in order. With
// shared memory (Unix sockets) the pool is a memfd the daemon fills itself:
// the receiver grants slots by number and reads only BATCH_REF heads.
#include "gpufeed/remote_loader.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/mutex.h"
#include "gpufeed/sample_decoder.h"
#include "loader/remote/address.h"
#include "loader/remote/conn.h"
#include "loader/remote/protocol.h"
#include "loader/remote/shm.h"
#include "loader/remote/token.h"
#include "loader/batch_pool.h"
#include "loader/sampler.h"
#include "loader/stream_core.h"
#include "loader/stream_impl.h"

namespace gpufeed {

using daemon::Conn;
using daemon::FrameType;

namespace {

Result<std::string> ReadToken(const RemoteLoaderOptions& o) {
  if (!o.token.empty() || o.token_file.empty()) return o.token;
  return daemon::ReadTokenFile(o.token_file);  // the daemon's own checks
}

// A daemon's ERROR or SHUTDOWN frame as a Status.
Status FromErrorFrame(const Conn::Frame& f, const std::string& peer) {
  auto e = daemon::DecodeError(f.payload);
  if (!e.ok()) return e.status().WithContext(peer);
  if (f.header.type == FrameType::kShutdown) {
    return Status::IOError(peer + ": the daemon is shutting down (" + e->message +
                           "); resume with Resume(state()) (Python: load_state_dict(state_dict()))");
  }
  return Status(e->code, peer + ": daemon refused: " + e->message);
}

}  // namespace

struct RemoteLoader::Impl {
  RemoteLoaderOptions options;
  daemon::Address address;
  std::string token;
  BatchSourceInfo info;
  uint64_t num_batches = 0;
  // Declared before the pool, so destroyed after it: the pool's slots are
  // views of the region (page-locked with cudaHostRegister on a GPU host),
  // unregistered by the pool before the region is unmapped.
  daemon::SharedRegion region;  // the pool's memory when it is shared with the daemon
  BatchPool pool;
  // Bytes of a slot per sample: the daemon's (HelloOk::slot_sample_bytes)
  // for encoded batches, else the sample's.
  uint64_t slot_sample_bytes = 0;
  uint64_t shm_stride = 0;
  // The position: written by whichever thread takes the stream's batches
  // (a feed's fill worker, when batches come encoded), read by state().
  mutable Mutex state_mu;
  LoaderState state GUARDED_BY(state_mu);
  struct RemoteStream* active = nullptr;
  // Encoded batches (info.encoded_batches): the host decoder of
  // options.decode, whose header parse and crop plan (PlanDevice) each
  // encoded sample the daemon sends is checked against before the feed's
  // device decoder sizes its buffers by it.
  std::shared_ptr<const SampleDecoder> planner;

  daemon::Hello MakeHello(uint64_t epoch, uint64_t start, bool describe) const {
    daemon::Hello h;
    h.token = token;
    h.dataset = options.dataset;
    h.client_name = options.client_name;
    h.loader = options.loader;
    h.epoch = epoch;
    h.start_batch = start;
    h.compress = options.compress;
    h.describe_only = describe;
    h.decode = options.decode;
    if (!describe && region.fd() >= 0) {
      h.shm_slots = static_cast<uint32_t>(pool.size());
      h.shm_stride = shm_stride;
    }
    return h;
  }

  // The pool, once: in a sealed memfd on a unix: address (shared_memory),
  // plain or pinned memory otherwise.
  Status EnsurePool() {
    if (pool.allocated()) return Status::Ok();
    const int slots = std::max(1, options.loader.prefetch) + 1;
    pool.SetHoldHint("raise prefetch (RemoteLoaderOptions::loader.prefetch, --prefetch; the pool has prefetch + 1 = " +
                     std::to_string(slots) + " buffers)");
    const uint64_t batch_bytes = info.batch_size * slot_sample_bytes;
    if (options.shared_memory && address.kind == daemon::Address::Kind::kUnix &&
        static_cast<uint32_t>(slots) <= daemon::kMaxShmSlots) {
      shm_stride = daemon::ShmSlotStride(batch_bytes);
      auto r = daemon::SharedRegion::Create(shm_stride * static_cast<uint64_t>(slots), "gpufeed-batches");
      if (!r.ok()) return r.status().WithContext("remote loader: shared batch memory");
      region = std::move(*r);
      return pool.AllocateViews(region.bytes(), shm_stride, slots, info.batch_size, slot_sample_bytes,
                                options.loader.pin_memory, /*start_free=*/true);
    }
    return pool.Allocate(slots, info.batch_size, slot_sample_bytes, options.loader.pin_memory);
  }

  // Connects and completes the handshake; the HelloOk is returned.
  Result<daemon::HelloOk> Handshake(Conn* conn, uint64_t epoch, uint64_t start, bool describe,
                                    const std::atomic<bool>* cancel) const {
    auto c = Conn::Connect(address, options.connect_timeout_ms);
    if (!c.ok()) return c.status();
    *conn = std::move(*c);
    conn->set_cancel(cancel);
    const daemon::Hello hello = MakeHello(epoch, start, describe);
    if (hello.shm_slots > 0) {
      GPUFEED_RETURN_IF_ERROR(
          conn->SendFrameWithFd(FrameType::kHello, daemon::EncodeHello(hello), region.fd(), options.io_timeout_ms));
    } else {
      GPUFEED_RETURN_IF_ERROR(conn->SendFrame(FrameType::kHello, daemon::EncodeHello(hello), options.io_timeout_ms));
    }
    Conn::Frame f;
    GPUFEED_RETURN_IF_ERROR(conn->RecvFrame(&f, daemon::kMaxControlPayload, options.io_timeout_ms));
    if (f.header.type == FrameType::kError || f.header.type == FrameType::kShutdown) {
      return FromErrorFrame(f, conn->peer());
    }
    if (f.header.type != FrameType::kHelloOk) {
      return Status::Corrupt(conn->peer() + ": expected HELLO_OK, got " +
                             std::string(daemon::FrameTypeName(f.header.type)));
    }
    auto ok = daemon::DecodeHelloOk(f.payload);
    if (!ok.ok()) return ok.status().WithContext(conn->peer());
    return ok;
  }
};

// ---------------------------------------------------------------------------

struct RemoteStream final : EpochStream::Impl {
  RemoteLoader::Impl* loader;
  uint64_t epoch = 0, start_batch = 0;
  // Batches of this epoch for this rank: the loader's, or fewer in an epoch
  // resumed at another world size (its reshard).
  uint64_t epoch_batches = 0;
  std::string peer;
  std::atomic<bool> cancel{false};
  std::thread receiver;
  bool stopped = false;

  explicit RemoteStream(RemoteLoader::Impl* l) : loader(l), core(&l->pool) {}
  loader::StreamCore core;  // the ready queue, the first error, Next()'s wait

  // Consumer-side stats (taken by a feed's fill worker, read by stats()).
  std::atomic<uint64_t> batches{0}, samples{0}, bytes{0};
  std::chrono::steady_clock::time_point start_time = std::chrono::steady_clock::now();

  void Run();
  Status Receive(Conn& conn, std::deque<Batch::Slot*>& held);
  Status CheckSameDataset(const daemon::HelloOk& ok) const;
  Status GrantCredit(Conn& conn, std::deque<Batch::Slot*>& held, bool shm, Status* send_error);
  Status ReadBatch(Conn& conn, const daemon::HeaderBytes& hb, const daemon::FrameHeader& h, uint64_t expect,
                   Batch::Slot* slot, uint64_t* count);
  Status ReadBatchRef(Conn& conn, const daemon::HeaderBytes& hb, const daemon::FrameHeader& h, uint64_t expect,
                      std::deque<Batch::Slot*>& held, loader::StreamCore::Item* item);
  Status CheckHead(const daemon::BatchHead& head, uint64_t expect) const;
  Status TakeTable(const daemon::BatchHead& head, std::span<const std::byte> table, Batch::Slot* slot,
                   uint64_t* data_bytes) const;
  Status CheckPlans(const Batch::Slot& slot, uint64_t count, uint64_t expect) const;
  Result<std::optional<Batch>> Next() override;
  WaitResult WaitReady(std::chrono::steady_clock::time_point deadline) override { return core.WaitReady(deadline); }
  void Interrupt() override { core.Interrupt(); }
  uint64_t num_batches() const override { return epoch_batches; }
  LoaderStats stats() const override;
  void Stop() override;
  static EpochStream Start(std::unique_ptr<RemoteStream> s) { return Wrap(std::move(s)); }
};

void RemoteStream::Run() {
  std::deque<Batch::Slot*> held;  // slots granted to the daemon as credit, in arrival order
  Status st;
  // A thread root: whatever escapes becomes the consumer's error (a
  // bad_alloc here would otherwise be std::terminate).
  try {
    Conn conn;
    st = Receive(conn, held);
  } catch (const std::exception& e) {
    st = Status::Internal(peer + ": receiver: " + e.what());
  } catch (...) {
    st = Status::Internal(peer + ": receiver: unknown exception");
  }
  for (Batch::Slot* s : held) loader->pool.Release(s);
  if (!st.ok()) core.Fail(std::move(st));
  core.Finish();
}

// The daemon's answer to this stream's HELLO describes the dataset the
// loader connected to (Connect): its shape, batches, labels and fields.
Status RemoteStream::CheckSameDataset(const daemon::HelloOk& ok) const {
  const BatchSourceInfo& want = loader->info;
  auto same_fields = [&] {
    if (ok.info.fields.size() != want.fields.size()) return false;
    for (size_t i = 0; i < want.fields.size(); ++i) {
      const FieldInfo &a = ok.info.fields[i], &b = want.fields[i];
      if (a.name != b.name || a.dtype != b.dtype || a.sample_shape != b.sample_shape ||
          a.sample_bytes != b.sample_bytes) {
        return false;
      }
    }
    return true;
  };
  if (ok.info.sample_bytes != want.sample_bytes || ok.info.batch_size != want.batch_size ||
      ok.num_batches != epoch_batches || ok.info.has_labels != want.has_labels ||
      ok.info.encoded_batches != want.encoded_batches ||
      (want.encoded_batches && ok.slot_sample_bytes != loader->slot_sample_bytes) || !same_fields()) {
    return Status::InvalidArgument(peer + ": the daemon now serves a different dataset (" + ok.info.name +
                                   ") than at Connect() (" + want.name + ")");
  }
  return Status::Ok();
}

// One credit per slot this thread holds: every free slot taken, and at
// least one waited for, then granted (SLOTS with shared memory, else
// CREDIT). A failed send is left in *send_error (a frame may still explain
// it); an error returned ends the stream (cancelled, or a buffer the pool
// could not allocate).
Status RemoteStream::GrantCredit(Conn& conn, std::deque<Batch::Slot*>& held, bool shm, Status* send_error) {
  const RemoteLoaderOptions& o = loader->options;
  std::vector<uint32_t> grant;
  while (Batch::Slot* s = loader->pool.TryAcquire()) {
    held.push_back(s);
    grant.push_back(s->id);
  }
  while (held.empty() && send_error->ok()) {
    // Woken by a consumer release or Stop(); a consumer that holds every
    // slot for keepalive_ms gets a PING sent for it.
    bool timed_out = false;
    Batch::Slot* s = o.keepalive_ms > 0 ? loader->pool.AcquireFor(std::chrono::milliseconds(o.keepalive_ms), &timed_out)
                                        : loader->pool.Acquire();
    if (s != nullptr) {
      held.push_back(s);
      grant.push_back(s->id);
    } else if (!timed_out) {
      Status why = loader->pool.status();  // a buffer the pool could not allocate
      return why.ok() ? Status::IOError(peer + ": cancelled") : why;
    } else {
      *send_error = conn.SendFrame(FrameType::kPing, {}, o.io_timeout_ms);
    }
  }
  if (!grant.empty()) {
    *send_error = shm ? conn.SendFrame(FrameType::kSlots, daemon::EncodeSlots(grant), o.io_timeout_ms)
                      : conn.SendFrame(FrameType::kCredit, daemon::EncodeCredit(static_cast<uint32_t>(grant.size())),
                                       o.io_timeout_ms);
  }
  return Status::Ok();
}

Status RemoteStream::Receive(Conn& conn, std::deque<Batch::Slot*>& held) {
  const RemoteLoaderOptions& o = loader->options;
  auto ok = loader->Handshake(&conn, epoch, start_batch, false, &cancel);
  if (!ok.ok()) return ok.status();
  GPUFEED_RETURN_IF_ERROR(CheckSameDataset(*ok));
  const BatchSourceInfo& want = loader->info;
  const bool shm = ok->shm;
  if (shm && loader->region.fd() < 0) return Status::Corrupt(peer + ": HELLO_OK grants shared memory never offered");
  const uint64_t bs = want.batch_size;
  const uint64_t max_payload64 = daemon::BatchHead::kFixedBytes + bs * 16 +
                                 (want.encoded_batches ? bs * daemon::kEncodedEntryBytes : 0) +
                                 bs * loader->slot_sample_bytes;
  if (max_payload64 > UINT32_MAX) return Status::Unsupported(peer + ": batches over 4 GiB");
  const uint32_t max_payload = static_cast<uint32_t>(std::max<uint64_t>(max_payload64, daemon::kMaxControlPayload));
  uint64_t expect = start_batch;
  // A failed CREDIT send (the daemon closed its side) is reported only if no
  // frame explains it: a SHUTDOWN or ERROR may still wait in the socket.
  Status send_error;
  for (;;) {
    // One credit per slot this thread holds: the daemon never sends a batch
    // that has no slot to land in.
    if (send_error.ok()) GPUFEED_RETURN_IF_ERROR(GrantCredit(conn, held, shm, &send_error));
    daemon::HeaderBytes hb;
    if (Status st = conn.RecvAll(hb, o.io_timeout_ms); !st.ok()) return send_error.ok() ? st : send_error;
    auto h = daemon::ParseHeader(hb, max_payload, max_payload, peer);
    if (!h.ok()) return h.status();
    if (h->type == FrameType::kBatchRef && shm) {
      loader::StreamCore::Item item;
      GPUFEED_RETURN_IF_ERROR(ReadBatchRef(conn, hb, *h, expect, held, &item));
      core.Push(item);
      ++expect;
      continue;
    }
    if (h->type == FrameType::kBatch && !shm) {
      if (held.empty()) return Status::Corrupt(peer + ": a BATCH frame beyond the credit granted");
      Batch::Slot* slot = held.front();
      uint64_t count = 0;
      GPUFEED_RETURN_IF_ERROR(ReadBatch(conn, hb, *h, expect, slot, &count));
      held.pop_front();
      core.Push({slot, expect, count});
      ++expect;
      continue;
    }
    if (h->payload_bytes > daemon::kMaxControlPayload) {
      return Status::Corrupt(peer + ": a " + std::string(daemon::FrameTypeName(h->type)) + " frame of " +
                             std::to_string(h->payload_bytes) + " bytes");
    }
    Conn::Frame f;
    f.header = *h;
    f.payload.resize(h->payload_bytes);
    GPUFEED_RETURN_IF_ERROR(conn.RecvAll(f.payload, o.io_timeout_ms));
    GPUFEED_RETURN_IF_ERROR(daemon::VerifyChecksum(*h, hb, f.payload, peer));
    switch (h->type) {
      case FrameType::kEnd: {
        auto end = daemon::DecodeEnd(f.payload);
        if (!end.ok()) return end.status().WithContext(peer);
        if (end->epoch != epoch || end->batches != expect) {
          return Status::Corrupt(peer + ": END of epoch " + std::to_string(end->epoch) + " after " +
                                 std::to_string(end->batches) + " batches, but " + std::to_string(expect) +
                                 " of epoch " + std::to_string(epoch) + " were received");
        }
        return Status::Ok();
      }
      case FrameType::kError:
      case FrameType::kShutdown:
        return FromErrorFrame(f, peer);
      default:
        return Status::Corrupt(peer + ": unexpected " + std::string(daemon::FrameTypeName(h->type)) +
                               " frame while streaming");
    }
  }
}

Status RemoteStream::ReadBatch(Conn& conn, const daemon::HeaderBytes& hb, const daemon::FrameHeader& h, uint64_t expect,
                               Batch::Slot* slot, uint64_t* count) {
  const int timeout = loader->options.io_timeout_ms;
  const BatchSourceInfo& info = loader->info;
  daemon::Checksum sum(hb);
  std::vector<std::byte> raw;  // the decompressed payload (compressed frames only)
  std::span<const std::byte> fixed;
  std::array<std::byte, daemon::BatchHead::kFixedBytes> fixed_buf;
  if (h.flags & daemon::kFlagZstd) {
    std::vector<std::byte> wire(h.payload_bytes);
    GPUFEED_RETURN_IF_ERROR(conn.RecvAll(wire, timeout));
    GPUFEED_RETURN_IF_ERROR(daemon::VerifyChecksum(h, hb, wire, peer));
    raw.resize(h.raw_bytes);
    GPUFEED_RETURN_IF_ERROR(daemon::Decompress(wire, raw, peer));
    fixed = std::span<const std::byte>(raw).first(std::min<size_t>(raw.size(), fixed_buf.size()));
  } else {
    if (h.payload_bytes < fixed_buf.size()) return Status::Corrupt(peer + ": BATCH frame shorter than its head");
    GPUFEED_RETURN_IF_ERROR(conn.RecvAll(fixed_buf, timeout));
    sum.Update(fixed_buf);
    fixed = fixed_buf;
  }
  auto head = daemon::DecodeBatchFixed(fixed);
  if (!head.ok()) return head.status().WithContext(peer);
  GPUFEED_RETURN_IF_ERROR(CheckHead(*head, expect));
  const uint64_t n = head->count;
  auto wrong_size = [&] {
    return Status::Corrupt(peer + ": BATCH " + std::to_string(expect) + " of " + std::to_string(head->count) +
                           " samples in a frame of " + std::to_string(h.raw_bytes) + " bytes");
  };
  if (head->head_bytes() > h.raw_bytes) return wrong_size();
  // The payload after the fixed part, piece by piece: from the decompressed
  // copy, or from the socket (checksummed as it comes).
  size_t at = daemon::BatchHead::kFixedBytes;
  auto take = [&](std::span<std::byte> dst) -> Status {
    if (dst.empty()) return Status::Ok();
    if (!raw.empty()) {
      std::memcpy(dst.data(), raw.data() + at, dst.size());  // in bounds: sizes checked against raw_bytes first
      at += dst.size();
      return Status::Ok();
    }
    GPUFEED_RETURN_IF_ERROR(conn.RecvAll(dst, timeout));
    sum.Update(dst);
    return Status::Ok();
  };
  // Indices, labels and an encoded batch's table.
  std::vector<std::byte> table(head->encoded ? n * daemon::kEncodedEntryBytes : 0);
  GPUFEED_RETURN_IF_ERROR(take(std::as_writable_bytes(std::span(slot->indices.data(), n))));
  GPUFEED_RETURN_IF_ERROR(take(std::as_writable_bytes(std::span(slot->labels.data(), head->has_labels ? n : 0))));
  GPUFEED_RETURN_IF_ERROR(take(table));
  GPUFEED_RETURN_IF_ERROR(TakeTable(*head, table, slot, &head->data_bytes));
  if (head->payload_bytes() != h.raw_bytes) return wrong_size();
  if (head->encoded) {
    // The slot's bytes up to the table's end, where the table says.
    GPUFEED_RETURN_IF_ERROR(take(std::span(slot->images.data(), head->data_bytes)));
  } else {
    // Each field's n rows, to where the field lives in a slot laid out for
    // batch_size samples (planar: ChunkSource's layout).
    const uint64_t capacity = slot->images.bytes() / info.sample_bytes;  // >= batch_size >= n (CheckHead)
    for (const FieldInfo& f : info.fields) {
      GPUFEED_RETURN_IF_ERROR(take(std::span(slot->images.data() + capacity * f.offset, n * f.sample_bytes)));
    }
  }
  if (raw.empty() && sum.Digest() != h.checksum) {
    return Status::Corrupt(peer + ": checksum mismatch in BATCH " + std::to_string(expect) + " (corrupted in transit)");
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (slot->indices[i] >= info.num_samples) {
      return Status::Corrupt(peer + ": BATCH " + std::to_string(expect) + " names sample " +
                             std::to_string(slot->indices[i]) + " of " + std::to_string(info.num_samples));
    }
  }
  if (head->encoded) GPUFEED_RETURN_IF_ERROR(CheckPlans(*slot, n, expect));
  *count = n;
  return Status::Ok();
}

// An encoded batch's table into the slot (checked: DecodeEncodedTable), or a
// decoded batch's mark; either must be what the stream agreed (HELLO_OK's
// encoded_batches: every batch of such a stream has a table).
Status RemoteStream::TakeTable(const daemon::BatchHead& head, std::span<const std::byte> table, Batch::Slot* slot,
                               uint64_t* data_bytes) const {
  const BatchSourceInfo& info = loader->info;
  const std::string what = peer + ": batch " + std::to_string(head.index);
  if (head.encoded != info.encoded_batches) {
    return Status::Corrupt(what + (head.encoded ? " carries encoded samples, which this stream did not agree to"
                                                : " has no encoded table, which every batch of this stream has"));
  }
  slot->deferred = head.encoded;
  if (!head.encoded) return Status::Ok();
  auto end = daemon::DecodeEncodedTable(table, head.count, info.sample_bytes, slot->images.bytes(), &slot->encoded);
  if (!end.ok()) return end.status().WithContext(what);
  *data_bytes = *end;
  return Status::Ok();
}

// Each encoded sample's size and crop, as this side's own header parse and
// crop plan (the daemon's decoder, the same options) give them: the feed's
// device decoder sizes its output by them, so a daemon's word is not taken.
Status RemoteStream::CheckPlans(const Batch::Slot& slot, uint64_t count, uint64_t expect) const {
  const SampleDecoder& planner = *loader->planner;
  const DecodeContext context{loader->options.loader.seed, epoch};
  for (uint64_t i = 0; i < count; ++i) {
    const EncodedSample& e = slot.encoded[i];
    if (e.bytes == 0) continue;
    DevicePlan plan;
    GPUFEED_RETURN_IF_ERROR(
        planner.PlanDevice(std::span(slot.images.data() + e.offset, e.bytes), slot.indices[i], context, &plan));
    if (!plan.device_decodable || plan.height != e.height || plan.width != e.width || !(plan.crop == e.crop)) {
      return Status::Corrupt(
          peer + ": batch " + std::to_string(expect) + " sample " + std::to_string(slot.indices[i]) +
          ": sent encoded as a " + std::to_string(e.height) + "x" + std::to_string(e.width) + " image cropped " +
          std::to_string(e.crop.height) + "x" + std::to_string(e.crop.width) + " at (" + std::to_string(e.crop.top) +
          ", " + std::to_string(e.crop.left) + "), but its header reads " +
          (plan.device_decodable
               ? std::to_string(plan.height) + "x" + std::to_string(plan.width) + " cropped " +
                     std::to_string(plan.crop.height) + "x" + std::to_string(plan.crop.width) + " at (" +
                     std::to_string(plan.crop.top) + ", " + std::to_string(plan.crop.left) + ")"
               : std::string("as no device-decodable JPEG (") + plan.why_not + ")") +
          " (the daemon and this client must run the same gpufeed with the same decode options)");
    }
  }
  return Status::Ok();
}

Status RemoteStream::CheckHead(const daemon::BatchHead& head, uint64_t expect) const {
  const BatchSourceInfo& info = loader->info;
  if (head.epoch != epoch || head.index != expect || head.count == 0 || head.count > info.batch_size ||
      head.sample_bytes != info.sample_bytes || head.has_labels != info.has_labels) {
    return Status::Corrupt(peer + ": batch head (epoch " + std::to_string(head.epoch) + ", batch " +
                           std::to_string(head.index) + ", " + std::to_string(head.count) + " samples of " +
                           std::to_string(head.sample_bytes) + " bytes) does not match the stream (epoch " +
                           std::to_string(epoch) + ", batch " + std::to_string(expect) + ")");
  }
  return Status::Ok();
}

// A BATCH_REF: the fields are in a slot granted to the daemon; the frame
// carries which, and the samples' indices and labels.
Status RemoteStream::ReadBatchRef(Conn& conn, const daemon::HeaderBytes& hb, const daemon::FrameHeader& h,
                                  uint64_t expect, std::deque<Batch::Slot*>& held, loader::StreamCore::Item* item) {
  const BatchSourceInfo& info = loader->info;
  const uint64_t table_max = info.encoded_batches ? info.batch_size * daemon::kEncodedEntryBytes : 0;
  if (h.flags != 0 || h.payload_bytes > daemon::BatchRef::kFixedBytes + info.batch_size * 16 + table_max) {
    return Status::Corrupt(peer + ": BATCH_REF frame of " + std::to_string(h.payload_bytes) + " bytes");
  }
  std::vector<std::byte> payload(h.payload_bytes);
  GPUFEED_RETURN_IF_ERROR(conn.RecvAll(payload, loader->options.io_timeout_ms));
  GPUFEED_RETURN_IF_ERROR(daemon::VerifyChecksum(h, hb, payload, peer));
  auto ref = daemon::DecodeBatchRef(payload);
  if (!ref.ok()) return ref.status().WithContext(peer);
  GPUFEED_RETURN_IF_ERROR(CheckHead(ref->head, expect));
  auto it = std::find_if(held.begin(), held.end(), [&](Batch::Slot* s) { return s->id == ref->slot; });
  if (it == held.end()) {
    return Status::Corrupt(peer + ": BATCH_REF " + std::to_string(expect) + " in slot " + std::to_string(ref->slot) +
                           ", which was not granted");
  }
  Batch::Slot* slot = *it;
  const uint64_t n = ref->head.count;
  const std::byte* at = payload.data() + daemon::BatchRef::kFixedBytes;
  std::memcpy(slot->indices.data(), at, n * 8);
  if (ref->head.has_labels) std::memcpy(slot->labels.data(), at + n * 8, n * 8);
  for (uint64_t i = 0; i < n; ++i) {
    if (slot->indices[i] >= info.num_samples) {
      return Status::Corrupt(peer + ": BATCH_REF " + std::to_string(expect) + " names sample " +
                             std::to_string(slot->indices[i]) + " of " + std::to_string(info.num_samples));
    }
  }
  const uint64_t labels_bytes = ref->head.has_labels ? n * 8 : 0;
  uint64_t data_bytes = 0;
  GPUFEED_RETURN_IF_ERROR(TakeTable(
      ref->head,
      std::span<const std::byte>(at + n * 8 + labels_bytes, ref->head.encoded ? n * daemon::kEncodedEntryBytes : 0),
      slot, &data_bytes));
  if (ref->head.encoded) GPUFEED_RETURN_IF_ERROR(CheckPlans(*slot, n, expect));
  held.erase(it);
  *item = {slot, expect, n};
  return Status::Ok();
}

Result<std::optional<Batch>> RemoteStream::Next() {
  // The receiver always finishes (io_timeout_ms bounds every read) and the
  // core notices a consumer that holds every slot, so this wait ends.
  auto r = core.Pop(peer);
  if (!r.ok()) return r.status();
  if (!r->has_value()) return std::optional<Batch>();
  const loader::StreamCore::Item& it = **r;
  const BatchSourceInfo& info = loader->info;
  Batch b = MakeBatch(it.slot, epoch, it.index, it.count, info.sample_bytes, info.has_labels, &info.sample_shape,
                      &info.fields);
  ++batches;
  samples += it.count;
  bytes += it.count * info.sample_bytes;
  MutexLock lock(&loader->state_mu);
  loader->state.epoch = epoch;
  loader->state.next_batch = it.index + 1;
  return std::optional<Batch>(std::move(b));
}

LoaderStats RemoteStream::stats() const {
  LoaderStats s;
  s.batches = batches;
  s.samples = samples;
  s.bytes_delivered = bytes;
  s.consumer_wait_seconds = core.wait_seconds();
  s.queue_depth_sum = core.depth_sum();
  s.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
  return s;
}

void RemoteStream::Stop() {
  if (stopped) return;
  stopped = true;
  cancel = true;
  loader->pool.SetCancelled(true);
  if (receiver.joinable()) receiver.join();
  core.ReleaseUndelivered();
  loader->pool.SetCancelled(false);
  if (loader->active == this) loader->active = nullptr;
}

// ---------------------------------------------------------------------------

RemoteLoader::RemoteLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteLoader::~RemoteLoader() {
  if (impl_->active != nullptr) impl_->active->Stop();
}

Result<std::unique_ptr<RemoteLoader>> RemoteLoader::Connect(const RemoteLoaderOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto addr = daemon::ParseAddress(options.address);
  if (!addr.ok()) return addr.status();
  impl->address = *addr;
  auto token = ReadToken(options);
  if (!token.ok()) return token.status();
  impl->token = *token;
  if (options.loader.batch_size == 0 || options.loader.world_size < 1 || options.loader.rank < 0 ||
      options.loader.rank >= options.loader.world_size) {
    return Status::InvalidArgument("remote loader: batch_size >= 1 and 0 <= rank < world_size required");
  }
  Conn conn;
  auto ok = impl->Handshake(&conn, 0, 0, true, nullptr);
  if (!ok.ok()) return ok.status();
  impl->info = ok->info;  // fields as the daemon's source has them (DecodeHelloOk set their offsets)
  if (ok->info.encoded_batches) {
    // Encoded samples for this client's device decoder (version 5): only
    // when asked for, checked against this side's own plan of each.
    if (!options.loader.defer_decode) {
      return Status::Corrupt(addr->ToString() + ": HELLO_OK offers encoded batches, which this client did not ask for");
    }
    auto planner = MakeImageDecoder(options.decode);
    if (!planner.ok()) return planner.status().WithContext(addr->ToString());
    impl->planner = std::move(*planner);
  }
  impl->slot_sample_bytes = ok->info.encoded_batches ? ok->slot_sample_bytes : ok->info.sample_bytes;
  impl->info.name = addr->ToString() + " " + ok->info.name;
  impl->info.pool_slots = static_cast<uint64_t>(std::max(1, options.loader.prefetch)) + 1;
  impl->num_batches = ok->num_batches;
  {
    MutexLock lock(&impl->state_mu);
    impl->state.seed = options.loader.seed;
  }
  return std::unique_ptr<RemoteLoader>(new RemoteLoader(std::move(impl)));
}

EpochStream RemoteLoader::Epoch(uint64_t epoch, uint64_t start_batch) {
  if (impl_->active != nullptr) impl_->active->Stop();
  auto s = std::make_unique<RemoteStream>(impl_.get());
  s->epoch = epoch;
  s->start_batch = start_batch;
  s->epoch_batches = impl_->num_batches;
  if (const LoaderOptions o = sharding(); o.reshard.world_size > 0 && o.reshard.epoch == epoch && o.batch_size > 0) {
    const uint64_t share = loader::RankShare(impl_->info.num_samples, o, epoch);
    s->epoch_batches = (share + o.batch_size - 1) / o.batch_size;
  }
  s->peer = impl_->address.ToString();
  {
    MutexLock lock(&impl_->state_mu);
    impl_->state.epoch = epoch;
    impl_->state.next_batch = start_batch;
  }
  Status st;
  if (start_batch > impl_->num_batches) {
    st = Status::InvalidArgument(s->peer + ": resume at batch " + std::to_string(start_batch) + " past the epoch's " +
                                 std::to_string(impl_->num_batches));
  } else {
    st = impl_->EnsurePool();
  }
  if (!st.ok()) {
    s->core.FailNow(st);
    s->stopped = true;
    return RemoteStream::Start(std::move(s));
  }
  impl_->active = s.get();
  RemoteStream* raw = s.get();
  raw->receiver = std::thread([raw] { raw->Run(); });
  return RemoteStream::Start(std::move(s));
}

LoaderState RemoteLoader::state() const {
  LoaderState s;
  {
    MutexLock lock(&impl_->state_mu);
    s = impl_->state;
  }
  DescribeShard(impl_->info.num_samples, sharding(), &s);
  return s;
}

LoaderOptions RemoteLoader::sharding() const {
  LoaderOptions o = impl_->options.loader;
  o.batch_size = impl_->info.batch_size;  // as the daemon delivers it (clamped to the share)
  return o;
}

void RemoteLoader::SetReshard(const LoaderOptions::Reshard& r) { impl_->options.loader.reshard = r; }
const BatchSourceInfo& RemoteLoader::info() const { return impl_->info; }
uint64_t RemoteLoader::num_batches() const { return impl_->num_batches; }
const RemoteLoaderOptions& RemoteLoader::options() const { return impl_->options; }

}  // namespace gpufeed
