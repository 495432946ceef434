// The wire protocol: frames and messages round-trip; every malformed input
// (bad magic, version, type, flags, lengths, truncation, checksum) is
// refused with a message naming the problem, before any allocation.
#include "loader/remote/protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>

#include "loader/remote/address.h"

namespace gpufeed::daemon {
namespace {

std::span<const std::byte> Bytes(const std::vector<std::byte>& v) { return v; }

HeaderBytes HeaderOf(const std::vector<std::byte>& frame) {
  HeaderBytes h;
  std::memcpy(h.data(), frame.data(), kHeaderBytes);
  return h;
}

TEST(ProtocolTest, HelloRoundTrip) {
  Hello h;
  h.token = "s3cret";
  h.dataset = "train.h5:/images";
  h.client_name = "trainer-3";
  h.loader.batch_size = 256;
  h.loader.order = Order::kRandom;
  h.loader.seed = 0xdeadbeefcafe;
  h.loader.shuffle_window = 7;
  h.loader.rank = 3;
  h.loader.world_size = 4;
  h.loader.drop_last = true;
  h.epoch = 9;
  h.start_batch = 12;
  h.compress = true;
  auto d = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->token, h.token);
  EXPECT_EQ(d->dataset, h.dataset);
  EXPECT_EQ(d->client_name, h.client_name);
  EXPECT_EQ(d->loader.batch_size, 256u);
  EXPECT_EQ(d->loader.order, Order::kRandom);
  EXPECT_EQ(d->loader.seed, h.loader.seed);
  EXPECT_EQ(d->loader.shuffle_window, 7u);
  EXPECT_EQ(d->loader.rank, 3);
  EXPECT_EQ(d->loader.world_size, 4);
  EXPECT_TRUE(d->loader.drop_last);
  EXPECT_EQ(d->epoch, 9u);
  EXPECT_EQ(d->start_batch, 12u);
  EXPECT_TRUE(d->compress);
  EXPECT_FALSE(d->describe_only);
}

TEST(ProtocolTest, HelloOkEndErrorCreditRoundTrip) {
  HelloOk ok;
  ok.info.name = "a.h5:/images";
  ok.info.dtype = DType::kUInt8;
  ok.info.sample_shape = {3, 4, 5};
  ok.info.sample_bytes = 60;
  ok.info.num_samples = 1000;
  ok.info.batch_size = 32;
  ok.info.has_labels = true;
  ok.info.mean = {1, 2, 3};
  ok.info.stddev = {4, 5, 6};
  ok.info.fields = {FieldInfo{"images", "/images", DType::kUInt8, false, {3, 4, 5}, 60, 0}};
  ok.num_batches = 32;
  ok.client_id = 5;
  auto d = DecodeHelloOk(EncodeHelloOk(ok));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->info.sample_shape, ok.info.sample_shape);
  EXPECT_EQ(d->info.mean, ok.info.mean);
  EXPECT_EQ(d->info.stddev, ok.info.stddev);
  EXPECT_EQ(d->num_batches, 32u);
  EXPECT_EQ(d->client_id, 5u);

  auto e = DecodeEnd(EncodeEnd({3, 77}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->epoch, 3u);
  EXPECT_EQ(e->batches, 77u);
  auto er = DecodeError(EncodeError({StatusCode::kNotFound, "no such dataset"}));
  ASSERT_TRUE(er.ok());
  EXPECT_EQ(er->code, StatusCode::kNotFound);
  EXPECT_EQ(er->message, "no such dataset");
  auto c = DecodeCredit(EncodeCredit(5));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 5u);
  EXPECT_FALSE(DecodeCredit(EncodeCredit(0)).ok());
  EXPECT_FALSE(DecodeCredit(EncodeCredit(kMaxCredits + 1)).ok());
}

// A sample of named fields (version 3): data float32 [2, 3] + mask bool [3]
// + target float64 scalar.
HelloOk FieldsHelloOk() {
  HelloOk ok;
  ok.info.name = "deepcam/*.h5";
  ok.info.dtype = DType::kUInt8;
  ok.info.sample_shape = {24 + 3 + 8};
  ok.info.sample_bytes = 24 + 3 + 8;
  ok.info.num_samples = 50;
  ok.info.batch_size = 4;
  ok.info.fields = {
      FieldInfo{"data", "/climate/data", DType::kFloat32, false, {2, 3}, 24, 0},
      FieldInfo{"mask", "/climate/mask", DType::kUInt8, true, {3}, 3, 0},
      FieldInfo{"target", "/y", DType::kFloat64, false, {}, 8, 0},
  };
  ok.num_batches = 13;
  return ok;
}

