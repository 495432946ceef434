// The daemon end to end on loopback: RemoteLoader batches equal a local
// Loader's byte for byte; resume after reconnect; bad clients (wrong token,
// garbage, oversized or truncated frames, silence, too many connections,
// stalled readers) are refused or contained without hurting other clients;
// graceful shutdown loses and doubles nothing for clients that resume.
// Every loop is bounded; timeouts are short.
#include "gpufeed/server.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "loader/remote/conn.h"
#include "daemon/event_log.h"
#include "loader/remote/protocol.h"
#include "loader/remote/shm.h"
#include "gpufeed/dataset.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/remote_loader.h"
#include "tests/testing/streams.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using daemon::Conn;
using daemon::FrameType;

struct Delivered {
  std::vector<uint64_t> batch_index;
  std::vector<uint64_t> hashes;   // images + labels + indices of each batch
  std::vector<uint64_t> indices;  // every sample, in order
};

uint64_t HashBatch(const Batch& b) {
  uint64_t h = XXH3_64bits(b.images().data(), b.images().size());
  h ^= XXH3_64bits_withSeed(b.indices().data(), b.indices().size_bytes(), 1);
  h ^= XXH3_64bits_withSeed(b.labels().data(), b.labels().size_bytes(), 2);
  return h;
}

// Pulls up to `max_batches` from a stream, checking each sample's bytes
// against its index. Returns the stream's final status.
Status Drain(EpochStream& stream, Delivered* d, uint64_t max_batches = UINT64_MAX) {
  for (uint64_t n = 0; n < max_batches; ++n) {
    auto r = stream.Next();
    if (!r.ok()) return r.status();
    if (!r->has_value()) return Status::Ok();
    const Batch& b = **r;
    for (uint64_t i = 0; i < b.size(); ++i) {
      auto sample = b.images().subspan(i * b.sample_bytes(), b.sample_bytes());
      EXPECT_EQ(testing::SampleIndexOf(sample), static_cast<int64_t>(b.indices()[i]));
      EXPECT_EQ(b.labels()[i], testing::IndexLabel(b.indices()[i]));
      d->indices.push_back(b.indices()[i]);
    }
    d->batch_index.push_back(b.index());
    d->hashes.push_back(HashBatch(b));
  }
  return Status::Ok();
}

class DaemonTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kN = 700, kChunk = 50;
  void SetUp() override {
    dir_ = testing::MakeTempDir("daemon");
    data_ = dir_ + "/data.h5";
    const std::vector<hsize_t> shape{kN, 3, 8, 8};
    const uint64_t sb = 3 * 8 * 8;
    auto bytes = testing::IndexSamples(kN, sb);
    testing::H5Layout layout;
    layout.chunk = {kChunk, 3, 8, 8};
    ASSERT_TRUE(testing::WriteH5(data_, shape, H5T_NATIVE_UINT8, bytes, layout));
    auto ds = Dataset::Open(data_);
    ASSERT_TRUE(ds.ok());
    ds_ = std::make_unique<Dataset>(std::move(*ds));
  }

  ServerOptions Options() {
    ServerOptions o;
    o.data = {data_};
    o.listen = "unix:" + dir_ + "/d.sock";
    o.io_threads = 2;
    o.loader_threads = 2;
    o.prefetch = 3;
    o.cache_bytes = 64 << 10;
    o.memory_bytes = 256 << 20;
    o.handshake_timeout_ms = 2000;
    o.idle_timeout_ms = 10000;
    o.write_timeout_ms = 10000;
    o.shutdown_grace_ms = 3000;
    o.log = [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.emplace_back(line);
    };
    return o;
  }
  std::unique_ptr<Server> StartServer(const ServerOptions& o) {
    auto s = Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  LoaderOptions StreamOptions(Order order = Order::kBlock, int rank = 0, int world = 1) {
    LoaderOptions lo;
    lo.batch_size = 32;
    lo.order = order;
    lo.seed = 17;
    lo.shuffle_window = 3;
    lo.rank = rank;
    lo.world_size = world;
    lo.prefetch = 3;
    lo.pin_memory = false;
    lo.threads = 2;
    lo.cache_bytes = 64 << 10;
    return lo;
  }
  RemoteLoaderOptions Client(const std::string& endpoint, const LoaderOptions& lo) {
    RemoteLoaderOptions c;
    c.address = endpoint;
    c.loader = lo;
    c.io_timeout_ms = 10000;
    return c;
  }
  Delivered Local(const LoaderOptions& lo, uint64_t epoch) {
    Loader loader(*ds_, lo);
    EpochStream s = loader.Epoch(epoch);
    Delivered d;
    EXPECT_TRUE(Drain(s, &d).ok());
    return d;
  }
  bool LogHas(const std::string& needle) {
    std::lock_guard<std::mutex> lock(log_mu_);
    for (const auto& l : log_) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  size_t LogCount(const std::string& needle) {
    std::lock_guard<std::mutex> lock(log_mu_);
    size_t n = 0;
    for (const auto& l : log_) n += l.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }
  // Waits (bounded) until `pred` holds.
  template <typename F>
  bool Eventually(F pred, int ms = 5000) {
    for (int waited = 0; waited < ms; waited += 10) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
  }
  Conn RawConnect(const std::string& endpoint) {
    auto a = daemon::ParseAddress(endpoint);
    EXPECT_TRUE(a.ok());
    auto c = Conn::Connect(*a, 2000);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : Conn();
  }
  std::vector<std::byte> HelloBytes(const LoaderOptions& lo, const std::string& token = "") {
    daemon::Hello h;
    h.token = token;
    h.loader = lo;
    return daemon::EncodeHello(h);
  }
  // A file of n index-valued samples of [3, 64, 64] (12 KiB), 100 a chunk;
  // its path, or "" if it could not be written.
  std::string WriteBig(uint64_t n) {
    const std::string path = dir_ + "/big.h5";
    testing::H5Layout layout;
    layout.chunk = {100, 3, 64, 64};
    const bool ok =
        testing::WriteH5(path, {n, 3, 64, 64}, H5T_NATIVE_UINT8, testing::IndexSamples(n, 3 * 64 * 64), layout);
    return ok ? path : "";
  }
  // Reads frames until an ERROR (returned) or the connection ends.
  std::string ReadError(Conn& c) {
    for (int i = 0; i < 1000; ++i) {
      Conn::Frame f;
      if (!c.RecvFrame(&f, 16 << 20, 3000).ok()) return "";
      if (f.header.type == FrameType::kError) {
        auto e = daemon::DecodeError(f.payload);
        return e.ok() ? e->message : "";
      }
    }
    return "";
  }

  std::string dir_, data_;
  std::unique_ptr<Dataset> ds_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(DaemonTest, RemoteBatchesEqualLocalByteForByte) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  for (bool shm : {true, false}) {
    for (Order order : {Order::kBlock, Order::kRandom, Order::kSequential}) {
      for (int rank = 0; rank < 2; ++rank) {
        const LoaderOptions lo = StreamOptions(order, rank, 2);
        RemoteLoaderOptions c = Client(server->endpoint(), lo);
        c.shared_memory = shm;
        auto remote = RemoteLoader::Connect(c);
        ASSERT_TRUE(remote.ok()) << remote.status().ToString();
        EXPECT_EQ((*remote)->info().sample_bytes, 192u);
        EXPECT_EQ((*remote)->info().sample_shape, (std::vector<uint64_t>{3, 8, 8}));
        // One field, "images", as the local Loader describes it (protocol 3).
        const std::vector<FieldInfo>& fields = (*remote)->info().fields;
        ASSERT_EQ(fields.size(), 1u);
        const FieldInfo want_field = ds_->fields()[0];
        EXPECT_EQ(fields[0].name, want_field.name);
        EXPECT_EQ(fields[0].path, want_field.path);
        EXPECT_EQ(fields[0].sample_shape, want_field.sample_shape);
        EXPECT_EQ(fields[0].sample_bytes, 192u);
        EXPECT_EQ(fields[0].offset, 0u);
        const Delivered want = Local(lo, 2);
        EpochStream s = (*remote)->Epoch(2);
        EXPECT_EQ(s.num_batches(), want.hashes.size());
        Delivered got;
        ASSERT_TRUE(Drain(s, &got).ok());
        EXPECT_EQ(got.hashes, want.hashes) << OrderName(order) << " rank " << rank;
        EXPECT_EQ(got.indices, want.indices);
        EXPECT_EQ((*remote)->state().next_batch, want.hashes.size());
      }
    }
  }
  EXPECT_GT(server->stats().batches_sent, 0u);
  EXPECT_TRUE(LogHas("transport=shm:4_slots"));
  EXPECT_TRUE(LogHas("transport=socket"));
}

TEST_F(DaemonTest, CompressedStreamIsIdentical) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  auto c = Client(server->endpoint(), StreamOptions());
  c.compress = true;
  auto remote = RemoteLoader::Connect(c);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EpochStream s = (*remote)->Epoch(1);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got).ok());
  EXPECT_EQ(got.hashes, Local(StreamOptions(), 1).hashes);
}

