// EncodedImageSource over gpufeed's bytes + offsets group (direct path) or an
// h5py variable-length uint8 dataset (HDF5 path). A loader chunk is a run of
// consecutive samples whose bytes are read in one range; the loader then
// calls DecodeSample per sample, in its own threads.
#include <hdf5.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "gpufeed/encoded.h"
#include "gpufeed/names.h"
#include "hdf5io/hdf5/fork_gate.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/image/image_decode.h"
#include "hdf5io/hdf5/probe.h"
#include "hdf5io/hdf5/reach.h"
#include "hdf5io/hdf5/remote_vfd.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed {
namespace {

// Loader chunks hold about this many stored bytes: large enough that a read
// is one pread of several byte chunks, small enough that the cache holds
// many and a batch's chunks are spread over the threads.
constexpr uint64_t kTargetChunkBytes = 4ull << 20;
constexpr uint64_t kMaxChunkSamples = 4096;

struct SpecParts {
  std::string file, path;
};
Result<SpecParts> SplitSpec(std::string_view spec) {
  auto parsed = DatasetSpec::Parse(spec);
  if (!parsed.ok()) return parsed.status();
  return SpecParts{parsed->file, parsed->images};
}

// `file` opened read-only: an object (s3://, http(s)://) through the remote
// driver (hdf5io/hdf5/remote_vfd.h), as Dataset::Open opens it, a local
// file with HDF5's default driver.
Result<h5::Id> OpenReadOnly(const std::string& file) {
  auto fapl = h5::FileAccessFor(file);
  if (!fapl.ok()) return fapl.status();
  h5::Id f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl->get()));
  if (f.valid()) return f;
  if (io::IsRemoteUrl(file)) {
    const std::string why = h5::TakeRemoteOpenError();  // the transport's (HTTP status, object)
    H5Eclear2(H5E_DEFAULT);
    if (!why.empty()) return Status::IOError(why);
    return Status::Corrupt(file + ": HDF5 cannot open the object (not HDF5, truncated or damaged?)");
  }
  return Status::IOError(file + ": cannot open: " + h5::LastErrorText());
}

// No HDF5 signature: not encoded (the open that follows says what it is).
// An object's signature is its probe's to find: no request is made here.
bool MayBeHdf5(const std::string& file) {
  if (io::IsRemoteUrl(file)) return true;
  if (H5Fis_hdf5(file.c_str()) > 0) return true;
  H5Eclear2(H5E_DEFAULT);
  return false;
}

// The object at `path` is a dataset of variable-length 8-bit integers.
bool IsVlenBytes(hid_t obj) {
  h5::Id type(H5Dget_type(obj));
  if (!type.valid() || H5Tget_class(type.get()) != H5T_VLEN) return false;
  h5::Id base(H5Tget_super(type.get()));
  return base.valid() && H5Tget_class(base.get()) == H5T_INTEGER && H5Tget_size(base.get()) == 1;
}

Result<EncodedStorage> DetectIn(hid_t file, const std::string& path) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return EncodedStorage::kNone;
  }
  H5O_info_t oi;
  if (H5Oget_info_by_name(file, path.c_str(), &oi, H5P_DEFAULT) < 0) return EncodedStorage::kNone;
  if (oi.type == H5O_TYPE_GROUP) {
    h5::Id g(H5Gopen2(file, path.c_str(), H5P_DEFAULT));
    if (g.valid() && !h5::ReadStringAttr(g.get(), "gpufeed_encoded").empty()) return EncodedStorage::kOffsets;
    return EncodedStorage::kNone;
  }
  if (oi.type == H5O_TYPE_DATASET) {
    h5::Id d(H5Dopen2(file, path.c_str(), H5P_DEFAULT));
    if (d.valid() && IsVlenBytes(d.get())) return EncodedStorage::kVlen;
  }
  return EncodedStorage::kNone;
}

