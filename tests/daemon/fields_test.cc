// The daemon serves what the local Loader loads: named fields of several
// dtypes and shapes (a FieldSource), and encoded JPEG datasets decoded with
// each client's decode options. Over TCP, TCP + zstd and shared memory,
// every batch equals the local Loader's (same order, same bytes in every
// field, each field's row i the same sample); protocol versions that differ
// get a clear error naming both.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <thread>

#include "gpufeed/gpu_feed.h"
#include "loader/remote/address.h"
#include "loader/remote/conn.h"
#include "daemon/datasets.h"
#include "loader/remote/protocol.h"
#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "gpufeed/fields.h"
#include "gpufeed/open_source.h"
#include "gpufeed/remote_loader.h"
#include "gpufeed/server.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;
using daemon::FrameType;

// A batch as bytes: indices, labels, then every field's rows.
struct Copy {
  std::vector<uint64_t> indices;
  std::vector<int64_t> labels;
  std::vector<std::vector<std::byte>> fields;
  bool operator==(const Copy&) const = default;
};

Result<std::vector<Copy>> Epoch(BatchSource& src, uint64_t epoch) {
  std::vector<Copy> out;
  EpochStream s = src.Epoch(epoch);
  for (;;) {
    auto r = s.Next();
    if (!r.ok()) return r.status();
    if (!r->has_value()) return out;
    const Batch& b = **r;
    Copy c;
    c.indices.assign(b.indices().begin(), b.indices().end());
    c.labels.assign(b.labels().begin(), b.labels().end());
    for (size_t f = 0; f < b.fields().size(); ++f) c.fields.emplace_back(b.field(f).begin(), b.field(f).end());
    out.push_back(std::move(c));
  }
}

void ExpectSameFields(const std::vector<FieldInfo>& got, const std::vector<FieldInfo>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].path, want[i].path);
    EXPECT_EQ(got[i].dtype, want[i].dtype);
    EXPECT_EQ(got[i].is_bool, want[i].is_bool);
    EXPECT_EQ(got[i].sample_shape, want[i].sample_shape);
    EXPECT_EQ(got[i].sample_bytes, want[i].sample_bytes);
    EXPECT_EQ(got[i].offset, want[i].offset);
  }
}

struct FieldDef {
  std::string name, path;
  hid_t type;
  std::vector<hsize_t> sample_shape;
  uint64_t sample_bytes;
  hsize_t chunk;  // samples per HDF5 chunk; 0: contiguous
};

