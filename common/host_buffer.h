// Host memory for batches: page-locked (cudaHostAlloc) when a CUDA device is
// present, so copies to the GPU are asynchronous DMA; 4 KiB-aligned plain
// memory otherwise. Allocated once per pool slot, never per batch.
#ifndef GPUFEED_COMMON_HOST_BUFFER_H_
#define GPUFEED_COMMON_HOST_BUFFER_H_

#include <cstddef>
#include <utility>

namespace gpufeed {

class HostBuffer {
 public:
  HostBuffer() = default;
  // Pinned if `try_pinned` and a device accepts the allocation; plain
  // otherwise. Returns an empty buffer (data() == nullptr) only when even a
  // plain allocation fails.
  static HostBuffer Allocate(size_t bytes, bool try_pinned);
  // A view of memory owned elsewhere (a shared-memory mapping), page-locked
  // in place with cudaHostRegister when `try_pinned` and a device accepts it.
  // The memory must outlive the buffer; destroying the buffer unregisters it
  // and frees nothing.
  static HostBuffer Adopt(std::byte* data, size_t bytes, bool try_pinned);
  HostBuffer(HostBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_), pinned_(o.pinned_), owned_(o.owned_) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = o.bytes_;
      pinned_ = o.pinned_;
      owned_ = o.owned_;
    }
    return *this;
  }
  ~HostBuffer() { Free(); }

  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void Free();
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
  bool owned_ = true;
};

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_HOST_BUFFER_H_
