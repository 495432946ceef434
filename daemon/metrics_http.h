// The daemon's Prometheus endpoint: GET /metrics over HTTP/1.1, served with
// Boost.Beast on the server's io_context. One request per connection; the
// request may not exceed kMaxHeaderBytes of headers nor carry a body, and the
// whole exchange ends within kDeadline (a client that sends nothing, or
// sends slowly, is closed then). Anything else gets 400/404/405/431. With a
// token (RequireToken), every request must carry "Authorization: Bearer
// <token>" (compared in constant time), else 401. Plain HTTP: the token
// travels in clear, like the daemon's own.
#ifndef GPUFEED_DAEMON_METRICS_HTTP_H_
#define GPUFEED_DAEMON_METRICS_HTTP_H_

#include <chrono>
#include <functional>
#include <string>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include "gpufeed/status.h"

namespace gpufeed::daemon {

class MetricsHttp {
 public:
  static constexpr size_t kMaxHeaderBytes = 8192;
  static constexpr std::chrono::seconds kDeadline{5};

  using Strand = boost::asio::strand<boost::asio::io_context::executor_type>;
  // `render` builds the body of each response; `on_error(what)` is told of
  // requests refused (for the log). Both run on the connection's strand.
  // Accept's handlers run on `control`, where Close() must be called too.
  MetricsHttp(boost::asio::io_context& io, Strand control, std::function<std::string()> render,
              std::function<void(const std::string&)> on_error);

  // Binds "HOST:PORT", or "PORT" / ":PORT" on 127.0.0.1 (port 0: any), and
  // listens; endpoint() then says where.
  Status Bind(const std::string& listen);
  const std::string& endpoint() const { return endpoint_; }
  // Before Accept(). Empty: requests need no token.
  void RequireToken(std::string token) { token_ = std::move(token); }
  bool requires_token() const { return !token_.empty(); }
  // Accepts connections until Close() (both on the control strand).
  void Accept();
  void Close();

 private:
  boost::asio::io_context& io_;
  Strand control_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  std::function<void(const std::string&)> on_error_;
  std::string endpoint_;
  std::string token_;  // set before Accept(), read-only afterwards
};

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_METRICS_HTTP_H_
