// The HDF5 fork gate. Debian's HDF5 is the threadsafe build: one global
// lock around every API call. A process forked while another of its threads
// holds that lock gets a copy that is held forever, so a probe child (probe.h)
// made beside a loader reading through HDF5 waited out its time limit and a
// good file was reported as hanging (11 of 12 probes with two readers on the
// hdf5 path).
//
// So gpufeed's HDF5 work outside the probe children runs in an Hdf5Section
// (a shared hold, re-entrant per thread), and ForkOutsideHdf5 forks only
// when no thread but the caller is in one: new sections wait meanwhile, and
// the wait for those in flight is bounded (a reader stuck in HDF5 must not
// stop every later open), after which it forks anyway.
#ifndef GPUFEED_HDF5_FORK_GATE_H_
#define GPUFEED_HDF5_FORK_GATE_H_

#include <sys/types.h>

#include <chrono>
#include <functional>

namespace gpufeed::h5 {

class Hdf5Section {
 public:
  Hdf5Section();
  ~Hdf5Section();
  Hdf5Section(const Hdf5Section&) = delete;
  Hdf5Section& operator=(const Hdf5Section&) = delete;
};

// fork(), once the other threads' sections have ended (waiting at most
// `wait`), from inside an HDF5 call: the forking thread then holds HDF5's
// global lock, so no other thread of the process is inside HDF5 either —
// not one of gpufeed's, not h5py's in the same Python process (whose
// threads the gate does not see: a probe forked while one of them read a
// file hung on its copy of the lock, and a good file was reported as
// hanging). In the child, `child` runs there, holding that lock (the
// child's only thread: HDF5's lock is re-entrant for it), and the child
// exits with _exit(0) if it returns; it never unlocks the copy (a condition
// variable with the parent's waiters in it could block it). In the parent,
// returns the child's pid, or -1 with errno set.
pid_t ForkOutsideHdf5(const std::function<void()>& child,
                      std::chrono::milliseconds wait = std::chrono::milliseconds(2000));

}  // namespace gpufeed::h5

#endif  // GPUFEED_HDF5_FORK_GATE_H_
