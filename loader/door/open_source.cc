// OpenBatchSource: a dataset spec or a daemon address to a BatchSource.
#include "gpufeed/open_source.h"

#include <optional>

#include "loader/door/node_share.h"
#include "gpufeed/fields.h"

namespace gpufeed {

bool IsDaemonAddress(std::string_view data) { return data.starts_with("unix:") || data.starts_with("tcp://"); }

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
  // The door's decision, when made already (by the caller, or here): the
  // local open takes it.
  std::optional<SourceDecision> decision = IsDaemonAddress(o.data) ? std::nullopt : o.decided;
  if (*share == Share::kNode && o.share == Share::kAuto && o.loader.defer_decode && !IsDaemonAddress(o.data)) {
    // JPEGs this rank's GPU decoder takes (defer_decode): the node's server
    // would send them encoded for this rank's GPU, as a local loader leaves
    // them, but without the host share balance_decode takes here, and that
    // is not measured on a GPU host yet: auto reads them here, each rank
    // decoding on its own GPU's engine (include/gpufeed/open_source.h). The
    // probe runs once: the open below trusts it.
    if (!decision) {
      auto decided = DecideSourceKind(o.data, o.open);
      if (!decided.ok()) return decided.status();
      decision = std::move(*decided);
    }
    if (decision->kind == SourceKind::kEncodedImages) share = Share::kNone;
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
  auto local = decision ? OpenDecidedSource(o.data, *decision, o.decode) : OpenLocalSource(o.data, o.open, o.decode);
  if (!local.ok()) return local.status();
  auto loader = std::make_unique<Loader>(*local->source(), o.loader);
  if (local->encoded) return std::make_unique<OpenedSource>(std::move(local->encoded), std::move(loader));
  if (local->fields) return std::make_unique<OpenedSource>(std::move(local->fields), std::move(loader));
  return std::make_unique<OpenedSource>(std::move(local->dataset), std::move(loader));
}

}  // namespace gpufeed
