// Decoders for the registered HDF5 plugin filters scientific files use: LZF
// (32000, h5py), Blosc (32001), LZ4 (32004) and Bitshuffle (32008, with or
// without LZ4). Each reads a stream whose sizes come from the file, so every
// size in it is checked against the stored bytes and the expected decoded
// size before anything is read or written (docs/practices.md, 15). Formats, as the
// reference plugins write them:
//   LZF:        one liblzf stream of the whole chunk (h5py's lzf_filter.c).
//   Blosc:      one blosc frame (its own 16-byte header; hdf5-blosc).
//   LZ4:        8-byte BE decoded size, 4-byte BE block size, then per block a
//               4-byte BE stored size and the LZ4 block; a block whose stored
//               size equals its decoded size is stored raw (H5Zlz4.c).
//   Bitshuffle: cd_values {major, minor, elem_size, block_size, compression}.
//               compression 0: the chunk bit-transposed in blocks of
//               block_size elements (a multiple of 8), the last < 8 elements
//               copied as they are; compression 2 (LZ4): 8-byte BE decoded
//               size, 4-byte BE block size in bytes, then per block a 4-byte
//               BE stored size and the LZ4 block of the transposed bytes
//               (bshuf_h5filter.c, bitshuffle.c).
#include <blosc.h>
#include <liblzf/lzf.h>
#include <lz4.h>

#if defined(__SSE2__)
#include <emmintrin.h>  // SSE2: every x86-64 CPU has it
#endif
#if defined(__x86_64__)
#include <immintrin.h>  // AVX2, compiled per function and chosen at run time
#endif

#include <cassert>
#include <climits>
#include <cstring>
#include <vector>

#include "common/sizes.h"
#include "hdf5io/codec/codec.h"

