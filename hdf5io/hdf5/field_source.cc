// FieldSource (fields.h): named fields over one or many HDF5 files, each
// field a Dataset, files opened lazily under a bound of open descriptors.
#include "gpufeed/fields.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/sizes.h"
#include "hdf5io/hdf5/probe.h"

namespace gpufeed {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One file's (or part's) fields, open (a Dataset per field, in field order).
using OpenFile = std::vector<Dataset>;

}  // namespace

namespace {

// Where one field of a part is read: the part's samples from `first` on of
// file:path. A stacked virtual source (no sample axis) is one whole sample:
// `rows` rows of its axis 0 (rows is 1 for everything else).
struct Piece {
  std::string file, path;
  uint64_t first = 0;
  bool stacked = false;
  std::string via;               // "vds.h5:/images" when mapped by a virtual dataset
  uint64_t rows = 1;             // set at Open
  uint64_t dataset_samples = 0;  // the dataset's axis 0 at Open (a reopen must agree)
};

// A run of samples that every field reads from one dataset: a whole input
// file, or, where a field is a virtual dataset, the samples between two
// source boundaries of any field. Read units never span parts.
struct Part {
  size_t file = 0;  // the input file it belongs to
  uint64_t count = 0;
  std::vector<Piece> pieces;  // one per field
};

}  // namespace

struct FieldSource::Impl {
  std::vector<FieldSpec> specs;
  std::vector<FieldInfo> fields;
  std::vector<std::string> files;
  std::vector<uint64_t> file_first;  // first global sample of each file; + total at the end
  std::vector<Part> parts;           // in sample order; empty input files have none
  std::vector<uint64_t> part_first;  // first global sample of each part; + total at the end
  std::vector<uint64_t> unit_first;  // first unit of each part; + num_chunks at the end
  uint64_t num_samples = 0, sample_bytes = 0, chunk_samples = 1, num_chunks = 0;
  std::vector<uint64_t> sample_shape;
  DType dtype = DType::kUInt8;
  SourceAttributes attributes;
  std::string what;
  std::string data;     // as given to Open (Select opens it again)
  OpenOptions options;  // as given to Open
  OpenOptions reopen;   // labels "none", no fields
  // Every (file, field) spec this source opens, through the probe (or the
  // user's trust) once, at Open.
  std::map<std::string, ProbedSpec> probed;
  // What the probe's children saw of the specs they opened: a file whose
  // every field has facts (and none is virtual) is placed without this
  // process opening it at Open; its first read opens it and checks them.
  std::map<std::string, SpecFacts> facts;
  size_t max_open = 256;

  // open_costs(): nanoseconds in the probe and in opens, and the opens.
  mutable std::atomic<uint64_t> probe_ns{0}, open_ns{0};
  // The opens, each counted as it ends, both counts at once: open_costs()
  // may read them while the opener opens a part ahead, and a read between
  // an open's start (opens counted) and its end (planned_opens counted)
  // reported a planned open as one through HDF5.
  mutable Mutex count_mu;
  mutable uint64_t opens GUARDED_BY(count_mu) = 0;
  mutable uint64_t planned_opens GUARDED_BY(count_mu) = 0;
  void CountOpen(bool planned_open) const EXCLUDES(count_mu) {
    MutexLock lock(&count_mu);
    opens += 1;
    if (planned_open) planned_opens += 1;
  }
  // Per part: every piece has the probe's plan, so a reader opens it on its
  // own thread (no HDF5, nothing to serialize) instead of asking the opener.
  std::vector<uint8_t> planned;
  // Open parts, least recently used first out. A reader holds a shared_ptr,
  // so closing one here never pulls it from under a read.
  mutable Mutex mu;
  mutable std::vector<std::shared_ptr<const OpenFile>> open GUARDED_BY(mu);  // per part
  mutable std::vector<uint64_t> last_use GUARDED_BY(mu);
  mutable std::vector<size_t> open_list GUARDED_BY(mu);  // parts with open[p]
  mutable uint64_t clock GUARDED_BY(mu) = 0;
  // The opener: the one thread that opens parts once readers run. HDF5 opens
  // one file at a time in a process, and threads contending for its lock
  // open slower than one thread alone (30,000 small files on a 16-core host:
  // 1,154 files/s with 16 readers opening, 3,026 with one). A reader whose
  // part is not open asks the opener (`wanted`) and waits; between those it
  // opens the parts of the units WillRead announced, in that order, ahead
  // of their reads, and passes each hint on to the part's datasets (their
  // read-ahead).
  struct OpenRequest {
    size_t part = 0;
    bool done = false;
    Status status;
    std::shared_ptr<const OpenFile> file;
  };
  mutable std::deque<std::shared_ptr<OpenRequest>> wanted GUARDED_BY(mu);  // readers waiting, in order
  mutable std::deque<uint64_t> ahead GUARDED_BY(mu);                       // units announced, not yet handled
  // Parts the opener opened for a hint and no read has taken yet: at most
  // half of max_open, so what it opens ahead is not closed again before its
  // read (the loader announces a whole prefetch of batches ahead).
  mutable std::vector<uint8_t> unread GUARDED_BY(mu);
  mutable size_t unread_count GUARDED_BY(mu) = 0;
  mutable bool stopping GUARDED_BY(mu) = false;
  mutable CondVar work_cv;    // the opener waits for wanted or ahead
  mutable CondVar opened_cv;  // readers wait for their request
  mutable std::thread opener GUARDED_BY(mu);

