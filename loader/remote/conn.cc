// Blocking socket I/O with deadlines and cancellation (poll in short slices).
#include "loader/remote/conn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

namespace gpufeed::daemon {
namespace {

constexpr int kSliceMs = 100;

std::string Errno(int e) { return std::strerror(e); }

using Clock = std::chrono::steady_clock;

}  // namespace

Conn::Conn(Conn&& o) noexcept : fd_(std::exchange(o.fd_, -1)), peer_(std::move(o.peer_)), cancel_(o.cancel_) {}
Conn& Conn::operator=(Conn&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    peer_ = std::move(o.peer_);
    cancel_ = o.cancel_;
  }
  return *this;
}

Result<Conn> Conn::Connect(const Address& a, int timeout_ms) {
  Conn c;
  c.peer_ = a.ToString();
  if (a.kind == Address::Kind::kUnix) {
    c.fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c.fd_ < 0) return Status::IOError(c.peer_ + ": socket: " + Errno(errno));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, a.path.c_str(), a.path.size() + 1);
    if (::connect(c.fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 && errno != EINPROGRESS && errno != EAGAIN) {
      return Status::IOError(c.peer_ + ": connect: " + Errno(errno) + " (is `gpufeed serve` running there?)");
    }
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(a.port);
    if (int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
      return Status::IOError(c.peer_ + ": cannot resolve host: " + gai_strerror(rc));
    }
    c.fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = c.fd_ < 0 ? -1 : ::connect(c.fd_, res->ai_addr, res->ai_addrlen);
    const int err = errno;
    ::freeaddrinfo(res);
    if (c.fd_ < 0) return Status::IOError(c.peer_ + ": socket: " + Errno(err));
    if (rc != 0 && err != EINPROGRESS) {
      return Status::IOError(c.peer_ + ": connect: " + Errno(err) + " (is `gpufeed serve` listening there?)");
    }
    int one = 1;
    ::setsockopt(c.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  // Wait for the connection to complete.
  pollfd p{c.fd_, POLLOUT, 0};
  const int r = ::poll(&p, 1, timeout_ms);
  if (r == 0) return Status::IOError(c.peer_ + ": connect timed out after " + std::to_string(timeout_ms) + " ms");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(c.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (r < 0 || err != 0) {
    return Status::IOError(c.peer_ + ": connect: " + Errno(r < 0 ? errno : err) +
                           " (is `gpufeed serve` listening there?)");
  }
  if (a.kind == Address::Kind::kUnix) GPUFEED_RETURN_IF_ERROR(c.CheckPeerUid());
  int buf = 4 << 20;  // a batch or more in flight per syscall
  ::setsockopt(c.fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  return c;
}

// Whoever can create a socket file where this process looks (a shared
// directory, a path another user guessed) could otherwise receive the HELLO
// with its token, a shared-memory descriptor and the client's trust in its
// error text. The kernel's record of the listener's uid settles it before
// any byte is sent. Root gets no exception: a root daemon's socket is 0600
// too, so only root's own clients could reach it.
Status Conn::CheckPeerUid() const {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return Status::IOError(peer_ + ": cannot read the server's uid (SO_PEERCRED): " + Errno(errno) +
                           "; nothing was sent");
  }
  if (peer.uid != ::geteuid()) {
    return Status::InvalidArgument(peer_ + ": the process listening there runs as uid " + std::to_string(peer.uid) +
                                   ", not as this process's uid " + std::to_string(::geteuid()) +
                                   "; nothing was sent. A Unix socket's server must be your own: remove the "
                                   "socket or connect to a daemon you started");
  }
  return Status::Ok();
}

Status Conn::SendAll(std::span<const std::byte> bytes, int timeout_ms) {
  size_t done = 0;
  auto last = Clock::now();
  while (done < bytes.size()) {
    if (cancel_ != nullptr && cancel_->load()) return Status::IOError(peer_ + ": cancelled");
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      last = Clock::now();
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (errno == EPIPE || errno == ECONNRESET) return Gone("send: " + Errno(errno));
      return Status::IOError(peer_ + ": send: " + Errno(errno));
    }
    if (Clock::now() - last > std::chrono::milliseconds(timeout_ms)) {
      return Status::IOError(peer_ + ": send stalled for " + std::to_string(timeout_ms) + " ms");
    }
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, kSliceMs);
  }
  return Status::Ok();
}

