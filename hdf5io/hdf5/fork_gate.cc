// The HDF5 fork gate (fork_gate.h): a count of threads in a section, a flag
// that holds new sections back while a fork waits, one mutex.
#include "hdf5io/hdf5/fork_gate.h"

#include <hdf5.h>
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

// The fork, made inside an HDF5 call (ForkOutsideHdf5): H5Piterate calls
// this with HDF5's global lock held by the calling thread. The child runs
// its work here and never returns into HDF5.
struct ForkCall {
  const std::function<void()>* child = nullptr;
  Mutex* gate = nullptr;
  pid_t pid = -1;
  int error = 0;
  bool called = false;
};
herr_t ForkInsideHdf5(hid_t, const char*, void* data) NO_THREAD_SAFETY_ANALYSIS {
  auto* call = static_cast<ForkCall*>(data);
  call->called = true;
  call->pid = ::fork();
  if (call->pid == 0) {
    g_in_child = true;
    AbandonInChild(call->gate);  // the child never touches the gate again
    (*call->child)();
    ::_exit(0);
  }
  call->error = errno;
  return 1;  // stop the iteration: one fork
}

pid_t ForkOutsideHdf5(const std::function<void()>& child, std::chrono::milliseconds wait) {
  Gate& g = TheGate();
  ForkCall call{&child, &g.mu};
  const auto fork_in_hdf5 = [&call]() {
    // Any property list will do: its first property's callback forks.
    const hid_t plist = H5Pcreate(H5P_FILE_ACCESS);
    if (plist < 0) return;
    (void)H5Piterate(plist, nullptr, ForkInsideHdf5, &call);
    H5Pclose(plist);
  };
  if (g_in_child) {  // a child is single-threaded: nothing to wait for
    fork_in_hdf5();
    if (!call.called) call.pid = ::fork(), call.error = errno;
    if (call.pid == 0) {
      child();
      ::_exit(0);
    }
    errno = call.error;
    return call.pid;
  }
  // Locked and unlocked by hand: the child keeps its copy held.
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
  fork_in_hdf5();
  if (!call.called) {  // HDF5 could not make or walk a property list: fork here
    call.pid = ::fork();
    call.error = errno;
    if (call.pid == 0) {
      g_in_child = true;
      AbandonInChild(&g.mu);
      child();
      ::_exit(0);
    }
  }
  g.forking = false;
  g.mu.Unlock();
  g.cv.SignalAll();
  errno = call.error;
  return call.pid;
}

}  // namespace gpufeed::h5
