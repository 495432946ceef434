// ListObjects (hdf5io/io/object_list.h): ListObjectsV2 pages through libcurl.
#include "hdf5io/io/object_list.h"

#include <curl/curl.h>
#include <fnmatch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>

#include "hdf5io/io/http_file.h"
#include "hdf5io/io/object_store.h"

namespace gpufeed::io {
namespace {

constexpr const char* kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr size_t kMaxPageBytes = size_t{64} << 20;  // a page of 1000 keys is well under 1 MiB

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsHdf5Name(std::string_view k) {
  return EndsWith(k, ".h5") || EndsWith(k, ".hdf5") || EndsWith(k, ".hdf") || EndsWith(k, ".nc");
}

// A query value as SigV4's canonical query wants it (RFC 3986 unreserved
// kept, everything else %XX): sent so, libcurl signs it as sent.
std::string EncodeQuery(std::string_view v) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : v) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// XML text with its five entities and numeric references decoded.
std::string XmlText(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    unsigned long code = 0;
    if (ent == "amp")
      code = '&';
    else if (ent == "lt")
      code = '<';
    else if (ent == "gt")
      code = '>';
    else if (ent == "quot")
      code = '"';
    else if (ent == "apos")
      code = '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      const std::string num(ent.substr(ent[1] == 'x' ? 2 : 1));
      code = std::strtoul(num.c_str(), nullptr, ent[1] == 'x' ? 16 : 10);
    }
    if (code == 0 || code > 0x10FFFF) {
      out += s[i];
      continue;
    }
    if (code < 0x80) {  // UTF-8
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
    i = semi;
  }
  return out;
}

// The text of each <tag>...</tag> in `body` from `from` to `to`.
std::vector<std::string> XmlAll(std::string_view body, const std::string& tag, size_t from = 0,
                                size_t to = std::string_view::npos) {
  std::vector<std::string> out;
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  to = std::min(to, body.size());
  for (size_t a = body.find(open, from); a != std::string_view::npos && a < to; a = body.find(open, a + 1)) {
    const size_t s = a + open.size();
    const size_t b = body.find(close, s);
    if (b == std::string_view::npos || b > to) break;
    out.push_back(XmlText(body.substr(s, b - s)));
  }
  return out;
}

size_t OnBody(char* p, size_t size, size_t nmemb, void* user) {
  auto* body = static_cast<std::string*>(user);
  const size_t len = size * nmemb;
  if (body->size() + len > kMaxPageBytes) return 0;  // a hostile or broken server: stopped
  body->append(p, len);
  return len;
}

struct Page {
  std::vector<std::string> keys;
  std::string next;  // the continuation token; empty on the last page
};

