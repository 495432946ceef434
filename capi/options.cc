// The C API's options (include/gpufeed/c_api.h, "options"): one table, each
// option written once (its name, type, range, what it is, and the field it
// sets). The typed setters, the generic gpufeed_options_set/_get, the
// listing Python builds its keywords from (gpufeed_option_*), and the range
// check at open are all made from it.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capi/c_api_internal.h"
#include "gpufeed/c_api.h"
#include "gpufeed/loader.h"

using gpufeed::Status;
using gpufeed::capi::Fail;
using gpufeed::capi::Guard;

namespace {

constexpr int64_t kMax63 = INT64_MAX;
constexpr int64_t kMaxInt = INT32_MAX;
// The values an integer option takes: [least, most], or (kAny) any value of
// its type, checked, if at all, where it is used (a device by CUDA, a decoded
// size by DecodeOptions). Ignored by the other types.
struct Range {
  int64_t least = 1, most = 0;  // most < least: any
};
constexpr Range R(int64_t least, int64_t most) { return {least, most}; }
constexpr Range kAny{};

// X(name, type, field of gpufeed_options, range, what): integer options are
// checked against their range by gpufeed_options_set, and for the typed
// setters when the loader opens.
// Types: U64 (uint64_t), U32 (uint32_t), INT (int), BOOL (int, nonzero is
// true), STR (const char*), BYTES (uint64_t; by name also a size text, as
// ParseByteSize reads it), BYTES_AUTO (BYTES, and "auto": AutoCacheBytes(),
// half the memory available). Sizes are read here for every door: the C
// API, Python (through gpufeed_options_set) and the CLI (ParseBytesOption).
#define GPUFEED_OPTION_TABLE(X)                                                                               \
  X(batch_size, U64, source.loader.batch_size, R(1, kMax63), "samples per batch")                             \
  X(order, STR, order, kAny, "sample order: block, random or sequential")                                     \
  X(seed, U64, source.loader.seed, kAny, "shuffle seed")                                                      \
  X(threads, INT, source.loader.threads, R(0, 4096), "loader threads (0: this rank's share of the cores)")    \
  X(prefetch, INT, source.loader.prefetch, R(1, 4096), "batches in flight")                                   \
  X(pool_bytes, BYTES, source.loader.pool_bytes, R(0, kMax63),                                                \
    "bytes of batch buffers (prefetch + 1 of them, fewer where larger; 0: no bound)")                         \
  X(cache_bytes, BYTES_AUTO, source.loader.cache_bytes, R(0, kMax63),                                         \
    "bytes of decoded chunks kept across epochs (auto: half the memory available)")                           \
  X(shuffle_window, U64, source.loader.shuffle_window, R(1, kMax63), "chunks")                                \
  X(rank, INT, source.loader.rank, R(0, kMaxInt), "this rank: 0 to world_size - 1")                           \
  X(world_size, INT, source.loader.world_size, R(1, kMaxInt), "ranks")                                        \
  X(drop_last, BOOL, source.loader.drop_last, kAny, "drop the last short batch")                              \
  X(pin_memory, BOOL, source.loader.pin_memory, kAny, "page-locked host batches")                             \
  X(labels_path, STR, source.open.labels_path, kAny, "labels dataset (\"\": /labels when present; \"none\")") \
  X(trust_files, BOOL, source.open.trust_files, kAny, "skip the forked probe of HDF5 metadata")               \
  X(io, STR, io, kAny, "direct-path I/O: auto, direct or buffered")                                           \
  X(max_open_files, INT, source.open.max_open_files, R(1, kMaxInt), "open files")                             \
  X(no_sample_axis, BOOL, source.open.no_sample_axis, kAny, "each file is one sample without a sample axis")  \
  X(allow_paths, STR, allow_paths, kAny,                                                                      \
    "directories (DIR:DIR) a file's external data, virtual sources and links may lie in, besides its own")    \
  X(share, STR, share, kAny, "where a node's ranks make batches: auto, node or none")                         \
  X(image_height, U32, source.decode.height, kAny, "decoded image height")                                    \
  X(image_width, U32, source.decode.width, kAny, "decoded image width")                                       \
  X(image_transform, STR, image_transform, kAny, "random_resized_crop or center_crop")                        \
  X(image_layout, STR, source.decode.layout, kAny, "decoded image layout: NCHW or NHWC")                      \
  X(skip_corrupt, BOOL, source.decode.skip_corrupt, kAny, "replace a sample that does not decode")            \
  X(decode, STR, decode, kAny, "where JPEGs are decoded: auto, gpu or cpu")                                   \
  X(dataset, STR, source.dataset, kAny, "the daemon's dataset to read")                                       \
  X(token, STR, source.remote.token, kAny, "the daemon's token")                                              \
  X(token_file, STR, source.remote.token_file, kAny, "a file holding the daemon's token")                     \
  X(client_name, STR, source.remote.client_name, kAny, "this client's name in the daemon's log")              \
  X(compress, BOOL, source.remote.compress, kAny, "compress batches on the wire")                             \
  X(shared_memory, BOOL, source.remote.shared_memory, kAny, "batches through shared memory on one host")      \
  X(connect_timeout_ms, INT, source.remote.connect_timeout_ms, R(1, kMaxInt), "milliseconds")                 \
  X(io_timeout_ms, INT, source.remote.io_timeout_ms, R(1, kMaxInt), "milliseconds")                           \
  X(keepalive_ms, INT, source.remote.keepalive_ms, R(0, kMaxInt), "milliseconds; 0: none")                    \
  X(feed, BOOL, feed, kAny, "batches through the GpuFeeder")                                                  \
  X(feed_device, INT, feed_options.device, kAny, "CUDA device")                                               \
  X(feed_dtype, STR, dtype, kAny, "float32, float16 or bfloat16")                                             \
  X(feed_layout, STR, layout, kAny, "NCHW or NHWC")                                                           \
  X(feed_input_layout, STR, input_layout, kAny, "the stored images' layout: NCHW or NHWC")                    \
  X(feed_echo, INT, feed_options.echo, R(0, 4096), "passes over each upload (0: auto)")                       \
  X(feed_super_batch, INT, feed_options.super_batch, R(1, 4096), "batches per upload")                        \
  X(feed_crop_padding, INT, feed_options.crop_padding, R(0, 4096), "pixels")                                  \
  X(feed_flip, BOOL, feed_options.flip, kAny, "random horizontal flips")                                      \
  X(feed_seed, U64, feed_options.seed, kAny, "augmentation seed")                                             \
  X(feed_slots, INT, feed_options.slots, R(1, 4096), "device batches")                                        \
  X(feed_labels_int32, BOOL, feed_options.labels_int32, kAny, "int32 labels")                                 \
  X(feed_force_cpu, BOOL, feed_options.force_cpu, kAny, "the feed's CPU twins even with a GPU")

enum class Type { kU64, kU32, kInt, kBool, kStr, kBytes, kBytesAuto };
constexpr Type kTypeU64 = Type::kU64, kTypeU32 = Type::kU32, kTypeINT = Type::kInt, kTypeBOOL = Type::kBool,
               kTypeSTR = Type::kStr, kTypeBYTES = Type::kBytes, kTypeBYTES_AUTO = Type::kBytesAuto;
bool IsBytes(Type t) { return t == Type::kBytes || t == Type::kBytesAuto; }

const char* TypeName(Type t) {
  switch (t) {
    case Type::kU64:
      return "uint64";
    case Type::kU32:
      return "uint32";
    case Type::kInt:
      return "int";
    case Type::kBool:
      return "bool";
    case Type::kStr:
      return "string";
    case Type::kBytes:
    case Type::kBytesAuto:
      return "bytes";
  }
  return "?";
}

struct Row {
  const char* name;
  Type type;
  void* (*field)(gpufeed_options*);  // the field it sets, of the type above (bool for BOOL)
  Range range;
  const char* what;
  bool ranged() const { return range.least <= range.most; }
};

#define GPUFEED_OPTION_ROW(name, type, member, range, what) \
  Row{#name, kType##type, [](gpufeed_options* o) -> void* { return &o->member; }, range, what},
const Row kRows[] = {GPUFEED_OPTION_TABLE(GPUFEED_OPTION_ROW)};
#undef GPUFEED_OPTION_ROW
constexpr int kNumRows = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));

