// ProbeFiles (hdf5io/hdf5/probe.h): fork, open in the child, watch from the parent.
#include "hdf5io/hdf5/probe.h"

#include <hdf5.h>

#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <string>
#include <vector>

#include "common/sizes.h"
#include "gpufeed/encoded.h"
#include "hdf5io/hdf5/fork_gate.h"
#include "hdf5io/hdf5/remote_vfd.h"
#include "hdf5io/hdf5/h5_util.h"

namespace gpufeed {

// A spec that names one dataset is issued as "file:/path" (the form
// FieldSource keys its opens by), so the same dataset reached by another
// spelling ("file.h5" for "file.h5:/images") is known as probed.
struct ProbedSpecIssuer {
  static ProbedSpec Issue(std::string spec) {
    if (auto s = DatasetSpec::Parse(spec); s.ok()) return ProbedSpec(s->file + ":" + s->images);
    return ProbedSpec(std::move(spec));
  }
};

namespace {

using Clock = std::chrono::steady_clock;

// Child messages: 'S' (4-byte index) before a file, 'D' (index) after it,
// and between them 'F' (index) with the spec's facts: a 4-byte length, then
// dtype, is_bool, is_virtual and rank (a byte each), num_samples and the
// sample shape (8 bytes each); then, when the payload is longer, the direct
// path's plan (DirectPlan): the file's identity (device, inode, size, mtime
// and ctime in ns), contiguous and the filter count (a byte each, two zero
// bytes), the contiguous address, chunk_samples and the chunk count, each
// filter (id 4 bytes, element size 8, block 8, compression 4) and each chunk
// (address 8, stored size 8, mask 4). Each message is one write() of at
// most PIPE_BUF bytes, so it reaches the pipe whole or not at all; a plan
// that would not fit is not sent (a file of more chunks than about 180 is
// opened through HDF5, whose open costs little beside reading it).
struct Msg {
  char tag;
  uint32_t index;
} __attribute__((packed));

constexpr size_t kMaxRank = 32;  // HDF5's H5S_MAX_RANK
constexpr size_t kMaxPayloadBytes = PIPE_BUF - sizeof(Msg) - 4;
constexpr size_t kFactsHeadBytes = 4 + 8;
constexpr size_t kPlanHeadBytes = 5 * 8 + 4 + 3 * 8;
constexpr size_t kPlanStepBytes = 4 + 8 + 8 + 4;
constexpr size_t kPlanChunkBytes = 8 + 8 + 4;
constexpr size_t kMaxPlanSteps = 8;
static_assert(kFactsHeadBytes + 8 * kMaxRank + kPlanHeadBytes + kPlanStepBytes * kMaxPlanSteps <= kMaxPayloadBytes);

void WriteAll(int fd, const void* data, size_t n) {
  ssize_t r;
  do {
    r = ::write(fd, data, n);
  } while (r < 0 && errno == EINTR);
}

void WriteMsg(int fd, char tag, uint32_t index) {
  Msg m{tag, index};
  WriteAll(fd, &m, sizeof(m));
}

void WriteFacts(int fd, uint32_t index, const Dataset& ds) {
  const std::vector<uint64_t>& shape = ds.sample_shape();
  if (shape.size() > kMaxRank) return;
  std::byte buf[sizeof(Msg) + 4 + kMaxPayloadBytes];
  size_t at = 0;
  auto put = [&](const void* p, size_t n) {
    std::memcpy(buf + at, p, n);
    at += n;
  };
  const Msg m{'F', index};
  put(&m, sizeof(m));
  const size_t facts_bytes = kFactsHeadBytes + 8 * shape.size();
  // A contiguous dataset's plan has no chunk list, whatever its size.
  const size_t max_chunks =
      (kMaxPayloadBytes - facts_bytes - kPlanHeadBytes - kPlanStepBytes * kMaxPlanSteps) / kPlanChunkBytes;
  DirectPlan plan;
  const bool planned = (ds.info().storage == "contiguous" || ds.num_chunks() <= max_chunks) && ds.Plan(&plan) &&
                       plan.pipeline.size() <= kMaxPlanSteps && plan.chunk_addr.size() <= max_chunks;
  const size_t nchunks = plan.chunk_addr.size();
  const uint32_t len = static_cast<uint32_t>(
      facts_bytes + (planned ? kPlanHeadBytes + kPlanStepBytes * plan.pipeline.size() + kPlanChunkBytes * nchunks : 0));
  put(&len, 4);
  const uint8_t head[4] = {static_cast<uint8_t>(ds.dtype()), static_cast<uint8_t>(ds.is_bool()),
                           static_cast<uint8_t>(!ds.info().virtual_sources.empty()),
                           static_cast<uint8_t>(shape.size())};
  put(head, 4);
  const uint64_t n = ds.num_samples();
  put(&n, 8);
  for (uint64_t d : shape) put(&d, 8);
  if (planned) {
    const io::FileIdentity& id = plan.identity;
    put(&id.dev, 8);
    put(&id.ino, 8);
    put(&id.size, 8);
    put(&id.mtime_ns, 8);
    put(&id.ctime_ns, 8);
    const uint8_t form[4] = {static_cast<uint8_t>(plan.contiguous), static_cast<uint8_t>(plan.pipeline.size()), 0, 0};
    put(form, 4);
    const uint64_t count = nchunks;
    put(&plan.contiguous_addr, 8);
    put(&plan.chunk_samples, 8);
    put(&count, 8);
    for (const codec::FilterStep& s : plan.pipeline) {
      const int32_t id32 = s.id, compression = s.compression;
      const uint64_t elem = s.elem_size;
      put(&id32, 4);
      put(&elem, 8);
      put(&s.block, 8);
      put(&compression, 4);
    }
    for (size_t i = 0; i < nchunks; ++i) {
      put(&plan.chunk_addr[i], 8);
      put(&plan.chunk_size[i], 8);
      put(&plan.chunk_mask[i], 4);
    }
  }
  WriteAll(fd, buf, at);
}

// A plan's payload (after the facts): nullptr when it does not parse or does
// not hold together: filters the direct path does not decode, chunks that do
// not tile the facts' samples or lie past the file's end.
std::shared_ptr<const DirectPlan> ParsePlan(const SpecFacts& f, const std::byte* p, size_t n) {
  if (n < kPlanHeadBytes || f.is_virtual) return nullptr;
  auto plan = std::make_shared<DirectPlan>();
  size_t at = 0;
  auto get = [&](void* out, size_t k) {
    std::memcpy(out, p + at, k);
    at += k;
  };
  io::FileIdentity& id = plan->identity;
  get(&id.dev, 8);
  get(&id.ino, 8);
  get(&id.size, 8);
  get(&id.mtime_ns, 8);
  get(&id.ctime_ns, 8);
  uint8_t form[4];
  get(form, 4);
  uint64_t count = 0;
  get(&plan->contiguous_addr, 8);
  get(&plan->chunk_samples, 8);
  get(&count, 8);
  const size_t steps = form[1];
  if (form[0] > 1 || steps > kMaxPlanSteps || form[2] != 0 || form[3] != 0) return nullptr;
  if (count > kMaxPayloadBytes / kPlanChunkBytes ||
      n != kPlanHeadBytes + kPlanStepBytes * steps + kPlanChunkBytes * count) {
    return nullptr;
  }
  plan->contiguous = form[0] != 0;
  for (size_t k = 0; k < steps; ++k) {
    int32_t id32 = 0, compression = 0;
    uint64_t elem = 0, block = 0;
    get(&id32, 4);
    get(&elem, 8);
    get(&block, 8);
    get(&compression, 4);
    if (!codec::DirectPathDecodes(id32) || elem == 0 || elem > (1u << 16) || block > (uint64_t{1} << 32) ||
        (compression != 0 && !(id32 == codec::kFilterBitshuffle && compression == 2))) {
      return nullptr;
    }
    plan->pipeline.push_back(codec::FilterStep{id32, static_cast<size_t>(elem), block, compression});
  }
  if (!codec::DirectPathCanDecode(plan->pipeline)) return nullptr;
  const auto sample_bytes = CheckedProduct(DTypeSize(f.dtype), f.sample_shape);
  const auto raw_bytes = sample_bytes ? CheckedMul(f.num_samples, *sample_bytes) : std::nullopt;
  if (!raw_bytes) return nullptr;
  if (plan->contiguous) {
    const auto end = CheckedAdd(plan->contiguous_addr, *raw_bytes);
    if (steps != 0 || count != 0 || !end || *end > id.size) return nullptr;
    return plan;
  }
  const uint64_t cs = plan->chunk_samples;
  const auto chunk_bytes = CheckedMul(cs, *sample_bytes);
  if (cs == 0 || !chunk_bytes || *chunk_bytes >= (uint64_t{1} << 32)) return nullptr;
  if (count != (f.num_samples + cs - 1) / cs) return nullptr;
  plan->chunk_addr.resize(count);
  plan->chunk_size.resize(count);
  plan->chunk_mask.resize(count);
  for (size_t i = 0; i < count; ++i) {
    get(&plan->chunk_addr[i], 8);
    get(&plan->chunk_size[i], 8);
    get(&plan->chunk_mask[i], 4);
    const auto end = CheckedAdd(plan->chunk_addr[i], plan->chunk_size[i]);
    if (!end || *end > id.size) return nullptr;
  }
  return plan;
}

// The facts of an 'F' message's payload; nullopt when it does not parse
// (the parent never trusts a child's bytes further than this). A plan that
// does not parse is dropped (the file is then opened through HDF5).
std::optional<SpecFacts> ParseFacts(const std::byte* p, size_t n) {
  if (n < kFactsHeadBytes) return std::nullopt;
  const uint8_t dtype = static_cast<uint8_t>(p[0]), is_bool = static_cast<uint8_t>(p[1]),
                is_virtual = static_cast<uint8_t>(p[2]), rank = static_cast<uint8_t>(p[3]);
  const size_t facts_bytes = kFactsHeadBytes + 8 * size_t{rank};
  if (rank > kMaxRank || n < facts_bytes || is_bool > 1 || is_virtual > 1) return std::nullopt;
  if (n != facts_bytes && n < facts_bytes + kPlanHeadBytes) return std::nullopt;
  if (dtype > static_cast<uint8_t>(DType::kFloat64)) return std::nullopt;
  SpecFacts f;
  f.dtype = static_cast<DType>(dtype);
  f.is_bool = is_bool != 0;
  f.is_virtual = is_virtual != 0;
  std::memcpy(&f.num_samples, p + 4, 8);
  f.sample_shape.resize(rank);
  if (rank > 0) std::memcpy(f.sample_shape.data(), p + kFactsHeadBytes, 8 * size_t{rank});
  if (n > facts_bytes) f.plan = ParsePlan(f, p + facts_bytes, n - facts_bytes);
  return f;
}

// The child: opens each file of [first, last) as Dataset::Open does, then
// _exit(0). Never returns.
// A forked child about to let HDF5 parse a file that may crash or hang it.
void BecomeSacrificialChild() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the parent
  struct rlimit no_core {
    0, 0
  };
  ::setrlimit(RLIMIT_CORE, &no_core);  // a crash here is expected: no core file
  // glibc's and HDF5's last words ("malloc(): corrupted top size") would
  // only confuse the parent's clear error.
  if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, STDERR_FILENO);
}

