// Codec round trips and damage detection.
#include "hdf5io/codec/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "tests/testing/test_data.h"

namespace gpufeed::codec {
namespace {

using gpufeed::testing::IndexSamples;

TEST(CodecTest, ShuffleRoundTripsForEveryElementSizeAndPrefix) {
  for (size_t elem : {1, 2, 4, 8}) {
    std::vector<std::byte> raw = IndexSamples(13, 24);
    raw.resize(raw.size() + 3);  // bytes that do not fill an element stay in place
    std::vector<std::byte> shuffled(raw.size());
    Shuffle(raw, shuffled, elem);
    if (elem > 1) {
      EXPECT_NE(shuffled, raw);
    }
    for (size_t prefix : {raw.size(), raw.size() - 3, size_t{17}, size_t{0}}) {
      std::vector<std::byte> back(prefix);
      Unshuffle(shuffled, back, elem);
      EXPECT_TRUE(std::equal(back.begin(), back.end(), raw.begin())) << "elem " << elem << " prefix " << prefix;
    }
  }
}

// A caller that wants none of a shuffled chunk (an empty dst, whose data() is
// null) gets nothing written and no undefined pointer arithmetic (the UBSan
// pass checks; found by the codec fuzzer).
TEST(CodecTest, UnshuffleIntoAnEmptyPrefix) {
  const std::vector<std::byte> shuffled = IndexSamples(4, 16);
  std::span<std::byte> none;
  Unshuffle(shuffled, none, 4);
  std::vector<std::byte> out;
  DecodeScratch scratch;
  EXPECT_TRUE(DecodeChunk({{kFilterShuffle, 4}}, 0, shuffled, shuffled.size(), out, scratch, "t").ok());
}

// HDF5 allows a filter after a compressor; the direct path sizes every
// intermediate as the decoded chunk, so it declines such pipelines (the
// dataset reads them through HDF5) instead of failing each chunk as Corrupt
// (found by the codec fuzzer).
TEST(CodecTest, FilterAfterACompressorIsLeftToHdf5) {
  const std::vector<FilterStep> after = {{kFilterShuffle, 4}, {kFilterDeflate, 1}, {kFilterShuffle, 4}};
  const std::vector<FilterStep> two = {{kFilterDeflate, 1}, {kFilterZstd, 1}};
  EXPECT_FALSE(DirectPathCanDecode(after));
  EXPECT_FALSE(DirectPathCanDecode(two));
  EXPECT_TRUE(DirectPathCanDecode({{kFilterShuffle, 4}, {kFilterZstd, 1}}));
  const std::vector<std::byte> raw = IndexSamples(8, 64);
  std::vector<std::byte> stored, back(raw.size());
  unsigned mask = 0;
  DecodeScratch scratch;
  EncodeChunk(two, 3, raw, stored, &mask, scratch);
  EXPECT_EQ(DecodeChunk(two, mask, stored, raw.size(), back, scratch, "t").code(), StatusCode::kUnsupported);
}

TEST(CodecTest, DeflateAndZstdRoundTrip) {
  const std::vector<std::byte> raw = IndexSamples(50, 1000);
  std::vector<std::byte> packed(std::max(DeflateBound(raw.size()), ZstdBound(raw.size())));
  std::vector<std::byte> out(raw.size());

  size_t n = Deflate(raw, packed, 4);
  ASSERT_GT(n, 0u);
  ASSERT_TRUE(Inflate(std::span(packed.data(), n), out, "t").ok());
  EXPECT_EQ(out, raw);

  n = ZstdCompress(raw, packed, 3);
  ASSERT_GT(n, 0u);
  std::fill(out.begin(), out.end(), std::byte{0});
  ASSERT_TRUE(ZstdDecompress(std::span(packed.data(), n), out, "t").ok());
  EXPECT_EQ(out, raw);
}

TEST(CodecTest, DamagedOrWrongSizeStreamsAreCorrupt) {
  const std::vector<std::byte> raw = IndexSamples(20, 500);
  std::vector<std::byte> packed(DeflateBound(raw.size()));
  size_t n = Deflate(raw, packed, 6);
  std::vector<std::byte> out(raw.size());

  std::vector<std::byte> bad(packed.begin(), packed.begin() + n);
  bad[n / 2] ^= std::byte{0x5a};
  Status s = Inflate(bad, out, "file.h5:/images chunk 3");
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("chunk 3"), std::string::npos) << s.message();