namespace gpufeed::codec {
namespace {

uint64_t ReadBE(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v = (v << 8) | static_cast<uint8_t>(p[k]);
  return v;
}

std::string N(uint64_t v) { return std::to_string(v); }

// Asks for p[0, n) to be brought into the cache, in address order.
void Prefetch(const std::byte* p, size_t n) {
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(p + i);
}

// Bitshuffle's default block (bshuf_default_block_size): 8 KiB of elements,
// a multiple of 8, at least 128.
uint64_t BitshuffleDefaultBlock(uint64_t elem_size) {
  uint64_t b = 8192 / elem_size;
  b = b / 8 * 8;
  return std::max<uint64_t>(b, 128);
}

// 8x8 bit-matrix transpose of the bytes of x (bit 8r+c <-> bit 8c+r), as
// bitshuffle's TRANS_BIT_8X8.
inline uint64_t Transpose8x8(uint64_t x) {
  uint64_t t;
  t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
  x = x ^ t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
  x = x ^ t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
  x = x ^ t ^ (t << 28);
  return x;
}

// Column g of byte j's 8 bit planes (row bytes each): elements 8g..8g+7's
// byte j, to out[0..8).
inline void UnshuffleColumn(const std::byte* planes, size_t row, size_t g, std::byte* out) {
  uint64_t x = 0;
  for (size_t k = 0; k < 8; ++k) x |= static_cast<uint64_t>(static_cast<uint8_t>(planes[k * row + g])) << (8 * k);
  x = Transpose8x8(x);
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(x >> (8 * i));
}

// The twin of the vector paths: one column at a time, each byte written to
// its place in its element.
void BitunshuffleScalar(const std::byte* src, std::byte* dst, size_t n, size_t elem_size) {
  // src holds 8 * elem_size bit planes of n / 8 bytes: plane (8j + k) bit e is
  // bit k of byte j of element e.
  const size_t row = n / 8;
  std::byte col[8];
  for (size_t j = 0; j < elem_size; ++j) {
    for (size_t g = 0; g < row; ++g) {
      UnshuffleColumn(src + j * 8 * row, row, g, col);
      for (size_t i = 0; i < 8; ++i) dst[(g * 8 + i) * elem_size + j] = col[i];
    }
  }
}

#if defined(__SSE2__)
// Transpose8x8 on both 64-bit lanes.
inline __m128i Transpose8x8x2(__m128i x) {
  __m128i t = _mm_and_si128(_mm_xor_si128(x, _mm_srli_epi64(x, 7)), _mm_set1_epi64x(0x00AA00AA00AA00AALL));
  x = _mm_xor_si128(_mm_xor_si128(x, t), _mm_slli_epi64(t, 7));
  t = _mm_and_si128(_mm_xor_si128(x, _mm_srli_epi64(x, 14)), _mm_set1_epi64x(0x0000CCCC0000CCCCLL));
  x = _mm_xor_si128(_mm_xor_si128(x, t), _mm_slli_epi64(t, 14));
  t = _mm_and_si128(_mm_xor_si128(x, _mm_srli_epi64(x, 28)), _mm_set1_epi64x(0x00000000F0F0F0F0LL));
  return _mm_xor_si128(_mm_xor_si128(x, t), _mm_slli_epi64(t, 28));
}

// The byte interleave of 8 rows of 16 bytes: c[m] holds the bytes of columns
// 2m and 2m + 1, one 64-bit word a column, row k's byte in byte k.
inline void InterleaveRows8(const __m128i r[8], __m128i c[8]) {
  const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpackhi_epi8(r[0], r[1]);
  const __m128i a2 = _mm_unpacklo_epi8(r[2], r[3]), a3 = _mm_unpackhi_epi8(r[2], r[3]);
  const __m128i a4 = _mm_unpacklo_epi8(r[4], r[5]), a5 = _mm_unpackhi_epi8(r[4], r[5]);
  const __m128i a6 = _mm_unpacklo_epi8(r[6], r[7]), a7 = _mm_unpackhi_epi8(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi16(a0, a2), b1 = _mm_unpackhi_epi16(a0, a2);
  const __m128i b2 = _mm_unpacklo_epi16(a1, a3), b3 = _mm_unpackhi_epi16(a1, a3);
  const __m128i b4 = _mm_unpacklo_epi16(a4, a6), b5 = _mm_unpackhi_epi16(a4, a6);
  const __m128i b6 = _mm_unpacklo_epi16(a5, a7), b7 = _mm_unpackhi_epi16(a5, a7);
  c[0] = _mm_unpacklo_epi32(b0, b4);
  c[1] = _mm_unpackhi_epi32(b0, b4);
  c[2] = _mm_unpacklo_epi32(b1, b5);
  c[3] = _mm_unpackhi_epi32(b1, b5);
  c[4] = _mm_unpacklo_epi32(b2, b6);
  c[5] = _mm_unpackhi_epi32(b2, b6);
  c[6] = _mm_unpacklo_epi32(b3, b7);
  c[7] = _mm_unpackhi_epi32(b3, b7);
}

// Byte j of elements [8g0 .. 8g0 + 128): the 8 bit planes of byte j at
// columns g0..g0+15, gathered into 16 64-bit words (word g: plane k's byte
// in byte k, as UnshuffleColumn builds it), each transposed, stored to
// out[0..128) in element order.
inline void UnshuffleColumns16(const std::byte* planes, size_t row, size_t g0, std::byte* out) {
  __m128i r[8], c[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(planes + k * row + g0));
  InterleaveRows8(r, c);
  for (int m = 0; m < 8; ++m) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * m), Transpose8x8x2(c[m]));
  }
}

#if defined(__x86_64__)
// Transpose8x8 on all four 64-bit lanes.
__attribute__((target("avx2"))) inline __m256i Transpose8x8x4(__m256i x) {
  __m256i t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 7)), _mm256_set1_epi64x(0x00AA00AA00AA00AALL));
  x = _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 7));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 14)), _mm256_set1_epi64x(0x0000CCCC0000CCCCLL));
  x = _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 14));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 28)), _mm256_set1_epi64x(0x00000000F0F0F0F0LL));
  return _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 28));
}

