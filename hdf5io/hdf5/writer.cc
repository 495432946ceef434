// DatasetWriter: creates the chunked /images dataset with the filters HDF5
// readers need to know about, stores chunks that gpufeed's codecs encoded
// (H5Dwrite_chunk, no HDF5 filter call), and commits by rename.
#include "gpufeed/writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>

#include <zstd.h>

#include "common/atomic_file.h"
#include "hdf5io/codec/codec.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/hdf5/zstd_filter.h"

namespace gpufeed {

uint64_t AutoChunkSamples(uint64_t sample_bytes, uint64_t num_samples) {
  constexpr uint64_t kMaxChunkBytes = 2u << 20;   // pread and codecs at full speed well before this
  constexpr uint64_t kMinChunkBytes = 64u << 10;  // below this, per-chunk overhead shows
  constexpr uint64_t kMinChunks = 256;            // so block-order shuffling has windows to mix
  const uint64_t sb = std::max<uint64_t>(1, sample_bytes);
  const uint64_t k_max = std::max<uint64_t>(1, kMaxChunkBytes / sb);
  const uint64_t k_min = std::max<uint64_t>(1, kMinChunkBytes / sb);
  const uint64_t k_spread = std::max<uint64_t>(1, (num_samples + kMinChunks - 1) / kMinChunks);
  return std::min({k_max, std::max(k_min, k_spread), std::max<uint64_t>(1, num_samples)});
}

namespace {

// The file type of a dtype, little-endian, from its kind and size in the
// dtype table: integers HDF5's standard ones, floats IEEE; bfloat16 has none
// (H5I_INVALID_HID: the writer refuses it). Each is made once, locked, and
// kept for the process's life.
hid_t FileTypeOf(DType t) {
  static const std::array<hid_t, 12> kTypes = [] {
    std::array<hid_t, 12> types;
    for (size_t i = 0; i < types.size(); ++i) {
      const DType d = static_cast<DType>(i);
      const size_t size = DTypeSize(d);
      hid_t f = H5I_INVALID_HID;
      switch (DTypeKindOf(d)) {
        case DTypeKind::kSignedInt:
        case DTypeKind::kUnsignedInt:
          f = H5Tcopy(H5T_STD_U8LE);
          H5Tset_size(f, size);
          H5Tset_precision(f, 8 * size);  // H5Tset_size alone keeps 8 significant bits
          H5Tset_sign(f, DTypeKindOf(d) == DTypeKind::kSignedInt ? H5T_SGN_2 : H5T_SGN_NONE);
          break;
        case DTypeKind::kFloat:
          f = H5Tcopy(size == 8 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE);
          if (size == 2) {
            // IEEE half, as h5py and NumPy store float16 (HDF5 has no
            // predefined one).
            H5Tset_fields(f, 15, 10, 5, 0, 10);
            H5Tset_size(f, 2);
            H5Tset_ebias(f, 15);
          }
          break;
        case DTypeKind::kBFloat:
          break;
      }
      if (f != H5I_INVALID_HID) H5Tlock(f);
      types[i] = f;
    }
    return types;
  }();
  return kTypes[static_cast<size_t>(t)];
}

}  // namespace

struct DatasetWriter::Impl {
  // One dataset of the file: /images, or a named field.
  struct Dset {
    std::string path;
    std::vector<uint64_t> sample_shape;
    DType dtype = DType::kUInt8;
    uint64_t sample_bytes = 0;
    std::vector<codec::FilterStep> pipeline;
    h5::Id id;
  };
  std::string path;
  std::unique_ptr<AtomicFile> out;  // the temporary file HDF5 writes, renamed by Commit
  uint64_t num_samples = 0;
  uint64_t chunk_samples = 1;
  int level = 0;
  WriteOptions options;
  std::vector<Dset> dsets;
  h5::Id file;
  uint64_t bytes_written = 0;
  bool committed = false;