  ~Impl() {
    std::thread t;
    {
      MutexLock lock(&mu);
      stopping = true;
      t = std::move(opener);
    }
    work_cv.SignalAll();
    if (t.joinable()) t.join();
  }

  void StartOpener() const REQUIRES(mu) {
    if (!opener.joinable()) opener = std::thread([this] { OpenerLoop(); });
  }

  // A spec this source has probed, opened; Internal for one it has not
  // (every spec it opens is probed at Open).
  Result<Dataset> OpenProbed(const std::string& spec) const {
    auto it = probed.find(spec);
    if (it == probed.end()) return Status::Internal(spec + ": opened by " + what + " without the probe");
    return Dataset::Open(it->second, reopen);
  }

  // Probes the specs not probed yet (in one pass of probe processes).
  // OpenSeeded's steps.
  Status ProbeFields(const OpenOptions& options);
  void BoundOpenFiles();  // max_open within the process's descriptor limit
  Status RecordFields(const OpenFile& ds, size_t* largest);
  Status ProbeVirtualSources(int timeout_ms);
  void Lay(uint64_t unit, std::string_view data);
  Status ProbeMissing(std::vector<std::string> specs, int timeout_ms) {
    std::sort(specs.begin(), specs.end());
    specs.erase(std::unique(specs.begin(), specs.end()), specs.end());
    std::erase_if(specs, [&](const std::string& s) { return probed.count(s) != 0; });
    if (specs.empty()) return Status::Ok();
    ProbeOptions probe;
    probe.open = reopen;
    probe.timeout_ms = timeout_ms;
    probe.processes = static_cast<int>(std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16));
    std::vector<Result<ProbedSpec>> got;
    std::vector<std::optional<SpecFacts>> seen;
    if (TrustFiles(reopen)) {
      got = ProbeAll(specs, probe);  // issued without a probe: no time to count
    } else {
      ScopedNanos timed(&probe_ns);
      got = ProbeAll(specs, probe, &seen);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      Result<ProbedSpec>& r = got[i];
      if (!r.ok()) return r.status();
      std::string key = r->text();
      if (i < seen.size() && seen[i]) facts.emplace(key, std::move(*seen[i]));
      probed.emplace(std::move(key), std::move(*r));
    }
    return Status::Ok();
  }

  // Opens every field of input file f as named (a virtual dataset opens as
  // one, its mapping resolved and checked) and checks it against the fields.
  Result<OpenFile> OpenFields(size_t f) const {
    ScopedNanos timed(&open_ns);
    OpenFile out;
    for (size_t j = 0; j < specs.size(); ++j) {
      auto ds = OpenProbed(files[f] + ":" + specs[j].path);
      if (!ds.ok()) {
        CountOpen(false);
        return ds.status();
      }
      out.push_back(std::move(*ds));
    }
    CountOpen(false);
    return out;
  }

  // The fields of input file f (as opened here, or as the probe saw them)
  // against the first file's.
  Status CheckFile(size_t f, const std::vector<SpecFacts>& ds) const {
    const uint64_t n = ds[0].num_samples;
    for (size_t j = 0; j < ds.size(); ++j) {
      if (ds[j].dtype != fields[j].dtype || ds[j].sample_shape != fields[j].sample_shape ||
          ds[j].is_bool != fields[j].is_bool) {
        return Status::InvalidArgument(files[f] + ":" + specs[j].path + ": field '" + specs[j].name + "' is " +
                                       std::string(DTypeName(ds[j].dtype)) + (ds[j].is_bool ? " (bool)" : "") + " " +
                                       ShapeText(ds[j].sample_shape) + " per sample, but in " + files[0] + " it is " +
                                       std::string(DTypeName(fields[j].dtype)) + (fields[j].is_bool ? " (bool)" : "") +
                                       " " + ShapeText(fields[j].sample_shape) +
                                       "; every file must agree in fields, dtypes and sample shapes");
      }
      if (ds[j].num_samples != n) {
        return Status::InvalidArgument(files[f] + ": field '" + specs[j].name + "' (" + specs[j].path + ") has " +
                                       std::to_string(ds[j].num_samples) + " samples but field '" + specs[0].name +
                                       "' (" + specs[0].path + ") has " + std::to_string(n) +
                                       "; the fields of a file must have the same length (axis 0)");
      }
    }
    return Status::Ok();
  }

  static std::vector<SpecFacts> FactsOf(const OpenFile& ds) {
    std::vector<SpecFacts> out;
    for (const Dataset& x : ds) {
      out.push_back(
          SpecFacts{x.dtype(), x.is_bool(), !x.info().virtual_sources.empty(), x.num_samples(), x.sample_shape(), {}});
    }
    return out;
  }

  // Input file f's fields, opened here (HDF5 in this process: trusted files,
  // the first file, a file the probe reported nothing of): where the direct
  // path reads a field by a plan of at most kMaxKeptPlanChunks chunks, that
  // plan, so a reopen after eviction needs no HDF5 either (OpenPart).
  static constexpr size_t kMaxKeptPlanChunks = 4096;
  void KeepPlans(size_t f, const OpenFile& ds, const std::vector<SpecFacts>& seen) {
    for (size_t j = 0; j < ds.size() && j < specs.size(); ++j) {
      if (ds[j].info().storage != "contiguous" && ds[j].num_chunks() > kMaxKeptPlanChunks) continue;
      auto plan = std::make_shared<DirectPlan>();
      if (!ds[j].Plan(plan.get())) continue;
      SpecFacts kept = seen[j];
      kept.plan = std::move(plan);
      facts[files[f] + ":" + specs[j].path] = std::move(kept);
    }
  }

  // Input file f's fields as the probe saw them: none unless every field has
  // facts and none is virtual (a virtual field's sources are placed from its
  // mapping, which only an open here reads).
  std::optional<std::vector<SpecFacts>> ProbedFacts(size_t f) const {
    std::vector<SpecFacts> out;
    for (const FieldSpec& s : specs) {
      auto it = facts.find(files[f] + ":" + s.path);
      if (it == facts.end() || it->second.is_virtual) return std::nullopt;
      out.push_back(it->second);
    }
    return out;
  }

  // The probe's plan of a spec, if it made one.
  const SpecFacts* PlannedFacts(const std::string& spec) const {
    auto it = facts.find(spec);
    return it != facts.end() && it->second.plan ? &it->second : nullptr;
  }

  // Opens the dataset of every field of part p: from the probe's plan where
  // it made one and the file is still the one it saw, else through HDF5.
  Result<OpenFile> OpenPart(size_t p) const {
    ScopedNanos timed(&open_ns);
    OpenFile out;
    bool all_planned = true;
    for (const Piece& pc : parts[p].pieces) {
      const std::string spec = pc.file + ":" + pc.path;
      std::optional<Result<Dataset>> ds;
      if (const SpecFacts* seen = PlannedFacts(spec)) {
        auto it = probed.find(spec);
        bool changed = false;
        if (it != probed.end()) ds = Dataset::OpenPlanned(it->second, *seen, reopen, &changed);
        if (changed) ds.reset();  // rewritten since the probe: HDF5 opens it, CheckPart checks it
      }
      if (!ds) {
        all_planned = false;
        ds = OpenProbed(spec);
      }
      if (!ds->ok()) {
        CountOpen(false);
        return pc.via.empty() ? ds->status() : ds->status().WithContext("source of " + pc.via);
      }
      out.push_back(std::move(**ds));
    }
    CountOpen(all_planned);
    return out;
  }

  // A part's datasets hold what the fields say: dtype, sample shape, the
  // samples the part reads. record: the first open (Open), whose rows and
  // lengths it sets; else a reopen, which must find the lengths unchanged.
  Status CheckPart(size_t p, const OpenFile& ds, Part* record) const {
    const Part& part = parts[p];
    for (size_t j = 0; j < ds.size(); ++j) {
      const Piece& pc = part.pieces[j];
      const std::string where = pc.file + ":" + pc.path + (pc.via.empty() ? "" : " (source of " + pc.via + ")");
      std::vector<uint64_t> shape = ds[j].sample_shape();
      if (pc.stacked) shape.insert(shape.begin(), ds[j].num_samples());  // the whole dataset is the sample
      if (ds[j].dtype() != fields[j].dtype || ds[j].is_bool() != fields[j].is_bool || shape != fields[j].sample_shape) {
        return Status::InvalidArgument(where + ": field '" + specs[j].name + "' is " +
                                       std::string(DTypeName(ds[j].dtype())) + " " + ShapeText(shape) +
                                       " per sample here, but " + std::string(DTypeName(fields[j].dtype)) + " " +
                                       ShapeText(fields[j].sample_shape) + " in " + files[0]);
      }
      if (record != nullptr) {
        Piece& rp = record->pieces[j];
        rp.dataset_samples = ds[j].num_samples();
        rp.rows = pc.stacked ? ds[j].num_samples() : 1;
        const auto end = CheckedAdd(rp.first, part.count);
        if (!pc.stacked && (!end || *end > rp.dataset_samples)) {
          return Status::InvalidArgument(where + ": has " + std::to_string(rp.dataset_samples) +
                                         " samples, the part read from it needs [" + std::to_string(rp.first) + ", " +
                                         (end ? std::to_string(*end) : std::string("overflow")) + ")");
        }
      } else if (ds[j].num_samples() != pc.dataset_samples) {
        return Status::InvalidArgument(where + ": now has " + std::to_string(ds[j].num_samples()) + " samples, had " +
                                       std::to_string(pc.dataset_samples) +
                                       " when the dataset was opened (the file changed; reopen the dataset)");
      }
    }
    return Status::Ok();
  }

  // Part p's datasets, open: at once when they are; else opened here when
  // the probe planned them, from the opener when HDF5 must open them.
  Result<std::shared_ptr<const OpenFile>> Acquire(size_t p) const EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      if (open[p]) {
        last_use[p] = ++clock;
        Taken(p);
        return open[p];
      }
      if (stopping) return Status::Internal(what + ": closed while a read waited for " + files[parts[p].file]);
      if (!planned[p]) return FromOpener(p);
    }
    auto ds = OpenPart(p);
    const Status st = ds.ok() ? CheckPart(p, *ds, nullptr) : ds.status();
    if (!st.ok()) return st;
    auto file = std::make_shared<const OpenFile>(std::move(*ds));
    MutexLock lock(&mu);
    if (!open[p]) Insert(p, std::move(file));  // else another reader's open is kept, this one closed
    last_use[p] = ++clock;
    Taken(p);
    return open[p];
  }

  // Part p from the opener: asks it and waits.
  Result<std::shared_ptr<const OpenFile>> FromOpener(size_t p) const REQUIRES(mu) {
    auto req = std::make_shared<OpenRequest>();
    req->part = p;
    wanted.push_back(req);
    StartOpener();
    work_cv.Signal();
    while (!req->done) opened_cv.Wait(&mu);
    if (!req->status.ok()) return req->status;
    return req->file;
  }

  // The opener's loop: the readers' requests first, each part opened once
  // for every request waiting for it; then the next announced unit.
  void OpenerLoop() const EXCLUDES(mu) {
    while (true) {
      size_t p = 0;
      uint64_t hinted = UINT64_MAX;  // the announced unit handled, if that is what this is
      std::shared_ptr<const OpenFile> file;
      {
        MutexLock lock(&mu);
        const size_t ahead_limit = std::max<size_t>(1, max_open / 2);
        while (!stopping && wanted.empty() && (ahead.empty() || unread_count >= ahead_limit)) work_cv.Wait(&mu);
        if (stopping) {
          for (const auto& r : wanted) {
            r->done = true;
            r->status = Status::Internal(what + ": closed while a read waited for " + files[parts[r->part].file]);
          }
          wanted.clear();
          opened_cv.SignalAll();
          return;
        }
        if (!wanted.empty()) {
          p = wanted.front()->part;
        } else {
          hinted = ahead.front();
          ahead.pop_front();
          p = PartOfUnit(hinted);
        }
        file = open[p];
        if (file) last_use[p] = ++clock;
      }
      Status st;
      if (!file) {
        auto ds = OpenPart(p);
        st = ds.ok() ? CheckPart(p, *ds, nullptr) : ds.status();
        if (st.ok()) file = std::make_shared<const OpenFile>(std::move(*ds));
      }
      {
        MutexLock lock(&mu);
        if (file && !open[p]) {
          Insert(p, file);
          if (hinted != UINT64_MAX && !unread[p]) {
            unread[p] = 1;
            unread_count += 1;
          }
        }
        for (auto it = wanted.begin(); it != wanted.end();) {
          if ((*it)->part != p) {
            ++it;
            continue;
          }
          (*it)->done = true;
          (*it)->status = st;
          (*it)->file = file;
          Taken(p);
          it = wanted.erase(it);
        }
      }
      opened_cv.SignalAll();
      if (file && hinted != UINT64_MAX) HintDatasets(hinted, *file);  // a hint's failed open waits for its read
    }
  }

  // Dataset::WillRead for the chunks of each field that unit `unit` reads.
  void HintDatasets(uint64_t unit, const OpenFile& file) const {
    const size_t p = PartOfUnit(unit);
    const uint64_t local = (unit - unit_first[p]) * chunk_samples;
    const uint64_t n = UnitSamples(unit);
    for (size_t j = 0; j < file.size() && j < parts[p].pieces.size(); ++j) {
      const Piece& pc = parts[p].pieces[j];
      const uint64_t cs = std::max<uint64_t>(1, file[j].chunk_samples());
      const uint64_t first = (pc.first + local) * pc.rows, count = n * pc.rows;
      if (count == 0) continue;
      for (uint64_t c = first / cs; c <= (first + count - 1) / cs; ++c) file[j].WillRead(c);
    }
  }

  // A read took part p: it no longer counts as opened ahead.
  void Taken(size_t p) const REQUIRES(mu) {
    if (p < unread.size() && unread[p]) {
      unread[p] = 0;
      unread_count -= 1;
      work_cv.Signal();
    }
  }

  void Insert(size_t p, std::shared_ptr<const OpenFile> ptr) const REQUIRES(mu) {
    const uint64_t* use = last_use.data();  // under mu, as the comparator below reads it
    const uint8_t* ahead_of_read = unread.data();
    while (open_list.size() >= max_open) {
      // The least recently used part that a read has taken; one still
      // waiting for its read only when every open part is.
      auto lru = std::min_element(open_list.begin(), open_list.end(), [&](size_t a, size_t b) {
        return std::pair(ahead_of_read[a] != 0, use[a]) < std::pair(ahead_of_read[b] != 0, use[b]);
      });
      Taken(*lru);  // closed unread: no longer ahead either
      open[*lru].reset();
      *lru = open_list.back();
      open_list.pop_back();
    }
    open[p] = std::move(ptr);
    last_use[p] = ++clock;
    open_list.push_back(p);
  }

  size_t PartOfUnit(uint64_t i) const {
    return static_cast<size_t>(std::upper_bound(unit_first.begin(), unit_first.end(), i) - unit_first.begin() - 1);
  }
  uint64_t UnitSamples(uint64_t i) const {
    const size_t p = PartOfUnit(i);
    const uint64_t local = (i - unit_first[p]) * chunk_samples;
    return std::min(chunk_samples, parts[p].count - local);
  }

  // Splits input file f (its fields open as `ds`) into parts: one when no
  // field is virtual, else one between every two source boundaries.
  Status AddParts(size_t f, const OpenFile& ds) {
    const uint64_t n = ds.front().num_samples();
    if (n == 0) return Status::Ok();
    // Per field, its runs: (start in the file, piece).
    std::vector<std::vector<std::pair<uint64_t, Piece>>> runs(ds.size());
    for (size_t j = 0; j < ds.size(); ++j) {
      const auto& vs = ds[j].info().virtual_sources;
      if (vs.empty()) {
        runs[j].push_back({0, Piece{files[f], specs[j].path, 0, false, "", 1, 0}});
        continue;
      }
      for (const VirtualSource& v : vs) {
        runs[j].push_back({v.first, Piece{v.file, v.dataset, v.source_first, v.stacked, ds[j].name(), 1, 0}});
      }
    }
    // Sweep: a part ends at the nearest boundary of any field.
    std::vector<size_t> at(ds.size(), 0);
    uint64_t s = 0;
    while (s < n) {
      Part part;
      part.file = f;
      uint64_t end = n;
      for (size_t j = 0; j < ds.size(); ++j) {
        while (at[j] + 1 < runs[j].size() && runs[j][at[j] + 1].first <= s) ++at[j];
        if (at[j] + 1 < runs[j].size()) end = std::min(end, runs[j][at[j] + 1].first);
        Piece pc = runs[j][at[j]].second;
        // Within the run (s < its end); a stacked run is one sample, so s is its start.
        pc.first += s - runs[j][at[j]].first;
        part.pieces.push_back(std::move(pc));
      }
      part.count = end - s;
      parts.push_back(std::move(part));
      s = end;
    }
    return Status::Ok();
  }
};

