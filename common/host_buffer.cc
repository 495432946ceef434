// HostBuffer: pinned through the CUDA runtime where built with CUDA and a
// device exists (host_buffer_cuda.cu), aligned plain memory otherwise.
#include "common/host_buffer.h"

#include <cstdlib>

namespace gpufeed {

#ifdef GPUFEED_WITH_CUDA
bool PinnedAlloc(size_t bytes, void** out);  // host_buffer_cuda.cu
void PinnedFree(void* p);
bool PinnedRegister(void* p, size_t bytes);
void PinnedUnregister(void* p);
#else
static bool PinnedAlloc(size_t, void**) { return false; }
static void PinnedFree(void*) {}
static bool PinnedRegister(void*, size_t) { return false; }
static void PinnedUnregister(void*) {}
#endif

HostBuffer HostBuffer::Allocate(size_t bytes, bool try_pinned) {
  HostBuffer b;
  b.bytes_ = bytes;
  void* p = nullptr;
  if (try_pinned && PinnedAlloc(bytes, &p)) {
    b.data_ = static_cast<std::byte*>(p);
    b.pinned_ = true;
    return b;
  }
  constexpr size_t kAlign = 4096;
  p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  b.data_ = static_cast<std::byte*>(p);
  return b;
}

HostBuffer HostBuffer::Adopt(std::byte* data, size_t bytes, bool try_pinned) {
  HostBuffer b;
  b.data_ = data;
  b.bytes_ = bytes;
  b.owned_ = false;
  b.pinned_ = try_pinned && data != nullptr && PinnedRegister(data, bytes);
  return b;
}

void HostBuffer::Free() {
  if (data_ == nullptr) return;
  if (!owned_) {
    if (pinned_) PinnedUnregister(data_);
  } else if (pinned_) {
    PinnedFree(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

}  // namespace gpufeed