  std::vector<std::byte> bigger(raw.size() + 1);
  EXPECT_EQ(Inflate(std::span(packed.data(), n), bigger, "c").code(), StatusCode::kCorrupt);
  std::vector<std::byte> smaller(raw.size() - 1);
  EXPECT_EQ(Inflate(std::span(packed.data(), n), smaller, "c").code(), StatusCode::kCorrupt);

  n = ZstdCompress(raw, packed, 3);
  EXPECT_EQ(ZstdDecompress(std::span(packed.data(), n - 7), out, "c").code(), StatusCode::kCorrupt);
  EXPECT_EQ(ZstdDecompress(std::span(packed.data(), n), bigger, "c").code(), StatusCode::kCorrupt);
}

TEST(CodecTest, PipelinesRoundTripWithSkippedFilters) {
  const std::vector<std::byte> raw = IndexSamples(64, 96);
  const std::vector<std::vector<FilterStep>> pipelines = {
      {},
      {{kFilterDeflate, 1}},
      {{kFilterShuffle, 4}, {kFilterDeflate, 1}},
      {{kFilterZstd, 1}},
      {{kFilterShuffle, 2}, {kFilterZstd, 1}},
  };
  DecodeScratch scratch;
  for (const auto& p : pipelines) {
    std::vector<std::byte> enc;
    unsigned mask = 0;
    EncodeChunk(p, 3, raw, enc, &mask, scratch);
    for (size_t prefix : {raw.size(), raw.size() / 3}) {
      std::vector<std::byte> out(prefix);
      ASSERT_TRUE(DecodeChunk(p, mask, enc, raw.size(), out, scratch, "c").ok());
      EXPECT_TRUE(std::equal(out.begin(), out.end(), raw.begin())) << p.size() << " filters, prefix " << prefix;
    }
  }
  // Incompressible input: the compressor is skipped and recorded in the mask.
  std::vector<std::byte> noise(4096);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = std::byte{gpufeed::testing::IndexByte(i, i * 7)};
  std::vector<std::byte> enc;
  unsigned mask = 0;
  EncodeChunk({{kFilterZstd, 1}}, 3, noise, enc, &mask, scratch);
  EXPECT_EQ(mask, 1u);
  std::vector<std::byte> out(noise.size());
  ASSERT_TRUE(DecodeChunk({{kFilterZstd, 1}}, mask, enc, noise.size(), out, scratch, "c").ok());
  EXPECT_EQ(out, noise);
}

}  // namespace
}  // namespace gpufeed::codec