// UnshuffleColumns16 on 32 columns: the same unpacks within each 128-bit
// lane (lane 0: columns g0..g0+15, lane 1: g0+16..g0+31).
__attribute__((target("avx2"))) void UnshuffleColumns32(const std::byte* planes, size_t row, size_t g0,
                                                        std::byte* out) {
  __m256i r[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(planes + k * row + g0));
  const __m256i a0 = _mm256_unpacklo_epi8(r[0], r[1]), a1 = _mm256_unpackhi_epi8(r[0], r[1]);
  const __m256i a2 = _mm256_unpacklo_epi8(r[2], r[3]), a3 = _mm256_unpackhi_epi8(r[2], r[3]);
  const __m256i a4 = _mm256_unpacklo_epi8(r[4], r[5]), a5 = _mm256_unpackhi_epi8(r[4], r[5]);
  const __m256i a6 = _mm256_unpacklo_epi8(r[6], r[7]), a7 = _mm256_unpackhi_epi8(r[6], r[7]);
  const __m256i b0 = _mm256_unpacklo_epi16(a0, a2), b1 = _mm256_unpackhi_epi16(a0, a2);
  const __m256i b2 = _mm256_unpacklo_epi16(a1, a3), b3 = _mm256_unpackhi_epi16(a1, a3);
  const __m256i b4 = _mm256_unpacklo_epi16(a4, a6), b5 = _mm256_unpackhi_epi16(a4, a6);
  const __m256i b6 = _mm256_unpacklo_epi16(a5, a7), b7 = _mm256_unpackhi_epi16(a5, a7);
  const __m256i c[8] = {_mm256_unpacklo_epi32(b0, b4), _mm256_unpackhi_epi32(b0, b4), _mm256_unpacklo_epi32(b1, b5),
                        _mm256_unpackhi_epi32(b1, b5), _mm256_unpacklo_epi32(b2, b6), _mm256_unpackhi_epi32(b2, b6),
                        _mm256_unpacklo_epi32(b3, b7), _mm256_unpackhi_epi32(b3, b7)};
  for (int m = 0; m < 8; ++m) {
    const __m256i x = Transpose8x8x4(c[m]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * m), _mm256_castsi256_si128(x));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 128 + 16 * m), _mm256_extracti128_si256(x, 1));
  }
}

// Whether the CPU has AVX2, asked once.
bool CpuHasAvx2() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return have;
}
#endif  // __x86_64__

// Byte j of every element of the block, in element order, to out[0..8 * row):
// 32 columns a step with AVX2 (the caller checked the CPU has it), then 16
// with SSE2, then one at a time.
void UnshufflePlaneRow(const std::byte* planes, size_t row, std::byte* out, bool avx2) {
  size_t g = 0;
#if defined(__x86_64__)
  if (avx2) {
    for (; g + 32 <= row; g += 32) UnshuffleColumns32(planes, row, g, out + 8 * g);
  }
#endif
  for (; g + 16 <= row; g += 16) UnshuffleColumns16(planes, row, g, out + 8 * g);
  for (; g < row; ++g) UnshuffleColumn(planes, row, g, out + 8 * g);
}

// The W-byte pieces of x, in order, to out, out + stride, ...
template <size_t W>
inline void StorePieces(__m128i x, std::byte* out, size_t stride) {
  if (stride == W) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), x);
    return;
  }
  alignas(16) std::byte t[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), x);
#pragma GCC unroll 8
  for (size_t i = 0; i < 16 / W; ++i) std::memcpy(out + i * stride, t + i * W, W);
}

