// Status and Result<T>: how gpufeed reports expected failures (a bad file, a
// corrupt chunk, a missing dataset) as values, in the manner of LevelDB.
//
// Contract: a non-OK Status always carries a message that names the thing that
// failed (file, dataset, chunk index, peer) and what was wrong with it, so it
// can be shown to a user as is. Programmer errors (a precondition the caller
// could have checked) are assertions, not Statuses.
#ifndef GPUFEED_STATUS_H_
#define GPUFEED_STATUS_H_

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace gpufeed {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is malformed (bad spec, bad option)
  kNotFound,         // a file or dataset that was named does not exist
  kUnsupported,      // well-formed input that gpufeed cannot handle
  kCorrupt,          // stored bytes are damaged: truncated file, bad chunk
  kIOError,          // the OS failed a read or write
  kInternal,         // a library we call failed in a way we did not expect
};

// Returns a short stable name ("NotFound", ...) for logs and JSON.
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corrupt: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context` ("while X: ...").
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Holds either a T or a non-OK Status. Accessing the value of a failed Result
// is a programmer error (asserts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result constructed from an OK Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace gpufeed

// Propagates a non-OK Status from an expression to the caller.
#define GPUFEED_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::gpufeed::Status gpufeed_status_ = (expr);        \
    if (!gpufeed_status_.ok()) return gpufeed_status_; \
  } while (0)

#endif  // GPUFEED_STATUS_H_
