// The GPU ranks' collectives (trainer/comm.h) through NCCL, loaded at run
// time (libnccl.so.2 comes with the host's CUDA; a build or a CPU run needs
// none). Collectives run on a stream of their own: AllReduce records an
// event on the compute stream and the collectives' stream waits on it, so
// a bucket's all-reduce overlaps the backward pass of the layers before it
// (llm.c's pattern); Join makes the compute stream wait for them. All of it
// may be recorded into a CUDA graph (NCCL supports capture).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu/cuda_check.h"
#include "trainer/comm.h"

namespace gpufeed::trainer {
namespace {

struct NcclApi {
  void* lib = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

  Status Load() {
    lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      return Status::Unsupported(std::string("train: NCCL is not installed here (") + dlerror() +
                                 "); data parallel on GPUs needs libnccl.so.2 (it comes with the CUDA toolkit)");
    bool ok = true;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(lib, name));
      ok = ok && *fn != nullptr;
    };
    sym(&get_version, "ncclGetVersion");
    sym(&get_unique_id, "ncclGetUniqueId");
    sym(&init_rank, "ncclCommInitRank");
    sym(&destroy, "ncclCommDestroy");
    sym(&abort, "ncclCommAbort");
    sym(&all_reduce, "ncclAllReduce");
    sym(&broadcast, "ncclBroadcast");
    sym(&all_gather, "ncclAllGather");
    sym(&group_start, "ncclGroupStart");
    sym(&group_end, "ncclGroupEnd");
    sym(&error_string, "ncclGetErrorString");
    if (!ok) return Status::Unsupported("train: libnccl.so.2 lacks the entry points gpufeed uses (too old?)");
    return Status::Ok();
  }
};

#define NCCL_RETURN(call)                                                                                    \
  do {                                                                                                       \
    const ncclResult_t r_ = (call);                                                                          \
    if (r_ != ncclSuccess)                                                                                   \
      return Status::Internal(std::string("NCCL: ") + #call + " failed: " + api_.error_string(r_) + " at " + \
                              __FILE__ + ":" + std::to_string(__LINE__));                                    \
  } while (0)

class NcclComm final : public Comm {
 public:
  NcclComm(const CommOptions& o, int device, cudaStream_t compute)
      : Comm(o.rank, o.world_size), o_(o), device_(device), compute_(compute) {}
  ~NcclComm() override {
    cudaSetDevice(device_);
    // After a failure a collective may wait for a peer that will never come:
    // abort the communicator (it ends its kernels) before anything waits.
    if (comm_ && aborted_) api_.abort(comm_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_ && !aborted_) api_.destroy(comm_);
    for (auto& [a, b] : timing_) cudaEventDestroy(a), cudaEventDestroy(b);
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    if (gather_) cudaFree(gather_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init() {
    GPUFEED_RETURN_IF_ERROR(api_.Load());
    int v = 0;
    api_.get_version(&v);
    describe_ =
        "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    ncclUniqueId id{};
    std::string payload;
    if (rank() == 0) {
      NCCL_RETURN(api_.get_unique_id(&id));
      payload.assign(id.internal, sizeof id.internal);
    }
    auto got = Rendezvous(o_, payload);
    if (!got.ok()) return got.status();
    if (got->size() != sizeof id.internal) return Status::Corrupt("train: the rendezvous holds no NCCL id");
    std::memcpy(id.internal, got->data(), sizeof id.internal);
    NCCL_RETURN(api_.init_rank(&comm_, world_size(), id, rank()));
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    GPUFEED_CUDA_RETURN(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    GPUFEED_CUDA_RETURN(cudaMalloc(&gather_, kGatherBytes * size_t(world_size())));
    // Every rank has read the id once the communicator is up.
    std::vector<char> all(static_cast<size_t>(world_size()));
    char one = 1;
    GPUFEED_RETURN_IF_ERROR(AllGather(&one, 1, all.data()));
    RendezvousDone(o_);
    return Status::Ok();
  }

  std::string Describe() const override { return describe_; }

  Status AllReduce(float* const* bufs, const size_t* sizes, int count) override {
    GPUFEED_CUDA_RETURN(cudaEventRecord(ready_, compute_));
    GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(stream_, ready_, 0));
    cudaEvent_t start = nullptr, end = nullptr;
    if (timing_on_) {
      GPUFEED_RETURN_IF_ERROR(TimingPair(&start, &end));
      GPUFEED_CUDA_RETURN(cudaEventRecord(start, stream_));
    }
    NCCL_RETURN(api_.group_start());
    for (int i = 0; i < count; ++i) {
      const ncclResult_t r = api_.all_reduce(bufs[i], bufs[i], sizes[i], ncclFloat32, ncclSum, comm_, stream_);
      if (r != ncclSuccess) {
        api_.group_end();
        return Status::Internal(std::string("NCCL: ncclAllReduce failed: ") + api_.error_string(r));
      }
    }
    NCCL_RETURN(api_.group_end());
    if (timing_on_) GPUFEED_CUDA_RETURN(cudaEventRecord(end, stream_));
    pending_ = true;
    return Status::Ok();
  }

  Status Broadcast(float* buf, size_t n, int root) override {
    GPUFEED_CUDA_RETURN(cudaEventRecord(ready_, compute_));
    GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(stream_, ready_, 0));
    NCCL_RETURN(api_.broadcast(buf, buf, n, ncclFloat32, root, comm_, stream_));
    pending_ = true;
    return Status::Ok();
  }

  Status Join() override {
    if (!pending_) return Status::Ok();
    GPUFEED_CUDA_RETURN(cudaEventRecord(done_, stream_));
    GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(compute_, done_, 0));
    pending_ = false;
    return Status::Ok();
  }

