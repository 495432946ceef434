// Shuffle, deflate (libdeflate) and zstd, and the filter pipelines built from
// them. This is the hot path of decoding: no HDF5 call, no lock.
#include "hdf5io/codec/codec.h"

#include <libdeflate.h>
#include <zstd.h>

#include <cstring>
#include <map>
#include <cassert>
#include <memory>

#include "common/sizes.h"

namespace gpufeed::codec {

void Shuffle(std::span<const std::byte> src, std::span<std::byte> dst, size_t elem_size) {
  const size_t n = elem_size == 0 ? 0 : src.size() / elem_size;
  if (elem_size <= 1 || n <= 1) {
    CopyBytes(dst.data(), src.data(), src.size());
    return;
  }
  for (size_t j = 0; j < elem_size; ++j) {
    std::byte* plane = dst.data() + j * n;
    const std::byte* s = src.data() + j;
    for (size_t e = 0; e < n; ++e) plane[e] = s[e * elem_size];
  }
  const size_t tail = src.size() - n * elem_size;
  CopyBytes(dst.data() + n * elem_size, src.data() + n * elem_size, tail);
}

void Unshuffle(std::span<const std::byte> src, std::span<std::byte> dst, size_t elem_size) {
  assert(dst.size() <= src.size());
  // An empty prefix writes nothing; below, dst.data() (null for an empty
  // span) + j would be undefined behaviour (found by the codec fuzzer).
  if (dst.empty()) return;
  const size_t n = elem_size == 0 ? 0 : src.size() / elem_size;
  if (elem_size <= 1 || n <= 1) {
    CopyBytes(dst.data(), src.data(), std::min(dst.size(), src.size()));
    return;
  }
  const size_t want = dst.size();
  const size_t full = std::min(n, want / elem_size);
  for (size_t j = 0; j < elem_size; ++j) {
    const std::byte* plane = src.data() + j * n;
    std::byte* d = dst.data() + j;
    for (size_t e = 0; e < full; ++e) d[e * elem_size] = plane[e];
  }
  // A requested prefix that ends mid-element, or the unshuffled tail.
  for (size_t k = full * elem_size; k < want; ++k) {
    const size_t e = k / elem_size, j = k % elem_size;
    dst[k] = e < n ? src[j * n + e] : src[k];
  }
}

namespace {

struct DeflateDecompressorDeleter {
  void operator()(libdeflate_decompressor* d) const { libdeflate_free_decompressor(d); }
};
struct DeflateCompressorDeleter {
  void operator()(libdeflate_compressor* c) const { libdeflate_free_compressor(c); }
};
struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

libdeflate_decompressor* ThreadDecompressor() {
  thread_local std::unique_ptr<libdeflate_decompressor, DeflateDecompressorDeleter> d(libdeflate_alloc_decompressor());
  return d.get();
}

libdeflate_compressor* ThreadCompressor(int level) {
  thread_local std::map<int, std::unique_ptr<libdeflate_compressor, DeflateCompressorDeleter>> by_level;
  auto& c = by_level[level];
  if (!c) c.reset(libdeflate_alloc_compressor(level));
  return c.get();
}

}  // namespace

size_t DeflateBound(size_t n) { return libdeflate_zlib_compress_bound(nullptr, n); }

size_t Deflate(std::span<const std::byte> src, std::span<std::byte> dst, int level) {
  return libdeflate_zlib_compress(ThreadCompressor(level), src.data(), src.size(), dst.data(), dst.size());
}

Status Inflate(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what) {
  size_t actual = 0;
  libdeflate_result r =
      libdeflate_zlib_decompress(ThreadDecompressor(), src.data(), src.size(), dst.data(), dst.size(), &actual);
  switch (r) {
    case LIBDEFLATE_SUCCESS:
      if (actual == dst.size()) return Status::Ok();
      [[fallthrough]];
    case LIBDEFLATE_SHORT_OUTPUT:
      return Status::Corrupt(what + ": deflate stream decompresses to fewer than the expected " +
                             std::to_string(dst.size()) + " bytes");
    case LIBDEFLATE_INSUFFICIENT_SPACE:
      return Status::Corrupt(what + ": deflate stream decompresses to more than the expected " +
                             std::to_string(dst.size()) + " bytes");
    case LIBDEFLATE_BAD_DATA:
    default:
      return Status::Corrupt(what + ": deflate stream is damaged (bad data or checksum, " + std::to_string(src.size()) +
                             " stored bytes)");
  }
}

size_t ZstdBound(size_t n) { return ZSTD_compressBound(n); }

size_t ZstdCompress(std::span<const std::byte> src, std::span<std::byte> dst, int level) {
  thread_local std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter> cctx(ZSTD_createCCtx());
  // Frames carry their content checksum (XXH64), so a damaged chunk fails to
  // decode instead of decoding to wrong bytes; any zstd decoder verifies it.
  ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
  size_t r = ZSTD_compress2(cctx.get(), dst.data(), dst.size(), src.data(), src.size());
  return ZSTD_isError(r) ? 0 : r;
}

Status ZstdDecompress(std::span<const std::byte> src, std::span<std::byte> dst, const std::string& what) {
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> dctx(ZSTD_createDCtx());
  size_t r = ZSTD_decompressDCtx(dctx.get(), dst.data(), dst.size(), src.data(), src.size());
  if (ZSTD_isError(r)) {
    return Status::Corrupt(what + ": zstd frame is damaged (" + ZSTD_getErrorName(r) + ", " +
                           std::to_string(src.size()) + " stored bytes)");
  }
  if (r != dst.size()) {
    return Status::Corrupt(what + ": zstd frame decompresses to " + std::to_string(r) + " bytes, expected " +
                           std::to_string(dst.size()));
  }
  return Status::Ok();
}

bool DirectPathDecodes(int id) {
  switch (id) {
    case kFilterDeflate:
    case kFilterShuffle:
    case kFilterZstd:
    case kFilterLzf:
    case kFilterBlosc:
    case kFilterLz4:
    case kFilterBitshuffle:
      return true;
    default:
      return false;
  }
}

bool DirectPathCanDecode(const std::vector<FilterStep>& pipeline) {
  for (size_t k = 0; k + 1 < pipeline.size(); ++k) {
    if (pipeline[k].id != kFilterShuffle) return false;
  }
  return true;
}

Status DecodeChunk(const std::vector<FilterStep>& pipeline, unsigned filter_mask, std::span<const std::byte> stored,
                   size_t decoded_size, std::span<std::byte> dst, DecodeScratch& scratch, const std::string& what) {
  // Found by the codec fuzzer: a filter after a compressor got the decoded
  // size for its input and failed every valid chunk as "Corrupt".
  if (!DirectPathCanDecode(pipeline)) {
    return Status::Unsupported(what + ": a filter follows a compressor in this pipeline; read it through HDF5");
  }
  // Index of the last filter to undo (the first in write order not skipped).
  int last_active = -1;
  for (int k = 0; k < static_cast<int>(pipeline.size()); ++k) {
    if (!(filter_mask & (1u << k))) {
      last_active = k;
      break;
    }
  }
  std::span<const std::byte> cur = stored;
  bool use_a = true;
  for (int k = static_cast<int>(pipeline.size()) - 1; k >= 0; --k) {
    if (filter_mask & (1u << k)) continue;
    const FilterStep& f = pipeline[k];
    // The final step writes straight into dst when dst holds the whole chunk.
    const bool direct = (k == last_active) && dst.size() == decoded_size;
    std::vector<std::byte>& buf = use_a ? scratch.a : scratch.b;
    if (!direct && buf.size() < decoded_size) buf.resize(decoded_size);
    std::span<std::byte> out = direct ? dst : std::span<std::byte>(buf.data(), decoded_size);
    if (f.id == kFilterShuffle) {
      if (cur.size() != decoded_size) {
        return Status::Corrupt(what + ": shuffled chunk holds " + std::to_string(cur.size()) + " bytes, expected " +
                               std::to_string(decoded_size));
      }
      if (k == last_active) {
        Unshuffle(cur, dst, f.elem_size);  // only the prefix the caller wants
        return Status::Ok();
      }
      Unshuffle(cur, out, f.elem_size);
    } else if (f.id == kFilterDeflate) {
      GPUFEED_RETURN_IF_ERROR(Inflate(cur, out, what));
    } else if (f.id == kFilterZstd) {
      GPUFEED_RETURN_IF_ERROR(ZstdDecompress(cur, out, what));
    } else if (f.id == kFilterLzf) {
      GPUFEED_RETURN_IF_ERROR(LzfDecompress(cur, out, what));
    } else if (f.id == kFilterBlosc) {
      GPUFEED_RETURN_IF_ERROR(BloscDecompress(cur, out, what));
    } else if (f.id == kFilterLz4) {
      GPUFEED_RETURN_IF_ERROR(Lz4FramedDecompress(cur, out, what));
    } else if (f.id == kFilterBitshuffle) {
      GPUFEED_RETURN_IF_ERROR(BitshuffleDecompress(cur, out, f.elem_size, f.block, f.compression, scratch.block, what));
    } else {
      return Status::Unsupported(what + ": filter " + std::to_string(f.id) + " is not supported by the direct path");
    }
    if (direct) return Status::Ok();
    cur = out;
    use_a = !use_a;
  }
  if (cur.size() != decoded_size) {
    return Status::Corrupt(what + ": chunk holds " + std::to_string(cur.size()) + " stored bytes, expected " +
                           std::to_string(decoded_size));
  }
  CopyBytes(dst.data(), cur.data(), dst.size());
  return Status::Ok();
}

void EncodeChunk(const std::vector<FilterStep>& pipeline, int level, std::span<const std::byte> raw,
                 std::vector<std::byte>& out, unsigned* filter_mask, DecodeScratch& scratch) {
  *filter_mask = 0;
  std::vector<std::byte> cur_storage;
  std::span<const std::byte> cur = raw;
  bool use_a = true;
  for (size_t k = 0; k < pipeline.size(); ++k) {
    const FilterStep& f = pipeline[k];
    std::vector<std::byte>& buf = use_a ? scratch.a : scratch.b;
    size_t n = 0;
    if (f.id == kFilterShuffle) {
      buf.resize(cur.size());
      Shuffle(cur, buf, f.elem_size);
      n = cur.size();
    } else if (f.id == kFilterDeflate) {
      buf.resize(DeflateBound(cur.size()));
      n = Deflate(cur, buf, level);
      if (n >= cur.size()) n = 0;
    } else if (f.id == kFilterZstd) {
      buf.resize(ZstdBound(cur.size()));
      n = ZstdCompress(cur, buf, level);
      if (n >= cur.size()) n = 0;
    }
    if (n == 0) {  // incompressible: skip this filter, as HDF5 does for optional ones
      *filter_mask |= 1u << k;
      continue;
    }
    cur = std::span<const std::byte>(buf.data(), n);
    use_a = !use_a;
  }
  out.assign(cur.begin(), cur.end());
}

}  // namespace gpufeed::codec