// pipe + fork (h5::ForkOutsideHdf5): in the parent, the child's pid and the
// pipe's read end; the child runs child(write end), the read end closed, and
// never returns.
struct Forked {
  pid_t pid = -1;
  int fd = -1;
};
Result<Forked> ForkWithPipe(const char* what, const std::function<void(int fd)>& child) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::IOError(std::string(what) + ": pipe: " + std::strerror(errno));
  const pid_t pid = h5::ForkOutsideHdf5([&] {
    ::close(fds[0]);
    child(fds[1]);
  });
  if (pid < 0) {
    const int error = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::IOError(std::string(what) + ": fork: " + std::strerror(error));
  }
  ::close(fds[1]);
  return Forked{pid, fds[0]};
}

std::string FileOf(const std::string& spec) {
  auto s = DatasetSpec::Parse(spec);
  return s.ok() ? s->file : spec;
}

// careful: HDF5 restarted (H5close) after each file, so that a crash is the
// file's own, never what an earlier file left in the library; else once, at
// the end (half the probe's time for small files). A crash or hang in a
// child that was not careful and had probed files before is probed again,
// carefully, from its first file (ProbeFiles).
// Whether h5py is loaded in this process: it registers HDF5 type conversion
// functions that take Python's GIL, and H5close calls them. In a forked
// child the GIL may be held by a thread that is not there (any other Python
// thread running at the fork): H5close then waits forever. Asked in the
// parent (dl_iterate_phdr takes the loader's lock, which a fork can leave
// held).
bool H5pyLoaded() {
  int found = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "/h5py/") != nullptr) {
          *static_cast<int*>(data) = 1;
          return 1;
        }
        return 0;
      },
      &found);
  return found != 0;
}

