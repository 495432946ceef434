// torchrun's environment read in one place, and the node's private directory
// (common/job.h).
#include "common/job.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpufeed {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

namespace {
// A count in [lo, 4096], or -1 when `v` is not one.
int Count(const std::string& v, int lo) {
  if (v.empty()) return -1;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  return *end == '\0' && n >= lo && n <= 4096 ? static_cast<int>(n) : -1;
}
}  // namespace

int LocalWorldSize() {
  const int n = Count(Env("LOCAL_WORLD_SIZE"), 1);
  return n > 0 ? n : 1;
}

Result<JobRanks> JobRanksFromEnv() {
  JobRanks r;
  const std::string rank = Env("RANK"), world = Env("WORLD_SIZE");
  if (rank.empty() && world.empty()) return r;
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("the job's environment: " + what +
                                   " (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE)");
  };
  r.world_size = Count(world, 1);
  r.rank = Count(rank, 0);
  if (r.world_size < 0) return bad("WORLD_SIZE='" + world + "' is not a count of processes");
  if (r.rank < 0 || r.rank >= r.world_size) return bad("RANK='" + rank + "' is not in [0, WORLD_SIZE=" + world + ")");
  const std::string local = Env("LOCAL_RANK"), local_world = Env("LOCAL_WORLD_SIZE");
  r.local_world_size = local_world.empty() ? r.world_size : Count(local_world, 1);
  r.local_rank = local.empty() ? r.rank : Count(local, 0);
  if (r.local_world_size < 0 || r.local_world_size > r.world_size)
    return bad("LOCAL_WORLD_SIZE='" + local_world + "' is not in [1, WORLD_SIZE=" + world + "]");
  if (r.local_rank < 0 || r.local_rank >= r.local_world_size)
    return bad("LOCAL_RANK='" + local + "' is not in [0, LOCAL_WORLD_SIZE)");
  return r;
}

std::string JobId(bool per_node) {
  if (std::string run = Env("TORCHELASTIC_RUN_ID"); !run.empty()) {
    // GROUP_RANK: the node's rank, so two agents of one job on one host
    // (simulated nodes) keep what is per node apart, as real nodes would.
    return "run=" + run + (per_node ? "/node=" + Env("GROUP_RANK") : "") +
           "/restart=" + Env("TORCHELASTIC_RESTART_COUNT");
  }
  if (std::string job = Env("GPUFEED_TRAIN_JOB"); !job.empty()) return "train=" + job;
  if (std::string addr = Env("MASTER_ADDR"), port = Env("MASTER_PORT"); !addr.empty() && !port.empty()) {
    return "master=" + addr + ":" + port;
  }
  // Ranks started by hand with LOCAL_WORLD_SIZE and nothing else: the
  // processes of one launcher share its process group.
  return "pgid=" + std::to_string(::getpgrp());
}

namespace {

// What is wrong with `dir` as a private directory ("" when nothing is):
// not a directory, a symbolic link, another owner, group or other bits.
std::string PrivateDirProblem(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::string("cannot be read: ") + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::string("cannot be opened as a directory: ") + std::strerror(errno);
  const int rc = ::fstat(fd, &st);
  ::close(fd);
  if (rc != 0) return std::string("cannot be read: ") + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  if (st.st_uid != ::geteuid()) {
    return "is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " +
           std::to_string(::geteuid());
  }
  if ((st.st_mode & 07777) != 0700) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("has mode ") + mode + ", not 0700";
  }
  return "";
}

// `dir`, created 0700 when absent (its parent must exist), then checked.
Result<std::string> PrivateDir(const std::string& dir, const std::string& why) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    ::chmod(dir.c_str(), 0700);  // the umask may have taken owner bits; the directory is ours and new
  } else if (errno != EEXIST) {
    return Status::IOError("the node's private directory " + dir + " (" + why + ") cannot be created: " +
                           std::strerror(errno) + "; set GPUFEED_NODE_DIR to a directory of yours with mode 0700");
  }
  if (std::string problem = PrivateDirProblem(dir); !problem.empty()) {
    return Status::InvalidArgument(
        "the node's private directory " + dir + " (" + why + ") " + problem +
        ": another user could plant sockets or links there. Remove it (it is made again, mode 0700, owned by "
        "you) or set GPUFEED_NODE_DIR to a directory of yours with mode 0700");
  }
  return dir;
}

bool UsableParent(const std::string& d) {
  struct stat st {};
  return !d.empty() && ::stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(d.c_str(), W_OK | X_OK) == 0;
}

}  // namespace

Result<std::string> NodeDir() {
  if (std::string d = Env("GPUFEED_NODE_DIR"); !d.empty()) return PrivateDir(d, "GPUFEED_NODE_DIR");
  if (std::string d = Env("XDG_RUNTIME_DIR"); UsableParent(d)) return PrivateDir(d + "/gpufeed", "in XDG_RUNTIME_DIR");
  const std::string name = "gpufeed-" + std::to_string(::geteuid());
  if (std::string d = Env("TMPDIR"); UsableParent(d)) return PrivateDir(d + "/" + name, "in TMPDIR");
  if (UsableParent("/tmp")) return PrivateDir("/tmp/" + name, "in /tmp");
  return Status::IOError(
      "no writable directory for the node's sockets and rendezvous files (XDG_RUNTIME_DIR, TMPDIR and /tmp "
      "are not); set GPUFEED_NODE_DIR to a directory of yours with mode 0700");
}

Result<int> OpenPrivateFile(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::IOError(path + ": " + std::strerror(errno) +
                           (errno == ELOOP ? " (a symbolic link where a private file belongs; remove it)" : ""));
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = std::string("cannot be read: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem =
        "is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " + std::to_string(::geteuid());
  } else if ((st.st_mode & 077) != 0) {
    problem = "can be read or written by other users";
  }
  if (!problem.empty()) {
    ::close(fd);
    return Status::InvalidArgument(path + " " + problem + "; remove it");
  }
  return fd;
}

}  // namespace gpufeed
