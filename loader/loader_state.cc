// LoaderState's codec (magic + version) and the order names of loader.h.
#include <cstring>
#include <string>

#include "gpufeed/loader.h"

#include "common/memory.h"

namespace gpufeed {

std::string_view OrderName(Order o) {
  switch (o) {
    case Order::kSequential:
      return "sequential";
    case Order::kRandom:
      return "random";
    case Order::kBlock:
      return "block";
  }
  return "?";
}

uint64_t AutoCacheBytes() {
  const uint64_t avail = AvailableMemoryBytes();
  return avail == UINT64_MAX ? uint64_t{1} << 30 : avail / 2;
}

Result<Order> OrderFromName(std::string_view name) {
  if (name == "sequential") return Order::kSequential;
  if (name == "random") return Order::kRandom;
  if (name == "block") return Order::kBlock;
  return Status::InvalidArgument("unknown order '" + std::string(name) + "' (expected sequential, random or block)");
}

// ---------------------------------------------------------------------------
// LoaderState

namespace {
constexpr char kStateMagic[8] = {'G', 'P', 'F', 'D', 'L', 'S', 'T', 'A'};
constexpr uint32_t kStateVersion = 1;

void PutU64(std::string& s, uint64_t v) {
  for (int k = 0; k < 8; ++k) s += static_cast<char>((v >> (8 * k)) & 0xff);
}
uint64_t GetU64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= uint64_t(uint8_t(s[at + k])) << (8 * k);
  return v;
}
}  // namespace

std::string LoaderState::Serialize() const {
  std::string s(kStateMagic, 8);
  for (int k = 0; k < 4; ++k) s += static_cast<char>((kStateVersion >> (8 * k)) & 0xff);
  PutU64(s, seed);
  PutU64(s, epoch);
  PutU64(s, next_batch);
  return s;
}

Result<LoaderState> LoaderState::Deserialize(std::string_view bytes) {
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kStateMagic, 8) != 0) {
    return Status::Corrupt("loader state: bad magic (not a gpufeed loader state)");
  }
  uint32_t version = 0;
  for (int k = 0; k < 4; ++k) version |= uint32_t(uint8_t(bytes[8 + k])) << (8 * k);
  if (version != kStateVersion) {
    return Status::Unsupported("loader state: version " + std::to_string(version) + ", this build reads " +
                               std::to_string(kStateVersion));
  }
  if (bytes.size() != 12 + 24) return Status::Corrupt("loader state: wrong length " + std::to_string(bytes.size()));
  LoaderState s;
  s.seed = GetU64(bytes, 12);
  s.epoch = GetU64(bytes, 20);
  s.next_batch = GetU64(bytes, 28);
  return s;
}

}  // namespace gpufeed
