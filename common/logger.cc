// The default Logger (gpufeed/logger.h).
#include "gpufeed/logger.h"

#include <cstdio>
#include <string>

namespace gpufeed {
namespace {

class Stderr final : public Logger {
 public:
  void Log(LogLevel, std::string_view, std::string_view message) override {
    // One write a line, so lines of several threads do not interleave.
    const std::string line = "gpufeed: " + std::string(message) + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
};

}  // namespace

std::string_view LogLevelName(LogLevel level) { return level == LogLevel::kWarning ? "warn" : "info"; }

std::shared_ptr<Logger> StderrLogger() {
  static const std::shared_ptr<Logger> logger = std::make_shared<Stderr>();
  return logger;
}

Logger& LoggerOr(const std::shared_ptr<Logger>& logger) { return logger ? *logger : *StderrLogger(); }

}  // namespace gpufeed