TEST(ProtocolTest, HelloOkCarriesEveryField) {
  const HelloOk ok = FieldsHelloOk();
  auto d = DecodeHelloOk(EncodeHelloOk(ok));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->info.fields.size(), 3u);
  const uint64_t offsets[] = {0, 24, 27};  // the running sum, as ChunkSource::fields() has it
  for (size_t i = 0; i < 3; ++i) {
    const FieldInfo &got = d->info.fields[i], &want = ok.info.fields[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.path, want.path);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.is_bool, want.is_bool);
    EXPECT_EQ(got.sample_shape, want.sample_shape);
    EXPECT_EQ(got.sample_bytes, want.sample_bytes);
    EXPECT_EQ(got.offset, offsets[i]);
  }
  EXPECT_EQ(EncodeHelloOk(*d), EncodeHelloOk(ok));
}

// Hostile field descriptions: refused with a message, nothing allocated
// from a count or a shape.
TEST(ProtocolTest, HostileFieldDescriptionsAreRefused) {
  auto refused = [](const HelloOk& m, const std::string& words) {
    auto d = DecodeHelloOk(EncodeHelloOk(m));
    EXPECT_FALSE(d.ok()) << words;
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kCorrupt);
      EXPECT_NE(d.status().message().find(words), std::string::npos) << d.status().message();
    }
  };
  HelloOk m = FieldsHelloOk();
  m.info.fields.clear();
  refused(m, "field count 0");
  m = FieldsHelloOk();
  m.info.fields.resize(kMaxFields + 1, m.info.fields[2]);
  refused(m, "field count 65");
  m = FieldsHelloOk();
  m.info.fields[0].sample_shape.assign(kMaxRank + 1, 1);
  refused(m, "'field sample_shape' has 9 entries");
  m = FieldsHelloOk();
  m.info.fields[0].sample_shape = {1ull << 32, 1ull << 32, 2};  // 2^65 elements of 4 bytes: the product wraps
  m.info.fields[0].sample_bytes = 24;
  refused(m, "does not fit its shape");
  m = FieldsHelloOk();
  m.info.fields[0].sample_shape = {1ull << 62, 4};  // 2^64 x 4 bytes: wraps to 0
  m.info.fields[0].sample_bytes = 0;
  refused(m, "does not fit");
  m = FieldsHelloOk();
  m.info.fields[1].sample_bytes = 4;  // shape says 3
  refused(m, "'mask' of 4 bytes");
  m = FieldsHelloOk();
  m.info.fields[2].sample_shape = {2};  // 16 bytes: the fields overrun the sample
  m.info.fields[2].sample_bytes = 16;
  refused(m, "does not fit its shape or the sample's 35 bytes");
  m = FieldsHelloOk();
  m.info.fields.pop_back();  // 27 of 35 bytes described
  refused(m, "fields of 27 bytes in samples of 35");
  m = FieldsHelloOk();
  m.info.fields[1].name = "data";
  refused(m, "'data' twice");
  m = FieldsHelloOk();
  m.info.fields[1].name = "";
  refused(m, "field 1 ''");
  // A field count that claims more than the payload holds: truncated.
  auto bytes = EncodeHelloOk(FieldsHelloOk());
  // Each field: str name, str path, u8 dtype, u8 is_bool, vec<u64> shape, u64 bytes.
  const size_t data_bytes = (4 + 4) + (4 + 13) + 1 + 1 + (4 + 16) + 8;
  const size_t mask_bytes = (4 + 4) + (4 + 13) + 1 + 1 + (4 + 8) + 8;
  const size_t target_bytes = (4 + 6) + (4 + 2) + 1 + 1 + 4 + 8;
  const size_t encoded_bytes = 1 + 8;  // u8 encoded_batches, u64 slot_sample_bytes (version 5)
  const size_t count_at = bytes.size() - encoded_bytes - data_bytes - mask_bytes - target_bytes - 4;
  uint32_t count = 0;
  std::memcpy(&count, bytes.data() + count_at, 4);
  ASSERT_EQ(count, 3u);  // found it
  count = 40;
  std::memcpy(bytes.data() + count_at, &count, 4);
  auto d = DecodeHelloOk(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("truncated"), std::string::npos) << d.status().message();
  // A field's dtype byte out of range.
  bytes = EncodeHelloOk(FieldsHelloOk());
  const size_t dtype_at = count_at + 4 + (4 + 4) + (4 + 13);  // after name "data", path "/climate/data"
  ASSERT_EQ(static_cast<uint8_t>(bytes[dtype_at]), static_cast<uint8_t>(DType::kFloat32));
  bytes[dtype_at] = std::byte{99};
  d = DecodeHelloOk(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("unknown dtype 99"), std::string::npos) << d.status().message();
}

