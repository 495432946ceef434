// DatasetRegistry: the daemon's datasets, opened as the local Loader opens
// them (loader/door/open_source.cc), and encoded datasets' per-options sources.
#include "daemon/datasets.h"

#include <algorithm>
#include <cstdio>

#include "common/sizes.h"
#include "loader/remote/protocol.h"
#include "gpufeed/local_source.h"
#include "gpufeed/fields.h"
#include "hdf5io/hdf5/probe.h"
#include "loader/chunk_cache.h"

namespace gpufeed::daemon {

std::string DecodeKey(const DecodeOptions& d) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%ux%u|%s|%s|%.17g,%.17g,%.17g,%.17g,%.17g|%s", d.height, d.width, d.layout.c_str(),
                std::string(ImageTransformName(d.transform)).c_str(), d.scale_min, d.scale_max, d.ratio_min,
                d.ratio_max, d.center_fraction, d.skip_corrupt ? "skip" : "fail");
  return buf;
}

struct DatasetRegistry::Entry {
  std::string name;
  std::unique_ptr<ChunkSource> source;  // a Dataset or FieldSource; null when encoded
  std::shared_ptr<loader::SharedChunks> shared;
  bool encoded = false;
  struct Variant {
    std::string key;
    std::unique_ptr<EncodedImageSource> source;
    std::shared_ptr<loader::SharedChunks> shared;
    std::shared_ptr<loader::SharedChunks> shared_samples;  // Stream::shared_samples
  };
  Mutex mu;
  std::vector<std::unique_ptr<Variant>> variants GUARDED_BY(mu);  // never shrinks: Loaders point into them
};

uint64_t DatasetRegistry::ShareCaches(uint64_t bytes) {
  uint64_t total = 0;
  for (const auto& e : entries_) {
    if (e->encoded || e->source == nullptr) continue;
    const ChunkSource& src = *e->source;
    const uint64_t chunks = SaturatingMul(src.num_chunks(), src.max_chunk_buffer_bytes());
    const uint64_t b = std::min(bytes, chunks);
    e->shared->Retain(b);
    total = SaturatingAdd(total, b);
  }
  return total;
}

DatasetRegistry::DatasetRegistry() = default;
DatasetRegistry::~DatasetRegistry() = default;

Status DatasetRegistry::Add(const std::string& spec, OpenOptions open) {
  auto e = std::make_unique<Entry>();
  e->name = spec;
  e->shared = std::make_shared<loader::SharedChunks>();
  // As a local Loader opens it (OpenLocalSource): a virtual dataset's
  // sources are read directly here too.
  const DecodeOptions defaults;
  auto local = OpenLocalSource(spec, open, defaults);
  if (!local.ok()) return local.status();
  if (local->encoded) {
    e->encoded = true;
    auto v = std::make_unique<Entry::Variant>();
    v->key = DecodeKey(defaults);
    v->source = std::move(local->encoded);
    v->shared = e->shared;
    v->shared_samples = std::make_shared<loader::SharedChunks>();
    MutexLock lock(&e->mu);
    e->variants.push_back(std::move(v));
  } else if (local->fields) {
    e->source = std::move(local->fields);
  } else {
    e->source = std::move(local->dataset);
  }
  entries_.push_back(std::move(e));
  return Status::Ok();
}

Result<DatasetRegistry::Stream> DatasetRegistry::Find(const std::string& name, const DecodeOptions& decode) {
  Entry* e = nullptr;
  if (name.empty() && !entries_.empty()) e = entries_.front().get();
  for (const auto& x : entries_) {
    if (e == nullptr && x->name == name) e = x.get();
  }
  if (e == nullptr) return Status::NotFound("dataset '" + name + "' is not served here (serving: " + Names() + ")");
  Stream s;
  s.name = e->name;
  if (!e->encoded) {
    s.source = e->source.get();
    s.shared = e->shared;
    return s;
  }
  s.encoded = true;
  s.decode_key = DecodeKey(decode);
  MutexLock lock(&e->mu);
  for (const auto& v : e->variants) {
    if (v->key == s.decode_key) {
      s.source = v->source.get();
      s.shared = v->shared;
      s.shared_samples = v->shared_samples;
      return s;
    }
  }
  if (e->variants.size() >= kMaxDecodeVariants) {
    return Status::Unsupported(e->name + ": " + std::to_string(kMaxDecodeVariants) +
                               " distinct decode options are served already (image size, layout, transform); "
                               "this daemon takes no more: use the options other clients use, or restart it");
  }
  // The file's index is shared with the first source: nothing is read here.
  auto enc = e->variants.front()->source->WithDecodeOptions(decode);
  if (!enc.ok()) return enc.status();
  if ((*enc)->sample_bytes() > kMaxSampleBytes) {  // what the protocol can describe
    return Status::InvalidArgument(e->name + ": decoded samples of " + std::to_string(decode.height) + " x " +
                                   std::to_string(decode.width) + " x 3 bytes exceed the protocol's " +
                                   std::to_string(kMaxSampleBytes >> 30) + " GiB a sample; ask for a smaller size");
  }
  auto v = std::make_unique<Entry::Variant>();
  v->key = s.decode_key;
  v->source = std::move(*enc);
  // Each variant shares with its own streams only: a shared chunk is a
  // source's buffer, and SharedChunks requires one source.
  v->shared = std::make_shared<loader::SharedChunks>();
  v->shared_samples = std::make_shared<loader::SharedChunks>();
  s.source = v->source.get();
  s.shared = v->shared;
  s.shared_samples = v->shared_samples;
  e->variants.push_back(std::move(v));
  return s;
}

std::string DatasetRegistry::Names() const {
  std::string names;
  for (const auto& e : entries_) names += (names.empty() ? "" : ",") + e->name;
  return names;
}

}  // namespace gpufeed::daemon
