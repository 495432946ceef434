// The pass-through gather: fields the feed neither normalizes nor crops
// (CosmoFlow's four float targets, a per-sample weight, an id, a float map
// taken as stored) go to the device as stored and come out in the order the
// image transform (transform.h) gives the same TransformParams: output row i
// is input row SourceSample(p, i), so every field of output sample i belongs
// to the same dataset sample, fresh or echoed. Rows are opaque bytes of any
// dtype and shape; nothing is converted.
//
// GatherRowsCpu is the reference; GatherRowsGpu (gather_rows.cu) copies the
// same rows on a stream and must give the same bytes (the GPU test checks).
#ifndef GPUFEED_GPU_GATHER_ROWS_H_
#define GPUFEED_GPU_GATHER_ROWS_H_

#include <cstdint>

#include "gpu/transform.h"

namespace gpufeed::gpu {

// An empty batch or row, or a batch that runs past its super-batch.
Status ValidateGather(const TransformParams& p, uint64_t row_bytes);

// Writes p.batch rows of row_bytes to dst.
Status GatherRowsCpu(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst);
// The same on `stream` (a cudaStream_t); CUDA builds only.
Status GatherRowsGpu(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst, void* stream);

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_GATHER_ROWS_H_
