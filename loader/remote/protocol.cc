// Frame and message encoding for the daemon protocol (docs/protocol.md).
#include "loader/remote/protocol.h"

#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/sizes.h"

namespace gpufeed::daemon {
namespace {

class Writer {
 public:
  void U8(uint8_t v) { Raw(&v, 1); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void F64(double v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte> Take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Bounds-checked reads; the first failure sticks and names the field.
class Reader {
 public:
  Reader(std::span<const std::byte> p, std::string_view what) : p_(p), what_(what) {}
  bool Raw(void* dst, size_t n, const char* field) {
    if (!error_.empty()) return false;
    if (n > p_.size() - at_) {
      error_ = std::string(what_) + ": truncated at field '" + field + "' (needs " + std::to_string(n) + " bytes, " +
               std::to_string(p_.size() - at_) + " left)";
      return false;
    }
    CopyBytes(dst, p_.data() + at_, n);  // n may be 0 with dst == nullptr (an empty list)
    at_ += n;
    return true;
  }
  uint8_t U8(const char* f) {
    uint8_t v = 0;
    Raw(&v, 1, f);
    return v;
  }
  uint32_t U32(const char* f) {
    uint32_t v = 0;
    Raw(&v, 4, f);
    return v;
  }
  uint64_t U64(const char* f) {
    uint64_t v = 0;
    Raw(&v, 8, f);
    return v;
  }
  double F64(const char* f) {
    double v = 0;
    Raw(&v, 8, f);
    return v;
  }
  std::string Str(const char* f) {
    const uint32_t n = U32(f);
    if (!error_.empty()) return {};
    if (n > kMaxString) {
      Fail(std::string("field '") + f + "' is " + std::to_string(n) + " bytes, limit " + std::to_string(kMaxString));
      return {};
    }
    std::string s(n, '\0');
    Raw(s.data(), n, f);
    return s;
  }
  // A u32 count followed by that many f64 / u64, at most `limit`.
  template <typename T>
  std::vector<T> Vec(uint32_t limit, const char* f) {
    const uint32_t n = U32(f);
    if (!error_.empty()) return {};
    if (n > limit) {
      Fail(std::string("field '") + f + "' has " + std::to_string(n) + " entries, limit " + std::to_string(limit));
      return {};
    }
    std::vector<T> v(n);
    Raw(v.data(), n * sizeof(T), f);
    return v;
  }
  bool ok() const { return error_.empty(); }
  void Fail(std::string m) {
    if (error_.empty()) error_ = std::string(what_) + ": " + std::move(m);
  }
  Status Finish() {
    if (error_.empty() && at_ != p_.size()) {
      Fail(std::to_string(p_.size() - at_) + " unexpected trailing bytes");
    }
    return error_.empty() ? Status::Ok() : Status::Corrupt(error_);
  }

 private:
  std::span<const std::byte> p_;
  size_t at_ = 0;
  std::string_view what_;
  std::string error_;
};

template <typename T>
void PutVec(Writer& w, const std::vector<T>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  w.Raw(v.data(), v.size() * sizeof(T));
}

bool KnownType(uint16_t t) { return t >= 1 && t <= 10; }

}  // namespace

std::string_view FrameTypeName(FrameType t) {
  switch (t) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kHelloOk:
      return "HELLO_OK";
    case FrameType::kCredit:
      return "CREDIT";
    case FrameType::kBatch:
      return "BATCH";
    case FrameType::kEnd:
      return "END";
    case FrameType::kError:
      return "ERROR";
    case FrameType::kShutdown:
      return "SHUTDOWN";
    case FrameType::kBatchRef:
      return "BATCH_REF";
    case FrameType::kSlots:
      return "SLOTS";
    case FrameType::kPing:
      return "PING";
  }
  return "?";
}

HeaderBytes MakeHeader(FrameType type, uint32_t flags, uint32_t raw_bytes,
                       std::initializer_list<std::span<const std::byte>> pieces, uint16_t version) {
  return MakeHeader(type, flags, raw_bytes, std::span(pieces.begin(), pieces.size()), version);
}

HeaderBytes MakeHeader(FrameType type, uint32_t flags, uint32_t raw_bytes,
                       std::span<const std::span<const std::byte>> pieces, uint16_t version) {
  HeaderBytes h{};
  uint64_t payload = 0;
  for (auto p : pieces) payload += p.size();
  const uint16_t t = static_cast<uint16_t>(type);
  const uint32_t len = static_cast<uint32_t>(payload);
  const uint32_t reserved = 0;
  std::memcpy(h.data() + 0, &kMagic, 4);
  std::memcpy(h.data() + 4, &version, 2);
  std::memcpy(h.data() + 6, &t, 2);
  std::memcpy(h.data() + 8, &flags, 4);
  std::memcpy(h.data() + 12, &len, 4);
  std::memcpy(h.data() + 16, &raw_bytes, 4);
  std::memcpy(h.data() + 20, &reserved, 4);
  Checksum c(h);
  for (auto p : pieces) c.Update(p);
  const uint64_t sum = c.Digest();
  std::memcpy(h.data() + 24, &sum, 8);
  return h;
}

uint16_t HeaderVersion(std::span<const std::byte, kHeaderBytes> b) {
  uint32_t magic = 0;
  uint16_t version = 0;
  std::memcpy(&magic, b.data() + 0, 4);
  std::memcpy(&version, b.data() + 4, 2);
  return magic == kMagic ? version : 0;
}

std::string VersionMismatch(std::string_view peer, uint16_t theirs) {
  const std::string side = theirs < kVersion ? "the older side (" + std::string(peer) + ")" : "this side";
  return std::string(peer) + " speaks gpufeed daemon protocol version " + std::to_string(theirs) +
         "; this build speaks version " + std::to_string(kVersion) + " only (2: shared memory; 3: named fields, " +
         "decode options; 4: reshard; 5: deferred decoding): upgrade gpufeed on " + side +
         " so both run the same release";
}

Result<FrameHeader> ParseHeader(std::span<const std::byte, kHeaderBytes> b, uint32_t max_payload, uint32_t max_raw,
                                std::string_view peer) {
  uint32_t magic = 0, reserved = 0;
  uint16_t version = 0, type = 0;
  FrameHeader h;
  std::memcpy(&magic, b.data() + 0, 4);
  std::memcpy(&version, b.data() + 4, 2);
  std::memcpy(&type, b.data() + 6, 2);
  std::memcpy(&h.flags, b.data() + 8, 4);
  std::memcpy(&h.payload_bytes, b.data() + 12, 4);
  std::memcpy(&h.raw_bytes, b.data() + 16, 4);
  std::memcpy(&reserved, b.data() + 20, 4);
  std::memcpy(&h.checksum, b.data() + 24, 8);
  const std::string who(peer);
  if (magic != kMagic) {
    return Status::Corrupt(who + ": bad frame magic 0x" + [&] {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08x", magic);
      return std::string(buf);
    }() + " (not a gpufeed daemon peer, or the stream lost its framing)");
  }
  if (version != kVersion) return Status::Unsupported(VersionMismatch(who, version));
  if (!KnownType(type)) return Status::Corrupt(who + ": unknown frame type " + std::to_string(type));
  h.type = static_cast<FrameType>(type);
  if ((h.flags & ~kFlagZstd) != 0 || reserved != 0) {
    return Status::Corrupt(who + ": unknown flags or reserved bits set in a " + std::string(FrameTypeName(h.type)) +
                           " frame");
  }
  if (h.payload_bytes > max_payload) {
    return Status::InvalidArgument(who + ": " + std::string(FrameTypeName(h.type)) + " frame of " +
                                   std::to_string(h.payload_bytes) + " bytes exceeds the limit of " +
                                   std::to_string(max_payload));
  }
  if (h.raw_bytes > max_raw || (!(h.flags & kFlagZstd) && h.raw_bytes != h.payload_bytes)) {
    return Status::InvalidArgument(who + ": " + std::string(FrameTypeName(h.type)) + " frame claims " +
                                   std::to_string(h.raw_bytes) + " raw bytes (limit " + std::to_string(max_raw) +
                                   ", wire " + std::to_string(h.payload_bytes) + ")");
  }
  return h;
}

Checksum::Checksum(std::span<const std::byte, kHeaderBytes> header) : state_(XXH3_createState()) {
  XXH3_64bits_reset(state_);
  XXH3_64bits_update(state_, header.data(), 24);
}
Checksum::~Checksum() { XXH3_freeState(state_); }
void Checksum::Update(std::span<const std::byte> bytes) { XXH3_64bits_update(state_, bytes.data(), bytes.size()); }
uint64_t Checksum::Digest() const { return XXH3_64bits_digest(state_); }

Status VerifyChecksum(const FrameHeader& h, std::span<const std::byte, kHeaderBytes> header,
                      std::span<const std::byte> payload, std::string_view peer) {
  Checksum c(header);
  c.Update(payload);
  if (c.Digest() != h.checksum) {
    return Status::Corrupt(std::string(peer) + ": checksum mismatch in a " + std::string(FrameTypeName(h.type)) +
                           " frame of " + std::to_string(payload.size()) + " bytes (corrupted in transit)");
  }
  return Status::Ok();
}

std::vector<std::byte> Compress(std::initializer_list<std::span<const std::byte>> pieces) {
  return Compress(std::span(pieces.begin(), pieces.size()));
}

std::vector<std::byte> Compress(std::span<const std::span<const std::byte>> pieces) {
  std::vector<std::byte> raw;
  size_t n = 0;
  for (auto p : pieces) n += p.size();
  raw.reserve(n);
  for (auto p : pieces) raw.insert(raw.end(), p.begin(), p.end());
  std::vector<std::byte> out(ZSTD_compressBound(n));
  const size_t z = ZSTD_compress(out.data(), out.size(), raw.data(), n, 1);
  out.resize(ZSTD_isError(z) ? 0 : z);  // cannot fail with a bound-sized buffer
  return out;
}

Status Decompress(std::span<const std::byte> src, std::span<std::byte> dst, std::string_view peer) {
  const size_t n = ZSTD_decompress(dst.data(), dst.size(), src.data(), src.size());
  if (ZSTD_isError(n)) {
    return Status::Corrupt(std::string(peer) + ": zstd payload: " + ZSTD_getErrorName(n));
  }
  if (n != dst.size()) {
    return Status::Corrupt(std::string(peer) + ": zstd payload decoded to " + std::to_string(n) +
                           " bytes, header says " + std::to_string(dst.size()));
  }
  return Status::Ok();
}

// --- messages ---------------------------------------------------------------

std::vector<std::byte> EncodeHello(const Hello& m) {
  Writer w;
  w.Str(m.token);
  w.Str(m.dataset);
  w.Str(m.client_name);
  w.U64(m.loader.batch_size);
  w.U8(static_cast<uint8_t>(m.loader.order));
  w.U64(m.loader.seed);
  w.U64(m.loader.shuffle_window);
  w.U32(static_cast<uint32_t>(m.loader.rank));
  w.U32(static_cast<uint32_t>(m.loader.world_size));
  w.U8(m.loader.drop_last ? 1 : 0);
  w.U64(m.epoch);
  w.U64(m.start_batch);
  w.U8(m.compress ? 1 : 0);
  w.U8(m.describe_only ? 1 : 0);
  w.U32(m.shm_slots);
  w.U64(m.shm_stride);
  w.U32(m.decode.height);
  w.U32(m.decode.width);
  w.Str(m.decode.layout);
  w.U8(static_cast<uint8_t>(m.decode.transform));
  w.F64(m.decode.scale_min);
  w.F64(m.decode.scale_max);
  w.F64(m.decode.ratio_min);
  w.F64(m.decode.ratio_max);
  w.F64(m.decode.center_fraction);
  w.U8(m.decode.skip_corrupt ? 1 : 0);
  w.U64(m.loader.reshard.epoch);
  w.U32(m.loader.reshard.world_size);
  w.U64(m.loader.reshard.share);
  w.U64(m.loader.reshard.consumed);
  w.U8(m.loader.defer_decode ? 1 : 0);
  return w.Take();
}

Result<Hello> DecodeHello(std::span<const std::byte> p) {
  Reader r(p, "HELLO");
  Hello m;
  m.token = r.Str("token");
  m.dataset = r.Str("dataset");
  m.client_name = r.Str("client_name");
  m.loader.batch_size = r.U64("batch_size");
  const uint8_t order = r.U8("order");
  m.loader.seed = r.U64("seed");
  m.loader.shuffle_window = r.U64("shuffle_window");
  const uint32_t rank = r.U32("rank"), world = r.U32("world_size");
  m.loader.drop_last = r.U8("drop_last") != 0;
  m.epoch = r.U64("epoch");
  m.start_batch = r.U64("start_batch");
  m.compress = r.U8("compress") != 0;
  m.describe_only = r.U8("describe_only") != 0;
  m.shm_slots = r.U32("shm_slots");
  m.shm_stride = r.U64("shm_stride");
  m.decode.height = r.U32("image_height");
  m.decode.width = r.U32("image_width");
  m.decode.layout = r.Str("image_layout");
  const uint8_t transform = r.U8("transform");
  m.decode.scale_min = r.F64("scale_min");
  m.decode.scale_max = r.F64("scale_max");
  m.decode.ratio_min = r.F64("ratio_min");
  m.decode.ratio_max = r.F64("ratio_max");
  m.decode.center_fraction = r.F64("center_fraction");
  const uint8_t skip_corrupt = r.U8("skip_corrupt");
  m.loader.reshard.epoch = r.U64("reshard_epoch");
  m.loader.reshard.world_size = r.U32("reshard_world_size");
  m.loader.reshard.share = r.U64("reshard_share");
  m.loader.reshard.consumed = r.U64("reshard_consumed");
  const uint8_t defer = r.U8("defer_decode");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  if (defer > 1) return Status::InvalidArgument("HELLO: defer_decode " + std::to_string(defer) + " (0 or 1)");
  m.loader.defer_decode = defer == 1;
  if (m.loader.reshard.world_size > (1u << 24) || m.loader.reshard.consumed > m.loader.reshard.share) {
    return Status::InvalidArgument("HELLO: reshard of " + std::to_string(m.loader.reshard.world_size) + " ranks, " +
                                   std::to_string(m.loader.reshard.consumed) + " of " +
                                   std::to_string(m.loader.reshard.share) + " samples received");
  }
  if (transform > static_cast<uint8_t>(ImageTransform::kCenterCrop) || skip_corrupt > 1) {
    return Status::InvalidArgument("HELLO: unknown transform " + std::to_string(transform) + " or skip_corrupt " +
                                   std::to_string(skip_corrupt) + " (0 random_resized_crop, 1 center_crop; 0 or 1)");
  }
  m.decode.transform = static_cast<ImageTransform>(transform);
  m.decode.skip_corrupt = skip_corrupt == 1;
  if (Status st = ValidateDecodeOptions(m.decode); !st.ok()) return st.WithContext("HELLO: decode options");
  if (m.shm_slots > kMaxShmSlots || (m.shm_slots > 0 && (m.shm_stride == 0 || m.shm_stride > (1ull << 36)))) {
    return Status::InvalidArgument("HELLO: " + std::to_string(m.shm_slots) + " shared-memory slots of " +
                                   std::to_string(m.shm_stride) + " bytes (up to " + std::to_string(kMaxShmSlots) +
                                   " slots of at most 64 GiB)");
  }
  if (order > static_cast<uint8_t>(Order::kBlock)) {
    return Status::InvalidArgument("HELLO: unknown order " + std::to_string(order));
  }
  m.loader.order = static_cast<Order>(order);
  if (m.loader.batch_size == 0 || m.loader.batch_size > kMaxBatchSize) {
    return Status::InvalidArgument("HELLO: batch size " + std::to_string(m.loader.batch_size) + " outside [1, " +
                                   std::to_string(kMaxBatchSize) + "]");
  }
  if (world == 0 || world > (1u << 20) || rank >= world) {
    return Status::InvalidArgument("HELLO: rank " + std::to_string(rank) + " of world size " + std::to_string(world));
  }
  m.loader.rank = static_cast<int>(rank);
  m.loader.world_size = static_cast<int>(world);
  return m;
}

std::vector<std::byte> EncodeHelloOk(const HelloOk& m) {
  Writer w;
  w.Str(m.info.name);
  w.U8(static_cast<uint8_t>(m.info.dtype));
  PutVec(w, m.info.sample_shape);
  w.U64(m.info.sample_bytes);
  w.U64(m.info.num_samples);
  w.U64(m.info.batch_size);
  w.U8(m.info.has_labels ? 1 : 0);
  PutVec(w, m.info.mean);
  PutVec(w, m.info.stddev);
  w.U64(m.num_batches);
  w.U64(m.client_id);
  w.U8(m.compress ? 1 : 0);
  w.U8(m.shm ? 1 : 0);
  w.U32(static_cast<uint32_t>(m.info.fields.size()));
  for (const FieldInfo& f : m.info.fields) {
    w.Str(f.name);
    w.Str(f.path);
    w.U8(static_cast<uint8_t>(f.dtype));
    w.U8(f.is_bool ? 1 : 0);
    PutVec(w, f.sample_shape);
    w.U64(f.sample_bytes);
  }
  w.U8(m.info.encoded_batches ? 1 : 0);
  w.U64(m.slot_sample_bytes);
  return w.Take();
}

namespace {

// Checked product: a shape whose size wraps to `bytes` would pass.
bool ShapeHoldsBytes(DType dtype, const std::vector<uint64_t>& shape, uint64_t bytes) {
  uint64_t shape_bytes = DTypeSize(dtype);
  bool wrapped = false;
  for (uint64_t d : shape) wrapped |= __builtin_mul_overflow(shape_bytes, d, &shape_bytes);
  return !wrapped && shape_bytes == bytes;
}

}  // namespace

Result<HelloOk> DecodeHelloOk(std::span<const std::byte> p) {
  Reader r(p, "HELLO_OK");
  HelloOk m;
  m.info.name = r.Str("name");
  const uint8_t dtype = r.U8("dtype");
  m.info.sample_shape = r.Vec<uint64_t>(kMaxRank, "sample_shape");
  m.info.sample_bytes = r.U64("sample_bytes");
  m.info.num_samples = r.U64("num_samples");
  m.info.batch_size = r.U64("batch_size");
  m.info.has_labels = r.U8("has_labels") != 0;
  m.info.mean = r.Vec<double>(kMaxChannels, "mean");
  m.info.stddev = r.Vec<double>(kMaxChannels, "std");
  m.num_batches = r.U64("num_batches");
  m.client_id = r.U64("client_id");
  m.compress = r.U8("compress") != 0;
  m.shm = r.U8("shm") != 0;
  const uint32_t nfields = r.U32("fields");
  if (nfields == 0 || nfields > kMaxFields) {
    r.Fail("field count " + std::to_string(nfields) + " outside [1, " + std::to_string(kMaxFields) + "]");
  }
  std::vector<uint8_t> field_dtypes;
  for (uint32_t i = 0; i < nfields && r.ok(); ++i) {
    FieldInfo f;
    f.name = r.Str("field name");
    f.path = r.Str("field path");
    field_dtypes.push_back(r.U8("field dtype"));
    f.is_bool = r.U8("field is_bool") != 0;
    f.sample_shape = r.Vec<uint64_t>(kMaxRank, "field sample_shape");
    f.sample_bytes = r.U64("field sample_bytes");
    m.info.fields.push_back(std::move(f));
  }
  const uint8_t encoded = r.U8("encoded_batches");
  m.slot_sample_bytes = r.U64("slot_sample_bytes");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  if (encoded > 1) return Status::Corrupt("HELLO_OK: encoded_batches " + std::to_string(encoded) + " (0 or 1)");
  m.info.encoded_batches = encoded == 1;
  if (dtype > static_cast<uint8_t>(DType::kFloat64)) {
    return Status::Corrupt("HELLO_OK: unknown dtype " + std::to_string(dtype));
  }
  m.info.dtype = static_cast<DType>(dtype);
  if (m.info.sample_bytes == 0 || m.info.sample_bytes > kMaxSampleBytes ||
      !ShapeHoldsBytes(m.info.dtype, m.info.sample_shape, m.info.sample_bytes)) {
    return Status::Corrupt("HELLO_OK: sample of " + std::to_string(m.info.sample_bytes) +
                           " bytes does not fit its shape");
  }
  // Each field fits its shape; offsets are the running sum, which must end
  // at sample_bytes (each term is at most sample_bytes <= 2^31: no wrap).
  uint64_t offset = 0;
  for (size_t i = 0; i < m.info.fields.size(); ++i) {
    FieldInfo& f = m.info.fields[i];
    if (field_dtypes[i] > static_cast<uint8_t>(DType::kFloat64)) {
      return Status::Corrupt("HELLO_OK: field '" + f.name + "' has unknown dtype " + std::to_string(field_dtypes[i]));
    }
    f.dtype = static_cast<DType>(field_dtypes[i]);
    if (f.name.empty() || f.sample_bytes == 0 || f.sample_bytes > m.info.sample_bytes - offset ||
        !ShapeHoldsBytes(f.dtype, f.sample_shape, f.sample_bytes)) {
      return Status::Corrupt("HELLO_OK: field " + std::to_string(i) + " '" + f.name + "' of " +
                             std::to_string(f.sample_bytes) + " bytes does not fit its shape or the sample's " +
                             std::to_string(m.info.sample_bytes) + " bytes");
    }
    for (size_t j = 0; j < i; ++j) {
      if (m.info.fields[j].name == f.name) return Status::Corrupt("HELLO_OK: field '" + f.name + "' twice");
    }
    f.offset = offset;
    offset += f.sample_bytes;
  }
  if (offset != m.info.sample_bytes) {
    return Status::Corrupt("HELLO_OK: fields of " + std::to_string(offset) + " bytes in samples of " +
                           std::to_string(m.info.sample_bytes));
  }
  if (m.info.batch_size == 0 || m.info.batch_size > kMaxBatchSize) {
    return Status::Corrupt("HELLO_OK: batch size " + std::to_string(m.info.batch_size));
  }
  if (m.info.encoded_batches ? m.slot_sample_bytes < m.info.sample_bytes || m.slot_sample_bytes > kMaxSampleBytes
                             : m.slot_sample_bytes != 0) {
    return Status::Corrupt("HELLO_OK: slots of " + std::to_string(m.slot_sample_bytes) + " bytes a sample for " +
                           (m.info.encoded_batches
                                ? "encoded batches of samples of " + std::to_string(m.info.sample_bytes) +
                                      " bytes (from that to " + std::to_string(kMaxSampleBytes) + ")"
                                : std::string("batches that are not encoded (0)")));
  }
  return m;
}

std::vector<std::byte> EncodeCredit(uint32_t batches) {
  Writer w;
  w.U32(batches);
  return w.Take();
}

Result<uint32_t> DecodeCredit(std::span<const std::byte> p) {
  Reader r(p, "CREDIT");
  const uint32_t n = r.U32("batches");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  if (n == 0 || n > kMaxCredits) {
    return Status::InvalidArgument("CREDIT: " + std::to_string(n) + " batches (1 to " + std::to_string(kMaxCredits) +
                                   ")");
  }
  return n;
}

namespace {

// A BATCH head, or with `slot` a BATCH_REF payload: the fixed part, [slot, 0],
// indices, labels.
std::vector<std::byte> EncodeHead(const Batch& b, const uint32_t* slot) {
  Writer w;
  w.U64(b.epoch());
  w.U64(b.index());
  w.U32(static_cast<uint32_t>(b.size()));
  w.U32((b.labels().empty() ? 0 : 1) | (b.encoded().empty() ? 0 : 2));
  w.U64(b.sample_bytes());
  if (slot != nullptr) {
    w.U32(*slot);
    w.U32(0);
  }
  w.Raw(b.indices().data(), b.indices().size_bytes());
  w.Raw(b.labels().data(), b.labels().size_bytes());
  for (const EncodedSample& e : b.encoded()) {
    w.U64(e.offset);
    w.U64(e.bytes);
    for (int32_t v : {e.height, e.width, e.crop.top, e.crop.left, e.crop.height, e.crop.width}) {
      w.U32(static_cast<uint32_t>(v));
    }
  }
  return w.Take();
}

}  // namespace

std::vector<std::byte> EncodeBatchHead(const Batch& b) { return EncodeHead(b, nullptr); }

Result<BatchHead> DecodeBatchFixed(std::span<const std::byte> p) {
  Reader r(p.first(std::min(p.size(), BatchHead::kFixedBytes)), "BATCH");
  BatchHead h;
  h.epoch = r.U64("epoch");
  h.index = r.U64("index");
  h.count = r.U32("count");
  const uint32_t flags = r.U32("flags");
  h.sample_bytes = r.U64("sample_bytes");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  if (flags > 3) return Status::Corrupt("BATCH: unknown flags " + std::to_string(flags));
  h.has_labels = (flags & 1) != 0;
  h.encoded = (flags & 2) != 0;
  return h;
}

std::vector<std::byte> EncodeBatchRef(const Batch& b, uint32_t slot) { return EncodeHead(b, &slot); }

std::vector<std::span<const std::byte>> BatchFieldBytes(const Batch& b) {
  if (!b.encoded().empty()) return {b.buffer().first(EncodedTableEnd(b.encoded(), b.sample_bytes()))};
  if (b.fields().size() <= 1) return {b.images()};
  std::vector<std::span<const std::byte>> v;
  for (size_t f = 0; f < b.fields().size(); ++f) v.push_back(b.field(f));
  return v;
}

uint64_t EncodedTableEnd(std::span<const EncodedSample> table, uint64_t sample_bytes) {
  return table.empty() ? 0 : table.back().offset + (table.back().bytes > 0 ? table.back().bytes : sample_bytes);
}

Result<uint64_t> DecodeEncodedTable(std::span<const std::byte> p, uint32_t count, uint64_t sample_bytes,
                                    uint64_t slot_bytes, std::vector<EncodedSample>* out) {
  if (p.size() != count * kEncodedEntryBytes) {
    return Status::Corrupt("encoded table of " + std::to_string(p.size()) + " bytes for " + std::to_string(count) +
                           " samples (" + std::to_string(kEncodedEntryBytes) + " bytes each)");
  }
  out->assign(count, EncodedSample{});
  uint64_t end = 0;  // of the previous entry
  for (uint32_t i = 0; i < count; ++i) {
    Reader r(p.subspan(uint64_t{i} * kEncodedEntryBytes, kEncodedEntryBytes), "encoded table");
    EncodedSample& e = (*out)[i];
    e.offset = r.U64("offset");
    e.bytes = r.U64("bytes");
    int32_t v[6];
    for (int32_t& x : v) x = static_cast<int32_t>(r.U32("size and crop"));
    GPUFEED_RETURN_IF_ERROR(r.Finish());
    e.height = v[0];
    e.width = v[1];
    e.crop = {v[2], v[3], v[4], v[5]};
    const std::string what = "encoded table entry " + std::to_string(i) + " of " + std::to_string(count);
    const uint64_t size = e.bytes > 0 ? e.bytes : sample_bytes;
    uint64_t entry_end = 0;
    if (e.offset < end || __builtin_add_overflow(e.offset, size, &entry_end) || entry_end > slot_bytes) {
      return Status::Corrupt(what + ": " + std::to_string(size) + " bytes at offset " + std::to_string(e.offset) +
                             " overlap the entry before (its end " + std::to_string(end) + ") or pass the slot's " +
                             std::to_string(slot_bytes) + " bytes");
    }
    end = entry_end;
    if (e.bytes == 0) {
      if (e.height != 0 || e.width != 0 || !(e.crop == CropRect{})) {
        return Status::Corrupt(what + ": a decoded sample (0 encoded bytes) with an image size or crop");
      }
      continue;
    }
    const CropRect& c = e.crop;
    if (e.height < 1 || e.width < 1 || e.height > kMaxImageSide || e.width > kMaxImageSide) {
      return Status::Corrupt(what + ": an image of " + std::to_string(e.height) + "x" + std::to_string(e.width) +
                             " (sides 1 to " + std::to_string(kMaxImageSide) + ")");
    }
    // Each term is at most kMaxImageSide: the sums do not wrap.
    if (c.top < 0 || c.left < 0 || c.height < 1 || c.width < 1 || int64_t{c.top} + c.height > e.height ||
        int64_t{c.left} + c.width > e.width) {
      return Status::Corrupt(what + ": crop " + std::to_string(c.height) + "x" + std::to_string(c.width) + " at (" +
                             std::to_string(c.top) + ", " + std::to_string(c.left) + ") outside its " +
                             std::to_string(e.height) + "x" + std::to_string(e.width) + " image");
    }
  }
  return end;
}

Result<BatchRef> DecodeBatchRef(std::span<const std::byte> p) {
  if (p.size() < BatchRef::kFixedBytes) {
    return Status::Corrupt("BATCH_REF: " + std::to_string(p.size()) + " bytes, shorter than its fixed part");
  }
  BatchRef m;
  auto head = DecodeBatchFixed(p.first(BatchHead::kFixedBytes));
  if (!head.ok()) return head.status();
  m.head = *head;
  Reader r(p.subspan(BatchHead::kFixedBytes, 8), "BATCH_REF");
  m.slot = r.U32("slot");
  const uint32_t zero = r.U32("reserved");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  if (zero != 0) return Status::Corrupt("BATCH_REF: reserved field is " + std::to_string(zero));
  if (m.head.count > kMaxBatchSize || m.payload_bytes() != p.size()) {
    return Status::Corrupt("BATCH_REF: " + std::to_string(m.head.count) + " samples need " +
                           std::to_string(m.payload_bytes()) + " bytes, the frame has " + std::to_string(p.size()));
  }
  return m;
}

std::vector<std::byte> EncodeSlots(std::span<const uint32_t> slots) {
  Writer w;
  w.U32(static_cast<uint32_t>(slots.size()));
  w.Raw(slots.data(), slots.size_bytes());
  return w.Take();
}

Result<std::vector<uint32_t>> DecodeSlots(std::span<const std::byte> p) {
  Reader r(p, "SLOTS");
  std::vector<uint32_t> v = r.Vec<uint32_t>(kMaxShmSlots, "slots");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  if (v.empty()) return Status::InvalidArgument("SLOTS: no slot named");
  return v;
}

std::vector<std::byte> EncodeEnd(const End& m) {
  Writer w;
  w.U64(m.epoch);
  w.U64(m.batches);
  return w.Take();
}

Result<End> DecodeEnd(std::span<const std::byte> p) {
  Reader r(p, "END");
  End m;
  m.epoch = r.U64("epoch");
  m.batches = r.U64("batches");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::vector<std::byte> EncodeError(const ErrorMsg& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.code));
  w.Str(m.message.size() > kMaxString ? m.message.substr(0, kMaxString) : m.message);
  return w.Take();
}

Result<ErrorMsg> DecodeError(std::span<const std::byte> p) {
  Reader r(p, "ERROR");
  ErrorMsg m;
  const uint32_t code = r.U32("code");
  m.message = r.Str("message");
  GPUFEED_RETURN_IF_ERROR(r.Finish());
  m.code = code >= 1 && code <= static_cast<uint32_t>(StatusCode::kInternal) ? static_cast<StatusCode>(code)
                                                                             : StatusCode::kInternal;
  return m;
}

std::vector<std::byte> MakeFrame(FrameType type, std::span<const std::byte> payload) {
  const HeaderBytes h = MakeHeader(type, 0, static_cast<uint32_t>(payload.size()), {payload});
  // One allocation of the frame's size, header and payload copied in (a
  // vector of the header grown by the payload reallocated once per frame).
  std::vector<std::byte> f(h.size() + payload.size());
  std::memcpy(f.data(), h.data(), h.size());
  if (!payload.empty()) std::memcpy(f.data() + h.size(), payload.data(), payload.size());
  return f;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited whatever the contents.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    const unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace gpufeed::daemon