TEST(ProtocolTest, HelloCarriesDecodeOptionsAndRefusesBadOnes) {
  Hello h;
  h.loader.batch_size = 8;
  h.decode.height = 160;
  h.decode.width = 192;
  h.decode.layout = "NHWC";
  h.decode.transform = ImageTransform::kCenterCrop;
  h.decode.scale_min = 0.25;
  h.decode.scale_max = 0.75;
  h.decode.ratio_min = 0.5;
  h.decode.ratio_max = 2;
  h.decode.center_fraction = 0.5;
  h.decode.skip_corrupt = true;
  auto d = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->decode.height, 160u);
  EXPECT_EQ(d->decode.width, 192u);
  EXPECT_EQ(d->decode.layout, "NHWC");
  EXPECT_EQ(d->decode.transform, ImageTransform::kCenterCrop);
  EXPECT_EQ(d->decode.scale_min, 0.25);
  EXPECT_EQ(d->decode.scale_max, 0.75);
  EXPECT_EQ(d->decode.ratio_min, 0.5);
  EXPECT_EQ(d->decode.ratio_max, 2);
  EXPECT_EQ(d->decode.center_fraction, 0.5);
  EXPECT_TRUE(d->decode.skip_corrupt);
  EXPECT_EQ(EncodeHello(*d), EncodeHello(h));

  auto refused = [](std::vector<std::byte> bytes, const std::string& words) {
    auto r = DecodeHello(bytes);
    EXPECT_FALSE(r.ok()) << words;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
      EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    }
  };
  Hello bad = h;
  bad.decode.height = 0;
  refused(EncodeHello(bad), "decode output size 0x192");
  bad = h;
  bad.decode.width = 40000;
  refused(EncodeHello(bad), "160x40000");
  bad = h;
  bad.decode.layout = "CHWN";
  refused(EncodeHello(bad), "'CHWN'");
  bad = h;
  bad.decode.scale_min = std::nan("");
  refused(EncodeHello(bad), "scale range");
  bad = h;
  bad.decode.ratio_max = INFINITY;
  refused(EncodeHello(bad), "ratio range");
  bad = h;
  bad.decode.center_fraction = 1.5;
  refused(EncodeHello(bad), "center-crop fraction");
  // The transform and skip_corrupt bytes, before the reshard (u64, u32,
  // u64, u64: 28 bytes) and defer_decode (u8) at the end.
  const size_t reshard_bytes = 8 + 4 + 8 + 8 + 1;
  auto bytes = EncodeHello(h);
  bytes[bytes.size() - 1 - reshard_bytes] = std::byte{2};
  refused(bytes, "skip_corrupt 2");
  bytes = EncodeHello(h);
  bytes[bytes.size() - 1 - reshard_bytes - 5 * 8 - 1] = std::byte{7};
  refused(bytes, "unknown transform 7");
  // The reshard of a run resumed at another world size travels, checked.
  h.loader.reshard = {7, 3, 160, 48};
  auto r = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->loader.reshard.epoch, 7u);
  EXPECT_EQ(r->loader.reshard.world_size, 3u);
  EXPECT_EQ(r->loader.reshard.share, 160u);
  EXPECT_EQ(r->loader.reshard.consumed, 48u);
  bad = h;
  bad.loader.reshard.consumed = 161;
  refused(EncodeHello(bad), "161 of 160 samples received");
  bad = h;
  bad.loader.reshard.world_size = (1u << 24) + 1;
  refused(EncodeHello(bad), "reshard of 16777217 ranks");
}