// Reads a 1-D (or [n, k]) integer dataset as uint64/int64 after checking its
// element count against `expect` (0: any) and against the file's size.
template <typename T>
Status ReadInts(hid_t file, const std::string& path, const std::string& what, uint64_t expect, uint64_t file_bytes,
                const h5::Reach& reach, std::vector<T>* out) {
  h5::Id d(H5Dopen2(file, path.c_str(), H5P_DEFAULT));
  if (!d.valid()) return Status::NotFound(what + ": no such dataset");
  GPUFEED_RETURN_IF_ERROR(reach.CheckDataset(d.get(), what));
  h5::Id type(H5Dget_type(d.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER) return Status::Corrupt(what + ": not an integer dataset");
  h5::Id space(H5Dget_space(d.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank != 1) return Status::Corrupt(what + ": rank " + std::to_string(rank) + ", expected 1");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  if (expect != 0 && n != expect) {
    return Status::Corrupt(what + ": holds " + std::to_string(n) + " entries, expected " + std::to_string(expect));
  }
  // Hostile sizes: a dataset cannot hold more entries than the file has
  // bytes unless it is a fill-value dataset, which gpufeed never writes.
  if (n > file_bytes) {
    return Status::Corrupt(what + ": claims " + std::to_string(n) + " entries in a file of " +
                           std::to_string(file_bytes) + " bytes");
  }
  out->resize(n);
  const hid_t mem = std::is_signed_v<T> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64;
  if (n > 0 && H5Dread(d.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data()) < 0) {
    return Status::Corrupt(what + ": cannot read: " + h5::LastErrorText());
  }
  return Status::Ok();
}

class EncodedSourceImpl final : public EncodedImageSource {
 public:
  // What sources over the same field share (WithDecodeOptions): read at
  // Init, never written afterwards.
  struct Index {
    std::vector<uint64_t> offsets;  // [n + 1], checked non-decreasing
    std::vector<int64_t> labels;
    std::vector<std::string> class_names;
    std::unique_ptr<Dataset> bytes;  // kOffsets
    h5::Id vlen;                     // kVlen (HDF5 serializes its reads)
  };
  explicit EncodedSourceImpl(std::shared_ptr<Index> index = std::make_shared<Index>()) : index_(std::move(index)) {}

  EncodedStorage storage() const override { return storage_; }
  const DecodeOptions& decode_options() const override { return decode_; }
  std::vector<std::string> class_names() const override { return class_names_; }
  uint64_t stored_bytes() const override { return offsets_.back(); }
  uint64_t sample_stored_bytes(uint64_t k) const override { return offsets_[k + 1] - offsets_[k]; }

  uint64_t num_samples() const override { return n_; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  uint64_t sample_bytes() const override { return sample_bytes_; }
  DType dtype() const override { return DType::kUInt8; }
  uint64_t chunk_samples() const override { return group_; }
  uint64_t num_chunks() const override { return (n_ + group_ - 1) / group_; }
  uint64_t samples_in_chunk(uint64_t i) const override { return std::min(group_, n_ - i * group_); }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return chunk_buffer_bytes(i); }
  uint64_t chunk_buffer_bytes(uint64_t i) const override {
    return offsets_[std::min(n_, (i + 1) * group_)] - offsets_[i * group_];
  }
  uint64_t max_chunk_buffer_bytes() const override { return std::max<uint64_t>(1, max_chunk_bytes_); }
  bool decodes_samples() const override { return true; }
  const std::vector<int64_t>& labels() const override { return labels_; }
  std::string name() const override { return name_; }

  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    if (i >= num_chunks() || dst.size() < chunk_buffer_bytes(i)) {
      return Status::InvalidArgument(name_ + ": ReadChunk(" + std::to_string(i) + ") out of range or buffer too small");
    }
    const uint64_t first = i * group_;
    return ReadRange(first, samples_in_chunk(i), dst.data());
  }

  Result<std::unique_ptr<EncodedImageSource>> WithDecodeOptions(const DecodeOptions& decode) const override {
    GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(decode));
    auto s = SameSamples();
    s->group_ = group_;
    s->max_chunk_bytes_ = max_chunk_bytes_;
    GPUFEED_RETURN_IF_ERROR(s->SetDecode(decode));
    return std::unique_ptr<EncodedImageSource>(std::move(s));
  }

  std::unique_ptr<EncodedImageSource> WithReadUnit(uint64_t samples) const override {
    auto s = SameSamples();
    s->decoder_ = decoder_;
    s->decode_ = decode_;
    s->shape_ = shape_;
    s->sample_bytes_ = sample_bytes_;
    s->SetGroup(std::clamp<uint64_t>(samples, 1, kMaxChunkSamples));
    return s;
  }

  Status ReadEncoded(uint64_t k, std::vector<uint8_t>* out) const override {
    if (k >= n_) return Status::InvalidArgument(name_ + ": sample " + std::to_string(k) + " out of range");
    out->resize(sample_stored_bytes(k));
    return ReadRange(k, 1, reinterpret_cast<std::byte*>(out->data()));
  }

  Result<std::span<const std::byte>> EncodedBytes(std::span<const std::byte> chunk_bytes, uint64_t chunk,
                                                  uint64_t sample) const override {
    const uint64_t first = chunk * group_;
    if (chunk >= num_chunks() || sample < first || sample >= first + samples_in_chunk(chunk) ||
        chunk_bytes.size() < chunk_buffer_bytes(chunk)) {
      return Status::Internal(name_ + ": EncodedBytes(" + std::to_string(sample) + ") outside chunk " +
                              std::to_string(chunk) + " or mis-sized");
    }
    return chunk_bytes.subspan(offsets_[sample] - offsets_[first], sample_stored_bytes(sample));
  }
  std::shared_ptr<const SampleDecoder> sample_decoder() const override { return decoder_; }

  // Opens file:path for `storage`. `file_handle` is open on the file.
  // `probed` covers the field's byte dataset: the probe opens an encoded
  // field as this does (hdf5io/hdf5/probe.cc).
  Status Init(const ProbedSpec& probed, const SpecParts& spec, hid_t file, EncodedStorage storage,
              const OpenOptions& open, const DecodeOptions& decode) {
    storage_ = storage;
    file_ = spec.file;
    path_ = spec.path;
    name_ = spec.file + ":" + spec.path;
    GPUFEED_RETURN_IF_ERROR(SetDecode(decode));
    hsize_t file_bytes = 0;
    H5Fget_filesize(file, &file_bytes);
    const h5::Reach reach(spec.file, open);  // what the index, labels and vlen data may name
    if (storage == EncodedStorage::kOffsets) {
      GPUFEED_RETURN_IF_ERROR(
          ReadInts<uint64_t>(file, spec.path + "/offsets", name_ + "/offsets", 0, file_bytes, reach, &offsets_));
      if (offsets_.size() < 2) return Status::Corrupt(name_ + "/offsets: needs N + 1 >= 2 entries");
      n_ = offsets_.size() - 1;
      OpenOptions bo = open;
      bo.labels_path = "none";
      auto bytes = Dataset::Open(probed.Member("bytes"), bo);
      if (!bytes.ok()) return bytes.status();
      if (bytes->dtype() != DType::kUInt8 || !bytes->sample_shape().empty()) {
        return Status::Corrupt(bytes->name() + ": must be a 1-D uint8 dataset of the stored files' bytes");
      }
      for (uint64_t k = 0; k < n_; ++k) {
        if (offsets_[k + 1] < offsets_[k]) {
          return Status::Corrupt(name_ + "/offsets: entry " + std::to_string(k + 1) + " (" +
                                 std::to_string(offsets_[k + 1]) + ") is below entry " + std::to_string(k) +
                                 "; offsets must not decrease (rewrite the file with gpufeed convert --keep-encoded)");
        }
      }
      if (offsets_[0] != 0 || offsets_[n_] != bytes->num_samples()) {
        return Status::Corrupt(name_ + "/offsets: span [" + std::to_string(offsets_[0]) + ", " +
                               std::to_string(offsets_[n_]) + ") but " + bytes->name() + " holds " +
                               std::to_string(bytes->num_samples()) + " bytes");
      }
      bytes_ = std::make_unique<Dataset>(std::move(*bytes));
      class_names_ = [&] {
        h5::Id g(H5Gopen2(file, spec.path.c_str(), H5P_DEFAULT));
        return h5::ReadStringArrayAttr(g.get(), "class_names");
      }();
    } else {
      vlen_ = h5::Id(H5Dopen2(file, spec.path.c_str(), H5P_DEFAULT));
      if (!vlen_.valid()) return Status::NotFound(name_ + ": cannot open: " + h5::LastErrorText());
      GPUFEED_RETURN_IF_ERROR(reach.CheckDataset(vlen_.get(), name_));
      h5::Id space(H5Dget_space(vlen_.get()));
      if (H5Sget_simple_extent_ndims(space.get()) != 1) return Status::Corrupt(name_ + ": vlen dataset must be 1-D");
      hsize_t n = 0;
      H5Sget_simple_extent_dims(space.get(), &n, nullptr);
      if (n == 0 || n > file_bytes) {
        return Status::Corrupt(name_ + ": claims " + std::to_string(n) + " entries in a file of " +
                               std::to_string(file_bytes) + " bytes");
      }
      n_ = n;
      class_names_ = h5::ReadStringArrayAttr(vlen_.get(), "class_names");
      GPUFEED_RETURN_IF_ERROR(MeasureVlen());
    }
    // Labels: /labels by default (as Dataset), "none" for none.
    std::string lp = open.labels_path;
    if (lp.empty()) lp = H5Lexists(file, "labels", H5P_DEFAULT) > 0 ? "/labels" : "";
    if (lp == "none") lp.clear();
    if (!lp.empty()) {
      GPUFEED_RETURN_IF_ERROR(ReadInts<int64_t>(file, lp, spec.file + ":" + lp, n_, file_bytes, reach, &labels_));
    }
    // Group samples into loader chunks of about kTargetChunkBytes.
    const uint64_t avg = std::max<uint64_t>(1, offsets_.back() / n_);
    SetGroup(std::clamp<uint64_t>(kTargetChunkBytes / avg, 1, kMaxChunkSamples));
    return Status::Ok();
  }

 private:
  // A source over this one's samples (index, storage, names), its read unit
  // and decoder still to set.
  std::unique_ptr<EncodedSourceImpl> SameSamples() const {
    auto s = std::make_unique<EncodedSourceImpl>(index_);
    s->storage_ = storage_;
    s->file_ = file_;
    s->path_ = path_;
    s->name_ = name_;
    s->n_ = n_;
    return s;
  }
  void SetGroup(uint64_t group) {
    group_ = group;
    max_chunk_bytes_ = 0;
    for (uint64_t c = 0; c < num_chunks(); ++c) max_chunk_bytes_ = std::max(max_chunk_bytes_, chunk_buffer_bytes(c));
  }
  Status SetDecode(const DecodeOptions& decode) {
    auto decoder = MakeImageDecoder(decode);
    if (!decoder.ok()) return decoder.status();
    decoder_ = std::move(*decoder);
    decode_ = decode;
    const bool nhwc = LayoutOr(decode.layout, Layout::kNCHW) == Layout::kNHWC;
    shape_ = nhwc ? std::vector<uint64_t>{decode.height, decode.width, 3}
                  : std::vector<uint64_t>{3, decode.height, decode.width};
    sample_bytes_ = decoder_->sample_bytes();
    return Status::Ok();
  }

  // Bytes of samples [first, first + count) into dst, back to back.
  Status ReadRange(uint64_t first, uint64_t count, std::byte* dst) const {
    const uint64_t lo = offsets_[first], hi = offsets_[first + count];
    if (storage_ == EncodedStorage::kOffsets) {
      return bytes_->ReadSamples(lo, hi - lo, std::span(dst, hi - lo)).WithContext(name_);
    }
    std::vector<hvl_t> refs(count);
    Status st = ReadVlen(first, count, refs.data());
    if (!st.ok()) return st;
    uint64_t at = 0;
    for (uint64_t i = 0; i < count && st.ok(); ++i) {
      if (refs[i].len != sample_stored_bytes(first + i)) {
        st = Status::Corrupt(name_ + " sample " + std::to_string(first + i) + ": holds " + std::to_string(refs[i].len) +
                             " bytes, " + std::to_string(sample_stored_bytes(first + i)) +
                             " when the file was opened (was it rewritten?)");
        break;
      }
      if (refs[i].len) std::memcpy(dst + at, refs[i].p, refs[i].len);
      at += refs[i].len;
    }
    ReclaimVlen(count, refs.data());
    return st;
  }

  Status ReadVlen(uint64_t first, uint64_t count, hvl_t* refs) const {
    h5::Hdf5Section in_hdf5;
    h5::QuietErrors();
    const hsize_t start = first, n = count;
    h5::Id mem_space(H5Screate_simple(1, &n, nullptr));
    h5::Id file_space(H5Dget_space(vlen_.get()));
    h5::Id mem_type(H5Tvlen_create(H5T_NATIVE_UINT8));
    if (!mem_space.valid() || !file_space.valid() || !mem_type.valid() ||
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr) < 0 ||
        H5Dread(vlen_.get(), mem_type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, refs) < 0) {
      return Status::Corrupt(name_ + ": reading entries " + std::to_string(first) + ".." +
                             std::to_string(first + count - 1) + ": " + h5::LastErrorText());
    }
    return Status::Ok();
  }
  void ReclaimVlen(uint64_t count, hvl_t* refs) const {
    h5::Hdf5Section in_hdf5;
    const hsize_t n = count;
    h5::Id mem_space(H5Screate_simple(1, &n, nullptr));
    h5::Id mem_type(H5Tvlen_create(H5T_NATIVE_UINT8));
    H5Dvlen_reclaim(mem_type.get(), mem_space.get(), H5P_DEFAULT, refs);
  }

  // One pass over a vlen dataset for each entry's length (the offsets the
  // direct format stores). Reads every byte once: the cost of this storage.
  Status MeasureVlen() {
    offsets_.assign(n_ + 1, 0);
    constexpr uint64_t kStep = 256;
    std::vector<hvl_t> refs(kStep);
    for (uint64_t first = 0; first < n_; first += kStep) {
      const uint64_t count = std::min(kStep, n_ - first);
      GPUFEED_RETURN_IF_ERROR(ReadVlen(first, count, refs.data()));
      for (uint64_t i = 0; i < count; ++i) offsets_[first + i + 1] = offsets_[first + i] + refs[i].len;
      ReclaimVlen(count, refs.data());
    }
    return Status::Ok();
  }

  EncodedStorage storage_ = EncodedStorage::kNone;
  DecodeOptions decode_;
  std::shared_ptr<const SampleDecoder> decoder_;
  std::string file_, path_, name_;
  std::vector<uint64_t> shape_;
  uint64_t sample_bytes_ = 0;
  uint64_t n_ = 0, group_ = 1, max_chunk_bytes_ = 0;
  std::shared_ptr<Index> index_;  // before the references into it
  std::vector<uint64_t>& offsets_ = index_->offsets;
  std::vector<int64_t>& labels_ = index_->labels;
  std::vector<std::string>& class_names_ = index_->class_names;
  std::unique_ptr<Dataset>& bytes_ = index_->bytes;
  h5::Id& vlen_ = index_->vlen;
};

}  // namespace

