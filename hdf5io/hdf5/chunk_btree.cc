// The version 1 B-tree chunk index read in one pass (hdf5io/hdf5/chunk_btree.h).
// Formats: the HDF5 File Format Specification, version 3.0: object header
// prefixes (IV.A.1.a version 1, IV.A.1.b version 2), the layout message
// (IV.A.2.i) and version 1 B-tree nodes (III.A.1).
#include "hdf5io/hdf5/chunk_btree.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <unordered_set>

#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/remote_vfd.h"
#include "hdf5io/io/object_store.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed::h5 {
namespace {

constexpr uint16_t kLayoutMessage = 0x0008;
constexpr uint16_t kContinuationMessage = 0x0010;
constexpr int kMaxHeaderBlocks = 256;  // continuation blocks of one object header
constexpr uint64_t kMaxHeaderBlockBytes = 1 << 20;
constexpr int kMaxLevels = 48;  // a B-tree of 2^48 leaves is not a dataset's

// The file's bytes through io (hdf5io/io/read_file.h), bounded by its size;
// little-endian fields.
class FileBytes {
 public:
  FileBytes(const io::ReadOnlyFile& file, uint64_t base) : file_(file), size_(file.size()), base_(base) {}
  // Bytes [base + rel, base + rel + n) into out, false past the end.
  bool Read(uint64_t rel, uint64_t n, std::vector<uint8_t>* out) const {
    if (rel > size_ || base_ > size_ - rel || n > size_ - base_ - rel) return false;
    out->resize(n);
    return file_.ReadExactly(base_ + rel, std::as_writable_bytes(std::span(*out))).ok();
  }

 private:
  const io::ReadOnlyFile& file_;
  uint64_t size_, base_;
};

uint64_t Le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t k = 0; k < n; ++k) v |= uint64_t(p[k]) << (8 * k);
  return v;
}

bool Undefined(uint64_t addr, size_t width) {
  return width >= 8 ? addr == UINT64_MAX : addr == (1ull << (8 * width)) - 1;
}

// The layout message's chunk index: the B-tree's address and the
// dimensionality of its keys (the dataset's rank + 1).
struct Layout {
  uint64_t btree = 0;
  int dims = 0;
};

