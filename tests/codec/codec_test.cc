// Codec round trips and damage detection.
#include "codec/codec.h"

#include <gtest/gtest.h>

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

// The SSE2 unshuffle against its scalar twin: every element size the direct
// path meets and block lengths with and without a remainder of columns (128
// elements a vector step), values that encode their own index.
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
      codec::BitunshuffleBlockScalar(sh.data(), scalar.data(), n, elem);
      EXPECT_EQ(simd, scalar) << "elem_size " << elem << ", " << n << " elements";
      EXPECT_EQ(simd, raw) << "elem_size " << elem << ", " << n << " elements";
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
