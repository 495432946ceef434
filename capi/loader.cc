// The C API's loader (include/gpufeed/c_api.h, "loader"): the options
// checked and turned into a gpufeed::Session's (include/gpufeed/session.h),
// and a handle over it: open, epochs, next and interrupt, position and
// state, statistics.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "capi/core.h"

using gpufeed::Status;
using gpufeed::capi::Fail;
using gpufeed::capi::Guard;

namespace {

char* CopyString(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

// The C options as a session's: every name checked (InvalidArgument saying
// what it takes).
gpufeed::Result<gpufeed::SessionOptions> SessionOptionsOf(const char* data, const gpufeed_options& options) {
  GPUFEED_RETURN_IF_ERROR(gpufeed::capi::CheckIntegerOptions(options));
  gpufeed::SessionOptions out;
  gpufeed::SourceOptions& so = out.source;
  so = options.source;
  so.data = data;
  auto order = gpufeed::OrderFromName(options.order);
  if (!order.ok()) return order.status();
  so.loader.order = *order;
  if (!options.io.empty()) {
    auto io = gpufeed::ParseIoMode(options.io);
    if (!io.ok()) return io.status();
    so.open.io = *io;
  }
  for (size_t at = 0; at < options.allow_paths.size();) {
    const size_t colon = std::min(options.allow_paths.find(':', at), options.allow_paths.size());
    if (colon > at) so.open.allow_paths.push_back(options.allow_paths.substr(at, colon - at));
    at = colon + 1;
  }
  auto transform = gpufeed::ImageTransformFromName(options.image_transform);
  if (!transform.ok()) return transform.status();
  so.decode.transform = *transform;
  auto share = gpufeed::ShareFromName(options.share);
  if (!share.ok()) return share.status();
  so.share = *share;
  out.feed = options.feed;
  out.feed_options = options.feed_options;
  if (out.feed) {
    auto dt = gpufeed::DTypeFromName(options.dtype);
    if (!dt) return Status::InvalidArgument("feed dtype '" + options.dtype + "': float32, float16 or bfloat16");
    out.feed_options.dtype = *dt;
    for (auto [text, field] : {std::pair{&options.layout, &out.feed_options.layout},
                               std::pair{&options.input_layout, &out.feed_options.input_layout}}) {
      auto layout = gpufeed::LayoutFromName(*text);  // "layout 'X': NCHW or NHWC"
      if (!layout.ok()) return Status::InvalidArgument("feed " + layout.status().message());
      *field = *layout;
    }
  }
  auto where = gpufeed::DecodeDeviceFromName(options.decode);
  if (!where.ok()) return where.status();
  out.decode = *where;
  return out;
}

gpufeed::Result<std::string_view> StateBytes(const void* bytes, size_t size) {
  if (bytes == nullptr && size > 0) return Status::InvalidArgument("loader state: NULL bytes");
  return std::string_view(static_cast<const char*>(bytes), size);
}

}  // namespace

extern "C" {

// ---- loader ------------------------------------------------------------------

gpufeed_loader* gpufeed_loader_open(const char* data, const gpufeed_options* options, gpufeed_error** error) {
  gpufeed_loader* out = nullptr;
  Guard(error, [&]() -> gpufeed_code {
    if (data == nullptr || options == nullptr)
      return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_loader_open: NULL argument");
    auto so = SessionOptionsOf(data, *options);
    if (!so.ok()) return Fail(error, so.status());
    auto session = gpufeed::Session::Open(std::move(*so));
    if (!session.ok()) return Fail(error, session.status());
    out = new gpufeed_loader{std::move(*session)};
    return GPUFEED_OK;
  });
  return out;
}

void gpufeed_loader_destroy(gpufeed_loader* l) {
  if (l == nullptr) return;
  try {
    // The session's live stream ends; batches still held keep what they
    // need (and its pipeline, parked on a full pool) until they are released.
    delete l;
  } catch (...) {
    // Nothing a destroy call can report; the session's destructor does not throw.
  }
}

const char* gpufeed_loader_name(const gpufeed_loader* l) { return l->session->name().c_str(); }
uint64_t gpufeed_loader_num_samples(const gpufeed_loader* l) { return l->session->info().num_samples; }
uint64_t gpufeed_loader_num_batches(const gpufeed_loader* l) { return l->session->num_batches(); }
uint64_t gpufeed_loader_batch_size(const gpufeed_loader* l) { return l->session->info().batch_size; }
int gpufeed_loader_sample_ndim(const gpufeed_loader* l) {
  return static_cast<int>(l->session->info().sample_shape.size());
}
uint64_t gpufeed_loader_sample_dim(const gpufeed_loader* l, int i) {
  const auto& s = l->session->info().sample_shape;
  return i >= 0 && static_cast<size_t>(i) < s.size() ? s[static_cast<size_t>(i)] : 0;
}
const char* gpufeed_dtype_name_of_dlpack(uint8_t code, uint8_t bits) {
  const auto t = gpufeed::DTypeFromDlpack(code, bits);
  return t ? gpufeed::DTypeName(*t).data() : nullptr;
}

const char* gpufeed_loader_dtype(const gpufeed_loader* l) {
  return gpufeed::DTypeName(l->session->info().dtype).data();  // the dtype table's names end in NUL
}
int gpufeed_loader_has_labels(const gpufeed_loader* l) { return l->session->info().has_labels ? 1 : 0; }
const char* gpufeed_loader_share(const gpufeed_loader* l) {
  return l->session->opened().node_shared() ? "node" : "none";
}
const char* gpufeed_loader_decode(const gpufeed_loader* l) { return l->session->decode().c_str(); }
int gpufeed_loader_started_node_server(const gpufeed_loader* l) {
  return l->session->opened().started_node_server() ? 1 : 0;
}
int gpufeed_loader_on_gpu(const gpufeed_loader* l) { return l->session->on_gpu() ? 1 : 0; }

gpufeed_code gpufeed_loader_start_epoch(gpufeed_loader* l, uint64_t epoch, uint64_t start_batch,
                                        gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    const Status st = l->session->StartEpoch(epoch, start_batch);
    return st.ok() ? GPUFEED_OK : Fail(error, st);
  });
}

