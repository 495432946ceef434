// The handful of device operations the GpuFeeder needs, behind one
// interface: CUDA (device_ops_cuda.cu) or the CPU twins (device_ops_cpu.cc),
// so the feeder's state machine is the same code on both and the CPU tests
// exercise it. Streams and events are passed as typed references (StreamRef,
// EventRef: a cudaStream_t / cudaEvent_t on the GPU; placeholders on the CPU,
// where every call completes before it returns) and owned by move-only
// handles (Stream, Event, DeviceBuffer, PinnedBuffer) that DeviceOps makes
// and frees in their destructors.
#ifndef GPUFEED_GPU_DEVICE_OPS_H_
#define GPUFEED_GPU_DEVICE_OPS_H_

#include <cstddef>
#include <memory>
#include <utility>

#include "gpu/gather_rows.h"
#include "gpu/mask_transform.h"
#include "gpu/transform.h"
#include "gpufeed/status.h"

namespace gpufeed::gpu {

// Non-owning references, cheap to copy. Two types so that a stream passed
// where an event belongs (or the reverse) does not compile: Record and
// StreamWait once took (event, stream) and (stream, event).
struct StreamRef {
  void* raw = nullptr;  // a cudaStream_t; null: the legacy default stream
};
struct EventRef {
  void* raw = nullptr;  // a cudaEvent_t; null: no event (nothing to wait for)
};

class DeviceOps;

namespace internal {

// Move-only owner of one resource `ops` made, freed by (ops->*Free)(raw) in
// its destructor (never throws). `ops` must outlive it. A null raw is not
// freed: the CPU's events are null placeholders.
template <void (DeviceOps::*Free)(void*) noexcept>
class Owned {
 public:
  Owned() = default;
  Owned(DeviceOps* ops, void* raw) : ops_(ops), raw_(raw) {}
  Owned(Owned&& o) noexcept : ops_(std::exchange(o.ops_, nullptr)), raw_(std::exchange(o.raw_, nullptr)) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = std::exchange(o.ops_, nullptr);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~Owned() { reset(); }
  void reset() noexcept {
    if (raw_ != nullptr) (ops_->*Free)(raw_);
    ops_ = nullptr;
    raw_ = nullptr;
  }
  void* raw() const { return raw_; }

 private:
  DeviceOps* ops_ = nullptr;
  void* raw_ = nullptr;
};

}  // namespace internal

class Stream;
class Event;
class DeviceBuffer;
class PinnedBuffer;

// A call that takes a stream and an event takes the stream first (Record,
// StreamWait); a copy or kernel takes its stream last, as cudaMemcpyAsync and
// the launchers do.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual bool is_gpu() const = 0;

  // The owning handles (below): each freed through this DeviceOps, which must
  // outlive them. A stream or buffer freed while work queued on a stream
  // still uses it is the caller's bug: sync the stream first.
  Result<Stream> NewStream();
  Result<Event> NewEvent();
  Result<DeviceBuffer> Alloc(size_t bytes);        // device memory
  Result<PinnedBuffer> AllocPinned(size_t bytes);  // host staging memory

  virtual Status CopyToDevice(void* dst, const void* src, size_t bytes, StreamRef stream) = 0;
  // Synchronous, after `event` (null: at once): for tests and debugging.
  virtual Status CopyToHost(void* dst, const void* src, size_t bytes, EventRef event) = 0;
  // Records `event` on `stream`: it completes once the work queued so far has.
  virtual Status Record(StreamRef stream, EventRef event) = 0;
  virtual Status StreamWait(StreamRef stream, EventRef event) = 0;  // device-side wait
  virtual Status EventSync(EventRef event) = 0;                     // host-side wait
  virtual Status StreamSync(StreamRef stream) = 0;
  virtual Status Transform(const TransformParams& p, const uint8_t* src, const int64_t* src_labels, void* dst,
                           void* dst_labels, StreamRef stream) = 0;
  // The mask transform (mask_transform.h): an integer field cropped and
  // flipped as Transform's images of the same params.
  virtual Status MaskTransform(const TransformParams& p, const MaskParams& m, const uint8_t* src, void* dst,
                               StreamRef stream) = 0;
  // The pass-through gather (gather_rows.h): rows of row_bytes in the order
  // Transform's samples of the same params.
  virtual Status GatherRows(const TransformParams& p, const uint8_t* src, uint64_t row_bytes, void* dst,
                            StreamRef stream) = 0;
  // Runs fn(data) on a runtime thread once the work queued on `stream` so far
  // has run (cudaLaunchHostFunc; on the CPU: now). fn must not call CUDA.
  virtual Status LaunchHostFunc(StreamRef stream, void (*fn)(void*), void* data) = 0;
  // Makes the calling thread's current device this ops' device (CUDA's
  // current device is per thread), for work queued from a thread other than
  // the one that made the ops. The CPU twins: nothing to do.
  virtual Status BindThread() { return Status::Ok(); }

