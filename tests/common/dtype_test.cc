// The one dtype table: every way in leads back to the same dtype.
#include "gpufeed/dtype.h"

#include <gtest/gtest.h>

#include <string>

namespace gpufeed {
namespace {

TEST(DTypeTest, EveryFactOfADtypeLeadsBackToIt) {
  for (int i = 0; i <= static_cast<int>(DType::kFloat64); ++i) {
    const DType t = static_cast<DType>(i);
    SCOPED_TRACE(std::string(DTypeName(t)));
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
    EXPECT_EQ(DTypeOf(DTypeKindOf(t), DTypeSize(t)), t);
    const DTypeDlpack d = DTypeDlpackOf(t);
    EXPECT_EQ(d.bits, 8 * DTypeSize(t));
    EXPECT_EQ(DTypeFromDlpack(d.code, d.bits), t);
    const std::string_view descr = DTypeNpyDescr(t);
    ASSERT_EQ(descr.size(), 3u);
    EXPECT_EQ(descr[2] - '0', static_cast<int>(DTypeSize(t)));
    EXPECT_EQ(descr[0], DTypeSize(t) == 1 ? '|' : '<');
    EXPECT_EQ(DTypeIsInteger(t), descr[1] == 'i' || descr[1] == 'u');
  }
  EXPECT_EQ(DTypeOf(DTypeKind::kFloat, 2), DType::kFloat16);  // not bfloat16
  EXPECT_EQ(DTypeOf(DTypeKind::kSignedInt, 3), std::nullopt);
  EXPECT_EQ(DTypeFromDlpack(2, 128), std::nullopt);
  EXPECT_EQ(DTypeFromName("float128"), std::nullopt);
}

}  // namespace
}  // namespace gpufeed