// Bytes i < W (W of 1, 2, 4 or 8) of n elements from their planes
// (p[i * n + e] is byte i of element e) to out[e * stride + i]: 16 elements a
// step with unpacks, the rest one at a time. kStride is the stride where it
// is known when compiling (W-byte elements: whole vectors stored), else 0.
template <size_t W, size_t kStride>
void InterleavePlanes(const std::byte* p, size_t n, std::byte* out, size_t runtime_stride) {
  const size_t stride = kStride != 0 ? kStride : runtime_stride;
  size_t e = 0;
  if constexpr (W > 1) {
    for (; e + 16 <= n; e += 16) {
      // x[q]: the pieces of elements e + q * 16 / W onwards. The loops are
      // unrolled so that v and x stay in registers.
      __m128i v[W], x[W];
#pragma GCC unroll 8
      for (size_t i = 0; i < W; ++i) v[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * n + e));
      if constexpr (W == 2) {
        x[0] = _mm_unpacklo_epi8(v[0], v[1]);
        x[1] = _mm_unpackhi_epi8(v[0], v[1]);
      } else if constexpr (W == 4) {
        const __m128i l01 = _mm_unpacklo_epi8(v[0], v[1]), h01 = _mm_unpackhi_epi8(v[0], v[1]);
        const __m128i l23 = _mm_unpacklo_epi8(v[2], v[3]), h23 = _mm_unpackhi_epi8(v[2], v[3]);
        x[0] = _mm_unpacklo_epi16(l01, l23);
        x[1] = _mm_unpackhi_epi16(l01, l23);
        x[2] = _mm_unpacklo_epi16(h01, h23);
        x[3] = _mm_unpackhi_epi16(h01, h23);
      } else {
        static_assert(W == 8);
        InterleaveRows8(v, x);
      }
#pragma GCC unroll 8
      for (size_t q = 0; q < W; ++q) StorePieces<W>(x[q], out + (e + q * 16 / W) * stride, stride);
    }
  }
  for (; e < n; ++e) {
    for (size_t i = 0; i < W; ++i) out[e * stride + i] = p[i * n + e];
  }
}

// Each byte of the element size is unshuffled into its own plane of n bytes,
// and the planes are then interleaved into elements 8, 4, 2 and 1 bytes at a
// time (a 12-byte element: bytes 0-7, then 8-11).
void BitunshuffleSimd(const std::byte* src, std::byte* dst, size_t n, size_t elem_size, bool avx2) {
  const size_t row = n / 8;
  if (elem_size == 1) {
    UnshufflePlaneRow(src, row, dst, avx2);
    return;
  }
  thread_local std::vector<std::byte> planes;
  if (planes.size() < n * elem_size) planes.resize(n * elem_size);
  for (size_t j = 0; j < elem_size; ++j) UnshufflePlaneRow(src + j * 8 * row, row, planes.data() + j * n, avx2);
  const std::byte* p = planes.data();
  // The common sizes store whole vectors; the others a piece an element.
  if (elem_size == 2) {
    InterleavePlanes<2, 2>(p, n, dst, 2);
    return;
  }
  if (elem_size == 4) {
    InterleavePlanes<4, 4>(p, n, dst, 4);
    return;
  }
  if (elem_size == 8) {
    InterleavePlanes<8, 8>(p, n, dst, 8);
    return;
  }
  size_t j = 0;
  for (; elem_size - j >= 8; j += 8) InterleavePlanes<8, 0>(p + j * n, n, dst + j, elem_size);
  if (elem_size - j >= 4) {
    InterleavePlanes<4, 0>(p + j * n, n, dst + j, elem_size);
    j += 4;
  }
  if (elem_size - j >= 2) {
    InterleavePlanes<2, 0>(p + j * n, n, dst + j, elem_size);
    j += 2;
  }
  if (j < elem_size) InterleavePlanes<1, 0>(p + j * n, n, dst + j, elem_size);
}
#endif  // __SSE2__

}  // namespace