TEST_F(DaemonTest, ResumeAfterReconnectContinuesExactly) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  const Delivered want = Local(StreamOptions(), 3);
  auto remote = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions()));
  ASSERT_TRUE(remote.ok());
  Delivered got;
  {
    EpochStream s = (*remote)->Epoch(3);
    ASSERT_TRUE(Drain(s, &got, 7).ok());
  }  // disconnects mid-epoch, with batches in flight
  const LoaderState st = (*remote)->state();
  EXPECT_EQ(st.epoch, 3u);
  EXPECT_EQ(st.next_batch, 7u);
  // A fresh client (as after a trainer restart) resumes from the state.
  auto again = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions()));
  ASSERT_TRUE(again.ok());
  EpochStream s = (*again)->Resume(st);
  ASSERT_TRUE(Drain(s, &got).ok());
  EXPECT_EQ(got.hashes, want.hashes);
  EXPECT_EQ(got.indices, want.indices);
}

TEST_F(DaemonTest, GpuFeederWorksUnchangedOnARemoteLoader) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  FeedOptions fo;  // on the GPU where there is one (the remote pool is then a registered memfd), else CPU twins
  bool on_gpu = false;
  auto run = [&](BatchSource& src) {
    GpuFeeder feeder(src, fo, 1);
    on_gpu = feeder.on_gpu();
    std::vector<uint64_t> hashes;
    for (int i = 0; i < 100; ++i) {
      auto b = feeder.Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok() || !b->has_value()) break;
      std::vector<float> img(static_cast<size_t>((*b)->size()) * 192);
      EXPECT_TRUE(feeder.CopyToHost(**b, img.data(), nullptr).ok());
      hashes.push_back(XXH3_64bits(img.data(), img.size() * sizeof(float)));
    }
    return hashes;
  };
  Loader local(*ds_, StreamOptions());
  LoaderOptions pinned = StreamOptions();
  pinned.pin_memory = true;
  auto remote = RemoteLoader::Connect(Client(server->endpoint(), pinned));
  ASSERT_TRUE(remote.ok());
  const auto want = run(local);
  EXPECT_EQ(want.size(), (kN + 31) / 32);
  EXPECT_EQ(run(**remote), want);
  EXPECT_TRUE(LogHas("transport=shm"));
  EpochStream s = (*remote)->Epoch(0);
  auto b = s.Next();
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->pinned(), on_gpu) << "the shared pool is page-locked in place where a GPU is present";
  if (!on_gpu) std::printf("[ note ] no CUDA device: the remote pool's registration was not exercised\n");
}

TEST_F(DaemonTest, TcpRequiresTheToken) {
  ServerOptions o = Options();
  o.listen = "tcp://127.0.0.1:0";
  auto no_token = Server::Start(o);
  ASSERT_FALSE(no_token.ok());
  EXPECT_NE(no_token.status().message().find("--token-file"), std::string::npos);
  { std::ofstream(dir_ + "/token") << "correct horse\n"; }
  o.token_file = dir_ + "/token";
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  EXPECT_EQ(server->endpoint().rfind("tcp://127.0.0.1:", 0), 0u);
  auto c = Client(server->endpoint(), StreamOptions());
  c.token = "wrong horse";
  auto bad = RemoteLoader::Connect(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("wrong token"), std::string::npos) << bad.status().message();
  EXPECT_GE(server->stats().protocol_errors, 1u);
  c.token.clear();
  c.token_file = dir_ + "/token";
  auto good = RemoteLoader::Connect(c);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EpochStream s = (*good)->Epoch(0);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got).ok());
  EXPECT_EQ(got.hashes, Local(StreamOptions(), 0).hashes);
  EXPECT_TRUE(LogHas("transport=socket"));  // no shared memory over TCP
  EXPECT_FALSE(LogHas("transport=shm"));
}

TEST_F(DaemonTest, MalformedFramesCloseOnlyThatConnection) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  {  // garbage bytes
    Conn c = RawConnect(server->endpoint());
    std::vector<std::byte> junk(64, std::byte{0x5a});
    ASSERT_TRUE(c.SendAll(junk, 2000).ok());
    EXPECT_NE(ReadError(c).find("magic"), std::string::npos);
  }
  {  // an oversized length: refused from the header, nothing allocated
    Conn c = RawConnect(server->endpoint());
    auto hb = daemon::MakeHeader(FrameType::kHello, 0, 0, {});
    const uint32_t big = 0x7fffffff;
    std::memcpy(hb.data() + 12, &big, 4);
    std::memcpy(hb.data() + 16, &big, 4);
    ASSERT_TRUE(c.SendAll(hb, 2000).ok());
    EXPECT_NE(ReadError(c).find("exceeds the limit"), std::string::npos);
  }
  {  // a corrupted payload
    Conn c = RawConnect(server->endpoint());
    auto frame = daemon::MakeFrame(FrameType::kHello, HelloBytes(StreamOptions()));
    frame.back() ^= std::byte{1};
    ASSERT_TRUE(c.SendAll(frame, 2000).ok());
    EXPECT_NE(ReadError(c).find("checksum"), std::string::npos);
  }
  {  // credit before hello
    Conn c = RawConnect(server->endpoint());
    ASSERT_TRUE(c.SendFrame(FrameType::kCredit, daemon::EncodeCredit(1), 2000).ok());
    EXPECT_NE(ReadError(c).find("expected HELLO"), std::string::npos);
  }
  {  // a truncated frame, then the client goes away
    Conn c = RawConnect(server->endpoint());
    auto frame = daemon::MakeFrame(FrameType::kHello, HelloBytes(StreamOptions()));
    ASSERT_TRUE(c.SendAll(std::span<const std::byte>(frame).first(frame.size() - 5), 2000).ok());
  }
  {  // a dataset the daemon does not serve gets a clear refusal
    Conn c = RawConnect(server->endpoint());
    daemon::Hello h;
    h.loader = StreamOptions();
    h.dataset = "other.h5";
    ASSERT_TRUE(c.SendFrame(FrameType::kHello, daemon::EncodeHello(h), 2000).ok());
    EXPECT_NE(ReadError(c).find("'other.h5' is not served here"), std::string::npos);
  }
  EXPECT_TRUE(Eventually([&] { return server->stats().connections_open == 0; }));
  EXPECT_GE(server->stats().protocol_errors, 4u);
  EXPECT_TRUE(LogHas("level=warn event=error"));
  // The daemon still serves.
  auto remote = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions()));
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EpochStream s = (*remote)->Epoch(0);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got).ok());
  EXPECT_EQ(got.hashes.size(), (kN + 31) / 32);
}