FieldSource::FieldSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FieldSource::~FieldSource() = default;

Result<std::unique_ptr<FieldSource>> FieldSource::Open(std::string_view data, const OpenOptions& options) {
  return Open(data, options, {});
}

Result<std::unique_ptr<FieldSource>> FieldSource::Select(const std::vector<std::string>& names) const {
  const Impl& d = *impl_;
  OpenOptions o = d.options;
  o.fields.clear();
  for (const std::string& name : names) {
    auto it = std::find_if(d.specs.begin(), d.specs.end(), [&](const FieldSpec& s) { return s.name == name; });
    if (it == d.specs.end()) return Status::NotFound(d.what + ": no field '" + name + "'");
    o.fields.push_back(it->name + "=" + it->path);
  }
  auto seed = std::make_unique<Impl>();
  seed->probed = d.probed;
  seed->facts = d.facts;
  return OpenSeeded(d.data, o, std::move(seed));
}

Result<Dataset> FieldSource::OpenField(size_t field, size_t file) const {
  const Impl& d = *impl_;
  if (field >= d.specs.size() || file >= d.files.size()) {
    return Status::InvalidArgument(d.what + ": no field " + std::to_string(field) + " in file " + std::to_string(file));
  }
  return d.OpenProbed(d.files[file] + ":" + d.specs[field].path);
}

