// CPU reference of the GPU decoder's resample (and its CPU twin's).
#include <string>

#include "gpu/resize_crop.h"

namespace gpufeed::gpu {

Status ValidateResizeJob(const ResizeJob& j) {
  const CropRect& b = j.box;
  if (j.src == nullptr || j.src_h <= 0 || j.src_w <= 0 || j.pitch < uint64_t(3) * j.src_w || b.height <= 0 ||
      b.width <= 0 || b.top < 0 || b.left < 0 || int64_t(b.top) + b.height > j.src_h ||
      int64_t(b.left) + b.width > j.src_w) {
    return Status::InvalidArgument("resize: box " + std::to_string(b.height) + "x" + std::to_string(b.width) + " at (" +
                                   std::to_string(b.top) + ", " + std::to_string(b.left) + ") is not inside the " +
                                   std::to_string(j.src_h) + "x" + std::to_string(j.src_w) + " image");
  }
  return Status::Ok();
}

Status ResizeCropCpu(const ResizeJob* jobs, int n, int out_h, int out_w, bool nchw, uint8_t* dst) {
  if (out_h <= 0 || out_w <= 0) return Status::InvalidArgument("resize: empty output size");
  for (int k = 0; k < n; ++k) {
    const ResizeJob& j = jobs[k];
    GPUFEED_RETURN_IF_ERROR(ValidateResizeJob(j));
    for (int oy = 0; oy < out_h; ++oy) {
      for (int ox = 0; ox < out_w; ++ox) {
        uint8_t rgb[3];
        ResizePixel(j, oy, ox, out_h, out_w, rgb);
        for (int c = 0; c < 3; ++c) dst[ResizeOffset(j.dst_index, c, oy, ox, out_h, out_w, nchw)] = rgb[c];
      }
    }
  }
  return Status::Ok();
}

#ifndef GPUFEED_WITH_CUDA
Status ResizeCropGpu(const ResizeJob*, int, int, int, bool, uint8_t*, void*) {
  return Status::Unsupported("resize: this build has no CUDA");
}
#endif

}  // namespace gpufeed::gpu
