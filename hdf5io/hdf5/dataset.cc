// Dataset: opens an HDF5 images dataset, decides the read path, enumerates the
// chunk index once, and serves ReadChunk either by pread + codec (direct) or
// by H5Dread through a tuned chunk cache (hdf5).
#include "gpufeed/dataset.h"
#include "gpufeed/stats.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdio>

#include "common/memory.h"
#include "common/mutex.h"
#include "common/sizes.h"
#include "hdf5io/codec/codec.h"
#include "hdf5io/io/file.h"
#include "hdf5io/io/io_policy.h"
#include "hdf5io/hdf5/chunk_btree.h"
#include "hdf5io/hdf5/chunk_index.h"
#include "hdf5io/hdf5/fork_gate.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/probe.h"
#include "hdf5io/hdf5/reach.h"
#include "hdf5io/hdf5/remote_vfd.h"
#include "hdf5io/io/object_store.h"
#include "hdf5io/hdf5/virtual.h"

namespace gpufeed {
namespace {

constexpr long kFormatVersion = 1;  // the gpufeed_format this build writes and reads (docs/format.md)
constexpr uint64_t kContiguousReadUnitBytes = 4u << 20;  // virtual chunk for contiguous data
constexpr uint64_t kHdf5ReadUnitMinBytes = 1u << 20;

uint64_t NextPrime(uint64_t n) {
  auto is_prime = [](uint64_t v) {
    if (v < 2) return false;
    for (uint64_t d = 2; d * d <= v; ++d) {
      if (v % d == 0) return false;
    }
    return true;
  };
  while (!is_prime(n)) ++n;
  return n;
}

std::string FilterName(int id, const char* hdf5_name) {
  switch (id) {
    case codec::kFilterDeflate:
      return "deflate";
    case codec::kFilterShuffle:
      return "shuffle";
    case codec::kFilterZstd:
      return "zstd";
    case 3:
      return "fletcher32";
    case 4:
      return "szip";
    case 5:
      return "nbit";
    case 6:
      return "scaleoffset";
    case 307:
      return "bzip2";
    case codec::kFilterLzf:
      return "lzf";
    case codec::kFilterBlosc:
      return "blosc";
    case codec::kFilterLz4:
      return "lz4";
    case codec::kFilterBitshuffle:
      return "bitshuffle";
    case 32013:
      return "zfp";
    default:
      return hdf5_name[0] ? hdf5_name : "filter " + std::to_string(id);
  }
}

// h5py's bool: a one-byte enum of exactly FALSE=0 and TRUE=1.
bool IsH5pyBool(hid_t type) {
  if (H5Tget_class(type) != H5T_ENUM || H5Tget_size(type) != 1 || H5Tget_nmembers(type) != 2) return false;
  for (unsigned i = 0; i < 2; ++i) {
    char* name = H5Tget_member_name(type, i);
    int8_t value = -1;
    const bool ok = name != nullptr && H5Tget_member_value(type, i, &value) >= 0 &&
                    std::string(name) == (value == 0 ? "FALSE" : "TRUE") && (value == 0 || value == 1);
    if (name) H5free_memory(name);
    if (!ok) return false;
  }
  return true;
}

// An enum's members as "NAME=value" (in the type's order); empty otherwise.
std::vector<std::string> EnumMembers(hid_t type) {
  std::vector<std::string> out;
  if (H5Tget_class(type) != H5T_ENUM) return out;
  const int n = H5Tget_nmembers(type);
  h5::Id base(H5Tget_super(type));
  const bool is_signed = base.valid() && H5Tget_sign(base.get()) == H5T_SGN_2;
  const size_t size = H5Tget_size(type);
  for (int i = 0; i < n && size <= 8; ++i) {
    char* name = H5Tget_member_name(type, unsigned(i));
    unsigned char raw[8] = {};
    if (name != nullptr && H5Tget_member_value(type, unsigned(i), raw) >= 0) {
      // The value in the type's own (native) byte order and size,
      // sign-extended when the base type is signed.
      uint64_t u = 0;
      std::memcpy(&u, raw, size);
      const int shift = 64 - 8 * static_cast<int>(size);
      out.push_back(std::string(name) + "=" +
                    (is_signed ? std::to_string(static_cast<int64_t>(u << shift) >> shift) : std::to_string(u)));
    }
    if (name) H5free_memory(name);
  }
  return out;
}

// Maps an HDF5 numeric type to a DType; nullopt for anything else.
std::optional<DType> DTypeOf(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  // Bit fields (PyTables' bool is H5T_STD_B8LE): the unsigned integer of
  // their size, as h5py reads them.
  if (cls == H5T_INTEGER || cls == H5T_BITFIELD) {
    const bool is_signed = cls == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_2;
    return gpufeed::DTypeOf(is_signed ? DTypeKind::kSignedInt : DTypeKind::kUnsignedInt, size);
  }
  if (cls == H5T_ENUM) {
    // h5py's bool (an enum FALSE=0 / TRUE=1 over int8) is read as its bytes,
    // uint8; any other enum as its integer base type, as h5py reads it.
    if (IsH5pyBool(type)) return DType::kUInt8;
    h5::Id base(H5Tget_super(type));
    return base.valid() ? DTypeOf(base.get()) : std::nullopt;
  }
  if (cls == H5T_FLOAT) return gpufeed::DTypeOf(DTypeKind::kFloat, size);
  return std::nullopt;
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string_view ClassName(H5T_class_t cls) {
  switch (cls) {
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_VLEN:
      return "variable-length";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_TIME:
      return "time";
    default:
      return "non-numeric";
  }
}

}  // namespace

Result<DatasetSpec> DatasetSpec::Parse(std::string_view spec) {
  DatasetSpec out;
  size_t colon = spec.rfind(":/");
  // s3://bucket/key.h5[:/dataset]: the scheme's "://" separates nothing.
  if (io::IsRemoteUrl(spec) && colon != std::string_view::npos && colon <= spec.find("://")) {
    colon = std::string_view::npos;
  }
  if (colon != std::string_view::npos && colon > 0) {
    out.file = std::string(spec.substr(0, colon));
    out.images = std::string(spec.substr(colon + 1));
  } else {
    out.file = std::string(spec);
  }
  if (out.file.empty()) {
    return Status::InvalidArgument("dataset spec '" + std::string(spec) +
                                   "' names no file (expected FILE.h5 or FILE.h5:/dataset)");
  }
  return out;
}

struct Dataset::Impl {
  DatasetInfo info;
  std::vector<uint64_t> sample_shape;
  uint64_t num_samples = 0;
  uint64_t sample_bytes = 0;
  DType dtype = DType::kUInt8;
  bool is_bool = false;
  uint64_t chunk_samples = 1;
  uint64_t num_chunks = 0;
  std::vector<int64_t> labels;
  std::string what;  // "file:/images", the prefix of every error message

  // Direct path: the file's bytes (hdf5io/io/file.h), through the page cache or
  // O_DIRECT with its read-ahead in the loader's order (WillRead), as
  // ChooseIo decided.
  std::unique_ptr<io::RandomAccessFile> bytes;
  io::FileIdentity identity;  // of `bytes`' file, when opened (a plan's check: Plan, OpenPlanned)
  bool contiguous = false;
  bool no_sample_axis = false;  // OpenOptions::no_sample_axis: axis 0 (extent 1) is not in the file
  uint64_t contiguous_addr = 0;
  std::vector<uint64_t> chunk_addr;  // absolute file offsets
  std::vector<uint64_t> chunk_size;  // stored bytes
  std::vector<uint32_t> chunk_mask;  // HDF5 filter mask (bit k: filter k skipped)
  std::vector<codec::FilterStep> pipeline;

  // hdf5 path (and metadata). HDF5's thread-safe build serializes calls
  // anyway; the mutex makes a non-thread-safe build safe too. It guards the
  // HDF5 calls of ReadHdf5, not the handles: those are set by Open before the
  // dataset is shared and not changed after.
  h5::Id file;
  h5::Id dset;
  h5::Id mem_type;
  Mutex h5_mu;

  // Bytes [off, off + n) of the file for chunk i (< n only at end of file)
  // or -errno.
  int64_t ReadAt(uint64_t i, std::byte* dst, size_t n, uint64_t off) const { return bytes->ReadAt(i, dst, n, off); }

  std::string ChunkWhat(uint64_t i) const { return what + " chunk " + std::to_string(i); }