// Deferred decoding (version 5): HELLO asks, HELLO_OK answers with the
// slots' size, and a batch's encoded table is checked as a hostile peer's.
TEST(ProtocolTest, DeferredDecodingIsAskedAnsweredAndItsTableChecked) {
  Hello h;
  h.loader.batch_size = 4;
  EXPECT_FALSE(DecodeHello(EncodeHello(h))->loader.defer_decode);
  h.loader.defer_decode = true;
  auto hd = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(hd.ok()) << hd.status().ToString();
  EXPECT_TRUE(hd->loader.defer_decode);
  auto bytes = EncodeHello(h);
  bytes.back() = std::byte{2};
  EXPECT_NE(DecodeHello(bytes).status().message().find("defer_decode 2"), std::string::npos);

  HelloOk ok = FieldsHelloOk();
  EXPECT_TRUE(DecodeHelloOk(EncodeHelloOk(ok)).ok());
  ok.slot_sample_bytes = 64;  // a slot size without encoded batches
  EXPECT_NE(DecodeHelloOk(EncodeHelloOk(ok)).status().message().find("batches that are not encoded"),
            std::string::npos);
  ok.info.encoded_batches = true;
  auto okd = DecodeHelloOk(EncodeHelloOk(ok));
  ASSERT_TRUE(okd.ok()) << okd.status().ToString();
  EXPECT_TRUE(okd->info.encoded_batches);
  EXPECT_EQ(okd->slot_sample_bytes, 64u);
  ok.slot_sample_bytes = 34;  // smaller than the decoded sample (35)
  EXPECT_NE(DecodeHelloOk(EncodeHelloOk(ok)).status().message().find("slots of 34 bytes a sample"), std::string::npos);
  ok.slot_sample_bytes = kMaxSampleBytes + 1;
  EXPECT_FALSE(DecodeHelloOk(EncodeHelloOk(ok)).ok());

  // A batch head with flags bit 1 has a table of count entries.
  std::vector<std::byte> fixed(BatchHead::kFixedBytes);
  const uint32_t count = 3, flags = 3;
  std::memcpy(fixed.data() + 16, &count, 4);
  std::memcpy(fixed.data() + 20, &flags, 4);
  auto head = DecodeBatchFixed(fixed);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_TRUE(head->has_labels && head->encoded);
  EXPECT_EQ(head->head_bytes(), BatchHead::kFixedBytes + 3 * 16 + 3 * kEncodedEntryBytes);
  const uint32_t unknown = 4;
  std::memcpy(fixed.data() + 20, &unknown, 4);
  EXPECT_NE(DecodeBatchFixed(fixed).status().message().find("unknown flags 4"), std::string::npos);

  // The table: samples of 100 bytes decoded, slots of 1000 bytes.
  const uint64_t sb = 100, slot = 1000;
  auto table = [](const std::vector<EncodedSample>& entries) {
    std::vector<std::byte> t;
    for (const EncodedSample& e : entries) {
      auto put = [&](const void* v, size_t n) {
        const auto* b = static_cast<const std::byte*>(v);
        t.insert(t.end(), b, b + n);
      };
      put(&e.offset, 8);
      put(&e.bytes, 8);
      for (int32_t v : {e.height, e.width, e.crop.top, e.crop.left, e.crop.height, e.crop.width}) put(&v, 4);
    }
    return t;
  };
  EncodedSample jpeg;  // 300 encoded bytes of a 20 x 30 image, cropped 10 x 12 at (5, 6)
  jpeg.bytes = 300;
  jpeg.height = 20;
  jpeg.width = 30;
  jpeg.crop = {5, 6, 10, 12};
  EncodedSample decoded;  // sample_bytes of pixels
  std::vector<EncodedSample> good = {jpeg, decoded, jpeg};
  good[1].offset = 300;
  good[2].offset = 400;
  std::vector<EncodedSample> got;
  auto end = DecodeEncodedTable(table(good), 3, sb, slot, &got);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(*end, 700u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].offset, good[i].offset);
    EXPECT_EQ(got[i].bytes, good[i].bytes);
    EXPECT_EQ(got[i].height, good[i].height);
    EXPECT_EQ(got[i].width, good[i].width);
    EXPECT_EQ(got[i].crop, good[i].crop);
  }
  EXPECT_EQ(EncodedTableEnd(got, sb), 700u);
  auto refused = [&](std::vector<EncodedSample> t, uint32_t n, const std::string& words) {
    auto r = DecodeEncodedTable(table(t), n, sb, slot, &got);
    EXPECT_FALSE(r.ok()) << words;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().message();
      EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    }
  };
  refused(good, 2, "encoded table of 120 bytes for 2 samples");
  auto bad = good;
  bad[1].offset = 299;  // into the sample before
  refused(bad, 3, "entry 1 of 3: 100 bytes at offset 299 overlap the entry before (its end 300)");
  bad = good;
  bad[2].offset = 701;  // 701 + 300 > 1000
  refused(bad, 3, "entry 2 of 3: 300 bytes at offset 701");
  bad = good;
  bad[2].bytes = UINT64_MAX - 100;  // the end wraps
  refused(bad, 3, "pass the slot's 1000 bytes");
  bad = good;
  bad[1].height = 20;  // a decoded sample with a size
  refused(bad, 3, "entry 1 of 3: a decoded sample (0 encoded bytes) with an image size or crop");
  bad = good;
  bad[0].width = 0;
  refused(bad, 3, "an image of 20x0");
  bad = good;
  bad[0].height = kMaxImageSide + 1;
  refused(bad, 3, "an image of 65536x30");
  bad = good;
  bad[2].crop = {11, 6, 10, 12};  // rows 11..20 of 20
  refused(bad, 3, "entry 2 of 3: crop 10x12 at (11, 6) outside its 20x30 image");
  bad = good;
  bad[0].crop = {0, -1, 10, 12};
  refused(bad, 3, "at (0, -1)");
  bad = good;
  bad[0].crop = {0, 0, 10, 0};
  refused(bad, 3, "crop 10x0");
}

