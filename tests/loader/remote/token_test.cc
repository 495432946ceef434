// The daemon's token file (loader/remote/token.h), read through io: trailing
// whitespace trimmed; empty, over-long and missing files refused naming the
// file; a file far larger than any token refused by its size, before it is
// read.
#include "loader/remote/token.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "loader/remote/protocol.h"
#include "tests/testing/test_data.h"

namespace gpufeed::daemon {
namespace {

TEST(TokenFileTest, TrimmedAndBoundedAndNamed) {
  const std::string dir = testing::MakeTempDir("token_file");
  std::ofstream(dir + "/t") << "s3cret-token\n \n";
  auto t = ReadTokenFile(dir + "/t");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, "s3cret-token");

  std::ofstream(dir + "/empty") << "\n\n";
  auto empty = ReadTokenFile(dir + "/empty");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find(dir + "/empty' is empty"), std::string::npos) << empty.status().ToString();

  std::ofstream(dir + "/long") << std::string(kMaxString + 1, 'x');
  auto too_long = ReadTokenFile(dir + "/long");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("token too long"), std::string::npos) << too_long.status().ToString();

  std::ofstream(dir + "/huge") << std::string(8u << 20, 'x');  // refused by its size
  auto huge = ReadTokenFile(dir + "/huge");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find(dir + "/huge': token too long"), std::string::npos)
      << huge.status().ToString();

  auto missing = ReadTokenFile(dir + "/none");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/none' cannot be read"), std::string::npos)
      << missing.status().ToString();
}

}  // namespace
}  // namespace gpufeed::daemon
