// DType names and sizes.
#include "gpufeed/dtype.h"

#include <array>
#include <utility>

namespace gpufeed {
namespace {

struct DTypeRow {
  DType type;
  std::string_view name;
  size_t size;
  bool is_integer;
};

constexpr std::array<DTypeRow, 12> kDTypes = {{
    {DType::kUInt8, "uint8", 1, true},
    {DType::kInt8, "int8", 1, true},
    {DType::kUInt16, "uint16", 2, true},
    {DType::kInt16, "int16", 2, true},
    {DType::kUInt32, "uint32", 4, true},
    {DType::kInt32, "int32", 4, true},
    {DType::kUInt64, "uint64", 8, true},
    {DType::kInt64, "int64", 8, true},
    {DType::kFloat16, "float16", 2, false},
    {DType::kBFloat16, "bfloat16", 2, false},
    {DType::kFloat32, "float32", 4, false},
    {DType::kFloat64, "float64", 8, false},
}};

const DTypeRow& Row(DType t) { return kDTypes[static_cast<size_t>(t)]; }

}  // namespace

size_t DTypeSize(DType t) { return Row(t).size; }
std::string_view DTypeName(DType t) { return Row(t).name; }
bool DTypeIsInteger(DType t) { return Row(t).is_integer; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const DTypeRow& r : kDTypes) {
    if (r.name == name) return r.type;
  }
  return std::nullopt;
}

}  // namespace gpufeed
