// SessionBatch (include/gpufeed/session.h): a delivered batch and its
// release, after a stream where one was named.
#include <cstring>
#include <memory>
#include <utility>

#include "gpu/session/session_core.h"
#include "gpufeed/session.h"

namespace gpufeed {

void RunPendingRelease(void* p) {
  std::unique_ptr<PendingRelease> r(static_cast<PendingRelease*>(p));
  std::shared_ptr<DeferredReleases> gate = r->gate;
  r.reset();  // the slot goes back to its pool
  {
    MutexLock lock(&gate->mu);
    --gate->pending;
  }
  gate->cv.SignalAll();
}

// A pinned host batch goes back to its pool after its release stream, by
// default the legacy default stream (torch's default), has run what was
// queued on it: an asynchronous copy to a GPU may still read it. (A copy
// from pageable memory cannot outlive the call that queued it.)
void SessionBatch::State::DeferHostRelease() {
  gpu::DeviceOps* ops = nullptr;
  if (host_release_stream.load()) {
    ops = core->release_ops.get();
  } else if (host->pinned()) {
    ops = core->ReleaseOps();
  }
  if (ops == nullptr) return;
  void* stream = release_stream.load();
  auto r = std::make_unique<PendingRelease>(PendingRelease{std::move(*host), core->deferred});
  host.reset();
  {
    MutexLock lock(&core->deferred->mu);
    ++core->deferred->pending;
  }
  bool launched = false;
  try {
    launched = ops->LaunchHostFunc(gpu::StreamRef{stream}, RunPendingRelease, r.get()).ok();
  } catch (...) {
  }
  if (launched) {
    (void)r.release();  // RunPendingRelease owns it now
    return;
  }
  try {
    (void)ops->StreamSync(gpu::StreamRef{stream});  // no callback: wait here instead
  } catch (...) {
  }
  RunPendingRelease(r.release());
}

SessionBatch::State::~State() {
  // The slot goes back first, then the references that keep its pool alive.
  if (device) {
    MutexLock lock(&feed->mu);
    device->Release(release_stream.load());
    device.reset();
  }
  if (host) {
    try {
      DeferHostRelease();
    } catch (...) {
      // Out of memory making the callback: released at once, as without a stream.
    }
    host.reset();
    core->held_host.fetch_sub(1, std::memory_order_relaxed);
  }
  feed.reset();
  core.reset();
}

SessionBatch::SessionBatch() = default;
SessionBatch::SessionBatch(std::unique_ptr<State> state) : state_(std::move(state)) {}
SessionBatch::SessionBatch(SessionBatch&&) noexcept = default;
SessionBatch& SessionBatch::operator=(SessionBatch&& o) noexcept {
  if (this != &o) {
    Release();
    state_ = std::move(o.state_);
  }
  return *this;
}
SessionBatch::~SessionBatch() { Release(); }

void SessionBatch::Release() {
  try {
    state_.reset();
  } catch (...) {
    // Release paths do not throw (BatchPool, GpuFeeder::ReleaseSlot); nothing to report here.
  }
}

const Batch* SessionBatch::host() const { return state_ && state_->host ? &*state_->host : nullptr; }
const DeviceBatch* SessionBatch::device() const { return state_ && state_->device ? &*state_->device : nullptr; }
const std::vector<FeedField>& SessionBatch::feed_fields() const {
  static const std::vector<FeedField> kNone;
  return state_ && state_->feed ? state_->feed->feeder->fields() : kNone;
}
uint64_t SessionBatch::epoch() const { return state_ ? state_->epoch : 0; }
uint64_t SessionBatch::index() const { return state_ ? state_->index : 0; }
uint64_t SessionBatch::size() const { return state_ ? state_->size : 0; }

Status SessionBatch::WaitOn(void* stream) const {
  if (!state_ || !state_->device || state_->device->ready_event() == nullptr) return Status::Ok();
  return state_->core->device_ops->StreamWait(gpu::StreamRef{stream}, gpu::EventRef{state_->device->ready_event()});
}

Status SessionBatch::CopyToHost(void* images, void* labels) const {
  if (!state_) return Status::InvalidArgument("SessionBatch::CopyToHost: the batch was released");
  if (const Batch* h = host()) {
    if (images != nullptr) std::memcpy(images, h->images().data(), h->images().size());
    if (labels != nullptr && !h->labels().empty()) std::memcpy(labels, h->labels().data(), h->labels().size_bytes());
    return Status::Ok();
  }
  MutexLock lock(&state_->feed->mu);
  return state_->feed->feeder->CopyToHost(*state_->device, images, labels);
}

void SessionBatch::SetReleaseStream(void* stream) {
  if (!state_) return;
  state_->release_stream.store(stream);
  if (state_->host) {
    try {
      state_->host_release_stream.store(state_->core->ReleaseOps() != nullptr);
    } catch (...) {
      // Without ops the slot is released at once, as without a stream.
    }
  }
}

}  // namespace gpufeed
