// Object storage addresses: what an s3:// or http(s):// data spec names, and
// how requests for it are made (URL, SigV4 signing, credentials). No I/O
// here but reading the user's credential files; the requests themselves are
// hdf5io/io/http_file.h's.
//
// Read from the environment and the files users already have, as the AWS
// tools do (docs/object_storage.md):
//   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
//   else AWS_PROFILE (default "default") in AWS_SHARED_CREDENTIALS_FILE
//   (default ~/.aws/credentials); none: unsigned requests (public objects).
//   AWS_REGION, AWS_DEFAULT_REGION, else the profile's region in
//   AWS_CONFIG_FILE (~/.aws/config), else us-east-1.
//   AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL: an S3-compatible store, addressed
//   path-style (ENDPOINT/BUCKET/KEY); unset: https://BUCKET.s3.REGION.amazonaws.com/KEY.
// A secret never appears in a message: Display() drops user info and the
// query (a presigned URL's signature) from what errors name.
#ifndef GPUFEED_IO_OBJECT_STORE_H_
#define GPUFEED_IO_OBJECT_STORE_H_

#include <string>
#include <string_view>

#include "gpufeed/status.h"

namespace gpufeed::io {

// s3://, http:// or https:// (case-insensitive scheme).
bool IsRemoteUrl(std::string_view path);

// `url` as errors may name it: scheme, host and path; no user info, no query.
std::string DisplayUrl(std::string_view url);

struct ObjectTarget {
  std::string named;             // what the user wrote, as DisplayUrl shows it
  std::string url;               // the HTTP(S) URL requests go to (may carry a presigned query)
  bool sign = false;             // SigV4 with the credentials below
  std::string sigv4;             // CURLOPT_AWS_SIGV4's "aws:amz:REGION:s3"
  std::string userpwd;           // "KEY:SECRET" (a secret: never logged)
  std::string token;             // AWS_SESSION_TOKEN, sent as x-amz-security-token
  std::string credentials_from;  // "AWS_ACCESS_KEY_ID", "profile p in FILE", "none (unsigned)": for errors
  std::string region;
  // s3:// only: the bucket, the key (as written, not encoded) and the
  // bucket's own URL (ENDPOINT/BUCKET, or https://BUCKET.s3.REGION.amazonaws.com),
  // where a listing is asked for.
  std::string bucket, key, bucket_url;
};

// What `spec` (s3://BUCKET/KEY or http(s)://HOST/PATH) is fetched from, with
// the credentials of the environment. InvalidArgument naming what is wrong
// (no bucket, no key, a profile that is not in the file, a key without its
// secret).
Result<ObjectTarget> ResolveObject(std::string_view spec);

// As ResolveObject, for s3://BUCKET/[PREFIX] (the key may be empty): what a
// listing of the bucket is asked with. InvalidArgument for an http(s) URL
// (a server that is not a store has no listing).
Result<ObjectTarget> ResolveBucket(std::string_view spec);

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_OBJECT_STORE_H_
