// The remote virtual file driver (hdf5io/hdf5/remote_vfd.h).
#include "hdf5io/hdf5/remote_vfd.h"

#include <H5FDpublic.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/mutex.h"
#include "hdf5io/io/http_file.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed::h5 {
namespace {

constexpr uint64_t kPage = 64 << 10;
constexpr uint64_t kFirstFetch = 1 << 20;  // the superblock, root group and usually the whole index
constexpr size_t kMaxPages = 1024;         // 64 MiB of metadata kept at most

thread_local std::string remote_open_error;

struct RemoteH5 {
  H5FD_t pub;  // first: HDF5 sees this struct as its H5FD_t
  std::unique_ptr<io::RemoteFile> file;
  haddr_t eoa = 0;
  Mutex mu;  // HDF5's lock serializes the calls; this keeps the cache right without it
  std::map<uint64_t, std::vector<std::byte>> pages GUARDED_BY(mu);  // page index -> bytes (short at the end)

  // Pages [first, last] fetched in one request where missing.
  // [addr, addr + size) into dst: pages kept, reads of a page or more
  // straight through (HDF5's Read, and the chunk index walk's).
  herr_t ReadInto(haddr_t addr, size_t size, std::byte* dst) EXCLUDES(mu);

  herr_t Fill(uint64_t first, uint64_t last) REQUIRES(mu) {
    const uint64_t size = file->size();
    if (pages.size() + (last - first + 1) > kMaxPages) pages.clear();
    uint64_t p = first;
    while (p <= last) {
      if (pages.count(p) != 0) {
        ++p;
        continue;
      }
      uint64_t q = p;
      while (q + 1 <= last && pages.count(q + 1) == 0) ++q;
      const uint64_t off = p * kPage;
      const uint64_t end = std::min(size, (q + 1) * kPage);
      if (off >= end) return 0;
      std::vector<std::byte> buf(end - off);
      auto got = file->Read(off, buf.data(), buf.size());
      if (!got.ok()) {
        remote_open_error = got.status().message();
        return -1;
      }
      if (*got != buf.size()) {
        remote_open_error = file->named() + ": short read of metadata at " + std::to_string(off);
        return -1;
      }
      for (uint64_t k = p; k <= q; ++k) {
        const uint64_t a = k * kPage - off;
        const uint64_t b = std::min<uint64_t>(a + kPage, buf.size());
        pages.emplace(k, std::vector<std::byte>(buf.begin() + a, buf.begin() + b));
      }
      p = q + 1;
    }
    return 0;
  }
};

H5FD_t* Open(const char* name, unsigned flags, hid_t /*fapl*/, haddr_t maxaddr) {
  remote_open_error.clear();
  if ((flags & (H5F_ACC_RDWR | H5F_ACC_CREAT | H5F_ACC_TRUNC | H5F_ACC_EXCL)) != 0) {
    remote_open_error = std::string(name) + ": objects are read-only";
    return nullptr;
  }
  if (!io::IsRemoteUrl(name)) {
    remote_open_error = std::string(name) + ": not an object URL (a remote file reaches no local file)";
    return nullptr;
  }
  auto options = io::RemoteOptions::FromEnv();
  if (!options.ok()) {
    remote_open_error = options.status().message();
    return nullptr;
  }
  auto file = io::RemoteFile::Open(name, *options);
  if (!file.ok()) {
    remote_open_error = file.status().message();
    return nullptr;
  }
  auto f = std::make_unique<RemoteH5>();
  std::memset(&f->pub, 0, sizeof(f->pub));
  f->file = std::move(*file);
  (void)maxaddr;
  {
    MutexLock lock(&f->mu);
    const uint64_t first = std::min<uint64_t>(f->file->size(), kFirstFetch);
    if (f->Fill(0, (first - 1) / kPage) < 0) return nullptr;
  }
  return &f.release()->pub;
}

herr_t Close(H5FD_t* file) {
  delete reinterpret_cast<RemoteH5*>(file);
  return 0;
}

int Cmp(const H5FD_t* a, const H5FD_t* b) {
  const auto* x = reinterpret_cast<const RemoteH5*>(a);
  const auto* y = reinterpret_cast<const RemoteH5*>(b);
  // The same object only at the same address and version: HDF5 shares an
  // open file with a later open the driver calls equal, and an object
  // replaced since (or one of the same name on another endpoint) is another
  // file.
  int c = x->file->address().compare(y->file->address());
  if (c == 0) c = x->file->version().compare(y->file->version());
  if (c == 0 && x->file->size() != y->file->size()) c = x->file->size() < y->file->size() ? -1 : 1;
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

herr_t Query(const H5FD_t* /*file*/, unsigned long* flags) {
  // Metadata accumulated and raw data sieved: HDF5 merges small reads
  // before they reach Read.
  *flags = H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t GetEoa(const H5FD_t* file, H5FD_mem_t /*type*/) { return reinterpret_cast<const RemoteH5*>(file)->eoa; }

herr_t SetEoa(H5FD_t* file, H5FD_mem_t /*type*/, haddr_t addr) {
  reinterpret_cast<RemoteH5*>(file)->eoa = addr;
  return 0;
}

haddr_t GetEof(const H5FD_t* file, H5FD_mem_t /*type*/) {
  return reinterpret_cast<const RemoteH5*>(file)->file->size();
}

herr_t GetHandle(H5FD_t* file, hid_t /*fapl*/, void** handle) {
  *handle = reinterpret_cast<RemoteH5*>(file);  // RemoteIdentityOf and RemoteBytesOf take it
  return 0;
}

herr_t Read(H5FD_t* file, H5FD_mem_t /*type*/, hid_t /*dxpl*/, haddr_t addr, size_t size, void* buffer) {
  return reinterpret_cast<RemoteH5*>(file)->ReadInto(addr, size, static_cast<std::byte*>(buffer));
}

herr_t RemoteH5::ReadInto(haddr_t addr, size_t size, std::byte* dst) {
  RemoteH5* f = this;
  const uint64_t eof = f->file->size();
  if (addr == HADDR_UNDEF || addr > eof) return -1;
  // Past the end reads as zeros (as HDF5's sec2 driver does).
  const uint64_t have = std::min<uint64_t>(size, eof - addr);
  std::memset(dst + have, 0, size - have);
  if (have == 0) return 0;
  if (have >= kPage) {
    // Raw data (the hdf5 path) or a large index block: straight through.
    MutexLock lock(&f->mu);
    // Served from the cache when every page is there (the first MiB).
    bool cached = true;
    for (uint64_t p = addr / kPage; p <= (addr + have - 1) / kPage && cached; ++p) cached = f->pages.count(p) != 0;
    if (!cached) {
      auto got = f->file->Read(addr, dst, have);
      if (!got.ok() || *got != have) {
        remote_open_error = got.ok() ? f->file->named() + ": short read" : got.status().message();
        return -1;
      }
      return 0;
    }
  }
  MutexLock lock(&f->mu);
  const uint64_t first = addr / kPage, last = (addr + have - 1) / kPage;
  if (f->Fill(first, last) < 0) return -1;
  uint64_t done = 0;
  for (uint64_t p = first; p <= last; ++p) {
    const std::vector<std::byte>& page = f->pages.at(p);
    const uint64_t from = p == first ? addr - p * kPage : 0;
    const uint64_t n = std::min<uint64_t>(page.size() - from, have - done);
    std::memcpy(dst + done, page.data() + from, n);
    done += n;
  }
  return 0;
}

herr_t Write(H5FD_t* /*file*/, H5FD_mem_t /*type*/, hid_t /*dxpl*/, haddr_t /*addr*/, size_t /*size*/,
             const void* /*buffer*/) {
  return -1;
}

H5FD_class_t MakeClass() {
  H5FD_class_t c;
  std::memset(&c, 0, sizeof(c));
  c.name = "gpufeed_remote";
  c.maxaddr = static_cast<haddr_t>(INT64_MAX);
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = Open;
  c.close = Close;
  c.cmp = Cmp;
  c.query = Query;
  c.get_eoa = GetEoa;
  c.set_eoa = SetEoa;
  c.get_eof = GetEof;
  c.get_handle = GetHandle;
  c.read = Read;
  c.write = Write;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::memcpy(c.fl_map, map, sizeof(map));
  return c;
}

// Registered once, and again after H5close (a probe child restarts HDF5).
Mutex driver_mu;
hid_t driver_id GUARDED_BY(driver_mu) = H5I_INVALID_HID;

hid_t DriverId() {
  static const H5FD_class_t kClass = MakeClass();
  MutexLock lock(&driver_mu);
  if (driver_id < 0 || H5Iis_valid(driver_id) <= 0) driver_id = H5FDregister(&kClass);
  return driver_id;
}

}  // namespace

Result<Id> FileAccessFor(const std::string& file) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.valid()) return Status::Internal("HDF5: cannot make a file access property list: " + LastErrorText());
  if (!io::IsRemoteUrl(file)) return fapl;
  const hid_t id = DriverId();
  if (id < 0 || H5Pset_driver(fapl.get(), id, nullptr) < 0) {
    return Status::Internal(io::DisplayUrl(file) + ": HDF5 refused gpufeed's remote driver: " + LastErrorText());
  }
  return fapl;
}