const Row* Find(std::string_view name) {
  for (const Row& r : kRows) {
    if (name == r.name) return &r;
  }
  return nullptr;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

Status NoSuchOption(std::string_view name) {
  const Row* best = nullptr;
  size_t best_d = 4;  // suggest only near misses
  for (const Row& r : kRows) {
    const size_t d = EditDistance(name, r.name);
    if (d < best_d) best = &r, best_d = d;
  }
  std::string text = "no option '" + std::string(name) + "'";
  if (best != nullptr) text += "; did you mean '" + std::string(best->name) + "'?";
  return Status::InvalidArgument(text + " (gpufeed_option_count and gpufeed_option_name list them)");
}

std::string RangeText(const Row& r) {
  if (r.ranged()) return std::to_string(r.range.least) + " to " + std::to_string(r.range.most);
  if (r.type == Type::kU64 || IsBytes(r.type)) return "0 to " + std::to_string(UINT64_MAX);
  if (r.type == Type::kU32) return "0 to " + std::to_string(UINT32_MAX);
  return std::to_string(INT32_MIN) + " to " + std::to_string(INT32_MAX);
}

// The integer text as the row's type takes it: kOk within its range.
enum class Parsed { kOk, kNotANumber, kOutOfRange };
Parsed ParseInteger(const Row& r, std::string_view text, uint64_t* out) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (r.type == Type::kU64 && !r.ranged() && !text.starts_with('-')) {
    const auto [end, ec] = std::from_chars(first, last, *out);
    if (ec == std::errc::result_out_of_range) return Parsed::kOutOfRange;
    return ec == std::errc() && end == last ? Parsed::kOk : Parsed::kNotANumber;
  }
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range) return Parsed::kOutOfRange;
  if (ec != std::errc() || end != last) return Parsed::kNotANumber;
  const bool in = r.ranged()             ? v >= r.range.least && v <= r.range.most
                  : r.type == Type::kU64 ? v >= 0
                  : r.type == Type::kU32 ? v >= 0 && v <= int64_t{UINT32_MAX}
                                         : v >= INT32_MIN && v <= INT32_MAX;
  if (!in) return Parsed::kOutOfRange;
  *out = static_cast<uint64_t>(v);
  return Parsed::kOk;
}

