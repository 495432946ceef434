// Terminal progress bar / plain progress lines.
#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace gpufeed::cli {

Progress::Progress(std::string label)
    : label_(std::move(label)), tty_(::isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}

void Progress::Update(uint64_t done, uint64_t total) {
  const auto now = std::chrono::steady_clock::now();
  const double frac = total ? static_cast<double>(done) / total : 1.0;
  const double secs = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    if (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    drawn_ = true;
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %llu/%llu %.1fs", label_.c_str(), fill,
                 "##############################", kWidth - fill, "", frac * 100, static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total), secs);
    std::fflush(stderr);
    return;
  }
  const int decile = static_cast<int>(frac * 10);
  if (decile == last_decile_) return;
  last_decile_ = decile;
  std::fprintf(stderr, "%s: %d%% (%llu/%llu samples, %.1fs)\n", label_.c_str(), decile * 10,
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total), secs);
}

void Progress::Finish() {
  if (tty_ && drawn_) std::fprintf(stderr, "\n");
}

}  // namespace gpufeed::cli
