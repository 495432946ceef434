// Testing hooks of the daemon (`gpufeed serve`): clients that misbehave on
// purpose, for the benchmark and tests of its memory bound with clients that
// never read (`gpufeed bench serve`). Not for applications: RemoteLoader is
// the client.
#ifndef GPUFEED_DAEMON_TESTING_H_
#define GPUFEED_DAEMON_TESTING_H_

#include <memory>
#include <string>

#include "gpufeed/loader.h"
#include "gpufeed/status.h"

namespace gpufeed::testing {

class RawDaemonClient {
 public:
  enum class Kind {
    kIdle,     // sends HELLO, then nothing
    kStalled,  // sends HELLO and the most credit the protocol allows, then never reads
  };
  // Connects to `address` ("unix:PATH" or "tcp://HOST:PORT") and asks for a
  // stream of the daemon's first dataset with `loader`'s options.
  static Result<RawDaemonClient> Connect(const std::string& address, const LoaderOptions& loader, Kind kind,
                                         int timeout_ms = 5000);
  RawDaemonClient(RawDaemonClient&&) noexcept;
  RawDaemonClient& operator=(RawDaemonClient&&) noexcept;
  ~RawDaemonClient();  // closes the connection

 private:
  struct Impl;
  explicit RawDaemonClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::testing

#endif  // GPUFEED_DAEMON_TESTING_H_
