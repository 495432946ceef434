// CPU reference of the mask transform (and the fallback without a GPU).
#include <string>

#include "gpu/mask_transform.h"

namespace gpufeed::gpu {

Status ValidateMask(const TransformParams& p, const MaskParams& m) {
  if (p.batch <= 0 || p.height <= 0 || p.width <= 0 || m.planes <= 0) {
    return Status::InvalidArgument("mask transform: empty batch or mask");
  }
  if (MaskElementBytes(m.in_dtype) == 0) {
    return Status::Unsupported("mask transform: input dtype " + std::string(DTypeName(m.in_dtype)) +
                               " (an integer type other than uint64)");
  }
  if (uint64_t(m.planes) * p.height * p.width >= (1ull << 32)) {
    return Status::InvalidArgument("mask transform: a mask of 2^32 elements or more");
  }
  if (p.crop_padding < 0 || p.crop_padding > 32767) return Status::InvalidArgument("mask transform: bad crop padding");
  if (p.perm_domain && p.perm_offset + static_cast<uint64_t>(p.batch) > p.perm_domain) {
    return Status::InvalidArgument("mask transform: batch runs past its super-batch");
  }
  return Status::Ok();
}

Status MaskTransformCpu(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst) {
  GPUFEED_RETURN_IF_ERROR(ValidateMask(p, m));
  const uint64_t per_sample = uint64_t(m.planes) * p.height * p.width;
  const uint64_t in_bytes = per_sample * MaskElementBytes(m.in_dtype);
  for (int i = 0; i < p.batch; ++i) {
    const uint8_t* sample = src + uint64_t(SourceSample(p, i)) * in_bytes;
    const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
    for (int c = 0; c < m.planes; ++c) {
      for (int y = 0; y < p.height; ++y) {
        for (int x = 0; x < p.width; ++x) {
          const int64_t v = MaskElement(p, m, sample, a, c, y, x);
          const uint64_t o = uint64_t(i) * per_sample + (uint64_t(c) * p.height + y) * p.width + x;
          if (m.out_int64) {
            static_cast<int64_t*>(dst)[o] = v;
          } else {
            static_cast<int32_t*>(dst)[o] = static_cast<int32_t>(v);
          }
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace gpufeed::gpu