TEST(ProtocolTest, VersionMismatchNamesBothVersionsAndTheSideToUpgrade) {
  const auto frame = MakeFrame(FrameType::kCredit, EncodeCredit(1));
  HeaderBytes old = HeaderOf(frame);
  const uint16_t two = 2;
  std::memcpy(old.data() + 4, &two, 2);
  Status st = ParseHeader(old, kMaxControlPayload, kMaxControlPayload, "client unix").status();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("client unix speaks gpufeed daemon protocol version 2; this build speaks version " +
                              std::to_string(kVersion)),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("upgrade gpufeed on the older side (client unix)"), std::string::npos);
  EXPECT_EQ(HeaderVersion(old), 2);
  HeaderBytes newer = old;
  const uint16_t next = kVersion + 1;
  std::memcpy(newer.data() + 4, &next, 2);
  st = ParseHeader(newer, kMaxControlPayload, kMaxControlPayload, "daemon x").status();
  EXPECT_NE(st.message().find("upgrade gpufeed on this side"), std::string::npos) << st.message();
  // A header made for another version checks out in that version.
  const auto body = EncodeError({StatusCode::kUnsupported, "old"});
  const auto h2 = MakeHeader(FrameType::kError, 0, static_cast<uint32_t>(body.size()), {body}, 2);
  EXPECT_EQ(HeaderVersion(h2), 2);
  HeaderBytes garbage{};
  EXPECT_EQ(HeaderVersion(garbage), 0);  // not ours at all
}

// A BATCH_REF payload built by hand: fixed part, slot, reserved, indices, labels.
std::vector<std::byte> BatchRefBytes(uint32_t count, uint32_t slot, uint32_t reserved) {
  std::vector<std::byte> p;
  auto put = [&](const void* v, size_t n) {
    const auto* b = static_cast<const std::byte*>(v);
    p.insert(p.end(), b, b + n);
  };
  const uint64_t epoch = 2, index = 5, sample_bytes = 192;
  const uint32_t flags = 1;
  put(&epoch, 8);
  put(&index, 8);
  put(&count, 4);
  put(&flags, 4);
  put(&sample_bytes, 8);
  put(&slot, 4);
  put(&reserved, 4);
  for (uint64_t i = 0; i < count; ++i) put(&i, 8);          // indices
  for (int64_t i = 0; i < int64_t{count}; ++i) put(&i, 8);  // labels
  return p;
}

