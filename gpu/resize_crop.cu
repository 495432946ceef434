// The GPU decoder's resample: a thread per output pixel (all three
// channels), a grid of (pixels / 256, jobs); the math is ResizePixel's.
#include <algorithm>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/resize_crop.h"

namespace gpufeed::gpu {
namespace {

__global__ void ResizeCropKernel(const ResizeJob* __restrict__ jobs, int out_h, int out_w, bool nchw,
                                 uint8_t* __restrict__ dst) {
  const ResizeJob j = jobs[blockIdx.y];
  const int pixels = out_h * out_w;
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < pixels; o += gridDim.x * blockDim.x) {
    const int oy = o / out_w, ox = o - oy * out_w;
    uint8_t rgb[3];
    ResizePixel(j, oy, ox, out_h, out_w, rgb);
    for (int c = 0; c < 3; ++c) dst[ResizeOffset(j.dst_index, c, oy, ox, out_h, out_w, nchw)] = rgb[c];
  }
}

}  // namespace

Status ResizeCropGpu(const ResizeJob* jobs, int n, int out_h, int out_w, bool nchw, uint8_t* dst, void* stream) {
  if (out_h <= 0 || out_w <= 0) return Status::InvalidArgument("resize: empty output size");
  if (n <= 0) return Status::Ok();
  if (n > 65535) return Status::InvalidArgument("resize: more than 65535 images in one launch");
  TraceRange trace("gpufeed resize crop");
  constexpr unsigned kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min((out_h * out_w + kThreads - 1) / kThreads, 1024u));
  ResizeCropKernel<<<dim3(blocks, static_cast<unsigned>(n)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      jobs, out_h, out_w, nchw, dst);
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

}  // namespace gpufeed::gpu