// The daemon stopped without a SHUTDOWN frame (killed, crashed): the error
// says what to do in the caller's terms, C++ and Python alike.
Status Conn::Gone(const std::string& what) const {
  return Status::IOError(peer_ + ": the daemon is gone (" + what +
                         "); restart it and resume with Resume(state()) (Python: "
                         "loader.load_state_dict(state) with a state_dict() you saved)");
}

Status Conn::RecvAll(std::span<std::byte> bytes, int timeout_ms) {
  size_t done = 0;
  auto last = Clock::now();
  while (done < bytes.size()) {
    if (cancel_ != nullptr && cancel_->load()) return Status::IOError(peer_ + ": cancelled");
    const ssize_t n = ::recv(fd_, bytes.data() + done, bytes.size() - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      last = Clock::now();
      continue;
    }
    if (n == 0) return Gone(done ? "the connection closed in the middle of a frame" : "the connection closed");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (errno == ECONNRESET) return Gone("recv: " + Errno(errno));
      return Status::IOError(peer_ + ": recv: " + Errno(errno));
    }
    if (Clock::now() - last > std::chrono::milliseconds(timeout_ms)) {
      return Status::IOError(peer_ + ": no data for " + std::to_string(timeout_ms) + " ms");
    }
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, kSliceMs);
  }
  return Status::Ok();
}

Status Conn::SendFrame(FrameType type, std::span<const std::byte> payload, int timeout_ms) {
  return SendAll(MakeFrame(type, payload), timeout_ms);
}

Status Conn::SendFrameWithFd(FrameType type, std::span<const std::byte> payload, int fd, int timeout_ms) {
  const std::vector<std::byte> frame = MakeFrame(type, payload);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<std::byte*>(frame.data()), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  const auto start = Clock::now();
  for (;;) {
    if (cancel_ != nullptr && cancel_->load()) return Status::IOError(peer_ + ": cancelled");
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n > 0) {  // the descriptor went with the first byte; the rest is plain
      return SendAll(std::span(frame).subspan(static_cast<size_t>(n)), timeout_ms);
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return Status::IOError(peer_ + ": sendmsg (passing the shared memory): " + Errno(errno));
    }
    if (Clock::now() - start > std::chrono::milliseconds(timeout_ms)) {
      return Status::IOError(peer_ + ": send stalled for " + std::to_string(timeout_ms) + " ms");
    }
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, kSliceMs);
  }
}

Status Conn::RecvFrame(Frame* f, uint32_t max_payload, int timeout_ms) {
  HeaderBytes hb;
  GPUFEED_RETURN_IF_ERROR(RecvAll(hb, timeout_ms));
  auto h = ParseHeader(hb, max_payload, max_payload, peer_);
  if (!h.ok()) {
    const uint16_t theirs = HeaderVersion(hb);
    if (theirs == 0 || theirs == kVersion) return h.status();
    return ForeignVersionError(hb, theirs, h.status(), timeout_ms);
  }
  f->header = *h;
  std::vector<std::byte> wire(h->payload_bytes);
  GPUFEED_RETURN_IF_ERROR(RecvAll(wire, timeout_ms));
  GPUFEED_RETURN_IF_ERROR(VerifyChecksum(*h, hb, wire, peer_));
  if (h->flags & kFlagZstd) {
    f->payload.resize(h->raw_bytes);
    GPUFEED_RETURN_IF_ERROR(Decompress(wire, f->payload, peer_));
  } else {
    f->payload = std::move(wire);
  }
  return Status::Ok();
}

// A peer of another protocol version answered: when it is an ERROR frame
// (whose layout every version shares), its message says why; the result
// names both versions and the side to upgrade either way.
Status Conn::ForeignVersionError(const HeaderBytes& hb, uint16_t theirs, const Status& mismatch, int timeout_ms) {
  HeaderBytes ours = hb;
  std::memcpy(ours.data() + 4, &kVersion, 2);
  auto h = ParseHeader(ours, kMaxControlPayload, kMaxControlPayload, peer_);
  if (!h.ok() || h->type != FrameType::kError || (h->flags & kFlagZstd)) return mismatch;
  std::vector<std::byte> payload(h->payload_bytes);
  if (!RecvAll(payload, timeout_ms).ok() || !VerifyChecksum(*h, hb, payload, peer_).ok()) return mismatch;
  auto e = DecodeError(payload);
  if (!e.ok()) return mismatch;
  return Status::Unsupported(VersionMismatch(peer_, theirs) + " (it says: " + e->message + ")");
}

void Conn::ShutdownBoth() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void Conn::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace gpufeed::daemon
