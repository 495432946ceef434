// The C API's batches (include/gpufeed/c_api.h, "batches"): their named
// arrays exported as DLPack tensors, and their release (after a stream).
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "capi/core.h"

using gpufeed::Batch;
using gpufeed::DeviceBatch;
using gpufeed::DType;
using gpufeed::Status;
using gpufeed::capi::Array;
using gpufeed::capi::DlType;
using gpufeed::capi::Fail;
using gpufeed::capi::Guard;

namespace {

struct Export {
  DLManagedTensor tensor;
  std::vector<int64_t> shape;
  gpufeed_batch* batch;
};

void DeleteExport(DLManagedTensor* t) {
  auto* e = static_cast<Export*>(t->manager_ctx);
  gpufeed_batch* b = e->batch;
  delete e;
  b->Unref();
}

}  // namespace

namespace gpufeed::capi {

gpufeed_batch* MakeBatch(const gpufeed::Session& session, gpufeed::SessionBatch batch) {
  auto b = std::make_unique<gpufeed_batch>();
  const auto& info = session.info();
  const int64_t n = static_cast<int64_t>(batch.size());
  if (const Batch* host = batch.host()) {
    const Batch& h = *host;
    std::vector<int64_t> shape{n};
    for (uint64_t d : h.sample_shape()) shape.push_back(static_cast<int64_t>(d));
    // Named fields (a FieldSource): one array per field, by its name.
    const bool named = info.fields.size() > 1 || (info.fields.size() == 1 && !info.fields[0].path.empty());
    if (named) {
      for (size_t f = 0; f < info.fields.size(); ++f) {
        const gpufeed::FieldInfo& fi = info.fields[f];
        std::vector<int64_t> fshape{n};
        for (uint64_t d : fi.sample_shape) fshape.push_back(static_cast<int64_t>(d));
        b->arrays.push_back({fi.name.c_str(), const_cast<std::byte*>(h.field(f).data()), DlType(fi.dtype), fshape});
      }
    } else {
      b->arrays.push_back({"images", const_cast<std::byte*>(h.images().data()), DlType(info.dtype), shape});
    }
    if (!h.labels().empty()) {
      b->arrays.push_back({"labels", const_cast<int64_t*>(h.labels().data()), DlType(DType::kInt64), {n}});
    }
    // Global sample indices (uint64 in the pool, < 2^63): int64, the type
    // every DLPack consumer takes.
    b->arrays.push_back({"indices", const_cast<uint64_t*>(h.indices().data()), DlType(DType::kInt64), {n}});
  } else {
    const DeviceBatch& d = *batch.device();
    const gpufeed::FeedOptions& fo = session.options().feed_options;
    // One array per field as the feeder delivers it: the image ("images" for
    // a source of /images) transformed, then a source's later named fields (a
    // class as the labels, masks cropped with the image, others as stored).
    const std::vector<gpufeed::FeedField>& fields = batch.feed_fields();
    for (size_t i = 0; i < fields.size(); ++i) {
      std::vector<int64_t> shape{n};
      for (uint64_t dim : fields[i].sample_shape) shape.push_back(static_cast<int64_t>(dim));
      b->arrays.push_back({fields[i].name.c_str(), const_cast<void*>(d.field(i)), DlType(fields[i].dtype), shape});
    }
    // The source's labels, unless a class field took their place.
    const bool class_field = std::any_of(fields.begin(), fields.end(), [](const gpufeed::FeedField& x) {
      return x.role == gpufeed::FeedFieldRole::kClass;
    });
    if (info.has_labels && !class_field) {
      b->arrays.push_back(
          {"labels", const_cast<void*>(d.labels()), DlType(fo.labels_int32 ? DType::kInt32 : DType::kInt64), {n}});
    }
    if (d.ready_event() != nullptr) b->dl_device = {kDLCUDA, fo.device};
  }
  b->batch = std::move(batch);
  return b.release();
}

}  // namespace gpufeed::capi

