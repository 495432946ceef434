// CPU reference of the fused transform (and the fallback without a GPU).
#include <cstring>

#include "gpu/transform.h"

namespace gpufeed::gpu {

Status ValidateTransform(const TransformParams& p) {
  if (p.batch <= 0 || p.channels <= 0 || p.height <= 0 || p.width <= 0) {
    return Status::InvalidArgument("transform: empty batch or image");
  }
  if (p.channels > kMaxChannels) {
    return Status::Unsupported("transform: " + std::to_string(p.channels) + " channels (at most " +
                               std::to_string(kMaxChannels) + ")");
  }
  if (p.out_dtype != DType::kFloat32 && p.out_dtype != DType::kFloat16 && p.out_dtype != DType::kBFloat16) {
    return Status::Unsupported("transform: output dtype " + std::string(DTypeName(p.out_dtype)) +
                               " (fp32, fp16 or bf16)");
  }
  if (InputElementBytes(p.in_dtype) == 0) {
    return Status::Unsupported("transform: input dtype " + std::string(DTypeName(p.in_dtype)) +
                               " (uint8, uint16, int16, float16 or float32)");
  }
  if (p.crop_padding < 0 || p.crop_padding > 32767) return Status::InvalidArgument("transform: bad crop padding");
  if (p.perm_domain && p.perm_offset + static_cast<uint64_t>(p.batch) > p.perm_domain) {
    return Status::InvalidArgument("transform: batch runs past its super-batch");
  }
  return Status::Ok();
}

Status TransformCpu(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
                    void* dst_labels) {
  GPUFEED_RETURN_IF_ERROR(ValidateTransform(p));
  const uint64_t per_sample = uint64_t(p.channels) * p.height * p.width;
  const uint64_t in_bytes = per_sample * InputElementBytes(p.in_dtype);
  for (int i = 0; i < p.batch; ++i) {
    const uint8_t* sample = src + uint64_t(SourceSample(p, i)) * in_bytes;
    const SampleAug a = AugFor(p.seed, i, p.crop_padding, p.flip);
    for (int c = 0; c < p.channels; ++c) {
      for (int y = 0; y < p.height; ++y) {
        for (int x = 0; x < p.width; ++x) {
          const float v = ElementValue(p, sample, a, c, y, x);
          const uint64_t o = uint64_t(i) * per_sample + OutputOffset(p, c, y, x);
          if (p.out_dtype == DType::kFloat32) {
            static_cast<float*>(dst)[o] = v;
          } else if (p.out_dtype == DType::kFloat16) {
            static_cast<uint16_t*>(dst)[o] = FloatToHalfBits(v);
          } else {
            static_cast<uint16_t*>(dst)[o] = FloatToBf16Bits(v);
          }
        }
      }
    }
    if (src_labels != nullptr && dst_labels != nullptr) {
      const uint32_t s = SourceSample(p, i);
      if (p.labels_int32) {
        static_cast<int32_t*>(dst_labels)[i] = static_cast<int32_t>(src_labels[s]);
      } else {
        static_cast<int64_t*>(dst_labels)[i] = src_labels[s];
      }
    }
  }
  return Status::Ok();
}

}  // namespace gpufeed::gpu