TEST(ProtocolTest, SharedMemoryMessages) {
  Hello h;
  h.loader.batch_size = 8;
  h.shm_slots = 9;
  h.shm_stride = 1 << 20;
  auto d = DecodeHello(EncodeHello(h));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->shm_slots, 9u);
  EXPECT_EQ(d->shm_stride, 1u << 20);
  h.shm_slots = kMaxShmSlots + 1;
  EXPECT_NE(DecodeHello(EncodeHello(h)).status().message().find("shared-memory slots"), std::string::npos);
  h.shm_slots = 2;
  h.shm_stride = 0;
  EXPECT_FALSE(DecodeHello(EncodeHello(h)).ok());

  HelloOk ok;
  ok.info.name = "a";
  ok.info.sample_shape = {4};
  ok.info.sample_bytes = 4;
  ok.info.batch_size = 8;
  ok.info.fields = {FieldInfo{"images", "", DType::kUInt8, false, {4}, 4, 0}};
  ok.shm = true;
  auto o = DecodeHelloOk(EncodeHelloOk(ok));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->shm);

  const std::vector<uint32_t> slots{3, 0, 7};
  auto sl = DecodeSlots(EncodeSlots(slots));
  ASSERT_TRUE(sl.ok());
  EXPECT_EQ(*sl, slots);
  EXPECT_NE(DecodeSlots(EncodeSlots({})).status().message().find("no slot"), std::string::npos);
  EXPECT_NE(DecodeSlots(EncodeSlots(std::vector<uint32_t>(kMaxShmSlots + 1, 1))).status().message().find("limit"),
            std::string::npos);
  auto cut = EncodeSlots(slots);
  cut.pop_back();
  EXPECT_NE(DecodeSlots(cut).status().message().find("truncated"), std::string::npos);

  auto ref = DecodeBatchRef(BatchRefBytes(2, 3, 0));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_EQ(ref->slot, 3u);
  EXPECT_EQ(ref->head.count, 2u);
  EXPECT_EQ(ref->head.index, 5u);
  EXPECT_TRUE(ref->head.has_labels);
  auto shorter = BatchRefBytes(2, 3, 0);
  shorter.pop_back();
  EXPECT_NE(DecodeBatchRef(shorter).status().message().find("the frame has"), std::string::npos);
  auto longer = BatchRefBytes(2, 3, 0);
  longer.push_back(std::byte{0});
  EXPECT_FALSE(DecodeBatchRef(longer).ok());
  EXPECT_NE(DecodeBatchRef(BatchRefBytes(2, 3, 1)).status().message().find("reserved"), std::string::npos);
  const auto full = BatchRefBytes(2, 3, 0);
  EXPECT_FALSE(DecodeBatchRef(std::span(full).first(20)).ok());
}

TEST(ProtocolTest, FrameHeaderRoundTripAndChecksum) {
  const std::vector<std::byte> payload = EncodeEnd({1, 2});
  const auto frame = MakeFrame(FrameType::kEnd, payload);
  ASSERT_EQ(frame.size(), kHeaderBytes + payload.size());
  const HeaderBytes hb = HeaderOf(frame);
  auto h = ParseHeader(hb, kMaxControlPayload, kMaxControlPayload, "peer");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->type, FrameType::kEnd);
  EXPECT_EQ(h->payload_bytes, payload.size());
  EXPECT_TRUE(VerifyChecksum(*h, hb, Bytes(payload), "peer").ok());
  // One flipped payload bit is caught.
  auto bad = payload;
  bad[3] ^= std::byte{0x10};
  Status st = VerifyChecksum(*h, hb, Bytes(bad), "peer");
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("checksum"), std::string::npos);
  // So is a changed header field (the checksum covers the header).
  HeaderBytes hb2 = hb;
  hb2[16] = std::byte{0x7f};  // raw_bytes
  auto h2 = ParseHeader(hb2, kMaxControlPayload, 1u << 30, "peer");
  if (h2.ok()) {
    EXPECT_FALSE(VerifyChecksum(*h2, hb2, Bytes(payload), "peer").ok());
  }
}