Status Set(gpufeed_options* o, const Row& r, std::string_view value) {
  const std::string call = "gpufeed_options_set(\"" + std::string(r.name) + "\", \"" + std::string(value) + "\")";
  void* field = r.field(o);
  switch (r.type) {
    case Type::kStr:
      *static_cast<std::string*>(field) = std::string(value);
      return Status::Ok();
    case Type::kBool: {
      for (std::string_view t : {"1", "true", "yes", "on"}) {
        if (value == t) return *static_cast<bool*>(field) = true, Status::Ok();
      }
      for (std::string_view f : {"0", "false", "no", "off"}) {
        if (value == f) return *static_cast<bool*>(field) = false, Status::Ok();
      }
      return Status::InvalidArgument(call + ": " + r.what + ": 1/true/yes/on or 0/false/no/off");
    }
    case Type::kBytes:
    case Type::kBytesAuto: {
      auto v = gpufeed::capi::ParseBytesOption(r.name, value);
      if (!v.ok()) return Status::InvalidArgument(call + ": " + v.status().message());
      *static_cast<uint64_t*>(field) = *v;
      return Status::Ok();
    }
    case Type::kU64:
    case Type::kU32:
    case Type::kInt: {
      uint64_t v = 0;
      switch (ParseInteger(r, value, &v)) {
        case Parsed::kOk:
          break;
        case Parsed::kNotANumber:
          return Status::InvalidArgument(call + ": " + r.what + ": a whole number, " + RangeText(r));
        case Parsed::kOutOfRange:
          return Status::InvalidArgument(call + ": " + r.what + ", " + RangeText(r));
      }
      if (r.type == Type::kU64) *static_cast<uint64_t*>(field) = v;
      if (r.type == Type::kU32) *static_cast<uint32_t*>(field) = static_cast<uint32_t>(v);
      if (r.type == Type::kInt) *static_cast<int*>(field) = static_cast<int>(static_cast<int64_t>(v));
      return Status::Ok();
    }
  }
  return Status::Internal(call + ": unknown option type");
}

std::string Get(gpufeed_options* o, const Row& r) {
  void* field = r.field(o);
  switch (r.type) {
    case Type::kStr:
      return *static_cast<std::string*>(field);
    case Type::kBool:
      return *static_cast<bool*>(field) ? "1" : "0";
    case Type::kU64:
    case Type::kBytes:
    case Type::kBytesAuto:
      return std::to_string(*static_cast<uint64_t*>(field));
    case Type::kU32:
      return std::to_string(*static_cast<uint32_t*>(field));
    case Type::kInt:
      return std::to_string(*static_cast<int*>(field));
  }
  return "";
}

