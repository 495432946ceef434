#include "daemon/metrics_http.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <memory>

#include "loader/remote/address.h"
#include "loader/remote/protocol.h"

namespace gpufeed::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// One connection: read one request (bounded), write one response, close.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(asio::ip::tcp::socket socket, std::function<std::string()> render,
           std::function<void(const std::string&)> on_error, const std::string& token)
      : stream_(std::move(socket)), render_(std::move(render)), on_error_(std::move(on_error)), token_(token) {}

  void Start() {
    parser_.header_limit(MetricsHttp::kMaxHeaderBytes);
    parser_.body_limit(0);
    stream_.expires_after(MetricsHttp::kDeadline);  // covers the read and the write
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return Close();  // nothing (complete) was asked
    }
    if (ec) {
      const bool too_big = ec == http::error::header_limit || ec == http::error::buffer_overflow;
      on_error_(std::string("metrics request refused: ") + ec.message());
      return Reply(too_big ? http::status::request_header_fields_too_large : http::status::bad_request,
                   too_big ? "request headers too large\n" : "malformed request: try GET /metrics\n", 11);
    }
    const auto& req = parser_.get();
    if (!token_.empty()) {
      // Only the Bearer scheme, the whole token, compared in constant time.
      const beast::string_view field = req[http::field::authorization];
      const std::string_view given(field.data(), field.size());
      constexpr std::string_view kScheme = "Bearer ";
      const bool ok = given.size() > kScheme.size() && given.substr(0, kScheme.size()) == kScheme &&
                      ConstantTimeEquals(token_, given.substr(kScheme.size()));
      if (!ok) {
        on_error_(given.empty() ? "metrics request without a token" : "metrics request with a wrong token");
        return Reply(http::status::unauthorized,
                     "the daemon has a token: send \"Authorization: Bearer <token>\" (--token-file)\n", req.version());
      }
    }
    if (parser_.content_length().value_or(0) != 0 || parser_.chunked()) {
      return Reply(http::status::bad_request, "a request body is not accepted: try GET /metrics\n", req.version());
    }
    const beast::string_view target = req.target();
    const bool metrics = target == "/metrics" || target.starts_with("/metrics?");
    if (!metrics) return Reply(http::status::not_found, "not found: try GET /metrics\n", req.version());
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      return Reply(http::status::method_not_allowed, "only GET /metrics\n", req.version());
    }
    Reply(http::status::ok, render_(), req.version(), req.method() == http::verb::head);
  }

  void Reply(http::status status, std::string body, unsigned version, bool head = false) {
    response_.result(status);
    response_.version(version);
    response_.set(http::field::server, "gpufeed");
    response_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
    if (status == http::status::method_not_allowed) response_.set(http::field::allow, "GET, HEAD");
    if (status == http::status::unauthorized) response_.set(http::field::www_authenticate, "Bearer realm=\"gpufeed\"");
    response_.keep_alive(false);
    response_.body() = std::move(body);
    response_.prepare_payload();
    if (head) response_.body().clear();  // Content-Length stays that of GET
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) { self->Close(); });
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{MetricsHttp::kMaxHeaderBytes};
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> response_;
  std::function<std::string()> render_;
  std::function<void(const std::string&)> on_error_;
  const std::string token_;  // empty: none required
};

}  // namespace

MetricsHttp::MetricsHttp(asio::io_context& io, Strand control, std::function<std::string()> render,
                         std::function<void(const std::string&)> on_error)
    : io_(io),
      control_(std::move(control)),
      acceptor_(io),
      render_(std::move(render)),
      on_error_(std::move(on_error)) {}

Status MetricsHttp::Bind(const std::string& listen) {
  // A port alone binds loopback: /metrics names every client, and reaching
  // it from elsewhere is a choice to write out ("0.0.0.0:9108").
  const bool port_only = !listen.empty() && listen.find_first_not_of("0123456789") == std::string::npos;
  auto a = ParseHostPort(port_only ? ":" + listen : listen);
  if (!a.ok()) return a.status().WithContext("--metrics");
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(a->host, ec);
  if (ec) return Status::InvalidArgument("--metrics: '" + a->host + "' is not an IP address");
  asio::ip::tcp::endpoint ep(ip, a->port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(16, ec);
  if (ec) return Status::IOError("--metrics " + listen + ": " + ec.message());
  endpoint_ = a->host + ":" + std::to_string(acceptor_.local_endpoint().port());
  return Status::Ok();
}

void MetricsHttp::Accept() {
  // The accepted socket gets a strand of its own; the handler runs on
  // control_, which also runs Close() (Asio objects are not thread-safe).
  acceptor_.async_accept(
      asio::make_strand(io_),
      asio::bind_executor(control_, [this](const boost::system::error_code& ec, asio::ip::tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
        if (!ec) std::make_shared<Exchange>(std::move(socket), render_, on_error_, token_)->Start();
        Accept();
      }));
}

void MetricsHttp::Close() {
  boost::system::error_code ec;
  acceptor_.close(ec);
}

}  // namespace gpufeed::daemon
