// The door (gpufeed/local_source.h): the one place that decides what a local
// spec names, and opens it.
#include "gpufeed/local_source.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/classes.h"
#include "gpufeed/fields.h"
#include "hdf5io/hdf5/probe.h"
#include "hdf5io/io/read_file.h"
#include "hdf5io/sources/folder_images.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed {
namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// HDF5's superblock signature, at 0, 512, 1024, ... (after a user block),
// read through io (hdf5io/io/read_file.h). A file that cannot be read has none.
bool HasHdf5Signature(const std::string& path) {
  static const unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  auto f = io::ReadOnlyFile::Open(path);
  if (!f.ok()) return false;
  std::byte buf[8];
  for (uint64_t off = 0; off <= (1u << 20) && off + 8 <= f->size(); off = off ? off * 2 : 512) {
    auto got = f->ReadAt(off, buf);
    if (!got.ok() || *got < sizeof buf) return false;
    if (std::memcmp(buf, kSig, 8) == 0) return true;
  }
  return false;
}

}  // namespace

namespace {

// Every named field NAME=PATTERN names .npy files (PATTERN.npy, or a list
// of them in a .txt/.list file): what OpenNpyFields reads.
bool NamesNpyFields(const std::vector<std::string>& fields) {
  if (fields.empty()) return false;
  for (const std::string& f : fields) {
    if (!EndsWith(f, ".npy") && !EndsWith(f, ".txt") && !EndsWith(f, ".list")) return false;
  }
  return true;
}

}  // namespace

