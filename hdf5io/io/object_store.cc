// Object addresses and credentials (hdf5io/io/object_store.h).
#include "hdf5io/io/object_store.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <utility>
#include <vector>

namespace gpufeed::io {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string Trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

std::string HomeFile(const char* env, const char* rel) {
  if (std::string v = Env(env); !v.empty()) return v;
  const std::string home = Env("HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

// The [section] of an INI file (the AWS files' format) as key = value
// lines; nullopt when the file or the section is absent.
std::optional<std::vector<std::pair<std::string, std::string>>> IniSection(const std::string& path,
                                                                           const std::string& section) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  bool inside = false, found = false;
  std::vector<std::pair<std::string, std::string>> out;
  while (std::getline(in, line)) {
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = Trim(std::string_view(t).substr(1, t.size() - 2)) == section;
      found = found || inside;
      continue;
    }
    if (!inside) continue;
    const size_t eq = t.find('=');
    if (eq == std::string::npos) continue;
    out.emplace_back(Lower(Trim(std::string_view(t).substr(0, eq))), Trim(std::string_view(t).substr(eq + 1)));
  }
  if (!found) return std::nullopt;
  return out;
}

std::string Lookup(const std::vector<std::pair<std::string, std::string>>& kv, std::string_view key) {
  for (const auto& [k, v] : kv) {
    if (k == key) return v;
  }
  return {};
}

// Path segments percent-encoded as SigV4's canonical URI wants them (RFC
// 3986 unreserved characters and '/' kept).
std::string EncodeKey(std::string_view key) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

struct Creds {
  std::string key, secret, token, from;
};

Result<Creds> LoadCredentials(const std::string& profile, bool profile_named) {
  Creds c;
  const std::string key = Env("AWS_ACCESS_KEY_ID"), secret = Env("AWS_SECRET_ACCESS_KEY");
  if (!key.empty() || !secret.empty()) {
    if (key.empty() || secret.empty()) {
      return Status::InvalidArgument(std::string(key.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID") +
                                     " is set but " + (key.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY") +
                                     " is not: set both (or neither, to use AWS_PROFILE's credentials file)");
    }
    c.key = key;
    c.secret = secret;
    c.token = Env("AWS_SESSION_TOKEN");
    c.from = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY";
    return c;
  }
  const std::string file = HomeFile("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  auto section = file.empty() ? std::nullopt : IniSection(file, profile);
  if (!section) {
    if (profile_named) {
      return Status::InvalidArgument("AWS_PROFILE=" + profile + ": no [" + profile + "] section in " +
                                     (file.empty() ? std::string("~/.aws/credentials (HOME is not set)") : file) +
                                     " (set AWS_SHARED_CREDENTIALS_FILE, or AWS_ACCESS_KEY_ID and "
                                     "AWS_SECRET_ACCESS_KEY)");
    }
    c.from = "none (unsigned requests: no AWS_ACCESS_KEY_ID, no [default] in " +
             (file.empty() ? std::string("~/.aws/credentials") : file) + ")";
    return c;
  }
  c.key = Lookup(*section, "aws_access_key_id");
  c.secret = Lookup(*section, "aws_secret_access_key");
  c.token = Lookup(*section, "aws_session_token");
  c.from = "profile " + profile + " in " + file;
  if (c.key.empty() || c.secret.empty()) {
    return Status::InvalidArgument(c.from + ": needs both aws_access_key_id and aws_secret_access_key");
  }
  return c;
}

}  // namespace

bool IsRemoteUrl(std::string_view path) {
  const std::string head = Lower(path.substr(0, 8));
  return head.starts_with("s3://") || head.starts_with("http://") || head.starts_with("https://");
}

std::string DisplayUrl(std::string_view url) {
  std::string_view u = url.substr(0, url.find_first_of("?#"));
  const size_t scheme = u.find("://");
  if (scheme == std::string_view::npos) return std::string(u);
  const size_t host = scheme + 3;
  const size_t slash = u.find('/', host);
  const size_t at = u.substr(0, slash).rfind('@');
  if (at != std::string_view::npos && at >= host) {
    return std::string(u.substr(0, host)) + std::string(u.substr(at + 1));
  }
  return std::string(u);
}

namespace {

// ResolveObject and ResolveBucket: `need_key` false takes s3://BUCKET/ and
// s3://BUCKET/PREFIX (a listing's address: bucket_url).
Result<ObjectTarget> Resolve(std::string_view spec, bool need_key) {
  ObjectTarget t;
  t.named = DisplayUrl(spec);
  if (!IsRemoteUrl(spec)) {
    return Status::InvalidArgument(t.named + ": not an object URL (expected s3://BUCKET/KEY or https://HOST/PATH)");
  }
  const std::string scheme = Lower(spec.substr(0, spec.find("://")));
  const std::string profile_env = Env("AWS_PROFILE");
  const std::string profile = profile_env.empty() ? "default" : profile_env;
  std::string region = Env("AWS_REGION");
  if (region.empty()) region = Env("AWS_DEFAULT_REGION");
  if (region.empty()) {
    const std::string config = HomeFile("AWS_CONFIG_FILE", ".aws/config");
    if (!config.empty()) {
      auto sec = IniSection(config, profile == "default" ? "default" : "profile " + profile);
      if (sec) region = Lookup(*sec, "region");
    }
  }
  if (region.empty()) region = "us-east-1";
  t.region = region;
  if (scheme != "s3") {
    // http(s): fetched as named, unsigned (a presigned URL carries its own
    // signature in its query).
    if (spec.find('/', spec.find("://") + 3) == std::string_view::npos) {
      return Status::InvalidArgument(t.named + ": names a host but no object (expected https://HOST/PATH.h5)");
    }
    t.url = std::string(spec);
    t.credentials_from = "none (an http(s) URL is fetched unsigned)";
    return t;
  }
  std::string_view rest = spec.substr(5);
  const size_t slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  const std::string key = slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash + 1));
  if (bucket.empty() || (need_key && key.empty())) {
    return Status::InvalidArgument(t.named + ": expected s3://BUCKET/KEY (" +
                                   (bucket.empty() ? "no bucket" : "no key after the bucket") + ")");
  }
  for (char c : bucket) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_')) {
      return Status::InvalidArgument(t.named + ": bucket '" + bucket +
                                     "' has characters a bucket name cannot (letters, digits, '-', '.', '_')");
    }
  }
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (!endpoint.empty()) {
    if (!IsRemoteUrl(endpoint) || Lower(endpoint).starts_with("s3://")) {
      return Status::InvalidArgument("AWS_ENDPOINT_URL='" + DisplayUrl(endpoint) +
                                     "': expected http://HOST[:PORT] or https://HOST[:PORT]");
    }
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    t.bucket_url = endpoint + "/" + bucket;  // path-style: what S3-compatible stores take
    t.url = t.bucket_url + "/" + EncodeKey(key);
  } else {
    t.bucket_url = "https://" + bucket + ".s3." + region + ".amazonaws.com";
    t.url = t.bucket_url + "/" + EncodeKey(key);
  }
  t.bucket = bucket;
  t.key = key;
  auto creds = LoadCredentials(profile, !profile_env.empty());
  if (!creds.ok()) return creds.status();
  t.credentials_from = creds->from;
  if (!creds->key.empty()) {
    t.sign = true;
    t.sigv4 = "aws:amz:" + region + ":s3";
    t.userpwd = creds->key + ":" + creds->secret;
    t.token = creds->token;
  }
  return t;
}

}  // namespace

Result<ObjectTarget> ResolveObject(std::string_view spec) { return Resolve(spec, true); }

Result<ObjectTarget> ResolveBucket(std::string_view spec) {
  if (!Lower(spec.substr(0, 5)).starts_with("s3://")) {
    return Status::InvalidArgument(DisplayUrl(spec) +
                                   ": only an s3:// address can be listed (an http(s) server has no listing); "
                                   "name the objects one by one, or in a .txt file of URLs, one a line");
  }
  return Resolve(spec, false);
}

}  // namespace gpufeed::io