TEST_F(DaemonTest, ClientThatDisconnectsMidBatch) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  {
    Conn c = RawConnect(server->endpoint());
    ASSERT_TRUE(c.SendFrame(FrameType::kHello, HelloBytes(StreamOptions()), 2000).ok());
    Conn::Frame ok;
    ASSERT_TRUE(c.RecvFrame(&ok, daemon::kMaxControlPayload, 3000).ok());
    ASSERT_EQ(ok.header.type, FrameType::kHelloOk);
    ASSERT_TRUE(c.SendFrame(FrameType::kCredit, daemon::EncodeCredit(4), 2000).ok());
    std::vector<std::byte> part(daemon::kHeaderBytes + 100);
    ASSERT_TRUE(c.RecvAll(part, 3000).ok());  // the first batch's header and a little more
  }                                           // gone in the middle of a batch
  EXPECT_TRUE(Eventually([&] { return server->stats().connections_open == 0; }));
  EXPECT_EQ(server->stats().streams_active, 0u);
  // Its Loader is parked warm (the reservation goes with it), and reused.
  EXPECT_NE(server->MetricsText().find("gpufeed_loaders_parked 1"), std::string::npos);
  RemoteLoaderOptions c = Client(server->endpoint(), StreamOptions());
  c.shared_memory = false;  // the same stream identity as the raw client's
  auto remote = RemoteLoader::Connect(c);
  ASSERT_TRUE(remote.ok());
  EpochStream s = (*remote)->Epoch(0);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got).ok());
  EXPECT_EQ(got.hashes, Local(StreamOptions(), 0).hashes);
  EXPECT_TRUE(LogHas("loader=warm"));
}

// A client's next epoch connects while the last epoch's session may still be
// closing (its END is out, its Loader not yet parked): the new session waits
// for that Loader instead of building a cold one beside it. Every epoch after
// the first runs warm, over TCP and over shared memory.
TEST_F(DaemonTest, EveryNextEpochRunsOnTheWarmLoader) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  constexpr uint64_t kEpochs = 6;
  for (bool shm : {false, true}) {
    RemoteLoaderOptions c = Client(server->endpoint(), StreamOptions());
    c.shared_memory = shm;
    auto remote = RemoteLoader::Connect(c);
    ASSERT_TRUE(remote.ok());
    const size_t new_before = LogCount("loader=new"), warm_before = LogCount("loader=warm");
    std::vector<Delivered> got(kEpochs);
    for (uint64_t epoch = 0; epoch < kEpochs; ++epoch) {  // back to back, as a training loop asks
      EpochStream s = (*remote)->Epoch(epoch);
      Status st = Drain(s, &got[epoch]);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    for (uint64_t epoch = 0; epoch < kEpochs; ++epoch) {
      EXPECT_EQ(got[epoch].hashes, Local(StreamOptions(), epoch).hashes) << "epoch " << epoch << " shm " << shm;
    }
    EXPECT_TRUE(Eventually([&] { return LogCount("loader=warm") - warm_before == kEpochs - 1; }))
        << "shm " << shm << ": " << LogCount("loader=warm") - warm_before << " warm starts";
    EXPECT_EQ(LogCount("loader=new") - new_before, 1u) << "shm " << shm;
  }
  EXPECT_FALSE(LogHas("outcome=cold_loader"));
}

