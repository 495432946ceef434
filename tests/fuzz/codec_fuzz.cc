// Fuzz target: the chunk decoders of the direct read path (hdf5io/codec/codec.h),
// which undo shuffle, deflate, zstd and the plugin filters (LZF, Blosc, LZ4,
// Bitshuffle alone or with LZ4) on bytes read from a file. The first bytes
// choose a pipeline (up to 3 filters with their element sizes), the
// filter mask, the decoded size and how much of it the caller wants; the rest
// is the stored chunk. Odd modes instead encode the rest with that pipeline
// and require DecodeChunk to give back exactly the raw bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "hdf5io/codec/codec.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpufeed::codec;
  gpufeed::fuzz::Input in(data, size);
  const uint8_t mode = in.U8();
  const int nfilters = mode % 4;
  std::vector<FilterStep> pipeline;
  for (int k = 0; k < nfilters; ++k) {
    const uint8_t f = in.U8();
    static constexpr int kIds[] = {kFilterShuffle, kFilterDeflate, kFilterZstd, 4 /* szip: unsupported */,
                                   kFilterLzf,     kFilterBlosc,   kFilterLz4,  kFilterBitshuffle};
    FilterStep step{kIds[f % 8], size_t{1} + (f >> 4)};  // element sizes 1..16
    // Bitshuffle: LZ4 or none, default or a small block (8 or 16 elements).
    step.compression = (f & 8) ? 2 : 0;
    step.block = (f & 0x40) ? 8u << ((f >> 7) & 1) : 0;
    pipeline.push_back(step);
  }
  const unsigned mask = in.U8() & 7u;
  const size_t decoded_size = in.U16();
  const size_t want = in.U16();
  const std::span<const std::byte> rest = in.Rest();
  thread_local DecodeScratch scratch;

  if (mode & 0x80) {  // round trip: encode `rest`, decode it, compare
    std::vector<std::byte> stored;
    unsigned written_mask = 0;
    EncodeChunk(pipeline, 1 + mode % 9, rest, stored, &written_mask, scratch);
    bool supported = DirectPathCanDecode(pipeline);
    for (const FilterStep& f : pipeline) supported = supported && f.id != 4;
    std::vector<std::byte> back(rest.size());
    gpufeed::Status s = DecodeChunk(pipeline, written_mask, stored, rest.size(), back, scratch, "fuzz");
    if (supported) {
      GPUFEED_FUZZ_CHECK(s.ok());
      GPUFEED_FUZZ_CHECK(back == std::vector<std::byte>(rest.begin(), rest.end()));
    }
    // A prefix of the chunk, as for a partial last chunk, is the raw prefix.
    if (supported && !rest.empty()) {
      std::vector<std::byte> prefix(want % rest.size());
      GPUFEED_FUZZ_CHECK(DecodeChunk(pipeline, written_mask, stored, rest.size(), prefix, scratch, "fuzz").ok());
      GPUFEED_FUZZ_CHECK(std::equal(prefix.begin(), prefix.end(), rest.begin()));
    }
    return 0;
  }
  // Hostile stored bytes: any result but a crash, an over-read or a hang.
  std::vector<std::byte> dst(decoded_size == 0 ? 0 : want % (decoded_size + 1));
  (void)DecodeChunk(pipeline, mask, rest, decoded_size, dst, scratch, "fuzz");
  // Unshuffle on its own: a prefix of any length of a shuffled buffer.
  if (!pipeline.empty()) {
    std::vector<std::byte> out(rest.empty() ? 0 : want % (rest.size() + 1));
    Unshuffle(rest, out, pipeline[0].elem_size);
  }
  return 0;
}