TEST(ProtocolTest, MalformedHeadersAreRefusedWithReasons) {
  const auto frame = MakeFrame(FrameType::kCredit, EncodeCredit(1));
  auto parse = [](HeaderBytes hb, uint32_t max = kMaxControlPayload) {
    return ParseHeader(hb, max, max, "client 7").status();
  };
  HeaderBytes magic = HeaderOf(frame);
  magic[0] = std::byte{'X'};
  EXPECT_NE(parse(magic).message().find("magic"), std::string::npos);
  HeaderBytes version = HeaderOf(frame);
  version[4] = std::byte{9};
  EXPECT_EQ(parse(version).code(), StatusCode::kUnsupported);
  EXPECT_NE(parse(version).message().find("version 9"), std::string::npos);
  HeaderBytes type = HeaderOf(frame);
  type[6] = std::byte{99};
  EXPECT_NE(parse(type).message().find("unknown frame type 99"), std::string::npos);
  HeaderBytes flags = HeaderOf(frame);
  flags[8] = std::byte{0x80};
  EXPECT_NE(parse(flags).message().find("flags"), std::string::npos);
  // An oversized length is refused from the header alone.
  HeaderBytes huge = HeaderOf(frame);
  const uint32_t big = 0xfffffff0u;
  std::memcpy(huge.data() + 12, &big, 4);
  std::memcpy(huge.data() + 16, &big, 4);
  Status st = parse(huge);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("exceeds the limit"), std::string::npos);
  EXPECT_NE(st.message().find("client 7"), std::string::npos);
}

TEST(ProtocolTest, TruncatedAndOversizedMessagesAreRefused) {
  Hello h;
  h.token = "t";
  h.loader.batch_size = 8;
  auto bytes = EncodeHello(h);
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    auto d = DecodeHello(std::span<const std::byte>(bytes).first(cut));
    ASSERT_FALSE(d.ok()) << cut;
    EXPECT_EQ(d.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(d.status().message().find("truncated"), std::string::npos) << d.status().message();
  }
  auto extra = bytes;
  extra.push_back(std::byte{0});
  EXPECT_NE(DecodeHello(extra).status().message().find("trailing"), std::string::npos);
  // A string length over the limit is refused before allocating it.
  std::vector<std::byte> longstr(4);
  const uint32_t n = 0xffffffffu;
  std::memcpy(longstr.data(), &n, 4);
  auto d = DecodeHello(longstr);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("limit"), std::string::npos);
  // Bad stream parameters.
  Hello bad = h;
  bad.loader.rank = 4;
  bad.loader.world_size = 4;
  EXPECT_EQ(DecodeHello(EncodeHello(bad)).status().code(), StatusCode::kInvalidArgument);
  bad = h;
  bad.loader.batch_size = 0;
  EXPECT_EQ(DecodeHello(EncodeHello(bad)).status().code(), StatusCode::kInvalidArgument);
}

