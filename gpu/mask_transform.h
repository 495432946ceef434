// The mask transform: integer fields that share the images' spatial
// dimensions (segmentation masks, per-pixel classes) get exactly the crop,
// flip and echo gather that the image transform (transform.h) gives output
// sample i for the same TransformParams, and no normalization: an image and
// its mask stay aligned pixel for pixel. Integer in (int8..int64,
// uint8..uint32), int32 or int64 out; pixels the crop pulls in from outside
// read `fill` (the ignore class of a loss, say).
//
// Layout: a mask sample is `planes` planes of [height, width] (a [H, W] mask
// is 1 plane), in and out. MaskTransformCpu is the reference;
// MaskTransformGpu (mask_transform.cu) computes each element with the same
// MaskElement function and must give the same values (the GPU test checks).
#ifndef GPUFEED_GPU_MASK_TRANSFORM_H_
#define GPUFEED_GPU_MASK_TRANSFORM_H_

#include <cstdint>

#include "gpu/transform.h"

namespace gpufeed::gpu {

struct MaskParams {
  DType in_dtype = DType::kInt32;  // any integer dtype but uint64
  bool out_int64 = false;          // else int32 (values outside int32 are an error of the caller)
  int planes = 1;
  int64_t fill = 0;
};

// Bytes of one input element, 0 for a dtype the mask transform does not take.
GPUFEED_HD uint32_t MaskElementBytes(DType t) {
  switch (t) {
    case DType::kInt8:
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
      return 2;
    case DType::kInt32:
    case DType::kUInt32:
      return 4;
    case DType::kInt64:
      return 8;
    default:
      return 0;
  }
}

GPUFEED_HD int64_t LoadMask(DType t, const uint8_t* sample, uint64_t off) {
  const uint8_t* p = sample + off * MaskElementBytes(t);
  switch (t) {
    case DType::kInt8: {
      int8_t v;
      __builtin_memcpy(&v, p, 1);
      return v;
    }
    case DType::kUInt8:
      return *p;
    case DType::kInt16: {
      int16_t v;
      __builtin_memcpy(&v, p, 2);
      return v;
    }
    case DType::kUInt16: {
      uint16_t v;
      __builtin_memcpy(&v, p, 2);
      return v;
    }
    case DType::kInt32: {
      int32_t v;
      __builtin_memcpy(&v, p, 4);
      return v;
    }
    case DType::kUInt32: {
      uint32_t v;
      __builtin_memcpy(&v, p, 4);
      return v;
    }
    default: {
      int64_t v;
      __builtin_memcpy(&v, p, 8);
      return v;
    }
  }
}

// Output element (plane, y, x) of a mask sample at `sample` whose
// augmentation is `a` (AugFor of the image's output sample): the same source
// pixel ElementValue reads for the image, or m.fill outside it.
GPUFEED_HD int64_t MaskElement(const TransformParams& p, const MaskParams& m, const uint8_t* sample, SampleAug a,
                               int plane, int y, int x) {
  const int xs = a.flip ? (p.width - 1 - x) : x;
  const int sy = y + a.dy, sx = xs + a.dx;
  if (sy < 0 || sy >= p.height || sx < 0 || sx >= p.width) return m.fill;
  return LoadMask(m.in_dtype, sample, (uint64_t(plane) * p.height + sy) * uint64_t(p.width) + sx);
}

Status ValidateMask(const TransformParams& p, const MaskParams& m);

// Writes p.batch mask samples (planes x height x width each) to dst.
Status MaskTransformCpu(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst);
// The same on `stream` (a cudaStream_t); CUDA builds only.
Status MaskTransformGpu(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst, void* stream);

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_MASK_TRANSFORM_H_
