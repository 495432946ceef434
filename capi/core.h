// What the C API's files share (capi/loader.cc, capi/batch.cc): the handles.
// A gpufeed_loader is a gpufeed::Session (include/gpufeed/session.h: the
// loader, decode placement, feed, epochs, state, statistics); a
// gpufeed_batch is a SessionBatch with its named arrays for DLPack. Not
// installed.
//
// Ownership. A batch's SessionBatch holds the session's internals (the
// loader, its pool, the feeder it came from), so every exported tensor,
// through its batch, outlives nothing it points into, whatever order the
// user releases things in.
#ifndef GPUFEED_CAPI_CORE_H_
#define GPUFEED_CAPI_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "capi/c_api_internal.h"
#include "gpufeed/c_api.h"
#include "gpufeed/dtype.h"
#include "gpufeed/session.h"

namespace gpufeed::capi {

// DLPack's type of a dtype: the dtype table's (gpufeed/dtype.h).
inline DLDataType DlType(DType t) {
  const gpufeed::DTypeDlpack d = gpufeed::DTypeDlpackOf(t);
  return {d.code, d.bits, 1};
}

struct Array {
  const char* name;
  void* data;
  DLDataType dtype;
  std::vector<int64_t> shape;
};

}  // namespace gpufeed::capi

struct gpufeed_loader {
  std::unique_ptr<gpufeed::Session> session;
};

struct gpufeed_batch {
  std::atomic<int> refs{1};  // the handle + every live exported tensor
  gpufeed::SessionBatch batch;
  DLDevice dl_device{kDLCPU, 0};
  std::vector<gpufeed::capi::Array> arrays;

  void Unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    batch.Release();  // the slot goes back (after its release stream), then what keeps its pool alive
    delete this;
  }
};

namespace gpufeed::capi {

// A batch handle for what the session delivered (capi/batch.cc): its named
// arrays (DLPack types from the dtype table), its slot held by the handle.
gpufeed_batch* MakeBatch(const gpufeed::Session& session, gpufeed::SessionBatch batch);

}  // namespace gpufeed::capi

#endif  // GPUFEED_CAPI_CORE_H_