  Status ReadDirect(uint64_t i, std::span<std::byte> dst) const;
  // Chunk i (direct path) is stored exactly as it reads: contiguous, or
  // unfiltered at its full decoded size.
  bool RawChunk(uint64_t i) const {
    if (contiguous) return true;
    if (i >= chunk_size.size()) return false;
    const bool unfiltered = pipeline.empty() || chunk_mask[i] == (1u << pipeline.size()) - 1;
    return unfiltered && chunk_size[i] == chunk_samples * sample_bytes;
  }
  // dst.size() bytes from byte `skip` of raw chunk i (RawChunk(i)).
  Status ReadRawPart(uint64_t i, uint64_t skip, std::span<std::byte> dst) const;
  Status ReadHdf5(uint64_t first, uint64_t count, std::span<std::byte> dst) EXCLUDES(h5_mu);
  Result<std::string> PlanDirectPath(hid_t dcpl, uint64_t userblock, uint64_t file_size);
  // PlanDirectPath's steps (an empty reason: the direct path reads it).
  Result<std::string> PlanContiguous(hid_t dcpl, uint64_t file_size);
  std::string PlanFilters();
  Status WalkChunkIndex(uint64_t userblock, hsize_t allocated, uint64_t n_chunks,
                        const std::vector<uint64_t>& file_extent, const std::vector<uint64_t>& file_chunk,
                        std::vector<h5::ChunkKey>* walked, std::vector<const h5::ChunkKey*>* at_position);
  Status ReadChunkIndex(uint64_t userblock, hsize_t allocated, uint64_t n_chunks,
                        const std::vector<uint64_t>& file_extent, const std::vector<uint64_t>& file_chunk,
                        uint64_t file_size);
  Status ChooseIo(IoMode asked, uint64_t file_size);
  // Dataset::Open's steps, in order, over its state (Opening).
  struct Opening;
  Status OpenFile(Opening& o);
  Status OpenImages(Opening& o);
  Status ReadElementType(Opening& o);
  Status ReadShape(Opening& o);
  Status ReadLayout(Opening& o);
  Status ChooseReadPath(Opening& o);
  Status SetUpHdf5Path(Opening& o, const std::string& reason);
  Status ReadLabels(Opening& o);
  Status ReadAttributes(Opening& o);
  void SetContiguousUnit() {
    chunk_samples = std::clamp<uint64_t>(kContiguousReadUnitBytes / std::max<uint64_t>(1, sample_bytes), 1,
                                         std::max<uint64_t>(1, num_samples));
  }
  std::shared_ptr<Logger> logger;  // OpenOptions::logger
};

// Opens the file for the direct path as io's policy chooses for it
// (hdf5io/io/io_policy.h: IoMode's contract).
Status Dataset::Impl::ChooseIo(IoMode asked, uint64_t file_size) {
  auto policy = io::IoPolicy::Resolve(asked);
  if (!policy.ok()) return policy.status();
  const io::IoChoice choice = policy->For(info.file, file_size);
  IoMode mode = choice.mode;
  info.io_note = choice.note;
  std::string what_io;
  bool fell_back = false;
  auto opened =
      io::OpenRandomAccessFile(info.file, mode == IoMode::kDirect, choice.depth, &what_io, &fell_back, &identity);
  if (!opened.ok()) return opened.status();
  bytes = std::move(*opened);
  if (fell_back) {
    mode = IoMode::kBuffered;
    info.io_note = what_io;
    // Once per process: a trainer opens the same file for each of its loaders.
    static std::once_flag logged;
    std::call_once(logged, [&] {
      LoggerOr(logger).Log(LogLevel::kWarning, "direct_io_unavailable",
                           info.file + ": direct I/O unavailable: " + info.io_note);
    });
  } else if (mode == IoMode::kDirect || io::IsRemoteUrl(info.file)) {
    info.io_note = info.io_note.empty() ? what_io : info.io_note + "; " + what_io;
  }
  info.read_ahead_chunks = bytes->read_ahead();
  info.io = std::string(IoModeName(mode));
  return Status::Ok();
}

Status Dataset::Impl::ReadDirect(uint64_t i, std::span<std::byte> dst) const {
  const uint64_t want = dst.size();
  if (contiguous) {
    const uint64_t off = contiguous_addr + i * chunk_samples * sample_bytes;
    int64_t r = ReadAt(i, dst.data(), want, off);
    if (r < 0) return Status::IOError(ChunkWhat(i) + ": read failed: " + io::ReadErrorText(r));
    if (static_cast<uint64_t>(r) != want) {
      return Status::Corrupt(ChunkWhat(i) + ": file is truncated (needed " + std::to_string(want) +
                             " bytes at offset " + std::to_string(off) + ", got " + std::to_string(r) + ")");
    }
    return Status::Ok();
  }
  const uint64_t stored = chunk_size[i];
  const uint64_t decoded = chunk_samples * sample_bytes;
  const bool unfiltered = pipeline.empty() || chunk_mask[i] == (1u << pipeline.size()) - 1;
  if (unfiltered && stored == decoded) {
    // Raw chunk: read just the prefix the caller wants, straight into dst.
    int64_t r = ReadAt(i, dst.data(), want, chunk_addr[i]);
    if (r < 0) return Status::IOError(ChunkWhat(i) + ": read failed: " + io::ReadErrorText(r));
    if (static_cast<uint64_t>(r) != want) {
      return Status::Corrupt(ChunkWhat(i) + ": file is truncated (chunk at offset " + std::to_string(chunk_addr[i]) +
                             " needs " + std::to_string(want) + " bytes, got " + std::to_string(r) + ")");
    }
    return Status::Ok();
  }
  thread_local std::vector<std::byte> raw;
  thread_local codec::DecodeScratch scratch;
  if (raw.size() < stored) raw.resize(stored);
  int64_t r = ReadAt(i, raw.data(), stored, chunk_addr[i]);
  if (r < 0) return Status::IOError(ChunkWhat(i) + ": read failed: " + io::ReadErrorText(r));
  if (static_cast<uint64_t>(r) != stored) {
    return Status::Corrupt(ChunkWhat(i) + ": file is truncated (chunk at offset " + std::to_string(chunk_addr[i]) +
                           " has " + std::to_string(stored) + " stored bytes, got " + std::to_string(r) + ")");
  }
  return codec::DecodeChunk(pipeline, chunk_mask[i], std::span(raw.data(), stored), decoded, dst, scratch,
                            ChunkWhat(i));
}

Status Dataset::Impl::ReadRawPart(uint64_t i, uint64_t skip, std::span<std::byte> dst) const {
  const uint64_t base = contiguous ? contiguous_addr + i * chunk_samples * sample_bytes : chunk_addr[i];
  const uint64_t off = base + skip;
  const int64_t r = ReadAt(i, dst.data(), dst.size(), off);
  if (r < 0) return Status::IOError(ChunkWhat(i) + ": read failed: " + io::ReadErrorText(r));
  if (static_cast<uint64_t>(r) != dst.size()) {
    return Status::Corrupt(ChunkWhat(i) + ": file is truncated (needed " + std::to_string(dst.size()) +
                           " bytes at offset " + std::to_string(off) + ", got " + std::to_string(r) + ")");
  }
  return Status::Ok();
}

Status Dataset::Impl::ReadHdf5(uint64_t first, uint64_t count, std::span<std::byte> dst) {
  h5::Hdf5Section in_hdf5;  // before h5_mu: a section never waits while holding it
  MutexLock lock(&h5_mu);
  h5::QuietErrors();
  if (no_sample_axis) {  // the one sample is the whole dataset
    if (first != 0 || count != 1 || dst.size() < sample_bytes) {
      return Status::InvalidArgument(what + ": samples [" + std::to_string(first) + ", " +
                                     std::to_string(first + count) + ") of a one-sample (no sample axis) dataset");
    }
    if (H5Dread(dset.get(), mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst.data()) < 0) {
      return Status::Corrupt(what + ": HDF5 read failed: " + h5::LastErrorText());
    }
    return Status::Ok();
  }
  const int rank = static_cast<int>(sample_shape.size()) + 1;
  std::vector<hsize_t> start(rank, 0), cnt(rank);
  start[0] = first;
  cnt[0] = count;
  for (int d = 1; d < rank; ++d) cnt[d] = sample_shape[d - 1];
  h5::Id fspace(H5Dget_space(dset.get()));
  h5::Id mspace(H5Screate_simple(rank, cnt.data(), nullptr));
  if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr) < 0 ||
      H5Dread(dset.get(), mem_type.get(), mspace.get(), fspace.get(), H5P_DEFAULT, dst.data()) < 0) {
    return Status::Corrupt(what + " samples [" + std::to_string(first) + ", " + std::to_string(first + count) +
                           "): HDF5 read failed: " + h5::LastErrorText());
  }
  return Status::Ok();
}

