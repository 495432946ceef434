// AvailableMemoryBytes and CheckFitsInMemory (common/memory.h).
#include "common/memory.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

namespace gpufeed {
namespace {

// The first number in a one-line file ("max" and unreadable: nullopt).
bool ReadNumber(const char* path, uint64_t* out) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return false;
  try {
    *out = std::stoull(s);
  } catch (...) {
    return false;
  }
  return true;
}

uint64_t ReadAvailableMemoryBytes() {
  uint64_t avail = UINT64_MAX;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        break;
      }
    }
  }
  // cgroup v2, then v1: the room left under the limit.
  uint64_t limit = 0, usage = 0;
  if ((ReadNumber("/sys/fs/cgroup/memory.max", &limit) && ReadNumber("/sys/fs/cgroup/memory.current", &usage)) ||
      (ReadNumber("/sys/fs/cgroup/memory/memory.limit_in_bytes", &limit) &&
       ReadNumber("/sys/fs/cgroup/memory/memory.usage_in_bytes", &usage))) {
    if (limit < (uint64_t{1} << 60)) avail = std::min(avail, limit > usage ? limit - usage : 0);
  }
  return avail;
}

}  // namespace

uint64_t AvailableMemoryBytes() {
  // Read again at most every 20 ms: each Dataset open asks (twice), and the
  // five files cost about 0.1 ms, a third of opening a small HDF5 file.
  constexpr int64_t kFreshNs = 20'000'000;
  static std::atomic<int64_t> read_at{INT64_MIN};
  static std::atomic<uint64_t> value{0};
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const int64_t at = read_at.load(std::memory_order_acquire);
  if (at != INT64_MIN && now - at < kFreshNs) return value.load(std::memory_order_relaxed);
  const uint64_t v = ReadAvailableMemoryBytes();
  value.store(v, std::memory_order_relaxed);
  read_at.store(now, std::memory_order_release);
  return v;
}

std::string HumanBytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 40)) {
    std::snprintf(buf, sizeof(buf), "%.1f TiB", b / double(uint64_t{1} << 40));
  } else if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", b / double(uint64_t{1} << 30));
  } else if (bytes >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / double(uint64_t{1} << 20));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

Status CheckFitsInMemory(uint64_t bytes, std::string_view what, std::string_view hint) {
  const uint64_t avail = AvailableMemoryBytes();
  if (bytes <= avail) return Status::Ok();
  std::string m = std::string(what) + " needs " + std::to_string(bytes) + " bytes (" + HumanBytes(bytes) +
                  ") but only " + HumanBytes(avail) + " of memory is available";
  if (!hint.empty()) m += "; " + std::string(hint);
  return Status::InvalidArgument(std::move(m));
}

}  // namespace gpufeed
