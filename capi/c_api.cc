// The C API (include/gpufeed/c_api.h) over the C++ library, a file per
// topic: this one the version and error objects; capi/options.cc the option
// table; capi/loader.cc the loader (open, epochs, next, state, stats);
// capi/batch.cc batches and their DLPack export. What they share is
// capi/core.h and capi/c_api_internal.h.
#include "gpufeed/c_api.h"

#include <cstdlib>

#include "capi/c_api_internal.h"
#include "gpufeed/version.h"

extern "C" {

const char* gpufeed_version(void) { return GPUFEED_VERSION; }
int gpufeed_c_api_version(void) { return GPUFEED_C_API_VERSION; }

gpufeed_code gpufeed_error_code(const gpufeed_error* e) { return e != nullptr ? e->code : GPUFEED_OK; }
const char* gpufeed_error_message(const gpufeed_error* e) { return e != nullptr ? e->message.c_str() : ""; }
void gpufeed_error_destroy(gpufeed_error* e) { delete e; }
void gpufeed_free(void* p) { std::free(p); }

const char* gpufeed_code_name(gpufeed_code code) {
  switch (code) {
    case GPUFEED_OK:
      return "OK";
    case GPUFEED_INVALID_ARGUMENT:
      return "InvalidArgument";
    case GPUFEED_NOT_FOUND:
      return "NotFound";
    case GPUFEED_UNSUPPORTED:
      return "Unsupported";
    case GPUFEED_CORRUPT:
      return "Corrupt";
    case GPUFEED_IO_ERROR:
      return "IOError";
    case GPUFEED_INTERNAL:
      return "Internal";
    case GPUFEED_END:
      return "End";
    case GPUFEED_TIMEOUT:
      return "Timeout";
    case GPUFEED_INTERRUPTED:
      return "Interrupted";
  }
  return "Unknown";
}

}  // extern "C"
