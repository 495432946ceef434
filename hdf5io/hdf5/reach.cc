// Reach (hdf5io/hdf5/reach.h): the directories a file's references may resolve
// under, and the check of a dataset's external raw-data files, virtual
// sources and external link against them.
#include "hdf5io/hdf5/reach.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/virtual.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed::h5 {
namespace {

namespace fs = std::filesystem;

// HDF5 keeps an external file's name in the object header; longer than this
// is no path (PATH_MAX is 4096).
constexpr size_t kMaxNameBytes = 1 << 16;

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

// The path `p` resolves to: its real path; for a path where nothing is, its
// existing directories resolved and the rest taken as written (what open(2)
// would reach once it is made); "" for a symbolic link whose target is
// missing (it would reach wherever that target is made) or a path that does
// not resolve.
std::string Resolve(const std::string& p) {
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  if (ec) return std::string();
  if (std::string real = RealPath(abs.string()); !real.empty()) return real;
  struct stat st;
  if (::lstat(abs.c_str(), &st) == 0) return std::string();  // a dangling link, or a loop
  const fs::path weak = fs::weakly_canonical(abs, ec);
  return ec ? std::string() : weak.lexically_normal().string();
}

bool Under(const std::string& path, const std::string& dir) {
  if (dir == "/") return !path.empty() && path[0] == '/';
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

void AddDir(std::vector<std::string>* dirs, const std::string& dir) {
  if (dir.empty()) return;
  std::string real = RealPath(dir);
  if (real.empty()) return;
  for (const std::string& d : *dirs) {
    if (d == real) return;
  }
  dirs->push_back(std::move(real));
}

// The name of the file holding `obj` as HDF5 opened it; "" when unknown.
std::string HolderName(hid_t obj) {
  const ssize_t n = H5Fget_name(obj, nullptr, 0);
  if (n <= 0) return std::string();
  std::string s(static_cast<size_t>(n) + 1, '\0');
  if (H5Fget_name(obj, s.data(), s.size()) < 0) return std::string();
  s.resize(static_cast<size_t>(n));
  return s;
}

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

Reach::Reach(const std::string& file, const OpenOptions& options) : file_(file) {
  std::error_code ec;
  const fs::path abs = fs::absolute(file, ec);
  if (!ec) AddDir(&dirs_, abs.parent_path().string());
  if (std::string real = RealPath(file); !real.empty()) AddDir(&dirs_, fs::path(real).parent_path().string());
  for (const std::string& d : options.allow_paths) AddDir(&dirs_, d);
  if (const char* env = std::getenv("GPUFEED_ALLOW_PATHS"); env != nullptr) {
    std::string_view list(env);
    while (!list.empty()) {
      const size_t colon = list.find(':');
      AddDir(&dirs_, std::string(list.substr(0, colon)));
      list = colon == std::string_view::npos ? std::string_view() : list.substr(colon + 1);
    }
  }
}

Status Reach::Check(const std::string& target, const std::string& name, const std::string& kind,
                    const std::string& what) const {
  const std::string real = Resolve(target);
  if (!real.empty()) {
    for (const std::string& d : dirs_) {
      if (Under(real, d)) return Status::Ok();
    }
  }
  std::string where;
  for (const std::string& d : dirs_) where += (where.empty() ? "" : ", ") + d;
  std::error_code ec;
  const std::string resolved = real.empty() ? fs::absolute(target, ec).string() +
                                                  " (a symbolic link to nothing, or a path that does not resolve)"
                                            : real;
  return Status::InvalidArgument(
      what + ": " + kind + " '" + name + "' resolves to " + resolved + ", outside " +
      (where.empty() ? std::string("the dataset's directory") : where) +
      "; a file reaches only files under its own directory and the allowed paths. If you trust this file, allow "
      "the directory that holds it: allow_paths (CLI --allow-paths DIR, Python allow_paths=[DIR], C API "
      "gpufeed_options_set(o, \"allow_paths\", \"DIR\"), or the environment GPUFEED_ALLOW_PATHS=DIR:DIR)");
}

Status Reach::CheckDataset(hid_t dset, const std::string& what) const {
  const std::string holder = HolderName(dset);
  if (io::IsRemoteUrl(file_)) {
    // An object reaches nothing beside itself: not a local file (a path in
    // it would be this machine's), not another object.
    auto refuse = [&](const std::string& kind) {
      return Status::InvalidArgument(what + ": " + kind +
                                     "; a remote object is read alone (it reaches no other "
                                     "file or object): copy the data into it");
    };
    if (!holder.empty() && holder != file_) return refuse("reached through an external link to " + holder);
    Id dcpl(H5Dget_create_plist(dset));
    if (!dcpl.valid()) return Status::Corrupt(what + ": unreadable creation properties: " + LastErrorText());
    if (H5Pget_external_count(dcpl.get()) != 0) return refuse("its raw data is in external files");
    if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) return refuse("a virtual dataset (its sources are other files)");
    return Status::Ok();
  }
  if (!holder.empty() && !SameFile(holder, file_)) {
    GPUFEED_RETURN_IF_ERROR(Check(holder, holder, "the file an external link leads to", what));
  }
  Id dcpl(H5Dget_create_plist(dset));
  if (!dcpl.valid()) return Status::Corrupt(what + ": unreadable creation properties: " + LastErrorText());
  const int externals = H5Pget_external_count(dcpl.get());
  if (externals < 0) return Status::Corrupt(what + ": unreadable external file list: " + LastErrorText());
  const std::string origin = fs::absolute(holder.empty() ? file_ : holder).parent_path().string();
  for (int i = 0; i < externals; ++i) {
    std::string name(kMaxNameBytes + 1, '\0');
    off_t offset = 0;
    hsize_t size = 0;
    if (H5Pget_external(dcpl.get(), static_cast<unsigned>(i), kMaxNameBytes, name.data(), &offset, &size) < 0) {
      return Status::Corrupt(what + ": unreadable external file " + std::to_string(i) + ": " + LastErrorText());
    }
    if (name[kMaxNameBytes - 1] != '\0') {
      return Status::Corrupt(what + ": external file " + std::to_string(i) + " has a name over " +
                             std::to_string(kMaxNameBytes) + " bytes");
    }
    name.resize(name.find('\0'));
    const std::string kind = "external raw-data file";
    if (!name.empty() && name[0] == '/') {
      GPUFEED_RETURN_IF_ERROR(Check(name, name, kind, what));
      continue;
    }
    // Where HDF5 opens it: under HDF5_EXTFILE_PREFIX, which it reads once,
    // at its start (read here at gpufeed's first check, as near to that as
    // gpufeed gets); else relative to the working directory.
    static const std::string env_prefix = [] {
      const char* e = std::getenv("HDF5_EXTFILE_PREFIX");
      return std::string(e != nullptr ? e : "");
    }();
    std::string target = name;
    if (!env_prefix.empty() && env_prefix != ".") {
      std::string prefix = env_prefix;
      if (prefix.rfind("${ORIGIN}", 0) == 0) prefix.replace(0, 9, origin);
      target = prefix + "/" + name;
    }
    GPUFEED_RETURN_IF_ERROR(Check(target, name, kind, what));
  }
  if (H5Pget_layout(dcpl.get()) != H5D_VIRTUAL) return Status::Ok();
  size_t mappings = 0;
  if (H5Pget_virtual_count(dcpl.get(), &mappings) < 0) {
    return Status::Corrupt(what + ": the virtual dataset's mappings are unreadable: " + LastErrorText());
  }
  for (size_t i = 0; i < mappings; ++i) {
    const ssize_t n = H5Pget_virtual_filename(dcpl.get(), i, nullptr, 0);
    if (n < 0 || static_cast<size_t>(n) > kMaxNameBytes) {
      return Status::Corrupt(what + ": mapping " + std::to_string(i) + ": unreadable source name: " + LastErrorText());
    }
    std::string raw(static_cast<size_t>(n) + 1, '\0');
    if (H5Pget_virtual_filename(dcpl.get(), i, raw.data(), raw.size()) < 0) {
      return Status::Corrupt(what + ": mapping " + std::to_string(i) + ": unreadable source name: " + LastErrorText());
    }
    raw.resize(static_cast<size_t>(n));
    if (raw == ".") continue;
    std::string name;  // as HDF5 expands it: "%%" is '%'
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] == '%' && k + 1 < raw.size() && raw[k + 1] == 'b') {
        // One file per block, named at read time: not a path to judge here.
        return Status::Unsupported(what + ": mapping " + std::to_string(i) + ": the source name '" + raw +
                                   "' is printf-style (%b: one source per block of an unlimited mapping)");
      }
      name += raw[k];
      if (raw[k] == '%' && k + 1 < raw.size() && raw[k + 1] == '%') ++k;
    }
    // HDF5 opens the first candidate that is an HDF5 file: each one up to
    // it is judged before its first bytes are looked at. None there: nothing
    // to reach (the virtual dataset's own checks say it is missing).
    for (const std::string& c : VirtualSourceCandidates(name, holder.empty() ? file_ : holder)) {
      struct stat st;
      if (::stat(c.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      GPUFEED_RETURN_IF_ERROR(Check(c, raw, "virtual dataset source file", what));
      const htri_t is_hdf5 = H5Fis_hdf5(c.c_str());
      H5Eclear2(H5E_DEFAULT);
      if (is_hdf5 > 0) break;
    }
  }
  return Status::Ok();
}

}  // namespace gpufeed::h5
