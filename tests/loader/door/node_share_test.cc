// Share::kNode through OpenBatchSource (the door every caller uses): ranks
// of one job on one host find or start one node-local server, read their
// own shards through it, and the server ends with the last of them, leaving
// no file behind. The node's files live in a private directory; planted
// links and a server of another uid are refused (docs/practices.md, practice 24).
#include "loader/door/node_share.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/job.h"
#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/open_source.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

class ScopedEnv {  // sets variables for one test, restores them after
 public:
  void Set(const char* name, const std::string& value) {
    const char* old = getenv(name);
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    setenv(name, value.c_str(), 1);
  }
  void Unset(const char* name) {
    Set(name, "");
    unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->had) {
        setenv(it->name, it->value.c_str(), 1);
      } else {
        unsetenv(it->name);
      }
    }
  }

 private:
  struct Saved {
    const char* name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

SourceOptions Rank(const std::string& data, int rank, int world) {
  SourceOptions o;
  o.data = data;
  o.loader.batch_size = 32;
  o.loader.seed = 3;
  o.loader.threads = 2;
  o.loader.prefetch = 2;
  o.loader.rank = rank;
  o.loader.world_size = world;
  o.loader.cache_bytes = 1 << 20;
  return o;
}

// A directory for the node's files inside `base` (MakeTempDir's are 0755,
// which NodeDir refuses).
std::string PrivateNodeDir(const std::string& base) {
  const std::string d = base + "/node";
  ::mkdir(d.c_str(), 0700);
  ::chmod(d.c_str(), 0700);
  return d;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += (s.empty() ? "" : " ") + e;
  return s;
}

// Waits up to 20 s for `dir` to hold nothing; returns what it holds.
std::vector<std::string> WaitEmpty(const std::string& dir) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!Entries(dir).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Entries(dir);
}

std::string WriteData(const std::string& dir, uint64_t n) {
  const std::string data = dir + "/data.h5";
  testing::H5Layout layout;
  layout.chunk = {20, 3, 4, 4};
  EXPECT_TRUE(testing::WriteH5(data, {n, 3, 4, 4}, H5T_NATIVE_UINT8, testing::IndexSamples(n, 3 * 4 * 4), layout));
  return data;
}

// The environment of one job's two local ranks meeting in `node_dir`.
void SetJob(ScopedEnv* env, const std::string& node_dir, const std::string& tag) {
  env->Set("GPUFEED_NODE_DIR", node_dir);
  env->Set("LOCAL_WORLD_SIZE", "2");
  env->Set("TORCHELASTIC_RUN_ID", "node-share-" + tag + "-" + std::to_string(::getpid()));
}

// A Unix-socket server of uid 65534 (another user): a child that binds
// `path` while still root, then drops to 65534 and listens (the kernel
// records the listener's credentials at listen(), which SO_PEERCRED
// reports). It accepts every connection and counts the bytes it receives
// until Stop(). Only root can make one.
class ForeignServer {
 public:
  static constexpr uid_t kUid = 65534;
  explicit ForeignServer(const std::string& path) {
    int ready[2], result[2], stop[2];
    if (::pipe(ready) != 0 || ::pipe(result) != 0 || ::pipe(stop) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(result[0]);
      ::close(stop[1]);
      Child(path.c_str(), ready[1], result[1], stop[0]);
    }
    ::close(ready[1]);
    ::close(result[1]);
    ::close(stop[0]);
    result_ = result[0];
    stop_ = stop[1];
    char ok = 0;
    listening_ = ::read(ready[0], &ok, 1) == 1 && ok == 1;
    ::close(ready[0]);
  }
  ~ForeignServer() { Stop(); }
  bool listening() const { return listening_; }
  // Ends the child; the bytes it received over all its connections.
  long Stop() {
    if (pid_ <= 0) return received_;
    ::close(stop_);
    if (::read(result_, &received_, sizeof received_) != sizeof received_) received_ = -1;
    ::close(result_);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return received_;
  }

 private:
  // After fork(): async-signal-safe calls only, no allocation.
  [[noreturn]] static void Child(const char* path, int ready, int result, int stop) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, path, sizeof sa.sun_path - 1);
    const char ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && ::setgid(kUid) == 0 &&
                            ::setuid(kUid) == 0 && ::listen(fd, 16) == 0
                        ? 1
                        : 0;
    (void)!::write(ready, &ok, 1);
    long total = 0;
    pollfd fds[34] = {};
    int n = 2;
    fds[0] = {stop, POLLIN, 0};
    fds[1] = {fd, POLLIN, 0};
    char buf[4096];
    while (::poll(fds, n, 30000) > 0 && fds[0].revents == 0) {
      if ((fds[1].revents & POLLIN) != 0) {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c >= 0 && n < 34) fds[n++] = {c, POLLIN, 0};
      }
      for (int i = 2; i < n; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0) continue;
        const ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
        if (r > 0) {
          total += r;
        } else {
          ::close(fds[i].fd);
          fds[i].fd = -1;
        }
      }
    }
    (void)!::write(result, &total, sizeof total);
    ::_exit(0);
  }
  pid_t pid_ = -1;
  int result_ = -1, stop_ = -1;
  bool listening_ = false;
  long received_ = 0;
};