// Shared memory: the daemon's Loader fills the client's memfd; a client's
// next epoch reuses the parked Loader; what the daemon maps is checked, and
// slots are granted exactly once each.
TEST_F(DaemonTest, SharedMemoryStreamsAndHostileRegions) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  {
    auto remote = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions()));
    ASSERT_TRUE(remote.ok());
    for (uint64_t epoch : {0, 1}) {
      EpochStream s = (*remote)->Epoch(epoch);
      Delivered got;
      Status st = Drain(s, &got);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(got.hashes, Local(StreamOptions(), epoch).hashes) << "epoch " << epoch;
    }
    EXPECT_TRUE(LogHas("transport=shm:4_slots"));
    EXPECT_TRUE(LogHas("loader=warm"));     // epoch 1 on epoch 0's Loader
    EXPECT_TRUE(LogHas("mapping=reused"));  // and the same mapping of the client's memfd
  }
  const uint64_t bb = 32 * 192, stride = daemon::ShmSlotStride(bb);
  auto hello = [&](uint32_t slots, uint64_t st) {
    daemon::Hello h;
    h.loader = StreamOptions();
    h.shm_slots = slots;
    h.shm_stride = st;
    return daemon::EncodeHello(h);
  };
  auto refused = [&](std::vector<std::byte> h, int fd) {
    Conn c = RawConnect(server->endpoint());
    EXPECT_TRUE(
        (fd >= 0 ? c.SendFrameWithFd(FrameType::kHello, h, fd, 2000) : c.SendFrame(FrameType::kHello, h, 2000)).ok());
    return ReadError(c);
  };
  EXPECT_NE(refused(hello(4, stride), -1).find("carries no memfd"), std::string::npos);
  {
    const int fd = ::memfd_create("unsealed", MFD_CLOEXEC);  // a client that could shrink it under the daemon
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(4 * stride)), 0);
    EXPECT_NE(refused(hello(4, stride), fd).find("not sealed"), std::string::npos);
    ::close(fd);
  }
  {
    const int fd = ::open(data_.c_str(), O_RDONLY | O_CLOEXEC);  // not a memfd at all
    ASSERT_GE(fd, 0);
    EXPECT_NE(refused(hello(4, stride), fd).find("not a memfd"), std::string::npos);
    ::close(fd);
  }
  auto small = daemon::SharedRegion::Create(2 * stride, "small");
  ASSERT_TRUE(small.ok());
  EXPECT_NE(refused(hello(4, stride), small->fd()).find("holds"), std::string::npos);
  EXPECT_NE(refused(hello(2, 4096), small->fd()).find("a batch each"), std::string::npos);
  auto region = daemon::SharedRegion::Create(4 * stride, "test");
  ASSERT_TRUE(region.ok());
  auto streaming = [&] {
    Conn c = RawConnect(server->endpoint());
    EXPECT_TRUE(c.SendFrameWithFd(FrameType::kHello, hello(4, stride), region->fd(), 2000).ok());
    Conn::Frame ok;
    EXPECT_TRUE(c.RecvFrame(&ok, daemon::kMaxControlPayload, 3000).ok());
    EXPECT_EQ(ok.header.type, FrameType::kHelloOk);
    auto m = daemon::DecodeHelloOk(ok.payload);
    EXPECT_TRUE(m.ok() && m->shm);
    return c;
  };
  auto slots = [](std::vector<uint32_t> v) { return daemon::EncodeSlots(v); };
  {
    Conn c = streaming();
    ASSERT_TRUE(c.SendFrame(FrameType::kSlots, slots({4}), 2000).ok());
    EXPECT_NE(ReadError(c).find("slot 4 of 4"), std::string::npos);
  }
  {
    Conn c = streaming();
    ASSERT_TRUE(c.SendFrame(FrameType::kSlots, slots({1, 1}), 2000).ok());
    EXPECT_NE(ReadError(c).find("daemon holds already"), std::string::npos);
  }
  {
    Conn c = streaming();
    ASSERT_TRUE(c.SendFrame(FrameType::kCredit, daemon::EncodeCredit(2), 2000).ok());
    EXPECT_NE(ReadError(c).find("granted SLOTS"), std::string::npos);
  }
  {  // a well-behaved raw client: slot 2 filled with batch 0, then handed back and refilled
    Conn c = streaming();
    ASSERT_TRUE(c.SendFrame(FrameType::kSlots, slots({2}), 2000).ok());
    const Delivered want = Local(StreamOptions(), 0);
    for (uint64_t b = 0; b < 3; ++b) {
      Conn::Frame f;
      ASSERT_TRUE(c.RecvFrame(&f, 1 << 20, 3000).ok());
      ASSERT_EQ(f.header.type, FrameType::kBatchRef);
      auto ref = daemon::DecodeBatchRef(f.payload);
      ASSERT_TRUE(ref.ok()) << ref.status().ToString();
      EXPECT_EQ(ref->slot, 2u);
      EXPECT_EQ(ref->head.index, b);
      EXPECT_EQ(ref->head.count, 32u);
      const std::byte* images = region->bytes().data() + 2 * stride;
      const uint64_t first = want.indices[b * 32];
      EXPECT_EQ(testing::SampleIndexOf(std::span(images, 192)), static_cast<int64_t>(first));
      ASSERT_TRUE(c.SendFrame(FrameType::kSlots, slots({2}), 2000).ok());
    }
  }
  {  // SLOTS on a stream that is not shared
    Conn c = RawConnect(server->endpoint());
    ASSERT_TRUE(c.SendFrame(FrameType::kHello, HelloBytes(StreamOptions()), 2000).ok());
    Conn::Frame ok;
    ASSERT_TRUE(c.RecvFrame(&ok, daemon::kMaxControlPayload, 3000).ok());
    ASSERT_TRUE(c.SendFrame(FrameType::kSlots, slots({0}), 2000).ok());
    EXPECT_NE(ReadError(c).find("unexpected SLOTS"), std::string::npos);
  }
  EXPECT_TRUE(Eventually([&] { return server->stats().connections_open == 0; }));
  EXPECT_EQ(server->stats().streams_active, 0u);
}

// Admission (issue 49, finding 4): connections past a valid HELLO are capped
// at max_connections (the one beyond is refused at its HELLO); silent ones
// are capped apart, the oldest dropped for a newer one, and the rest end at
// the handshake deadline.
TEST_F(DaemonTest, HandshakeTimeoutAndConnectionCap) {
  ServerOptions o = Options();
  // Long enough that no connection of the cap checks below times out while
  // a busy (sanitized) machine runs them; short enough to wait out at the end.
  o.handshake_timeout_ms = 1500;
  o.max_connections = 2;
  o.max_pending_handshakes = 2;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto admitted = [&] {
    Conn c = RawConnect(server->endpoint());
    EXPECT_TRUE(c.SendFrame(FrameType::kHello, HelloBytes(StreamOptions()), 2000).ok());
    return c;
  };
  Conn a = admitted(), b = admitted();
  for (Conn* c : {&a, &b}) {
    Conn::Frame ok;
    ASSERT_TRUE(c->RecvFrame(&ok, daemon::kMaxControlPayload, 3000).ok());
    EXPECT_EQ(ok.header.type, FrameType::kHelloOk);
  }
  Conn c = admitted();
  EXPECT_NE(ReadError(c).find("too many connections"), std::string::npos);
  EXPECT_EQ(server->stats().connections_rejected, 1u);
  // Silent connections: two pending; a third drops the oldest of them.
  Conn d = RawConnect(server->endpoint());
  ASSERT_TRUE(Eventually([&] { return server->stats().handshakes_pending == 1; }));
  Conn e = RawConnect(server->endpoint());
  ASSERT_TRUE(Eventually([&] { return server->stats().handshakes_pending == 2; }));
  Conn f = RawConnect(server->endpoint());
  EXPECT_NE(ReadError(d).find("the oldest, is dropped"), std::string::npos);
  EXPECT_EQ(server->stats().handshakes_dropped, 1u);
  EXPECT_LE(server->stats().handshakes_pending, 2u);
  // The silent others are dropped after the handshake timeout.
  EXPECT_NE(ReadError(e).find("no valid HELLO"), std::string::npos);
  EXPECT_NE(ReadError(f).find("no valid HELLO"), std::string::npos);
  a.Close();
  b.Close();
  EXPECT_TRUE(Eventually([&] { return server->stats().connections_open == 0; }));
  EXPECT_EQ(server->stats().handshakes_pending, 0u);
}

// Issue 49, finding 4: 70 idle TCP connections that never send a HELLO used
// to fill the 64-connection cap, and a client with the right token was
// refused until the handshake timeout (5 s) freed a slot. Now it is admitted
// at once. The timeout here is 20 s and the client must be served within
// half of it (its own limit too): the whole test takes 25 ms in a plain
// build and 1.1-1.4 s in CI's TSan tree, too near the 1.5 s this wait had
// on a loaded 2-core machine; a client kept out until the idle ones time
// out is not served within 10 s.
TEST_F(DaemonTest, IdleConnectionsDoNotKeepOutAnAuthenticatedClient) {
  ServerOptions o = Options();
  o.listen = "tcp://127.0.0.1:0";
  { std::ofstream(dir_ + "/token") << "correct horse\n"; }
  o.token_file = dir_ + "/token";
  o.handshake_timeout_ms = 20000;
  o.max_connections = 64;
  o.max_pending_handshakes = 16;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  std::vector<Conn> idle;
  for (int i = 0; i < 70; ++i) idle.push_back(RawConnect(server->endpoint()));
  ASSERT_TRUE(Eventually([&] { return server->stats().connections_accepted >= 70; }, 3000));
  EXPECT_LE(server->stats().handshakes_pending, 16u);
  const auto t0 = std::chrono::steady_clock::now();
  RemoteLoaderOptions c = Client(server->endpoint(), StreamOptions());
  c.token_file = dir_ + "/token";
  c.io_timeout_ms = o.handshake_timeout_ms / 2;
  auto remote = RemoteLoader::Connect(c);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString() << " (kept out until the idle ones time out?)";
  EpochStream s = (*remote)->Epoch(0);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got, 1).ok());
  ASSERT_EQ(got.batch_index.size(), 1u);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, std::chrono::milliseconds(o.handshake_timeout_ms / 2))
      << "admitted only after the idle ones timed out?";
  EXPECT_GE(server->stats().handshakes_dropped, 54u);
}

