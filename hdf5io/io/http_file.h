// An object on S3 or an HTTP(S) server read as a RandomAccessFile
// (hdf5io/io/file.h): byte-range GETs through libcurl's multi interface, many
// in flight on reused connections, driven by one transfer thread per object.
//
// At open a one-byte ranged GET learns the object's size and version (its
// ETag, else its Last-Modified); every later request carries If-Match and
// its response's ETag is checked too, so an object replaced while it is
// read is an error naming it, never bytes of two versions. A request has a
// time limit; a reset, a timeout, 5xx or throttling (429, 503 SlowDown) is
// retried with exponential backoff (jittered), and after the last retry the
// read fails with the object, the status and the attempts. 403 and 404 fail
// at once, naming the object, the status, the server's error code and where
// the credentials came from (never the credentials).
//
// WillRead(key) starts a read the loader will make soon (its plan's order,
// as the O_DIRECT read-ahead does), up to a window of them; ReadAt(key)
// takes it when it gets there, waiting only for what is still in flight.
// The window is sized by what the link holds (hdf5io/io/remote_window.h:
// twice the measured latency x completion rate, from 64, within 16 and
// 1024 requests, a quarter of the open-file limit, and the bytes budget).
// It bounds the requests in the link; finished reads not yet taken may hold
// as many buffers again (within the budget), and read_ahead(), which the
// loader's hints follow, counts both.
//
// Cancellation (common/cancel.h): a read or read-ahead takes the cancel
// flag of the thread that asks for it (a loader's stream sets one). Once it
// is set the request ends at once, in flight or waiting for a retry, with an
// error saying it was cancelled; no retry starts, and a read asked for on a
// cancelled thread is not made. A read-ahead cancelled so is made again when
// a reader whose work is not cancelled takes or hints it.
//
// Options from the environment (RemoteOptions::FromEnv):
//   GPUFEED_REMOTE_IN_FLIGHT   read-ahead requests kept in flight, fixed (1 to 1024;
//                              unset: sized by the link, from 64)
//   GPUFEED_REMOTE_IN_FLIGHT_MB the sized window's bytes budget: requests x
//                              their size (default 128, 1 to 65536)
//   GPUFEED_REMOTE_TIMEOUT_MS  per request (default 30000)
//   GPUFEED_REMOTE_RETRIES     retries of a failed request (default 5)
//   GPUFEED_REMOTE_BACKOFF_MS  the first retry's wait, doubled each time up to 5 s (default 100)
//   GPUFEED_REMOTE_STATS=1     each object's requests, retries, bytes and
//                              requests in flight on stderr when it closes
//   AWS_CA_BUNDLE, else CURL_CA_BUNDLE, else SSL_CERT_FILE
//                              a PEM file of the CAs https servers are checked
//                              against (unset: the system's store); SSL_CERT_DIR
//                              a directory of them. A server whose certificate
//                              none of them signed is refused, naming these.
//
// Thread safety: every method may be called from any number of threads.
#ifndef GPUFEED_IO_HTTP_FILE_H_
#define GPUFEED_IO_HTTP_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gpufeed/status.h"
#include "hdf5io/io/file.h"

namespace gpufeed::io {

// The integer environment variable `name` in [lo, hi], or `def` when unset or
// empty; InvalidArgument naming the variable, its value and `what` it counts
// ("milliseconds") otherwise. The remote transport's and listing's knobs.
Result<long> EnvLong(const char* name, long def, long lo, long hi, const char* what);

// libcurl's global state, set up once (any thread, any number of calls).
Status RemoteInit();

struct RemoteOptions {
  unsigned in_flight = 64;                         // the window: the first, or always when in_flight_fixed
  bool in_flight_fixed = false;                    // GPUFEED_REMOTE_IN_FLIGHT was set
  uint64_t in_flight_bytes = uint64_t{128} << 20;  // the sized window's budget
  int timeout_ms = 30000;
  int connect_timeout_ms = 10000;
  int retries = 5;
  int backoff_ms = 100;
  // TLS: the CA file and directory https servers are checked against
  // (empty: libcurl's, the system's store) and the variable that named them.
  std::string ca_file, ca_dir, ca_from;
  static Result<RemoteOptions> FromEnv();
};

// What to say when an https server's certificate is not trusted (libcurl's
// CURLE_PEER_FAILED_VERIFICATION): which CAs were used and how to name others.
std::string UntrustedCertificateHint(const RemoteOptions& options);

struct RemoteStats {
  uint64_t requests = 0, retries = 0, bytes = 0;
  uint64_t peak_in_flight = 0;
  double mean_in_flight = 0;  // over the time any request was in flight
  unsigned window = 0;        // the read-ahead's window now: requests in the link
  unsigned peak_window = 0;   // the largest it was
  double latency_s = 0;       // the mean request latency it was last sized by (0: fixed, or not yet)
};

class RemoteFile final : public RandomAccessFile {
 public:
  // spec: s3://BUCKET/KEY or http(s)://HOST/PATH (object_store.h says how
  // it is addressed and signed).
  static Result<std::unique_ptr<RemoteFile>> Open(std::string_view spec, const RemoteOptions& options);
  ~RemoteFile() override;

  int64_t ReadAt(uint64_t key, std::byte* dst, size_t n, uint64_t offset) const override;
  void WillRead(uint64_t key, uint64_t offset, size_t n) const override;
  unsigned read_ahead() const override;

  // [offset, offset + n) into dst: the bytes delivered (< n only at the
  // object's end), or a Status naming the object.
  Result<size_t> Read(uint64_t offset, std::byte* dst, size_t n) const;

  uint64_t size() const;
  // The ETag (else Last-Modified) seen at open; empty when the server sent
  // neither (a change is then seen only in the size).
  const std::string& version() const;
  const std::string& named() const;  // the URL as errors name it (no secrets)
  // The URL requests go to (endpoint included; may hold a presigned query:
  // compared, never shown).
  const std::string& address() const;
  RemoteStats stats() const;

  struct Impl;

 private:
  explicit RemoteFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The object as a FileIdentity: its size, and its version hashed into ino
// (a plan made in the probe's process is used only on the same version).
FileIdentity RemoteIdentity(const RemoteFile& f);

}  // namespace gpufeed::io

#endif  // GPUFEED_IO_HTTP_FILE_H_