// The layout message of the object header at `header` (relative address).
Result<Layout> FindLayout(const ReadBytes& read, uint64_t header, size_t sa, size_t ss, const std::string& what) {
  const auto unsupported = [&](const std::string& why) {
    return Status::Unsupported(what + ": " + why + "; the chunk index is read through HDF5");
  };
  const auto corrupt = [&](const std::string& why) {
    return Status::Corrupt(what + ": object header at byte " + std::to_string(header) + ": " + why);
  };
  std::vector<uint8_t> b;
  if (!read(header, 16, &b)) return corrupt("outside the file");
  struct Block {
    uint64_t at, len;
  };
  std::vector<Block> blocks;
  int version = 0;
  bool creation_order = false;
  if (std::memcmp(b.data(), "OHDR", 4) == 0) {
    version = 2;
    if (b[4] != 2) return unsupported("object header version " + std::to_string(b[4]));
    const uint8_t flags = b[5];
    creation_order = (flags & 0x04) != 0;
    uint64_t pos = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
    const size_t width = size_t{1} << (flags & 3);
    if (!read(header + pos, width, &b)) return corrupt("outside the file");
    blocks.push_back({header + pos + width, Le(b.data(), width)});
  } else if (b[0] == 1) {
    version = 1;
    blocks.push_back({header + 16, Le(b.data() + 8, 4)});
  } else {
    return unsupported("object header version " + std::to_string(b[0]));
  }
  const size_t msg_header = version == 1 ? 8 : 4 + (creation_order ? 2 : 0);
  for (size_t k = 0; k < blocks.size(); ++k) {
    if (k >= kMaxHeaderBlocks) return corrupt("more than " + std::to_string(kMaxHeaderBlocks) + " continuation blocks");
    const Block blk = blocks[k];
    if (blk.len > kMaxHeaderBlockBytes) return corrupt("a block of " + std::to_string(blk.len) + " bytes");
    if (!read(blk.at, blk.len, &b)) return corrupt("a block outside the file");
    uint64_t pos = 0;
    while (pos + msg_header <= blk.len) {
      const uint8_t* m = b.data() + pos;
      const uint16_t type = version == 1 ? uint16_t(Le(m, 2)) : m[0];
      const uint64_t size = version == 1 ? Le(m + 2, 2) : Le(m + 1, 2);
      const uint64_t data = pos + msg_header;
      if (size > blk.len - data) return corrupt("a message past its block");
      const uint8_t* d = b.data() + data;
      if (type == kContinuationMessage) {
        if (size < sa + ss) return corrupt("a short continuation message");
        uint64_t at = Le(d, sa), len = Le(d + sa, ss);
        if (version == 2) {  // "OCHK", the messages, a checksum
          if (len < 8) return corrupt("a continuation block of " + std::to_string(len) + " bytes");
          at += 4;
          len -= 8;
        }
        blocks.push_back({at, len});
      } else if (type == kLayoutMessage) {
        if (size < 2) return corrupt("a short layout message");
        const uint8_t v = d[0];
        Layout out;
        uint64_t dims_at = 0;
        if (v == 3) {
          if (d[1] != 2) return unsupported("not chunked storage");
          if (size < 3 + sa) return corrupt("a short layout message");
          out.dims = d[2];
          out.btree = Le(d + 3, sa);
          dims_at = 3 + sa;
        } else if (v == 1 || v == 2) {
          if (size < 8 + sa) return corrupt("a short layout message");
          if (d[2] != 2) return unsupported("not chunked storage");
          out.dims = d[1];
          out.btree = Le(d + 8, sa);
          dims_at = 8 + sa;
        } else {
          return unsupported("layout message version " + std::to_string(v) +
                             " (the latest file format: an array or version 2 B-tree index)");
        }
        if (out.dims < 2 || out.dims > H5S_MAX_RANK + 1 || dims_at + 4ull * out.dims > size) {
          return corrupt("a chunked layout of dimensionality " + std::to_string(out.dims));
        }
        if (Undefined(out.btree, sa)) return unsupported("no chunk allocated");
        return out;
      }
      pos = data + size;
    }
  }
  return corrupt("no layout message");
}

}  // namespace

Result<std::vector<ChunkKey>> WalkChunkBTree(hid_t dset, const std::string& path, uint64_t base, uint64_t max_entries,
                                             const std::string& what) {
  H5O_info_t oi{};
  if (H5Oget_info2(dset, &oi, H5O_INFO_BASIC) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Unsupported(what + ": no object header address");
  }
  size_t sa = 0, ss = 0;
  {
    Id file_id(H5Iget_file_id(dset));
    Id fcpl(file_id.valid() ? H5Fget_create_plist(file_id.get()) : H5I_INVALID_HID);
    if (!fcpl.valid() || H5Pget_sizes(fcpl.get(), &sa, &ss) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return Status::Unsupported(what + ": the file's address sizes unknown");
    }
  }
  if (sa < 2 || sa > 8 || ss < 2 || ss > 8) return Status::Unsupported(what + ": addresses of " + std::to_string(sa));
  if (io::IsRemoteUrl(path)) {
    // An object: its bytes through the remote driver's page cache (the
    // first MiB, read at open, usually holds the whole index).
    Id file_id(H5Iget_file_id(dset));
    const RemoteBytes remote = file_id.valid() ? RemoteBytesOf(file_id.get()) : nullptr;
    if (!remote) return Status::Unsupported(what + ": not open through gpufeed's remote driver");
    const ReadBytes read = [&remote, base](uint64_t at, uint64_t n, std::vector<uint8_t>* out) {
      return at <= UINT64_MAX - base && remote(base + at, n, out);
    };
    return WalkChunkBTreeAt(read, oi.addr, sa, ss, max_entries, what);
  }
  auto opened = io::ReadOnlyFile::Open(path);
  if (!opened.ok()) return Status::Unsupported(what + ": " + opened.status().message());
  const FileBytes file(*opened, base);

  const ReadBytes read = [&file](uint64_t at, uint64_t n, std::vector<uint8_t>* out) { return file.Read(at, n, out); };
  return WalkChunkBTreeAt(read, oi.addr, sa, ss, max_entries, what);
}