// Issue 49, finding 3: a client that sent a frame of another protocol
// version while streaming made the daemon stop reading it; once it closed,
// its session kept its stream and reservation until the idle timeout. Now
// the violation ends the session at once and its Loader is not parked: the
// reservation is back to what it was long before the idle timeout (30 s):
// within 5 s (the whole test takes 50 ms in a plain build and 0.4-1.2 s in
// CI's TSan tree, too near the 1 s each release had on a loaded machine).
TEST_F(DaemonTest, AVersionMismatchMidStreamEndsTheSessionAndFreesItsReservation) {
  ServerOptions o = Options();
  o.idle_timeout_ms = 30000;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const uint64_t baseline = server->stats().reserved_bytes;  // the dataset's shared chunk cache
  const std::array<std::byte, 0> none{};
  const daemon::HeaderBytes foreign =
      daemon::MakeHeader(FrameType::kPing, 0, 0, {std::span<const std::byte>(none)}, daemon::kVersion + 1);
  for (bool read_the_error : {false, true}) {
    SCOPED_TRACE(read_the_error ? "the client reads its error" : "the client closes at once");
    const uint64_t sent = server->stats().batches_sent;
    Conn c = RawConnect(server->endpoint());
    ASSERT_TRUE(c.SendFrame(FrameType::kHello, HelloBytes(StreamOptions()), 2000).ok());
    Conn::Frame ok;
    ASSERT_TRUE(c.RecvFrame(&ok, daemon::kMaxControlPayload, 3000).ok());
    ASSERT_TRUE(c.SendFrame(FrameType::kCredit, daemon::EncodeCredit(2), 2000).ok());
    ASSERT_TRUE(Eventually([&] { return server->stats().batches_sent > sent; }));
    ASSERT_GT(server->stats().reserved_bytes, baseline);
    ASSERT_TRUE(c.SendAll(foreign, 2000).ok());
    if (read_the_error) {
      // Batches sent before, then the ERROR in the client's own version.
      Status st;
      for (int i = 0; i < 10 && st.ok(); ++i) {
        Conn::Frame f;
        st = c.RecvFrame(&f, 16 << 20, 3000);
      }
      EXPECT_NE(st.message().find("version"), std::string::npos) << st.ToString();
    }
    const auto t0 = std::chrono::steady_clock::now();
    c.Close();
    EXPECT_TRUE(Eventually(
        [&] {
          const ServerStats st = server->stats();
          return st.reserved_bytes == baseline && st.connections_open == 0 && st.streams_active == 0;
        },
        5000))
        << server->stats().reserved_bytes << " bytes reserved against " << baseline << " before";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(server->stats().loaders_parked, 0u);  // a violator's Loader is not kept
  }
  EXPECT_GE(server->stats().protocol_errors, 2u);
}

// Parked Loaders (kept for a client's next epoch or reconnect) keep in the
// budget only what an idle Loader holds, and are bounded in count and bytes,
// the oldest going first; /metrics reports them.
TEST_F(DaemonTest, ParkedLoadersAreBoundedAndKeepOnlyWhatTheyHold) {
  auto stream_and_leave = [&](Server& server, uint64_t seed, bool compress, uint64_t* reserved_while) {
    const uint64_t before = server.stats().reserved_bytes;
    Conn c = RawConnect(server.endpoint());
    daemon::Hello h;
    h.loader = StreamOptions();
    h.loader.seed = seed;  // another stream identity: another parked Loader
    h.compress = compress;
    ASSERT_TRUE(c.SendFrame(FrameType::kHello, daemon::EncodeHello(h), 2000).ok());
    Conn::Frame ok;
    ASSERT_TRUE(c.RecvFrame(&ok, daemon::kMaxControlPayload, 3000).ok());
    ASSERT_TRUE(c.SendFrame(FrameType::kCredit, daemon::EncodeCredit(1), 2000).ok());
    Conn::Frame batch;
    ASSERT_TRUE(c.RecvFrame(&batch, 16 << 20, 3000).ok());
    if (reserved_while != nullptr) *reserved_while = server.stats().reserved_bytes - before;
    c.Close();  // mid-epoch: its Loader is parked for a reconnect
    ASSERT_TRUE(Eventually([&] { return server.stats().connections_open == 0; }));
  };
  ServerOptions o = Options();
  o.max_parked = 2;
  o.memory_bytes = 1ull << 30;
  o.max_parked_bytes = 512ull << 20;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const uint64_t baseline = server->stats().reserved_bytes;
  uint64_t streaming = 0;
  stream_and_leave(*server, 1, /*compress=*/true, &streaming);
  ASSERT_EQ(server->stats().loaders_parked, 1u);
  const uint64_t parked = server->stats().parked_bytes;
  EXPECT_GT(parked, 0u);
  EXPECT_LT(parked, streaming) << "the compressed copies are not held by a parked Loader";
  EXPECT_EQ(server->stats().reserved_bytes, baseline + parked);
  for (uint64_t seed = 2; seed <= 4; ++seed) stream_and_leave(*server, seed, false, nullptr);
  EXPECT_EQ(server->stats().loaders_parked, 2u);  // the two oldest went
  EXPECT_EQ(server->stats().reserved_bytes, baseline + server->stats().parked_bytes);
  const std::string m = server->MetricsText();
  EXPECT_NE(m.find("gpufeed_loaders_parked 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("gpufeed_loaders_parked_evicted_total 2\n"), std::string::npos);
  EXPECT_NE(m.find("gpufeed_loaders_parked_max 2\n"), std::string::npos);
  EXPECT_NE(m.find("gpufeed_loaders_parked_bytes " + std::to_string(server->stats().parked_bytes) + "\n"),
            std::string::npos);
  server.reset();

  // In bytes: room for one parked Loader only.
  o.max_parked = 16;
  o.max_parked_bytes = parked + parked / 2;
  o.listen = "unix:" + dir_ + "/d2.sock";
  server = StartServer(o);
  ASSERT_TRUE(server);
  for (uint64_t seed = 1; seed <= 3; ++seed) stream_and_leave(*server, seed, true, nullptr);
  EXPECT_EQ(server->stats().loaders_parked, 1u);
  EXPECT_LE(server->stats().parked_bytes, o.max_parked_bytes);
  EXPECT_NE(server->MetricsText().find("gpufeed_loaders_parked_evicted_total 2\n"), std::string::npos);
}

TEST_F(DaemonTest, StalledAndIdleClientsAreBoundedAndDoNotBlockOthers) {
  // Larger samples so a stalled client fills its socket: 12 KiB, batches of 64.
  const uint64_t n = 1600;
  const std::string big = WriteBig(n);
  ASSERT_FALSE(big.empty());
  ServerOptions o = Options();
  o.data = {big};
  o.memory_bytes = 1ull << 30;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  LoaderOptions lo = StreamOptions();
  lo.batch_size = 64;
  std::vector<Conn> idle, stalled;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(RawConnect(server->endpoint()));
    ASSERT_TRUE(idle.back().SendFrame(FrameType::kHello, HelloBytes(lo), 2000).ok());
  }
  for (int i = 0; i < 4; ++i) {
    stalled.push_back(RawConnect(server->endpoint()));
    ASSERT_TRUE(stalled.back().SendFrame(FrameType::kHello, HelloBytes(lo), 2000).ok());
    ASSERT_TRUE(stalled.back().SendFrame(FrameType::kCredit, daemon::EncodeCredit(1000), 2000).ok());
  }
  ASSERT_TRUE(Eventually([&] { return server->stats().streams_active == 4; }));
  // Let the stalled streams run into their sockets, then check they stopped.
  uint64_t sent = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        const uint64_t now = server->stats().batches_sent;
        const bool settled = now == sent && now > 0;
        sent = now;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return settled;
      },
      20000));
  const ServerStats st = server->stats();
  EXPECT_LT(st.batches_sent, 4 * n / 64);  // not the whole epoch: the sockets are full
  EXPECT_LE(st.queued_frames, 4u * 2);     // at most 2 frames per client wait in the daemon
  EXPECT_EQ(st.streams_active, 4u);        // idle clients hold no Loader
  EXPECT_LE(st.reserved_bytes, o.memory_bytes);
  // A normal client is not held up by them.
  auto c = Client(server->endpoint(), lo);
  c.dataset = big;
  auto remote = RemoteLoader::Connect(c);
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  EpochStream s = (*remote)->Epoch(0);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got).ok());
  EXPECT_EQ(got.indices.size(), n);
}