Result<std::unique_ptr<FieldSource>> FieldSource::Open(std::string_view data, const OpenOptions& options,
                                                       std::vector<ProbedSpec> probed) {
  auto seed = std::make_unique<Impl>();
  for (ProbedSpec& p : probed) {
    std::string key = p.text();
    seed->probed.emplace(std::move(key), std::move(p));
  }
  return OpenSeeded(data, options, std::move(seed));
}

// The fields named (else images, and labels where the first file has
// them), every (file, field) probed before this process opens any.
Status FieldSource::Impl::ProbeFields(const OpenOptions& options) {
  for (const std::string& text : options.fields) {
    auto f = FieldSpec::Parse(text);
    if (!f.ok()) return f.status();
    for (const FieldSpec& g : specs) {
      if (g.name == f->name) return Status::InvalidArgument("field '" + f->name + "' is named twice");
    }
    specs.push_back(std::move(*f));
  }
  // HDF5's parser is untrusted: every (file, field) goes through the probe
  // processes once, in one pass, before this process opens any of them
  // (with no fields named, the first file's /labels too: a field when it is
  // there, the other files' /labels then probed in a second pass).
  const bool default_fields = specs.empty();
  if (default_fields) specs.push_back({"images", "/images"});
  {
    std::vector<std::string> probe_specs;
    for (const std::string& f : files) {
      for (const FieldSpec& s : specs) probe_specs.push_back(f + ":" + s.path);
    }
    // Every file's /labels in the same pass: a probe restarts HDF5 once a
    // file, not once a spec. A file whose /labels crashes or hangs HDF5 is
    // refused even when the labels go unused (the first file has none): the
    // probe restarts HDF5 after the file's last spec, so such a crash may
    // come from what an earlier spec of the file left behind.
    if (default_fields) {
      for (const std::string& f : files) probe_specs.push_back(f + ":/labels");
    }
    GPUFEED_RETURN_IF_ERROR(ProbeMissing(std::move(probe_specs), options.probe_timeout_ms));
  }
  if (default_fields && OpenProbed(files[0] + ":/labels").ok()) {
    specs.push_back({"labels", "/labels"});
    std::vector<std::string> labels;
    for (const std::string& f : files) labels.push_back(f + ":/labels");
    GPUFEED_RETURN_IF_ERROR(ProbeMissing(std::move(labels), options.probe_timeout_ms));
  }
  return Status::Ok();
}