// shutdown: H5close in the child (a crash or hang in HDF5's shutdown with the
// file is seen); false where h5py is loaded (H5pyLoaded).
[[noreturn]] void ChildMain(int fd, const std::vector<std::string>& specs, size_t first, size_t last,
                            const ProbeOptions& options, bool careful, bool shutdown) {
  BecomeSacrificialChild();
  OpenOptions o = options.open;
  // What this child runs in a process of its own (the dataset listing of a
  // "no such dataset" error, ListDatasetsIsolated) waits past the parent's
  // limit: the parent's clock, started at 'S', decides that a file hangs.
  // With one limit for both, a parent late to wake (a loaded machine) let
  // the listing give up first; the child then finished the spec, the probe
  // passed a file that hangs HDF5, and the caller's own open hung on it again.
  o.probe_timeout_ms =
      static_cast<int>(std::min<int64_t>(INT_MAX, 2 * int64_t{std::max(1, options.timeout_ms)} + 1000));
  for (size_t i = first; i < last; ++i) {
    WriteMsg(fd, 'S', static_cast<uint32_t>(i));
    {
      // This child is the probe: what it opens, it opens unprobed.
      const ProbedSpec spec = ProbedSpecIssuer::Issue(specs[i]);
      auto ds = Dataset::Open(spec, o);
      if (ds.ok()) WriteFacts(fd, static_cast<uint32_t>(i), *ds);
      if (!ds.ok()) {
        // An encoded image field is a group (or an h5py vlen dataset):
        // opened as the loader opens it, its byte dataset and index too.
        if (auto kind = DetectEncoded(spec, o); kind.ok() && *kind != EncodedStorage::kNone) {
          (void)OpenEncodedImages(spec, o, DecodeOptions{});
        }
      }
      if (ds.ok() && ds->info().read_path == ReadPath::kHdf5 && ds->num_samples() > 0) {
        // HDF5 decodes on this path: its filters see the file's bytes too.
        // One HDF5 chunk's row of samples is enough for that (a read unit
        // can span 10^5 tiny chunks of a sparse file: seconds for nothing).
        const auto& cs = ds->info().hdf5_chunk_shape;
        const uint64_t n = std::min<uint64_t>(ds->num_samples(), cs.empty() ? 1 : std::max<uint64_t>(1, cs[0]));
        const auto bytes = CheckedMul(n, ds->sample_bytes());
        if (bytes && *bytes <= (uint64_t{256} << 20)) {
          std::vector<std::byte> buf(*bytes);
          (void)ds->ReadSamples(0, n, buf);
        }
      }
    }  // closes every handle: HDF5 has crashed while closing hostile files too
    // and while shutting down with them (the caller's exit would). Careful:
    // once a file, after its last spec (the specs of a file are usually
    // adjacent: FieldSource sorts them), as restarting HDF5 costs about as
    // much as opening a small file.
    if (shutdown && careful && (i + 1 == last || FileOf(specs[i + 1]) != FileOf(specs[i]))) H5close();
    WriteMsg(fd, 'D', static_cast<uint32_t>(i));
  }
  if (shutdown && !careful) H5close();  // a crash here is seen by the exit status: probed again, carefully
  ::_exit(0);
}

