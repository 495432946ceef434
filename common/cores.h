// How many cores gpufeed's thread pools take by default: one place for the
// loader, the daemon and the tools (docs/practices.md, practice 21).
#ifndef GPUFEED_COMMON_CORES_H_
#define GPUFEED_COMMON_CORES_H_

namespace gpufeed {

// The cores this process may run on (its CPU affinity mask, which taskset,
// cgroups' cpusets and job schedulers narrow), at least 1.
int AvailableCores();

// A loader's threads when the options say 0: this process's share of the
// node's cores. Under torchrun the LOCAL_WORLD_SIZE processes of one host
// each take AvailableCores() / LOCAL_WORLD_SIZE (at least 2), so G ranks do
// not each ask for every core (the node issue measured a loader per rank of
// two, each taking all 32 cores, at 0.72-0.92 of the model's ceiling).
// Outside torchrun: AvailableCores().
int DefaultLoaderThreads();

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_CORES_H_