namespace gpufeed {
namespace {

// Bitshuffle's transform: bit k of byte j of element e lands in bit e % 8 of
// byte e / 8 of plane 8j + k (bitshuffle.c's layout), and unshuffling undoes it.
TEST(CodecTest, BitshuffleTransformLayoutAndInverse) {
  std::vector<std::byte> in(8, std::byte{0}), out(8);
  in[7] = std::byte{0x01};  // element 7, bit 0 -> plane 0, bit 7
  in[0] = std::byte{0x80};  // element 0, bit 7 -> plane 7, bit 0
  codec::BitshuffleBlock(in.data(), out.data(), 8, 1);
  EXPECT_EQ(out[0], std::byte{0x80});
  EXPECT_EQ(out[7], std::byte{0x01});
  for (int k = 1; k < 7; ++k) EXPECT_EQ(out[k], std::byte{0});
  for (size_t elem : {1, 2, 3, 4, 8}) {
    const size_t n = 64;
    std::vector<std::byte> raw(n * elem), sh(n * elem), back(n * elem);
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::byte>(i * 37 + elem);
    codec::BitshuffleBlock(raw.data(), sh.data(), n, elem);
    codec::BitunshuffleBlock(sh.data(), back.data(), n, elem);
    EXPECT_EQ(back, raw) << "elem_size " << elem;
  }
}

// The unshuffle this CPU runs against its scalar twin: every element size the
// direct path meets and block lengths with and without a remainder of columns
// (128 elements an SSE2 step, 256 an AVX2 one), values that encode their own
// index. BitunshuffleImplTest below runs each vector path alone.
TEST(CodecTest, BitunshuffleSimdEqualsItsScalarTwin) {
  for (size_t elem : {1, 2, 3, 4, 8, 16}) {
    // 128: SSE2 alone; 384: AVX2 and SSE2 (where the CPU has AVX2); 8200 a
    // scalar tail.
    for (size_t n : {8, 120, 128, 136, 384, 1024, 8192, 8200}) {
      std::vector<std::byte> raw(n * elem), sh(n * elem), simd(n * elem), scalar(n * elem);
      for (size_t i = 0; i < raw.size(); ++i)
        raw[i] = static_cast<std::byte>(gpufeed::testing::IndexByte(i / elem, i % elem));
      codec::BitshuffleBlock(raw.data(), sh.data(), n, elem);
      codec::BitunshuffleBlock(sh.data(), simd.data(), n, elem);
      codec::BitunshuffleBlockWith(codec::BitunshuffleImpl::kScalar, sh.data(), scalar.data(), n, elem);
      EXPECT_EQ(simd, scalar) << "elem_size " << elem << ", " << n << " elements";
      EXPECT_EQ(simd, raw) << "elem_size " << elem << ", " << n << " elements";
    }
  }
}

// The index of the first byte where a and b differ, or -1 where they are equal
// (a failure names the byte instead of printing both buffers).
int64_t FirstDifference(const std::byte* a, const std::byte* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

const char* ImplName(codec::BitunshuffleImpl impl) {
  switch (impl) {
    case codec::BitunshuffleImpl::kScalar:
      return "Scalar";
    case codec::BitunshuffleImpl::kSse2:
      return "Sse2";
    case codec::BitunshuffleImpl::kAvx2:
      return "Avx2";
  }
  return "?";
}

}  // namespace

namespace codec {
// Names the implementation in gtest's messages (found by argument-dependent lookup).
void PrintTo(BitunshuffleImpl impl, std::ostream* os) { *os << ImplName(impl); }
}  // namespace codec

namespace {

// Each vector unshuffle alone against the scalar twin, byte for byte: element
// sizes 1-17 and larger odd and even ones; every block length (a multiple of 8
// elements) up to 520, so every remainder of columns after AVX2's 32 and
// SSE2's 16 a step, and default-sized blocks; values that encode their own
// index (element e holds e in its first bytes, a hash of (e, byte) in the
// rest) and random bytes, at an odd address. The bytes after the block stay
// untouched.
class BitunshuffleImplTest : public ::testing::TestWithParam<codec::BitunshuffleImpl> {};

TEST_P(BitunshuffleImplTest, EqualsTheScalarTwin) {
  const codec::BitunshuffleImpl impl = GetParam();
  if (!codec::BitunshuffleImplAvailable(impl)) GTEST_SKIP() << "this build or CPU has no " << ImplName(impl);
  std::vector<size_t> lengths;
  for (size_t n = 8; n <= 520; n += 8) lengths.push_back(n);
  for (size_t n : {1016, 1024, 2040, 2048, 8184, 8192, 8200}) lengths.push_back(n);
  constexpr size_t kGuard = 64;
  constexpr std::byte kGuardByte{0xA5};
  std::mt19937_64 rng(30);
  for (size_t elem : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 31, 32, 64}) {
    for (size_t n : lengths) {
      const size_t bytes = n * elem;
      for (bool random : {false, true}) {
        std::vector<std::byte> raw(bytes), sh(bytes + 1), scalar(bytes + kGuard), simd(bytes + 1 + kGuard, kGuardByte);
        if (random) {
          for (auto& b : raw) b = static_cast<std::byte>(rng());
        } else {
          for (size_t e = 0; e < n; ++e) {
            for (size_t j = 0; j < elem; ++j) {
              raw[e * elem + j] = static_cast<std::byte>(j < 8 ? e >> (8 * j) : gpufeed::testing::IndexByte(e, j));
            }
          }
        }
        codec::BitshuffleBlock(raw.data(), sh.data() + 1, n, elem);
        codec::BitunshuffleBlockWith(codec::BitunshuffleImpl::kScalar, sh.data() + 1, scalar.data(), n, elem);
        codec::BitunshuffleBlockWith(impl, sh.data() + 1, simd.data() + 1, n, elem);
        const std::string where = "elem_size " + std::to_string(elem) + ", " + std::to_string(n) +
                                  (random ? " random" : " index") + " elements";
        ASSERT_EQ(FirstDifference(scalar.data(), raw.data(), bytes), -1) << "scalar twin, " << where;
        ASSERT_EQ(FirstDifference(simd.data() + 1, scalar.data(), bytes), -1) << where;
        ASSERT_EQ(simd[0], kGuardByte) << where;
        for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(simd[1 + bytes + i], kGuardByte) << where << ", byte " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vector, BitunshuffleImplTest,
                         ::testing::Values(codec::BitunshuffleImpl::kSse2, codec::BitunshuffleImpl::kAvx2),
                         [](const ::testing::TestParamInfo<codec::BitunshuffleImpl>& info) {
                           return std::string(ImplName(info.param));
                         });

// A bitshuffled chunk (no compression) of whole blocks, a shorter last block
// (still a multiple of 8 elements) and fewer than 8 elements left over, which
// the format stores as they are: BitshuffleDecompress, by the unshuffle this
// CPU runs, gives back the elements.
TEST(CodecTest, BitshuffleChunkOfBlocksAndLeftoverElements) {
  for (size_t elem : {1, 2, 3, 4, 5, 8, 12, 16}) {
    for (size_t block : {8, 136, 256, 1024, 4096}) {  // 4096: the decoder prefetches the next block
      for (size_t n : {size_t{5}, size_t{8}, block, 3 * block + 8, 3 * block + 8 * 13 + 7}) {
        const std::vector<std::byte> raw = gpufeed::testing::IndexSamples(n, elem);
        std::vector<std::byte> stored(raw.size()), back(raw.size());
        size_t e = 0;
        for (;;) {
          size_t count = std::min(block, n - e);
          count -= count % 8;
          if (count == 0) break;
          codec::BitshuffleBlock(raw.data() + e * elem, stored.data() + e * elem, count, elem);
          e += count;
        }
        std::memcpy(stored.data() + e * elem, raw.data() + e * elem, (n - e) * elem);
        std::vector<std::byte> tmp;
        ASSERT_TRUE(codec::BitshuffleDecompress(stored, back, elem, block, 0, tmp, "t").ok());
        EXPECT_EQ(FirstDifference(back.data(), raw.data(), raw.size()), -1)
            << "elem_size " << elem << ", block " << block << ", " << n << " elements";
      }
    }
  }
}

// Hostile framing: sizes in the LZ4 and bitshuffle headers are not trusted.
TEST(CodecTest, PluginFramesWithLyingSizesAreCorrupt) {
  std::vector<std::byte> dst(64);
  std::vector<std::byte> tmp;
  // Header claims 64 bytes in one block whose stored size overruns the chunk.
  std::vector<std::byte> lz4 = {std::byte{0},    std::byte{0},    std::byte{0},    std::byte{0},
                                std::byte{0},    std::byte{0},    std::byte{0},    std::byte{64},
                                std::byte{0},    std::byte{0},    std::byte{0},    std::byte{64},
                                std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}};
  EXPECT_EQ(codec::Lz4FramedDecompress(lz4, dst, "t").code(), StatusCode::kCorrupt);
  EXPECT_EQ(codec::BitshuffleDecompress(lz4, dst, 1, 0, 2, tmp, "t").code(), StatusCode::kCorrupt);
  lz4[7] = std::byte{65};  // total size differs from the expected
  EXPECT_EQ(codec::Lz4FramedDecompress(lz4, dst, "t").code(), StatusCode::kCorrupt);
  EXPECT_EQ(codec::Lz4FramedDecompress(std::span(lz4).first(5), dst, "t").code(), StatusCode::kCorrupt);
  EXPECT_EQ(codec::BloscDecompress(lz4, dst, "t").code(), StatusCode::kCorrupt);
  EXPECT_EQ(codec::LzfDecompress(lz4, dst, "t").code(), StatusCode::kCorrupt);
  // Bitshuffle's block in bytes not a multiple of 8 elements.
  lz4[7] = std::byte{64};
  lz4[11] = std::byte{12};
  EXPECT_EQ(codec::BitshuffleDecompress(lz4, dst, 1, 0, 2, tmp, "t").code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace gpufeed