namespace {
// Python's capsule calls, found in the process that loaded this library
// (the interpreter exports them); null where there is no Python. Outside
// the extern "C" block: C++ linkage, for a function that returns a struct.
struct CapsuleCalls {
  int (*is_valid)(void*, const char*) = nullptr;
  void* (*get_pointer)(void*, const char*) = nullptr;
};
const CapsuleCalls& Capsules() {
  static const CapsuleCalls calls = [] {
    CapsuleCalls c;
    c.is_valid = reinterpret_cast<int (*)(void*, const char*)>(::dlsym(RTLD_DEFAULT, "PyCapsule_IsValid"));
    c.get_pointer = reinterpret_cast<void* (*)(void*, const char*)>(::dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer"));
    return c;
  }();
  return calls;
}
}  // namespace

extern "C" {

uint64_t gpufeed_batch_epoch(const gpufeed_batch* b) { return b->batch.epoch(); }
uint64_t gpufeed_batch_index(const gpufeed_batch* b) { return b->batch.index(); }
uint64_t gpufeed_batch_size(const gpufeed_batch* b) { return b->batch.size(); }
int gpufeed_batch_num_arrays(const gpufeed_batch* b) { return static_cast<int>(b->arrays.size()); }
const char* gpufeed_batch_array_name(const gpufeed_batch* b, int i) {
  return i >= 0 && static_cast<size_t>(i) < b->arrays.size() ? b->arrays[static_cast<size_t>(i)].name : nullptr;
}
int gpufeed_batch_find_array(const gpufeed_batch* b, const char* name) {
  for (size_t i = 0; name != nullptr && i < b->arrays.size(); ++i) {
    if (std::strcmp(b->arrays[i].name, name) == 0) return static_cast<int>(i);
  }
  return -1;
}

DLManagedTensor* gpufeed_batch_array_dlpack(gpufeed_batch* b, int i, gpufeed_error** error) {
  DLManagedTensor* out = nullptr;
  Guard(error, [&]() -> gpufeed_code {
    if (b == nullptr || i < 0 || static_cast<size_t>(i) >= b->arrays.size()) {
      return Fail(error, GPUFEED_INVALID_ARGUMENT,
                  "gpufeed_batch_array_dlpack: array " + std::to_string(i) + " of " +
                      std::to_string(b != nullptr ? b->arrays.size() : 0));
    }
    const Array& a = b->arrays[static_cast<size_t>(i)];
    auto e = std::make_unique<Export>();
    e->shape = a.shape;
    e->batch = b;
    DLTensor& t = e->tensor.dl_tensor;
    t.data = a.data;
    t.device = b->dl_device;
    t.ndim = static_cast<int>(e->shape.size());
    t.dtype = a.dtype;
    t.shape = e->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    e->tensor.manager_ctx = e.get();
    e->tensor.deleter = DeleteExport;
    b->refs.fetch_add(1, std::memory_order_relaxed);
    out = &e.release()->tensor;
    return GPUFEED_OK;
  });
  return out;
}

int gpufeed_dlpack_capsule_destructor_available(void) {
  return Capsules().is_valid != nullptr && Capsules().get_pointer != nullptr ? 1 : 0;
}

void gpufeed_dlpack_capsule_destructor(void* capsule) {
  const CapsuleCalls& c = Capsules();
  if (capsule == nullptr || c.is_valid == nullptr || c.get_pointer == nullptr) return;
  if (c.is_valid(capsule, "dltensor") != 0) {
    gpufeed_dlpack_delete(static_cast<DLManagedTensor*>(c.get_pointer(capsule, "dltensor")));
  }
}

void gpufeed_dlpack_delete(DLManagedTensor* t) {
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
}

gpufeed_code gpufeed_batch_wait_stream(gpufeed_batch* b, void* stream, gpufeed_error** error) {
  return Guard(error, [&]() -> gpufeed_code {
    const Status s = b->batch.WaitOn(stream);
    return s.ok() ? GPUFEED_OK : Fail(error, s);
  });
}

void gpufeed_batch_set_release_stream(gpufeed_batch* b, void* stream) {
  b->batch.SetReleaseStream(stream);  // any thread; without CUDA a host slot is released at once
}

void gpufeed_batch_destroy(gpufeed_batch* b) {
  if (b == nullptr) return;
  try {
    b->Unref();
  } catch (...) {
    // Release paths do not throw (BatchPool, GpuFeeder::ReleaseSlot); nothing to report here.
  }
}

}  // extern "C"
