// CPU reference of the pass-through gather (and the fallback without a GPU).
#include <cstring>

#include "gpu/gather_rows.h"

namespace gpufeed::gpu {

Status ValidateGather(const TransformParams& p, uint64_t row_bytes) {
  if (p.batch <= 0 || row_bytes == 0) return Status::InvalidArgument("gather: empty batch or row");
  if (p.perm_domain && p.perm_offset + static_cast<uint64_t>(p.batch) > p.perm_domain) {
    return Status::InvalidArgument("gather: batch runs past its super-batch");
  }
  return Status::Ok();
}

Status GatherRowsCpu(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst) {
  GPUFEED_RETURN_IF_ERROR(ValidateGather(p, row_bytes));
  auto* out = static_cast<uint8_t*>(dst);
  for (int i = 0; i < p.batch; ++i) {
    std::memcpy(out + uint64_t(i) * row_bytes, src + uint64_t(SourceSample(p, uint32_t(i))) * row_bytes, row_bytes);
  }
  return Status::Ok();
}

}  // namespace gpufeed::gpu
