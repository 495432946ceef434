// What the C API's files (capi/*.cc) share: the options object behind
// gpufeed_options, and how an entry point reports a failure. Not installed.
#ifndef GPUFEED_CAPI_C_API_INTERNAL_H_
#define GPUFEED_CAPI_C_API_INTERNAL_H_

#include <exception>
#include <new>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpufeed/c_api.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/open_source.h"
#include "gpufeed/status.h"

struct gpufeed_error {
  gpufeed_code code;
  std::string message;
};

// Every option is a row of the table in capi/options.cc (its name, type,
// range and the field below it sets).
struct gpufeed_options {
  gpufeed::SourceOptions source;
  std::string order = "block";
  std::string io;  // "" : OpenOptions' default (auto, or GPUFEED_IO)
  // OpenOptions::allow_paths, ':'-separated (split at open).
  std::string allow_paths;
  bool feed = false;
  gpufeed::FeedOptions feed_options;
  std::string dtype = "float32", layout = "NCHW", input_layout = "NCHW";
  std::string image_transform = "random_resized_crop";  // encoded image datasets (checked at open)
  std::string share = "auto";                           // SourceOptions::share (checked at open)
  std::string decode = "auto";                          // DecodeDevice (checked at open)
};

namespace gpufeed::capi {

// Sets *error (when asked for) and returns the code.
inline gpufeed_code Fail(gpufeed_error** error, gpufeed_code code, std::string message) {
  if (error != nullptr) *error = new (std::nothrow) gpufeed_error{code, std::move(message)};
  return code;
}

inline gpufeed_code Fail(gpufeed_error** error, const Status& s) {
  return Fail(error, static_cast<gpufeed_code>(static_cast<int>(s.code())), s.message());
}

// Every entry point that can fail runs its body through this: no exception
// (bad_alloc, a TBB or Asio throw we did not expect) crosses the C ABI.
template <typename F>
gpufeed_code Guard(gpufeed_error** error, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(error, GPUFEED_INTERNAL, std::string("gpufeed: unexpected exception: ") + e.what());
  } catch (...) {
    return Fail(error, GPUFEED_INTERNAL, "gpufeed: unexpected exception");
  }
}

// The integer options' ranges (the table's), checked when a loader opens:
// the typed setters cannot fail. InvalidArgument names the setter and the
// value it was given (-1 through an unsigned setter shows as -1).
Status CheckIntegerOptions(const gpufeed_options& o);

// Bytes from a size as every door takes it: a whole number ("1073741824"),
// or a number (a fraction too: "1.5GiB") and a unit, binary (K, KiB, M,
// MiB, G, GiB, T, TiB) or decimal (KB, MB, GB, TB), in any case, spaces
// around. InvalidArgument saying what it takes (without the text: the
// caller names its option and value).
Result<uint64_t> ParseByteSize(std::string_view text);

// Option `option` of the table (a size: pool_bytes, cache_bytes) from text:
// ParseByteSize, "auto" where the option has a meaning for it, its range.
// gpufeed_options_set (so Python) and the CLI's flags read sizes with it.
Result<uint64_t> ParseBytesOption(std::string_view option, std::string_view text);

}  // namespace gpufeed::capi

#endif  // GPUFEED_CAPI_C_API_INTERNAL_H_
