// Share::kNode: finding, starting and holding the node's server
// (daemon/node_share.h).
#include "daemon/node_share.h"

#include "common/mutex.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "common/job.h"
#include "common/sizes.h"
#include "gpufeed/fields.h"

extern char** environ;

namespace gpufeed {

namespace {

constexpr int kStartTimeoutMs = 180000;  // opening a large many-file dataset (and its probe) can take a while

// The data as every rank names it: a file spec made absolute (ranks may
// start in different directories); globs, lists and directories as given.
std::string CanonicalSpec(const std::string& spec) {
  if (spec.find_first_of("*?[") != std::string::npos) return spec;
  const size_t colon = spec.find(':');
  const std::string path = spec.substr(0, colon);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return spec;
  const std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  return ec ? spec : abs + (colon == std::string::npos ? "" : spec.substr(colon));
}

bool Accepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

bool IsExecutable(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// The gpufeed executable that serves the node: GPUFEED_CLI, else the one
// beside the library this code is in (the bundle's bin/, a build tree, a
// package folder, or the gpufeed executable itself), else `gpufeed` on PATH.
Result<std::string> CliPath() {
  if (std::string env = Env("GPUFEED_CLI"); !env.empty()) return env;
  std::string here_dir;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&AttachNodeServer), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    here_dir = std::filesystem::canonical(info.dli_fname, ec).parent_path().string();
    if (!ec) {
      for (const std::string& c : {here_dir + "/gpufeed", here_dir + "/../bin/gpufeed", here_dir + "/bin/gpufeed"}) {
        if (IsExecutable(c)) return c;
      }
    }
  }
  std::stringstream path(Env("PATH"));
  for (std::string dir; std::getline(path, dir, ':');) {
    if (!dir.empty() && IsExecutable(dir + "/gpufeed")) return dir + "/gpufeed";
  }
  return Status::NotFound("share=node starts `gpufeed serve`, but no gpufeed executable was found beside " +
                          (here_dir.empty() ? std::string("this library") : here_dir) +
                          " or on PATH; set GPUFEED_CLI, or use share=none");
}

std::string Tail(const std::string& path) {
  std::ifstream f(path);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!all.empty() && (all.back() == '\n' || all.back() == ' ')) all.pop_back();
  if (all.size() > 2000) all = "..." + all.substr(all.size() - 2000);
  return all.empty() ? "(nothing in " + path + ")" : all;
}

// Servers this process started: reaped once they exit (they are this
// process's children until then).
Mutex started_mu;
std::vector<pid_t> started GUARDED_BY(started_mu);

void Reap() {
  MutexLock lock(&started_mu);
  std::erase_if(started, [](pid_t p) { return ::waitpid(p, nullptr, WNOHANG) != 0; });
}

class Fd {  // closes on scope exit
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

Status Spawn(const std::vector<std::string>& args, const std::string& log, pid_t* pid) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);  // nothing of this process's, its lease above all
  // A session of its own: the terminal's Ctrl-C and the launcher's signals
  // to the ranks' group do not reach it; the lease ends it.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  const int rc = ::posix_spawn(pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::IOError("share=node: could not start " + args[0] + ": " + std::strerror(rc));
  return Status::Ok();
}

}  // namespace

NodeLease::~NodeLease() {
  if (lease_fd_ >= 0) ::close(lease_fd_);
  Reap();
}

Result<Share> ResolveShare(const SourceOptions& o) {
  std::string given;
  if (!o.open.labels_path.empty()) given += "labels ";
  if (o.open.io != IoMode::kAuto) given += "io ";
  if (o.open.max_open_files != OpenOptions{}.max_open_files) given += "max_open_files ";
  switch (o.share) {
    case Share::kNone:
      return Share::kNone;
    case Share::kNode:
      if (IsDaemonAddress(o.data)) {
        return Status::InvalidArgument("share=node: " + o.data + " is a daemon already; share applies to files");
      }
      if (!given.empty()) {
        given.pop_back();
        return Status::InvalidArgument("share=node cannot pass " + given +
                                       " to the node's server; use share=none (a loader in this process) or leave "
                                       "it out");
      }
      return Share::kNode;
    case Share::kAuto:
      return LocalWorldSize() > 1 && !IsDaemonAddress(o.data) && given.empty() ? Share::kNode : Share::kNone;
  }
  return Share::kNone;
}

