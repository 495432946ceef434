// torchrun's environment read in one place (common/job.h).
#include "common/job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

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

Result<std::string> NodeDir() {
  for (const std::string& d : {Env("GPUFEED_NODE_DIR"), Env("XDG_RUNTIME_DIR"), Env("TMPDIR"), std::string("/tmp")}) {
    struct stat st {};
    if (!d.empty() && ::stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(d.c_str(), W_OK) == 0) return d;
  }
  return Status::IOError("no writable directory for the node's sockets and rendezvous files (set GPUFEED_NODE_DIR)");
}

}  // namespace gpufeed