void FieldSource::Impl::BoundOpenFiles() {
  // Each open field holds about 2 descriptors (ours and HDF5's): keep the
  // bound within the process's limit, with room for everything else.
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
    const uint64_t per_file = 2 * specs.size() + 1;
    const uint64_t room = nofile.rlim_cur > 128 ? (nofile.rlim_cur - 128) / 2 : 1;  // half of what is left
    max_open = static_cast<size_t>(std::clamp<uint64_t>(room / per_file, 1, max_open));
  }
}

// The first file's fields: names, types, shapes and offsets in a sample;
// *largest: the field with the largest samples.
Status FieldSource::Impl::RecordFields(const OpenFile& ds, size_t* largest) {
  uint64_t offset = 0;
  for (size_t j = 0; j < ds.size(); ++j) {
    const Dataset& x = ds[j];
    FieldInfo fi;
    fi.name = specs[j].name;
    fi.path = specs[j].path;
    fi.dtype = x.dtype();
    fi.is_bool = x.is_bool();
    fi.sample_shape = x.sample_shape();
    fi.sample_bytes = x.sample_bytes();
    fi.offset = offset;
    const auto next = CheckedAdd(offset, fi.sample_bytes);
    if (!next) return Status::Unsupported(files[0] + ": the fields' sample sizes overflow 64 bits");
    offset = *next;
    fields.push_back(std::move(fi));
  }
  sample_bytes = offset;
  attributes = ds.front().attributes();
  for (size_t j = 1; j < fields.size(); ++j) {
    if (fields[j].sample_bytes > fields[*largest].sample_bytes) *largest = j;
  }
  return Status::Ok();
}

