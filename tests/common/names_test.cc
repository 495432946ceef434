// The enums' name tables (gpufeed/names.h): every value has one name that
// leads back to it, every enumerator is in its table, and a name not in it
// is refused with the message users have seen (the CLI's and Python's tests
// match these texts).
#include "gpufeed/names.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "gpufeed/crop_rect.h"

namespace gpufeed {
namespace {

// Every row's name parses to its value and back; `count` enumerators
// (0..count-1) each have exactly one row.
template <typename E>
void ExpectRoundTrips(const NameTable<E>& t, int count) {
  std::set<std::string_view> names;
  for (const NameRow<E>& r : t.rows) {
    SCOPED_TRACE(std::string(r.name));
    auto parsed = t.Parse(r.name);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, r.value);
    EXPECT_EQ(t.Name(r.value), r.name);
    EXPECT_TRUE(names.insert(r.name).second) << "a name twice";
  }
  ASSERT_EQ(static_cast<int>(t.rows.size()), count);
  for (int i = 0; i < count; ++i) EXPECT_NE(t.Name(static_cast<E>(i)), "?") << i;
  for (const NameAlias<E>& a : t.aliases) EXPECT_EQ(*t.Find(a.name), a.value) << a.name;
}

std::string Refusal(const Status& s) { return s.message(); }

TEST(NamesTest, EveryEnumeratorHasOneNameThatLeadsBackToIt) {
  ExpectRoundTrips(kOrderNames, 3);
  ExpectRoundTrips(kImageTransformNames, 2);
  ExpectRoundTrips(kLayoutNames, 2);
  ExpectRoundTrips(kReadPathNames, 2);
  ExpectRoundTrips(kIoModeNames, 3);
  ExpectRoundTrips(kCodecNames, 3);
  ExpectRoundTrips(kSourceKindNames, 7);
  ExpectRoundTrips(kDecodeDeviceNames, 3);
  ExpectRoundTrips(kShareNames, 3);
  ExpectRoundTrips(kModelKindNames, 3);
  ExpectRoundTrips(kOptimizerNames, 4);
  ExpectRoundTrips(kTrainDeviceNames, 3);
  // The spellings files and state carry.
  EXPECT_EQ(OrderName(Order::kBlock), "block");
  EXPECT_EQ(CodecName(Codec::kZstd), "zstd");
  EXPECT_EQ(*CodecFromName("gzip"), Codec::kDeflate);
  EXPECT_EQ(*ImageTransformFromName("rrc"), ImageTransform::kRandomResizedCrop);
  EXPECT_EQ(*ImageTransformFromName("center"), ImageTransform::kCenterCrop);
  EXPECT_EQ(OptimizerName(Optimizer::kAdamW8bit), "adamw8bit");
  EXPECT_EQ(LayoutName(Layout::kNHWC), "NHWC");
}

TEST(NamesTest, AnUnknownNameIsRefusedWithTheMessageUsersKnow) {
  EXPECT_EQ(Refusal(OrderFromName("up").status()), "unknown order 'up' (expected sequential, random or block)");
  EXPECT_EQ(Refusal(CodecFromName("lz4").status()), "unknown codec 'lz4' (expected none, deflate or zstd)");
  EXPECT_EQ(Refusal(ImageTransformFromName("crop").status()),
            "image transform 'crop' is not random_resized_crop (training) or center_crop (evaluation)");
  EXPECT_EQ(Refusal(ParseIoMode("mmap").status()), "I/O mode 'mmap' is not one of auto, direct, buffered");
  EXPECT_EQ(Refusal(DecodeDeviceFromName("tpu").status()), "decode 'tpu': auto, cpu or gpu");
  EXPECT_EQ(Refusal(ShareFromName("all").status()),
            "share 'all': auto (one decode per node under torchrun), node or none");
  EXPECT_EQ(Refusal(ModelKindFromName("rnn").status()), "unknown model 'rnn' (mlp, cnn or resnet18)");
  EXPECT_EQ(Refusal(OptimizerFromName("lion").status()), "unknown optimizer 'lion' (sgd, adamw, adamw8bit or sgd8bit)");
  EXPECT_EQ(OrderFromName("up").status().code(), StatusCode::kInvalidArgument);
  // Names are matched whole and by case; the name given is quoted as given,
  // never read as the message's placeholders.
  EXPECT_FALSE(OrderFromName("Block").ok());
  EXPECT_FALSE(OrderFromName("").ok());
  EXPECT_FALSE(LayoutFromName("NCHW ").ok());
  EXPECT_EQ(Refusal(CodecFromName("{names}{name}").status()),
            "unknown codec '{names}{name}' (expected none, deflate or zstd)");
}

TEST(NamesTest, LayoutOrTakesWhatAFileMayCarry) {
  EXPECT_EQ(LayoutOr("NHWC", Layout::kNCHW), Layout::kNHWC);
  EXPECT_EQ(LayoutOr("NCHW", Layout::kNHWC), Layout::kNCHW);
  EXPECT_EQ(LayoutOr("", Layout::kNHWC), Layout::kNHWC);       // no attribute
  EXPECT_EQ(LayoutOr("NCDHW", Layout::kNCHW), Layout::kNCHW);  // another layout
  EXPECT_EQ(kLayoutNames.List(), "NCHW or NHWC");
}

TEST(CropRectTest, ComparesEveryField) {
  const CropRect a{.top = 1, .left = 2, .height = 3, .width = 4};
  EXPECT_EQ(a, (CropRect{1, 2, 3, 4}));
  for (CropRect b : {CropRect{9, 2, 3, 4}, CropRect{1, 9, 3, 4}, CropRect{1, 2, 9, 4}, CropRect{1, 2, 3, 9}}) {
    EXPECT_FALSE(a == b);
  }
}

}  // namespace
}  // namespace gpufeed
