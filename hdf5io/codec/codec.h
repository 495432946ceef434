// Chunk codecs: the HDF5 filters gpufeed runs in its own threads (shuffle,
// deflate through libdeflate, zstd), in both directions, and the decoders of
// the plugin filters scientific files use (LZF, Blosc, LZ4, Bitshuffle). Byte-compatible with
// HDF5's built-in shuffle/deflate filters and with the zstd filter 32015 of
// hdf5plugin (one zstd frame per chunk).
//
// Thread safety: every function may be called from any thread; each thread
// keeps its own (de)compressor state.
#ifndef GPUFEED_CODEC_CODEC_H_
#define GPUFEED_CODEC_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed::codec {

inline constexpr int kFilterDeflate = 1;   // H5Z_FILTER_DEFLATE
inline constexpr int kFilterShuffle = 2;   // H5Z_FILTER_SHUFFLE
inline constexpr int kFilterZstd = 32015;  // registered zstd filter id
// Registered plugin filters the direct path decodes (hdf5io/codec/codec_plugins.cc).
inline constexpr int kFilterLzf = 32000;         // h5py's LZF
inline constexpr int kFilterBlosc = 32001;       // Blosc (its own header and shuffle)
inline constexpr int kFilterLz4 = 32004;         // HDF5's LZ4 plugin framing
inline constexpr int kFilterBitshuffle = 32008;  // bitshuffle, alone or with LZ4

// Whether DecodeChunk undoes filter `id`.
bool DirectPathDecodes(int id);

// Byte-plane transpose as HDF5's shuffle filter does it: byte j of element e
// goes to dst[j * n + e]. Trailing bytes that do not fill an element are
// copied as is. elem_size 1 is a plain copy.
void Shuffle(std::span<const std::byte> src, std::span<std::byte> dst, size_t elem_size);
// Inverse of Shuffle over src.size() bytes, writing only the first dst.size()
// bytes of the result (dst.size() <= src.size()), so a partial last chunk can
// be unshuffled straight into the caller's buffer.
void Unshuffle(std::span<const std::byte> src, std::span<std::byte> dst, size_t elem_size);

// zlib-format streams, as HDF5's deflate filter writes them.
size_t DeflateBound(size_t n);
// Returns the compressed size, or 0 if it did not fit in dst.
size_t Deflate(std::span<const std::byte> src, std::span<std::byte> dst, int level);
// Decompresses into dst and requires exactly dst.size() bytes to result.
// `what` names the chunk for the error message.
Status Inflate(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what);

size_t ZstdBound(size_t n);
size_t ZstdCompress(std::span<const std::byte> src, std::span<std::byte> dst, int level);
Status ZstdDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what);

// The plugin filters' decoders. Sizes in the streams are checked against the
// stored bytes and dst.size(), which is the exact decoded size.
Status LzfDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what);
Status BloscDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what);
Status Lz4FramedDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what);
// `tmp` is scratch for one LZ4 block.
Status BitshuffleDecompress(std::span<const std::byte> src, std::span<std::byte> dst, size_t elem_size,
                            uint64_t block_elems, int compression, std::vector<std::byte>& tmp,
                            const std::string& what);
// Bitshuffle's transform of one block of n elements (n a multiple of 8).
void BitshuffleBlock(const std::byte* src, std::byte* dst, size_t n, size_t elem_size);
// Its inverse, by the fastest implementation this build and CPU run: AVX2
// where the CPU has it (asked once, at the first call), else SSE2 on x86,
// else the scalar loop.
void BitunshuffleBlock(const std::byte* src, std::byte* dst, size_t n, size_t elem_size);
// The implementations BitunshuffleBlock chooses from, for the tests and
// benchmarks that compare them. All write the same bytes: the scalar loop is
// the twin the vector paths are tested against. kAvx2 does 32 columns of 8
// elements a step, then SSE2's 16, then the scalar loop's one.
enum class BitunshuffleImpl { kScalar, kSse2, kAvx2 };
// Whether this build and CPU run `impl` (kScalar: always; kSse2: x86 builds;
// kAvx2: x86-64 CPUs with AVX2).
bool BitunshuffleImplAvailable(BitunshuffleImpl impl);
// BitunshuffleBlock by `impl`, which must be available (asserted; where
// assertions are off, an unavailable one runs the scalar loop).
void BitunshuffleBlockWith(BitunshuffleImpl impl, const std::byte* src, std::byte* dst, size_t n, size_t elem_size);

// One filter of a dataset's pipeline, as the direct path runs it.
struct FilterStep {
  int id = 0;            // one DirectPathDecodes accepts
  size_t elem_size = 1;  // for shuffle and bitshuffle (bitshuffle: cd_values[2])
  uint64_t block = 0;    // bitshuffle: elements per block (cd_values[3]; 0: the default)
  int compression = 0;   // bitshuffle: cd_values[4] (0 none, 2 LZ4)
};

// Whether DecodeChunk can undo `pipeline`: every filter but the last (in
// write order) must keep the size (shuffle), because the decoder sizes each
// intermediate as the decoded chunk. HDF5 allows any order ([deflate, zstd],
// or a shuffle after a compressor); those chunks are read through HDF5.
bool DirectPathCanDecode(const std::vector<FilterStep>& pipeline);

// Per-thread scratch for DecodeChunk; grows to the largest chunk seen.
struct DecodeScratch {
  std::vector<std::byte> a, b;
  std::vector<std::byte> block;  // one LZ4 block of bitshuffle
};

// Undoes `pipeline` (in write order; filters whose bit is set in
// `filter_mask` were skipped when the chunk was written) on `stored`, which
// must decode to exactly `decoded_size` bytes, and writes the first
// dst.size() (<= decoded_size) of them into dst. A pipeline that
// DirectPathCanDecode refuses is Unsupported.
Status DecodeChunk(const std::vector<FilterStep>& pipeline, unsigned filter_mask, std::span<const std::byte> stored,
                   size_t decoded_size, std::span<std::byte> dst, DecodeScratch& scratch, const std::string& what);

// Applies `pipeline` to a full chunk. Returns the stored bytes in `out`
// (resized). A compressor whose output would not be smaller than its input
// fails, as HDF5's do, and the filter is recorded as skipped in *filter_mask.
void EncodeChunk(const std::vector<FilterStep>& pipeline, int level, std::span<const std::byte> raw,
                 std::vector<std::byte>& out, unsigned* filter_mask, DecodeScratch& scratch);

}  // namespace gpufeed::codec

#endif  // GPUFEED_CODEC_CODEC_H_