bool BitunshuffleImplAvailable(BitunshuffleImpl impl) {
  switch (impl) {
    case BitunshuffleImpl::kScalar:
      return true;
    case BitunshuffleImpl::kSse2:
#if defined(__SSE2__)
      return true;
#else
      return false;
#endif
    case BitunshuffleImpl::kAvx2:
#if defined(__SSE2__) && defined(__x86_64__)
      return CpuHasAvx2();
#else
      return false;
#endif
  }
  return false;
}

void BitunshuffleBlockWith(BitunshuffleImpl impl, const std::byte* src, std::byte* dst, size_t n, size_t elem_size) {
  assert(n % 8 == 0 && BitunshuffleImplAvailable(impl));
#if defined(__SSE2__)
  if (impl != BitunshuffleImpl::kScalar && BitunshuffleImplAvailable(impl)) {
    BitunshuffleSimd(src, dst, n, elem_size, impl == BitunshuffleImpl::kAvx2);
    return;
  }
#endif
  BitunshuffleScalar(src, dst, n, elem_size);
}

void BitunshuffleBlock(const std::byte* src, std::byte* dst, size_t n, size_t elem_size) {
  static const BitunshuffleImpl best = BitunshuffleImplAvailable(BitunshuffleImpl::kAvx2)   ? BitunshuffleImpl::kAvx2
                                       : BitunshuffleImplAvailable(BitunshuffleImpl::kSse2) ? BitunshuffleImpl::kSse2
                                                                                            : BitunshuffleImpl::kScalar;
  BitunshuffleBlockWith(best, src, dst, n, elem_size);
}

void BitshuffleBlock(const std::byte* src, std::byte* dst, size_t n, size_t elem_size) {
  const size_t row = n / 8;
  for (size_t j = 0; j < elem_size; ++j) {
    for (size_t g = 0; g < row; ++g) {
      uint64_t x = 0;
      for (size_t i = 0; i < 8; ++i) {
        x |= static_cast<uint64_t>(static_cast<uint8_t>(src[(g * 8 + i) * elem_size + j])) << (8 * i);
      }
      x = Transpose8x8(x);  // the transpose is its own inverse
      for (size_t k = 0; k < 8; ++k) dst[(j * 8 + k) * row + g] = static_cast<std::byte>(x >> (8 * k));
    }
  }
}

Status LzfDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what) {
  if (src.size() > UINT_MAX || dst.size() > UINT_MAX) {
    return Status::Corrupt(what + ": LZF chunk of " + N(src.size()) + " stored / " + N(dst.size()) +
                           " decoded bytes is larger than LZF can address (4 GiB)");
  }
  // liblzf bounds-checks both the input and the output; 0 means an error.
  const unsigned r =
      lzf_decompress(src.data(), static_cast<unsigned>(src.size()), dst.data(), static_cast<unsigned>(dst.size()));
  if (r == 0 && !dst.empty()) {
    return Status::Corrupt(what + ": LZF stream is damaged or decompresses to more than the expected " + N(dst.size()) +
                           " bytes (" + N(src.size()) + " stored bytes)");
  }
  if (r != dst.size()) {
    return Status::Corrupt(what + ": LZF stream decompresses to " + N(r) + " bytes, expected " + N(dst.size()));
  }
  return Status::Ok();
}

Status BloscDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what) {
  // blosc_decompress_ctx takes no source size: the frame's header is checked
  // against the stored bytes first (blosc_cbuffer_validate), and its decoded
  // size against ours.
  size_t nbytes = 0;
  if (src.size() < BLOSC_MIN_HEADER_LENGTH || blosc_cbuffer_validate(src.data(), src.size(), &nbytes) != 0) {
    return Status::Corrupt(what + ": Blosc frame is damaged (its header does not fit the " + N(src.size()) +
                           " stored bytes)");
  }
  if (nbytes != dst.size()) {
    return Status::Corrupt(what + ": Blosc frame holds " + N(nbytes) + " bytes, expected " + N(dst.size()));
  }
  const int r = blosc_decompress_ctx(src.data(), dst.data(), dst.size(), 1);
  if (r < 0 || static_cast<size_t>(r) != dst.size()) {
    return Status::Corrupt(what + ": Blosc frame is damaged (decompression returned " + std::to_string(r) +
                           ", expected " + N(dst.size()) + " bytes)");
  }
  return Status::Ok();
}