Result<EncodedStorage> DetectEncoded(std::string_view spec, const OpenOptions& open) {
  auto parts = SplitSpec(spec);
  if (!parts.ok()) return parts.status();
  h5::QuietErrors();
  if (!MayBeHdf5(parts->file)) return EncodedStorage::kNone;
  auto probed = Probe(std::string(spec), open);
  if (!probed.ok()) return probed.status();
  return DetectEncoded(*probed, open);
}

Result<EncodedStorage> DetectEncoded(const ProbedSpec& spec, const OpenOptions&) {
  auto parts = SplitSpec(spec.text());
  if (!parts.ok()) return parts.status();
  h5::QuietErrors();
  if (!MayBeHdf5(parts->file)) return EncodedStorage::kNone;
  auto file = OpenReadOnly(parts->file);
  if (!file.ok()) return file.status();
  return DetectIn(file->get(), parts->path);
}

Result<std::unique_ptr<EncodedImageSource>> OpenEncodedImages(std::string_view spec, const OpenOptions& open,
                                                              const DecodeOptions& decode) {
  GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(decode));
  auto parts = SplitSpec(spec);
  if (!parts.ok()) return parts.status();
  auto probed = Probe(std::string(spec), open);
  if (!probed.ok()) return probed.status();
  return OpenEncodedImages(*probed, open, decode);
}