// A stream reserves what it can hold, not the options' figures: a 134 KB
// file with the default 256 MiB cache reserved over 256 MiB a stream, so a
// 1 GiB budget admitted 3 of 20 clients; now each reserves well under 1 MiB.
TEST_F(DaemonTest, StreamsReserveWhatTheSourceCanHold) {
  ServerOptions o = Options();
  o.cache_bytes = 256ull << 20;
  o.memory_bytes = 1ull << 30;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  const LoaderOptions lo = StreamOptions();
  std::vector<Conn> clients;
  for (int i = 0; i < 20; ++i) {
    clients.push_back(RawConnect(server->endpoint()));
    ASSERT_TRUE(clients.back().SendFrame(FrameType::kHello, HelloBytes(lo), 2000).ok());
    ASSERT_TRUE(clients.back().SendFrame(FrameType::kCredit, daemon::EncodeCredit(2), 2000).ok());
    // One at a time: 20 connections at once are more than the 16 that may
    // wait for their HELLO to be read (max_pending_handshakes), and on a
    // busy machine the oldest would be dropped before the daemon reads it.
    // This test is about what an admitted stream reserves, not that burst.
    ASSERT_TRUE(Eventually([&] { return server->stats().streams_active == static_cast<uint64_t>(i + 1); }))
        << server->stats().streams_active << " of " << i + 1 << " streams admitted, " << server->stats().reserved_bytes
        << " bytes reserved";
  }
  ASSERT_TRUE(Eventually([&] { return server->stats().streams_active == 20; }))
      << server->stats().streams_active << " of 20 streams admitted, " << server->stats().reserved_bytes
      << " bytes reserved";
  const uint64_t file_bytes = kN * 3 * 8 * 8;
  EXPECT_LE(server->stats().reserved_bytes, 20 * (2 * file_bytes + (1u << 20)));
}

// A trainer that pauses (evaluation, a checkpoint) holding every batch of
// its pool sends no SLOTS or CREDIT; its PINGs keep the daemon from closing
// the stream as idle, for both transports. Without them it is closed.
TEST_F(DaemonTest, PausedConsumerIsKeptAliveByPings) {
  ServerOptions so = Options();
  so.idle_timeout_ms = 300;
  auto server = StartServer(so);
  ASSERT_TRUE(server);
  const Delivered want = Local(StreamOptions(), 0);
  for (bool shm : {true, false}) {
    for (int keepalive_ms : {50, 0}) {
      RemoteLoaderOptions c = Client(server->endpoint(), StreamOptions());
      c.shared_memory = shm;
      c.keepalive_ms = keepalive_ms;
      auto remote = RemoteLoader::Connect(c);
      ASSERT_TRUE(remote.ok());
      EpochStream s = (*remote)->Epoch(0);
      std::vector<Batch> held = testing::HoldBatches(s, 4);  // the whole pool (prefetch 3 + 1)
      ASSERT_EQ(held.size(), 4u);
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // > 3 idle timeouts
      held.clear();
      Delivered rest;
      const Status st = Drain(s, &rest);
      if (keepalive_ms > 0) {
        EXPECT_TRUE(st.ok()) << (shm ? "shm: " : "socket: ") << st.ToString();
        EXPECT_EQ(rest.hashes.size() + 4, want.hashes.size());
      } else {
        EXPECT_FALSE(st.ok()) << "without PINGs the daemon closes an idle stream";
      }
    }
  }
  EXPECT_TRUE(LogHas("idle for 300 ms"));
}

TEST_F(DaemonTest, WriteTimeoutClosesADeadReader) {
  const std::string big = WriteBig(800);
  ASSERT_FALSE(big.empty());
  ServerOptions o = Options();
  o.data = {big};
  o.write_timeout_ms = 300;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  LoaderOptions lo = StreamOptions();
  lo.batch_size = 64;
  Conn c = RawConnect(server->endpoint());
  ASSERT_TRUE(c.SendFrame(FrameType::kHello, HelloBytes(lo), 2000).ok());
  ASSERT_TRUE(c.SendFrame(FrameType::kCredit, daemon::EncodeCredit(1000), 2000).ok());
  EXPECT_TRUE(Eventually(
      [&] { return server->stats().connections_accepted == 1 && server->stats().connections_open == 0; }, 10000));
  EXPECT_TRUE(LogHas("write timeout"));
  EXPECT_EQ(server->stats().streams_active, 0u);
}

TEST_F(DaemonTest, MemoryBudgetRefusesAStreamThatDoesNotFit) {
  ServerOptions o = Options();
  o.memory_bytes = 1000;  // less than any stream's bound
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto remote = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions()));
  ASSERT_TRUE(remote.ok());  // describing needs no memory
  EpochStream s = (*remote)->Epoch(0);
  auto r = s.Next();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("memory budget"), std::string::npos) << r.status().message();
}

