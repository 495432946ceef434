// gpufeed/daemon_testing.h: raw protocol clients that misbehave on purpose.
#include "gpufeed/daemon_testing.h"

#include "loader/remote/address.h"
#include "loader/remote/conn.h"
#include "loader/remote/protocol.h"

namespace gpufeed::testing {

struct RawDaemonClient::Impl {
  daemon::Conn conn;
};

Result<RawDaemonClient> RawDaemonClient::Connect(const std::string& address, const LoaderOptions& loader, Kind kind,
                                                 int timeout_ms) {
  auto addr = daemon::ParseAddress(address);
  if (!addr.ok()) return addr.status();
  daemon::Hello h;
  h.loader = loader;
  auto c = daemon::Conn::Connect(*addr, timeout_ms);
  if (!c.ok()) return c.status();
  GPUFEED_RETURN_IF_ERROR(c->SendFrame(daemon::FrameType::kHello, daemon::EncodeHello(h), timeout_ms));
  if (kind == Kind::kStalled) {
    GPUFEED_RETURN_IF_ERROR(
        c->SendFrame(daemon::FrameType::kCredit, daemon::EncodeCredit(daemon::kMaxCredits), timeout_ms));
  }
  return RawDaemonClient(std::make_unique<Impl>(Impl{std::move(*c)}));
}

RawDaemonClient::RawDaemonClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RawDaemonClient::RawDaemonClient(RawDaemonClient&&) noexcept = default;
RawDaemonClient& RawDaemonClient::operator=(RawDaemonClient&&) noexcept = default;
RawDaemonClient::~RawDaemonClient() = default;

}  // namespace gpufeed::testing