std::string SignalText(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigdescr_np(sig);
    return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  size_t first = 0;           // the first file it probed (HDF5 was fresh there)
  size_t next = 0, last = 0;  // files [next, last) not yet finished
  bool in_file = false;       // 'S' seen for `next`, no 'D' yet
  bool careful = false;       // ChildMain's: HDF5 restarted after each file
  Clock::time_point file_start;
};

// Files [first, last) for one child; careful: HDF5 restarted after each.
struct ProbeShare {
  size_t first, last;
  bool careful;
};

void KillChild(const Child& c) {
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, nullptr, 0);
  ::close(c.fd);
}

// A crash or hang at spec c.next is that file's own when HDF5 saw no
// other file in the child before it; else the child's files are probed
// again, each after a restart of HDF5, and the rest go on as before.
bool OwnFailure(const std::vector<std::string>& specs, const Child& c) {
  if (c.careful) return true;
  for (size_t i = c.first; i < c.next; ++i) {
    if (FileOf(specs[i]) != FileOf(specs[c.next])) return false;
  }
  return true;
}

void AgainCarefully(const Child& c, std::vector<ProbeShare>* respawn) {
  const size_t end = std::min(c.next + 1, c.last);
  respawn->push_back({c.first, end, true});
  if (end < c.last) respawn->push_back({end, c.last, false});
}

