// Where statistics live (gpufeed/stats.h): mean/std attributes written into
// a copy of the file that replaces it atomically, or a JSON sidecar beside a
// file that is not writable; and the sidecar's reader, for Dataset::Open.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "gpufeed/stats.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/io/read_file.h"

namespace gpufeed {
namespace {

constexpr int kSidecarVersion = 1;
constexpr uint64_t kMaxSidecarBytes = 16u << 20;  // far above any real one (a few KB a field)
constexpr size_t kMaxChannels = 1u << 16;

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

Status StoreAttributes(const std::string& file, const struct stat& st, const std::vector<FieldStats>& stats) {
  AtomicFile out(file);
  // A copy made through io (hdf5io/io/read_file.h): a reflink where it can.
  if (Status copied = io::CopyFile(file, out.tmp_path(), st.st_mode); !copied.ok()) {
    return copied.WithContext("--store writes a copy of the file (--store sidecar writes none)");
  }
  if (::geteuid() == 0) (void)::chown(out.tmp_path().c_str(), st.st_uid, st.st_gid);  // keep the owner
  h5::QuietErrors();
  {
    h5::Id f(H5Fopen(out.tmp_path().c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    if (!f.valid()) return Status::IOError(file + ": cannot open its copy for writing: " + h5::LastErrorText());
    for (const FieldStats& s : stats) {
      if (s.path.empty() || s.channels.empty()) continue;
      h5::Id d(H5Dopen2(f.get(), s.path.c_str(), H5P_DEFAULT));
      if (!d.valid()) return Status::NotFound(file + ":" + s.path + ": no such dataset: " + h5::LastErrorText());
      Status w = h5::WriteDoubleArrayAttr(d.get(), "mean", s.means());
      if (w.ok()) w = h5::WriteDoubleArrayAttr(d.get(), "std", s.stddevs());
      if (!w.ok()) return w.WithContext(file + ":" + s.path);
    }
    if (H5Fclose(f.Release()) < 0) return Status::IOError(file + ": closing its copy: " + h5::LastErrorText());
  }
  return out.Commit();
}

nlohmann::json FieldJson(const FieldStats& s) {
  nlohmann::json j = {{"name", s.name}, {"channel_axis", s.channel_axis}, {"samples", s.samples}};
  std::vector<double> mean, sd, mn, mx;
  std::vector<uint64_t> count, nan, inf;
  for (const ChannelStats& c : s.channels) {
    mean.push_back(c.mean);
    sd.push_back(c.stddev);
    mn.push_back(c.min);
    mx.push_back(c.max);
    count.push_back(c.count);
    nan.push_back(c.nan);
    inf.push_back(c.inf);
  }
  j["mean"] = mean;
  j["std"] = sd;
  j["min"] = mn;
  j["max"] = mx;
  j["count"] = count;
  j["nan"] = nan;
  j["inf"] = inf;
  return j;
}

// The sidecar's JSON when it is well-formed, this version, and recorded for
// the file as it is now (size, mtime); null otherwise, with *why set when a
// sidecar is there but was not taken.
nlohmann::json ReadSidecar(const std::string& file, std::string* why = nullptr) {
  struct stat fst {
  }, sst{};
  const std::string side = StatsSidecarPath(file);
  if (::stat(file.c_str(), &fst) != 0 || ::stat(side.c_str(), &sst) != 0) return nullptr;
  auto refuse = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return nullptr;
  };
  if (!S_ISREG(sst.st_mode)) return refuse("not a regular file");
  if (static_cast<uint64_t>(sst.st_size) > kMaxSidecarBytes) {
    return refuse("larger than " + std::to_string(kMaxSidecarBytes) + " bytes");
  }
  std::string text;  // read whole through io (hdf5io/io/read_file.h), its size bounded
  if (!io::ReadWholeFile(side, &text, kMaxSidecarBytes).ok()) return refuse("unreadable");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  try {
    if (!j.is_object()) return refuse("not a JSON object");
    if (j.value("gpufeed_stats", 0) != kSidecarVersion)
      return refuse("not a gpufeed_stats version " + std::to_string(kSidecarVersion) + " sidecar");
    if (!j.at("datasets").is_object()) return refuse("its datasets are not an object");
    if (j.at("file_size").get<int64_t>() != static_cast<int64_t>(fst.st_size) ||
        j.at("file_mtime_ns").get<int64_t>() != MtimeNs(fst)) {
      return refuse("recorded for another version of the file (its size or modification time differ)");
    }
  } catch (const std::exception&) {
    return refuse("malformed (a field is missing or of the wrong type)");
  }
  return j;
}

}  // namespace

std::vector<double> FieldStats::means() const {
  std::vector<double> v;
  for (const ChannelStats& c : channels) v.push_back(c.mean);
  return v;
}

std::vector<double> FieldStats::stddevs() const {
  std::vector<double> v;
  for (const ChannelStats& c : channels) v.push_back(c.stddev);
  return v;
}

std::string StatsSidecarPath(const std::string& file) { return file + ".gpufeed-stats.json"; }

Result<std::string> StoreStats(const std::string& file, const std::vector<FieldStats>& stats, StoreMode mode) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return Status::NotFound(file + ": cannot stat: " + std::strerror(errno));
  const std::string dir = DirOf(file);
  const bool dir_writable = ::access(dir.c_str(), W_OK) == 0;
  // A file without write bits is read-only to us even where access() would
  // let root write it: chmod 0444 says "do not modify".
  const bool file_writable = ::access(file.c_str(), W_OK) == 0 && (st.st_mode & 0222) != 0;
  if (mode == StoreMode::kAuto) mode = file_writable && dir_writable ? StoreMode::kAttributes : StoreMode::kSidecar;
  if (mode == StoreMode::kAttributes) {
    if (!file_writable || !dir_writable) {
      return Status::InvalidArgument(file + ": cannot store attributes: " +
                                     (!file_writable ? "the file is not writable"
                                                     : "its directory " + dir + " is not writable (the file is " +
                                                           "replaced by a copy, atomically)") +
                                     "; the sidecar (" + StatsSidecarPath(file) + ") needs a writable directory");
    }
    GPUFEED_RETURN_IF_ERROR(StoreAttributes(file, st, stats));
    return std::string("attributes");
  }
  if (!dir_writable) {
    return Status::InvalidArgument(file + ": cannot store statistics: neither the file nor its directory " + dir +
                                   " is writable (the sidecar " + StatsSidecarPath(file) + " goes beside the file)");
  }
  nlohmann::json j = ReadSidecar(file);
  if (j.is_null()) {
    j = {{"gpufeed_stats", kSidecarVersion}, {"datasets", nlohmann::json::object()}};
  }
  j["file_size"] = static_cast<int64_t>(st.st_size);
  j["file_mtime_ns"] = MtimeNs(st);
  for (const FieldStats& s : stats) {
    if (!s.path.empty() && !s.channels.empty()) j["datasets"][s.path] = FieldJson(s);
  }
  GPUFEED_RETURN_IF_ERROR(AtomicFile::WriteWhole(StatsSidecarPath(file), j.dump(1) + "\n"));
  return StatsSidecarPath(file);
}

void ReadStatsSidecar(const std::string& file, const std::string& dataset_path, std::vector<double>* mean,
                      std::vector<double>* stddev, std::string* ignored) {
  mean->clear();
  stddev->clear();
  std::string why;
  auto refuse = [&](const std::string& reason) {
    if (ignored != nullptr) {
      *ignored = StatsSidecarPath(file) + ": " + reason + "; its statistics are ignored (gpufeed inspect " + file +
                 " --stats --store writes them again)";
    }
  };
  const nlohmann::json j = ReadSidecar(file, &why);
  if (j.is_null()) {
    if (!why.empty()) refuse(why);
    return;
  }
  const nlohmann::json& datasets = j.at("datasets");
  if (!datasets.contains(dataset_path)) return;  // statistics of other datasets only
  try {
    const nlohmann::json& d = datasets.at(dataset_path);
    const nlohmann::json& m = d.at("mean");
    const nlohmann::json& s = d.at("std");
    if (!m.is_array() || !s.is_array() || m.size() != s.size() || m.empty() || m.size() > kMaxChannels) {
      return refuse(dataset_path + ": mean and std are not two arrays of 1.." + std::to_string(kMaxChannels) +
                    " channels of one length");
    }
    std::vector<double> mv, sv;
    for (size_t c = 0; c < m.size(); ++c) {
      const double a = m[c].get<double>(), b = s[c].get<double>();
      if (!std::isfinite(a) || !std::isfinite(b) || b < 0) {
        return refuse(dataset_path + ": channel " + std::to_string(c) + " has a mean or std that is not finite, " +
                      "or a negative std");
      }
      mv.push_back(a);
      sv.push_back(b);
    }
    *mean = std::move(mv);
    *stddev = std::move(sv);
  } catch (const std::exception&) {
    refuse(dataset_path + ": malformed (mean and std must be arrays of numbers)");
  }
}

}  // namespace gpufeed