TEST(NodeShareTest, ResolvesAutoUnderTorchrunAndRefusesWhatTheServerCannotTake) {
  ScopedEnv env;
  env.Set("LOCAL_WORLD_SIZE", "1");
  SourceOptions o = Rank("x.h5", 0, 1);
  EXPECT_EQ(*ResolveShare(o), Share::kNone);
  env.Set("LOCAL_WORLD_SIZE", "2");
  EXPECT_EQ(*ResolveShare(o), Share::kNode);
  o.open.labels_path = "/y";
  EXPECT_EQ(*ResolveShare(o), Share::kNone);  // auto: a local loader takes it
  o.share = Share::kNode;
  auto r = ResolveShare(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot pass labels"), std::string::npos) << r.status().message();
  o = Rank("unix:/tmp/x.sock", 0, 1);
  EXPECT_EQ(*ResolveShare(o), Share::kNone);
  o.share = Share::kNode;
  EXPECT_FALSE(ResolveShare(o).ok());
  EXPECT_FALSE(ShareFromName("sometimes").ok());
  EXPECT_EQ(*ShareFromName("node"), Share::kNode);
}

TEST(NodeShareTest, RanksShareOneServerThatEndsWithTheLast) {
#if !GPUFEED_TESTS_HAVE_CLI
  GTEST_SKIP() << "this build has no gpufeed command to start as the node's server (GPUFEED_BUILD_CLI=OFF: "
                  "scripts/test's ThreadSanitizer pass)";
#endif
  const std::string base = testing::MakeTempDir("node");
  const std::string dir = PrivateNodeDir(base);
  const uint64_t n = 300, sb = 3 * 4 * 4;
  const std::string data = WriteData(base, n);
  ScopedEnv env;
  SetJob(&env, dir, "share");
  auto first = OpenBatchSource(Rank(data, 0, 2));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = OpenBatchSource(Rank(data, 1, 2));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE((*first)->node_shared() && (*second)->node_shared());
  EXPECT_TRUE((*first)->started_node_server());
  EXPECT_FALSE((*second)->started_node_server());
  std::vector<int> seen(n, 0);
  for (auto* s : {&*first, &*second}) {
    for (const Batch& b : (*s)->source().Epoch(0)) {
      for (uint64_t i = 0; i < b.size(); ++i) {
        ASSERT_EQ(testing::SampleIndexOf(b.images().subspan(i * sb, sb)), static_cast<int64_t>(b.indices()[i]));
        seen[b.indices()[i]] += 1;
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(n));
  // The server's socket stays while a rank holds the lease, and goes after.
  std::string sock;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".sock") sock = e.path().string();
  }
  ASSERT_FALSE(sock.empty());
  first->reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  struct stat st {};
  EXPECT_EQ(::stat(sock.c_str(), &st), 0) << "the server stopped while a rank still held it";
  second->reset();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (::stat(sock.c_str(), &st) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(::stat(sock.c_str(), &st), 0) << "the node's server outlived its last rank";
}

TEST(NodeShareTest, NodeDirectoryIsPrivateOrRefused) {
  const std::string base = testing::MakeTempDir("node_dir");
  const std::string euid = std::to_string(::geteuid());
  ScopedEnv env;
  env.Unset("XDG_RUNTIME_DIR");
  auto mode_of = [](const std::string& p) {
    struct stat st {};
    return ::lstat(p.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
  };
  auto refused = [](const std::string& what, const std::string& path) {
    auto d = NodeDir();
    EXPECT_FALSE(d.ok()) << path << " (" << what << ") was taken as the node's directory";
    if (d.ok()) return;
    const std::string m = d.status().message();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
    EXPECT_NE(m.find("GPUFEED_NODE_DIR"), std::string::npos) << m;
  };
  // GPUFEED_NODE_DIR: made 0700 when absent, whatever the umask.
  const std::string made = base + "/made";
  env.Set("GPUFEED_NODE_DIR", made);
  const mode_t old_umask = ::umask(0022);
  auto d = NodeDir();
  ::umask(old_umask);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, made);
  EXPECT_EQ(mode_of(made), 0700u);
  // A symbolic link to a private directory of ours: refused.
  ASSERT_EQ(::symlink(made.c_str(), (base + "/link").c_str()), 0);
  env.Set("GPUFEED_NODE_DIR", base + "/link");
  refused("symbolic link", base + "/link");
  // Group or other bits.
  const std::string open = base + "/open";
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  env.Set("GPUFEED_NODE_DIR", open);
  refused("mode 0777", open);
  ASSERT_EQ(::chmod(open.c_str(), 0750), 0);
  refused("mode 0750", open);
  // Another owner (a second uid needs root to make).
  if (::geteuid() == 0) {
    const std::string foreign = base + "/foreign";
    ASSERT_EQ(::mkdir(foreign.c_str(), 0700), 0);
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
    env.Set("GPUFEED_NODE_DIR", foreign);
    refused("owned by uid 65534", foreign);
  }
  // Without GPUFEED_NODE_DIR: gpufeed-<euid> in TMPDIR, made 0700; a link
  // planted there under that name is refused, and nothing is made through it.
  env.Unset("GPUFEED_NODE_DIR");
  const std::string tmp = base + "/tmp";
  ASSERT_EQ(::mkdir(tmp.c_str(), 0777), 0);
  env.Set("TMPDIR", tmp);
  ASSERT_EQ(::symlink(open.c_str(), (tmp + "/gpufeed-" + euid).c_str()), 0);
  refused("symbolic link", tmp + "/gpufeed-" + euid);
  ASSERT_EQ(::unlink((tmp + "/gpufeed-" + euid).c_str()), 0);
  d = NodeDir();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, tmp + "/gpufeed-" + euid);
  EXPECT_EQ(mode_of(*d), 0700u);
  // XDG_RUNTIME_DIR/gpufeed first when there is one.
  ASSERT_EQ(::mkdir((base + "/xdg").c_str(), 0700), 0);
  env.Set("XDG_RUNTIME_DIR", base + "/xdg");
  d = NodeDir();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, base + "/xdg/gpufeed");
  EXPECT_EQ(mode_of(*d), 0700u);
  // share=node goes no further than the check.
  env.Set("GPUFEED_NODE_DIR", open);
  env.Set("LOCAL_WORLD_SIZE", "2");
  SourceOptions o = Rank(base + "/missing.h5", 0, 2);
  o.share = Share::kNode;
  auto r = OpenBatchSource(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(open + " (GPUFEED_NODE_DIR) has mode 0750"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(Entries(open).empty()) << Joined(Entries(open));
}

TEST(NodeShareTest, PlantedLinksAtTheNodeFilesAreRefusedAndTheirTargetsKept) {
  const std::string base = testing::MakeTempDir("node_links");
  const std::string dir = PrivateNodeDir(base);
  const std::string data = WriteData(base, 100);
  ScopedEnv env;
  SetJob(&env, dir, "links");
  SourceOptions o = Rank(data, 0, 2);
  o.share = Share::kNode;
  auto prefix = NodePrefix(o);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  const std::string target = base + "/precious", kept = "bytes the rank may write but must not lose\n";
  { std::ofstream(target) << kept; }
  for (const char* ext : {".log", ".lock", ".lease", ".sock"}) {
    const std::string link = *prefix + ext;
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link;
    auto r = OpenBatchSource(o);
    EXPECT_FALSE(r.ok()) << "a link at " << link << " was used";
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(link), std::string::npos) << r.status().message();
    }
    EXPECT_EQ(ReadAll(target), kept) << "written through " << link;
    struct stat st {};
    EXPECT_EQ(::lstat(link.c_str(), &st), 0) << link << " was removed: the error says to look at it";
    ::unlink(link.c_str());
  }
}

