// OpenBatchSource: a dataset spec or a daemon address to a BatchSource.
#include "gpufeed/open_source.h"

#include "common/classes.h"
#include "daemon/node_share.h"
#include "gpufeed/fields.h"
#include "hdf5/probe.h"

namespace gpufeed {

bool IsDaemonAddress(std::string_view data) { return data.starts_with("unix:") || data.starts_with("tcp://"); }

Result<Share> ShareFromName(std::string_view name) {
  if (name == "auto") return Share::kAuto;
  if (name == "node") return Share::kNode;
  if (name == "none") return Share::kNone;
  return Status::InvalidArgument("share '" + std::string(name) +
                                 "': auto (one decode per node under torchrun), node or none");
}

std::string_view ShareName(Share s) {
  switch (s) {
    case Share::kAuto:
      return "auto";
    case Share::kNode:
      return "node";
    case Share::kNone:
      return "none";
  }
  return "?";
}

OpenedSource::OpenedSource(std::unique_ptr<Dataset> dataset, std::unique_ptr<Loader> loader)
    : dataset_(std::move(dataset)), loader_(std::move(loader)), source_(loader_.get()) {}

OpenedSource::OpenedSource(std::unique_ptr<ChunkSource> source, std::unique_ptr<Loader> loader)
    : other_(std::move(source)), loader_(std::move(loader)), source_(loader_.get()) {}

OpenedSource::OpenedSource(std::unique_ptr<EncodedImageSource> encoded, std::unique_ptr<Loader> loader)
    : encoded_(encoded.get()), other_(std::move(encoded)), loader_(std::move(loader)), source_(loader_.get()) {}

OpenedSource::OpenedSource(std::unique_ptr<RemoteLoader> remote) : remote_(std::move(remote)), source_(remote_.get()) {}

// The loader goes before the dataset it reads; the node's lease after the
// connection.
OpenedSource::~OpenedSource() {
  loader_.reset();
  other_.reset();
  remote_.reset();
  lease_.reset();
}

bool OpenedSource::started_node_server() const { return lease_ != nullptr && lease_->started_here(); }
void OpenedSource::HoldLease(std::unique_ptr<NodeLease> lease) { lease_ = std::move(lease); }

uint64_t OpenedSource::num_batches() const { return remote_ ? remote_->num_batches() : loader_->num_batches(); }

Result<std::unique_ptr<OpenedSource>> OpenBatchSource(const SourceOptions& given) {
  SourceOptions o = given;
  auto share = ResolveShare(o);
  if (!share.ok()) return share.status();
  if (*share == Share::kNode && o.share == Share::kAuto && o.loader.defer_decode && o.open.fields.empty() &&
      !IsMultiFileSpec(o.data)) {
    // JPEGs this rank's GPU decoder takes (defer_decode): the node's server
    // would decode them on its CPU, so auto reads them here and each rank
    // decodes on its own GPU's engine. The probe runs once: the open below
    // trusts it.
    OpenOptions probed = o.open;
    GPUFEED_RETURN_IF_ERROR(ProbeUnlessTrusted(o.data, probed));
    probed.trust_files = true;
    auto kind = DetectEncoded(o.data, probed);
    if (!kind.ok()) return kind.status();
    if (*kind != EncodedStorage::kNone) {
      share = Share::kNone;
      o.open = probed;
    }
  }
  if (*share == Share::kNode) {
    auto lease = AttachNodeServer(o);
    if (!lease.ok()) return lease.status();
    SourceOptions r = o;
    r.data = (*lease)->address();
    r.dataset = (*lease)->dataset();
    r.share = Share::kNone;
    auto opened = OpenBatchSource(r);
    if (!opened.ok()) return opened.status();
    (*opened)->HoldLease(std::move(*lease));
    return opened;
  }
  if (IsDaemonAddress(o.data)) {
    RemoteLoaderOptions r = o.remote;
    r.address = o.data;
    r.dataset = o.dataset;
    r.loader = o.loader;
    r.decode = o.decode;
    auto remote = RemoteLoader::Connect(r);
    if (!remote.ok()) return remote.status();
    // Named fields are the daemon's (gpufeed serve --data ... --field ...);
    // fields asked for here must be what it serves, in the same order.
    if (!o.open.fields.empty()) {
      const std::vector<FieldInfo>& served = (*remote)->info().fields;
      std::string want, have;
      bool same = served.size() == o.open.fields.size();
      for (size_t i = 0; i < o.open.fields.size(); ++i) {
        auto spec = FieldSpec::Parse(o.open.fields[i]);
        if (!spec.ok()) return spec.status();
        want += (want.empty() ? "" : ", ") + spec->name + "=" + spec->path;
        same = same && served[i].name == spec->name && served[i].path == spec->path;
      }
      for (const FieldInfo& f : served) have += (have.empty() ? "" : ", ") + f.name + "=" + f.path;
      if (!same) {
        return Status::InvalidArgument(o.data + " serves fields [" + have + "], not the [" + want +
                                       "] asked for (the daemon's --field options define them; leave --field out "
                                       "to take what it serves)");
      }
    }
    return std::make_unique<OpenedSource>(std::move(*remote));
  }
  if (!o.dataset.empty()) {
    return Status::InvalidArgument("--dataset '" + o.dataset + "' names a dataset on a daemon; '" + o.data +
                                   "' is a file (use file.h5:/path to pick a dataset in it)");
  }
  auto local = OpenLocalSource(o.data, o.open, o.decode);
  if (!local.ok()) return local.status();
  auto loader = std::make_unique<Loader>(*local->source(), o.loader);
  if (local->encoded) return std::make_unique<OpenedSource>(std::move(local->encoded), std::move(loader));
  if (local->fields) return std::make_unique<OpenedSource>(std::move(local->fields), std::move(loader));
  return std::make_unique<OpenedSource>(std::move(local->dataset), std::move(loader));
}

Result<LocalSource> OpenLocalSource(const std::string& spec, const OpenOptions& options, const DecodeOptions& decode) {
  LocalSource out;
  if (!options.fields.empty() || IsMultiFileSpec(spec)) {
    auto fs = FieldSource::Open(spec, options);
    if (!fs.ok()) return fs.status();
    out.fields = std::move(*fs);
    return out;
  }
  // HDF5's parser meets the file in the forked probe first (as Dataset::Open
  // would), then here to see whether the field is encoded images.
  OpenOptions open = options;
  GPUFEED_RETURN_IF_ERROR(ProbeUnlessTrusted(spec, open));
  open.trust_files = true;
  auto kind = DetectEncoded(spec, open);
  if (!kind.ok()) return kind.status();
  if (*kind != EncodedStorage::kNone) {
    auto enc = OpenEncodedImages(spec, open, decode);
    if (!enc.ok()) return enc.status();
    out.encoded = std::move(*enc);
    return out;
  }
  auto ds = Dataset::Open(spec, open);
  if (!ds.ok()) return ds.status();
  if (!ds->info().virtual_sources.empty()) {
    // A virtual dataset (its mapping checked by Open): read its sources
    // directly, as fields named as a many-file input's (images, labels).
    OpenOptions fo = open;
    fo.trust_files = options.trust_files;  // the sources have not been through the probe yet
    fo.fields = {"images=" + ds->info().images_path};
    if (ds->has_labels()) fo.fields.push_back("labels=" + ds->info().labels_path);
    auto fs = FieldSource::Open(ds->info().file, fo);
    if (!fs.ok()) return fs.status();
    out.fields = std::move(*fs);
    return out;
  }
  out.dataset = std::make_unique<Dataset>(std::move(*ds));
  return out;
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
  std::string data = spec;
  std::vector<std::string> named = o.fields;
  bool trusted = o.trust_files;
  if (named.empty()) {
    auto local = OpenLocalSource(spec, o, decode);
    if (!local.ok()) return local.status();
    if (local->dataset) return std::unique_ptr<ChunkSource>(std::move(local->dataset));
    if (local->encoded) return std::unique_ptr<ChunkSource>(std::move(local->encoded));
    for (const FieldInfo& f : local->fields->fields()) named.push_back(f.name + "=" + f.path);
    const auto* opened = dynamic_cast<const FieldSource*>(local->fields.get());
    if (opened && opened->files().size() == 1) data = opened->files()[0];
    trusted = true;  // opened and checked just now
  }
  std::string images, labels, names;
  for (const std::string& text : named) {
    auto f = FieldSpec::Parse(text);
    if (!f.ok()) return f.status();
    if (f->name == "images") images = f->path;
    if (f->name == "labels") labels = f->path;
    names += (names.empty() ? "" : ", ") + f->name + "=" + f->path;
  }
  if (images.empty() || labels.empty()) {
    return Status::InvalidArgument(spec + ": a classifier reads an images field and a labels field, this has [" +
                                   names + "]; name them --field images=/path --field labels=/path");
  }
  // Each field a source of its own; the second open trusts what the first
  // probed.
  OpenOptions one = o;
  one.trust_files = trusted;
  one.fields = {"labels=" + labels};
  auto lab = FieldSource::Open(data, one);
  if (!lab.ok()) return lab.status();
  const FieldInfo info = (*lab)->fields()[0];
  if (info.sample_bytes != DTypeSize(info.dtype) || !DTypeIsInteger(info.dtype)) {
    std::string shape;
    for (uint64_t d : info.sample_shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    return Status::InvalidArgument(spec + ": labels field " + labels + " holds " + std::string(DTypeName(info.dtype)) +
                                   " [" + shape + "] a sample; a classifier needs one integer class a sample");
  }
  one.trust_files = true;
  one.fields = {"images=" + images};
  auto img = FieldSource::Open(data, one);
  if (!img.ok()) return img.status();
  std::vector<int64_t> values((*lab)->num_samples());
  std::vector<std::byte> chunk;
  uint64_t at = 0;
  for (uint64_t c = 0; c < (*lab)->num_chunks(); ++c) {
    chunk.resize((*lab)->chunk_buffer_bytes(c));
    GPUFEED_RETURN_IF_ERROR((*lab)->ReadChunk(c, chunk));
    const uint64_t n = (*lab)->samples_in_chunk(c);
    GPUFEED_RETURN_IF_ERROR(ClassesToInt64(chunk, info.dtype, n, values.data() + at).WithContext(labels));
    at += n;
  }
  return std::unique_ptr<ChunkSource>(std::make_unique<LabeledImages>(std::move(*img), std::move(values)));
}

}  // namespace gpufeed
