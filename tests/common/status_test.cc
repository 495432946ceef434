// Status / Result behaviour.
#include "gpufeed/status.h"

#include <gtest/gtest.h>

namespace gpufeed {
namespace {

Status FailsWith(StatusCode code) { return Status(code, "x.h5: broken"); }

Status Propagates() {
  GPUFEED_RETURN_IF_ERROR(FailsWith(StatusCode::kCorrupt));
  return Status::Internal("not reached");
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Status::NotFound("a.h5: no such file");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NotFound: a.h5: no such file");
  EXPECT_EQ(s.WithContext("opening").message(), "opening: a.h5: no such file");
  EXPECT_EQ(Propagates().code(), StatusCode::kCorrupt);
}

TEST(StatusTest, ResultHoldsValueOrStatus) {
  Result<int> v(42);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 42);
  Result<int> e(Status::Corrupt("chunk 3"));
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace gpufeed