gpufeed_code gpufeed_loader_next(gpufeed_loader* l, int timeout_ms, gpufeed_batch** batch, gpufeed_error** error) {
  if (batch != nullptr) *batch = nullptr;
  return Guard(error, [&]() -> gpufeed_code {
    if (batch == nullptr) return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_loader_next: NULL batch");
    const auto timeout = timeout_ms < 0 ? std::chrono::milliseconds::max() : std::chrono::milliseconds(timeout_ms);
    auto r = l->session->NextFor(timeout);
    if (!r.ok()) return Fail(error, r.status());  // the consumer holding every slot can continue
    if (r->wait == gpufeed::WaitResult::kTimeout) return GPUFEED_TIMEOUT;
    if (r->wait == gpufeed::WaitResult::kInterrupted) return GPUFEED_INTERRUPTED;
    if (!r->batch) return GPUFEED_END;
    *batch = gpufeed::capi::MakeBatch(*l->session, std::move(*r->batch));
    return GPUFEED_OK;
  });
}

void gpufeed_loader_interrupt(gpufeed_loader* l) {
  if (l != nullptr) l->session->Interrupt();
}

void gpufeed_loader_position(const gpufeed_loader* l, uint64_t* epoch, uint64_t* next_batch) {
  const gpufeed::Session::Position p = l->session->position();
  if (epoch != nullptr) *epoch = p.epoch;
  if (next_batch != nullptr) *next_batch = p.next_batch;
}

gpufeed_code gpufeed_loader_save_state(const gpufeed_loader* l, void** bytes, size_t* size, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    const std::string s = l->session->state().Serialize();
    void* p = std::malloc(s.size());
    if (p == nullptr) return Fail(error, GPUFEED_INTERNAL, "gpufeed_loader_save_state: out of memory");
    std::memcpy(p, s.data(), s.size());
    *bytes = p;
    *size = s.size();
    return GPUFEED_OK;
  });
}

gpufeed_code gpufeed_loader_check_state(const gpufeed_loader* l, const void* bytes, size_t size,
                                        gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    if (l == nullptr) return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_loader_check_state: NULL loader");
    auto text = StateBytes(bytes, size);
    if (!text.ok()) return Fail(error, text.status());
    auto st = l->session->CheckState(*text);
    return st.ok() ? GPUFEED_OK : Fail(error, st.status());
  });
}

gpufeed_code gpufeed_loader_restore_state(gpufeed_loader* l, const void* bytes, size_t size, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    auto text = StateBytes(bytes, size);
    if (!text.ok()) return Fail(error, text.status());
    const Status st = l->session->LoadState(*text);
    return st.ok() ? GPUFEED_OK : Fail(error, st);
  });
}

gpufeed_code gpufeed_loader_stats_json(gpufeed_loader* l, char** json, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    // The ended epoch's while the next one runs ahead of its start.
    *json = CopyString(gpufeed::SessionStatsJson(l->session->stats()));
    if (*json == nullptr) return Fail(error, GPUFEED_INTERNAL, "gpufeed_loader_stats_json: out of memory");
    return GPUFEED_OK;
  });
}

}  // extern "C"