std::string TakeRemoteOpenError() { return std::exchange(remote_open_error, std::string()); }

namespace {

// The driver's state of `file`, or null when it is not open through it.
RemoteH5* RemoteOf(hid_t file) {
  h5::Id fapl(H5Fget_access_plist(file));
  if (!fapl.valid() || H5Pget_driver(fapl.get()) != DriverId()) return nullptr;
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, fapl.get(), &handle) < 0 || handle == nullptr) return nullptr;
  return static_cast<RemoteH5*>(handle);
}

}  // namespace

std::optional<io::FileIdentity> RemoteIdentityOf(hid_t file) {
  RemoteH5* f = RemoteOf(file);
  if (f == nullptr) return std::nullopt;
  return io::RemoteIdentity(*f->file);
}

RemoteBytes RemoteBytesOf(hid_t file) {
  RemoteH5* f = RemoteOf(file);
  if (f == nullptr) return nullptr;
  return [f](uint64_t at, uint64_t n, std::vector<uint8_t>* out) {
    const uint64_t size = f->file->size();
    if (at > size || n > size - at) return false;
    out->resize(n);
    return n == 0 || f->ReadInto(at, n, reinterpret_cast<std::byte*>(out->data())) >= 0;
  };
}

}  // namespace gpufeed::h5
