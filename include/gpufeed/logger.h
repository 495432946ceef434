// Logger: where the library says what a caller should know but that is no
// error (a corrupt sample replaced, direct I/O unavailable, a statistics
// sidecar that does not match its file). One Logger travels in the options
// (OpenOptions, LoaderOptions, FeedOptions); null is the default logger,
// which writes "gpufeed: MESSAGE" to stderr. The daemon plugs its
// structured event log in; a test captures what it is told. The library
// prints nothing else.
#ifndef GPUFEED_LOGGER_H_
#define GPUFEED_LOGGER_H_

#include <memory>
#include <string_view>

namespace gpufeed {

enum class LogLevel { kInfo, kWarning };
std::string_view LogLevelName(LogLevel level);  // "info", "warn"

class Logger {
 public:
  virtual ~Logger() = default;
  // `event`: a short name ("sample_replaced", "direct_io_unavailable",
  // "stats_sidecar_ignored"); `message`: the whole sentence. Thread-safe:
  // called from the library's threads.
  virtual void Log(LogLevel level, std::string_view event, std::string_view message) = 0;
};

// "gpufeed: MESSAGE" on stderr, one line a call.
std::shared_ptr<Logger> StderrLogger();
// `logger`, or the stderr logger when it is null.
Logger& LoggerOr(const std::shared_ptr<Logger>& logger);

}  // namespace gpufeed

#endif  // GPUFEED_LOGGER_H_