Result<SourceDecision> DecideSourceKind(const std::string& spec, const OpenOptions& open) {
  SourceDecision d;
  d.open = open;
  // .npy files named as fields (gpufeed convert --field NAME='dir/*_NAME.npy'):
  // they are the input, whatever the spec.
  if (NamesNpyFields(open.fields)) {
    d.kind = SourceKind::kNpyFields;
    return d;
  }
  // An object (s3://BUCKET/KEY.h5[:/dataset], https://HOST/PATH.h5): one
  // HDF5 file, probed (its metadata parsed in the probe process, fetched
  // there through the remote driver) like a local one.
  // Many objects (s3://BUCKET/dir/*.h5, s3://BUCKET/dir/) are many files,
  // listed by ExpandFiles as a local glob is; named fields in objects are
  // FieldSource's as in local files. One object is probed, then HDF5 (in
  // this process, through the remote driver) says whether it holds encoded
  // images, as for a local file.
  if (io::IsRemoteUrl(spec)) {
    if (!open.fields.empty() || IsMultiFileSpec(spec)) {
      d.kind = SourceKind::kFields;
      return d;
    }
    auto probed = Probe(spec, open);
    if (!probed.ok()) return probed.status();
    auto encoded = DetectEncoded(*probed, open);
    if (!encoded.ok()) return encoded.status();
    d.kind = *encoded != EncodedStorage::kNone ? SourceKind::kEncodedImages : SourceKind::kDataset;
    d.probed = std::move(*probed);
    return d;
  }
  // A directory is many files when it holds HDF5 files (or fields are
  // named), else an image folder (class folders of images).
  struct stat dir {};
  if (open.fields.empty() && ::stat(spec.c_str(), &dir) == 0 && S_ISDIR(dir.st_mode)) {
    auto files = ExpandFiles(spec);
    d.kind = files.ok() && !files->empty() ? SourceKind::kFields : SourceKind::kImageFolder;
    return d;
  }
  if (!open.fields.empty() || IsMultiFileSpec(spec)) {
    d.kind = SourceKind::kFields;  // FieldSource::Open probes each file itself
    return d;
  }
  // Not HDF5 at all: an image folder, .npy or IDX (what convert reads), said
  // before any probe process is forked for it.
  auto parsed = DatasetSpec::Parse(spec);
  if (!parsed.ok()) return parsed.status();
  struct stat st {};
  if (::stat(parsed->file.c_str(), &st) != 0) {
    return Status::NotFound(parsed->file + ": cannot open: " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    d.kind = SourceKind::kImageFolder;
    return d;
  }
  // "file.h5:/path" names a dataset in an HDF5 file: HDF5 says what it is.
  if (parsed->file == spec && !HasHdf5Signature(spec)) {
    for (const char* ext : {".h5", ".hdf5", ".hdf", ".he5"}) {
      if (EndsWith(spec, ext)) {
        return Status::Corrupt(spec + ": named like an HDF5 file but it has no HDF5 signature (" +
                               std::to_string(st.st_size) + " bytes): not HDF5, or damaged");
      }
    }
    d.kind = EndsWith(spec, ".npy") ? SourceKind::kNpy : SourceKind::kIdx;
    return d;
  }
  // HDF5's parser meets the file in the forked probe first (as Dataset::Open
  // would), once: its verdict on a file that crashes or hangs HDF5 is the
  // answer, and what opens it next takes the probed spec.
  auto probed = Probe(spec, open);
  if (!probed.ok()) return probed.status();
  auto encoded = DetectEncoded(*probed, open);
  if (!encoded.ok()) return encoded.status();
  d.kind = *encoded != EncodedStorage::kNone ? SourceKind::kEncodedImages : SourceKind::kDataset;
  d.probed = std::move(*probed);
  return d;
}

Result<LocalSource> OpenLocalSource(const std::string& spec, const OpenOptions& options, const DecodeOptions& decode) {
  auto decided = DecideSourceKind(spec, options);
  if (!decided.ok()) return decided.status();
  return OpenDecidedSource(spec, *decided, decode);
}

Status RefuseConvertOnly(const std::string& spec, const SourceDecision& decided) {
  switch (decided.kind) {
    case SourceKind::kNpy:
    case SourceKind::kIdx:
      return Status::InvalidArgument(
          spec + ": not an HDF5 file (no HDF5 signature; " +
          (decided.kind == SourceKind::kNpy ? "a .npy file" : "an MNIST IDX file, or not a dataset at all") +
          "): the loader reads HDF5; convert it first: gpufeed convert " + spec + " -o " + spec + ".h5");
    case SourceKind::kNpyFields:
      return Status::InvalidArgument(
          "named .npy fields: the loader reads HDF5; convert them first: gpufeed convert --field NAME='dir/*_NAME.npy' "
          "... -o OUT.h5");
    case SourceKind::kFields:
    case SourceKind::kEncodedImages:
    case SourceKind::kDataset:
    case SourceKind::kImageFolder:
      break;
  }
  return Status::Ok();
}

Result<LocalSource> OpenDecidedSource(const std::string& spec, const SourceDecision& decided,
                                      const DecodeOptions& decode) {
  LocalSource out;
  const OpenOptions& open = decided.open;
  if (Status s = RefuseConvertOnly(spec, decided); !s.ok()) return s;
  if (decided.kind == SourceKind::kFields) {
    auto fs = FieldSource::Open(spec, open);
    if (!fs.ok()) return fs.status();
    out.fields = std::move(*fs);
    return out;
  }
  if (decided.kind == SourceKind::kImageFolder) {
    auto folder = OpenFolderImages(spec, open, decode);
    if (!folder.ok()) return folder.status();
    out.encoded = std::move(*folder);
    return out;
  }
  if (!decided.probed) return Status::Internal(spec + ": the door decided one file without probing it");
  const ProbedSpec& probed = *decided.probed;
  if (decided.kind == SourceKind::kEncodedImages) {
    auto enc = OpenEncodedImages(probed, open, decode);
    if (!enc.ok()) return enc.status();
    out.encoded = std::move(*enc);
    return out;
  }
  auto ds = Dataset::Open(probed, open);
  if (!ds.ok()) return ds.status();
  if (!ds->info().virtual_sources.empty()) {
    // A virtual dataset (its mapping checked by Open): read its sources
    // directly, as fields named as a many-file input's (images, labels).
    // FieldSource probes the sources (and the labels), not the dataset again.
    OpenOptions fo = open;
    fo.fields = {"images=" + ds->info().images_path};
    if (ds->has_labels()) fo.fields.push_back("labels=" + ds->info().labels_path);
    auto fs = FieldSource::Open(ds->info().file, fo, {probed});
    if (!fs.ok()) return fs.status();
    out.fields = std::move(*fs);
    return out;
  }
  out.dataset = std::make_unique<Dataset>(std::move(*ds));
  return out;
}

Result<std::unique_ptr<FieldSource>> OpenDecidedFields(const std::string& spec, const SourceDecision& decided) {
  if (decided.kind == SourceKind::kFields) return FieldSource::Open(spec, decided.open);
  if (decided.kind != SourceKind::kDataset) {
    return Status::InvalidArgument(spec + ": " + std::string(SourceKindName(decided.kind)) +
                                   ", not fields of numbers (an HDF5 dataset, named fields or many HDF5 files)");
  }
  if (!decided.probed) return Status::Internal(spec + ": the door decided one file without probing it");
  auto parsed = DatasetSpec::Parse(decided.probed->text());
  if (!parsed.ok()) return parsed.status();
  OpenOptions fo = decided.open;
  fo.fields = {"images=" + parsed->images};
  return FieldSource::Open(parsed->file, fo, {*decided.probed});
}

}  // namespace gpufeed