TEST(NodeShareTest, AServerOfAnotherUidIsRefusedBeforeAnythingIsSent) {
  if (::geteuid() != 0) GTEST_SKIP() << "a server of another uid takes root to make (CI runs as root)";
  const std::string base = testing::MakeTempDir("node_peer");
  const std::string dir = PrivateNodeDir(base);
  const std::string data = WriteData(base, 100);
  ScopedEnv env;
  SetJob(&env, dir, "peer");
  // A daemon address the user gives.
  {
    const std::string path = base + "/foreign.sock";
    ForeignServer foreign(path);
    ASSERT_TRUE(foreign.listening());
    SourceOptions o = Rank("unix:" + path, 0, 1);
    o.remote.io_timeout_ms = 2000;  // without the check: the HELLO, then a silent peer
    auto r = OpenBatchSource(o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("unix:" + path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("uid 65534"), std::string::npos) << r.status().message();
    EXPECT_EQ(foreign.Stop(), 0) << "bytes reached a server of another uid";
  }
  // The node's socket (only root could put one there: the directory is
  // private; the check holds all the same).
  SourceOptions o = Rank(data, 0, 2);
  o.share = Share::kNode;
  o.remote.io_timeout_ms = 2000;
  auto prefix = NodePrefix(o);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  ForeignServer foreign(*prefix + ".sock");
  ASSERT_TRUE(foreign.listening());
  auto r = OpenBatchSource(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(*prefix + ".sock"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("uid 65534"), std::string::npos) << r.status().message();
  EXPECT_EQ(foreign.Stop(), 0) << "bytes reached a server of another uid";
}

TEST(NodeShareTest, AJobLeavesNoFilesInTheNodeDirectory) {
#if !GPUFEED_TESTS_HAVE_CLI
  GTEST_SKIP() << "this build has no gpufeed command to start as the node's server";
#endif
  const std::string base = testing::MakeTempDir("node_clean");
  const std::string dir = PrivateNodeDir(base);
  const std::string data = WriteData(base, 100);
  ScopedEnv env;
  SetJob(&env, dir, "clean");
  {
    auto first = OpenBatchSource(Rank(data, 0, 2));
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    auto second = OpenBatchSource(Rank(data, 1, 2));
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_EQ(Entries(dir).size(), 4u) << Joined(Entries(dir));  // .sock .lease .lock .log
    for (const Batch& b : (*first)->source().Epoch(0)) (void)b;
  }
  EXPECT_TRUE(WaitEmpty(dir).empty()) << "left after the job: " << Joined(Entries(dir));

  // A rank that waited for the start-up lock while the server removed it
  // (the test plays the server: it holds the lock, then removes the files)
  // sees that its lock is gone, makes the files anew and starts a server
  // whose files go with its job too.
  SourceOptions o = Rank(data, 0, 2);
  auto prefix = NodePrefix(o);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  const int lock = ::open((*prefix + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX), 0);
  auto late = std::async(std::launch::async, [&] { return OpenBatchSource(o); });
  // The rank blocks on the lock: seen as a waiter on its inode in
  // /proc/locks ("-> FLOCK ..."), not assumed after a fixed sleep (on a busy
  // machine the rank reached the lock after it was gone, and this branch did
  // not run).
  struct stat lock_st {};
  ASSERT_EQ(::fstat(lock, &lock_st), 0);
  const std::string inode = ":" + std::to_string(lock_st.st_ino) + " ";
  bool waiting = false;
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       !waiting && std::chrono::steady_clock::now() < deadline;) {
    std::ifstream locks("/proc/locks");
    for (std::string line; !waiting && std::getline(locks, line);) {
      waiting = line.find("->") != std::string::npos && line.find(inode) != std::string::npos;
    }
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(waiting) << "the rank never waited for the start-up lock";
  ::unlink((*prefix + ".lock").c_str());
  ::close(lock);
  {
    auto rank = late.get();
    ASSERT_TRUE(rank.ok()) << rank.status().ToString();
    struct stat st {};
    EXPECT_EQ(::lstat((*prefix + ".lock").c_str(), &st), 0) << "the rank kept a removed lock";
  }
  EXPECT_TRUE(WaitEmpty(dir).empty()) << "left after the job: " << Joined(Entries(dir));

  // A server that cannot start: the error names its log, the one file left.
  auto r = OpenBatchSource(Rank(base + "/missing.h5", 0, 2));
  ASSERT_FALSE(r.ok());
  const std::vector<std::string> left = Entries(dir);
  ASSERT_EQ(left.size(), 1u) << Joined(left);
  EXPECT_TRUE(left[0].ends_with(".log")) << left[0];
  EXPECT_NE(r.status().message().find(dir + "/" + left[0]), std::string::npos) << r.status().message();
}

// An image folder of n textured JPEGs of varied sizes in two classes (every
// fifth progressive: no device decoder takes those), converted to an
// encoded HDF5 file; its path.
std::string WriteJpegs(const std::string& dir, uint64_t n) {
  const std::filesystem::path images = std::filesystem::path(dir) / "images";
  for (uint64_t k = 0; k < n; ++k) {
    const int h = 40 + static_cast<int>(k * 7 % 50), w = 60 + static_cast<int>(k * 13 % 70);
    std::vector<uint8_t> px(static_cast<size_t>(h) * w * 3);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i % (3 * w)) * 7 + (i / (3 * w)) * 3 + k * 11);
    tjhandle tj = tjInitCompress();
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    EXPECT_EQ(
        tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &buf, &size, TJSAMP_420, 90, k % 5 == 4 ? TJFLAG_PROGRESSIVE : 0),
        0);
    const std::filesystem::path cls = images / (k % 3 == 0 ? "b" : "a");
    std::filesystem::create_directories(cls);
    std::ofstream(cls / (std::to_string(1000 + k) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(size));
    tjFree(buf);
    tjDestroy(tj);
  }
  const std::string data = dir + "/jpeg.h5";
  auto c = ConvertEncodedImageFolder(images.string(), data, {});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return data;
}