// The child's messages waiting in its pipe: where it is ('S' a spec
// started, 'D' done) and what it found ('F'). true: it ended (EOF, or a
// message that makes no sense, after which it is killed).
bool ReadMessages(Child& c, Clock::time_point now, std::vector<std::optional<SpecFacts>>* facts) {
  Msg m;
  ssize_t n;
  while ((n = ::read(c.fd, &m, sizeof(m))) == static_cast<ssize_t>(sizeof(m))) {
    if (m.tag == 'S') {
      c.next = m.index;
      c.in_file = true;
      c.file_start = now;
    } else if (m.tag == 'D') {
      c.next = m.index + 1;
      c.in_file = false;
    } else if (m.tag == 'F') {
      // The rest of the message is in the pipe already (one write).
      uint32_t len = 0;
      std::byte payload[kMaxPayloadBytes];
      if (::read(c.fd, &len, 4) != 4 || len > kMaxPayloadBytes ||
          ::read(c.fd, payload, len) != static_cast<ssize_t>(len)) {
        ::kill(c.pid, SIGKILL);  // a child that writes nonsense is treated as one that died here
        n = 0;
        break;
      }
      if (facts != nullptr && c.in_file && m.index == c.next) (*facts)[m.index] = ParseFacts(payload, len);
    }
    pollfd one{c.fd, POLLIN, 0};
    if (::poll(&one, 1, 0) <= 0 || !(one.revents & POLLIN)) break;
  }
  return n == 0;  // EOF: the child exited or died
}

