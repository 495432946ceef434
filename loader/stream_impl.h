// EpochStream::Impl: the interface behind EpochStream. The local pipeline
// (loader.cc) and RemoteLoader's connection (loader/remote/remote_loader.cc)
// implement it; EpochStream forwards to it.
#ifndef GPUFEED_LOADER_STREAM_IMPL_H_
#define GPUFEED_LOADER_STREAM_IMPL_H_

#include <chrono>
#include <memory>
#include <optional>

#include "gpufeed/loader.h"

namespace gpufeed {

struct EpochStream::Impl {
  virtual ~Impl() = default;
  // The consumer's calls (one thread), as documented on EpochStream.
  virtual Result<std::optional<Batch>> Next() = 0;
  // WaitFor's and Interrupt's (EpochStream). A stream with nothing to wait
  // for (one that failed before it started) is always ready.
  virtual WaitResult WaitReady(std::chrono::steady_clock::time_point deadline) {
    (void)deadline;
    return WaitResult::kReady;
  }
  virtual void Interrupt() {}
  virtual uint64_t num_batches() const = 0;
  virtual LoaderStats stats() const = 0;
  // Idempotent. When it returns, no thread of the stream runs or touches a
  // pool slot, and every slot the stream held is back in its pool.
  virtual void Stop() = 0;

 protected:
  static EpochStream Wrap(std::unique_ptr<Impl> impl) { return EpochStream(std::move(impl)); }
  static Batch MakeBatch(Batch::Slot* slot, uint64_t epoch, uint64_t index, uint64_t count, uint64_t sample_bytes,
                         bool has_labels, const std::vector<uint64_t>* sample_shape,
                         const std::vector<FieldInfo>* fields) {
    return EpochStream::MakeBatch(slot, epoch, index, count, sample_bytes, has_labels, sample_shape, fields);
  }
};

}  // namespace gpufeed

#endif  // GPUFEED_LOADER_STREAM_IMPL_H_
