// A Logger (gpufeed/logger.h) that keeps what it is told, for tests that
// check what the library says besides its errors.
#ifndef GPUFEED_TESTS_TESTING_CAPTURING_LOGGER_H_
#define GPUFEED_TESTS_TESTING_CAPTURING_LOGGER_H_

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gpufeed/logger.h"

namespace gpufeed::testing {

class CapturingLogger final : public Logger {
 public:
  void Log(LogLevel, std::string_view event, std::string_view message) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(event, message);
  }
  // (event, message) pairs, in order.
  std::vector<std::pair<std::string, std::string>> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> events_;
};

}  // namespace gpufeed::testing

#endif  // GPUFEED_TESTS_TESTING_CAPTURING_LOGGER_H_
