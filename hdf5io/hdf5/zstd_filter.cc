// The zstd HDF5 filter callback. Buffers are malloc/free'd, as HDF5's own
// filters and hdf5plugin's do, since HDF5 frees what a filter returns.
#include "hdf5io/hdf5/zstd_filter.h"

#include <zstd.h>

#include <cstdlib>

namespace gpufeed::h5 {
namespace {

size_t ZstdFilter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes, size_t* buf_size,
                  void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
    if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN) return 0;
    void* out = std::malloc(n ? n : 1);
    if (out == nullptr) return 0;
    size_t r = ZSTD_decompress(out, n, *buf, nbytes);
    if (ZSTD_isError(r) || r != n) {
      std::free(out);
      return 0;
    }
    std::free(*buf);
    *buf = out;
    *buf_size = n;
    return r;
  }
  int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : 3;
  size_t cap = ZSTD_compressBound(nbytes);
  void* out = std::malloc(cap);
  if (out == nullptr) return 0;
  // With a content checksum, as gpufeed's own encoder writes (codec.cc).
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  if (cctx == nullptr) {
    std::free(out);
    return 0;
  }
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  size_t r = ZSTD_compress2(cctx, out, cap, *buf, nbytes);
  ZSTD_freeCCtx(cctx);
  if (ZSTD_isError(r)) {
    std::free(out);
    return 0;
  }
  std::free(*buf);
  *buf = out;
  *buf_size = cap;
  return r;
}

}  // namespace

const H5Z_class2_t kZstdFilterClass = {
    H5Z_CLASS_T_VERS, kZstdFilterId, 1, 1, "zstd", nullptr, nullptr, ZstdFilter,
};

}  // namespace gpufeed::h5