TEST_F(DaemonTest, GracefulShutdownUnderLoadLosesAndDoublesNothing) {
  ServerOptions o = Options();
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  constexpr int kWorld = 2;
  std::vector<std::unique_ptr<RemoteLoader>> clients;
  for (int r = 0; r < kWorld; ++r) {
    auto c = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions(Order::kBlock, r, kWorld)));
    ASSERT_TRUE(c.ok());
    clients.push_back(std::move(*c));
  }
  std::vector<Delivered> got(kWorld);
  std::vector<Status> ended(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      EpochStream s = clients[r]->Epoch(4);
      for (uint64_t n = 0; n < 1000; ++n) {  // slow consumers: the daemon stops mid-epoch
        auto b = s.Next();
        if (!b.ok()) {
          ended[r] = b.status();
          return;
        }
        if (!b->has_value()) return;
        got[r].hashes.push_back(HashBatch(**b));
        got[r].batch_index.push_back((**b).index());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return server->stats().batches_sent >= 4; }));
  server->Stop();
  EXPECT_TRUE(server->Wait().ok());
  for (auto& t : threads) t.join();
  EXPECT_TRUE(LogHas("event=shutdown"));
  server.reset();
  // A new daemon on the same socket; each client resumes where it stopped.
  server = StartServer(o);
  ASSERT_TRUE(server);
  for (int r = 0; r < kWorld; ++r) {
    const LoaderState st = clients[r]->state();
    EXPECT_EQ(st.next_batch, got[r].hashes.size());
    if (!ended[r].ok()) {
      EXPECT_NE(ended[r].message().find("shutting down"), std::string::npos) << ended[r].ToString();
    }
    EpochStream s = clients[r]->Resume(st);
    Delivered rest;
    ASSERT_TRUE(Drain(s, &rest).ok());
    got[r].hashes.insert(got[r].hashes.end(), rest.hashes.begin(), rest.hashes.end());
    EXPECT_EQ(got[r].hashes, Local(StreamOptions(Order::kBlock, r, kWorld), 4).hashes) << "rank " << r;
  }
}

TEST_F(DaemonTest, MetricsEndpointServesPrometheusText) {
  ServerOptions o = Options();
  o.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto remote = RemoteLoader::Connect(Client(server->endpoint(), StreamOptions()));
  ASSERT_TRUE(remote.ok());
  EpochStream s = (*remote)->Epoch(0);
  Delivered got;
  ASSERT_TRUE(Drain(s, &got, 3).ok());
  Conn m = RawConnect("tcp://" + server->metrics_endpoint());
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(m.SendAll(std::as_bytes(std::span(req.data(), req.size())), 2000).ok());
  std::string resp;
  for (int i = 0; i < 100000; ++i) {
    std::byte b[1];
    if (!m.RecvAll(b, 2000).ok()) break;
    resp += static_cast<char>(b[0]);
  }
  EXPECT_EQ(resp.rfind("HTTP/1.1 200 OK", 0), 0u) << resp.substr(0, 200);
  EXPECT_NE(resp.find("gpufeed_client_batches_sent_total{client="), std::string::npos);
  EXPECT_NE(resp.find("gpufeed_client_cache_hit_rate"), std::string::npos);
  EXPECT_NE(resp.find("gpufeed_connections_open 1"), std::string::npos);
  EXPECT_NE(server->MetricsText().find("# TYPE gpufeed_bytes_sent_total counter"), std::string::npos);
}