namespace {

// One LZ4 block of exactly dst.size() bytes.
Status Lz4Block(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what,
                uint64_t block_index) {
  if (src.size() > INT_MAX || dst.size() > INT_MAX) {
    return Status::Corrupt(what + ": LZ4 block " + N(block_index) + " is larger than 2 GiB");
  }
  const int r = LZ4_decompress_safe(reinterpret_cast<const char*>(src.data()), reinterpret_cast<char*>(dst.data()),
                                    static_cast<int>(src.size()), static_cast<int>(dst.size()));
  if (r < 0 || static_cast<size_t>(r) != dst.size()) {
    return Status::Corrupt(what + ": LZ4 block " + N(block_index) + " is damaged (" + N(src.size()) +
                           " stored bytes do not decompress to " + N(dst.size()) + ")");
  }
  return Status::Ok();
}

}  // namespace

Status Lz4FramedDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what) {
  if (src.size() < 12) {
    return Status::Corrupt(what + ": LZ4 chunk of " + N(src.size()) + " bytes is shorter than its 12-byte header");
  }
  const uint64_t total = ReadBE(src.data(), 8);
  uint64_t block = ReadBE(src.data() + 8, 4);
  if (total != dst.size()) {
    return Status::Corrupt(what + ": LZ4 chunk header says " + N(total) + " decoded bytes, expected " + N(dst.size()));
  }
  if (block == 0 && total > 0) return Status::Corrupt(what + ": LZ4 chunk header has a block size of 0");
  if (block > total) block = total;  // as H5Zlz4.c
  size_t pos = 12;
  uint64_t done = 0;
  for (uint64_t b = 0; done < total; ++b) {
    const uint64_t this_block = std::min(block, total - done);
    if (src.size() - pos < 4) {
      return Status::Corrupt(what + ": LZ4 chunk ends before block " + N(b) + " (" + N(src.size()) + " stored bytes)");
    }
    const uint64_t stored = ReadBE(src.data() + pos, 4);
    pos += 4;
    if (stored > src.size() - pos) {
      return Status::Corrupt(what + ": LZ4 block " + N(b) + " claims " + N(stored) + " stored bytes, only " +
                             N(src.size() - pos) + " remain in the chunk");
    }
    std::span<std::byte> out = dst.subspan(done, this_block);
    if (stored == this_block) {
      CopyBytes(out.data(), src.data() + pos, this_block);  // stored raw
    } else {
      GPUFEED_RETURN_IF_ERROR(Lz4Block(src.subspan(pos, stored), out, what, b));
    }
    pos += stored;
    done += this_block;
  }
  return Status::Ok();
}

