// FirstError: what a parallel job reports when several of its workers fail —
// the first error kept, the later ones dropped — and a flag the other
// workers poll to stop early. Thread-safe.
#ifndef GPUFEED_COMMON_FIRST_ERROR_H_
#define GPUFEED_COMMON_FIRST_ERROR_H_

#include <atomic>
#include <utility>

#include "common/mutex.h"
#include "gpufeed/status.h"

namespace gpufeed {

class FirstError {
 public:
  // Keeps `s` if it is the first error; an OK status is ignored.
  void Set(Status s) EXCLUDES(mu_) {
    if (s.ok()) return;
    MutexLock lock(&mu_);
    if (first_.ok()) first_ = std::move(s);
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The first error (OK when none was set).
  Status Get() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return first_;
  }

 private:
  mutable Mutex mu_;
  Status first_ GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_FIRST_ERROR_H_