// A ListObjectsV2 page's body (2xx) into *body, the request retried as an
// object read is; the HTTP status into *code.
Status GetPage(const ObjectTarget& t, const RemoteOptions& o, const std::string& url, const std::string& named,
               std::string* out, long* status) {
  std::string& body = *out;
  long& code = *status;
  curl_slist* headers = nullptr;
  if (t.sign) {
    headers = curl_slist_append(headers, (std::string("x-amz-content-sha256: ") + kEmptySha256).c_str());
    if (!t.token.empty()) headers = curl_slist_append(headers, ("x-amz-security-token: " + t.token).c_str());
  }
  CURL* e = curl_easy_init();
  if (e == nullptr) {
    curl_slist_free_all(headers);
    return Status::Internal(named + ": libcurl: cannot make a handle");
  }
  Status failed;
  for (int attempt = 0;; ++attempt) {
    body.clear();
    char errbuf[CURL_ERROR_SIZE] = {};
    curl_easy_reset(e);
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(o.timeout_ms));
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_ms));
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (!o.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, o.ca_file.c_str());
    if (!o.ca_dir.empty()) curl_easy_setopt(e, CURLOPT_CAPATH, o.ca_dir.c_str());
    if (headers != nullptr) curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
    if (t.sign) {
      curl_easy_setopt(e, CURLOPT_AWS_SIGV4, t.sigv4.c_str());
      curl_easy_setopt(e, CURLOPT_USERPWD, t.userpwd.c_str());
    }
    const CURLcode rc = curl_easy_perform(e);
    code = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    std::string why;
    bool transient = false;
    if (rc == CURLE_PEER_FAILED_VERIFICATION) {
      failed =
          Status::InvalidArgument(named + ": listing the bucket: " + curl_easy_strerror(rc) +
                                  (errbuf[0] ? std::string(": ") + errbuf : "") + "; " + UntrustedCertificateHint(o));
      break;
    }
    if (rc != CURLE_OK) {
      why = std::string(curl_easy_strerror(rc)) + (errbuf[0] ? std::string(": ") + errbuf : "");
      transient = rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_SEND_ERROR ||
                  rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE;
    } else if (code == 429 || code == 408 || code >= 500) {
      const auto s3 = XmlAll(body, "Code");
      why = "HTTP " + std::to_string(code) + (s3.empty() ? "" : " " + s3[0]);
      transient = true;
    } else if (code < 200 || code >= 300) {
      const auto s3 = XmlAll(body, "Code"), msg = XmlAll(body, "Message");
      std::string text = named + ": listing the bucket: HTTP " + std::to_string(code);
      if (!s3.empty()) text += " " + s3[0];
      if (!msg.empty()) text += " (" + msg[0].substr(0, 200) + ")";
      if (code == 403 || code == 401) {
        failed = Status::InvalidArgument(text + "; access denied with credentials from " + t.credentials_from +
                                         " (docs/object_storage.md lists what is read)");
      } else if (code == 404) {
        failed = Status::NotFound(text + "; no such bucket");
      } else {
        failed = Status::IOError(text);
      }
      break;
    } else {
      break;  // 2xx
    }
    if (!transient || attempt >= o.retries) {
      failed = Status::IOError(named + ": listing the bucket: " + why +
                               (attempt > 0 ? " (after " + std::to_string(attempt + 1) + " attempts)" : "") +
                               (transient ? "; GPUFEED_REMOTE_RETRIES and GPUFEED_REMOTE_TIMEOUT_MS set how many "
                                            "retries and how long each may take"
                                          : ""));
      break;
    }
    const int base = std::min(5000, o.backoff_ms << std::min(attempt, 10));
    std::this_thread::sleep_for(std::chrono::milliseconds(base));
  }
  curl_easy_cleanup(e);
  curl_slist_free_all(headers);
  return failed;
}

// One ListObjectsV2 page: its keys and the next page's token.
Result<Page> ListPage(const ObjectTarget& t, const RemoteOptions& o, const std::string& query,
                      const std::string& named) {
  std::string body;
  long code = 0;
  GPUFEED_RETURN_IF_ERROR(GetPage(t, o, t.bucket_url + "?" + query, named, &body, &code));
  if (body.find("<ListBucketResult") == std::string::npos) {
    return Status::Corrupt(named + ": listing the bucket: HTTP " + std::to_string(code) +
                           " without a ListBucketResult (is AWS_ENDPOINT_URL an S3-compatible store?)");
  }
  Page page;
  for (size_t a = body.find("<Contents>"); a != std::string::npos; a = body.find("<Contents>", a + 1)) {
    const size_t b = body.find("</Contents>", a);
    if (b == std::string::npos) break;
    auto key = XmlAll(body, "Key", a, b);
    if (!key.empty()) page.keys.push_back(std::move(key[0]));
  }
  const auto truncated = XmlAll(body, "IsTruncated");
  if (!truncated.empty() && truncated[0] == "true") {
    const auto next = XmlAll(body, "NextContinuationToken");
    if (next.empty() || next[0].empty()) {
      return Status::Corrupt(named + ": listing the bucket: a truncated page without a NextContinuationToken");
    }
    page.next = next[0];
  }
  return page;
}

}  // namespace

