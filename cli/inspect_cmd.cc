// `gpufeed inspect`: what a dataset is, how it is stored, how gpufeed reads it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "gpufeed/convert.h"
#include "gpufeed/stats.h"
#include "gpufeed/dataset.h"
#include "gpufeed/fields.h"
#include "common/atomic_file.h"
#include "gpufeed/encoded.h"
#include "hdf5io/image/image_decode.h"
#include "gpufeed/inspect.h"
#include "gpufeed/local_source.h"

namespace gpufeed::cli {
namespace {

struct InspectArgs {
  std::string spec, labels, out;
  std::vector<std::string> fields;
  int64_t sample = -1;
  bool json = false;
  bool trust_files = false;
  bool no_sample_axis = false;
  bool stats = false, store = false, sidecar = false;
  std::vector<std::string> channel_axis;  // K, none, NAME=K, NAME=none; empty: from the layout
  int threads = 0;
};

std::string ShapeText(const std::vector<uint64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// How gpufeed reads a virtual dataset, in a line: its source count and the
// first few sources.
constexpr size_t kSourcesShown = 3;

std::string SourceText(const VirtualSource& v) {
  return v.file + ":" + v.dataset +
         (v.stacked ? " (one sample)"
                    : " [" + std::to_string(v.source_first) + ", " + std::to_string(v.source_first + v.count) + ")") +
         " -> [" + std::to_string(v.first) + ", " + std::to_string(v.first + v.count) + ")";
}

nlohmann::json SourcesJson(const std::vector<VirtualSource>& vs) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < std::min(vs.size(), kSourcesShown); ++i) {
    out.push_back({{"file", vs[i].file},
                   {"dataset", vs[i].dataset},
                   {"first", vs[i].first},
                   {"count", vs[i].count},
                   {"source_first", vs[i].source_first},
                   {"stacked", vs[i].stacked}});
  }
  return out;
}

// Named fields or many files: the fields, the files and the read unit, and
// each field's storage in the first file.
int RunInspectFields(const InspectArgs& a, const SourceDecision& decided) {
  auto src = OpenDecidedFields(a.spec, decided);
  if (!src.ok()) {
    std::fprintf(stderr, "gpufeed inspect: %s\n", src.status().ToString().c_str());
    return 1;
  }
  const FieldSource& fs = **src;
  nlohmann::json fields = nlohmann::json::array();
  const std::vector<FieldInfo> infos = fs.fields();
  for (size_t j = 0; j < infos.size(); ++j) {
    const FieldInfo& f = infos[j];
    auto ds = fs.OpenField(j);
    nlohmann::json filters = nlohmann::json::array();
    std::string path_taken, storage;
    std::vector<uint64_t> chunk;
    size_t sources = 0;
    nlohmann::json first_sources = nlohmann::json::array();
    if (ds.ok()) {
      for (const FilterInfo& fi : ds->info().filters) filters.push_back(fi.name);
      path_taken = std::string(ReadPathName(ds->info().read_path));
      if (!ds->info().read_path_reason.empty()) path_taken += " (" + ds->info().read_path_reason + ")";
      storage = ds->info().storage;
      chunk = ds->info().hdf5_chunk_shape;
      sources = ds->info().virtual_sources.size();
      if (sources > 0) {
        // The loader reads each source as a dataset of its own (direct path where it qualifies).
        path_taken = "per-source";
        storage +=
            " (" + std::to_string(sources) + " sources, first " + SourceText(ds->info().virtual_sources[0]) + ")";
        first_sources = SourcesJson(ds->info().virtual_sources);
      }
    }
    fields.push_back({{"name", f.name},
                      {"path", f.path},
                      {"dtype", f.is_bool ? "bool" : DTypeName(f.dtype)},
                      {"sample_shape", f.sample_shape},
                      {"sample_bytes", f.sample_bytes},
                      {"storage", storage},
                      {"hdf5_chunk_shape", chunk},
                      {"filters", filters},
                      {"read_path", path_taken},
                      {"virtual_sources", sources},
                      {"virtual_sources_first", first_sources}});
  }
  if (a.json) {
    nlohmann::json j = {{"data", a.spec},
                        {"files", fs.files().size()},
                        {"samples", fs.num_samples()},
                        {"sample_bytes", fs.sample_bytes()},
                        {"read_unit_samples", fs.chunk_samples()},
                        {"read_units", fs.num_chunks()},
                        {"fields", fields}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "%s\n  files        %zu (first %s)\n  samples      %llu, %.2f MB a sample (all fields)\n"
      "  read unit    %llu samples (%llu units; never spans two files)\n  fields\n",
      a.spec.c_str(), fs.files().size(), fs.files()[0].c_str(), static_cast<unsigned long long>(fs.num_samples()),
      fs.sample_bytes() / 1e6, static_cast<unsigned long long>(fs.chunk_samples()),
      static_cast<unsigned long long>(fs.num_chunks()));
  for (const auto& f : fields) {
    std::string filters;
    for (const auto& x : f["filters"]) filters += (filters.empty() ? "" : "+") + x.get<std::string>();
    std::printf("    %-10s %-24s %-8s %-18s %s%s, %s path\n", f["name"].get<std::string>().c_str(),
                f["path"].get<std::string>().c_str(), f["dtype"].get<std::string>().c_str(),
                ShapeText(f["sample_shape"].get<std::vector<uint64_t>>()).c_str(),
                f["storage"].get<std::string>().c_str(), filters.empty() ? "" : (", " + filters).c_str(),
                f["read_path"].get<std::string>().c_str());
  }
  return 0;
}

// An encoded image field: how it is stored and how the loader will read it.
int InspectEncoded(const InspectArgs& a, const ProbedSpec& probed, const OpenOptions& o) {
  auto src = OpenEncodedImages(probed, o, {});
  if (!src.ok()) {
    std::fprintf(stderr, "gpufeed inspect: %s\n", src.status().ToString().c_str());
    return 1;
  }
  const EncodedImageSource& s = **src;
  if (a.sample >= 0 || !a.out.empty()) {
    // The evaluation transform (resize to 256, center crop 224), as .npy
    // uint8 [3, 224, 224]: what the loader delivers with --transform
    // center_crop, for comparing with an independent decoder.
    if (a.sample < 0 || a.out.empty() || static_cast<uint64_t>(a.sample) >= s.num_samples() || a.out.size() < 4 ||
        a.out.substr(a.out.size() - 4) != ".npy") {
      std::fprintf(stderr, "gpufeed inspect: --sample K (< %llu) and --out FILE.npy go together\n",
                   static_cast<unsigned long long>(s.num_samples()));
      return 2;
    }
    DecodeOptions d;
    d.transform = ImageTransform::kCenterCrop;
    std::vector<uint8_t> stored, out(3 * 224 * 224);
    Status st = s.ReadEncoded(static_cast<uint64_t>(a.sample), &stored);
    if (st.ok()) st = image::DecodeTransform(stored, d, 0, out.data());
    if (st.ok()) {
      std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 224, 224), }";
      dict.append((64 - (10 + dict.size() + 1) % 64) % 64, ' ');
      dict += '\n';
      std::string header("\x93NUMPY\x01\x00", 8);
      header += static_cast<char>(dict.size() & 0xff);
      header += static_cast<char>(dict.size() >> 8);
      AtomicFile f(a.out);
      st = f.Write(header + dict);
      if (st.ok()) st = f.Write(out.data(), out.size());
      if (st.ok()) st = f.Commit();
    }
    if (!st.ok()) {
      std::fprintf(stderr, "gpufeed inspect: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("wrote sample %lld (center crop 224 of resize 256) to %s\n", static_cast<long long>(a.sample),
                a.out.c_str());
    return 0;
  }
  const bool vlen = s.storage() == EncodedStorage::kVlen;
  const std::string path = vlen ? "hdf5" : "direct";
  const std::string advice =
      vlen ? "h5py variable-length uint8: every read goes through H5Dread under HDF5's global lock (one thread at a "
             "time; opening measured every entry). For the direct path run: gpufeed convert " +
                 a.spec + " --keep-encoded -o OUT.h5"
           : "";
  if (a.json) {
    nlohmann::json j = {{"images", s.name()},
                        {"encoded", true},
                        {"storage", vlen ? "vlen" : "bytes+offsets"},
                        {"samples", s.num_samples()},
                        {"stored_bytes", s.stored_bytes()},
                        {"read_path", path},
                        {"read_path_reason", advice},
                        {"class_names", s.class_names()},
                        {"has_labels", !s.labels().empty()}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s\n", s.name().c_str());
  std::printf("  encoded images (JPEG/PNG, decoded by the loader: --image-size, --transform), %s\n",
              vlen ? "h5py vlen uint8" : "bytes + offsets (docs/format.md)");
  std::printf("  samples %llu, %.1f MB stored, %.1f KB a sample, %zu classes%s\n",
              static_cast<unsigned long long>(s.num_samples()), s.stored_bytes() / 1e6,
              s.stored_bytes() / 1e3 / std::max<uint64_t>(1, s.num_samples()), s.class_names().size(),
              s.labels().empty() ? ", no labels" : "");
  std::printf("  read path: %s%s%s\n", path.c_str(), advice.empty() ? "" : "\n  ", advice.c_str());
  return 0;
}

// What inspect --stats found, for its report.
struct StatsReport {
  const std::string& spec;
  const std::vector<FieldInfo>& fields;
  const std::vector<std::string>& layouts;
  const std::vector<bool>& guesses;  // the channel axis is a guess (no layout attribute)
  const std::vector<FieldStats>& stats;
  const std::vector<std::string>& files;
  uint64_t bytes = 0;
  double seconds = 0;
  const nlohmann::json& stored;  // where --store put them
  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }
};

void PrintStatsJson(const StatsReport& r) {
  nlohmann::json jf = nlohmann::json::array();
  for (size_t j = 0; j < r.stats.size(); ++j) {
    const FieldStats& fs = r.stats[j];
    nlohmann::json ch = nlohmann::json::array();
    for (const ChannelStats& c : fs.channels) {
      ch.push_back({{"count", c.count},
                    {"mean", c.mean},
                    {"std", c.stddev},
                    {"min", c.min},
                    {"max", c.max},
                    {"nan", c.nan},
                    {"inf", c.inf}});
    }
    jf.push_back({{"name", fs.name},
                  {"path", fs.path},
                  {"dtype", DTypeName(r.fields[j].dtype)},
                  {"sample_shape", r.fields[j].sample_shape},
                  {"layout", r.layouts[j]},
                  {"channel_axis_guessed", static_cast<bool>(r.guesses[j])},
                  {"channel_axis", fs.channel_axis},
                  {"samples", fs.samples},
                  {"mean", fs.means()},
                  {"std", fs.stddevs()},
                  {"channels", ch}});
  }
  nlohmann::json j = {{"data", r.spec},          {"files", r.files.size()}, {"fields", jf},
                      {"seconds", r.seconds},    {"bytes", r.bytes},        {"stored", r.stored},
                      {"gb_per_s", r.gb_per_s()}};
  std::printf("%s\n", j.dump(2).c_str());
}

void PrintStatsText(const StatsReport& r) {
  std::printf("%s: %zu file%s, %.2f GB read in %.2f s (%.2f GB/s)\n", r.spec.c_str(), r.files.size(),
              r.files.size() == 1 ? "" : "s", r.bytes / 1e9, r.seconds, r.gb_per_s());
  for (size_t j = 0; j < r.stats.size(); ++j) {
    const FieldStats& fs = r.stats[j];
    std::printf("  %s (%s) %s %s, %llu samples, %s\n", fs.name.c_str(), fs.path.c_str(),
                std::string(DTypeName(r.fields[j].dtype)).c_str(), ShapeText(r.fields[j].sample_shape).c_str(),
                static_cast<unsigned long long>(fs.samples),
                fs.channel_axis < 0 ? "one channel (the whole sample)"
                                    : ("channel axis " + std::to_string(fs.channel_axis) +
                                       (r.guesses[j]           ? " (no layout attribute: a guess; --channel-axis K)"
                                        : r.layouts[j].empty() ? ""
                                                               : " (" + r.layouts[j] + ")"))
                                          .c_str());
    std::printf("    %7s %14s %14s %14s %14s %14s %10s %10s\n", "channel", "count", "mean", "std", "min", "max", "nan",
                "inf");
    uint64_t nan = 0, inf = 0;
    for (size_t c = 0; c < fs.channels.size(); ++c) {
      const ChannelStats& x = fs.channels[c];
      std::printf("    %7zu %14llu %14.6g %14.6g %14.6g %14.6g %10llu %10llu\n", c,
                  static_cast<unsigned long long>(x.count), x.mean, x.stddev, x.min, x.max,
                  static_cast<unsigned long long>(x.nan), static_cast<unsigned long long>(x.inf));
      nan += x.nan;
      inf += x.inf;
    }
    if (nan + inf > 0) {
      std::printf("    %llu NaN and %llu Inf values, left out of count, mean, std, min and max\n",
                  static_cast<unsigned long long>(nan), static_cast<unsigned long long>(inf));
    }
  }
  for (const auto& s : r.stored) {
    std::printf("  stored for %s: %s\n", s["file"].get<std::string>().c_str(), s["where"].get<std::string>().c_str());
  }
}

// --stats: per-channel statistics of every field, over every file, and with
// --store where the loader finds them.
int RunStats(const InspectArgs& a) {
  if (a.sidecar && !a.store) {
    std::fprintf(stderr, "gpufeed inspect: --sidecar goes with --store\n");
    return 2;
  }
  if (a.sample >= 0 || !a.out.empty()) {
    std::fprintf(stderr, "gpufeed inspect: --stats does not go with --sample/--out\n");
    return 2;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "gpufeed inspect: %s\n", s.ToString().c_str());
    return 1;
  };
  OpenOptions o;
  o.fields = a.fields;
  o.trust_files = a.trust_files;
  // The door decides what the spec names: named fields or many files as
  // they are, one HDF5 file's dataset (probed there, once) as the field
  // images; anything else is said as what it is.
  auto decided = DecideSourceKind(a.spec, o);
  if (!decided.ok()) return fail(decided.status());
  auto src = OpenDecidedFields(a.spec, *decided);
  if (!src.ok()) return fail(src.status());
  const std::vector<FieldInfo> fields = (*src)->fields();
  StatsOptions so;
  so.threads = a.threads;
  std::vector<std::string> layouts;
  std::vector<bool> guesses;  // the channel axis is a guess (no layout attribute)
  for (size_t j = 0; j < fields.size(); ++j) {
    const FieldInfo& f = fields[j];
    auto ds = (*src)->OpenField(j);
    std::string layout = ds.ok() ? ds->info().layout : "";
    bool guessed = false;
    int axis = GuessChannelAxis(layout, f.sample_shape, &guessed);
    guesses.push_back(guessed);
    // --channel-axis K|none (every field) or NAME=K|none (that field), repeatable.
    std::string choice;
    for (const std::string& c : a.channel_axis) {
      const size_t eq = c.find('=');
      if (eq == std::string::npos) {
        choice = c;
      } else if (c.substr(0, eq) == f.name) {
        choice = c.substr(eq + 1);
      }
    }
    if (choice == "none") {
      axis = -1;
      guesses.back() = false;
    } else if (!choice.empty()) {
      char* end = nullptr;
      const long v = std::strtol(choice.c_str(), &end, 10);
      if (end == choice.c_str() || *end != '\0' || v < 0 || static_cast<size_t>(v) >= f.sample_shape.size()) {
        std::fprintf(stderr,
                     "gpufeed inspect: --channel-axis %s: field '%s' has %zu sample axes (0..%zu); give an axis, "
                     "'none', or NAME=K for one field\n",
                     choice.c_str(), f.name.c_str(), f.sample_shape.size(),
                     f.sample_shape.empty() ? 0 : f.sample_shape.size() - 1);
        return 2;
      }
      axis = static_cast<int>(v);
      guesses.back() = false;
    }
    so.channel_axes.push_back(axis);
    layouts.push_back(layout);
  }
  Progress progress("stats " + a.spec);
  if (!a.json) so.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  const auto t0 = std::chrono::steady_clock::now();
  auto stats = ComputeStats(**src, so);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.Finish();
  if (!stats.ok()) return fail(stats.status());
  const std::vector<std::string> files = (*src)->files();
  const uint64_t bytes = (*src)->num_samples() * (*src)->sample_bytes();
  src->reset();  // closed before the files are replaced

  nlohmann::json stored = nlohmann::json::array();
  if (a.store) {
    for (const std::string& f : files) {
      auto where = StoreStats(f, *stats, a.sidecar ? StoreMode::kSidecar : StoreMode::kAuto);
      if (!where.ok()) return fail(where.status());
      stored.push_back({{"file", f}, {"where", *where}});
    }
  }
  const StatsReport report{a.spec, fields, layouts, guesses, *stats, files, bytes, seconds, stored};
  if (a.json) {
    PrintStatsJson(report);
    return 0;
  }
  PrintStatsText(report);
  return 0;
}

// What inspect says of one HDF5 dataset, as JSON (--json).
void PrintInspectJson(const Dataset& ds, const DatasetInfo& info, const InspectReport& r) {
  nlohmann::json filters = nlohmann::json::array();
  for (const FilterInfo& f : info.filters) filters.push_back({{"id", f.id}, {"name", f.name}, {"params", f.params}});
  nlohmann::json hist = nlohmann::json::object();
  for (auto [label, n] : r.label_histogram) hist[std::to_string(label)] = n;
  nlohmann::json j = {
      {"file", info.file},
      {"images", info.images_path},
      {"labels", info.labels_path},
      {"shape", info.shape},
      {"dtype", DTypeName(ds.dtype())},
      {"enum", info.enum_members},
      {"layout", info.layout},
      {"storage", info.storage},
      {"virtual_sources", info.virtual_sources.size()},
      {"virtual_sources_first", SourcesJson(info.virtual_sources)},
      {"hdf5_chunk_shape", info.hdf5_chunk_shape},
      {"hdf5_chunks", r.hdf5_chunks},
      {"filters", filters},
      {"stored_bytes", info.stored_bytes},
      {"raw_bytes", info.raw_bytes},
      {"compression_ratio", r.compression_ratio},
      {"read_path", ReadPathName(info.read_path)},
      {"read_path_reason", info.read_path_reason},
      {"unreadable", info.unreadable},
      {"io", info.io},
      {"io_note", info.io_note},
      {"read_unit_samples", ds.chunk_samples()},
      {"read_units", ds.num_chunks()},
      {"recommended_cache_bytes", r.recommended_cache_bytes},
      {"label_histogram", hist},
      {"class_names", info.class_names},
      {"mean", info.mean},
      {"std", info.stddev},
      {"stats_from", info.stats_from},
  };
  std::printf("%s\n", j.dump(2).c_str());
}

// What inspect says of one HDF5 dataset, as text.
void PrintInspectText(const Dataset& ds, const DatasetInfo& info, const InspectReport& r) {
  std::printf("%s:%s\n", info.file.c_str(), info.images_path.c_str());
  std::printf("  shape        %s %s%s\n", ShapeText(info.shape).c_str(), std::string(DTypeName(ds.dtype())).c_str(),
              info.big_endian ? " (big-endian)" : "");
  if (!info.enum_members.empty()) {
    std::string members;
    for (const std::string& m : info.enum_members) members += (members.empty() ? "" : ", ") + m;
    std::printf("  enum         %s (read as the integers)\n", members.c_str());
  }
  std::printf("  layout       %s\n", info.layout.empty() ? "(not recorded)" : info.layout.c_str());
  std::printf("  storage      %s", info.storage.c_str());
  if (!info.hdf5_chunk_shape.empty()) {
    std::printf(", chunks %s, %llu chunks", ShapeText(info.hdf5_chunk_shape).c_str(),
                static_cast<unsigned long long>(r.hdf5_chunks));
  }
  if (!info.virtual_sources.empty()) {
    std::printf(", %zu sources", info.virtual_sources.size());
    for (size_t i = 0; i < std::min(info.virtual_sources.size(), kSourcesShown); ++i) {
      std::printf("\n    %s", SourceText(info.virtual_sources[i]).c_str());
    }
    if (info.virtual_sources.size() > kSourcesShown) {
      std::printf("\n    ... %zu more", info.virtual_sources.size() - kSourcesShown);
    }
    std::printf(
        "\n  loader       reads each source directly (bench loader, Python, the C API); this Dataset, "
        "`bench read`, `train` and `serve` read through HDF5");
  }
  std::printf("\n  filters      ");
  if (info.filters.empty()) std::printf("none");
  for (size_t i = 0; i < info.filters.size(); ++i) {
    std::printf("%s%s", i ? " -> " : "", info.filters[i].name.c_str());
    if (!info.filters[i].params.empty()) std::printf("(%u)", info.filters[i].params[0]);
  }
  std::printf("\n  size         %.2f MB stored, %.2f MB raw (%.2fx)\n", info.stored_bytes / 1e6, info.raw_bytes / 1e6,
              r.compression_ratio);
  std::printf("  read path    %s", std::string(ReadPathName(info.read_path)).c_str());
  if (!info.read_path_reason.empty()) std::printf(" (%s)", info.read_path_reason.c_str());
  std::printf(", read unit %llu samples (%.2f MiB), %llu units\n", static_cast<unsigned long long>(ds.chunk_samples()),
              ds.chunk_bytes_max() / 1048576.0, static_cast<unsigned long long>(ds.num_chunks()));
  if (!info.io.empty()) {
    std::printf("  I/O          %s%s%s%s\n", info.io.c_str(), info.io_note.empty() ? "" : " (", info.io_note.c_str(),
                info.io_note.empty() ? "" : ")");
  }
  if (!info.unreadable.empty()) {
    std::printf("  UNREADABLE   %s\n", info.unreadable.c_str());
    std::fprintf(stderr, "gpufeed inspect: warning: no sample can be read: %s\n", info.unreadable.c_str());
  }
  std::printf("  cache        %.1f MiB recommended (a %llu-chunk shuffle window, decoded)\n",
              r.recommended_cache_bytes / 1048576.0,
              static_cast<unsigned long long>(InspectReport::kRecommendedWindow));
  if (!info.mean.empty()) {
    std::printf("  mean/std     (%s)", info.stats_from.c_str());
    for (size_t c = 0; c < info.mean.size(); ++c) {
      std::printf(" %.3f/%.3f", info.mean[c], c < info.stddev.size() ? info.stddev[c] : 0.0);
    }
    std::printf("\n");
  }
  if (info.labels_path.empty()) {
    std::printf("  labels       none\n");
  } else {
    std::printf("  labels       %s, %zu classes\n", info.labels_path.c_str(), r.label_histogram.size());
    // The text view lists the first classes (index-like labels would print a
    // line per sample); --json has them all.
    constexpr size_t kShown = 40;
    size_t shown = 0;
    for (auto [label, n] : r.label_histogram) {
      if (shown++ == kShown) {
        std::printf("    ... %zu more classes (--json lists every one)\n", r.label_histogram.size() - kShown);
        break;
      }
      const bool named = label >= 0 && static_cast<size_t>(label) < info.class_names.size();
      std::printf("    %6lld %-16s %llu\n", static_cast<long long>(label), named ? info.class_names[label].c_str() : "",
                  static_cast<unsigned long long>(n));
    }
  }
}

int RunInspect(const InspectArgs& a) {
  if (a.stats) return RunStats(a);
  if (a.store || a.sidecar || !a.channel_axis.empty() || a.threads != 0) {
    std::fprintf(stderr, "gpufeed inspect: --store, --sidecar, --channel-axis and --threads go with --stats\n");
    return 2;
  }
  OpenOptions given;
  given.fields = a.fields;
  given.labels_path = a.labels;
  given.no_sample_axis = a.no_sample_axis;
  given.trust_files = a.trust_files;
  // The door decides what the spec names; for one file it probes it (a
  // forked process) once: its verdict on a file that crashes or hangs HDF5
  // is the answer, and the opens below trust it.
  auto decided = DecideSourceKind(a.spec, given);
  if (!decided.ok()) {
    std::fprintf(stderr, "gpufeed inspect: %s\n", decided.status().ToString().c_str());
    return 1;
  }
  const OpenOptions& o = decided->open;
  if (decided->kind == SourceKind::kFields) return RunInspectFields(a, *decided);
  if (decided->kind == SourceKind::kImageFolder) {
    // Read as it is: its files, classes and bytes, as the loader sees them.
    auto folder = OpenLocalSource(a.spec, o, DecodeOptions{});
    if (!folder.ok()) {
      std::fprintf(stderr, "gpufeed inspect: %s\n", folder.status().ToString().c_str());
      return 1;
    }
    const EncodedImageSource& f = *folder->encoded;
    std::printf(
        "%s: image folder, %llu files (JPEG/PNG) in %zu classes, %.1f MB; the loader reads it as it is, "
        "each file decoded in its threads or on the GPU (no conversion needed)\n",
        a.spec.c_str(), static_cast<unsigned long long>(f.num_samples()), f.class_names().size(),
        f.stored_bytes() / 1e6);
    return 0;
  }
  // An image folder, .npy or IDX file (not HDF5, not probed): said as such,
  // with the convert command that makes it a dataset to inspect.
  Status readable = RefuseConvertOnly(a.spec, *decided);
  if (!readable.ok() || !decided->probed) {
    std::fprintf(
        stderr, "gpufeed inspect: %s\n",
        (readable.ok() ? Status::Internal(a.spec + ": the door decided one file without probing it") : readable)
            .ToString()
            .c_str());
    return 1;
  }
  if (decided->kind == SourceKind::kEncodedImages) return InspectEncoded(a, *decided->probed, o);
  auto ds = Dataset::Open(*decided->probed, o);  // probed by the door: not again
  if (!ds.ok()) {
    std::fprintf(stderr, "gpufeed inspect: %s\n", ds.status().ToString().c_str());
    return 1;
  }
  if (a.sample >= 0 || !a.out.empty()) {
    if (a.sample < 0 || a.out.empty()) {
      std::fprintf(stderr, "gpufeed inspect: --sample K and --out FILE go together\n");
      return 2;
    }
    Status s = ExportSample(*ds, static_cast<uint64_t>(a.sample), a.out);
    if (!s.ok()) {
      std::fprintf(stderr, "gpufeed inspect: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("wrote sample %lld to %s\n", static_cast<long long>(a.sample), a.out.c_str());
    return 0;
  }
  const DatasetInfo& info = ds->info();
  const InspectReport r = Inspect(*ds);
  if (a.json) {
    PrintInspectJson(*ds, info, r);
    return 0;
  }
  PrintInspectText(*ds, info, r);
  return 0;
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a dataset's shape, storage, filters, read path and labels");
  cmd->add_option("dataset", args->spec, "FILE.h5 or FILE.h5:/path; many files: 'DIR/*.h5', DIR or LIST.txt")
      ->required();
  cmd->add_option("--field", args->fields, "NAME=/hdf5/path: a named field (repeatable, in order)");
  cmd->add_option("--labels", args->labels, "labels dataset path (default /labels if present; 'none')");
  cmd->add_flag("--no-sample-axis", args->no_sample_axis,
                "each file is one sample; its datasets have no sample axis (DeepCAM's reference files)");
  cmd->add_flag("--json", args->json, "print as JSON");
  cmd->add_option("--sample", args->sample, "write sample K ...");
  cmd->add_option("--out", args->out, "... to this .npy, .pgm or .ppm file");
  cmd->add_flag("--stats", args->stats,
                "per-channel count, mean, std, min, max, NaN/Inf of every field over every file (reads them all)");
  cmd->add_option("--channel-axis", args->channel_axis,
                  "--stats: the sample axis channels run along, or 'none'; NAME=K for one field (repeatable; default: "
                  "from the layout attribute)");
  cmd->add_flag("--store", args->store,
                "--stats: store mean/std where the loader reads them: each file's attributes (atomically, through a "
                "copy), or FILE.gpufeed-stats.json beside a read-only file");
  cmd->add_flag("--sidecar", args->sidecar, "--store: always the sidecar file, never the HDF5 file");
  cmd->add_option("--threads", args->threads, "--stats: threads (default: all cores)");
  cmd->callback([args, exit_code] { *exit_code = RunInspect(*args); });
}

}  // namespace gpufeed::cli
