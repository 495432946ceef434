// The resample of the GPU image decoder: a crop box of a decoded image
// (interleaved RGB, as nvJPEG writes it) to the batch's out_h x out_w uint8
// sample, planar (NCHW) or interleaved (NHWC), with the antialiased bilinear
// filter of the CPU decoder (PIL's: a triangle of half-width max(1, scale)
// per axis, weights normalized per axis).
//
// ResizeCropCpu (resize_crop_cpu.cc) is the reference; ResizeCropGpu
// (resize_crop.cu) has the same signature plus a stream and produces the same
// bytes: both run ResizePixel below, whose float operations are each rounded
// as IEEE says (the __f*_rn intrinsics on the device, no contraction on
// the host), in the same order.
#ifndef GPUFEED_GPU_RESIZE_CROP_H_
#define GPUFEED_GPU_RESIZE_CROP_H_

#include <cmath>
#include <cstdint>

#include "gpu/transform.h"  // GPUFEED_HD
#include "gpufeed/crop_rect.h"
#include "gpufeed/status.h"

namespace gpufeed::gpu {

struct ResizeJob {
  const uint8_t* src = nullptr;  // the decoded image: device memory for the GPU, host for the CPU twin
  uint64_t pitch = 0;            // bytes from one row to the next (>= 3 x src_w)
  int32_t src_h = 0, src_w = 0;
  CropRect box;            // inside the image
  uint32_t dst_index = 0;  // the sample's position in the batch
};

// Checks a job against its image (a box inside it, sizes positive).
Status ValidateResizeJob(const ResizeJob& j);

// jobs[0..n) into dst, sample j.dst_index at dst + dst_index x 3 x out_h x out_w.
Status ResizeCropCpu(const ResizeJob* jobs, int n, int out_h, int out_w, bool nchw, uint8_t* dst);
// The same with `jobs` in device memory (already validated on the host by
// the caller, from its host copy: ValidateResizeJob).
Status ResizeCropGpu(const ResizeJob* jobs, int n, int out_h, int out_w, bool nchw, uint8_t* dst, void* stream);

// --- the per-pixel math both run ------------------------------------------
GPUFEED_HD float RnAdd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
GPUFEED_HD float RnMul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GPUFEED_HD float RnDiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The taps of output position i along an axis of n source pixels whose box
// starts at b0 and spans `extent`: [lo, hi), with center and filter scale.
struct AxisTaps {
  int lo = 0, hi = 0;
  float center = 0, fs = 1;
};
GPUFEED_HD AxisTaps Taps(int i, int n, float b0, float extent, int out) {
  AxisTaps t;
  const float scale = RnDiv(extent, static_cast<float>(out));
  t.fs = scale > 1.0f ? scale : 1.0f;
  t.center = RnAdd(b0, RnMul(RnAdd(static_cast<float>(i), 0.5f), scale));
  int lo = static_cast<int>(floorf(RnAdd(RnAdd(t.center, -t.fs), 0.5f)));
  int hi = static_cast<int>(floorf(RnAdd(RnAdd(t.center, t.fs), 0.5f)));
  lo = lo < 0 ? 0 : lo;
  hi = hi > n ? n : hi;
  if (hi <= lo) {  // the center lies outside the image: its edge pixel
    int c = static_cast<int>(t.center);
    c = c < 0 ? 0 : (c > n - 1 ? n - 1 : c);
    lo = c;
    hi = c + 1;
  }
  t.lo = lo;
  t.hi = hi;
  return t;
}
// The triangle's weight of source pixel x.
GPUFEED_HD float TapWeight(const AxisTaps& t, int x) {
  float d = RnDiv(RnAdd(RnAdd(static_cast<float>(x), 0.5f), -t.center), t.fs);
  d = d < 0 ? -d : d;
  return d < 1.0f ? RnAdd(1.0f, -d) : 0.0f;
}

// Output pixel (oy, ox) of job j: rgb[0..2].
GPUFEED_HD void ResizePixel(const ResizeJob& j, int oy, int ox, int out_h, int out_w, uint8_t rgb[3]) {
  const AxisTaps ty = Taps(oy, j.src_h, static_cast<float>(j.box.top), static_cast<float>(j.box.height), out_h);
  const AxisTaps tx = Taps(ox, j.src_w, static_cast<float>(j.box.left), static_cast<float>(j.box.width), out_w);
  float sx = 0;
  for (int x = tx.lo; x < tx.hi; ++x) sx = RnAdd(sx, TapWeight(tx, x));
  float sy = 0, acc[3] = {0, 0, 0};
  for (int y = ty.lo; y < ty.hi; ++y) {
    const float wy = TapWeight(ty, y);
    sy = RnAdd(sy, wy);
    const uint8_t* row = j.src + static_cast<uint64_t>(y) * j.pitch;
    float r = 0, g = 0, b = 0;
    for (int x = tx.lo; x < tx.hi; ++x) {
      const float wx = TapWeight(tx, x);
      const uint8_t* p = row + 3 * x;
      r = RnAdd(r, RnMul(wx, static_cast<float>(p[0])));
      g = RnAdd(g, RnMul(wx, static_cast<float>(p[1])));
      b = RnAdd(b, RnMul(wx, static_cast<float>(p[2])));
    }
    acc[0] = RnAdd(acc[0], RnMul(wy, r));
    acc[1] = RnAdd(acc[1], RnMul(wy, g));
    acc[2] = RnAdd(acc[2], RnMul(wy, b));
  }
  // Every tap's weight can be 0 only when a box edge falls exactly between
  // taps at the image border: then the nearest pixel.
  const float norm = RnMul(sx, sy);
  for (int c = 0; c < 3; ++c) {
    float v;
    if (norm > 0) {
      v = RnAdd(RnDiv(acc[c], norm), 0.5f);
    } else {
      v = static_cast<float>(j.src[static_cast<uint64_t>(ty.lo) * j.pitch + 3 * tx.lo + c]) + 0.5f;
    }
    const int q = static_cast<int>(floorf(v));
    rgb[c] = static_cast<uint8_t>(q < 0 ? 0 : (q > 255 ? 255 : q));
  }
}

// Where output pixel (oy, ox) channel c of sample s goes.
GPUFEED_HD uint64_t ResizeOffset(uint32_t s, int c, int oy, int ox, int out_h, int out_w, bool nchw) {
  const uint64_t plane = static_cast<uint64_t>(out_h) * out_w;
  const uint64_t base = static_cast<uint64_t>(s) * 3 * plane;
  return nchw ? base + c * plane + static_cast<uint64_t>(oy) * out_w + ox
              : base + (static_cast<uint64_t>(oy) * out_w + ox) * 3 + c;
}

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_RESIZE_CROP_H_
