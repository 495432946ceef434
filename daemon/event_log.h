// The daemon's structured log: one line per event, through spdlog, as
// key=value pairs (logfmt, the default) or one JSON object a line:
//   ts=2026-11-23T16:05:01.123Z level=info event=accept client=3
//   {"ts":"2026-11-23T16:05:01.123Z","level":"info","event":"accept","client":"3"}
// Levels debug < info < warn < error; events below the chosen level are
// dropped. Thread-safe.
#ifndef GPUFEED_DAEMON_EVENT_LOG_H_
#define GPUFEED_DAEMON_EVENT_LOG_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufeed/status.h"

namespace spdlog {
class logger;
}

namespace gpufeed::daemon {

class EventLog {
 public:
  // format "kv" or "json"; level "debug", "info", "warn" or "error"; `sink`
  // receives each line (no newline) one call at a time, empty: stderr.
  static Result<std::unique_ptr<EventLog>> Create(const std::string& format, const std::string& level,
                                                  std::function<void(std::string_view)> sink);
  ~EventLog();

  // `fields` is "key=value ..." as Kv() builds them (values quoted and
  // escaped where needed).
  void Log(const char* level, const std::string& event, const std::string& fields);

 private:
  EventLog(bool json, std::shared_ptr<spdlog::logger> logger);
  bool json_;
  std::shared_ptr<spdlog::logger> logger_;
};

// "key=value" with the value quoted and escaped when it has spaces or quotes.
std::string Kv(const std::string& key, const std::string& value);
std::string Kv(const std::string& key, uint64_t value);
// The pairs of a Kv() string, unescaped (what the JSON format writes).
std::vector<std::pair<std::string, std::string>> SplitKv(std::string_view fields);

}  // namespace gpufeed::daemon

#endif  // GPUFEED_DAEMON_EVENT_LOG_H_