Dataset::Dataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dataset::Dataset(Dataset&&) noexcept = default;
// Closing a Dataset closes HDF5 handles: inside a section, so a probe fork
// made meanwhile (by another source's open, or an opener thread's) never
// copies HDF5's lock held (fork_gate.h).
Dataset& Dataset::operator=(Dataset&& other) noexcept {
  if (this != &other) {
    h5::Hdf5Section in_hdf5;
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Dataset::~Dataset() {
  if (impl_) {
    h5::Hdf5Section in_hdf5;
    impl_.reset();
  }
}

uint64_t Dataset::num_samples() const { return impl_->num_samples; }
const std::vector<uint64_t>& Dataset::sample_shape() const { return impl_->sample_shape; }
uint64_t Dataset::sample_bytes() const { return impl_->sample_bytes; }
DType Dataset::dtype() const { return impl_->dtype; }
uint64_t Dataset::chunk_samples() const { return impl_->chunk_samples; }
uint64_t Dataset::num_chunks() const { return impl_->num_chunks; }
bool Dataset::has_labels() const { return !impl_->info.labels_path.empty(); }
const std::vector<int64_t>& Dataset::labels() const { return impl_->labels; }
const DatasetInfo& Dataset::info() const { return impl_->info; }
bool Dataset::is_bool() const { return impl_->is_bool; }
SourceAttributes Dataset::attributes() const {
  return {impl_->info.layout, impl_->info.class_names, impl_->info.mean, impl_->info.stddev};
}
std::string Dataset::name() const { return impl_->what; }

uint64_t Dataset::samples_in_chunk(uint64_t i) const {
  assert(i < impl_->num_chunks);
  return std::min(impl_->chunk_samples, impl_->num_samples - i * impl_->chunk_samples);
}

uint64_t Dataset::stored_chunk_bytes(uint64_t i) const {
  assert(i < impl_->num_chunks);
  if (impl_->info.read_path == ReadPath::kDirect && !impl_->contiguous) return impl_->chunk_size[i];
  return samples_in_chunk(i) * impl_->sample_bytes;
}

Status Dataset::ReadChunk(uint64_t i, std::span<std::byte> dst) const {
  if (i >= impl_->num_chunks) {
    return Status::InvalidArgument(impl_->what + ": chunk " + std::to_string(i) + " out of range (" +
                                   std::to_string(impl_->num_chunks) + " chunks)");
  }
  const uint64_t n = samples_in_chunk(i);
  const uint64_t want = n * impl_->sample_bytes;
  if (dst.size() < want) {
    return Status::InvalidArgument(impl_->ChunkWhat(i) + ": destination holds " + std::to_string(dst.size()) +
                                   " bytes, chunk needs " + std::to_string(want));
  }
  dst = dst.first(want);
  if (!impl_->info.unreadable.empty()) return Status::Unsupported(impl_->ChunkWhat(i) + ": " + impl_->info.unreadable);
  if (impl_->info.read_path == ReadPath::kDirect) return impl_->ReadDirect(i, dst);
  return impl_->ReadHdf5(i * impl_->chunk_samples, n, dst);
}

uint32_t Dataset::read_ahead_chunks() const {
  if (impl_->info.read_path != ReadPath::kDirect) return 0;
  // Asked each time: a remote object's window moves with the link.
  return impl_->bytes ? impl_->bytes->read_ahead() : impl_->info.read_ahead_chunks;
}

void Dataset::WillRead(uint64_t i) const {
  const Impl& d = *impl_;
  if (d.info.read_path != ReadPath::kDirect || !d.bytes || i >= d.num_chunks) return;
  // The range ReadDirect will read: a raw chunk's wanted prefix, a filtered
  // chunk's stored bytes.
  uint64_t off = 0, len = 0;
  if (d.contiguous) {
    off = d.contiguous_addr + i * d.chunk_samples * d.sample_bytes;
    len = samples_in_chunk(i) * d.sample_bytes;
  } else if (i < d.chunk_addr.size()) {
    off = d.chunk_addr[i];
    len = d.chunk_size[i];
    const bool unfiltered = d.pipeline.empty() || d.chunk_mask[i] == (1u << d.pipeline.size()) - 1;
    if (unfiltered && len == d.chunk_samples * d.sample_bytes) len = samples_in_chunk(i) * d.sample_bytes;
  }
  if (len == 0) return;
  d.bytes->WillRead(i, off, len);
}

Status Dataset::ReadSamples(uint64_t first, uint64_t count, std::span<std::byte> dst) const {
  const uint64_t sb = impl_->sample_bytes;
  if (first + count > impl_->num_samples || dst.size() < count * sb) {
    return Status::InvalidArgument(impl_->what + ": samples [" + std::to_string(first) + ", " +
                                   std::to_string(first + count) + ") out of range or buffer " + "too small");
  }
  if (!impl_->info.unreadable.empty()) return Status::Unsupported(impl_->what + ": " + impl_->info.unreadable);
  if (impl_->info.read_path == ReadPath::kHdf5) return impl_->ReadHdf5(first, count, dst);
  const uint64_t k = impl_->chunk_samples;
  thread_local std::vector<std::byte> tmp;
  uint64_t s = first;
  while (s < first + count) {
    const uint64_t c = s / k;
    const uint64_t c_first = c * k;
    const uint64_t c_n = samples_in_chunk(c);
    const uint64_t take = std::min(first + count, c_first + c_n) - s;
    std::byte* out = dst.data() + (s - first) * sb;
    if (s == c_first && take == c_n) {
      GPUFEED_RETURN_IF_ERROR(ReadChunk(c, std::span(out, take * sb)));
    } else if (impl_->info.read_path == ReadPath::kDirect && impl_->info.unreadable.empty() && impl_->RawChunk(c)) {
      // Part of a chunk stored as it reads (an encoded sample's bytes in
      // a 256 KiB byte chunk): those bytes alone, not the whole chunk.
      GPUFEED_RETURN_IF_ERROR(impl_->ReadRawPart(c, (s - c_first) * sb, std::span(out, take * sb)));
    } else {
      if (tmp.size() < c_n * sb) tmp.resize(c_n * sb);
      GPUFEED_RETURN_IF_ERROR(ReadChunk(c, std::span(tmp.data(), c_n * sb)));
      std::memcpy(out, tmp.data() + (s - c_first) * sb, take * sb);
    }
    s += take;
  }
  return Status::Ok();
}

// The Corrupt status of a chunk index whose entries are not one at each of
// the extent's chunk positions: the entry at fault named when the index is
// small enough to list (h5::ReadChunkKeys), else the counts.
static Status DamagedChunkIndex(hid_t dset, uint64_t entries, uint64_t positions, const std::vector<uint64_t>& extent,
                                const std::vector<uint64_t>& chunk, const std::string& what) {
  constexpr uint64_t kMaxEntriesListed = 4096;  // each costs a walk of the index
  if (entries <= kMaxEntriesListed) {
    auto keys = h5::ReadChunkKeys(dset, kMaxEntriesListed);
    if (!keys.ok()) return keys.status().WithContext(what);
    GPUFEED_RETURN_IF_ERROR(h5::CheckChunkKeys(*keys, extent, chunk, what));
  }
  return Status::Corrupt(what + ": the chunk index holds " + std::to_string(entries) + " entries for the " +
                         std::to_string(positions) + " chunk positions of the extent " + ShapeText(extent) +
                         ", not one at each (a damaged chunk index)");
}

// Picks the read path of a dataset and fills the direct-path chunk index.
// Returns the reason for the hdf5 path, or "" for the direct path.
// Contiguous storage: its address, checked against the file's size; a
// reason when the direct path cannot read it.
Result<std::string> Dataset::Impl::PlanContiguous(hid_t dcpl, uint64_t file_size) {
  Impl& d = *this;
  if (H5Pget_external_count(dcpl) > 0) return std::string("data is in external files");
  haddr_t addr = H5Dget_offset(d.dset.get());
  H5Eclear2(H5E_DEFAULT);
  if (addr == HADDR_UNDEF) return std::string("contiguous storage is not allocated (fill value)");
  d.contiguous = true;
  d.contiguous_addr = addr;  // H5Dget_offset is absolute (user block included); chunk addresses are not
  const auto end = CheckedAdd(d.contiguous_addr, d.info.raw_bytes);
  if (!end || *end > file_size) {
    return Status::Corrupt(d.what + ": file is truncated (" + std::to_string(d.info.raw_bytes) +
                           " bytes of data at byte " + std::to_string(d.contiguous_addr) + ", file has " +
                           std::to_string(file_size) + ")");
  }
  d.SetContiguousUnit();
  return std::string();
}

// Chunks of whole samples and the filter pipeline the direct path decodes
// (into d.pipeline); else the reason it cannot.
std::string Dataset::Impl::PlanFilters() {
  Impl& d = *this;
  const auto& cs = d.info.hdf5_chunk_shape;
  for (size_t k = 1; k < cs.size(); ++k) {
    if (cs[k] != d.info.shape[k]) {
      return std::string("chunks split samples (chunk shape differs from the sample shape past axis 0)");
    }
  }
  for (const FilterInfo& f : d.info.filters) {
    if (!codec::DirectPathDecodes(f.id)) {
      return "filter " + std::to_string(f.id) + " (" + f.name + ") is not handled by the direct path";
    }
    codec::FilterStep step{f.id, DTypeSize(d.dtype)};
    if (f.id == codec::kFilterShuffle && !f.params.empty() && f.params[0] > 0) step.elem_size = f.params[0];
    if (f.id == codec::kFilterBitshuffle) {
      // cd_values {major, minor, elem_size, block_size, compression}.
      if (f.params.size() > 2 && f.params[2] > 0) step.elem_size = f.params[2];
      if (f.params.size() > 3) step.block = f.params[3];
      if (f.params.size() > 4) step.compression = static_cast<int>(f.params[4]);
      if (step.compression != 0 && step.compression != 2) {
        return "filter 32008 (bitshuffle) with compression " + std::to_string(step.compression) +
               " is not handled by the direct path (only none and LZ4)";
      }
    }
    d.pipeline.push_back(step);
  }
  if (!codec::DirectPathCanDecode(d.pipeline)) return std::string("a filter follows a compressor");
  return std::string();
}

// The index in one pass where it is a version 1 B-tree (HDF5's default
// format): each entry to its position (*at_position, pointing into *walked),
// checked as ReadChunkIndex checks. Else (another index kind, or no_sample_axis)
// *at_position stays empty and HDF5 finds each position's entry, walking the
// index for each (quadratic in the chunks).
Status Dataset::Impl::WalkChunkIndex(uint64_t userblock, hsize_t allocated, uint64_t n_chunks,
                                     const std::vector<uint64_t>& file_extent, const std::vector<uint64_t>& file_chunk,
                                     std::vector<h5::ChunkKey>* walked_out,
                                     std::vector<const h5::ChunkKey*>* at_position_out) {
  Impl& d = *this;
  if (d.no_sample_axis) return Status::Ok();
  const auto& cs = d.info.hdf5_chunk_shape;
  std::vector<h5::ChunkKey>& walked = *walked_out;
  std::vector<const h5::ChunkKey*>& at_position = *at_position_out;
  auto keys = h5::WalkChunkBTree(d.dset.get(), d.info.file, userblock, allocated, d.what);
  if (keys.ok() && keys->size() == n_chunks) {
    GPUFEED_RETURN_IF_ERROR(h5::CheckChunkKeys(*keys, file_extent, file_chunk, d.what));
    walked = std::move(*keys);
    at_position.assign(n_chunks, nullptr);
    for (const h5::ChunkKey& k : walked) at_position[k.offset[0] / cs[0]] = &k;
    // The first, middle and last entries as HDF5 finds them (a walk each):
    // where they differ, HDF5's answer for every chunk.
    for (uint64_t i : {uint64_t{0}, n_chunks / 2, n_chunks - 1}) {
      std::vector<hsize_t> at(cs.size(), 0);
      at[0] = i * cs[0];
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      const h5::ChunkKey& k = *at_position[i];
      if (H5Dget_chunk_info_by_coord(d.dset.get(), at.data(), &mask, &addr, &size) < 0 || addr != k.addr ||
          size != k.size || mask != k.mask) {
        H5Eclear2(H5E_DEFAULT);
        at_position.clear();
        break;
      }
    }
  } else if (!keys.ok() && keys.status().code() != StatusCode::kUnsupported) {
    return keys.status();
  }
  return Status::Ok();
}

// Each chunk's address, size and filter mask, from the walked index or
// HDF5's lookup, checked against HDF5's own lookup and the file's size.
Status Dataset::Impl::ReadChunkIndex(uint64_t userblock, hsize_t allocated, uint64_t n_chunks,
                                     const std::vector<uint64_t>& file_extent, const std::vector<uint64_t>& file_chunk,
                                     uint64_t file_size) {
  Impl& d = *this;
  const auto& cs = d.info.hdf5_chunk_shape;
  const size_t skip = d.no_sample_axis ? 1 : 0;
  d.chunk_addr.resize(n_chunks);
  d.chunk_size.resize(n_chunks);
  d.chunk_mask.resize(n_chunks);
  std::vector<const h5::ChunkKey*> at_position;
  std::vector<h5::ChunkKey> walked;
  GPUFEED_RETURN_IF_ERROR(
      WalkChunkIndex(userblock, allocated, n_chunks, file_extent, file_chunk, &walked, &at_position));
  std::vector<hsize_t> offset(cs.size(), 0);
  for (uint64_t i = 0; i < n_chunks; ++i) {
    offset[0] = i * cs[0];
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (!at_position.empty()) {
      const h5::ChunkKey& k = *at_position[i];  // one at each position: checked above
      mask = k.mask, addr = k.addr, size = k.size;
    } else if (H5Dget_chunk_info_by_coord(d.dset.get(), offset.data() + (d.no_sample_axis ? 1 : 0), &mask, &addr,
                                          &size) < 0) {
      // The file's coordinates lack the axis no_sample_axis adds.
      return Status::Corrupt(d.ChunkWhat(i) + ": chunk index unreadable: " + h5::LastErrorText());
    }
    if (addr == HADDR_UNDEF) {
      // As many entries as positions, yet none here: one is elsewhere.
      return DamagedChunkIndex(d.dset.get(), allocated, n_chunks, file_extent, file_chunk, d.what);
    }
    // The walk of the index above matched this entry to the position; HDF5
    // reads through its own lookup, which must find the same chunk (a key
    // that disagrees with its place in a B-tree is found by the one and not
    // the other).
    const std::vector<hsize_t> file_offset(offset.begin() + skip, offset.end());
    auto found = h5::LookupChunkBytes(d.dset.get(), file_offset);
    if (!found.ok() || *found != size) {
      return Status::Corrupt(d.ChunkWhat(i) + ": the chunk index lists " + std::to_string(size) + " bytes at byte " +
                             std::to_string(addr) + " for offset " +
                             ShapeText(std::vector<uint64_t>(file_offset.begin(), file_offset.end())) +
                             ", but HDF5's lookup of that offset finds " +
                             (!found.ok()   ? "nothing (" + found.status().message() + ")"
                              : *found == 0 ? std::string("no chunk (it would read the fill value there)")
                                            : std::to_string(*found) + " bytes") +
                             ": a damaged chunk index (a key that disagrees with its place)");
    }
    d.chunk_addr[i] = userblock + addr;
    d.chunk_size[i] = size;
    d.chunk_mask[i] = mask;
    if (addr > file_size || size > file_size - std::min<uint64_t>(file_size, d.chunk_addr[i]) ||
        d.chunk_addr[i] > file_size) {
      return Status::Corrupt(d.ChunkWhat(i) + ": file is truncated (chunk ends at byte " +
                             std::to_string(d.chunk_addr[i] + size) + ", file has " + std::to_string(file_size) +
                             " bytes)");
    }
  }
  return Status::Ok();
}

Result<std::string> Dataset::Impl::PlanDirectPath(hid_t dcpl, uint64_t userblock, uint64_t file_size) {
  Impl& d = *this;
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (d.info.big_endian) return std::string("data is big-endian");
  if (layout == H5D_COMPACT) return std::string("compact storage");
  if (layout == H5D_VIRTUAL) {
    return "virtual dataset of " + std::to_string(d.info.virtual_sources.size()) +
           " sources: read through HDF5 here; the loader reads each source directly";
  }
  if (layout == H5D_CONTIGUOUS) return PlanContiguous(dcpl, file_size);
  if (layout != H5D_CHUNKED) return std::string("unknown storage layout");
  if (std::string reason = PlanFilters(); !reason.empty()) return reason;
  const auto& cs = d.info.hdf5_chunk_shape;
  d.chunk_samples = cs[0];
  if (cs[0] == 0) return Status::Corrupt(d.what + ": damaged layout: chunk dimension 0 is 0");
  const uint64_t n_chunks = (d.num_samples + cs[0] - 1) / cs[0];
  // Compare with the chunks the file actually stores before sizing the index
  // by the declared shape (a sparse file may declare 2^40 samples).
  hsize_t allocated = 0;
  h5::Id all(H5Dget_space(d.dset.get()));
  if (!all.valid() || H5Dget_num_chunks(d.dset.get(), all.get(), &allocated) < 0) {
    return Status::Corrupt(d.what + ": chunk index unreadable: " + h5::LastErrorText());
  }
  if (allocated < n_chunks) {
    return std::to_string(n_chunks - allocated) + " of " + std::to_string(n_chunks) +
           " chunks are not allocated (they read as the fill value)";
  }
  // The file's own coordinates (no_sample_axis adds an axis it lacks).
  const size_t skip = d.no_sample_axis ? 1 : 0;
  const std::vector<uint64_t> file_extent(d.info.shape.begin() + skip, d.info.shape.end());
  const std::vector<uint64_t> file_chunk(cs.begin() + skip, cs.end());
  // More entries than the extent has chunk positions: one lies outside it,
  // off the grid or on another's position.
  if (allocated > n_chunks)
    return DamagedChunkIndex(d.dset.get(), allocated, n_chunks, file_extent, file_chunk, d.what);
  if (const auto chunk_bytes = CheckedMul(cs[0], d.sample_bytes); !chunk_bytes || *chunk_bytes >= (uint64_t{1} << 32)) {
    return Status::Corrupt(d.what + ": damaged layout: a chunk of " + std::to_string(cs[0]) +
                           " samples exceeds HDF5's 4 GiB chunk limit");
  }
  GPUFEED_RETURN_IF_ERROR(ReadChunkIndex(userblock, allocated, n_chunks, file_extent, file_chunk, file_size));
  return std::string();
}

// Why `spec.images` in `file` is no dataset: a group (with its first members,
// so the user can name one), a named datatype, or what HDF5 said.
static std::string NotADatasetReason(hid_t file, const DatasetSpec& spec) {
  H5O_info_t oi{};
  if (H5Oget_info_by_name(file, spec.images.c_str(), &oi, H5P_DEFAULT) < 0) {
    const std::string hdf5 = h5::LastErrorText();
    H5Eclear2(H5E_DEFAULT);
    return hdf5.empty() ? "HDF5 cannot open it as one" : hdf5;
  }
  if (oi.type == H5O_TYPE_NAMED_DATATYPE) return "it is a named datatype";
  if (oi.type != H5O_TYPE_GROUP) return "HDF5 cannot open it as one";
  std::vector<std::string> members;
  H5Literate_by_name(
      file, spec.images.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        auto* m = static_cast<std::vector<std::string>*>(data);
        m->push_back(name);
        return m->size() >= 8 ? 1 : 0;
      },
      &members, H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  std::string base = spec.images == "/" ? "" : spec.images;
  std::string text = "it is a group";
  if (members.empty()) return text + " with nothing in it";
  text += " holding ";
  for (size_t i = 0; i < members.size(); ++i) text += (i ? ", " : "") + members[i];
  return text + (members.size() >= 8 ? ", ..." : "") + "; name a dataset in it, e.g. " + spec.file + ":" + base + "/" +
         members[0];
}

ProbedSpec ProbedSpec::Member(std::string_view name) const {
  auto spec = DatasetSpec::Parse(text_);
  if (!spec.ok()) return *this;  // opening it says what is wrong
  return ProbedSpec(spec->file + ":" + spec->images + "/" + std::string(name));
}

// Dataset::Open's state between its steps (below, in order).
struct Dataset::Impl::Opening {
  Opening(const DatasetSpec& spec_in, const OpenOptions& options_in, const struct stat& local)
      : spec(spec_in),
        options(options_in),
        remote(io::IsRemoteUrl(spec_in.file)),
        st(local),
        file_size(static_cast<uint64_t>(local.st_size)) {}
  const DatasetSpec& spec;
  const OpenOptions& options;
  bool remote = false;  // an object (s3://, http(s)://), read through the remote driver
  struct stat st {};    // the local file's
  uint64_t file_size = 0;
  std::optional<io::FileIdentity> remote_identity;
  std::optional<h5::Reach> reach;
  std::string linked_file;  // the file holding the dataset behind an external link
  h5::Id ftype, dcpl;
  H5D_layout_t layout = H5D_LAYOUT_ERROR;
  int file_rank = 0;  // the file's rank; `rank` counts no_sample_axis's axis 0
  int rank = 0;
  std::vector<hsize_t> dims;
  bool whole = false;  // OpenOptions::no_sample_axis
};

// A missing local file or a directory, said before HDF5 or a probe process
// sees it (an object: by its open, which names its HTTP status).
static Status CheckLocalFile(const std::string& file, struct stat* st) {
  if (io::IsRemoteUrl(file)) return Status::Ok();
  if (::stat(file.c_str(), st) != 0) return Status::NotFound(file + ": cannot open: " + std::strerror(errno));
  if (S_ISDIR(st->st_mode)) return Status::InvalidArgument(file + ": is a directory, not an HDF5 file");
  return Status::Ok();
}

Result<Dataset> Dataset::Open(std::string_view spec_text, const OpenOptions& options) {
  auto spec = DatasetSpec::Parse(spec_text);
  if (!spec.ok()) return spec.status();
  struct stat st {};
  GPUFEED_RETURN_IF_ERROR(CheckLocalFile(spec->file, &st));
  auto probed = Probe(std::string(spec_text), options);
  if (!probed.ok()) return probed.status();
  return Open(*probed, options);
}

Result<Dataset> Dataset::Open(const ProbedSpec& probed, const OpenOptions& options) {
  const std::string& spec_text = probed.text();
  auto spec_or = DatasetSpec::Parse(spec_text);
  if (!spec_or.ok()) return spec_or.status();
  const DatasetSpec& spec = *spec_or;
  h5::QuietErrors();
  h5::EnsureZstdFilterRegistered();

  auto d = std::make_unique<Impl>();
  d->logger = options.logger;
  d->what = spec.file + ":" + spec.images;
  d->info.file = spec.file;
  d->info.images_path = spec.images;

  // An object (s3://, http(s)://) is read through the remote driver
  // (hdf5io/hdf5/remote_vfd.h): its metadata in a few ranged GETs, then
  // chunks through the transport's read-ahead like a local file's.
  struct stat st {};
  GPUFEED_RETURN_IF_ERROR(CheckLocalFile(spec.file, &st));
  h5::Hdf5Section in_hdf5;  // no probe forks while this thread is in HDF5 (fork_gate.h)
  Impl::Opening o(spec, options, st);
  GPUFEED_RETURN_IF_ERROR(d->OpenFile(o));
  GPUFEED_RETURN_IF_ERROR(d->OpenImages(o));
  GPUFEED_RETURN_IF_ERROR(d->ReadElementType(o));
  GPUFEED_RETURN_IF_ERROR(d->ReadShape(o));
  GPUFEED_RETURN_IF_ERROR(d->ReadLayout(o));
  GPUFEED_RETURN_IF_ERROR(d->ChooseReadPath(o));
  d->num_chunks = d->num_samples == 0 ? 0 : (d->num_samples + d->chunk_samples - 1) / d->chunk_samples;
  GPUFEED_RETURN_IF_ERROR(d->ReadLabels(o));
  GPUFEED_RETURN_IF_ERROR(d->ReadAttributes(o));
  H5Eclear2(H5E_DEFAULT);
  return Dataset(std::move(d));
}

// HDF5's open of the file (a local path, or an object through the remote
// driver), its signature checked first; an object's identity and size.
Status Dataset::Impl::OpenFile(Opening& o) {
  if (!o.remote && H5Fis_hdf5(o.spec.file.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return Status::Corrupt(o.spec.file + ": not an HDF5 file (no HDF5 signature found; " + std::to_string(o.file_size) +
                           " bytes)");
  }
  auto fapl = h5::FileAccessFor(o.spec.file);
  if (!fapl.ok()) return fapl.status();
  file = h5::Id(H5Fopen(o.spec.file.c_str(), H5F_ACC_RDONLY, fapl->get()));
  if (!file.valid()) {
    if (o.remote) {
      const std::string why = h5::TakeRemoteOpenError();
      H5Eclear2(H5E_DEFAULT);
      // The transport's own error (HTTP status, object, credentials' source).
      if (!why.empty()) return Status::IOError(why);
      return Status::Corrupt(o.spec.file + ": HDF5 cannot open the object (not HDF5, truncated or damaged?)");
    }
    return Status::Corrupt(o.spec.file + ": HDF5 cannot open it (truncated or damaged?): " + h5::LastErrorText());
  }
  if (o.remote) {
    o.remote_identity = h5::RemoteIdentityOf(file.get());
    if (!o.remote_identity) return Status::Internal(o.spec.file + ": opened without gpufeed's remote driver");
    o.file_size = o.remote_identity->size;
  }
  return Status::Ok();
}

// The images dataset: there (else the file's datasets are named), a dataset
// (not encoded images, not a group), what it names beside the file within
// reach, and the file that holds it behind an external link.
Status Dataset::Impl::OpenImages(Opening& o) {
  if (H5Lexists(file.get(), o.spec.images.c_str(), H5P_DEFAULT) <= 0 ||
      H5Oexists_by_name(file.get(), o.spec.images.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    // Listed in a child process: HDF5 has corrupted its heap walking
    // hostile files' headers (ListDatasetsIsolated).
    auto listed = ListDatasetsIsolated(o.spec.file, o.options.probe_timeout_ms);
    if (!listed.ok()) return listed.status().WithContext(what + ": no such dataset");
    std::string have;
    for (const std::string& p : *listed) have += (have.empty() ? "" : ", ") + p;
    return Status::NotFound(what + ": no such dataset (the file has: " + (have.empty() ? "no datasets" : have) +
                            "; name one as FILE.h5:/path)");
  }
  // First open (default access) to learn the layout; reopened below with a
  // tuned chunk cache if the hdf5 path is taken.
  dset = h5::Id(H5Dopen2(file.get(), o.spec.images.c_str(), H5P_DEFAULT));
  if (!dset.valid()) {
    // gpufeed's encoded images are a group (docs/format.md): only the
    // loader's decoding source reads them.
    if (h5::Id g(H5Gopen2(file.get(), o.spec.images.c_str(), H5P_DEFAULT));
        g.valid() && !h5::ReadStringAttr(g.get(), "gpufeed_encoded").empty()) {
      return Status::Unsupported(what +
                                 ": encoded images (JPEG/PNG files), which the loader decodes: read them with "
                                 "`gpufeed bench loader`, `gpufeed train`, the C API or Python (gpufeed/encoded.h); "
                                 "this command reads decoded datasets only");
    }
    return Status::InvalidArgument(what + ": not a dataset: " + NotADatasetReason(file.get(), o.spec));
  }
  // What the dataset names beside this file (external raw data, virtual
  // sources, the file an external link leads to) lies under its directory
  // or an allowed one, before a byte of it is read (hdf5io/hdf5/reach.h).
  o.reach.emplace(o.spec.file, o.options);
  GPUFEED_RETURN_IF_ERROR(o.reach->CheckDataset(dset.get(), what));
  // Behind an external link the dataset lives in another file: its chunk
  // addresses are offsets in that file, not in spec.file.
  if (ssize_t n = H5Fget_name(dset.get(), nullptr, 0); n > 0) {
    std::string holder(size_t(n), '\0');
    H5Fget_name(dset.get(), holder.data(), size_t(n) + 1);
    struct stat hs {};
    if (o.remote ? holder != o.spec.file
                 : ::stat(holder.c_str(), &hs) != 0 || hs.st_dev != o.st.st_dev || hs.st_ino != o.st.st_ino) {
      o.linked_file = holder;
    }
  }
  return Status::Ok();
}

// The element type: a dtype gpufeed reads, bool, enum members, byte order.
Status Dataset::Impl::ReadElementType(Opening& o) {
  o.ftype = h5::Id(H5Dget_type(dset.get()));
  auto found = DTypeOf(o.ftype.get());
  if (!found) {
    return Status::Unsupported(what + ": element type is " + std::string(ClassName(H5Tget_class(o.ftype.get()))) +
                               " of " + std::to_string(H5Tget_size(o.ftype.get())) +
                               " bytes; gpufeed reads integer and float arrays" +
                               (H5Tget_class(o.ftype.get()) == H5T_VLEN
                                    ? " here (variable-length uint8 files of JPEG/PNG bytes are read by the loader: "
                                      "`gpufeed bench loader`, `gpufeed train`, the C API, Python)"
                                    : ""));
  }
  dtype = *found;
  is_bool = IsH5pyBool(o.ftype.get());
  info.enum_members = EnumMembers(o.ftype.get());
  info.big_endian = H5Tget_order(o.ftype.get()) == H5T_ORDER_BE;
  return Status::Ok();
}

// The shape (with no_sample_axis's axis 0), checked against its maxima,
// and the sizes of a sample and of the dataset, checked before use.
Status Dataset::Impl::ReadShape(Opening& o) {
  h5::Id space(H5Dget_space(dset.get()));
  // no_sample_axis: the whole dataset is one sample, behind an axis 0 of
  // extent 1 that the file does not have (`rank` counts it, `file_rank` not).
  o.whole = o.options.no_sample_axis;
  no_sample_axis = o.whole;
  info.no_sample_axis = o.whole;
  o.file_rank = H5Sget_simple_extent_ndims(space.get());
  if (o.file_rank < 0) return Status::Corrupt(what + ": damaged dataspace: " + h5::LastErrorText());
  if (o.file_rank < 1 && !o.whole) {
    return Status::Unsupported(what +
                               ": scalar dataset; expected [N, ...] samples (a file holding one sample without a "
                               "sample axis: open with no_sample_axis, CLI --no-sample-axis)");
  }
  o.rank = o.file_rank + (o.whole ? 1 : 0);
  o.dims.assign(size_t(o.file_rank), 0);
  std::vector<hsize_t> maxdims(o.file_rank);
  H5Sget_simple_extent_dims(space.get(), o.dims.data(), maxdims.data());
  if (o.whole) {
    o.dims.insert(o.dims.begin(), 1);
    maxdims.insert(maxdims.begin(), 1);
  }
  info.shape.assign(o.dims.begin(), o.dims.end());
  // Sizes below come from the file: checked before anything is sized by them.
  for (int k = 0; k < o.rank; ++k) {
    if (maxdims[k] != H5S_UNLIMITED && o.dims[k] > maxdims[k]) {
      return Status::Corrupt(what + ": damaged dataspace: dimension " + std::to_string(k) + " is " +
                             std::to_string(o.dims[k]) + " but its maximum is " + std::to_string(maxdims[k]));
    }
  }
  num_samples = o.dims[0];
  sample_shape.assign(o.dims.begin() + 1, o.dims.end());
  const auto sample_size = CheckedProduct(DTypeSize(dtype), sample_shape);
  const auto raw_bytes = sample_size ? CheckedMul(num_samples, *sample_size) : std::nullopt;
  if (!raw_bytes) {
    return Status::Unsupported(what + ": shape " + ShapeText(info.shape) + " of " + std::string(DTypeName(dtype)) +
                               " is larger than 2^64 bytes; a sample or the dataset cannot be addressed");
  }
  sample_bytes = *sample_size;
  info.raw_bytes = *raw_bytes;
  // Every read decodes whole samples (whole chunks on the direct path).
  GPUFEED_RETURN_IF_ERROR(CheckFitsInMemory(sample_bytes, what + ": one sample of shape " + ShapeText(sample_shape),
                                            "gpufeed reads whole samples; is the file's shape right?"));
  info.stored_bytes = H5Dget_storage_size(dset.get());
  return Status::Ok();
}

// The storage layout: virtual sources resolved, the chunk shape, the filters.
Status Dataset::Impl::ReadLayout(Opening& o) {
  o.dcpl = h5::Id(H5Dget_create_plist(dset.get()));
  o.layout = H5Pget_layout(o.dcpl.get());
  info.storage = o.layout == H5D_CHUNKED      ? "chunked"
                 : o.layout == H5D_CONTIGUOUS ? "contiguous"
                 : o.layout == H5D_VIRTUAL    ? "virtual"
                                              : "compact";
  if (o.layout == H5D_VIRTUAL && o.whole) {
    return Status::InvalidArgument(what +
                                   ": a virtual dataset with no_sample_axis (--no-sample-axis): its axis 0 is the "
                                   "sample axis (stacked sources are one sample each already); open it without");
  }
  if (o.layout == H5D_VIRTUAL) {
    // Resolved and checked here (gaps, missing files, sources that disagree
    // would read as fill values through HDF5); FieldSource reads the sources.
    auto sources = h5::ResolveVirtualSources(o.dcpl.get(), o.ftype.get(), info.shape, o.spec.file, what);
    if (!sources.ok()) return sources.status();
    info.virtual_sources = std::move(*sources);
  }
  if (o.layout == H5D_CHUNKED) {
    std::vector<hsize_t> cdims(o.file_rank);
    if (o.file_rank > 0 && H5Pget_chunk(o.dcpl.get(), o.file_rank, cdims.data()) != o.file_rank) {
      return Status::Corrupt(what + ": damaged layout: chunk rank differs from the dataset's rank " +
                             std::to_string(o.file_rank));
    }
    if (o.whole) cdims.insert(cdims.begin(), 1);
    info.hdf5_chunk_shape.assign(cdims.begin(), cdims.end());
  }
  const int nfilters = H5Pget_nfilters(o.dcpl.get());
  for (int k = 0; k < nfilters; ++k) {
    unsigned flags = 0, cd[16];
    size_t ncd = 16;
    char name[128] = {0};
    H5Z_filter_t id = H5Pget_filter2(o.dcpl.get(), k, &flags, &ncd, cd, sizeof(name), name, nullptr);
    FilterInfo f{static_cast<int>(id), FilterName(static_cast<int>(id), name),
                 std::vector<unsigned>(cd, cd + std::min<size_t>(ncd, 16))};
    info.filters.push_back(std::move(f));
  }
  return Status::Ok();
}

// The read path: direct (gpufeed reads the chunks, PlanDirectPath) unless a
// reason sends the reads through HDF5 (SetUpHdf5Path).
Status Dataset::Impl::ChooseReadPath(Opening& o) {
  h5::Id fcpl(H5Fget_create_plist(file.get()));
  hsize_t userblock = 0;
  H5Pget_userblock(fcpl.get(), &userblock);

  std::string hdf5_reason = "forced by option";
  if (!o.linked_file.empty()) {
    hdf5_reason = "the dataset is in " + o.linked_file + ", reached through an external link; HDF5 follows it";
  } else if (!o.options.force_hdf5_path) {
    auto reason = PlanDirectPath(o.dcpl.get(), userblock, o.file_size);
    if (!reason.ok()) return reason.status();
    hdf5_reason = *reason;
  }
  if (hdf5_reason.empty()) {
    info.read_path = ReadPath::kDirect;
    GPUFEED_RETURN_IF_ERROR(ChooseIo(o.options.io, o.file_size));
    // The chunks' object is the one the metadata came from (an object
    // replaced between the two opens is an error, not an index of one
    // version over the bytes of another).
    if (o.remote_identity && !(identity == *o.remote_identity)) {
      return Status::Corrupt(o.spec.file +
                             ": the object changed while it was opened (its ETag or size differs "
                             "between the metadata's read and the data's); open it again");
    }
  } else {
    return SetUpHdf5Path(o, hdf5_reason);
  }
  return Status::Ok();
}

// The HDF5 path: a filter without its plugin named, a read unit of whole
// chunk rows, a chunk cache that holds one, the dataset reopened with it,
// and the native memory type.
Status Dataset::Impl::SetUpHdf5Path(Opening& o, const std::string& reason) {
  info.read_path = ReadPath::kHdf5;
  info.read_path_reason = reason;
  // HDF5 loads a filter's plugin on first use; without one, every read
  // would fail with a misleading "can't open directory". Named now.
  for (const FilterInfo& f : info.filters) {
    if (H5Zfilter_avail(static_cast<H5Z_filter_t>(f.id)) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      const char* plugin_path = std::getenv("HDF5_PLUGIN_PATH");
      info.unreadable = "filter " + std::to_string(f.id) + " (" + f.name +
                        ") is not available: gpufeed's direct path does not decode it and HDF5 found no plugin "
                        "for it (HDF5_PLUGIN_PATH=" +
                        (plugin_path ? plugin_path : "unset, default directory") +
                        "); install the filter's HDF5 plugin (Debian: bitshuffle for LZF, hdf5-filter-plugin*) or "
                        "recompress the file where the filter is available (h5repack, h5py)";
      break;
    }
  }
  contiguous = false;
  chunk_addr.clear();
  chunk_size.clear();
  chunk_mask.clear();
  pipeline.clear();
  // Read unit and a chunk cache that holds every HDF5 chunk one read unit
  // touches, so each chunk is decoded once per pass, not once per sample.
  uint64_t cache_bytes = o.options.hdf5_cache_bytes;
  uint64_t chunk_nbytes = 0;
  if (o.layout == H5D_CHUNKED) {
    const auto& cs = info.hdf5_chunk_shape;
    chunk_nbytes = DTypeSize(dtype);
    uint64_t chunks_per_row = 1;
    for (int k = 0; k < o.rank; ++k) {
      if (cs[k] == 0) return Status::Corrupt(what + ": damaged layout: chunk shape " + ShapeText(cs));
      chunk_nbytes *= cs[k];  // HDF5 keeps a chunk under 4 GiB: no overflow
      if (k > 0) chunks_per_row *= (o.dims[k] + cs[k] - 1) / cs[k];
    }
    // A read unit of whole chunk rows, and a cache holding one more row.
    const auto row_bytes = CheckedMul(cs[0], sample_bytes);
    if (!row_bytes || cs[0] == 0) {
      return Status::Corrupt(what + ": damaged layout: chunk shape " + ShapeText(cs) + " for shape " +
                             ShapeText(info.shape));
    }
    const uint64_t rows = std::max<uint64_t>(1, kHdf5ReadUnitMinBytes / std::max<uint64_t>(1, *row_bytes));
    chunk_samples = std::min<uint64_t>(cs[0] * rows, std::max<uint64_t>(1, num_samples));
    const auto needed = CheckedMul(rows + 1, chunks_per_row * chunk_nbytes);
    if (!needed) return Status::Corrupt(what + ": damaged layout: chunk shape " + ShapeText(cs));
    GPUFEED_RETURN_IF_ERROR(CheckFitsInMemory(
        *needed, what + ": HDF5's chunk cache for one read unit of " + std::to_string(chunk_samples) + " samples",
        "the dataset's chunks span too much of each sample; rechunk it with gpufeed convert"));
    cache_bytes = std::max(cache_bytes, *needed);
  } else {
    SetContiguousUnit();
  }
  h5::Id dapl(H5Pcreate(H5P_DATASET_ACCESS));
  if (chunk_nbytes > 0) {
    const uint64_t fit = std::max<uint64_t>(1, cache_bytes / chunk_nbytes);
    H5Pset_chunk_cache(dapl.get(), NextPrime(100 * fit), cache_bytes, 1.0);
  }
  dset = h5::Id(H5Dopen2(file.get(), o.spec.images.c_str(), dapl.get()));
  if (!dset.valid()) return Status::Internal(what + ": reopen failed: " + h5::LastErrorText());
  // Native-order type of the same size; for little-endian float16 (no
  // native HDF5 type in 1.10), the file type itself.
  hid_t native = H5Tget_native_type(o.ftype.get(), H5T_DIR_ASCEND);
  if (native < 0 || H5Tget_size(native) != DTypeSize(dtype)) {
    if (native >= 0) H5Tclose(native);
    H5Eclear2(H5E_DEFAULT);
    if (info.big_endian) {
      return Status::Unsupported(what + ": big-endian " + std::string(DTypeName(dtype)) +
                                 " cannot be converted to native order");
    }
    native = H5Tcopy(o.ftype.get());
  }
  mem_type = h5::Id(native);
  return Status::Ok();
}

// The labels: /labels when there, a named dataset, or none; integers, one
// per sample.
Status Dataset::Impl::ReadLabels(Opening& o) {
  std::string labels_path = o.options.labels_path;
  const bool explicit_labels = !labels_path.empty() && labels_path != "none";
  if (labels_path.empty() && o.whole) {
    // One sample per file: a label is a field of its own (or a one-element
    // labels dataset named explicitly); /labels of a segmentation is not one.
  } else if (labels_path.empty()) {
    labels_path = "/labels";
    if (H5Lexists(file.get(), "labels", H5P_DEFAULT) <= 0) labels_path.clear();
    H5Eclear2(H5E_DEFAULT);
  } else if (labels_path == "none") {
    labels_path.clear();
  }
  if (explicit_labels && (H5Lexists(file.get(), labels_path.c_str(), H5P_DEFAULT) <= 0 ||
                          H5Oexists_by_name(file.get(), labels_path.c_str(), H5P_DEFAULT) <= 0)) {
    H5Eclear2(H5E_DEFAULT);
    const std::string missing = o.spec.file + ":" + labels_path + ": no such labels dataset";
    auto listed = ListDatasetsIsolated(o.spec.file, o.options.probe_timeout_ms);  // as for the images, above
    if (!listed.ok()) return listed.status().WithContext(missing);
    std::string have;
    for (const std::string& p : *listed) have += (have.empty() ? "" : ", ") + p;
    return Status::NotFound(missing + " (the file has: " + (have.empty() ? "no datasets" : have) +
                            "; name one as the labels, or none)");
  }
  if (!labels_path.empty()) {
    const std::string lwhat = o.spec.file + ":" + labels_path;
    h5::Id ldset(H5Dopen2(file.get(), labels_path.c_str(), H5P_DEFAULT));
    if (!ldset.valid()) return Status::InvalidArgument(lwhat + ": not a dataset: " + h5::LastErrorText());
    GPUFEED_RETURN_IF_ERROR(o.reach->CheckDataset(ldset.get(), lwhat));
    h5::Id ltype(H5Dget_type(ldset.get()));
    if (H5Tget_class(ltype.get()) != H5T_INTEGER) {
      return Status::Unsupported(
          lwhat + ": labels must be integers, found " +
          std::string(H5Tget_class(ltype.get()) == H5T_FLOAT ? "float" : ClassName(H5Tget_class(ltype.get()))));
    }
    h5::Id lspace(H5Dget_space(ldset.get()));
    const hssize_t n = H5Sget_simple_extent_npoints(lspace.get());
    if (n < 0 || static_cast<uint64_t>(n) != num_samples) {
      return Status::InvalidArgument(lwhat + ": has " + std::to_string(n) + " labels but " + what + " has " +
                                     std::to_string(num_samples) + " samples");
    }
    GPUFEED_RETURN_IF_ERROR(
        CheckFitsInMemory(static_cast<uint64_t>(n) * sizeof(int64_t), lwhat + ": " + std::to_string(n) + " labels"));
    labels.resize(static_cast<size_t>(n));
    if (n > 0 && H5Dread(ldset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0) {
      return Status::Corrupt(lwhat + ": read failed: " + h5::LastErrorText());
    }
    info.labels_path = labels_path;
  }
  return Status::Ok();
}

// The file's format version, the dataset's attributes (layout, class names,
// statistics) or a read-only file's statistics sidecar.
Status Dataset::Impl::ReadAttributes(Opening& o) {
  // A file written by a newer gpufeed may lay out things this build would
  // misread; files without the attribute (h5py's) read as they are.
  const std::string format = h5::ReadStringAttr(file.get(), "gpufeed_format");
  if (!format.empty()) {
    char* end = nullptr;
    const long v = std::strtol(format.c_str(), &end, 10);
    if (end == format.c_str() || *end != '\0' || v < 1) {
      return Status::Corrupt(o.spec.file + ": gpufeed_format attribute '" + format + "' is not a format version");
    }
    if (v > kFormatVersion) {
      return Status::Unsupported(o.spec.file + ": written in gpufeed format " + format + ", this build reads up to " +
                                 std::to_string(kFormatVersion) +
                                 "; upgrade gpufeed (or rewrite the file with the "
                                 "gpufeed that wrote it: gpufeed convert FILE -o OLD.h5)");
    }
  }
  info.layout = h5::ReadStringAttr(dset.get(), "layout");
  info.class_names = h5::ReadStringArrayAttr(dset.get(), "class_names");
  info.mean = h5::ReadDoubleArrayAttr(dset.get(), "mean");
  info.stddev = h5::ReadDoubleArrayAttr(dset.get(), "std");
  if (!info.mean.empty()) {
    info.stats_from = "attributes";
  } else {
    // A read-only file's statistics (gpufeed inspect --stats --store).
    std::string ignored;
    ReadStatsSidecar(o.spec.file, o.spec.images, &info.mean, &info.stddev, &ignored);
    if (!info.mean.empty()) info.stats_from = StatsSidecarPath(o.spec.file);
    if (!ignored.empty()) LoggerOr(o.options.logger).Log(LogLevel::kWarning, "stats_sidecar_ignored", ignored);
  }
  return Status::Ok();
}

bool Dataset::Plan(DirectPlan* out) const {
  const Impl& d = *impl_;
  if (d.info.read_path != ReadPath::kDirect || !d.bytes || !d.info.unreadable.empty() ||
      !d.info.virtual_sources.empty()) {
    return false;
  }
  out->identity = d.identity;
  out->contiguous = d.contiguous;
  out->contiguous_addr = d.contiguous_addr;
  out->chunk_samples = d.chunk_samples;
  out->pipeline = d.pipeline;
  out->chunk_addr = d.chunk_addr;
  out->chunk_size = d.chunk_size;
  out->chunk_mask = d.chunk_mask;
  return true;
}

// The plan was checked for form and bounds when the probe's report was
// parsed (hdf5io/hdf5/probe.cc, ParsePlan); what is left to check is that the file
// opened is the one it was made from.
Result<Dataset> Dataset::OpenPlanned(const ProbedSpec& probed, const SpecFacts& facts, const OpenOptions& options,
                                     bool* changed) {
  *changed = false;
  auto spec = DatasetSpec::Parse(probed.text());
  if (!spec.ok()) return spec.status();
  if (!facts.plan) return Status::Internal(probed.text() + ": opened from a plan the probe did not make");
  const DirectPlan& plan = *facts.plan;
  auto d = std::make_unique<Impl>();
  d->logger = options.logger;
  d->what = spec->file + ":" + spec->images;
  d->info.file = spec->file;
  d->info.images_path = spec->images;
  d->dtype = facts.dtype;
  d->is_bool = facts.is_bool;
  d->num_samples = facts.num_samples;
  d->sample_shape = facts.sample_shape;
  d->no_sample_axis = options.no_sample_axis;
  d->info.no_sample_axis = options.no_sample_axis;
  d->info.shape = facts.sample_shape;
  d->info.shape.insert(d->info.shape.begin(), facts.num_samples);
  const auto sample_bytes = CheckedProduct(DTypeSize(d->dtype), d->sample_shape);
  const auto raw_bytes = sample_bytes ? CheckedMul(d->num_samples, *sample_bytes) : std::nullopt;
  if (!raw_bytes) return Status::Internal(d->what + ": a plan whose size overflows (the probe checks it)");
  d->sample_bytes = *sample_bytes;
  d->info.raw_bytes = *raw_bytes;
  GPUFEED_RETURN_IF_ERROR(CheckFitsInMemory(d->sample_bytes,
                                            d->what + ": one sample of shape " + ShapeText(d->sample_shape),
                                            "gpufeed reads whole samples; is the file's shape right?"));
  d->info.read_path = ReadPath::kDirect;
  d->contiguous = plan.contiguous;
  d->info.storage = plan.contiguous ? "contiguous" : "chunked";
  if (plan.contiguous) {
    d->contiguous_addr = plan.contiguous_addr;
    d->SetContiguousUnit();
    d->info.stored_bytes = *raw_bytes;
  } else {
    d->chunk_samples = plan.chunk_samples;
    d->info.hdf5_chunk_shape = d->info.shape;
    d->info.hdf5_chunk_shape[0] = plan.chunk_samples;
    d->chunk_addr = plan.chunk_addr;
    d->chunk_size = plan.chunk_size;
    d->chunk_mask = plan.chunk_mask;
    d->pipeline = plan.pipeline;
    for (uint64_t s : plan.chunk_size) d->info.stored_bytes += s;
    for (const codec::FilterStep& f : plan.pipeline) d->info.filters.push_back({f.id, FilterName(f.id, ""), {}});
  }
  d->num_chunks = d->num_samples == 0 ? 0 : (d->num_samples + d->chunk_samples - 1) / d->chunk_samples;
  if (!plan.contiguous && d->chunk_addr.size() != d->num_chunks) {
    return Status::Internal(d->what + ": a plan of " + std::to_string(d->chunk_addr.size()) + " chunks for " +
                            std::to_string(d->num_chunks) + " (the probe checks it)");
  }
  GPUFEED_RETURN_IF_ERROR(d->ChooseIo(options.io, plan.identity.size));
  if (!(d->identity == plan.identity)) {
    *changed = true;
    return Status::Corrupt(spec->file + ": changed since the probe read it (size " +
                           std::to_string(plan.identity.size) + " then, " + std::to_string(d->identity.size) +
                           " now, or its inode or times)");
  }
  return Dataset(std::move(d));
}

}  // namespace gpufeed
