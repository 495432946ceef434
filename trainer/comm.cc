// The ranks' rendezvous (trainer/comm.h): rank 0 writes what the others need
// (NCCL's unique id, the shared-memory segment's name) to one file every rank
// names alike; the others wait for it.
#include "trainer/comm.h"

#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/job.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed::trainer {

namespace {
constexpr char kMagic[] = "gpufeed-rendezvous 1";
constexpr uint64_t kMaxRendezvousBytes = 1 << 20;  // far above any payload (an id of a few hundred bytes)
}  // namespace

Result<std::string> RendezvousPrefix(int world_size, int local_world_size) {
  std::string dir = Env("GPUFEED_RENDEZVOUS_DIR");
  std::string key;
  if (world_size > local_world_size) {
    if (dir.empty()) {
      return Status::InvalidArgument(
          "train: " + std::to_string(world_size) + " ranks, " + std::to_string(local_world_size) +
          " on this host: ranks on several hosts meet through a directory all of them see; set "
          "GPUFEED_RENDEZVOUS_DIR to one (a shared file system)");
    }
    key = JobId(false);
  } else {
    if (dir.empty()) {
      auto node = NodeDir();
      if (!node.ok()) return node.status().WithContext("train");
      dir = *node;
    }
    // The launcher's pid too: torchrun's default run id ("none") and port
    // repeat from one job to the next, and a crashed job may leave its file.
    key = JobId(false) + "/launcher=" + std::to_string(::getppid());
  }
  key += "/world=" + std::to_string(world_size);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return dir + "/gpufeed-train-" + hash;
}

Result<std::string> Rendezvous(const CommOptions& o, const std::string& payload) {
  const std::string path = o.prefix + ".id";
  if (o.rank == 0) {
    std::ostringstream s;
    s << kMagic << '\n' << o.world_size << '\n' << payload.size() << '\n' << payload;
    GPUFEED_RETURN_IF_ERROR(AtomicFile::WriteWhole(path, s.str()).WithContext("train: rendezvous"));
    return payload;
  }
  const double deadline = NowSeconds() + o.timeout_s;
  for (int i = 0;; ++i) {
    // Read whole through io (hdf5io/io/read_file.h), bounded: the payload is
    // a communicator's id (a few hundred bytes), and a file far larger is
    // not rank 0's. A file not (yet) there, or not complete, is waited for.
    std::string file;
    if (io::ReadWholeFile(path, &file, kMaxRendezvousBytes).ok()) {
      std::istringstream in(file);
      std::string magic;
      int world = 0;
      size_t n = 0;
      std::getline(in, magic);
      in >> world >> n;
      in.get();
      const auto at = in.tellg();
      if (magic == kMagic && in && at >= 0 && n <= file.size() - static_cast<size_t>(at)) {
        if (world != o.world_size) {
          return Status::InvalidArgument("train: rendezvous " + path + " is for " + std::to_string(world) +
                                         " ranks, this rank was started for " + std::to_string(o.world_size));
        }
        return file.substr(static_cast<size_t>(at), n);
      }
    }
    if (NowSeconds() > deadline) {
      return Status::IOError("train: rank " + std::to_string(o.rank) + " waited " + std::to_string(int(o.timeout_s)) +
                             " s for rank 0's rendezvous file " + path +
                             "; is rank 0 running (same job, same WORLD_SIZE)?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(i < 100 ? 5 : 50));
  }
}

void RendezvousDone(const CommOptions& o) {
  if (o.rank == 0) ::unlink((o.prefix + ".id").c_str());
}

}  // namespace gpufeed::trainer
