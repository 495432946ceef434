// The HDF5 fork gate (fork_gate.h): a count of threads in a section, a flag
// that holds new sections back while a fork waits, one mutex.
#include "hdf5io/hdf5/fork_gate.h"

#include <unistd.h>

#include "common/mutex.h"

namespace gpufeed::h5 {
namespace {

struct Gate {
  Mutex mu;
  CondVar cv;
  int inside GUARDED_BY(mu) = 0;        // threads in a section
  bool forking GUARDED_BY(mu) = false;  // a fork is waiting or under way
};

Gate& TheGate() {
  static Gate* g = new Gate();  // never destroyed: sections may end during exit
  return *g;
}

thread_local int t_depth = 0;  // this thread's nested sections
// Set in a child of ForkOutsideHdf5: the only thread there, whose copy of the
// gate's condition variable may be mid-operation of a parent thread; the
// gate is not used again in it.
bool g_in_child = false;

// In the child of a fork made holding `mu`: the child's copy stays locked (the
// child never touches the gate again, and its copy of the condition variable
// may be mid-operation of a parent thread), but the caller no longer holds it.
// Not analysed: it releases nothing, it only says that the hold ends here.
void AbandonInChild(Mutex* mu) RELEASE(mu) NO_THREAD_SAFETY_ANALYSIS {}

}  // namespace

Hdf5Section::Hdf5Section() {
  if (t_depth++ > 0 || g_in_child) return;
  Gate& g = TheGate();
  MutexLock lock(&g.mu);
  while (g.forking) g.cv.Wait(&g.mu);
  ++g.inside;
}

Hdf5Section::~Hdf5Section() {
  if (--t_depth > 0 || g_in_child) return;
  Gate& g = TheGate();
  {
    MutexLock lock(&g.mu);
    --g.inside;
  }
  g.cv.SignalAll();
}

pid_t ForkOutsideHdf5(std::chrono::milliseconds wait) {
  if (g_in_child) return ::fork();  // a child is single-threaded: nothing to wait for
  Gate& g = TheGate();
  // Locked and unlocked by hand: the child returns with its copy still held.
  g.mu.Lock();
  // Another fork in progress: wait for it (forks are quick).
  while (g.forking) g.cv.Wait(&g.mu);
  g.forking = true;
  const int mine = t_depth > 0 ? 1 : 0;  // the caller's own section, if any
  // Bounded: after `wait` it forks anyway (a reader stuck in HDF5).
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (g.inside > mine) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    g.cv.WaitFor(&g.mu, deadline - now);
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    g_in_child = true;
    AbandonInChild(&g.mu);  // the child never touches the gate again
    return 0;
  }
  g.forking = false;
  g.mu.Unlock();
  g.cv.SignalAll();
  return pid;
}

}  // namespace gpufeed::h5
