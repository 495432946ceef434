// Testing hooks behind `gpufeed bench h2d` and `gpufeed bench kernel`:
// hardware measurements that need the feed's internals (batch-sized pinned
// pool slots as the loader allocates them; the fused transform kernel checked
// bit for bit against its CPU twin before it is timed). Each reports a
// ceiling measured in the same run: pinned host->device bandwidth for copies,
// a device-to-device copy (bytes read + written) for the kernel. Without CUDA
// (build or device) they return Unsupported saying so.
#ifndef GPUFEED_HW_TIMING_H_
#define GPUFEED_HW_TIMING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpufeed/status.h"

namespace gpufeed {

struct H2dTiming {
  double pinned_gb_per_s = 0;  // one large pinned buffer, repeated copies (the ceiling)
  double pool_gb_per_s = 0;    // batch-sized pinned pool slots into rotating device slots
  double pageable_gb_per_s = 0;
  uint64_t batch_bytes = 0;
  double ratio() const { return pool_gb_per_s / pinned_gb_per_s; }
};
Result<H2dTiming> MeasureH2d(uint64_t batch_bytes, int slots);

struct KernelTiming {
  std::string dtype, layout;
  double kernel_gb_per_s = 0;  // (uint8 read + output written) / time
  double memcpy_gb_per_s = 0;  // device-to-device copy, read + written
  double ms = 0;
  double ratio() const { return kernel_gb_per_s / memcpy_gb_per_s; }
};
// A CelebA-sized batch (B x 3 x 218 x 178) through the fused transform, after
// checking it bit for bit against the CPU reference.
Result<std::vector<KernelTiming>> MeasureTransformKernel(int batch);

}  // namespace gpufeed

#endif  // GPUFEED_HW_TIMING_H_
