// LaunchLocalRanks (common/launch_ranks.h): posix_spawn per rank, then a
// waitpid loop that stops the job at its first failure.
#include "common/launch_ranks.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace gpufeed {

namespace {
std::vector<std::string> OwnArguments() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return args;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by ") + strsignal(WTERMSIG(status));
  return "stopped";
}
}  // namespace

Status LaunchLocalRanks(int n) {
  const std::vector<std::string> args = OwnArguments();
  if (args.empty()) return Status::Internal("launch ranks: cannot read /proc/self/cmdline");
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const std::string job =
      std::to_string(::getpid()) + "-" + std::to_string(now.tv_sec) + "." + std::to_string(now.tv_nsec);
  std::vector<pid_t> pids(size_t(n), -1);
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "LOCAL_WORLD_SIZE" ||
          key == "GPUFEED_TRAIN_JOB" || key == "TORCHELASTIC_RUN_ID")
        continue;
      env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(n));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(n));
    env.push_back("GPUFEED_TRAIN_JOB=" + job);
    std::vector<char*> argv, envp;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      stop_all(SIGTERM);
      for (pid_t p : pids)
        if (p > 0) ::waitpid(p, nullptr, 0);
      return Status::IOError("launch ranks: cannot start rank " + std::to_string(r) + ": " + std::strerror(rc));
    }
    pids[size_t(r)] = pid;
  }
  Status first = Status::Ok();
  int running = n;
  auto deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t got = ::waitpid(-1, &status, deadline == std::chrono::steady_clock::time_point::max() ? 0 : WNOHANG);
    if (got < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (got == 0) {  // stopping: escalate after the grace period
      if (std::chrono::steady_clock::now() > deadline) stop_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < n; ++r)
      if (pids[size_t(r)] == got) rank = r;
    if (rank < 0) continue;  // not one of ours
    pids[size_t(rank)] = -1;
    --running;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && first.ok()) {
      first = Status::IOError("rank " + std::to_string(rank) + " of " + std::to_string(n) + " " + Describe(status) +
                              (running > 0 ? "; the other ranks were stopped" : ""));
      stop_all(SIGTERM);
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  return first;
}

}  // namespace gpufeed
