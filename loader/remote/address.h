// Daemon addresses: "unix:PATH" or "tcp://HOST:PORT", parsed once for the
// server and the client alike.
#ifndef GPUFEED_DAEMON_ADDRESS_H_
#define GPUFEED_DAEMON_ADDRESS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "gpufeed/status.h"

namespace gpufeed::daemon {

struct Address {
  enum class Kind { kUnix, kTcp } kind = Kind::kUnix;
  std::string path;                // kUnix
  std::string host = "127.0.0.1";  // kTcp; empty in the text means loopback
  uint16_t port = 0;               // kTcp
  std::string ToString() const;    // "unix:/p" or "tcp://h:p"
};

// Fails with InvalidArgument naming the text and the expected forms.
Result<Address> ParseAddress(std::string_view text);
// "HOST:PORT" (the metrics endpoint).
Result<Address> ParseHostPort(std::string_view text);

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_ADDRESS_H_