// One epoch through the feed on the CPU, whose decoder for what a loader
// leaves encoded is the CPU twin of nvJPEG's: images as floats (mean 0, std
// 1: the pixel values), labels and dataset indices, in order.
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

// share="node" over JPEGs, ranks whose feed decodes (defer_decode, what a
// GPU feed sets): the node's server reads and caches the file for both,
// leaves each the JPEGs its feed's decoder takes, and decodes only the
// progressive ones. Each rank's feed delivers byte for byte what it
// delivers over a local Loader with the same options, in both orders; the
// two ranks together deliver every sample, each with its label.
TEST(NodeShareTest, EncodedImagesAreDecodedByEachRanksOwnFeed) {
#if !GPUFEED_TESTS_HAVE_CLI
  GTEST_SKIP() << "this build has no gpufeed command to start as the node's server (GPUFEED_BUILD_CLI=OFF: "
                  "scripts/test's ThreadSanitizer pass)";
#endif
  const std::string base = testing::MakeTempDir("node_jpeg");
  const std::string dir = PrivateNodeDir(base);
  const uint64_t n = 22;
  const std::string data = WriteJpegs(base, n);
  ScopedEnv env;
  SetJob(&env, dir, "jpeg");
  env.Set("GPUFEED_TRUST_FILES", "1");  // the tests' own file: no probe forked beside the ranks' threads
  DecodeOptions d;
  d.height = d.width = 20;  // random-resized-crop: a crop of its own for each sample and epoch
  d.scale_min = 0.3;
  auto local_src = OpenEncodedImages(data, {}, d);
  ASSERT_TRUE(local_src.ok()) << local_src.status().ToString();
  const std::vector<int64_t>& labels = (*local_src)->labels();
  for (Order order : {Order::kRandom, Order::kBlock}) {
    std::vector<std::unique_ptr<OpenedSource>> ranks;
    std::vector<SourceOptions> options;
    for (int rank = 0; rank < 2; ++rank) {
      SourceOptions o = Rank(data, rank, 2);
      o.loader.batch_size = 4;
      o.loader.order = order;
      o.loader.defer_decode = true;
      o.loader.pin_memory = false;
      o.decode = d;
      o.share = Share::kNode;
      auto opened = OpenBatchSource(o);
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      ASSERT_TRUE((*opened)->node_shared());
      EXPECT_TRUE((*opened)->source().info().encoded_batches) << "rank " << rank;
      ranks.push_back(std::move(*opened));
      options.push_back(o);
    }
    std::vector<int> seen(n, 0);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string what = std::string(OrderName(order)) + " rank " + std::to_string(rank);
      const Fed got = FeedEpoch(ranks[rank]->source(), 1);
      ASSERT_TRUE(got.error.ok()) << what << ": " << got.error.ToString();
      Loader local(**local_src, options[rank].loader);
      const Fed want = FeedEpoch(local, 1);
      ASSERT_TRUE(want.error.ok()) << what << ": " << want.error.ToString();
      EXPECT_EQ(got.indices, want.indices) << what;
      EXPECT_EQ(got.labels, want.labels) << what;
      EXPECT_TRUE(got.images.size() == want.images.size() &&
                  std::memcmp(got.images.data(), want.images.data(), got.images.size() * sizeof(float)) == 0)
          << what << ": the pixels differ";
      EXPECT_GT(got.stats.decoded_on_device, 0u) << what;  // by this rank's feed
      EXPECT_GT(got.stats.decoded_by_loader, 0u) << what;  // the progressive ones, by the server
      EXPECT_EQ(got.stats.decoded_on_device, want.stats.decoded_on_device) << what;
      for (size_t i = 0; i < got.indices.size(); ++i) {
        ASSERT_LT(got.indices[i], n) << what;
        EXPECT_EQ(got.labels[i], labels[got.indices[i]]) << what << " sample " << got.indices[i];
        seen[got.indices[i]] += 1;
      }
    }
    // Two shards of 11: every sample once.
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(n)) << OrderName(order);
  }
}

}  // namespace
}  // namespace gpufeed