  Status AllGather(const void* mine, size_t bytes, void* all) override {
    if (bytes > kGatherBytes) return Status::InvalidArgument("train: AllGather of too many bytes");
    char* d = static_cast<char*>(gather_);
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(d + size_t(rank()) * bytes, mine, bytes, cudaMemcpyHostToDevice, stream_));
    NCCL_RETURN(api_.all_gather(d + size_t(rank()) * bytes, d, bytes, ncclUint8, comm_, stream_));
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(all, d, bytes * size_t(world_size()), cudaMemcpyDeviceToHost, stream_));
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  void Abort() override { aborted_ = true; }

  void SetTiming(bool on) override { timing_on_ = on; }
  double BusyMs() override {
    double sum = 0;
    for (size_t i = 0; i < timing_used_; ++i) {
      float ms = 0;
      if (cudaEventSynchronize(timing_[i].second) != cudaSuccess ||
          cudaEventElapsedTime(&ms, timing_[i].first, timing_[i].second) != cudaSuccess)
        return -1;
      sum += ms;
    }
    timing_used_ = 0;
    return sum;
  }

 private:
  static constexpr size_t kGatherBytes = 4096;

  Status TimingPair(cudaEvent_t* a, cudaEvent_t* b) {
    if (timing_used_ == timing_.size()) {
      cudaEvent_t x = nullptr, y = nullptr;
      GPUFEED_CUDA_RETURN(cudaEventCreate(&x));
      GPUFEED_CUDA_RETURN(cudaEventCreate(&y));
      timing_.emplace_back(x, y);
    }
    *a = timing_[timing_used_].first;
    *b = timing_[timing_used_].second;
    ++timing_used_;
    return Status::Ok();
  }

  NcclApi api_;
  CommOptions o_;
  int device_;
  cudaStream_t compute_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  void* gather_ = nullptr;
  bool pending_ = false, aborted_ = false, timing_on_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timing_;
  size_t timing_used_ = 0;
  std::string describe_;
};

}  // namespace

Result<std::unique_ptr<Comm>> MakeNcclComm(const CommOptions& o, int device, void* compute_stream) {
  auto c = std::make_unique<NcclComm>(o, device, static_cast<cudaStream_t>(compute_stream));
  GPUFEED_RETURN_IF_ERROR(c->Init().WithContext("rank " + std::to_string(o.rank)));
  return std::unique_ptr<Comm>(std::move(c));
}

}  // namespace gpufeed::trainer
