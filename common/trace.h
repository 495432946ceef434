// NVTX ranges around pipeline stages, so a profile (Nsight Systems) shows how
// read, decode, assemble, copy and transform overlap. No-ops in builds
// without CUDA; with CUDA, nvtx3 is header-only and costs a pointer check
// when no profiler is attached.
#ifndef GPUFEED_COMMON_TRACE_H_
#define GPUFEED_COMMON_TRACE_H_

#ifdef GPUFEED_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace gpufeed {

class TraceRange {
 public:
  explicit TraceRange(const char* name) {
#ifdef GPUFEED_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~TraceRange() {
#ifdef GPUFEED_WITH_CUDA
    nvtxRangePop();
#endif
  }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_TRACE_H_