Result<std::vector<ChunkKey>> WalkChunkBTreeAt(const ReadBytes& read, uint64_t header, size_t sa, size_t ss,
                                               uint64_t max_entries, const std::string& what) {
  if (sa < 2 || sa > 8 || ss < 2 || ss > 8) return Status::Unsupported(what + ": addresses of " + std::to_string(sa));
  auto layout = FindLayout(read, header, sa, ss, what);
  if (!layout.ok()) return layout.status();
  const int dims = layout->dims;  // the rank + 1 (the element's size)
  const uint64_t key_bytes = 8 + 8ull * dims;
  const uint64_t node_header = 8 + 2 * sa;
  const auto corrupt = [&](uint64_t node, const std::string& why) {
    return Status::Corrupt(what + ": chunk index node at byte " + std::to_string(node) + ": " + why +
                           " (a damaged chunk index)");
  };

  std::vector<ChunkKey> out;
  std::unordered_set<uint64_t> visited;
  struct Pending {
    uint64_t addr;
    int level;  // -1: the root, whatever its level
  };
  // Depth-first in key order: children pushed last to first.
  std::vector<Pending> stack{{layout->btree, -1}};
  std::vector<uint8_t> b;
  while (!stack.empty()) {
    const Pending p = stack.back();
    stack.pop_back();
    if (!visited.insert(p.addr).second) return corrupt(p.addr, "reached twice");
    if (p.addr > UINT64_MAX - node_header) return corrupt(p.addr, "outside the file");
    if (visited.size() > 2 * max_entries + 2) return corrupt(p.addr, "more nodes than the index has chunks");
    if (!read(p.addr, node_header, &b)) return corrupt(p.addr, "outside the file");
    if (std::memcmp(b.data(), "TREE", 4) != 0) return corrupt(p.addr, "no B-tree node signature");
    if (b[4] != 1) return corrupt(p.addr, "a node of type " + std::to_string(b[4]) + ", not raw data chunks");
    const int level = b[5];
    const uint64_t entries = Le(b.data() + 6, 2);
    if (level > kMaxLevels || (p.level >= 0 && level != p.level)) {
      return corrupt(p.addr, "level " + std::to_string(level) + " where " + std::to_string(p.level) + " belongs");
    }
    if (!read(p.addr + node_header, entries * (key_bytes + sa) + key_bytes, &b)) {
      return corrupt(p.addr, std::to_string(entries) + " entries outside the file");
    }
    if (level == 0 && out.size() + entries > max_entries) {
      return corrupt(p.addr, "more than the " + std::to_string(max_entries) + " chunks the index counts");
    }
    const size_t first_child = stack.size();
    for (uint64_t i = 0; i < entries; ++i) {
      const uint8_t* key = b.data() + i * (key_bytes + sa);
      const uint64_t child = Le(key + key_bytes, sa);
      if (level > 0) {
        stack.push_back({child, level - 1});
        continue;
      }
      ChunkKey k;
      k.size = Le(key, 4);
      k.mask = static_cast<uint32_t>(Le(key + 4, 4));
      k.offset.resize(static_cast<size_t>(dims - 1));
      for (int a = 0; a < dims - 1; ++a) k.offset[static_cast<size_t>(a)] = Le(key + 8 + 8ull * a, 8);
      k.addr = child;
      out.push_back(std::move(k));
    }
    std::reverse(stack.begin() + static_cast<std::ptrdiff_t>(first_child), stack.end());
  }
  return out;
}

}  // namespace gpufeed::h5