namespace gpufeed {
namespace {

// One FieldSource's images field as the samples, with labels read from its
// labels field: every call but labels() goes to the images.
class LabeledImages final : public ChunkSource {
 public:
  LabeledImages(std::unique_ptr<ChunkSource> images, std::vector<int64_t> labels)
      : images_(std::move(images)), labels_(std::move(labels)) {}
  uint64_t num_samples() const override { return images_->num_samples(); }
  const std::vector<uint64_t>& sample_shape() const override { return images_->sample_shape(); }
  uint64_t sample_bytes() const override { return images_->sample_bytes(); }
  DType dtype() const override { return images_->dtype(); }
  uint64_t chunk_samples() const override { return images_->chunk_samples(); }
  uint64_t num_chunks() const override { return images_->num_chunks(); }
  uint64_t samples_in_chunk(uint64_t i) const override { return images_->samples_in_chunk(i); }
  uint64_t stored_chunk_bytes(uint64_t i) const override { return images_->stored_chunk_bytes(i); }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override { return images_->ReadChunk(i, dst); }
  void WillRead(uint64_t i) const override { images_->WillRead(i); }
  uint32_t read_ahead_chunks() const override { return images_->read_ahead_chunks(); }
  const std::vector<int64_t>& labels() const override { return labels_; }
  std::string name() const override { return images_->name(); }
  std::vector<FieldInfo> fields() const override { return images_->fields(); }
  SourceAttributes attributes() const override { return images_->attributes(); }
  uint64_t chunk_buffer_bytes(uint64_t i) const override { return images_->chunk_buffer_bytes(i); }
  uint64_t max_chunk_buffer_bytes() const override { return images_->max_chunk_buffer_bytes(); }

 private:
  std::unique_ptr<ChunkSource> images_;
  std::vector<int64_t> labels_;
};

}  // namespace

Result<std::unique_ptr<ChunkSource>> OpenClassifierSource(const std::string& spec, const OpenOptions& open,
                                                          const DecodeOptions& decode) {
  OpenOptions o = open;
  if (o.fields.empty() && IsMultiFileSpec(spec)) o.fields = {"images=/images", "labels=/labels"};
  // The fields to read: as named (or many files' defaults), or, for one
  // file, what the door finds there (a plain dataset or encoded images are
  // the source as they are; a virtual dataset, its sources' fields).
  // Named fields must hold images and labels (said before anything is opened).
  auto check_named = [&](const std::vector<std::string>& named) -> Status {
    bool images = false, labels = false;
    std::string names;
    for (const std::string& text : named) {
      auto f = FieldSpec::Parse(text);
      if (!f.ok()) return f.status();
      images = images || f->name == "images";
      labels = labels || f->name == "labels";
      names += (names.empty() ? "" : ", ") + f->name + "=" + f->path;
    }
    if (images && labels) return Status::Ok();
    return Status::InvalidArgument(spec + ": a classifier reads an images field and a labels field, this has [" +
                                   names + "]; name them --field images=/path --field labels=/path");
  };
  std::unique_ptr<ChunkSource> opened;
  if (o.fields.empty()) {
    auto local = OpenLocalSource(spec, o, decode);
    if (!local.ok()) return local.status();
    if (local->dataset) return std::unique_ptr<ChunkSource>(std::move(local->dataset));
    if (local->encoded) return std::unique_ptr<ChunkSource>(std::move(local->encoded));
    opened = std::move(local->fields);
    std::vector<std::string> named;
    for (const FieldInfo& f : opened->fields()) named.push_back(f.name + "=" + f.path);
    GPUFEED_RETURN_IF_ERROR(check_named(named));
  } else {
    GPUFEED_RETURN_IF_ERROR(check_named(o.fields));
    auto fs = FieldSource::Open(spec, o);
    if (!fs.ok()) return fs.status();
    opened = std::move(*fs);
  }
  const auto* both = dynamic_cast<const FieldSource*>(opened.get());
  if (both == nullptr) return Status::Internal(spec + ": the door's fields are not a FieldSource");
  // Each field a source of its own, over the files probed once above.
  auto lab = both->Select({"labels"});
  if (!lab.ok()) return lab.status();
  const FieldInfo info = (*lab)->fields()[0];
  if (info.sample_bytes != DTypeSize(info.dtype) || !DTypeIsInteger(info.dtype)) {
    std::string shape;
    for (uint64_t d : info.sample_shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    return Status::InvalidArgument(spec + ": labels field " + info.path + " holds " +
                                   std::string(DTypeName(info.dtype)) + " [" + shape +
                                   "] a sample; a classifier needs one integer class a sample");
  }
  auto img = both->Select({"images"});
  if (!img.ok()) return img.status();
  std::vector<int64_t> values((*lab)->num_samples());
  std::vector<std::byte> chunk;
  uint64_t at = 0;
  for (uint64_t c = 0; c < (*lab)->num_chunks(); ++c) {
    chunk.resize((*lab)->chunk_buffer_bytes(c));
    GPUFEED_RETURN_IF_ERROR((*lab)->ReadChunk(c, chunk));
    const uint64_t n = (*lab)->samples_in_chunk(c);
    GPUFEED_RETURN_IF_ERROR(ClassesToInt64(chunk, info.dtype, n, values.data() + at).WithContext(info.path));
    at += n;
  }
  return std::unique_ptr<ChunkSource>(std::make_unique<LabeledImages>(std::move(*img), std::move(values)));
}

}  // namespace gpufeed
