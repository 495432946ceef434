// LoaderState's codec (magic + version) and the order names of loader.h.
#include <cstring>
#include <string>

#include "gpufeed/loader.h"

#include "common/memory.h"

namespace gpufeed {

uint64_t AutoCacheBytes() {
  const uint64_t avail = AvailableMemoryBytes();
  return avail == UINT64_MAX ? uint64_t{1} << 30 : avail / 2;
}

// ---------------------------------------------------------------------------
// LoaderState

namespace {
constexpr char kStateMagic[8] = {'G', 'P', 'F', 'D', 'L', 'S', 'T', 'A'};
// 2: the shard fields (world size, share, received, base); 3: the run's
// order (1 + Order, 0: unknown), shuffle window and dataset size.
constexpr uint32_t kStateVersion = 3;
constexpr size_t kFields[] = {0, 3, 10, 13};  // u64 fields after the header, by version

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
  const uint64_t order_code = order ? static_cast<uint64_t>(*order) + 1 : 0;
  for (uint64_t v : {seed, epoch, next_batch, uint64_t{world_size}, share, consumed, base.epoch,
                     uint64_t{base.world_size}, base.share, base.consumed, order_code, shuffle_window, num_samples}) {
    PutU64(s, v);
  }
  return s;
}

Result<LoaderState> LoaderState::Deserialize(std::string_view bytes) {
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kStateMagic, 8) != 0) {
    return Status::Corrupt("loader state: bad magic (not a gpufeed loader state)");
  }
  uint32_t version = 0;
  for (int k = 0; k < 4; ++k) version |= uint32_t(uint8_t(bytes[8 + k])) << (8 * k);
  if (version < 1 || version > kStateVersion) {
    return Status::Unsupported("loader state: version " + std::to_string(version) + ", this build reads 1 to " +
                               std::to_string(kStateVersion));
  }
  const size_t want = 12 + 8 * kFields[version];
  if (bytes.size() != want) return Status::Corrupt("loader state: wrong length " + std::to_string(bytes.size()));
  LoaderState s;
  s.seed = GetU64(bytes, 12);
  s.epoch = GetU64(bytes, 20);
  s.next_batch = GetU64(bytes, 28);
  if (version == 1) return s;  // no shard fields: resumes at the same world size
  const uint64_t world = GetU64(bytes, 36), base_world = GetU64(bytes, 68);
  s.share = GetU64(bytes, 44);
  s.consumed = GetU64(bytes, 52);
  s.base.epoch = GetU64(bytes, 60);
  s.base.share = GetU64(bytes, 76);
  s.base.consumed = GetU64(bytes, 84);
  if (world > (1u << 24) || base_world > (1u << 24) || s.consumed > s.share || s.base.consumed > s.base.share) {
    return Status::Corrupt("loader state: shard fields out of range (world size " + std::to_string(world) + ", " +
                           std::to_string(s.consumed) + " of " + std::to_string(s.share) + " samples received)");
  }
  s.world_size = static_cast<uint32_t>(world);
  s.base.world_size = static_cast<uint32_t>(base_world);
  if (version == 2) return s;  // no order or dataset size: not checked at resume
  const uint64_t order_code = GetU64(bytes, 92);
  if (order_code > static_cast<uint64_t>(Order::kBlock) + 1) {
    return Status::Corrupt("loader state: order code " + std::to_string(order_code) + " out of range");
  }
  if (order_code > 0) s.order = static_cast<Order>(order_code - 1);
  s.shuffle_window = GetU64(bytes, 100);
  s.num_samples = GetU64(bytes, 108);
  return s;
}

}  // namespace gpufeed