Result<std::unique_ptr<NodeLease>> AttachNodeServer(const SourceOptions& o) {
  Reap();
  auto dir = NodeDir();
  if (!dir.ok()) return dir.status().WithContext("share=node");
  const std::string spec = CanonicalSpec(o.data);
  const int local = LocalWorldSize();
  const int node_threads = o.loader.threads > 0 ? o.loader.threads * local : 0;  // 0: every core
  std::string key = JobId(true) + "|" + spec + "|" + (o.open.no_sample_axis ? "1" : "0") + "|" +
                    (o.open.trust_files ? "1" : "0") + "|" + std::to_string(node_threads) + "|" +
                    std::to_string(o.loader.cache_bytes) + "|" + std::to_string(o.loader.prefetch);
  for (const std::string& f : o.open.fields) key += "|" + f;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  const std::string prefix = *dir + "/gpufeed-" + std::to_string(::getuid()) + "-" + hash;
  const std::string sock = prefix + ".sock", lease_path = prefix + ".lease", log = prefix + ".log";
  if (sock.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::InvalidArgument("share=node: the socket path " + sock +
                                   " is too long for a Unix socket; set GPUFEED_NODE_DIR to a shorter directory");
  }
  auto lease = std::unique_ptr<NodeLease>(new NodeLease());
  lease->address_ = "unix:" + sock;
  lease->dataset_ = spec;
  Fd lock(::open((prefix + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  Fd held(::open(lease_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (lock.get() < 0 || held.get() < 0) {
    return Status::IOError("share=node: " + prefix + ".lock/.lease: " + std::strerror(errno) +
                           " (set GPUFEED_NODE_DIR to a writable directory)");
  }
  // The start-up mutex, held until this function returns (Fd closes it);
  // then the shared lease, which waits while a server that found no holder
  // is stopping (it holds the lease exclusively until it exits).
  if (::flock(lock.get(), LOCK_EX) != 0 || ::flock(held.get(), LOCK_SH) != 0) {
    return Status::IOError("share=node: flock on " + prefix + ": " + std::strerror(errno));
  }
  if (!Accepts(sock)) {
    auto cli = CliPath();
    if (!cli.ok()) return cli.status();
    uint64_t budget = std::max<uint64_t>(
        8ull << 30,
        SaturatingAdd(SaturatingMul(2 * static_cast<uint64_t>(local) + 1, o.loader.cache_bytes), 4ull << 30));
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) budget = std::min<uint64_t>(budget, static_cast<uint64_t>(pages) * page / 10 * 8);
    std::vector<std::string> args{*cli, "serve", "--data", spec};
    for (const std::string& f : o.open.fields) args.insert(args.end(), {"--field", f});
    if (o.open.no_sample_axis) args.push_back("--no-sample-axis");
    args.insert(args.end(), {"--listen", lease->address_, "--lease-file", lease_path, "--cache-bytes",
                             std::to_string(o.loader.cache_bytes), "--prefetch", std::to_string(o.loader.prefetch),
                             "--memory-bytes", std::to_string(budget), "--log-level", "warn"});
    if (node_threads > 0) args.insert(args.end(), {"--threads", std::to_string(node_threads)});
    if (o.open.trust_files) args.push_back("--trust-files");
    ::unlink(sock.c_str());  // a server that died without cleaning up
    pid_t pid = 0;
    GPUFEED_RETURN_IF_ERROR(Spawn(args, log, &pid));
    {
      MutexLock g(&started_mu);
      started.push_back(pid);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStartTimeoutMs);
    while (!Accepts(sock)) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::string cmd;
        for (const std::string& a : args) cmd += (cmd.empty() ? "" : " ") + a;
        return Status::Internal("share=node: the node's server (" + cmd + ") exited with " +
                                std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) +
                                ": " + Tail(log));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        return Status::IOError("share=node: the node's server did not listen on " + sock + " within " +
                               std::to_string(kStartTimeoutMs / 1000) + " s: " + Tail(log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    lease->started_here_ = true;
  }
  lease->lease_fd_ = held.release();
  return lease;
}

}  // namespace gpufeed
