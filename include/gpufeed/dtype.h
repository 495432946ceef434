// Element types gpufeed carries: the stored dtype of a dataset (uint8 in the
// common case, any numeric HDF5 type otherwise, carried as bytes) and the
// output types of the GPU transform (fp32/fp16/bf16). Every fact of a dtype
// (size, name, kind, NumPy descriptor, DLPack code) is in one table
// (common/dtype.cc); HDF5's types are made from its kind and size
// (hdf5io/hdf5/writer.cc, hdf5io/hdf5/dataset.cc) and Python reads names from it through
// the C API.
#ifndef GPUFEED_DTYPE_H_
#define GPUFEED_DTYPE_H_

#include <cstddef>
#include <cstdint>
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

enum class DTypeKind { kSignedInt, kUnsignedInt, kFloat, kBFloat };
DTypeKind DTypeKindOf(DType t);
// The dtype of `kind` and `size` bytes (HDF5's class, sign and size; a
// NumPy kind letter and size); nullopt when gpufeed carries none such.
std::optional<DType> DTypeOf(DTypeKind kind, size_t size);
// NumPy's array-protocol descriptor: "|u1", "<i4", "<f2"; bfloat16, which
// NumPy lacks, "<V2" (its raw bytes).
std::string_view DTypeNpyDescr(DType t);
// DLPack's DLDataType code (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4)
// and bits; lanes are 1.
struct DTypeDlpack {
  uint8_t code = 0;
  uint8_t bits = 0;
};
DTypeDlpack DTypeDlpackOf(DType t);
std::optional<DType> DTypeFromDlpack(uint8_t code, uint8_t bits);

}  // namespace gpufeed

#endif  // GPUFEED_DTYPE_H_
