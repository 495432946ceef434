// The pass-through gather kernel: a grid-stride loop over the output in the
// widest word (16, 8, 4 or 1 bytes) that divides the row, so a row never
// straddles a word and every access is aligned (the device buffers are).
#include <algorithm>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "gpu/gather_rows.h"

namespace gpufeed::gpu {
namespace {

template <typename Word>
__global__ void GatherKernel(TransformParams p, const Word* __restrict__ src, uint64_t row_words,
                             Word* __restrict__ dst) {
  const uint64_t total = row_words * p.batch;
  for (uint64_t o = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; o < total; o += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t i = static_cast<uint32_t>(o / row_words);
    const uint64_t w = o - uint64_t(i) * row_words;
    dst[o] = src[uint64_t(SourceSample(p, i)) * row_words + w];
  }
}

template <typename Word>
Status Launch(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst, void* stream) {
  const uint64_t row_words = row_bytes / sizeof(Word);
  const uint64_t total = row_words * p.batch;
  constexpr unsigned kThreads = 256;
  const uint64_t blocks = std::clamp<uint64_t>((total + kThreads - 1) / kThreads, 1, 65535);
  GatherKernel<Word><<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p, reinterpret_cast<const Word*>(src), row_words, static_cast<Word*>(dst));
  GPUFEED_CUDA_RETURN(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status GatherRowsGpu(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst, void* stream) {
  GPUFEED_RETURN_IF_ERROR(ValidateGather(p, row_bytes));
  TraceRange trace("gpufeed gather rows");
  if (row_bytes % 16 == 0) return Launch<uint4>(p, src, row_bytes, dst, stream);
  if (row_bytes % 8 == 0) return Launch<uint64_t>(p, src, row_bytes, dst, stream);
  if (row_bytes % 4 == 0) return Launch<uint32_t>(p, src, row_bytes, dst, stream);
  return Launch<uint8_t>(p, src, row_bytes, dst, stream);
}

}  // namespace gpufeed::gpu