Result<std::unique_ptr<EncodedImageSource>> OpenEncodedImages(const ProbedSpec& spec, const OpenOptions& open,
                                                              const DecodeOptions& decode) {
  GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(decode));
  auto parts = SplitSpec(spec.text());
  if (!parts.ok()) return parts.status();
  h5::QuietErrors();
  auto opened = OpenReadOnly(parts->file);
  if (!opened.ok()) return opened.status();
  h5::Id file = std::move(*opened);
  auto storage = DetectIn(file.get(), parts->path);
  if (!storage.ok()) return storage.status();
  if (*storage == EncodedStorage::kNone) {
    return Status::NotFound(parts->file + ":" + parts->path +
                            ": not an encoded image field (a group written by gpufeed convert --keep-encoded, or an "
                            "h5py vlen uint8 dataset)");
  }
  auto src = std::make_unique<EncodedSourceImpl>();
  GPUFEED_RETURN_IF_ERROR(src->Init(spec, *parts, file.get(), *storage, open, decode));
  if (*storage == EncodedStorage::kOffsets) file.Reset();  // the vlen source keeps its dataset (and so the file) open
  return std::unique_ptr<EncodedImageSource>(std::move(src));
}

Status DecodeImage(std::span<const uint8_t> bytes, const DecodeOptions& options, uint64_t seed, uint64_t epoch,
                   uint64_t sample, uint8_t* dst) {
  return image::DecodeTransform(bytes, options, image::RandomKey(seed, epoch, sample), dst);
}

}  // namespace gpufeed