 protected:
  // What the handles are made and freed with: the implementation's part.
  // The Free*Raw calls never throw and ignore errors (they run in
  // destructors).
  virtual Status AllocRaw(size_t bytes, void** p) = 0;
  virtual void FreeRaw(void* p) noexcept = 0;
  virtual Status AllocPinnedRaw(size_t bytes, void** p) = 0;
  virtual void FreePinnedRaw(void* p) noexcept = 0;
  virtual Status NewStreamRaw(void** s) = 0;
  virtual void FreeStreamRaw(void* s) noexcept = 0;
  virtual Status NewEventRaw(void** e) = 0;  // may be null on the CPU
  virtual void FreeEventRaw(void* e) noexcept = 0;

 private:
  friend class Stream;
  friend class Event;
  friend class DeviceBuffer;
  friend class PinnedBuffer;
};

// An owned stream (cudaStreamNonBlocking on the GPU). Empty when
// default-constructed or moved from; an empty one's ref() is the legacy
// default stream's, so test it (operator bool) where that would be wrong.
class Stream {
 public:
  Stream() = default;
  StreamRef ref() const { return StreamRef{h_.raw()}; }
  explicit operator bool() const { return h_.raw() != nullptr; }
  void reset() { h_.reset(); }  // frees it now

 private:
  friend class DeviceOps;
  Stream(DeviceOps* ops, void* raw) : h_(ops, raw) {}
  internal::Owned<&DeviceOps::FreeStreamRaw> h_;
};

// An owned event (cudaEventDisableTiming on the GPU; a null placeholder on
// the CPU).
class Event {
 public:
  Event() = default;
  EventRef ref() const { return EventRef{h_.raw()}; }
  void reset() { h_.reset(); }

 private:
  friend class DeviceOps;
  Event(DeviceOps* ops, void* raw) : h_(ops, raw) {}
  internal::Owned<&DeviceOps::FreeEventRaw> h_;
};

// Owned device memory (host memory on the CPU), 256-byte aligned.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  void* get() const { return h_.raw(); }
  explicit operator bool() const { return h_.raw() != nullptr; }
  void reset() { h_.reset(); }

 private:
  friend class DeviceOps;
  DeviceBuffer(DeviceOps* ops, void* raw) : h_(ops, raw) {}
  internal::Owned<&DeviceOps::FreeRaw> h_;
};

// Owned pinned (page-locked, portable) host memory for asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  void* get() const { return h_.raw(); }
  explicit operator bool() const { return h_.raw() != nullptr; }
  void reset() { h_.reset(); }

 private:
  friend class DeviceOps;
  PinnedBuffer(DeviceOps* ops, void* raw) : h_(ops, raw) {}
  internal::Owned<&DeviceOps::FreePinnedRaw> h_;
};

inline Result<Stream> DeviceOps::NewStream() {
  void* s = nullptr;
  GPUFEED_RETURN_IF_ERROR(NewStreamRaw(&s));
  return Stream(this, s);
}
inline Result<Event> DeviceOps::NewEvent() {
  void* e = nullptr;
  GPUFEED_RETURN_IF_ERROR(NewEventRaw(&e));
  return Event(this, e);
}
inline Result<DeviceBuffer> DeviceOps::Alloc(size_t bytes) {
  void* p = nullptr;
  GPUFEED_RETURN_IF_ERROR(AllocRaw(bytes, &p));
  return DeviceBuffer(this, p);
}
inline Result<PinnedBuffer> DeviceOps::AllocPinned(size_t bytes) {
  void* p = nullptr;
  GPUFEED_RETURN_IF_ERROR(AllocPinnedRaw(bytes, &p));
  return PinnedBuffer(this, p);
}

std::unique_ptr<DeviceOps> MakeCpuOps();
// MakeCudaOps' device for "the calling thread's current device", left as it is.
constexpr int kCurrentDevice = -1;
// Fails with a Status naming the CUDA error (no driver, no such device).
// In a build without CUDA: Unsupported.
Result<std::unique_ptr<DeviceOps>> MakeCudaOps(int device);

}  // namespace gpufeed::gpu

#endif  // GPUFEED_GPU_DEVICE_OPS_H_
