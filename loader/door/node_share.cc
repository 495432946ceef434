// Share::kNode: finding, starting and holding the node's server
// (loader/door/node_share.h).
#include "loader/door/node_share.h"

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
#include <span>
#include <sstream>
#include <thread>
#include <vector>

#include "common/job.h"
#include "common/sizes.h"
#include "gpufeed/fields.h"
#include "hdf5io/io/read_file.h"

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

// The log's last lines, read through io (hdf5io/io/read_file.h): the node's
// file, not one a link there names (practice 24), and only its end.
std::string Tail(const std::string& path) {
  auto f = io::ReadOnlyFile::Open(path, {.no_follow = true});
  if (!f.ok()) return "(" + f.status().message() + ")";
  constexpr uint64_t kTail = 2048;
  const uint64_t from = f->size() > kTail ? f->size() - kTail : 0;
  std::string all(static_cast<size_t>(f->size() - from), '\0');
  auto got = f->ReadAt(from, std::as_writable_bytes(std::span(all)));
  all.resize(got.ok() ? *got : 0);
  while (!all.empty() && (all.back() == '\n' || all.back() == ' ')) all.pop_back();
  if (from > 0 || all.size() > 2000) all = "..." + all.substr(all.size() > 2000 ? all.size() - 2000 : 0);
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

// Starts `args` with stdin and stdout on /dev/null and stderr on `log_fd`
// (a private file this rank just created: no path is opened in the child).
Status Spawn(const std::vector<std::string>& args, int log_fd, pid_t* pid) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, log_fd, 2);  // dup2 clears FD_CLOEXEC on 2
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

// OK when `path` is absent or a file of type `type` (S_IFSOCK, S_IFREG)
// owned by this uid; anything else (a symbolic link above all) is refused,
// naming it, before anything is opened, connected to or removed there.
Status CheckOwn(const std::string& path, mode_t type) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();
  if ((st.st_mode & S_IFMT) != type || st.st_uid != ::geteuid()) {
    return Status::InvalidArgument(
        "share=node: " + path + " is " +
        (S_ISLNK(st.st_mode) ? std::string("a symbolic link")
                             : "not a " + std::string(type == S_IFSOCK ? "socket" : "file") + " of this uid's") +
        " where the node's server keeps its " + (type == S_IFSOCK ? "socket" : "log") +
        "; nothing was opened through it. Remove it");
  }
  return Status::Ok();
}

// The start-up mutex: PREFIX.lock, locked exclusively and still the file at
// its path. A server that ends its job removes the job's files while it
// holds this lock (ServerOptions::lease_lock_file); a rank that opened the
// file before and locked it after holds a removed file, which locks nothing
// anyone else will see, so it sees that (the path names another file or
// none) and opens the path again. The other files (.lease, .log, .sock)
// are made and removed under this lock too (but for a stopping server's
// own socket, removed while it holds the lease exclusively, so while no
// rank can get past the lease), so they stay what its holder found.
Result<int> LockStartup(const std::string& path) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    auto opened = OpenPrivateFile(path, O_RDWR | O_CREAT);
    if (!opened.ok()) return opened.status().WithContext("share=node");
    Fd lock(*opened);
    if (::flock(lock.get(), LOCK_EX) != 0) {
      return Status::IOError("share=node: flock on " + path + ": " + std::strerror(errno));
    }
    struct stat held {};
    struct stat now {};
    if (::fstat(lock.get(), &held) == 0 && ::lstat(path.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino) {
      return lock.release();
    }
  }
  return Status::Internal("share=node: " + path + " was removed under this rank 1000 times in a row");
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

Result<std::string> NodePrefix(const SourceOptions& o) {
  auto dir = NodeDir();
  if (!dir.ok()) return dir.status().WithContext("share=node");
  const int node_threads = o.loader.threads > 0 ? o.loader.threads * LocalWorldSize() : 0;  // 0: every core
  std::string key = JobId(true) + "|" + CanonicalSpec(o.data) + "|" + (o.open.no_sample_axis ? "1" : "0") + "|" +
                    (o.open.trust_files ? "1" : "0") + "|" + std::to_string(node_threads) + "|" +
                    std::to_string(o.loader.cache_bytes) + "|" + std::to_string(o.loader.prefetch);
  for (const std::string& f : o.open.fields) key += "|" + f;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  const std::string prefix = *dir + "/gpufeed-" + std::to_string(::geteuid()) + "-" + hash;
  if (prefix.size() + std::strlen(".sock") >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::InvalidArgument("share=node: the socket path " + prefix +
                                   ".sock is too long for a Unix socket; set GPUFEED_NODE_DIR to a shorter directory");
  }
  return prefix;
}