// One child after a poll (revents: its pipe's): its messages read, and if
// it hung or ended, its verdict in *out and what it left to probe in
// *respawn; a child still at work goes to *still.
void TendChild(Child c, short revents, Clock::time_point now, std::chrono::milliseconds limit,
               const std::vector<std::string>& specs, std::vector<std::optional<SpecFacts>>* facts,
               std::vector<Status>& out, std::vector<Child>* still, std::vector<ProbeShare>* respawn) {
  bool ended = false;
  if (revents & (POLLIN | POLLHUP | POLLERR)) ended = ReadMessages(c, now, facts);
  if (!ended && c.file_start + limit <= now && c.next >= c.last) {
    // Every answer is in, and the child has not left HDF5 within the
    // limit: stuck in its shutdown (H5close in a process whose HDF5 has
    // another user, h5py's hooks waiting for a lock the fork left held).
    // Its answers stand; without this the parent waited for it forever,
    // waking at once again and again (its deadline long past).
    KillChild(c);
    return;
  }
  if (!ended && c.file_start + limit <= now && c.next < c.last) {
    KillChild(c);
    if (!OwnFailure(specs, c)) return AgainCarefully(c, respawn);
    out[c.next] =
        Status::Corrupt(FileOf(specs[c.next]) + ": HDF5 did not finish reading this file's metadata within " +
                        std::to_string(limit.count()) +
                        " ms (in a probe process): damaged or hostile file; if you trust it and it is only slow, pass "
                        "--trust-files (OpenOptions::trust_files) to skip the probe");
    if (c.next + 1 < c.last) respawn->push_back({c.next + 1, c.last, c.careful});
    return;
  }
  if (!ended) {
    still->push_back(c);
    return;
  }
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  ::close(c.fd);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && c.next >= c.last) return;
  if (c.next >= c.last) {
    // Died in HDF5's shutdown after its last file: careful children
    // shut down after each file, inside it, so this one was not.
    if (!c.careful) respawn->push_back({c.first, c.last, true});
    return;
  }
  if (!OwnFailure(specs, c)) return AgainCarefully(c, respawn);
  // Died: the file it was in (or was about to start) is the culprit.
  out[c.next] =
      Status::Corrupt(FileOf(specs[c.next]) + ": HDF5 crashed reading this file's metadata (" + SignalText(status) +
                      " in a probe process): damaged or hostile file; gpufeed will not open it");
  if (c.next + 1 < c.last) respawn->push_back({c.next + 1, c.last, c.careful});
}

}  // namespace

// The one maker of ProbedSpecs (a friend of the class).

namespace {
std::atomic<uint64_t> g_specs_probed{0};
}  // namespace

uint64_t SpecsProbed() { return g_specs_probed.load(); }

std::vector<Status> ProbeFiles(const std::vector<std::string>& specs, const ProbeOptions& options,
                               std::vector<std::optional<SpecFacts>>* facts) {
  std::vector<Status> out(specs.size());
  if (facts != nullptr) facts->assign(specs.size(), std::nullopt);
  if (specs.empty()) return out;
  g_specs_probed.fetch_add(specs.size());
  const size_t procs = std::clamp<size_t>(static_cast<size_t>(std::max(1, options.processes)), 1, specs.size());
  // Contiguous shares, refilled by a fresh child after a crash or a hang.
  std::vector<ProbeShare> todo;
  for (size_t p = 0; p < procs; ++p) {
    todo.push_back({specs.size() * p / procs, specs.size() * (p + 1) / procs, false});
  }
  std::vector<Child> live;
  const bool shutdown = !H5pyLoaded();
  auto spawn = [&](size_t first, size_t last, bool careful) -> Status {
    auto forked = ForkWithPipe("probe", [&](int fd) { ChildMain(fd, specs, first, last, options, careful, shutdown); });
    if (!forked.ok()) return forked.status();
    Child c;
    c.pid = forked->pid;
    c.fd = forked->fd;
    c.first = first;
    c.next = first;
    c.last = last;
    c.careful = careful;
    c.file_start = Clock::now();
    live.push_back(c);
    return Status::Ok();
  };
  for (auto [a, b, careful] : todo) {
    if (a < b) {
      if (Status st = spawn(a, b, careful); !st.ok()) {
        for (Child& c : live) KillChild(c);
        return std::vector<Status>(specs.size(), st);
      }
    }
  }
  const auto limit = std::chrono::milliseconds(std::max(1, options.timeout_ms));
  while (!live.empty()) {
    std::vector<pollfd> pfds;
    for (const Child& c : live) pfds.push_back({c.fd, POLLIN, 0});
    // Wake for the nearest deadline.
    auto now = Clock::now();
    auto wait = limit;
    for (const Child& c : live) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.file_start + limit - now);
      wait = std::min(wait, std::max(left, std::chrono::milliseconds(0)));
    }
    const int r = ::poll(pfds.data(), pfds.size(), static_cast<int>(wait.count()) + 1);
    if (r < 0 && errno != EINTR) break;
    now = Clock::now();
    std::vector<Child> still;
    std::vector<ProbeShare> respawn;
    for (size_t k = 0; k < live.size(); ++k) {
      TendChild(live[k], pfds[k].revents, now, limit, specs, facts, out, &still, &respawn);
    }
    live = std::move(still);
    // Let the children's messages gather for a millisecond before the next
    // poll: waking for each of them (three or more a spec) was a fifth of a
    // many-file probe's time, in the kernel's wake-ups and task switches.
    if (!live.empty() && r > 0) ::usleep(1000);
    for (auto [a, b, careful] : respawn) {
      if (Status st = spawn(a, b, careful); !st.ok()) {
        for (size_t i = a; i < b; ++i) out[i] = st;
      }
    }
  }
  return out;
}

