// The part of nvJPEG's C API the GPU image decoder uses, declared here from
// NVIDIA's documentation (docs.nvidia.com/cuda/nvjpeg, "nvJPEG Type
// Declarations" and "nvJPEG API Reference"): the developer machine's CUDA
// toolkit has no nvjpeg.h, so libnvjpeg is loaded at run time (dlopen, as
// NVML is) and the build needs nothing of it. scripts/gpu-host-jpeg checks
// these declarations against the host's nvjpeg.h (check_nvjpeg_api.cc).
#ifndef GPUFEED_GPU_NVJPEG_API_H_
#define GPUFEED_GPU_NVJPEG_API_H_

#include <cstddef>

namespace gpufeed::gpu::nvj {

using Status = int;  // nvjpegStatus_t: 0 = NVJPEG_STATUS_SUCCESS
constexpr Status kSuccess = 0;

enum Backend : int {  // nvjpegBackend_t
  kBackendDefault = 0,
  kBackendHybrid = 1,
  kBackendGpuHybrid = 2,
  kBackendHardware = 3,
};
enum OutputFormat : int {  // nvjpegOutputFormat_t
  kOutputRgbi = 5,         // interleaved RGB in channel[0]
};
// nvjpegCreateEx's flags: NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE, the hardware
// backend without its internal pipeline (with it, a batch's bitstream copies
// and colour conversions, spread over 14 internal streams, wait behind a
// training model's queued kernels: issue 27, bench/peer/nvjpeg_wait.py).
constexpr unsigned kFlagsHwDecodeNoPipeline = 1;
constexpr int kMaxComponent = 4;  // NVJPEG_MAX_COMPONENT
struct Image {                    // nvjpegImage_t
  unsigned char* channel[kMaxComponent];
  size_t pitch[kMaxComponent];
};

struct HandleRec;
using Handle = HandleRec*;  // nvjpegHandle_t
struct StateRec;
using State = StateRec*;  // nvjpegJpegState_t
struct JpegStreamRec;
using JpegStream = JpegStreamRec*;  // nvjpegJpegStream_t

// Entry points (the allocator arguments are always null here).
using CreateExFn = Status (*)(int backend, void* dev_allocator, void* pinned_allocator, unsigned flags, Handle* handle);
using DestroyFn = Status (*)(Handle);
using StateCreateFn = Status (*)(Handle, State*);
using StateDestroyFn = Status (*)(State);
using BatchedInitializeFn = Status (*)(Handle, State, int batch_size, int max_cpu_threads, int output_format);
using DecodeBatchedFn = Status (*)(Handle, State, const unsigned char* const* data, const size_t* lengths,
                                   Image* destinations, void* stream);
using JpegStreamCreateFn = Status (*)(Handle, JpegStream*);
using JpegStreamDestroyFn = Status (*)(JpegStream);
using JpegStreamParseFn = Status (*)(Handle, const unsigned char* data, size_t length, int save_metadata,
                                     int save_stream, JpegStream);
// The hardware backend's engines and each one's cores (a handle made with
// kBackendHardware; NVJPEG_STATUS_NOT_SUPPORTED otherwise).
using GetHardwareDecoderInfoFn = Status (*)(Handle, unsigned* num_engines, unsigned* num_cores_per_engine);
// *is_supported == 0: the batched decoder of the handle's backend takes it.
using DecodeBatchedSupportedFn = Status (*)(Handle, JpegStream, int* is_supported);

}  // namespace gpufeed::gpu::nvj

#endif  // GPUFEED_GPU_NVJPEG_API_H_