bool IsObjectListSpec(std::string_view spec) {
  if (!IsRemoteUrl(spec)) return false;
  const size_t scheme = spec.find("://");
  const bool s3 = scheme == 2;
  std::string_view path = spec.substr(scheme + 3);
  if (!s3) path = path.substr(0, path.find_first_of("?#"));  // a query is not a pattern
  if (path.find_first_of(s3 ? "*?[" : "*[") != std::string_view::npos) return true;
  if (!s3) return false;
  const size_t slash = path.find('/');
  return slash == std::string_view::npos || slash + 1 == path.size() || path.back() == '/';
}

Result<std::vector<std::string>> ListObjects(std::string_view spec) {
  const std::string named = DisplayUrl(spec);
  auto target = ResolveBucket(spec);
  if (!target.ok()) return target.status();
  auto max_objects = EnvLong("GPUFEED_REMOTE_MAX_OBJECTS", 100000, 1, 100000000, "a number");
  if (!max_objects.ok()) return max_objects.status();
  auto page_keys = EnvLong("GPUFEED_REMOTE_LIST_PAGE", 1000, 1, 1000, "a number");
  if (!page_keys.ok()) return page_keys.status();
  auto options = RemoteOptions::FromEnv();
  if (!options.ok()) return options.status();
  GPUFEED_RETURN_IF_ERROR(RemoteInit());

  const std::string& key = target->key;
  const size_t g = key.find_first_of("*?[");
  const bool glob = g != std::string::npos;
  const std::string prefix = glob ? key.substr(0, g) : key;
  // One level, as a local glob or directory reads: '/' ends a listed key
  // unless the pattern itself goes deeper.
  const bool one_level = !glob || key.find('/', g) == std::string::npos;
  const uint64_t max = static_cast<uint64_t>(*max_objects);
  // Keys listed that do not match count too (bounded at 10x), so a pattern
  // over a huge prefix ends in an error, not hours of paging.
  const uint64_t max_listed = max * 10;

  std::vector<std::string> out;
  std::set<std::string> tokens;
  std::string token;
  uint64_t listed = 0;
  do {
    std::string query;  // sorted by name, as SigV4's canonical query is
    if (!token.empty()) query += "continuation-token=" + EncodeQuery(token) + "&";
    if (one_level) query += "delimiter=%2F&";
    query += "list-type=2&max-keys=" + std::to_string(*page_keys) + "&prefix=" + EncodeQuery(prefix);
    auto page = ListPage(*target, *options, query, named);
    if (!page.ok()) return page.status();
    for (std::string& k : page->keys) {
      ++listed;
      const bool match =
          glob ? ::fnmatch(key.c_str(), k.c_str(), FNM_PATHNAME) == 0 : k.size() > prefix.size() && IsHdf5Name(k);
      if (match) out.push_back("s3://" + target->bucket + "/" + k);
    }
    if (out.size() > max) {
      return Status::InvalidArgument(named + ": more than " + std::to_string(max) +
                                     " objects match (GPUFEED_REMOTE_MAX_OBJECTS=" + std::to_string(max) +
                                     "): name a narrower prefix or pattern, or raise GPUFEED_REMOTE_MAX_OBJECTS");
    }
    if (listed > max_listed) {
      return Status::InvalidArgument(named + ": " + std::to_string(listed) + " keys listed under '" + prefix +
                                     "' and still more (10x GPUFEED_REMOTE_MAX_OBJECTS=" + std::to_string(max) +
                                     "): name a longer prefix before the pattern's first '*', '?' or '['");
    }
    if (!page->next.empty() && !tokens.insert(page->next).second) {
      return Status::Corrupt(named +
                             ": listing the bucket: the server repeated a continuation token (a listing "
                             "that never ends)");
    }
    token = page->next;
  } while (!token.empty());
  if (out.empty()) {
    return Status::NotFound(named +
                            (glob ? ": the pattern matches no objects"
                                  : ": no .h5 / .hdf5 / .hdf / .nc objects directly under the prefix") +
                            " (" + std::to_string(listed) + " keys listed under '" + prefix + "')");
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace gpufeed::io
