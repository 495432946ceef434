// Compiled on a GPU host only (scripts/gpu-host-jpeg): gpu/nvjpeg_api.h, the
// declarations gpufeed uses to call libnvjpeg through dlopen, against the
// host's nvjpeg.h. A mismatch fails to compile (a static_assert or a
// function whose arguments do not convert); the binary prints "ok".
#include <nvjpeg.h>

#include <cstddef>
#include <cstdio>

#include "gpu/nvjpeg_api.h"

namespace nvj = gpufeed::gpu::nvj;

static_assert(NVJPEG_STATUS_SUCCESS == nvj::kSuccess);
static_assert(int(NVJPEG_BACKEND_DEFAULT) == int(nvj::kBackendDefault));
static_assert(int(NVJPEG_BACKEND_HYBRID) == int(nvj::kBackendHybrid));
static_assert(int(NVJPEG_BACKEND_GPU_HYBRID) == int(nvj::kBackendGpuHybrid));
static_assert(int(NVJPEG_BACKEND_HARDWARE) == int(nvj::kBackendHardware));
static_assert(int(NVJPEG_OUTPUT_RGBI) == int(nvj::kOutputRgbi));
static_assert(NVJPEG_MAX_COMPONENT == nvj::kMaxComponent);
static_assert(NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE == nvj::kFlagsHwDecodeNoPipeline);
static_assert(sizeof(nvjpegImage_t) == sizeof(nvj::Image));
static_assert(offsetof(nvjpegImage_t, channel) == offsetof(nvj::Image, channel));
static_assert(offsetof(nvjpegImage_t, pitch) == offsetof(nvj::Image, pitch));
static_assert(sizeof(nvjpegStatus_t) == sizeof(nvj::Status));
static_assert(sizeof(nvjpegBackend_t) == sizeof(int) && sizeof(nvjpegOutputFormat_t) == sizeof(int));

// Each of our function types, as a call of the real one with the same
// arguments (handles are pointers to opaque structs on both sides).
#define H(x) reinterpret_cast<nvjpegHandle_t>(x)
#define S(x) reinterpret_cast<nvjpegJpegState_t>(x)
[[maybe_unused]] nvj::CreateExFn create_ex = [](int b, void* d, void* p, unsigned f, nvj::Handle* h) -> int {
  return nvjpegCreateEx(static_cast<nvjpegBackend_t>(b), static_cast<nvjpegDevAllocator_t*>(d),
                        static_cast<nvjpegPinnedAllocator_t*>(p), f, reinterpret_cast<nvjpegHandle_t*>(h));
};
[[maybe_unused]] nvj::DestroyFn destroy = [](nvj::Handle h) -> int { return nvjpegDestroy(H(h)); };
[[maybe_unused]] nvj::StateCreateFn state_create = [](nvj::Handle h, nvj::State* s) -> int {
  return nvjpegJpegStateCreate(H(h), reinterpret_cast<nvjpegJpegState_t*>(s));
};
[[maybe_unused]] nvj::StateDestroyFn state_destroy = [](nvj::State s) -> int { return nvjpegJpegStateDestroy(S(s)); };
[[maybe_unused]] nvj::BatchedInitializeFn init = [](nvj::Handle h, nvj::State s, int n, int t, int f) -> int {
  return nvjpegDecodeBatchedInitialize(H(h), S(s), n, t, static_cast<nvjpegOutputFormat_t>(f));
};
[[maybe_unused]] nvj::DecodeBatchedFn decode = [](nvj::Handle h, nvj::State s, const unsigned char* const* data,
                                                  const size_t* lengths, nvj::Image* out, void* stream) -> int {
  return nvjpegDecodeBatched(H(h), S(s), data, lengths, reinterpret_cast<nvjpegImage_t*>(out),
                             static_cast<cudaStream_t>(stream));
};
[[maybe_unused]] nvj::GetHardwareDecoderInfoFn hw_info = [](nvj::Handle h, unsigned* engines, unsigned* cores) -> int {
  return nvjpegGetHardwareDecoderInfo(H(h), engines, cores);
};

int main() {
  std::printf("ok: gpu/nvjpeg_api.h agrees with this host's nvjpeg.h\n");
  return 0;
}
