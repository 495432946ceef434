// The one monotonic clock of gpufeed's timings (stage busy times, waits,
// benchmark figures): seconds on the steady clock, for differences only.
#ifndef GPUFEED_COMMON_CLOCK_H_
#define GPUFEED_COMMON_CLOCK_H_

#include <chrono>

namespace gpufeed {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_CLOCK_H_
