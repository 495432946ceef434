// What an s3:// or http(s):// spec resolves to: the URL (path-style on an
// S3-compatible endpoint, virtual-host on AWS), the signing, where the
// credentials come from, and that no secret is in what errors show. The
// requests themselves run against a real server in
// tests/python/test_object_storage.py.
#include "hdf5io/io/object_store.h"

#include "gpufeed/file_list.h"
#include "hdf5io/io/object_list.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace gpufeed::io {
namespace {

// The AWS_* environment of one case, restored after it.
class AwsEnv {
 public:
  using Vars = std::map<std::string, std::string>;
  explicit AwsEnv(const Vars& set) {
    for (const char* k : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                          "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
                          "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"}) {
      if (const char* v = ::getenv(k)) saved_[k] = v;
      ::unsetenv(k);
    }
    ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null", 1);
    ::setenv("AWS_CONFIG_FILE", "/dev/null", 1);
    for (const auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~AwsEnv() {
    for (const char* k : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                          "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
                          "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"}) {
      ::unsetenv(k);
    }
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST(ObjectStoreTest, WhatIsAnObjectUrl) {
  EXPECT_TRUE(IsRemoteUrl("s3://b/k.h5"));
  EXPECT_TRUE(IsRemoteUrl("HTTPS://host/k.h5"));
  EXPECT_TRUE(IsRemoteUrl("http://127.0.0.1:9000/b/k.h5"));
  EXPECT_FALSE(IsRemoteUrl("train.h5"));
  EXPECT_FALSE(IsRemoteUrl("/data/s3://x.h5"));
  EXPECT_FALSE(IsRemoteUrl("file:/images"));
}

// Many objects: a glob or an s3:// prefix (ending '/'); a presigned URL's
// query is no pattern; the door's IsMultiFileSpec says the same.
TEST(ObjectStoreTest, WhatNamesManyObjects) {
  for (const char* many : {"s3://b/dir/*.h5", "s3://b/dir/part-0[0-3].h5", "s3://b/dir/part-?.h5", "s3://b/dir/",
                           "s3://b/", "s3://b", "https://host/dir/*.h5"}) {
    EXPECT_TRUE(IsObjectListSpec(many)) << many;
    EXPECT_TRUE(IsMultiFileSpec(many)) << many;
  }
  for (const char* one : {"s3://b/dir/k.h5", "s3://b/k.h5:/images", "https://host/k.h5?X-Amz-Signature=ab&x=1",
                          "http://127.0.0.1:9000/b/k.h5"}) {
    EXPECT_FALSE(IsObjectListSpec(one)) << one;
    EXPECT_FALSE(IsMultiFileSpec(one)) << one;
  }
  EXPECT_FALSE(IsObjectListSpec("dir/*.h5"));  // a local glob is ExpandFiles' own
}

TEST(ObjectStoreTest, ABucketIsResolvedForItsListing) {
  AwsEnv env(
      {{"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"}, {"AWS_ACCESS_KEY_ID", "K"}, {"AWS_SECRET_ACCESS_KEY", "S"}});
  auto t = ResolveBucket("s3://data/dir/*.h5");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->bucket_url, "http://127.0.0.1:9000/data");
  EXPECT_EQ(t->bucket, "data");
  EXPECT_EQ(t->key, "dir/*.h5");
  EXPECT_TRUE(t->sign);
  auto top = ResolveBucket("s3://data/");
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  EXPECT_EQ(top->key, "");
  auto https = ResolveBucket("https://host/dir/*.h5");
  ASSERT_FALSE(https.ok());
  EXPECT_NE(https.status().message().find("no listing"), std::string::npos) << https.status().message();
  auto listed = ListObjects("https://host/dir/*.h5");  // refused before any request
  ASSERT_FALSE(listed.ok());
  EXPECT_NE(listed.status().message().find(".txt"), std::string::npos) << listed.status().message();
}

TEST(ObjectStoreTest, DisplayDropsUserInfoAndQuery) {
  EXPECT_EQ(DisplayUrl("https://user:secret@host/p.h5?X-Amz-Signature=abc"), "https://host/p.h5");
  EXPECT_EQ(DisplayUrl("s3://bucket/key.h5"), "s3://bucket/key.h5");
  EXPECT_EQ(DisplayUrl("https://host/a@b.h5"), "https://host/a@b.h5");
}

TEST(ObjectStoreTest, AnEndpointIsAddressedPathStyleAndSigned) {
  AwsEnv env({{"AWS_ACCESS_KEY_ID", "AKID"},
              {"AWS_SECRET_ACCESS_KEY", "SECRETVALUE"},
              {"AWS_SESSION_TOKEN", "TOKENVALUE"},
              {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
              {"AWS_REGION", "eu-west-3"}});
  auto t = ResolveObject("s3://bucket/dir/a b+c.h5");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->url, "http://127.0.0.1:9000/bucket/dir/a%20b%2Bc.h5");
  EXPECT_TRUE(t->sign);
  EXPECT_EQ(t->sigv4, "aws:amz:eu-west-3:s3");
  EXPECT_EQ(t->userpwd, "AKID:SECRETVALUE");
  EXPECT_EQ(t->token, "TOKENVALUE");
  EXPECT_EQ(t->credentials_from.find("SECRETVALUE"), std::string::npos);
}

TEST(ObjectStoreTest, AwsIsAddressedByBucketHostInItsRegion) {
  AwsEnv env(AwsEnv::Vars{{"AWS_DEFAULT_REGION", "us-west-2"}});
  auto t = ResolveObject("s3://my-bucket/k.h5");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->url, "https://my-bucket.s3.us-west-2.amazonaws.com/k.h5");
  EXPECT_FALSE(t->sign);  // no credentials anywhere: unsigned (public objects)
  EXPECT_NE(t->credentials_from.find("unsigned"), std::string::npos);
}

TEST(ObjectStoreTest, AProfileIsReadFromTheCredentialsFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("gpufeed-aws-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string creds = (dir / "credentials").string();
  std::ofstream(creds) << "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n"
                       << "[work]\n aws_access_key_id=W \naws_secret_access_key = WS\naws_session_token = WT\n";
  {
    AwsEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds}, {"AWS_PROFILE", "work"}});
    auto t = ResolveObject("s3://b/k.h5");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->userpwd, "W:WS");
    EXPECT_EQ(t->token, "WT");
    EXPECT_EQ(t->credentials_from, "profile work in " + creds);
  }
  {
    AwsEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds}});
    auto t = ResolveObject("s3://b/k.h5");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->userpwd, "D:DS");
  }
  {
    AwsEnv env({{"AWS_SHARED_CREDENTIALS_FILE", creds}, {"AWS_PROFILE", "nope"}});
    auto t = ResolveObject("s3://b/k.h5");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("[nope]"), std::string::npos) << t.status().message();
  }
  std::filesystem::remove_all(dir);
}

TEST(ObjectStoreTest, BadSpecsAndHalfCredentialsAreClearErrors) {
  AwsEnv env(AwsEnv::Vars{{"AWS_SECRET_ACCESS_KEY", "ONLYSECRET"}});
  auto half = ResolveObject("s3://b/k.h5");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  EXPECT_EQ(half.status().message().find("ONLYSECRET"), std::string::npos);
  for (const char* bad : {"s3://", "s3://bucket", "s3://bucket/", "s3://bu$ket/k.h5", "https://host", "train.h5"}) {
    auto t = ResolveObject(bad);
    EXPECT_FALSE(t.ok()) << bad;
  }
}

}  // namespace
}  // namespace gpufeed::io
