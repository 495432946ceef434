// Size arithmetic on numbers that come from outside (file headers, the wire):
// every product and sum is checked, so a hostile shape gives an error instead
// of a wrapped (silently wrong) size. docs/practices.md, practice 15.
#ifndef GPUFEED_COMMON_SIZES_H_
#define GPUFEED_COMMON_SIZES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace gpufeed {

// a * b, or nullopt if it does not fit in 64 bits.
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a * b and a + b clamped to UINT64_MAX: for bounds that must stay bounds
// (a budget check then refuses them) rather than errors.
inline uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

// first * dims[0] * dims[1] * ..., or nullopt on overflow.
inline std::optional<uint64_t> CheckedProduct(uint64_t first, std::span<const uint64_t> dims) {
  uint64_t r = first;
  for (uint64_t d : dims) {
    if (__builtin_mul_overflow(r, d, &r)) return std::nullopt;
  }
  return r;
}

// memcpy that accepts n == 0 with null pointers (an empty vector's data()):
// memcpy itself does not (undefined behaviour, which UBSan reports).
inline void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_SIZES_H_
