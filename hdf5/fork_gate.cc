// The HDF5 fork gate (fork_gate.h): a count of threads in a section, a flag
// that holds new sections back while a fork waits, one mutex.
#include "hdf5/fork_gate.h"

#include <unistd.h>

#include <condition_variable>
#include <mutex>

namespace gpufeed::h5 {
namespace {

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;        // threads in a section (GUARDED_BY(mu))
  bool forking = false;  // a fork is waiting or under way (GUARDED_BY(mu))
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

}  // namespace

Hdf5Section::Hdf5Section() {
  if (t_depth++ > 0 || g_in_child) return;
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  g.cv.wait(lock, [&] { return !g.forking; });
  ++g.inside;
}

Hdf5Section::~Hdf5Section() {
  if (--t_depth > 0 || g_in_child) return;
  Gate& g = TheGate();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    --g.inside;
  }
  g.cv.notify_all();
}

pid_t ForkOutsideHdf5(std::chrono::milliseconds wait) {
  if (g_in_child) return ::fork();  // a child is single-threaded: nothing to wait for
  Gate& g = TheGate();
  std::unique_lock<std::mutex> lock(g.mu);
  // Another fork in progress: wait for it (forks are quick).
  g.cv.wait(lock, [&] { return !g.forking; });
  g.forking = true;
  const int mine = t_depth > 0 ? 1 : 0;  // the caller's own section, if any
  g.cv.wait_for(lock, wait, [&] { return g.inside <= mine; });
  const pid_t pid = ::fork();
  if (pid == 0) {
    g_in_child = true;
    (void)lock.release();  // the child never touches the gate again
    return 0;
  }
  g.forking = false;
  lock.unlock();
  g.cv.notify_all();
  return pid;
}

}  // namespace gpufeed::h5
