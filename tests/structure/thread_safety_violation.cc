// Must NOT compile under clang's -Wthread-safety -Werror=thread-safety: a
// guarded field written without its mutex (tests/structure/check_thread_safety.sh).
#include "common/mutex.h"

namespace {
struct Counter {
  gpufeed::Mutex mu;
  int value GUARDED_BY(mu) = 0;
  void Locked() {
    gpufeed::MutexLock lock(&mu);
    ++value;
  }
#ifdef GPUFEED_VIOLATE
  void Unlocked() { ++value; }
#endif
};
}  // namespace

int main() {
  Counter c;
  c.Locked();
  return 0;
}
