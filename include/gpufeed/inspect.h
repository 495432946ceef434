// What `gpufeed inspect` reports beyond DatasetInfo, and one-sample export.
#ifndef GPUFEED_INSPECT_H_
#define GPUFEED_INSPECT_H_

#include <cstdint>
#include <map>
#include <string>

#include "gpufeed/dataset.h"
#include "gpufeed/status.h"

namespace gpufeed {

struct InspectReport {
  std::map<int64_t, uint64_t> label_histogram;  // label -> count
  double compression_ratio = 1;                 // raw / stored bytes
  uint64_t hdf5_chunks = 0;                     // chunks of the HDF5 chunk grid (0 unless chunked)
  // Decoded-chunk cache that holds a shuffle window of kRecommendedWindow
  // chunks (the loader's `block` order reads each chunk once per epoch with
  // it), capped at the whole dataset.
  uint64_t recommended_cache_bytes = 0;
  static constexpr uint64_t kRecommendedWindow = 16;
};

InspectReport Inspect(const Dataset& ds);

// Writes sample k to `path`: ".npy" (any dtype, the sample's own shape),
// ".pgm" (uint8, one channel) or ".ppm" (uint8, three channels; NCHW or NHWC
// by the layout attribute, NCHW if 3 leads the shape). The format follows the
// extension; the file is written whole or not at all.
Status ExportSample(const Dataset& ds, uint64_t k, const std::string& path);

}  // namespace gpufeed

#endif  // GPUFEED_INSPECT_H_
