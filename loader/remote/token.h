// The daemon's shared secret, read from a token file the same way by the
// daemon and its clients: trailing whitespace trimmed, empty and over-long
// tokens refused with the file named.
#ifndef GPUFEED_DAEMON_TOKEN_H_
#define GPUFEED_DAEMON_TOKEN_H_

#include <string>

#include "gpufeed/status.h"

namespace gpufeed::daemon {

Result<std::string> ReadTokenFile(const std::string& path);

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_TOKEN_H_