// Virtual fields' sources are files HDF5 has not parsed in this process
// beyond their metadata: they go through the probe before they are read.
Status FieldSource::Impl::ProbeVirtualSources(int timeout_ms) {
  std::vector<std::string> probe_specs;
  for (const Part& part : parts) {
    for (const Piece& pc : part.pieces) {
      if (!pc.via.empty()) probe_specs.push_back(pc.file + ":" + pc.path);
    }
  }
  GPUFEED_RETURN_IF_ERROR(ProbeMissing(std::move(probe_specs), timeout_ms));
  return Status::Ok();
}

// The read units over the parts (`unit`: the first part's chunking), the
// source's geometry and its name.
void FieldSource::Impl::Lay(uint64_t unit, std::string_view data) {
  planned.assign(parts.size(), 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    planned[p] = std::all_of(parts[p].pieces.begin(), parts[p].pieces.end(),
                             [&](const Piece& pc) { return PlannedFacts(pc.file + ":" + pc.path) != nullptr; });
  }
  // Units never span parts: every part but the last holds whole units (the
  // last may end in a short one, as a single file's last chunk).
  for (size_t p = 0; p + 1 < parts.size(); ++p) unit = std::gcd(unit, parts[p].count);
  num_samples = file_first.back();
  chunk_samples = std::max<uint64_t>(1, unit);
  part_first.assign(1, 0);
  unit_first.assign(1, 0);
  for (const Part& part : parts) {
    part_first.push_back(part_first.back() + part.count);
    unit_first.push_back(unit_first.back() + (part.count + chunk_samples - 1) / chunk_samples);
  }
  num_chunks = unit_first.back();
  if (fields.size() == 1) {
    dtype = fields[0].dtype;
    sample_shape = fields[0].sample_shape;
  } else {
    dtype = DType::kUInt8;
    sample_shape = {sample_bytes};
  }
  what = files.size() == 1 ? files[0] : std::string(data) + " (" + std::to_string(files.size()) + " files)";
  what += " fields ";
  for (size_t j = 0; j < specs.size(); ++j) what += (j ? "," : "") + specs[j].name + "=" + specs[j].path;
}

