// Parsing of daemon addresses.
#include "loader/remote/address.h"

#include <charconv>

#include <sys/un.h>

namespace gpufeed::daemon {

std::string Address::ToString() const {
  return kind == Kind::kUnix ? "unix:" + path : "tcp://" + host + ":" + std::to_string(port);
}

Result<Address> ParseHostPort(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) {
    return Status::InvalidArgument("address '" + std::string(text) + "': expected HOST:PORT");
  }
  Address a;
  a.kind = Address::Kind::kTcp;
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (!host.empty()) a.host = std::string(host);
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || port.empty() || p > 65535) {
    return Status::InvalidArgument("address '" + std::string(text) + "': port '" + std::string(port) +
                                   "' is not a number in [0, 65535]");
  }
  a.port = static_cast<uint16_t>(p);
  return a;
}

Result<Address> ParseAddress(std::string_view text) {
  if (text.starts_with("unix:")) {
    Address a;
    a.path = std::string(text.substr(5));
    if (a.path.empty()) return Status::InvalidArgument("address '" + std::string(text) + "': empty socket path");
    if (a.path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return Status::InvalidArgument("address '" + std::string(text) + "': socket path longer than " +
                                     std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
    }
    return a;
  }
  if (text.starts_with("tcp://")) return ParseHostPort(text.substr(6));
  return Status::InvalidArgument("address '" + std::string(text) + "': expected unix:PATH or tcp://HOST:PORT");
}

}  // namespace gpufeed::daemon
