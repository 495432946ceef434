// Page-locked host allocations through the CUDA runtime.
#include <cuda_runtime.h>

#include <cstddef>

namespace gpufeed {

namespace {

// Whether a device exists, leaving no sticky CUDA error behind.
bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace

// False when there is no device or the allocation fails (the caller then uses
// plain memory); never leaves a sticky CUDA error behind.
bool PinnedAlloc(size_t bytes, void** out) {
  if (!HaveDevice()) return false;
  if (cudaHostAlloc(out, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    *out = nullptr;
    return false;
  }
  return true;
}

void PinnedFree(void* p) { cudaFreeHost(p); }

// Page-locks memory allocated elsewhere (e.g. a shared mapping); false, with
// no sticky error, when there is no device or the driver refuses.
bool PinnedRegister(void* p, size_t bytes) {
  if (!HaveDevice()) return false;
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

void PinnedUnregister(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

}  // namespace gpufeed