Result<std::unique_ptr<FieldSource>> FieldSource::OpenSeeded(std::string_view data, const OpenOptions& options,
                                                             std::unique_ptr<Impl> d) {
  auto files = ExpandFiles(data);
  if (!files.ok()) return files.status();
  d->files = std::move(*files);
  d->data = std::string(data);
  d->options = options;
  d->max_open = static_cast<size_t>(std::max(1, options.max_open_files));
  d->reopen = options;
  d->reopen.labels_path = "none";
  d->reopen.fields.clear();

  GPUFEED_RETURN_IF_ERROR(d->ProbeFields(options));

  d->BoundOpenFiles();
  d->file_first.assign(1, 0);
  bool any_virtual = false;
  size_t largest = 0;  // the field with the largest samples: its chunking is the read unit
  uint64_t unit = 1;
  std::vector<bool> checked;  // per part: opened, checked, lengths recorded
  // Records part p's datasets (its first open) and keeps the first max_open open.
  auto first_open = [&](size_t p, std::shared_ptr<const OpenFile> ds) -> Status {
    GPUFEED_RETURN_IF_ERROR(d->CheckPart(p, *ds, &d->parts[p]));
    if (p == 0) unit = d->parts[0].pieces[largest].stacked ? 1 : (*ds)[largest].chunk_samples();
    checked[p] = true;
    MutexLock lock(&d->mu);  // no reader yet: for the analysis
    if (d->open_list.size() < d->max_open) d->Insert(p, std::move(ds));
    return Status::Ok();
  };
  for (size_t f = 0; f < d->files.size(); ++f) {
    // A file past the first that the probe saw whole is placed from what it
    // saw: its first read opens it (Acquire checks it against these facts),
    // so many files cost the probe's processes, not as many opens here.
    std::optional<std::vector<SpecFacts>> seen = f > 0 ? d->ProbedFacts(f) : std::nullopt;
    std::optional<OpenFile> ds;  // the file's fields, when opened here
    if (!seen) {
      auto opened = d->OpenFields(f);
      if (!opened.ok()) return opened.status();
      ds = std::move(*opened);
      seen = Impl::FactsOf(*ds);
      d->KeepPlans(f, *ds, *seen);
    }
    if (f == 0) GPUFEED_RETURN_IF_ERROR(d->RecordFields(*ds, &largest));
    GPUFEED_RETURN_IF_ERROR(d->CheckFile(f, *seen));
    const uint64_t n = seen->front().num_samples;
    const auto total = CheckedAdd(d->file_first.back(), n);
    if (!total) return Status::Unsupported(d->files[f] + ": the files' sample counts overflow 64 bits");
    d->file_first.push_back(*total);
    if (!ds) {  // placed from the probe's facts: one part, no virtual field
      if (n > 0) {
        Part part{f, n, {}};
        for (size_t j = 0; j < d->specs.size(); ++j) {
          part.pieces.push_back(Piece{d->files[f], d->specs[j].path, 0, false, "", 1, (*seen)[j].num_samples});
        }
        d->parts.push_back(std::move(part));
      }
      checked.resize(d->parts.size(), true);
      continue;
    }
    const size_t before = d->parts.size();
    GPUFEED_RETURN_IF_ERROR(d->AddParts(f, *ds));
    bool is_virtual = false;
    for (const SpecFacts& x : *seen) is_virtual = is_virtual || x.is_virtual;
    any_virtual = any_virtual || is_virtual;
    checked.resize(d->parts.size(), false);
    {
      MutexLock lock(&d->mu);  // no reader yet: for the analysis
      d->open.resize(d->parts.size());
      d->last_use.resize(d->parts.size(), 0);
    }
    // A file without virtual fields is one part, read from the datasets just opened.
    if (!is_virtual && d->parts.size() > before) {
      GPUFEED_RETURN_IF_ERROR(first_open(before, std::make_shared<const OpenFile>(std::move(*ds))));
    }
  }
  {
    MutexLock lock(&d->mu);  // no reader yet: for the analysis
    d->open.resize(d->parts.size());
    d->last_use.resize(d->parts.size(), 0);
    d->unread.assign(d->parts.size(), 0);
  }
  if (any_virtual) GPUFEED_RETURN_IF_ERROR(d->ProbeVirtualSources(options.probe_timeout_ms));
  // The parts of virtual fields: their sources opened once (checked,
  // lengths recorded).
  for (size_t p = 0; p < d->parts.size(); ++p) {
    if (checked[p]) continue;
    auto opened = d->OpenPart(p);
    if (!opened.ok()) return opened.status();
    GPUFEED_RETURN_IF_ERROR(first_open(p, std::make_shared<const OpenFile>(std::move(*opened))));
  }
  d->Lay(unit, data);
  return std::unique_ptr<FieldSource>(new FieldSource(std::move(d)));
}

