// DType names and sizes.
#include "gpufeed/dtype.h"

#include <cstring>
#include <string>

#include "common/classes.h"

#include <array>
#include <utility>

namespace gpufeed {
namespace {

struct DTypeRow {
  DType type;
  std::string_view name;
  size_t size;
  DTypeKind kind;
  std::string_view npy_descr;
  uint8_t dlpack_code;
};

constexpr auto kS = DTypeKind::kSignedInt, kU = DTypeKind::kUnsignedInt, kF = DTypeKind::kFloat,
               kB = DTypeKind::kBFloat;
// Rows in the enum's order (Row() indexes by it; a static_assert checks).
constexpr std::array<DTypeRow, 12> kDTypes = {{
    {DType::kUInt8, "uint8", 1, kU, "|u1", 1},
    {DType::kInt8, "int8", 1, kS, "|i1", 0},
    {DType::kUInt16, "uint16", 2, kU, "<u2", 1},
    {DType::kInt16, "int16", 2, kS, "<i2", 0},
    {DType::kUInt32, "uint32", 4, kU, "<u4", 1},
    {DType::kInt32, "int32", 4, kS, "<i4", 0},
    {DType::kUInt64, "uint64", 8, kU, "<u8", 1},
    {DType::kInt64, "int64", 8, kS, "<i8", 0},
    {DType::kFloat16, "float16", 2, kF, "<f2", 2},
    {DType::kBFloat16, "bfloat16", 2, kB, "<V2", 4},
    {DType::kFloat32, "float32", 4, kF, "<f4", 2},
    {DType::kFloat64, "float64", 8, kF, "<f8", 2},
}};
constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].type) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kDTypes must list the DTypes in the enum's order");

const DTypeRow& Row(DType t) { return kDTypes[static_cast<size_t>(t)]; }

}  // namespace

size_t DTypeSize(DType t) { return Row(t).size; }
std::string_view DTypeName(DType t) { return Row(t).name; }
bool DTypeIsInteger(DType t) { return Row(t).kind == kS || Row(t).kind == kU; }
DTypeKind DTypeKindOf(DType t) { return Row(t).kind; }
std::string_view DTypeNpyDescr(DType t) { return Row(t).npy_descr; }
DTypeDlpack DTypeDlpackOf(DType t) { return {Row(t).dlpack_code, static_cast<uint8_t>(8 * Row(t).size)}; }

std::optional<DType> DTypeOf(DTypeKind kind, size_t size) {
  for (const DTypeRow& r : kDTypes) {
    if (r.kind == kind && r.size == size) return r.type;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromDlpack(uint8_t code, uint8_t bits) {
  for (const DTypeRow& r : kDTypes) {
    if (r.dlpack_code == code && 8 * r.size == bits) return r.type;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const DTypeRow& r : kDTypes) {
    if (r.name == name) return r.type;
  }
  return std::nullopt;
}

Status ClassesToInt64(std::span<const std::byte> column, DType t, uint64_t n, int64_t* out) {
  const uint64_t es = DTypeSize(t);
  if (column.size() < n * es)
    return Status::Internal("classes: a column shorter than its " + std::to_string(n) + " values");
  auto get = [&](uint64_t i, auto v) {
    std::memcpy(&v, column.data() + i * es, sizeof v);
    return v;
  };
  for (uint64_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kInt8:
        out[i] = get(i, int8_t{});
        break;
      case DType::kUInt8:
        out[i] = get(i, uint8_t{});
        break;
      case DType::kInt16:
        out[i] = get(i, int16_t{});
        break;
      case DType::kUInt16:
        out[i] = get(i, uint16_t{});
        break;
      case DType::kInt32:
        out[i] = get(i, int32_t{});
        break;
      case DType::kUInt32:
        out[i] = get(i, uint32_t{});
        break;
      case DType::kInt64:
        out[i] = get(i, int64_t{});
        break;
      case DType::kUInt64: {
        const uint64_t v = get(i, uint64_t{});
        if (v > static_cast<uint64_t>(INT64_MAX)) {
          return Status::InvalidArgument("class " + std::to_string(v) + " does not fit the labels' int64");
        }
        out[i] = static_cast<int64_t>(v);
        break;
      }
      default:
        return Status::Internal("classes: not of an integer dtype: " + std::string(DTypeName(t)));
    }
  }
  return Status::Ok();
}

}  // namespace gpufeed
