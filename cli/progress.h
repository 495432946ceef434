// Progress reporting for long commands: a redrawn bar on a terminal, a plain
// line every 10% otherwise (logs, CI).
#ifndef GPUFEED_CLI_PROGRESS_H_
#define GPUFEED_CLI_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <string>

namespace gpufeed::cli {

class Progress {
 public:
  explicit Progress(std::string label);
  void Update(uint64_t done, uint64_t total);
  void Finish();  // ends the bar's line on a terminal

 private:
  std::string label_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace gpufeed::cli

#endif  // GPUFEED_CLI_PROGRESS_H_