// The endpoint's limits: wrong path 404, wrong method 405, HEAD without a
// body, oversized headers 431, garbage 400, a body refused; each answered
// and closed, and the server keeps serving.
TEST_F(DaemonTest, MetricsEndpointRefusesWhatItDoesNotServe) {
  ServerOptions o = Options();
  o.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto ask = [&](const std::string& req) {
    Conn m = RawConnect("tcp://" + server->metrics_endpoint());
    (void)m.SendAll(std::as_bytes(std::span(req.data(), req.size())), 2000);
    std::string resp;
    for (int i = 0; i < 200000; ++i) {
      std::byte b[1];
      if (!m.RecvAll(b, 3000).ok()) break;
      resp += static_cast<char>(b[0]);
    }
    return resp;
  };
  EXPECT_EQ(ask("GET /other HTTP/1.1\r\nHost: x\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  const std::string post = ask("POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos) << post;
  const std::string head = ask("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.find("gpufeed_connections_open"), std::string::npos) << "HEAD carries no body";
  const std::string big = ask("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(16384, 'a') + "\r\n\r\n");
  EXPECT_EQ(big.rfind("HTTP/1.1 431", 0), 0u) << big.substr(0, 100);
  EXPECT_EQ(ask("\x01\x02 nonsense\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  const std::string body = ask("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(body.rfind("HTTP/1.1 400", 0), 0u) << body.substr(0, 100);
  const std::string ok = ask("GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200", 0), 0u) << ok.substr(0, 100);
  EXPECT_NE(ok.find("gpufeed_connections_open"), std::string::npos);
}

// A client that connects to /metrics and sends nothing is closed at the
// deadline (it holds no io thread meanwhile: GET still answers).
TEST_F(DaemonTest, MetricsEndpointClosesASilentClientAtTheDeadline) {
  ServerOptions o = Options();
  o.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  Conn silent = RawConnect("tcp://" + server->metrics_endpoint());
  Conn m = RawConnect("tcp://" + server->metrics_endpoint());
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(m.SendAll(std::as_bytes(std::span(req.data(), req.size())), 2000).ok());
  std::byte b[15];
  ASSERT_TRUE(m.RecvAll(b, 2000).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b), 15), "HTTP/1.1 200 OK");
  const auto t0 = std::chrono::steady_clock::now();
  std::byte one[1];
  EXPECT_FALSE(silent.RecvAll(one, 15000).ok());  // closed by the server, before this wait's own limit
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, std::chrono::seconds(10));
}

// Issue 49, finding 4: /metrics names every client, so a port alone binds
// loopback, and with a token it must be asked for with it
// ("Authorization: Bearer <token>"): 401 without it or with another.
TEST_F(DaemonTest, MetricsBindLoopbackByDefaultAndRequireTheToken) {
  auto ask = [&](Server& server, const std::string& auth) {
    Conn m = RawConnect("tcp://" + server.metrics_endpoint());
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n";
    (void)m.SendAll(std::as_bytes(std::span(req.data(), req.size())), 2000);
    std::string resp;
    for (int i = 0; i < 200000; ++i) {
      std::byte b[1];
      if (!m.RecvAll(b, 3000).ok()) break;
      resp += static_cast<char>(b[0]);
    }
    return resp;
  };
  ServerOptions o = Options();
  for (const char* port_only : {"0", ":0"}) {
    o.metrics_listen = port_only;
    auto server = StartServer(o);
    ASSERT_TRUE(server);
    EXPECT_EQ(server->metrics_endpoint().rfind("127.0.0.1:", 0), 0u) << server->metrics_endpoint();
    EXPECT_EQ(ask(*server, "").rfind("HTTP/1.1 200", 0), 0u);  // no token: none asked
  }
  { std::ofstream(dir_ + "/token") << "correct horse\n"; }
  o.token_file = dir_ + "/token";
  o.listen = "tcp://127.0.0.1:0";
  o.metrics_listen = "0";
  {
    auto server = StartServer(o);
    ASSERT_TRUE(server);
    const std::string none = ask(*server, "");
    EXPECT_EQ(none.rfind("HTTP/1.1 401", 0), 0u) << none.substr(0, 200);
    EXPECT_NE(none.find("WWW-Authenticate: Bearer"), std::string::npos);
    EXPECT_EQ(none.find("gpufeed_connections_open"), std::string::npos);
    EXPECT_EQ(ask(*server, "Authorization: Bearer wrong horse\r\n").rfind("HTTP/1.1 401", 0), 0u);
    EXPECT_EQ(ask(*server, "Authorization: Basic correct horse\r\n").rfind("HTTP/1.1 401", 0), 0u);
    EXPECT_EQ(ask(*server, "Authorization: Bearer correct horse \r\n").rfind("HTTP/1.1 200", 0), 0u)
        << "HTTP drops the value's trailing space";
    const std::string ok = ask(*server, "Authorization: Bearer correct horse\r\n");
    EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok.substr(0, 200);
    EXPECT_NE(ok.find("gpufeed_connections_open"), std::string::npos);
  }
  o.metrics_require_token = false;  // --metrics-without-token
  auto open = StartServer(o);
  ASSERT_TRUE(open);
  EXPECT_EQ(ask(*open, "").rfind("HTTP/1.1 200", 0), 0u);
}

// The log in JSON: one object a line with ts, level, event and every field
// (quoted values unescaped); --log-level warn drops the info lines.
TEST(EventLogTest, JsonLinesAndLevels) {
  std::vector<std::string> lines;
  auto log = daemon::EventLog::Create("json", "info", [&](std::string_view l) { lines.emplace_back(l); });
  ASSERT_TRUE(log.ok());
  (*log)->Log("info", "stream", daemon::Kv("name", "a \"b\" c") + " " + daemon::Kv("epoch", 3) + " loader=warm");
  (*log)->Log("debug", "hidden", "");
  ASSERT_EQ(lines.size(), 1u);
  const std::string& l = lines[0];
  EXPECT_EQ(l.rfind("{\"ts\":\"", 0), 0u) << l;
  EXPECT_EQ(l.back(), '}') << l;
  EXPECT_NE(
      l.find("\"level\":\"info\",\"event\":\"stream\",\"name\":\"a \\\"b\\\" c\",\"epoch\":\"3\",\"loader\":\"warm\""),
      std::string::npos)
      << l;
  lines.clear();
  auto warn = daemon::EventLog::Create("kv", "warn", [&](std::string_view l) { lines.emplace_back(l); });
  ASSERT_TRUE(warn.ok());
  (*warn)->Log("info", "accept", "");
  (*warn)->Log("error", "handler_exception", daemon::Kv("what", "x"));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(" level=error event=handler_exception what=x"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[0].rfind("ts=", 0), 0u);
  auto bad = daemon::EventLog::Create("xml", "info", nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--log-format 'xml'"), std::string::npos);
  auto bad_level = daemon::EventLog::Create("kv", "verbose", nullptr);
  ASSERT_FALSE(bad_level.ok());
  EXPECT_NE(bad_level.status().message().find("--log-level 'verbose'"), std::string::npos);
}

TEST(EventLogTest, SplitKvUndoesKv) {
  const std::string f = daemon::Kv("a", "plain") + " " + daemon::Kv("b", "with space") + " " +
                        daemon::Kv("c", "q\"uo\\te") + " " + daemon::Kv("d", "") + " bare";
  const auto kv = daemon::SplitKv(f);
  ASSERT_EQ(kv.size(), 5u) << f;
  EXPECT_EQ(kv[0], (std::pair<std::string, std::string>("a", "plain")));
  EXPECT_EQ(kv[1], (std::pair<std::string, std::string>("b", "with space")));
  EXPECT_EQ(kv[2], (std::pair<std::string, std::string>("c", "q\"uo\\te")));
  EXPECT_EQ(kv[3], (std::pair<std::string, std::string>("d", "")));
  EXPECT_EQ(kv[4], (std::pair<std::string, std::string>("bare", "")));
}

// A consumer that holds every slot of its pool and asks for another gets an
// error naming prefetch, on both transports, instead of a wait that the
// receiver's PINGs would keep alive forever; releasing continues the stream.
TEST_F(DaemonTest, ConsumerHoldingEverySlotGetsAnErrorNotAHang) {
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  const Delivered want = Local(StreamOptions(), 0);
  for (bool shm : {true, false}) {
    RemoteLoaderOptions c = Client(server->endpoint(), StreamOptions());
    c.shared_memory = shm;
    c.keepalive_ms = 50;
    auto remote = RemoteLoader::Connect(c);
    ASSERT_TRUE(remote.ok());
    EXPECT_EQ((*remote)->info().pool_slots, 4u);
    EpochStream s = (*remote)->Epoch(0);
    std::vector<Batch> held = testing::HoldBatches(s, 4);  // the whole pool (prefetch 3 + 1)
    ASSERT_EQ(held.size(), 4u);
    const auto t0 = std::chrono::steady_clock::now();
    auto more = s.Next();
    ASSERT_FALSE(more.ok()) << (shm ? "shm" : "socket");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(more.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(more.status().message().find("holds all 4 batch buffers"), std::string::npos) << more.status().ToString();
    EXPECT_NE(more.status().message().find("prefetch"), std::string::npos);
    held.clear();
    Delivered rest;
    ASSERT_TRUE(Drain(s, &rest).ok());
    EXPECT_EQ(rest.hashes.size() + 4, want.hashes.size());
  }
}

// The /metrics handler reads each session's client name while the session's
// strand sets it at the handshake: scraped from accept on (under TSan in CI).
TEST_F(DaemonTest, MetricsScrapedDuringHandshakesDoNotRace) {
  ServerOptions o = Options();
  o.metrics_listen = "127.0.0.1:0";
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  std::atomic<bool> stop{false};
  std::atomic<int> scrapes{0};
  std::thread scraper([&] {
    while (!stop.load()) {
      EXPECT_NE(server->MetricsText().find("gpufeed_connections_open"), std::string::npos);
      ++scrapes;
    }
  });
  for (int i = 0; i < 8; ++i) {
    RemoteLoaderOptions c = Client(server->endpoint(), StreamOptions());
    c.client_name = "trainer-" + std::to_string(i);
    auto remote = RemoteLoader::Connect(c);
    ASSERT_TRUE(remote.ok());
    EpochStream s = (*remote)->Epoch(0);
    Delivered got;
    ASSERT_TRUE(Drain(s, &got, 1).ok());
  }
  stop = true;
  scraper.join();
  EXPECT_GT(scrapes.load(), 0);
}

TEST_F(DaemonTest, BadStartOptionsAreNamed) {
  ServerOptions o = Options();
  o.data = {dir_ + "/missing.h5"};
  auto s = Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("missing.h5"), std::string::npos);
  o = Options();
  o.listen = "udp://x";
  EXPECT_NE(Server::Start(o).status().message().find("unix:PATH"), std::string::npos);
  { std::ofstream(dir_ + "/notasocket") << "x"; }
  o = Options();
  o.listen = "unix:" + dir_ + "/notasocket";
  EXPECT_NE(Server::Start(o).status().message().find("not a socket"), std::string::npos);
  // A unix socket is created with mode 0600.
  auto server = StartServer(Options());
  ASSERT_TRUE(server);
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/d.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A second daemon on the same path is refused.
  auto second = Server::Start(Options());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another daemon"), std::string::npos);
}

}  // namespace
}  // namespace gpufeed
