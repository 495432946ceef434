// A blocking socket connection with deadlines: what RemoteLoader uses, and
// what tests use to send the daemon raw (and wrong) bytes. Every wait is a
// poll() in slices of at most 100 ms that also checks a cancel flag, so a
// stream's Stop() never waits for the network.
#ifndef GPUFEED_DAEMON_CONN_H_
#define GPUFEED_DAEMON_CONN_H_

#include <atomic>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "loader/remote/address.h"
#include "loader/remote/protocol.h"
#include "gpufeed/status.h"

namespace gpufeed::daemon {

class Conn {
 public:
  Conn() = default;
  ~Conn() { Close(); }
  Conn(Conn&& o) noexcept;
  Conn& operator=(Conn&& o) noexcept;

  // On a unix: address, refuses (InvalidArgument, nothing sent) a server
  // that runs as another uid than this process's effective uid.
  static Result<Conn> Connect(const Address& a, int timeout_ms);
  bool is_open() const { return fd_ >= 0; }
  const std::string& peer() const { return peer_; }
  void set_cancel(const std::atomic<bool>* c) { cancel_ = c; }

  // Fail with IOError naming the peer on a socket error, the peer closing
  // (or resetting: "the daemon is gone ..., resume with ..."), cancellation,
  // or `timeout_ms` without progress.
  Status SendAll(std::span<const std::byte> bytes, int timeout_ms);
  Status RecvAll(std::span<std::byte> bytes, int timeout_ms);
  // A control frame: header, payload, checksum (payload at most
  // kMaxControlPayload).
  Status SendFrame(FrameType type, std::span<const std::byte> payload, int timeout_ms);
  // The same, with file descriptor `fd` attached to the frame's first bytes
  // (SCM_RIGHTS; Unix sockets only). The descriptor stays the caller's.
  Status SendFrameWithFd(FrameType type, std::span<const std::byte> payload, int fd, int timeout_ms);
  struct Frame {
    FrameHeader header;
    std::vector<std::byte> payload;  // decompressed
  };
  Status RecvFrame(Frame* f, uint32_t max_payload, int timeout_ms);

  void ShutdownBoth();  // wakes a blocked send/recv in another thread
  void Close();

 private:
  Status Gone(const std::string& what) const;
  // A Unix socket's listener runs as this process's effective uid
  // (SO_PEERCRED); else InvalidArgument naming the socket and both uids.
  Status CheckPeerUid() const;
  Status ForeignVersionError(const HeaderBytes& hb, uint16_t theirs, const Status& mismatch, int timeout_ms);
  int fd_ = -1;
  std::string peer_;
  const std::atomic<bool>* cancel_ = nullptr;
};

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_CONN_H_
