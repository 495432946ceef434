// The feed's image decode stage: a batch the loader left encoded
// (LoaderOptions::defer_decode, Batch::encoded()) becomes uint8 samples of
// the batch's size and layout in the feed's input slot. Two implementations
// of one seam:
//   - nvJPEG (image_decoder_nvjpeg.cc): the batch's JPEGs decoded by the
//     GPU's hardware engine (NVJPEG_BACKEND_HARDWARE; the GPU hybrid backend
//     where the device has no engine), each crop box resampled by
//     ResizeCropGpu, the samples the loader decoded copied up;
//   - the CPU twin (image_decoder_cpu.cc): the same steps with libjpeg's
//     full-size decode and ResizeCropCpu, for the CPU feed and CI.
// A stream the device decoder rejects is decoded on the host instead
// (counted as fallback_samples); one that does not decode at all is a
// Corrupt error naming the sample, or with skip_corrupt is replaced by the
// batch's next sample that decoded (its label with it).
#ifndef GPUFEED_GPU_IMAGE_DECODER_H_
#define GPUFEED_GPU_IMAGE_DECODER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/device_ops.h"
#include "gpu/resize_crop.h"
#include "gpufeed/loader.h"
#include "gpufeed/status.h"

namespace gpufeed::gpu {

struct ImageDecodeShape {
  int height = 0, width = 0;  // the output sample
  bool nchw = true;
  bool skip_corrupt = false;
  std::string source;              // for messages: "train.h5:/images"
  std::shared_ptr<Logger> logger;  // where a replaced sample is said (null: stderr)
};

struct ImageDecodeCounters {
  uint64_t device_samples = 0;    // decoded by the device decoder
  uint64_t host_samples = 0;      // decoded by the loader (Batch::encoded() bytes == 0), copied up
  uint64_t fallback_samples = 0;  // rejected by the device decoder, decoded on the host here
  uint64_t skipped = 0;           // corrupt, replaced (skip_corrupt)
  double decode_seconds = 0;      // host time in Decode()
};

class ImageBatchDecoder {
 public:
  virtual ~ImageBatchDecoder() = default;
  // Decodes the b.size() samples of `b` (b.encoded() not empty) to
  // dst + i x 3 x height x width, on `stream` (device memory and a
  // cudaStream_t on the GPU). `labels` (b.size(), host) and `indices` are
  // the batch's as staged: a replaced sample's are rewritten. b's buffer
  // must stay alive until the stream has passed this work.
  virtual Status Decode(const Batch& b, uint8_t* dst, int64_t* labels, StreamRef stream) = 0;
  virtual const ImageDecodeCounters& counters() const = 0;
  virtual std::string name() const = 0;  // "nvjpeg hardware", "nvjpeg gpu-hybrid", "cpu"
};

std::unique_ptr<ImageBatchDecoder> MakeCpuImageDecoder(const ImageDecodeShape& shape);
// The nvJPEG decoder on `device` through `ops` (CUDA ops, which must outlive
// it: its buffers are freed through them). Unsupported, with
// the reason, where libnvjpeg cannot be loaded or makes no handle, or in a
// build without CUDA.
Result<std::unique_ptr<ImageBatchDecoder>> MakeNvjpegDecoder(const ImageDecodeShape& shape, int device, DeviceOps* ops);
// Whether MakeNvjpegDecoder would succeed on `device` (and which backend:
// *backend "hardware" or "gpu-hybrid"); the reason when not. Cached.
Status NvjpegAvailable(int device, std::string* backend = nullptr);

// Shared by both: decodes sample i of b on the host (libjpeg, full size) and
// resamples its box with ResizeCropCpu into out (3 x height x width).
Status DecodeOnHost(const Batch& b, size_t i, const ImageDecodeShape& shape, uint8_t* out);
// The resample of sample `e`, decoded to interleaved RGB at `src` (3 x width
// bytes a row), into batch position `dst_index`.
ResizeJob ResizeJobFor(const EncodedSample& e, const uint8_t* src, uint32_t dst_index);
// failed[i] not ok: sample i did not decode. Without skip_corrupt, Corrupt
// naming the first; with it, each is replaced by the batch's next sample
// that decoded (copy_sample(from, to); labels[to] = labels[from]), counted
// in *skipped and said on stderr as the CPU path does.
Status ReplaceCorrupt(const Batch& b, const ImageDecodeShape& shape, std::vector<Status>& failed, int64_t* labels,
                      uint64_t* skipped, const std::function<Status(size_t from, size_t to)>& copy_sample);

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_IMAGE_DECODER_H_