// An integer option's value as set (unsigned ones as signed, so that a -1
// given to an unsigned setter shows as -1).
int64_t IntegerValue(const gpufeed_options& o, const Row& r) {
  void* field = r.field(const_cast<gpufeed_options*>(&o));
  if (r.type == Type::kU64 || IsBytes(r.type)) return static_cast<int64_t>(*static_cast<uint64_t*>(field));
  if (r.type == Type::kU32) return static_cast<int64_t>(*static_cast<uint32_t*>(field));
  return *static_cast<int*>(field);
}

}  // namespace

namespace gpufeed::capi {

namespace {
constexpr char kSizeTakes[] = "a byte count, or a size such as 512MiB, 1GiB, 4G (binary) or 512MB, 2GB (decimal)";
}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  const auto bad = [] { return Status::InvalidArgument(kSizeTakes); };
  auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  size_t at = 0;
  while (at < text.size() && is_digit(text[at])) ++at;
  if (at == 0) return bad();  // no digits, or a sign
  uint64_t whole = 0;
  if (std::from_chars(text.data(), text.data() + at, whole).ec != std::errc()) {
    return Status::InvalidArgument(std::string(kSizeTakes) + ", below 2^64");
  }
  // A fraction ("1.5GiB"), to 18 digits: what a unit multiplies exactly.
  uint64_t frac = 0, frac_scale = 1;
  if (at < text.size() && text[at] == '.') {
    const size_t from = ++at;
    for (; at < text.size() && is_digit(text[at]); ++at) {
      if (frac_scale < uint64_t{1000000000000000000}) frac = frac * 10 + (text[at] - '0'), frac_scale *= 10;
    }
    if (at == from) return bad();
  }
  while (at < text.size() && is_space(text[at])) ++at;
  std::string unit(text.substr(at));
  for (char& c : unit) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  static constexpr std::pair<std::string_view, uint64_t> kUnits[] = {{"", 1},
                                                                     {"b", 1},
                                                                     {"k", 1ull << 10},
                                                                     {"kib", 1ull << 10},
                                                                     {"kb", 1000},
                                                                     {"m", 1ull << 20},
                                                                     {"mib", 1ull << 20},
                                                                     {"mb", 1000000},
                                                                     {"g", 1ull << 30},
                                                                     {"gib", 1ull << 30},
                                                                     {"gb", 1000000000},
                                                                     {"t", 1ull << 40},
                                                                     {"tib", 1ull << 40},
                                                                     {"tb", 1000000000000ull}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const unsigned __int128 bytes =
        static_cast<unsigned __int128>(whole) * scale + static_cast<unsigned __int128>(frac) * scale / frac_scale;
    if (bytes > UINT64_MAX) return Status::InvalidArgument(std::string(kSizeTakes) + ", below 2^64 bytes");
    return static_cast<uint64_t>(bytes);
  }
  return bad();
}

Result<uint64_t> ParseBytesOption(std::string_view option, std::string_view text) {
  const Row* r = Find(option);
  if (r == nullptr || !IsBytes(r->type)) {
    return Status::Internal("ParseBytesOption: '" + std::string(option) + "' is no size option of the table");
  }
  const bool takes_auto = r->type == Type::kBytesAuto;
  if (takes_auto && text == "auto") return AutoCacheBytes();
  auto v = ParseByteSize(text);
  const std::string or_auto = takes_auto ? ", or auto" : "";
  if (!v.ok()) return Status::InvalidArgument(std::string(r->what) + ": " + v.status().message() + or_auto);
  if (r->ranged() && (*v < static_cast<uint64_t>(r->range.least) || *v > static_cast<uint64_t>(r->range.most))) {
    return Status::InvalidArgument(std::string(r->what) + ": " + kSizeTakes + or_auto + ", " + RangeText(*r) +
                                   " bytes");
  }
  return v;
}

Status CheckIntegerOptions(const gpufeed_options& o) {
  for (const Row& r : kRows) {
    if ((r.type != Type::kU64 && r.type != Type::kU32 && r.type != Type::kInt && !IsBytes(r.type)) || !r.ranged())
      continue;
    int64_t most = r.range.most;
    if (std::string_view(r.name) == "rank") most = std::max(0, o.source.loader.world_size - 1);
    const int64_t v = IntegerValue(o, r);
    if (v >= r.range.least && v <= most) continue;
    return Status::InvalidArgument(std::string("gpufeed_options_set_") + r.name + "(" + std::to_string(v) + "): " +
                                   r.what + ", " + std::to_string(r.range.least) + " to " + std::to_string(most) +
                                   (v < 0 ? " (a negative value, through an unsigned setter?)" : ""));
  }
  return Status::Ok();
}

}  // namespace gpufeed::capi

