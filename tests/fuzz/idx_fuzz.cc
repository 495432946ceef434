// Fuzz target: the IDX parser behind `gpufeed convert x-idx3-ubyte[.gz]` (a file from
// anywhere), plain or gzip'd. The input is the file; it is opened as the
// images and, in odd modes of its last byte, also as its own labels. A plain
// file's source must never promise more bytes than the file holds, and
// reading its first and last sample must stay in bounds.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpufeed/convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gpufeed::fuzz::MemFile file;
  file.Set(data, size);
  const std::string path = file.Path();
  const bool with_labels = size > 0 && (data[size - 1] & 1);
  auto src = gpufeed::OpenIdxSource(path, with_labels ? path : "");
  if (!src.ok()) return 0;
  const gpufeed::SampleSource& s = **src;
  uint64_t sample_bytes = gpufeed::DTypeSize(s.dtype()), total = 0;
  for (uint64_t d : s.sample_shape()) GPUFEED_FUZZ_CHECK(!__builtin_mul_overflow(sample_bytes, d, &sample_bytes));
  GPUFEED_FUZZ_CHECK(!__builtin_mul_overflow(sample_bytes, s.num_samples(), &total));
  const bool gzipped = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  GPUFEED_FUZZ_CHECK(gzipped || total <= size);
  if (with_labels) GPUFEED_FUZZ_CHECK(s.labels().size() == s.num_samples());
  // A source of 0 samples may declare any sample size (nothing backs it).
  std::vector<std::byte> one(s.num_samples() > 0 ? sample_bytes : 0);
  if (s.num_samples() > 0) {
    GPUFEED_FUZZ_CHECK(s.Read(0, 1, one).ok());
    GPUFEED_FUZZ_CHECK(s.Read(s.num_samples() - 1, 1, one).ok());
  }
  GPUFEED_FUZZ_CHECK(!s.Read(s.num_samples(), 1, one).ok());
  return 0;
}