namespace {

// The command line of the node's server (`gpufeed serve`) for `o`: its
// lease files, and a memory budget for the node's ranks' caches, at least
// 8 GiB and at most 80% of the machine.
std::vector<std::string> ServeArgs(const SourceOptions& o, const std::string& cli, const std::string& spec,
                                   const std::string& address, const std::string& lease_path,
                                   const std::string& lock_path, const std::string& log, int local, int node_threads) {
  uint64_t budget = std::max<uint64_t>(
      8ull << 30, SaturatingAdd(SaturatingMul(2 * static_cast<uint64_t>(local) + 1, o.loader.cache_bytes), 4ull << 30));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) budget = std::min<uint64_t>(budget, static_cast<uint64_t>(pages) * page / 10 * 8);
  std::vector<std::string> args{cli, "serve", "--data", spec};
  for (const std::string& f : o.open.fields) args.insert(args.end(), {"--field", f});
  if (o.open.no_sample_axis) args.push_back("--no-sample-axis");
  args.insert(args.end(),
              {"--listen", address, "--lease-file", lease_path, "--lease-lock", lock_path, "--lease-remove", log,
               "--cache-bytes", std::to_string(o.loader.cache_bytes), "--prefetch", std::to_string(o.loader.prefetch),
               "--memory-bytes", std::to_string(budget), "--log-level", "warn"});
  if (node_threads > 0) args.insert(args.end(), {"--threads", std::to_string(node_threads)});
  if (o.open.trust_files) args.push_back("--trust-files");
  return args;
}

}  // namespace

Result<std::unique_ptr<NodeLease>> AttachNodeServer(const SourceOptions& o) {
  Reap();
  auto named = NodePrefix(o);
  if (!named.ok()) return named.status();
  const std::string& prefix = *named;
  const std::string spec = CanonicalSpec(o.data);
  const int local = LocalWorldSize();
  const int node_threads = o.loader.threads > 0 ? o.loader.threads * local : 0;  // 0: every core
  const std::string sock = prefix + ".sock", lease_path = prefix + ".lease", log = prefix + ".log",
                    lock_path = prefix + ".lock";
  auto lease = std::unique_ptr<NodeLease>(new NodeLease());
  lease->address_ = "unix:" + sock;
  lease->dataset_ = spec;
  // The node's socket and log checked before anything is made or looked for:
  // a planted link is named (whatever else is missing) and nothing is left
  // behind. What uses them later does not trust a link either (Accepts
  // only connects and sends nothing; the client's Conn::Connect checks the
  // peer's uid before it sends; the log is made O_EXCL | O_NOFOLLOW).
  GPUFEED_RETURN_IF_ERROR(CheckOwn(sock, S_IFSOCK));
  GPUFEED_RETURN_IF_ERROR(CheckOwn(log, S_IFREG));
  // The start-up mutex, held until this function returns (Fd closes it);
  // then the shared lease, which waits while a server that found no holder
  // is stopping (it holds the lease exclusively until it exits).
  auto locked = LockStartup(lock_path);
  if (!locked.ok()) return locked.status();
  Fd lock(*locked);
  auto opened = OpenPrivateFile(lease_path, O_RDWR | O_CREAT);
  if (!opened.ok()) return opened.status().WithContext("share=node");
  Fd held(*opened);
  if (::flock(held.get(), LOCK_SH) != 0) {
    return Status::IOError("share=node: flock on " + lease_path + ": " + std::strerror(errno));
  }
  if (!Accepts(sock)) {
    // No server: this rank starts one. Until it listens, a failure removes
    // what this rank made but the log, which the error names (the ranks
    // waiting for the lock then find no files and try again themselves).
    bool remove_log = false;  // true while the log is this rank's, new and empty
    struct Unmake {
      const std::string &lock, &lease, &log, &sock;
      const bool& remove_log;
      bool armed = true;
      ~Unmake() {
        if (!armed) return;
        ::unlink(sock.c_str());  // a server that bound and died (or was killed) before it listened
        ::unlink(lease.c_str());
        if (remove_log) ::unlink(log.c_str());
        ::unlink(lock.c_str());  // last: the lock is still held (Fd `lock` closes after this)
      }
    } unmake{lock_path, lease_path, log, sock, remove_log};
    auto cli = CliPath();
    if (!cli.ok()) return cli.status();
    const std::vector<std::string> args =
        ServeArgs(o, *cli, spec, lease->address_, lease_path, lock_path, log, local, node_threads);
    // What a server that died (or failed to start) left goes (the log
    // checked above: ours, not a link); anything else there is not this
    // rank's to remove.
    ::unlink(sock.c_str());
    ::unlink(log.c_str());
    // O_EXCL with O_NOFOLLOW: a new file, never one reached through a link.
    auto log_opened = OpenPrivateFile(log, O_WRONLY | O_CREAT | O_EXCL);
    if (!log_opened.ok()) return log_opened.status().WithContext("share=node: the server's log");
    Fd log_fd(*log_opened);
    remove_log = true;
    pid_t pid = 0;
    GPUFEED_RETURN_IF_ERROR(Spawn(args, log_fd.get(), &pid));
    {
      MutexLock g(&started_mu);
      started.push_back(pid);
    }
    remove_log = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStartTimeoutMs);
    while (!Accepts(sock)) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        std::string cmd;
        for (const std::string& a : args) cmd += (cmd.empty() ? "" : " ") + a;
        return Status::Internal("share=node: the node's server (" + cmd + ") exited with " +
                                std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) +
                                ": " + Tail(log) + " (its log: " + log + ")");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        return Status::IOError("share=node: the node's server did not listen on " + sock + " within " +
                               std::to_string(kStartTimeoutMs / 1000) + " s: " + Tail(log) + " (its log: " + log + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    unmake.armed = false;
    lease->started_here_ = true;
  }
  lease->lease_fd_ = held.release();
  return lease;
}

}  // namespace gpufeed