gpufeed_options* gpufeed_options_create(void) { return new (std::nothrow) gpufeed_options(); }
void gpufeed_options_destroy(gpufeed_options* o) { delete o; }

// The typed setters (c_api.h), one per row.
#define GPUFEED_SETTER_U64(name, member) \
  void gpufeed_options_set_##name(gpufeed_options* o, uint64_t v) { o->member = v; }
#define GPUFEED_SETTER_BYTES(name, member) GPUFEED_SETTER_U64(name, member)
#define GPUFEED_SETTER_BYTES_AUTO(name, member) GPUFEED_SETTER_U64(name, member)
#define GPUFEED_SETTER_U32(name, member) \
  void gpufeed_options_set_##name(gpufeed_options* o, uint32_t v) { o->member = v; }
#define GPUFEED_SETTER_INT(name, member) \
  void gpufeed_options_set_##name(gpufeed_options* o, int v) { o->member = v; }
#define GPUFEED_SETTER_BOOL(name, member) \
  void gpufeed_options_set_##name(gpufeed_options* o, int v) { o->member = v != 0; }
#define GPUFEED_SETTER_STR(name, member) \
  void gpufeed_options_set_##name(gpufeed_options* o, const char* v) { o->member = v != nullptr ? v : ""; }
#define GPUFEED_SETTER(name, type, member, range, what) GPUFEED_SETTER_##type(name, member)
GPUFEED_OPTION_TABLE(GPUFEED_SETTER)
#undef GPUFEED_SETTER

// Beside the table: a list and two vectors of numbers.
void gpufeed_options_add_field(gpufeed_options* o, const char* field) {
  if (field != nullptr) o->source.open.fields.emplace_back(field);
}
void gpufeed_options_set_feed_mean(gpufeed_options* o, const double* v, size_t n) {
  o->feed_options.mean.assign(v, v + (v != nullptr ? n : 0));
}
void gpufeed_options_set_feed_std(gpufeed_options* o, const double* v, size_t n) {
  o->feed_options.stddev.assign(v, v + (v != nullptr ? n : 0));
}

gpufeed_code gpufeed_options_set(gpufeed_options* o, const char* name, const char* value, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    if (o == nullptr || name == nullptr || value == nullptr) {
      return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_options_set: NULL argument");
    }
    const Row* r = Find(name);
    if (r == nullptr) return Fail(error, NoSuchOption(name));
    if (Status st = Set(o, *r, value); !st.ok()) return Fail(error, st);
    return GPUFEED_OK;
  });
}

gpufeed_code gpufeed_options_get(const gpufeed_options* o, const char* name, char** value, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    if (o == nullptr || name == nullptr || value == nullptr) {
      return Fail(error, GPUFEED_INVALID_ARGUMENT, "gpufeed_options_get: NULL argument");
    }
    const Row* r = Find(name);
    if (r == nullptr) return Fail(error, NoSuchOption(name));
    const std::string text = Get(const_cast<gpufeed_options*>(o), *r);
    char* out = static_cast<char*>(std::malloc(text.size() + 1));
    if (out == nullptr) return Fail(error, GPUFEED_INTERNAL, "gpufeed_options_get: out of memory");
    std::memcpy(out, text.c_str(), text.size() + 1);
    *value = out;
    return GPUFEED_OK;
  });
}

int gpufeed_option_count(void) { return kNumRows; }
const char* gpufeed_option_name(int i) { return i >= 0 && i < kNumRows ? kRows[i].name : nullptr; }
const char* gpufeed_option_type(int i) { return i >= 0 && i < kNumRows ? TypeName(kRows[i].type) : nullptr; }
const char* gpufeed_option_doc(int i) { return i >= 0 && i < kNumRows ? kRows[i].what : nullptr; }
int gpufeed_option_range(int i, int64_t* least, uint64_t* most) {
  if (i < 0 || i >= kNumRows || least == nullptr || most == nullptr) return 0;
  const Row& r = kRows[i];
  if (r.ranged()) {
    *least = r.range.least, *most = static_cast<uint64_t>(r.range.most);
  } else if (r.type == Type::kU64 || IsBytes(r.type)) {
    *least = 0, *most = UINT64_MAX;
  } else if (r.type == Type::kU32) {
    *least = 0, *most = UINT32_MAX;
  } else if (r.type == Type::kInt) {
    *least = INT32_MIN, *most = INT32_MAX;
  } else {
    return 0;
  }
  return 1;
}
