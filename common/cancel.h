// Cancelling the blocking reads a thread makes for something that may stop
// (a loader's epoch stream): the thread runs its work under a ScopedCancel
// naming a flag, and a read that can take long (a remote object's ranged
// GETs and their retries, hdf5io/io/http_file.h) takes the thread's flag
// with it. When the flag is set the read ends at once with an error, starts
// no retry, and a read not yet started is not made. Reads on a thread
// without a flag are never cancelled.
//
// The flag travels by thread, not by argument: the reads happen deep under
// ChunkSource::ReadChunk (a dataset, HDF5's driver, the transport), whose
// interfaces carry no context. Every task a stream runs on a TBB thread
// sets it for its own body (a task may run on any thread of the arena).
//
// Thread safety: the flag is shared and atomic; the current one is per
// thread.
#ifndef GPUFEED_COMMON_CANCEL_H_
#define GPUFEED_COMMON_CANCEL_H_

#include <atomic>
#include <memory>
#include <utility>

namespace gpufeed {

// Shared: a read may outlive the stream that started it (a remote read
// ahead stays with its file), and holds the flag as long as it does.
using CancelFlag = std::shared_ptr<const std::atomic<bool>>;

namespace cancel_internal {
inline thread_local CancelFlag current;
}  // namespace cancel_internal

// The calling thread's flag (null: none).
inline const CancelFlag& CurrentCancel() { return cancel_internal::current; }
inline bool IsCancelled(const CancelFlag& f) { return f != nullptr && f->load(std::memory_order_acquire); }
// Whether the calling thread's work has been cancelled.
inline bool CurrentCancelled() { return IsCancelled(cancel_internal::current); }

// Sets the calling thread's flag for its lifetime; the previous one (a
// task run inside another's wait) comes back after.
class ScopedCancel {
 public:
  explicit ScopedCancel(CancelFlag f) : prev_(std::exchange(cancel_internal::current, std::move(f))) {}
  ~ScopedCancel() { cancel_internal::current = std::move(prev_); }
  ScopedCancel(const ScopedCancel&) = delete;
  ScopedCancel& operator=(const ScopedCancel&) = delete;

 private:
  CancelFlag prev_;
};

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_CANCEL_H_