bool TrustFiles(const OpenOptions& open) {
  const char* env = std::getenv("GPUFEED_TRUST_FILES");
  return open.trust_files || (env != nullptr && std::string_view(env) == "1");
}

Result<ProbedSpec> Probe(const std::string& spec, const OpenOptions& open) {
  ProbeOptions po;
  po.open = open;
  po.timeout_ms = open.probe_timeout_ms;
  po.processes = 1;
  return std::move(ProbeAll({spec}, po)[0]);
}

std::vector<Result<ProbedSpec>> ProbeAll(const std::vector<std::string>& specs, const ProbeOptions& options,
                                         std::vector<std::optional<SpecFacts>>* facts) {
  std::vector<Result<ProbedSpec>> out;
  out.reserve(specs.size());
  if (TrustFiles(options.open)) {
    if (facts != nullptr) facts->assign(specs.size(), std::nullopt);
    for (const std::string& s : specs) out.push_back(ProbedSpecIssuer::Issue(s));
    return out;
  }
  std::vector<Status> probed = ProbeFiles(specs, options, facts);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (probed[i].ok()) {
      out.push_back(ProbedSpecIssuer::Issue(specs[i]));
    } else {
      out.push_back(std::move(probed[i]));
    }
  }
  return out;
}

Result<std::vector<std::string>> ListDatasetsIsolated(const std::string& file, int timeout_ms, size_t max_bytes) {
  auto forked = ForkWithPipe("list datasets", [&](int fd) {
    BecomeSacrificialChild();
    auto fapl = h5::FileAccessFor(file);  // an object: through the remote driver
    const hid_t f = fapl.ok() ? H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl->get()) : H5I_INVALID_HID;
    std::string names;  // NUL-terminated names: HDF5 allows newlines in them
    if (f >= 0) {
      for (const std::string& n : h5::ListDatasets(f)) {
        if (names.size() + n.size() + 1 > max_bytes) break;
        names += n;
        names.push_back('\0');
      }
    }
    for (size_t off = 0; off < names.size();) {
      const ssize_t w = ::write(fd, names.data() + off, names.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    ::_exit(0);  // no H5Fclose: closing a hostile file has crashed HDF5 too, and the answer is out
  });
  if (!forked.ok()) return forked.status();
  const pid_t pid = forked->pid;
  const int fd = forked->fd;
  std::string got;
  bool timed_out = false;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(1, timeout_ms));
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd one{fd, POLLIN, 0};
    const int r = ::poll(&one, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child is done (or died)
    if (got.size() < max_bytes) got.append(buf, static_cast<size_t>(std::min<size_t>(n, max_bytes - got.size())));
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::close(fd);
  if (timed_out) {
    return Status::Corrupt(file + ": HDF5 did not finish listing this file's datasets within " +
                           std::to_string(timeout_ms) + " ms (in a child process): damaged or hostile file");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Corrupt(file + ": HDF5 crashed listing this file's datasets (" + SignalText(status) +
                           " in a child process): damaged or hostile file; gpufeed will not open it");
  }
  std::vector<std::string> out;
  for (size_t a = 0; a < got.size();) {
    const size_t z = got.find('\0', a);
    if (z == std::string::npos) break;  // a name cut by max_bytes
    out.push_back(got.substr(a, z - a));
    a = z + 1;
  }
  return out;
}

}  // namespace gpufeed
