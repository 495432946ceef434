// The encoded-images converter (`gpufeed convert DIR --keep-encoded`, and
// an h5py vlen file to the bytes + offsets format): the files' bytes are
// stored untouched in the group EncodedImageSource reads (docs/format.md).
#include <sys/stat.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include "common/atomic_file.h"
#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "hdf5io/hdf5/h5_util.h"
#include "hdf5io/image/image_decode.h"
#include "hdf5io/formats/image_folder_listing.h"

namespace gpufeed {

using image_folder::FolderListing;
using image_folder::ListImageFolder;
using image_folder::ReadWholeFile;

namespace {

// ---------------------------------------------------------------------------
// Encoded conversion helpers.

// The narrowest integer type holding labels 0..max_label, as
// DatasetWriter::WriteLabels picks it.
hid_t LabelFileType(int64_t max_label) {
  if (max_label <= 255) return H5T_STD_U8LE;
  if (max_label <= INT16_MAX) return H5T_STD_I16LE;
  if (max_label <= INT32_MAX) return H5T_STD_I32LE;
  return H5T_STD_I64LE;
}

// The HDF5 chunk of /images/bytes. A loader chunk (a run of samples, about
// 4 MiB) reads the byte chunks it overlaps whole, so smaller byte chunks
// waste less at its two ends; 256 KiB keeps the chunk index small (4,000
// entries a GiB) and each pread large.
constexpr uint64_t kEncodedByteChunk = 256u << 10;
// Files are written in batches of this many bytes (at least one file).
constexpr uint64_t kEncodedBatchBytes = 64ull << 20;

}  // namespace

namespace {

Status H5Error(const std::string& out_path, const std::string& what) {
  return Status::IOError(out_path + ": " + what + ": " + h5::LastErrorText());
}

// The image's header read (its size), and with `skip_corrupt` the whole
// file decoded (at its smallest DCT scale, which still reads all of it).
Status CheckImage(const std::vector<unsigned char>& bytes, bool skip_corrupt, std::vector<uint8_t>* rgb, int* h,
                  int* w) {
  Status hs = image::ImageSize(bytes, h, w);
  if (hs.ok() && skip_corrupt) {
    int dh = 0, dw = 0;
    hs = image::DecodeCovering(bytes, 1, 1, rgb, &dh, &dw);
  }
  return hs;
}

// One batch of files' bytes appended to /images/bytes at `written`
// (samples n_first..n - 1, for the message).
Status AppendBytes(hid_t bytes_ds, const std::vector<unsigned char>& batch, uint64_t written, uint64_t n_first,
                   uint64_t n, const std::string& out_path) {
  const hsize_t at = written, count = batch.size(), new_size = written + batch.size();
  if (count == 0) return Status::Ok();
  if (H5Dset_extent(bytes_ds, &new_size) < 0) return H5Error(out_path, "growing /images/bytes");
  h5::Id mem_space(H5Screate_simple(1, &count, nullptr));
  h5::Id file_space(H5Dget_space(bytes_ds));
  if (!mem_space.valid() || !file_space.valid() ||
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &at, nullptr, &count, nullptr) < 0 ||
      H5Dwrite(bytes_ds, H5T_NATIVE_UINT8, mem_space.get(), file_space.get(), H5P_DEFAULT, batch.data()) < 0) {
    return H5Error(out_path,
                   "writing /images/bytes for samples " + std::to_string(n_first) + ".." + std::to_string(n - 1));
  }
  return Status::Ok();
}

// The index of the n images written: /images/offsets, /images/sizes and
// /labels (where there are labels).
Status WriteIndex(hid_t file, hid_t group, const std::vector<uint64_t>& offsets, const std::vector<uint32_t>& sizes,
                  const std::vector<int64_t>& labels, uint64_t n, const std::string& out_path) {
  const hsize_t off_dims = n + 1, size_dims[2] = {n, 2};
  h5::Id off_space(H5Screate_simple(1, &off_dims, nullptr));
  h5::Id off_ds(H5Dcreate2(group, "offsets", H5T_STD_U64LE, off_space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!off_ds.valid() || H5Dwrite(off_ds.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) < 0) {
    return H5Error(out_path, "writing /images/offsets");
  }
  h5::Id size_space(H5Screate_simple(2, size_dims, nullptr));
  h5::Id size_ds(H5Dcreate2(group, "sizes", H5T_STD_U32LE, size_space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!size_ds.valid() || H5Dwrite(size_ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, sizes.data()) < 0) {
    return H5Error(out_path, "writing /images/sizes");
  }
  const hsize_t dims = n;
  h5::Id space(H5Screate_simple(1, &dims, nullptr));
  if (!labels.empty()) {
    int64_t max_label = *std::max_element(labels.begin(), labels.end());
    h5::Id ds(H5Dcreate2(file, "labels", LabelFileType(max_label), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!ds.valid() || H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()) < 0) {
      return H5Error(out_path, "writing /labels");
    }
  }
  return Status::Ok();
}

// What a conversion of n images (`written` bytes, stored as they came)
// into out_path, begun at `start`, did.
ConvertSummary SummaryOf(const std::string& out_path, uint64_t n, uint64_t written,
                         std::chrono::steady_clock::time_point start) {
  ConvertSummary summary;
  summary.samples = n;
  summary.chunk_samples = 0;  // byte chunks, not sample chunks
  summary.input_bytes = written;
  summary.raw_bytes = written;  // stored as they came
  struct stat st;
  if (::stat(out_path.c_str(), &st) == 0) summary.output_bytes = static_cast<uint64_t>(st.st_size);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

// Writes the encoded-images format (docs/format.md) from n files that `get`
// yields in order (bytes, and a name for messages), with labels and class
// names. Atomic. A file whose header is not an image is Corrupt; with
// `skip_corrupt`, every file is decoded too (at its smallest DCT scale, which
// still reads all of it) and one that fails is left out and named in
// *skipped.
using GetEncoded = std::function<Status(uint64_t k, std::vector<unsigned char>* bytes, std::string* name)>;
Result<ConvertSummary> WriteEncodedImages(const std::string& out_path, uint64_t n_in, const GetEncoded& get,
                                          const std::vector<int64_t>& label_values,
                                          const std::vector<std::string>& class_names, const ConvertOptions& options,
                                          bool skip_corrupt = false, std::vector<std::string>* skipped = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  h5::QuietErrors();
  std::vector<int64_t> kept_labels;  // of the files written, in order
  struct {
    const std::vector<int64_t>& labels;
    const std::vector<std::string>& class_names;
  } listing{kept_labels, class_names};
  AtomicFile out(out_path);  // before `file`: the file closes first
  const std::string& tmp_path = out.tmp_path();
  auto h5_error = [&](const std::string& what) { return H5Error(out_path, what); };

  // docs/format.md "Encoded images": /images is a group of
  //   bytes    uint8 [total], chunked, the files back to back
  //   offsets  uint64 [N + 1], sample k = bytes[offsets[k], offsets[k + 1])
  //   sizes    uint32 [N, 2], (height, width) of each image
  h5::Id file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!file.valid()) return h5_error("cannot create " + tmp_path);
  h5::Id group(H5Gcreate2(file.get(), "images", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!group.valid()) return h5_error("cannot create /images");
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(group.get(), "gpufeed_encoded", "1"));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(group.get(), "encoding", "jpeg/png by signature"));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringArrayAttr(group.get(), "class_names", listing.class_names));
  GPUFEED_RETURN_IF_ERROR(h5::WriteStringAttr(file.get(), "gpufeed_format", "1"));

  const hsize_t zero = 0, unlimited = H5S_UNLIMITED, byte_chunk = kEncodedByteChunk;
  h5::Id bytes_space(H5Screate_simple(1, &zero, &unlimited));
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (!bytes_space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl.get(), 1, &byte_chunk) < 0) {
    return h5_error("cannot set up /images/bytes");
  }
  h5::Id bytes_ds(
      H5Dcreate2(group.get(), "bytes", H5T_STD_U8LE, bytes_space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  if (!bytes_ds.valid()) return h5_error("cannot create /images/bytes");

  std::vector<uint64_t> offsets(n_in + 1, 0);
  std::vector<uint32_t> sizes(2 * n_in, 0);
  std::vector<unsigned char> batch;
  uint64_t written = 0;
  uint64_t n = 0;  // files written
  std::vector<uint8_t> rgb;
  for (uint64_t first = 0; first < n_in;) {
    // Fill a batch of whole files up to the byte cap (at least one file).
    batch.clear();
    uint64_t k = first;
    const uint64_t n_first = n;
    thread_local std::vector<unsigned char> bytes;
    while (k < n_in && (k == first || batch.size() < kEncodedBatchBytes)) {
      std::string path;
      GPUFEED_RETURN_IF_ERROR(get(k, &bytes, &path));
      // Headers: cheap, and catches files the loader could never decode.
      int w = 0, h = 0;
      const Status hs = CheckImage(bytes, skip_corrupt, &rgb, &h, &w);
      if (!hs.ok()) {
        if (!skip_corrupt) {
          return Status::Corrupt(path + ": " + hs.message() +
                                 " (--skip-corrupt leaves such files out; the count and their names are printed)");
        }
        if (skipped) skipped->push_back(path + ": " + hs.message());
        ++k;
        continue;
      }
      sizes[2 * n] = static_cast<uint32_t>(h);
      sizes[2 * n + 1] = static_cast<uint32_t>(w);
      batch.insert(batch.end(), bytes.begin(), bytes.end());
      offsets[n + 1] = offsets[n] + bytes.size();
      if (!label_values.empty()) kept_labels.push_back(label_values[k]);
      ++n, ++k;
    }
    GPUFEED_RETURN_IF_ERROR(AppendBytes(bytes_ds.get(), batch, written, n_first, n, out_path));
    written += batch.size();
    first = k;
    if (options.progress) options.progress(first, n_in);
  }
  batch = {};
  if (n == 0) {
    return Status::InvalidArgument(out_path + ": no image left to write: all " + std::to_string(n_in) +
                                   " files failed to decode");
  }
  offsets.resize(n + 1);
  sizes.resize(2 * n);

  GPUFEED_RETURN_IF_ERROR(WriteIndex(file.get(), group.get(), offsets, sizes, listing.labels, n, out_path));
  bytes_ds.Reset();
  group.Reset();
  if (H5Fclose(file.Release()) < 0) return h5_error("closing " + tmp_path);
  GPUFEED_RETURN_IF_ERROR(out.Commit());

  return SummaryOf(out_path, n, written, start);
}

}  // namespace

Result<ConvertSummary> ConvertEncodedImageFolder(const std::string& dir, const std::string& out_path,
                                                 const ConvertOptions& options, bool skip_corrupt,
                                                 std::vector<std::string>* skipped) {
  h5::QuietErrors();
  Result<FolderListing> listed = ListImageFolder(dir);
  if (!listed.ok()) return listed.status();
  const FolderListing& listing = *listed;
  return WriteEncodedImages(
      out_path, listing.files.size(),
      [&](uint64_t k, std::vector<unsigned char>* bytes, std::string* name) {
        *name = listing.files[k];
        return ReadWholeFile(*name, bytes);
      },
      listing.labels, listing.class_names, options, skip_corrupt, skipped);
}

Result<ConvertSummary> ConvertEncodedHdf5(const std::string& spec, const std::string& out_path,
                                          const ConvertOptions& options) {
  // The door decides what the spec is; an HDF5 file is probed there, once.
  auto decided = DecideSourceKind(spec, {});
  if (!decided.ok()) return decided.status();
  return ConvertEncodedHdf5(spec, *decided, out_path, options);
}

Result<ConvertSummary> ConvertEncodedHdf5(const std::string& spec, const SourceDecision& decided,
                                          const std::string& out_path, const ConvertOptions& options) {
  if (decided.kind != SourceKind::kEncodedImages) {
    return Status::InvalidArgument(spec + ": " + std::string(SourceKindName(decided.kind)) +
                                   ", not an encoded image field (a group written by gpufeed convert --keep-encoded, "
                                   "or an h5py vlen uint8 dataset); convert reads it without --keep-encoded");
  }
  if (!decided.probed) return Status::Internal(spec + ": the door decided one file without probing it");
  auto src = OpenEncodedImages(*decided.probed, decided.open, {});
  if (!src.ok()) return src.status();
  const EncodedImageSource& s = **src;
  std::vector<uint8_t> tmp;
  return WriteEncodedImages(
      out_path, s.num_samples(),
      [&](uint64_t k, std::vector<unsigned char>* bytes, std::string* name) {
        *name = s.name() + " sample " + std::to_string(k);
        Status st = s.ReadEncoded(k, &tmp);
        bytes->assign(tmp.begin(), tmp.end());
        return st;
      },
      s.labels(), s.class_names(), options);
}

}  // namespace gpufeed
