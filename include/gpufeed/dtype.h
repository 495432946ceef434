// Element types gpufeed carries: the stored dtype of a dataset (uint8 in the
// common case, any numeric HDF5 type otherwise, carried as bytes) and the
// output types of the GPU transform (fp32/fp16/bf16).
#ifndef GPUFEED_DTYPE_H_
#define GPUFEED_DTYPE_H_

#include <cstddef>
#include <optional>
#include <string_view>

namespace gpufeed {

enum class DType {
  kUInt8,
  kInt8,
  kUInt16,
  kInt16,
  kUInt32,
  kInt32,
  kUInt64,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

// Size of one element in bytes.
size_t DTypeSize(DType t);
// NumPy-style name: "uint8", "float32", "bfloat16", ...
std::string_view DTypeName(DType t);
// Inverse of DTypeName; nullopt for an unknown name.
std::optional<DType> DTypeFromName(std::string_view name);
bool DTypeIsInteger(DType t);

}  // namespace gpufeed

#endif  // GPUFEED_DTYPE_H_
