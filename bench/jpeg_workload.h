// The `imagenet-jpeg` workload (docs/benchmarks.md, Workloads) and its decode
// ceiling. JPEGs with ImageNet's size distribution (width 400..500, height
// 350..375, quality 90, 4:2:0) drawn from structured synthetic content
// (gradients, shapes, multi-scale texture: not noise, so sizes and decode
// cost are realistic), written as a folder DIR/cNN/kkkkkkk.jpg and converted
// to gpufeed's encoded format. Deterministic in (seed, sample).
#ifndef GPUFEED_BENCH_JPEG_WORKLOAD_H_
#define GPUFEED_BENCH_JPEG_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "gpufeed/status.h"

namespace gpufeed::bench {

struct JpegGenOptions {
  std::string output;  // the encoded .h5
  std::string folder;  // the .jpg folder (default: output + ".jpg.d")
  uint64_t samples = 20000;
  uint64_t seed = 1;
  int classes = 100;  // labels k % classes; sample k is file c<label>/<k>.jpg
  int quality = 90;
  int threads = 0;  // 0: all cores
  std::function<void(uint64_t, uint64_t)> progress;
};

struct JpegGenSummary {
  uint64_t samples = 0, file_bytes = 0;
  double mean_width = 0, mean_height = 0;
  std::string folder;
  ConvertSummary convert;
};

// Sample k of the workload, JPEG-encoded. Thread-safe.
Status MakeJpegSample(uint64_t k, uint64_t seed, int quality, std::vector<unsigned char>* jpeg);

Result<JpegGenSummary> GenImagenetJpeg(const JpegGenOptions& options);

// libjpeg-turbo's own full-size decode rate (tjDecompress2 to RGB, the
// settings of tjbench) over up to `max_samples` of the source's samples,
// on one thread; the loader's ceiling is this times its threads.
// The same files are also decoded with the source's transform (gpufeed's
// decode + crop + resample, one core), interleaved with the full decodes in
// blocks so that load from other processes hits both alike.
struct DecodeCeiling {
  uint64_t samples = 0;
  double seconds = 0;            // full-size decodes (tjDecompress2)
  double transform_seconds = 0;  // gpufeed's DecodeTransform of the same samples
  double samples_per_s() const { return seconds > 0 ? samples / seconds : 0; }
  double transform_per_s() const { return transform_seconds > 0 ? samples / transform_seconds : 0; }
};
Result<DecodeCeiling> MeasureDecodeCeiling(const EncodedImageSource& source, uint64_t max_samples, uint64_t seed = 0);

// Full-size decodes of the same samples on `threads` threads at once
// (samples/s): the ceiling as the machine delivers it now, when other
// processes share its cores (one core x threads assumes they do not).
Result<double> MeasureParallelDecode(const EncodedImageSource& source, uint64_t max_samples, int threads);

}  // namespace gpufeed::bench

#endif  // GPUFEED_BENCH_JPEG_WORKLOAD_H_