uint64_t FieldSource::num_samples() const { return impl_->num_samples; }
const std::vector<uint64_t>& FieldSource::sample_shape() const { return impl_->sample_shape; }
uint64_t FieldSource::sample_bytes() const { return impl_->sample_bytes; }
DType FieldSource::dtype() const { return impl_->dtype; }
uint64_t FieldSource::chunk_samples() const { return impl_->chunk_samples; }
uint64_t FieldSource::num_chunks() const { return impl_->num_chunks; }
uint64_t FieldSource::samples_in_chunk(uint64_t i) const { return impl_->UnitSamples(i); }
uint64_t FieldSource::stored_chunk_bytes(uint64_t i) const { return impl_->UnitSamples(i) * impl_->sample_bytes; }
const std::vector<int64_t>& FieldSource::labels() const {
  static const std::vector<int64_t> kNone;
  return kNone;
}
std::string FieldSource::name() const { return impl_->what; }
std::vector<FieldInfo> FieldSource::fields() const { return impl_->fields; }
SourceAttributes FieldSource::attributes() const { return impl_->attributes; }
const std::vector<std::string>& FieldSource::files() const { return impl_->files; }

std::pair<size_t, uint64_t> FieldSource::Locate(uint64_t index) const {
  const auto& ff = impl_->file_first;
  const size_t f = static_cast<size_t>(std::upper_bound(ff.begin(), ff.end(), index) - ff.begin() - 1);
  return {f, index - ff[f]};
}

ChunkSource::OpenCosts FieldSource::open_costs() const {
  OpenCosts c;
  c.probe_seconds = impl_->probe_ns.load(std::memory_order_relaxed) * 1e-9;
  c.open_seconds = impl_->open_ns.load(std::memory_order_relaxed) * 1e-9;
  MutexLock lock(&impl_->count_mu);
  c.opens = impl_->opens;
  c.planned_opens = impl_->planned_opens;
  return c;
}

size_t FieldSource::open_files() const {
  MutexLock lock(&impl_->mu);
  return impl_->open_list.size();
}

void FieldSource::WillRead(uint64_t i) const {
  const Impl& d = *impl_;
  if (i >= d.num_chunks) return;
  constexpr size_t kMaxAhead = 4096;  // hints, not orders: past this many waiting, one is dropped
  {
    MutexLock lock(&d.mu);
    if (d.stopping || d.ahead.size() >= kMaxAhead) return;
    d.ahead.push_back(i);
    d.StartOpener();
  }
  d.work_cv.Signal();
}

Status FieldSource::ReadChunk(uint64_t i, std::span<std::byte> dst) const {
  const Impl& d = *impl_;
  if (i >= d.num_chunks) {
    return Status::InvalidArgument(d.what + ": unit " + std::to_string(i) + " out of range (" +
                                   std::to_string(d.num_chunks) + " units)");
  }
  const size_t p = d.PartOfUnit(i);
  const Part& part = d.parts[p];
  const uint64_t n = d.UnitSamples(i);
  const uint64_t local = (i - d.unit_first[p]) * d.chunk_samples;
  const uint64_t capacity = d.fields.size() == 1 ? n : d.chunk_samples;
  if (dst.size() < capacity * d.sample_bytes) {
    return Status::InvalidArgument(d.what + ": unit " + std::to_string(i) + ": destination holds " +
                                   std::to_string(dst.size()) + " bytes, the unit needs " +
                                   std::to_string(capacity * d.sample_bytes));
  }
  const std::string where = d.files[part.file] + " (unit " + std::to_string(i) + ", samples [" +
                            std::to_string(d.part_first[p] + local) + ", " +
                            std::to_string(d.part_first[p] + local + n) + ") of " + d.what + ")";
  auto file = d.Acquire(p);
  if (!file.ok()) return file.status().WithContext(where);
  for (size_t j = 0; j < d.fields.size(); ++j) {
    const FieldInfo& fi = d.fields[j];
    const Piece& pc = part.pieces[j];
    std::span<std::byte> out = dst.subspan(capacity * fi.offset, n * fi.sample_bytes);
    // A stacked source is one sample (first and local are 0): all its rows.
    Status s = (**file)[j].ReadSamples((pc.first + local) * pc.rows, n * pc.rows, out);
    if (!s.ok()) return pc.via.empty() ? s.WithContext(where) : s.WithContext("source of " + pc.via).WithContext(where);
  }
  return Status::Ok();
}

}  // namespace gpufeed