// Samples [first, first + n) of every field: index-valued bytes
// (testing::FillIndexSamples) of the field's size, so each row names its
// sample. no_axis: one sample (n == 1) stored without the sample axis, as
// DeepCAM's reference files are (a chunked field is then one chunk; a
// scalar is contiguous).
void WriteFields(const std::string& path, const std::vector<FieldDef>& defs, uint64_t n, uint64_t first = 0,
                 bool no_axis = false) {
  if (no_axis) {
    ASSERT_EQ(n, 1u);
  }
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  for (const FieldDef& d : defs) {
    std::vector<hsize_t> dims;
    if (!no_axis) dims.push_back(n);
    dims.insert(dims.end(), d.sample_shape.begin(), d.sample_shape.end());
    std::vector<std::byte> bytes(n * d.sample_bytes);
    testing::FillIndexSamples(first, n, d.sample_bytes, bytes);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (d.chunk > 0 && !dims.empty()) {
      std::vector<hsize_t> c = dims;
      if (!no_axis) c[0] = d.chunk;
      H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
    }
    hid_t space =
        dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t ds = H5Dcreate2(file, d.path.c_str(), d.type, space, lcpl, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << d.path;
    ASSERT_GE(H5Dwrite(ds, d.type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
  }
  H5Fclose(file);
}

// These tests start a daemon beside another daemon or loader in one
// process, and every open's probe forks there: a fork copies any lock a
// running thread holds (clang 14's ASan allocator lock hung the probe child,
// and a good file read as hanging). The files are the tests' own, so the
// probe (tested in hostile_files_test, where nothing else runs) is skipped.
struct TrustOwnFiles {
  TrustOwnFiles() { ::setenv("GPUFEED_TRUST_FILES", "1", 1); }
  ~TrustOwnFiles() { ::unsetenv("GPUFEED_TRUST_FILES"); }
};

class DaemonFieldsTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kN = 103;  // not a multiple of the batch: a short last batch
  TrustOwnFiles trust_;
  void SetUp() override {
    dir_ = testing::MakeTempDir("daemon_fields");
    data_ = dir_ + "/fields.h5";
    defs_ = {
        {"data", "/climate/data", H5T_NATIVE_FLOAT, {2, 3, 4}, 96, 7},
        {"mask", "/climate/mask", H5T_NATIVE_INT16, {3, 4}, 24, 5},
        {"target", "/y", H5T_NATIVE_DOUBLE, {2}, 16, 0},
        {"id", "/id", H5T_NATIVE_INT64, {}, 8, 16},
    };
    WriteFields(data_, defs_, kN);
    for (const FieldDef& d : defs_) specs_.push_back(d.name + "=" + d.path);
    std::ofstream(dir_ + "/token") << "tok\n";
  }

  ServerOptions Options(const std::string& listen) {
    ServerOptions o;
    o.data = {data_};
    o.fields = {specs_};
    o.listen = listen;
    o.token_file = dir_ + "/token";
    o.io_threads = 2;
    o.loader_threads = 2;
    o.prefetch = 3;
    o.cache_bytes = 64 << 10;
    o.memory_bytes = 256 << 20;
    o.log = [](std::string_view) {};
    return o;
  }
  LoaderOptions Stream(Order order, int rank = 0, int world = 1) {
    LoaderOptions lo;
    lo.batch_size = 10;
    lo.order = order;
    lo.seed = 5;
    lo.shuffle_window = 2;
    lo.rank = rank;
    lo.world_size = world;
    lo.prefetch = 3;
    lo.threads = 2;
    lo.pin_memory = false;
    lo.cache_bytes = 64 << 10;
    return lo;
  }

  std::string dir_, data_;
  std::vector<FieldDef> defs_;
  std::vector<std::string> specs_;
};

TEST_F(DaemonFieldsTest, EveryFieldOfEveryBatchEqualsTheLocalLoaders) {
  OpenOptions oo;
  oo.fields = specs_;
  auto local_src = FieldSource::Open(data_, oo);
  ASSERT_TRUE(local_src.ok()) << local_src.status().ToString();
  auto tcp = Server::Start(Options("tcp://127.0.0.1:0"));
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  auto unix_server = Server::Start(Options("unix:" + dir_ + "/d.sock"));
  ASSERT_TRUE(unix_server.ok()) << unix_server.status().ToString();

  struct Transport {
    std::string name, address;
    bool compress, shm;
  };
  const std::vector<Transport> transports = {
      {"tcp", (*tcp)->endpoint(), false, false},
      {"tcp+zstd", (*tcp)->endpoint(), true, false},
      {"shm", (*unix_server)->endpoint(), false, true},
      {"unix socket", (*unix_server)->endpoint(), false, false},
  };
  for (Order order : {Order::kRandom, Order::kBlock}) {
    for (int rank : {0, 1}) {
      const LoaderOptions lo = Stream(order, rank, 2);
      Loader local(**local_src, lo);
      auto want = Epoch(local, 1);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      ASSERT_FALSE(want->empty());
      // The test can fail: each row of each field is its sample's bytes.
      for (const Copy& c : *want) {
        for (size_t f = 0; f < defs_.size(); ++f) {
          ASSERT_EQ(c.fields[f].size(), c.indices.size() * defs_[f].sample_bytes);
          for (size_t i = 0; i < c.indices.size(); ++i) {
            auto row = std::span(c.fields[f]).subspan(i * defs_[f].sample_bytes, defs_[f].sample_bytes);
            ASSERT_EQ(testing::SampleIndexOf(row), static_cast<int64_t>(c.indices[i])) << defs_[f].name;
          }
        }
      }
      for (const Transport& t : transports) {
        RemoteLoaderOptions ro;
        ro.address = t.address;
        ro.token = "tok";
        ro.loader = lo;
        ro.compress = t.compress;
        ro.shared_memory = t.shm;
        ro.io_timeout_ms = 10000;
        auto remote = RemoteLoader::Connect(ro);
        ASSERT_TRUE(remote.ok()) << t.name << ": " << remote.status().ToString();
        ExpectSameFields((*remote)->info().fields, local.info().fields);
        EXPECT_EQ((*remote)->info().sample_bytes, local.info().sample_bytes);
        EXPECT_EQ((*remote)->info().has_labels, local.info().has_labels);
        auto got = Epoch(**remote, 1);
        ASSERT_TRUE(got.ok()) << t.name << ": " << got.status().ToString();
        EXPECT_TRUE(*got == *want) << t.name << " order " << OrderName(order) << " rank " << rank;
      }
    }
  }
  // Shared memory was used where offered, and the same Loader was reused warm.
  EXPECT_GT((*unix_server)->stats().batches_sent, 0u);
}

TEST_F(DaemonFieldsTest, OpenBatchSourceChecksTheFieldsAskedFor) {
  auto server = Server::Start(Options("unix:" + dir_ + "/d.sock"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  SourceOptions so;
  so.data = (*server)->endpoint();
  so.loader = Stream(Order::kSequential);
  so.remote.token = "tok";
  so.open.fields = specs_;
  auto same = OpenBatchSource(so);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ((*same)->source().info().fields.size(), defs_.size());
  so.open.fields = {"mask=/climate/mask", "data=/climate/data"};  // another order
  auto other = OpenBatchSource(so);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("serves fields [data=/climate/data"), std::string::npos)
      << other.status().message();
}

TEST_F(DaemonFieldsTest, FieldsBeforeAnyDataAreRefusedAtStart) {
  ServerOptions o = Options("unix:" + dir_ + "/d.sock");
  o.fields = {specs_, {"x=/x"}};
  auto s = Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--field"), std::string::npos);
  o.fields = {{"nope=/missing"}};
  auto missing = Server::Start(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/missing"), std::string::npos) << missing.status().message();
}

// DeepCAM's reference files hold one sample each, without a sample axis
// (/climate/data is [768, 1152, 16]). Served with no_sample_axis (CLI:
// --no-sample-axis after their --data), each file is one sample: every
// sample arrives once and every batch equals the local Loader's opened with
// OpenOptions::no_sample_axis. Without it the daemon does not start, and the
// error (the /id field is a scalar) names the option.
TEST_F(DaemonFieldsTest, FilesWithoutASampleAxisAreOneSampleEach) {
  constexpr uint64_t kFiles = 23;  // not a multiple of the batch
  const std::string ref = dir_ + "/ref";
  fs::create_directories(ref);
  for (uint64_t k = 0; k < kFiles; ++k) {
    char name[32];
    std::snprintf(name, sizeof name, "/r_%03d.h5", static_cast<int>(k));
    WriteFields(ref + name, defs_, 1, k, /*no_axis=*/true);
  }
  const std::string spec = ref + "/r_*.h5";
  // The local reference opens first: its probe forks, and a fork beside the
  // daemon's threads can copy a lock one of them holds (ASan's allocator
  // did: the probe child hung and a good file read as hanging).
  OpenOptions oo;
  oo.fields = specs_;
  oo.no_sample_axis = true;
  auto local_src = FieldSource::Open(spec, oo);
  ASSERT_TRUE(local_src.ok()) << local_src.status().ToString();
  ASSERT_EQ((*local_src)->num_samples(), kFiles);
  ServerOptions o = Options("unix:" + dir_ + "/d.sock");
  o.data = {data_, spec};
  o.fields = {specs_, specs_};
  auto refused = Server::Start(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--no-sample-axis"), std::string::npos) << refused.status().ToString();
  o.no_sample_axis = {false, true};  // per dataset: data_ has its sample axis
  auto server = Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  for (bool shm : {true, false}) {
    for (Order order : {Order::kRandom, Order::kBlock}) {
      const LoaderOptions lo = Stream(order);
      Loader local(**local_src, lo);
      auto want = Epoch(local, 1);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      RemoteLoaderOptions ro;
      ro.address = (*server)->endpoint();
      ro.dataset = spec;
      ro.token = "tok";
      ro.loader = lo;
      ro.shared_memory = shm;
      ro.io_timeout_ms = 10000;
      auto remote = RemoteLoader::Connect(ro);
      ASSERT_TRUE(remote.ok()) << remote.status().ToString();
      ExpectSameFields((*remote)->info().fields, local.info().fields);
      EXPECT_EQ((*remote)->info().num_samples, kFiles);
      EXPECT_EQ((*remote)->info().fields[0].sample_shape, (std::vector<uint64_t>{2, 3, 4}));
      EXPECT_TRUE((*remote)->info().fields[3].sample_shape.empty());  // /id: a scalar sample
      auto got = Epoch(**remote, 1);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(*got == *want) << (shm ? "shm" : "socket") << " order " << OrderName(order);
      // Each file is one sample, delivered once, every field's row its bytes.
      std::vector<int> seen(kFiles, 0);
      for (const Copy& c : *got) {
        for (size_t i = 0; i < c.indices.size(); ++i) {
          ASSERT_LT(c.indices[i], kFiles);
          ++seen[c.indices[i]];
          for (size_t f = 0; f < defs_.size(); ++f) {
            auto row = std::span(c.fields[f]).subspan(i * defs_[f].sample_bytes, defs_[f].sample_bytes);
            ASSERT_EQ(testing::SampleIndexOf(row), static_cast<int64_t>(c.indices[i])) << defs_[f].name;
          }
        }
      }
      EXPECT_EQ(seen, std::vector<int>(kFiles, 1));
    }
  }
  // The daemon's other dataset keeps its sample axis.
  RemoteLoaderOptions ro;
  ro.address = (*server)->endpoint();
  ro.dataset = data_;
  ro.token = "tok";
  ro.loader = Stream(Order::kSequential);
  auto plain = RemoteLoader::Connect(ro);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ((*plain)->info().num_samples, kN);
  // More flags than datasets: refused, naming the option.
  o.no_sample_axis = {false, true, true};
  auto extra = Server::Start(o);
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("--no-sample-axis"), std::string::npos) << extra.status().ToString();
}

// ---------------------------------------------------------------------------
// Versions

// A HELLO of version 2 (an older client): an ERROR frame in version 2,
// naming both versions and what to upgrade.
TEST_F(DaemonFieldsTest, OldClientGetsAnErrorInItsOwnVersion) {
  auto server = Server::Start(Options("unix:" + dir_ + "/d.sock"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto addr = daemon::ParseAddress((*server)->endpoint());
  ASSERT_TRUE(addr.ok());
  auto c = daemon::Conn::Connect(*addr, 2000);
  ASSERT_TRUE(c.ok());
  daemon::Hello h;
  h.token = "tok";
  h.loader = Stream(Order::kSequential);
  const auto payload = daemon::EncodeHello(h);
  const auto hb = daemon::MakeHeader(FrameType::kHello, 0, static_cast<uint32_t>(payload.size()), {payload}, 2);
  std::vector<std::byte> frame(hb.begin(), hb.end());
  frame.insert(frame.end(), payload.begin(), payload.end());
  ASSERT_TRUE(c->SendAll(frame, 2000).ok());  // in one write, as a client of any version sends it
  daemon::HeaderBytes reply;
  ASSERT_TRUE(c->RecvAll(reply, 5000).ok());
  EXPECT_EQ(daemon::HeaderVersion(reply), 2);
  // What an old client does: its own version's header, then ERROR's payload.
  daemon::HeaderBytes as_v3 = reply;
  std::memcpy(as_v3.data() + 4, &daemon::kVersion, 2);
  auto rh = daemon::ParseHeader(as_v3, daemon::kMaxControlPayload, daemon::kMaxControlPayload, "daemon");
  ASSERT_TRUE(rh.ok()) << rh.status().ToString();
  EXPECT_EQ(rh->type, FrameType::kError);
  std::vector<std::byte> body(rh->payload_bytes);
  ASSERT_TRUE(c->RecvAll(body, 5000).ok());
  EXPECT_TRUE(daemon::VerifyChecksum(*rh, reply, body, "daemon").ok());  // computed over the version-2 header
  auto e = daemon::DecodeError(body);
  ASSERT_TRUE(e.ok());
  EXPECT_NE(e->message.find("version 2"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("version " + std::to_string(daemon::kVersion)), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("upgrade gpufeed on the older side (client"), std::string::npos) << e->message;
}

// A daemon of version 2 answers a new client's HELLO with its ERROR in
// version 2 (what such a daemon sends): Connect fails naming both versions.
TEST_F(DaemonFieldsTest, NewClientAgainstOldDaemonGetsAClearError) {
  const std::string path = dir_ + "/old.sock";
  int lfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  std::thread old_daemon([lfd] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    char hdr[32];
    (void)::recv(fd, hdr, sizeof hdr, MSG_WAITALL);
    const auto body = daemon::EncodeError(
        {StatusCode::kUnsupported, "client unix: protocol version 3, this build speaks 2 (upgrade the older side)"});
    const auto h = daemon::MakeHeader(FrameType::kError, 0, static_cast<uint32_t>(body.size()), {body}, 2);
    (void)::send(fd, h.data(), h.size(), MSG_NOSIGNAL);
    (void)::send(fd, body.data(), body.size(), MSG_NOSIGNAL);
    ::usleep(200 * 1000);
    ::close(fd);
  });
  RemoteLoaderOptions ro;
  ro.address = "unix:" + path;
  ro.loader = Stream(Order::kSequential);
  ro.io_timeout_ms = 5000;
  auto r = RemoteLoader::Connect(ro);
  old_daemon.join();
  ::close(lfd);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("speaks gpufeed daemon protocol version 2"), std::string::npos) << m;
  EXPECT_NE(m.find("version 3"), std::string::npos) << m;
  EXPECT_NE(m.find("upgrade gpufeed on the older side"), std::string::npos) << m;
  EXPECT_NE(m.find("it says: client unix: protocol version 3"), std::string::npos) << m;
}

// ---------------------------------------------------------------------------
// Encoded images

// A JPEG of h x w whose pixels depend on k (textured, so crops differ).
std::vector<unsigned char> TexturedJpeg(uint64_t k, int h, int w, bool progressive) {
  std::vector<uint8_t> px(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>((x * 7 + y * 3 * (c + 1) + k * 11) % 256);
      }
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc =
      tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, progressive ? TJFLAG_PROGRESSIVE : 0);
  EXPECT_EQ(rc, 0);
  std::vector<unsigned char> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

class DaemonEncodedTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kN = 23;
  TrustOwnFiles trust_;
  void SetUp() override {
    const fs::path root = testing::MakeTempDir("daemon_jpeg");
    dir_ = root.string();
    const fs::path images = root / "images";
    // Textured JPEGs of varied sizes in two classes, so crops differ and a
    // wrong crop or transform shows in the bytes.
    // Every fifth progressive: a device decoder does not take those, so
    // whoever serves the batch decodes them on its CPU.
    for (uint64_t k = 0; k < kN; ++k) {
      const int h = 40 + static_cast<int>(k * 7 % 50), w = 60 + static_cast<int>(k * 13 % 70);
      const std::vector<unsigned char> jpeg = TexturedJpeg(k, h, w, k % 5 == 4);
      const fs::path cls = images / (k % 3 == 0 ? "b" : "a");
      fs::create_directories(cls);
      char name[32];
      std::snprintf(name, sizeof name, "%02llu.jpg", static_cast<unsigned long long>(k));
      std::ofstream(cls / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(jpeg.data()), std::streamsize(jpeg.size()));
    }
    data_ = (root / "jpeg.h5").string();
    auto c = ConvertEncodedImageFolder(images.string(), data_, {});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::ofstream(dir_ + "/token") << "tok\n";
  }
  ServerOptions Options(const std::string& listen) {
    ServerOptions o;
    o.data = {data_};
    o.listen = listen;
    o.token_file = dir_ + "/token";
    o.io_threads = 2;
    o.loader_threads = 2;
    o.prefetch = 3;
    o.cache_bytes = 64 << 10;
    o.memory_bytes = 256 << 20;
    o.log = [](std::string_view) {};
    return o;
  }
  LoaderOptions Stream() {
    LoaderOptions lo;
    lo.batch_size = 5;
    lo.order = Order::kRandom;
    lo.seed = 11;
    lo.prefetch = 3;
    lo.threads = 2;
    lo.pin_memory = false;
    lo.cache_bytes = 64 << 10;
    return lo;
  }
  std::string dir_, data_;
};

TEST_F(DaemonEncodedTest, DecodedBatchesEqualTheLocalLoadersForEachClientsOptions) {
  auto tcp = Server::Start(Options("tcp://127.0.0.1:0"));
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  auto unix_server = Server::Start(Options("unix:" + dir_ + "/d.sock"));
  ASSERT_TRUE(unix_server.ok()) << unix_server.status().ToString();
  std::vector<DecodeOptions> variants(3);
  variants[0].height = 16;  // deterministic: resize + center crop
  variants[0].width = 24;
  variants[0].transform = ImageTransform::kCenterCrop;
  variants[1].height = 16;  // the same size, another transform: a parked Loader of [0] must not serve it
  variants[1].width = 24;
  variants[2].height = variants[2].width = 20;  // random-resized-crop, channels last
  variants[2].layout = "NHWC";
  variants[2].scale_min = 0.3;
  struct Transport {
    std::string name, address;
    bool compress, shm;
  };
  const std::vector<Transport> transports = {
      {"shm", (*unix_server)->endpoint(), false, true},
      {"tcp", (*tcp)->endpoint(), false, false},
      {"tcp+zstd", (*tcp)->endpoint(), true, false},
  };
  std::vector<std::vector<Copy>> wants;
  for (const DecodeOptions& d : variants) {
    auto local_src = OpenEncodedImages(data_, {}, d);
    ASSERT_TRUE(local_src.ok()) << local_src.status().ToString();
    Loader local(**local_src, Stream());
    auto want = Epoch(local, 2);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_EQ(want->size(), (kN + 4) / 5);
    EXPECT_FALSE(want->front().labels.empty());
    // Same seed, same bytes: the local decode is deterministic.
    Loader again(**local_src, Stream());
    auto twice = Epoch(again, 2);
    ASSERT_TRUE(twice.ok());
    ASSERT_TRUE(*twice == *want);
    for (const Transport& t : transports) {
      RemoteLoaderOptions ro;
      ro.address = t.address;
      ro.token = "tok";
      ro.loader = Stream();
      ro.decode = d;
      ro.compress = t.compress;
      ro.shared_memory = t.shm;
      ro.io_timeout_ms = 10000;
      auto remote = RemoteLoader::Connect(ro);
      ASSERT_TRUE(remote.ok()) << t.name << ": " << remote.status().ToString();
      EXPECT_EQ((*remote)->info().sample_shape, local.info().sample_shape) << t.name;
      EXPECT_EQ((*remote)->info().sample_bytes, 3u * d.height * d.width);
      ExpectSameFields((*remote)->info().fields, local.info().fields);
      auto got = Epoch(**remote, 2);
      ASSERT_TRUE(got.ok()) << t.name << ": " << got.status().ToString();
      EXPECT_TRUE(*got == *want) << t.name << " decode " << d.height << "x" << d.width << " "
                                 << ImageTransformName(d.transform);
    }
    wants.push_back(std::move(*want));
  }
  // The test can fail: the variants' bytes differ.
  EXPECT_FALSE(wants[0] == wants[1]);
}

TEST_F(DaemonEncodedTest, BadAndTooManyDecodeOptionsAreRefused) {
  auto server = Server::Start(Options("unix:" + dir_ + "/d.sock"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  {  // out of range: the daemon's HELLO decoder names it
    auto addr = daemon::ParseAddress((*server)->endpoint());
    ASSERT_TRUE(addr.ok());
    auto c = daemon::Conn::Connect(*addr, 2000);
    ASSERT_TRUE(c.ok());
    daemon::Hello h;
    h.token = "tok";
    h.loader = Stream();
    h.decode.height = 0;
    ASSERT_TRUE(c->SendFrame(FrameType::kHello, daemon::EncodeHello(h), 2000).ok());
    daemon::Conn::Frame f;
    ASSERT_TRUE(c->RecvFrame(&f, daemon::kMaxControlPayload, 5000).ok());
    ASSERT_EQ(f.header.type, FrameType::kError);
    auto e = daemon::DecodeError(f.payload);
    ASSERT_TRUE(e.ok());
    EXPECT_NE(e->message.find("decode output size 0x224"), std::string::npos) << e->message;
  }
  {  // a size whose samples the protocol cannot describe: refused, no slot taken
    RemoteLoaderOptions big;
    big.address = (*server)->endpoint();
    big.token = "tok";
    big.loader = Stream();
    big.decode.height = big.decode.width = 32768;  // valid, 3 GiB a sample
    auto r = RemoteLoader::Connect(big);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("exceed the protocol's 2 GiB a sample"), std::string::npos)
        << r.status().message();
  }
  // Distinct options, one source each, up to the limit (the defaults are the first).
  RemoteLoaderOptions ro;
  ro.address = (*server)->endpoint();
  ro.token = "tok";
  ro.loader = Stream();
  for (uint32_t i = 0; i < daemon::DatasetRegistry::kMaxDecodeVariants - 1; ++i) {
    ro.decode.height = ro.decode.width = 8 + i;
    auto r = RemoteLoader::Connect(ro);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
  }
  ro.decode.height = ro.decode.width = 8;  // known already: fine
  EXPECT_TRUE(RemoteLoader::Connect(ro).ok());
  ro.decode.height = ro.decode.width = 99;
  auto over = RemoteLoader::Connect(ro);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(over.status().message().find("distinct decode options"), std::string::npos) << over.status().message();
}

// One epoch through the feed on the CPU (whose decoder for the samples a
// loader leaves encoded is the CPU twin of nvJPEG's): the images as floats
// (mean 0, std 1: the pixel values), labels and dataset indices, in order.
struct Fed {
  std::vector<float> images;
  std::vector<int64_t> labels;
  std::vector<uint64_t> indices;
  FeedStats stats;
  Status error;
};
Fed FeedEpoch(BatchSource& src, uint64_t epoch) {
  FeedOptions fo;
  fo.force_cpu = true;
  fo.mean = {0, 0, 0};
  fo.stddev = {1, 1, 1};
  GpuFeeder feeder(src, fo, epoch);
  const uint64_t sb = src.info().sample_bytes;
  Fed out;
  for (;;) {
    auto b = feeder.Next();
    if (!b.ok()) {
      out.error = b.status();
      break;
    }
    if (!*b) break;
    const DeviceBatch& db = **b;
    const size_t at = out.images.size(), lat = out.labels.size();
    out.images.resize(at + static_cast<size_t>(db.size()) * sb);
    out.labels.resize(lat + static_cast<size_t>(db.size()));
    EXPECT_TRUE(feeder.CopyToHost(db, out.images.data() + at, out.labels.data() + lat).ok());
    out.indices.insert(out.indices.end(), db.indices().begin(), db.indices().end());
  }
  out.stats = feeder.stats();
  return out;
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A client whose feed decodes (defer_decode) gets the JPEGs its device
// decoder takes encoded, with the daemon's crop plan, and the rest decoded
// by the daemon: its feed delivers, byte for byte, what the same feed over a
// local Loader delivers, over every transport, in both orders, each rank
// its own shard; every sample is delivered, with its label.
TEST_F(DaemonEncodedTest, DeferredBatchesDecodeOnTheClientAsOnALocalLoader) {
  auto tcp = Server::Start(Options("tcp://127.0.0.1:0"));
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  auto unix_server = Server::Start(Options("unix:" + dir_ + "/d.sock"));
  ASSERT_TRUE(unix_server.ok()) << unix_server.status().ToString();
  DecodeOptions d;
  d.height = d.width = 20;  // random-resized-crop: each sample's crop is its own
  d.scale_min = 0.3;
  auto local_src = OpenEncodedImages(data_, {}, d);
  ASSERT_TRUE(local_src.ok()) << local_src.status().ToString();
  const std::vector<int64_t>& labels = (*local_src)->labels();
  ASSERT_EQ(labels.size(), kN);
  struct Transport {
    std::string name, address;
    bool compress, shm;
  };
  const std::vector<Transport> transports = {
      {"shm", (*unix_server)->endpoint(), false, true},
      {"unix socket", (*unix_server)->endpoint(), false, false},
      {"tcp+zstd", (*tcp)->endpoint(), true, false},
  };
  for (Order order : {Order::kRandom, Order::kBlock}) {
    std::vector<int> seen(kN, 0);
    uint64_t delivered = 0;
    for (int rank = 0; rank < 2; ++rank) {
      LoaderOptions lo = Stream();
      lo.order = order;
      lo.rank = rank;
      lo.world_size = 2;
      lo.defer_decode = true;
      Loader local(**local_src, lo);
      const Fed want = FeedEpoch(local, 1);
      ASSERT_TRUE(want.error.ok()) << want.error.ToString();
      EXPECT_GT(want.stats.decoded_on_device, 0u);  // the CPU twin's, as the device's
      EXPECT_GT(want.stats.decoded_by_loader, 0u);  // the progressive ones
      for (size_t i = 0; i < want.indices.size(); ++i) {
        ASSERT_LT(want.indices[i], kN);
        EXPECT_EQ(want.labels[i], labels[want.indices[i]]) << "sample " << want.indices[i];
        seen[want.indices[i]] += 1;
      }
      delivered += want.indices.size();
      for (const Transport& t : transports) {
        const std::string what = t.name + " " + std::string(OrderName(order)) + " rank " + std::to_string(rank);
        RemoteLoaderOptions ro;
        ro.address = t.address;
        ro.token = "tok";
        ro.loader = lo;
        ro.decode = d;
        ro.compress = t.compress;
        ro.shared_memory = t.shm;
        ro.io_timeout_ms = 10000;
        auto remote = RemoteLoader::Connect(ro);
        ASSERT_TRUE(remote.ok()) << what << ": " << remote.status().ToString();
        EXPECT_TRUE((*remote)->info().encoded_batches) << what;
        const Fed got = FeedEpoch(**remote, 1);
        ASSERT_TRUE(got.error.ok()) << what << ": " << got.error.ToString();
        EXPECT_EQ(got.indices, want.indices) << what;
        EXPECT_EQ(got.labels, want.labels) << what;
        EXPECT_TRUE(SameBytes(got.images, want.images)) << what;
        EXPECT_EQ(got.stats.decoded_on_device, want.stats.decoded_on_device) << what;
        EXPECT_EQ(got.stats.decoded_by_loader, want.stats.decoded_by_loader) << what;
      }
    }
    // Two shards of ceil(23 / 2): every sample, one repeated as padding.
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 0) << OrderName(order);
    EXPECT_EQ(delivered, 2 * ((kN + 1) / 2)) << OrderName(order);
  }
  // A client that does not defer gets decoded samples, as before.
  RemoteLoaderOptions plain;
  plain.address = (*unix_server)->endpoint();
  plain.token = "tok";
  plain.loader = Stream();
  plain.decode = d;
  auto r = RemoteLoader::Connect(plain);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE((*r)->info().encoded_batches);
  auto epoch = Epoch(**r, 0);
  ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
}

// A daemon that answers HELLO with `ok`, and a stream's first CREDIT with
// one BATCH frame of `batch`: what a broken or hostile server sends. Every
// wait is bounded (poll and socket timeouts); the destructor ends it.
class FakeDaemon {
 public:
  FakeDaemon(const std::string& path, daemon::HelloOk ok, std::vector<std::byte> batch)
      : path_(path), ok_(std::move(ok)), batch_(std::move(batch)) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
    ::unlink(path.c_str());
    listening_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && ::listen(fd_, 4) == 0;
    if (listening_) thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDaemon() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool listening() const { return listening_; }
  std::string address() const { return "unix:" + path_; }

 private:
  static bool Io(int c, void* p, size_t n, bool send) {
    auto* b = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = send ? ::send(c, b, n, MSG_NOSIGNAL) : ::recv(c, b, n, 0);
      if (r <= 0) return false;
      b += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  static bool Send(int c, std::span<const std::byte> bytes) {
    return Io(c, const_cast<std::byte*>(bytes.data()), bytes.size(), true);
  }
  // A client frame's type and payload.
  static bool Recv(int c, FrameType* type, std::vector<std::byte>* payload) {
    daemon::HeaderBytes hb;
    if (!Io(c, hb.data(), hb.size(), false)) return false;
    auto h = daemon::ParseHeader(hb, daemon::kMaxControlPayload, daemon::kMaxControlPayload, "client");
    if (!h.ok()) return false;
    payload->resize(h->payload_bytes);
    *type = h->type;
    return Io(c, payload->data(), payload->size(), false);
  }
  void Serve() {
    for (int served = 0; served < 2 && !stop_;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      ++served;
      timeval tv{5, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      FrameType type{};
      std::vector<std::byte> payload;
      if (Recv(c, &type, &payload) && type == FrameType::kHello) {
        auto hello = daemon::DecodeHello(payload);
        const bool describe = hello.ok() && hello->describe_only;
        Send(c, daemon::MakeFrame(FrameType::kHelloOk, daemon::EncodeHelloOk(ok_)));
        if (!describe && Recv(c, &type, &payload) && type == FrameType::kCredit) {
          const daemon::HeaderBytes hb =
              daemon::MakeHeader(FrameType::kBatch, 0, static_cast<uint32_t>(batch_.size()), {batch_});
          if (Send(c, hb) && Send(c, batch_)) {
            char sink[256];
            while (::recv(c, sink, sizeof sink, 0) > 0) {  // until the client closes (or 5 s)
            }
          }
        }
      }
      ::close(c);
    }
  }
  std::string path_;
  daemon::HelloOk ok_;
  std::vector<std::byte> batch_;
  int fd_ = -1;
  bool listening_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A BATCH payload of one sample (index 0, label 0) with an encoded table of
// one entry and `data` after it.
std::vector<std::byte> OneEncodedBatch(uint64_t sample_bytes, const EncodedSample& e, std::span<const std::byte> data) {
  std::vector<std::byte> p;
  auto put = [&](const void* v, size_t n) {
    const auto* b = static_cast<const std::byte*>(v);
    p.insert(p.end(), b, b + n);
  };
  const uint64_t epoch = 0, index = 0, sample = 0;
  const int64_t label = 0;
  const uint32_t count = 1, flags = 3;  // labels, encoded
  put(&epoch, 8);
  put(&index, 8);
  put(&count, 4);
  put(&flags, 4);
  put(&sample_bytes, 8);
  put(&sample, 8);
  put(&label, 8);
  put(&e.offset, 8);
  put(&e.bytes, 8);
  for (int32_t v : {e.height, e.width, e.crop.top, e.crop.left, e.crop.height, e.crop.width}) put(&v, 4);
  put(data.data(), data.size());
  return p;
}

TEST_F(DaemonEncodedTest, AHostileEncodedTableIsRefusedWithItsReason) {
  DecodeOptions d;
  d.height = d.width = 16;
  daemon::HelloOk ok;
  ok.info.name = "fake";
  ok.info.sample_shape = {3, 16, 16};
  ok.info.sample_bytes = 3 * 16 * 16;
  ok.info.num_samples = 4;
  ok.info.batch_size = 2;
  ok.info.has_labels = true;
  ok.info.encoded_batches = true;
  FieldInfo f;
  f.name = "images";
  f.path = "/images";
  f.sample_shape = ok.info.sample_shape;
  f.sample_bytes = ok.info.sample_bytes;
  ok.info.fields = {f};
  ok.num_batches = 2;
  ok.slot_sample_bytes = ok.info.sample_bytes;  // slots of 2 x 768 bytes
  const std::vector<unsigned char> jpeg = TexturedJpeg(1, 20, 30, false);
  const auto jpeg_bytes = std::as_bytes(std::span(jpeg));
  auto run = [&](const EncodedSample& e, std::span<const std::byte> data, bool defer) -> Status {
    FakeDaemon fake(dir_ + "/fake.sock", ok, OneEncodedBatch(ok.info.sample_bytes, e, data));
    EXPECT_TRUE(fake.listening());
    RemoteLoaderOptions ro;
    ro.address = fake.address();
    ro.loader = Stream();
    ro.loader.batch_size = 2;
    ro.loader.defer_decode = defer;
    ro.decode = d;
    ro.shared_memory = false;
    ro.io_timeout_ms = 3000;
    auto remote = RemoteLoader::Connect(ro);
    if (!remote.ok()) return remote.status();
    EpochStream s = (*remote)->Epoch(0);
    auto r = s.Next();
    return r.ok() ? Status::Ok() : r.status();
  };
  auto expect_refused = [](const Status& st, const std::string& says) {
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  };
  // Past the slot (2 samples of 768 bytes).
  EncodedSample e;
  e.bytes = 5000;
  e.height = 20;
  e.width = 30;
  e.crop = {0, 0, 10, 10};
  const std::vector<std::byte> big(5000);
  expect_refused(run(e, big, true), "pass the slot's 1536 bytes");
  // A crop outside the image.
  e.bytes = jpeg.size();
  e.crop = {15, 0, 10, 10};
  expect_refused(run(e, jpeg_bytes, true), "crop 10x10 at (15, 0) outside its 20x30 image");
  // Inside the slot and the image it claims, but the JPEG's header says
  // otherwise: the device decoder would size its output by the lie.
  e.height = 40;
  e.crop = {0, 0, 10, 10};
  expect_refused(run(e, jpeg_bytes, true), "its header reads 20x30");
  // The true size with another crop than this client plans.
  e.height = 20;
  e.crop = {1, 2, 3, 4};
  expect_refused(run(e, jpeg_bytes, true), "its header reads 20x30 cropped");
  // Encoded batches for a client that decodes nothing itself.
  expect_refused(run(e, jpeg_bytes, false), "did not ask for");
}

}  // namespace
}  // namespace gpufeed