  ~Impl() {
    for (Dset& d : dsets) d.id.Reset();
    file.Reset();  // closed before `out` removes an uncommitted temporary file
  }
  Status Error(const std::string& what) const {
    return Status::IOError(path + ": " + what + ": " + h5::LastErrorText());
  }
  Status Reopen() {
    if (file.valid()) return Status::Ok();
    file = h5::Id(H5Fopen(out->tmp_path().c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    if (!file.valid()) return Error("cannot reopen " + out->tmp_path());
    for (Dset& d : dsets) {
      d.id = h5::Id(H5Dopen2(file.get(), d.path.c_str(), H5P_DEFAULT));
      if (!d.id.valid()) return Error("cannot reopen " + d.path);
    }
    return Status::Ok();
  }
  Status CloseFile() {
    if (!file.valid()) return Status::Ok();
    for (Dset& d : dsets) d.id.Reset();
    if (H5Fclose(file.Release()) < 0) return Error("closing " + out->tmp_path());
    return Status::Ok();
  }
  // Creates dataset `path` with this writer's chunking and filters.
  Status AddDset(const std::string& dpath, const std::vector<uint64_t>& sample_shape, DType dtype,
                 const std::string& layout) {
    const hid_t ftype = FileTypeOf(dtype);
    if (ftype == H5I_INVALID_HID) {
      return Status::Unsupported(path + ":" + dpath + ": writing " + std::string(DTypeName(dtype)) +
                                 " is not supported");
    }
    Dset d;
    d.path = dpath;
    d.sample_shape = sample_shape;
    d.dtype = dtype;
    d.sample_bytes = DTypeSize(dtype);
    for (uint64_t x : sample_shape) d.sample_bytes *= x;
    if (chunk_samples * d.sample_bytes > (4ull << 30) - 1) {
      return Status::InvalidArgument(path + ":" + dpath + ": a chunk of " + std::to_string(chunk_samples) +
                                     " samples exceeds HDF5's 4 GiB chunk limit; use fewer --chunk-samples");
    }
    const int rank = static_cast<int>(sample_shape.size()) + 1;
    std::vector<hsize_t> dims(rank), chunk(rank);
    dims[0] = num_samples;
    chunk[0] = chunk_samples;
    for (int k = 1; k < rank; ++k) dims[k] = chunk[k] = sample_shape[k - 1];
    h5::Id space(H5Screate_simple(rank, dims.data(), nullptr));
    h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_chunk(dcpl.get(), rank, chunk.data());
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    if (options.codec != Codec::kNone && options.shuffle_filter && DTypeSize(dtype) > 1) {
      H5Pset_shuffle(dcpl.get());
      d.pipeline.push_back({codec::kFilterShuffle, DTypeSize(dtype)});
    }
    if (options.codec == Codec::kDeflate) {
      H5Pset_deflate(dcpl.get(), static_cast<unsigned>(level));
      d.pipeline.push_back({codec::kFilterDeflate, 1});
    } else if (options.codec == Codec::kZstd) {
      const unsigned cd = static_cast<unsigned>(level);
      if (H5Pset_filter(dcpl.get(), h5::kZstdFilterId, H5Z_FLAG_OPTIONAL, 1, &cd) < 0) {
        return Error("cannot set the zstd filter");
      }
      d.pipeline.push_back({codec::kFilterZstd, 1});
    }
    h5::Id lcpl(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    d.id = h5::Id(H5Dcreate2(file.get(), dpath.c_str(), ftype, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
    if (!d.id.valid()) return Error("cannot create " + dpath);
    if (!layout.empty()) GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(d.id.get(), "layout", layout));
    dsets.push_back(std::move(d));
    return Status::Ok();
  }
};

DatasetWriter::DatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatasetWriter::DatasetWriter(DatasetWriter&&) noexcept = default;
DatasetWriter& DatasetWriter::operator=(DatasetWriter&&) noexcept = default;
DatasetWriter::~DatasetWriter() = default;

uint64_t DatasetWriter::chunk_samples() const { return impl_->chunk_samples; }
uint64_t DatasetWriter::sample_bytes() const { return impl_->dsets[0].sample_bytes; }
uint64_t DatasetWriter::sample_bytes(size_t dataset) const { return impl_->dsets.at(dataset).sample_bytes; }
uint64_t DatasetWriter::bytes_written() const { return impl_->bytes_written; }
uint64_t DatasetWriter::num_chunks() const {
  return (impl_->num_samples + impl_->chunk_samples - 1) / impl_->chunk_samples;
}

Result<DatasetWriter> DatasetWriter::Create(const std::string& path, const std::vector<uint64_t>& sample_shape,
                                            DType dtype, uint64_t num_samples, const WriteOptions& options) {
  h5::QuietErrors();
  h5::EnsureZstdFilterRegistered();
  if (num_samples == 0) return Status::InvalidArgument(path + ": no samples to write");
  auto d = std::make_unique<Impl>();
  d->path = path;
  d->out = std::make_unique<AtomicFile>(path);
  d->num_samples = num_samples;
  d->options = options;
  uint64_t sample_bytes = DTypeSize(dtype);
  for (uint64_t x : sample_shape) sample_bytes *= x;
  d->chunk_samples = options.chunk_samples ? std::min(options.chunk_samples, num_samples)
                                           : AutoChunkSamples(sample_bytes, num_samples);
  // Levels outside a codec's range are refused, not clamped or wrapped.
  if (options.level != -1) {
    const int lo = options.codec == Codec::kDeflate ? 0 : 1;
    const int hi = options.codec == Codec::kDeflate ? 9 : ZSTD_maxCLevel();
    if (options.codec == Codec::kNone) {
      return Status::InvalidArgument(path + ": a compression level (--level " + std::to_string(options.level) +
                                     ") applies to deflate and zstd, not to codec none");
    }
    if (options.level < lo || options.level > hi) {
      return Status::InvalidArgument(path + ": " + std::string(CodecName(options.codec)) + " level " +
                                     std::to_string(options.level) + " is outside " + std::to_string(lo) + ".." +
                                     std::to_string(hi) + " (--level)");
    }
  }
  d->level = options.level;
  if (d->level < 0) d->level = options.codec == Codec::kDeflate ? 4 : 3;

  // Every object of 4 KiB or more (each chunk) starts on a 4 KiB boundary, so
  // direct I/O (O_DIRECT) reads a chunk with no extra bytes around it.
  h5::Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_alignment(fapl.get(), 4096, 4096);
  d->file = h5::Id(H5Fcreate(d->out->tmp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!d->file.valid()) return d->Error("cannot create " + d->out->tmp_path());
  GPUFEED_RETURN_IF_ERROR(d->AddDset(options.dataset_path, sample_shape, dtype, options.layout));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringArrayAttr(d->dsets[0].id.get(), "class_names", options.class_names));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(d->file.get(), "gpufeed_format", "1"));
  return DatasetWriter(std::move(d));
}

Result<size_t> DatasetWriter::AddDataset(const std::string& path, const std::vector<uint64_t>& sample_shape,
                                         DType dtype, const std::string& layout) {
  h5::QuietErrors();
  GPUFEED_RETURN_IF_ERROR(impl_->Reopen());
  GPUFEED_RETURN_IF_ERROR(impl_->AddDset(path, sample_shape, dtype, layout));
  return impl_->dsets.size() - 1;
}

Status DatasetWriter::Close() {
  h5::QuietErrors();
  return impl_->CloseFile();
}

Status DatasetWriter::EncodeChunk(uint64_t i, std::span<const std::byte> samples, EncodedChunk* out,
                                  size_t dataset) const {
  const Impl::Dset& d = impl_->dsets.at(dataset);
  const uint64_t full = impl_->chunk_samples * d.sample_bytes;
  const uint64_t first = i * impl_->chunk_samples;
  const uint64_t n = std::min(impl_->chunk_samples, impl_->num_samples - first);
  if (samples.size() != n * d.sample_bytes) {
    return Status::InvalidArgument(impl_->path + ": chunk " + std::to_string(i) + " given " +
                                   std::to_string(samples.size()) + " bytes, expected " +
                                   std::to_string(n * d.sample_bytes));
  }
  thread_local codec::DecodeScratch scratch;
  thread_local std::vector<std::byte> padded;
  std::span<const std::byte> raw = samples;
  if (samples.size() < full) {  // HDF5 stores edge chunks at full size
    padded.assign(full, std::byte{0});
    std::memcpy(padded.data(), samples.data(), samples.size());
    raw = padded;
  }
  unsigned mask = 0;
  codec::EncodeChunk(d.pipeline, impl_->level, raw, out->bytes, &mask, scratch);
  out->filter_mask = mask;
  return Status::Ok();
}

Status DatasetWriter::WriteChunk(uint64_t i, const EncodedChunk& chunk, size_t dataset) {
  h5::QuietErrors();
  GPUFEED_RETURN_IF_ERROR(impl_->Reopen());
  const Impl::Dset& d = impl_->dsets.at(dataset);
  std::vector<hsize_t> offset(d.sample_shape.size() + 1, 0);
  offset[0] = i * impl_->chunk_samples;
  if (H5Dwrite_chunk(d.id.get(), H5P_DEFAULT, chunk.filter_mask, offset.data(), chunk.bytes.size(),
                     chunk.bytes.data()) < 0) {
    return impl_->Error("writing chunk " + std::to_string(i) + " of " + d.path);
  }
  impl_->bytes_written += chunk.bytes.size();
  return Status::Ok();
}

Status DatasetWriter::WriteLabels(std::span<const int64_t> labels) {
  h5::QuietErrors();
  GPUFEED_RETURN_IF_ERROR(impl_->Reopen());
  if (labels.size() != impl_->num_samples) {
    return Status::InvalidArgument(impl_->path + ": " + std::to_string(labels.size()) + " labels for " +
                                   std::to_string(impl_->num_samples) + " samples");
  }
  int64_t lo = 0, hi = 0;
  if (!labels.empty()) {
    auto [mn, mx] = std::minmax_element(labels.begin(), labels.end());
    lo = *mn;
    hi = *mx;
  }
  hid_t ftype = H5T_STD_I64LE;
  if (lo >= 0 && hi <= 255)
    ftype = H5T_STD_U8LE;
  else if (lo >= INT16_MIN && hi <= INT16_MAX)
    ftype = H5T_STD_I16LE;
  else if (lo >= INT32_MIN && hi <= INT32_MAX)
    ftype = H5T_STD_I32LE;
  hsize_t n = labels.size();
  h5::Id space(H5Screate_simple(1, &n, nullptr));
  h5::Id dset(H5Dcreate2(impl_->file.get(), "labels", ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!dset.valid() || H5Dwrite(dset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0) {
    return impl_->Error("writing /labels");
  }
  return Status::Ok();
}

Status DatasetWriter::WriteChannelStats(const std::vector<double>& mean, const std::vector<double>& stddev,
                                        size_t dataset) {
  h5::QuietErrors();
  GPUFEED_RETURN_IF_ERROR(impl_->Reopen());
  const hid_t id = impl_->dsets.at(dataset).id.get();
  GPUFEED_RETURN_IF_ERROR(h5::WriteDoubleArrayAttr(id, "mean", mean));
  return h5::WriteDoubleArrayAttr(id, "std", stddev);
}

Status DatasetWriter::Commit() {
  h5::QuietErrors();
  GPUFEED_RETURN_IF_ERROR(impl_->CloseFile());
  GPUFEED_RETURN_IF_ERROR(impl_->out->Commit());
  impl_->committed = true;
  return Status::Ok();
}

}  // namespace gpufeed