Status BitshuffleDecompress(std::span<const std::byte> src, std::span<std::byte> dst, size_t elem_size,
                            uint64_t block_elems, int compression, std::vector<std::byte>& tmp,
                            const std::string& what) {
  if (elem_size == 0 || elem_size > 0xFFFF) {
    return Status::Corrupt(what + ": bitshuffle element size " + N(elem_size) + " is not a type size");
  }
  if (compression != 0 && compression != 2) {
    return Status::Unsupported(what + ": bitshuffle compression " + std::to_string(compression) +
                               " (only none and LZ4 are decoded by the direct path)");
  }
  if (dst.size() % elem_size != 0) {
    return Status::Corrupt(what + ": bitshuffle chunk of " + N(dst.size()) + " bytes is not a whole number of " +
                           N(elem_size) + "-byte elements");
  }
  size_t pos = 0;
  if (compression == 2) {
    if (src.size() < 12) {
      return Status::Corrupt(what + ": bitshuffle chunk of " + N(src.size()) +
                             " bytes is shorter than its 12-byte header");
    }
    const uint64_t total = ReadBE(src.data(), 8);
    const uint64_t block_bytes = ReadBE(src.data() + 8, 4);
    if (total != dst.size()) {
      return Status::Corrupt(what + ": bitshuffle chunk header says " + N(total) + " decoded bytes, expected " +
                             N(dst.size()));
    }
    if (block_bytes % elem_size != 0) {
      return Status::Corrupt(what + ": bitshuffle block of " + N(block_bytes) + " bytes is not a whole number of " +
                             N(elem_size) + "-byte elements");
    }
    block_elems = block_bytes / elem_size;
    pos = 12;
  } else {
    if (src.size() != dst.size()) {
      return Status::Corrupt(what + ": bitshuffled chunk holds " + N(src.size()) + " bytes, expected " + N(dst.size()));
    }
    if (block_elems == 0) block_elems = BitshuffleDefaultBlock(elem_size);
  }
  if (block_elems == 0 || block_elems % 8 != 0) {
    return Status::Corrupt(what + ": bitshuffle block of " + N(block_elems) +
                           " elements is not a positive multiple of 8");
  }
  const uint64_t n = dst.size() / elem_size;
  const uint64_t block_bytes = block_elems * elem_size;  // <= 2^32 * 2^16: no overflow
  if (compression == 2 && tmp.size() < std::min<uint64_t>(block_bytes, dst.size())) {
    tmp.resize(std::min<uint64_t>(block_bytes, dst.size()));
  }
  uint64_t e = 0;
  for (uint64_t b = 0;; ++b) {
    uint64_t count = std::min(block_elems, n - e);
    count -= count % 8;  // the last < 8 elements are stored as they are
    if (count == 0) break;
    const uint64_t bytes = count * elem_size;
    std::byte* out = dst.data() + e * elem_size;
    if (compression == 2) {
      if (src.size() - pos < 4) {
        return Status::Corrupt(what + ": bitshuffle chunk ends before block " + N(b) + " (" + N(src.size()) +
                               " stored bytes)");
      }
      const uint64_t stored = ReadBE(src.data() + pos, 4);
      pos += 4;
      if (stored > src.size() - pos) {
        return Status::Corrupt(what + ": bitshuffle block " + N(b) + " claims " + N(stored) + " stored bytes, only " +
                               N(src.size() - pos) + " remain in the chunk");
      }
      GPUFEED_RETURN_IF_ERROR(Lz4Block(src.subspan(pos, stored), std::span(tmp.data(), bytes), what, b));
      BitunshuffleBlock(tmp.data(), out, count, elem_size);
      pos += stored;
    } else {
      // The transposes read a block as 8 streams a row (count / 8 bytes)
      // apart. From memory, the hardware prefetchers follow long rows poorly
      // (64 MiB in 8 KiB blocks on a Zen 5: 2.6 GB/s for 2-byte elements,
      // 2.8 for 1-byte; 6.7 and 11 with this), so the next block is asked
      // for while this one is transposed. Shorter rows stream well as they
      // are (prefetching slowed 4- and 8-byte elements), and the LZ4 path
      // reads its block from the cache.
      if (count / 8 >= 512) Prefetch(src.data() + pos + bytes, std::min<uint64_t>(bytes, src.size() - pos - bytes));
      BitunshuffleBlock(src.data() + pos, out, count, elem_size);
      pos += bytes;
    }
    e += count;
  }
  const uint64_t left = (n - e) * elem_size;
  if (src.size() - pos < left) {
    return Status::Corrupt(what + ": bitshuffle chunk ends inside its last " + N(n - e) + " unshuffled elements");
  }
  CopyBytes(dst.data() + e * elem_size, src.data() + pos, left);
  return Status::Ok();
}

}  // namespace gpufeed::codec