// Random payloads in correctly made frames of every type: the frame is
// accepted as made, and any single flipped bit anywhere in it (magic,
// version, type, lengths, reserved, checksum, payload) is refused by
// ParseHeader or VerifyChecksum, as a reader would apply them.
TEST(ProtocolTest, EveryBitFlipInAFrameIsDetected) {
  std::mt19937_64 rng(5);
  auto check = [](const std::vector<std::byte>& f) -> Status {
    auto h = ParseHeader(HeaderOf(f), kMaxControlPayload, kMaxControlPayload, "test");
    if (!h.ok()) return h.status();
    if (h->payload_bytes != f.size() - kHeaderBytes) return Status::Corrupt("length field changed");
    return VerifyChecksum(*h, HeaderOf(f), std::span(f).subspan(kHeaderBytes), "test");
  };
  for (int i = 0; i < 2000; ++i) {
    const auto type = static_cast<FrameType>(1 + rng() % 10);
    std::vector<std::byte> p(rng() % 64);
    for (auto& b : p) b = static_cast<std::byte>(rng());
    std::vector<std::byte> f = MakeFrame(type, p);
    ASSERT_TRUE(check(f).ok()) << FrameTypeName(type);
    const size_t bit = rng() % (f.size() * 8);
    f[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    EXPECT_FALSE(check(f).ok()) << "bit " << bit << " of a " << FrameTypeName(type) << " frame";
  }
}

// Valid messages with random bytes changed, cut or appended, through every
// decoder: each is refused or decodes to a message that encodes and decodes
// back to itself; both outcomes occur, so the mutations reach past the
// length and limit checks into the fields (the sanitizer passes check the
// reads).
TEST(ProtocolTest, MutatedMessagesAreRefusedOrDecodeConsistently) {
  Hello hello;
  hello.token = "tok";
  hello.client_name = "rank1";
  hello.loader.batch_size = 32;
  hello.loader.rank = 1;
  hello.loader.world_size = 2;
  HelloOk ok;
  ok.info.name = "d.h5:/images";
  ok.info.sample_shape = {3, 4};
  ok.info.sample_bytes = 12;
  ok.info.batch_size = 8;
  ok.info.mean = {0.5};
  ok.info.stddev = {2};
  ok.info.fields = {FieldInfo{"images", "", DType::kUInt8, false, {3, 4}, 12, 0}};
  const uint32_t slots[] = {1, 2, 3};
  struct Codec {
    std::vector<std::byte> valid;
    std::function<std::optional<std::vector<std::byte>>(std::span<const std::byte>)> reencode;
  };
  auto codec = [](auto decode, auto encode) {
    return [=](std::span<const std::byte> p) -> std::optional<std::vector<std::byte>> {
      auto m = decode(p);
      if (!m.ok()) return std::nullopt;
      return encode(*m);
    };
  };
  const Codec codecs[] = {
      {EncodeHello(hello), codec(DecodeHello, EncodeHello)},
      {EncodeHelloOk(ok), codec(DecodeHelloOk, EncodeHelloOk)},
      {EncodeSlots(slots), codec(DecodeSlots, [](const std::vector<uint32_t>& v) { return EncodeSlots(v); })},
      {EncodeEnd({.epoch = 2, .batches = 9}), codec(DecodeEnd, EncodeEnd)},
      {EncodeError({StatusCode::kCorrupt, "bad chunk"}), codec(DecodeError, EncodeError)},
      {EncodeCredit(7), codec(DecodeCredit, EncodeCredit)},
  };
  std::mt19937_64 rng(9);
  for (const Codec& c : codecs) {
    int accepted = 0, refused = 0;
    for (int i = 0; i < 500; ++i) {
      std::vector<std::byte> p = c.valid;
      switch (rng() % 3) {
        case 0:  // change 1 to 3 bytes
          for (int k = 0, n = 1 + rng() % 3; k < n; ++k) p[rng() % p.size()] = static_cast<std::byte>(rng());
          break;
        case 1:  // cut
          p.resize(rng() % p.size());
          break;
        case 2:  // append
          for (int k = 0, n = 1 + rng() % 8; k < n; ++k) p.push_back(static_cast<std::byte>(rng()));
          break;
      }
      const auto once = c.reencode(p);
      if (!once) {
        ++refused;
        continue;
      }
      ++accepted;
      const auto twice = c.reencode(*once);
      ASSERT_TRUE(twice.has_value());
      EXPECT_EQ(*twice, *once);
    }
    EXPECT_GT(accepted, 0);
    EXPECT_GT(refused, 0);
  }
}

TEST(ProtocolTest, CompressionRoundTrip) {
  std::vector<std::byte> a(1000, std::byte{7}), b(3000);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 31);
  auto z = Compress({a, b});
  ASSERT_FALSE(z.empty());
  EXPECT_LT(z.size(), a.size() + b.size());
  std::vector<std::byte> out(4000);
  ASSERT_TRUE(Decompress(z, out, "p").ok());
  EXPECT_EQ(0, std::memcmp(out.data(), a.data(), a.size()));
  EXPECT_EQ(0, std::memcmp(out.data() + a.size(), b.data(), b.size()));
  std::vector<std::byte> wrong(3999);
  EXPECT_FALSE(Decompress(z, wrong, "p").ok());
  z[z.size() / 2] ^= std::byte{0xff};
  EXPECT_FALSE(Decompress(z, out, "p").ok() && std::memcmp(out.data() + a.size(), b.data(), b.size()) == 0);
}

TEST(ProtocolTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(AddressTest, Parses) {
  auto u = ParseAddress("unix:/tmp/x.sock");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->kind, Address::Kind::kUnix);
  EXPECT_EQ(u->path, "/tmp/x.sock");
  auto t = ParseAddress("tcp://:7070");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->host, "127.0.0.1");  // loopback unless told otherwise
  EXPECT_EQ(t->port, 7070);
  auto t2 = ParseAddress("tcp://0.0.0.0:0");
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->host, "0.0.0.0");
  EXPECT_FALSE(ParseAddress("tcp://host:99999").ok());
  EXPECT_FALSE(ParseAddress("http://x").ok());
  EXPECT_FALSE(ParseAddress("unix:").ok());
  EXPECT_FALSE(ParseAddress("unix:/" + std::string(200, 'a')).ok());
}

}  // namespace
}  // namespace gpufeed::daemon
