// The CUDA backend of the trainer's operations: cuBLAS GEMMs (fp32
// accumulation, tensor cores for bf16/fp16), cuDNN convolutions (NHWC,
// deterministic algorithms; plans in conv_plans_cuda.cu), and our kernels
// (kernels_cuda.cuh) for everything else — each with
// its CPU reference of the same signature in ops_cpu.cc and the per-element
// math shared through elem.h. Every reduction has a fixed order (block
// partials, then one block), so a run's results do not depend on scheduling:
// a resumed run reproduces an uninterrupted one bit for bit. cuBLAS and
// cuDNN are called through the tables of cuda_libs.h (loaded at run time).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "trainer/conv_plans_cuda.h"
#include "trainer/cuda_libs.h"
#include "trainer/cuda_status.h"
#include "trainer/elem.h"
#include "trainer/kernels_cuda.cuh"
#include "trainer/ops.h"

namespace gpufeed::trainer {
namespace {

#define DISPATCH(dt, T, ...)                                                      \
  switch (dt) {                                                                   \
    case DType::kFloat32: {                                                       \
      using T = float;                                                            \
      __VA_ARGS__                                                                 \
    } break;                                                                      \
    case DType::kBFloat16: {                                                      \
      using T = __nv_bfloat16;                                                    \
      __VA_ARGS__                                                                 \
    } break;                                                                      \
    case DType::kFloat16: {                                                       \
      using T = __half;                                                           \
      __VA_ARGS__                                                                 \
    } break;                                                                      \
    default:                                                                      \
      return Status::Unsupported("trainer: dtype " + std::string(DTypeName(dt))); \
  }

unsigned Blocks(size_t n, unsigned threads = 256) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 65535u * 16));
}

// The kernels (kernels_cuda.cuh): this file launches them.
using namespace kernels;  // NOLINT(build/namespaces): one file's launch sites

// --- the backend ----------------------------------------------------------------------

// cuBLAS's own workspace: 32 MiB, what NVIDIA's documentation recommends
// for Hopper.
constexpr size_t kCublasWorkspace = 32u << 20;

class CudaOps final : public Ops {
 public:
  // `lib`: the loaded cuBLAS and cuDNN (they stay loaded for the process).
  CudaOps(int device, const CudaLibs& lib) : device_(device), blas_(lib.blas), dnn_(lib.dnn), plans_(lib.dnn) {}
  ~CudaOps() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (side_) cudaStreamSynchronize(side_), cudaStreamDestroy(side_);
    for (void* p : scratch_) cudaFree(p);
    if (workspace_) cudaFree(workspace_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    for (cudaEvent_t e : marks_)
      if (e) cudaEventDestroy(e);
    if (cudnn_) dnn_.destroy(cudnn_);
    if (cublas_) blas_.destroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init() {
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    cudaDeviceProp prop;
    GPUFEED_CUDA_RETURN(cudaGetDeviceProperties(&prop, device_));
    char bus[32];
    GPUFEED_CUDA_RETURN(cudaDeviceGetPCIBusId(bus, sizeof bus, device_));
    pci_ = bus;
    describe_ = "cuda:" + std::to_string(device_) + " " + prop.name + " (sm_" + std::to_string(prop.major) +
                std::to_string(prop.minor) + ", cuDNN " + std::to_string(dnn_.get_version()) + ")";
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_RETURN(blas_.create(&cublas_));
    CUBLAS_RETURN(blas_.set_stream(cublas_, stream_));
    GPUFEED_CUDA_RETURN(cudaMalloc(&cublas_workspace_, kCublasWorkspace));
    CUBLAS_RETURN(blas_.set_workspace(cublas_, cublas_workspace_, kCublasWorkspace));
    CUDNN_RETURN(dnn_.create(&cudnn_));
    CUDNN_RETURN(dnn_.set_stream(cudnn_, stream_));
    return Status::Ok();
  }

  bool on_gpu() const override { return true; }
  std::string Describe() const override { return describe_; }
  std::string PciBusId() const override { return pci_; }
  void* stream() const override { return stream_; }

  Status Alloc(size_t bytes, void** p) override {
    GPUFEED_CUDA_RETURN(cudaMalloc(p, std::max<size_t>(bytes, 1)));
    GPUFEED_CUDA_RETURN(cudaMemsetAsync(*p, 0, bytes, stream_));
    return Status::Ok();
  }
  void Free(void* p) override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  Status Upload(void* dst, const void* src, size_t bytes) override {
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(stream_));  // src may be freed when we return
    return Status::Ok();
  }
  Status Download(void* dst, const void* src, size_t bytes) override {
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return Status::Ok();
  }
  Status Sync() override {
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }
  Status WaitEvent(void* event) override {
    if (event) GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0));
    return Status::Ok();
  }
  size_t DeviceBytesUsed() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return total - free;
  }
  size_t WorkspaceBytes() const override { return workspace_bytes_ + scratch_bytes_ + kCublasWorkspace; }

  Status Gemm(const GemmArgs& g) override {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    CUBLAS_RETURN(blas_.gemm_ex(cublas_, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                g.n, g.m, g.k, &g.alpha, g.b, CudaType(g.ab), g.ldb, g.a, CudaType(g.ab), g.lda,
                                &g.beta, g.c, CudaType(g.c_dtype), g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  }

  Status Cast(const float* src, void* dst, DType dt, size_t n) override {
    DISPATCH(dt, T, CastKernel<T><<<Blocks(n), 256, 0, stream_>>>(src, static_cast<T*>(dst), n);)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status BiasAct(void* y, const float* bias, int rows, int cols, bool relu, DType dt) override {
    const size_t n = size_t(rows) * cols;
    DISPATCH(dt, T, BiasActKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<T*>(y), bias, n, cols, relu);)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status ReluBackward(void* dy, const void* y, size_t n, DType dt) override {
    DISPATCH(dt, T,
             ReluBackwardKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<T*>(dy), static_cast<const T*>(y), n);)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status ColumnSum(const void* dy, int rows, int cols, DType dt, float* db, float beta) override {
    DISPATCH(dt, T,
             ColumnSumKernel<T>
             <<<(cols + 127) / 128, 128, 0, stream_>>>(static_cast<const T*>(dy), rows, cols, db, beta);)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  // The one cuDNN workspace, grown (after the queued work) when a plan needs more.
  Status Workspace(size_t bytes) {
    if (bytes <= workspace_bytes_) return Status::Ok();
    if (capturing_) return Status::Unsupported("the cuDNN workspace would grow while a graph is captured");
    ++generation_;
    GPUFEED_CUDA_RETURN(cudaStreamSynchronize(stream_));
    if (workspace_) GPUFEED_CUDA_RETURN(cudaFree(workspace_));
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    GPUFEED_CUDA_RETURN(cudaMalloc(&workspace_, bytes));
    workspace_bytes_ = bytes;
    return Status::Ok();
  }
  // Named scratch buffers (reduction partials, row losses, bf16 filter grads).
  Result<void*> Scratch(int id, size_t bytes) {
    if (scratch_.size() <= size_t(id)) scratch_.resize(id + 1, nullptr), scratch_size_.resize(id + 1, 0);
    if (scratch_size_[id] < bytes) {
      if (capturing_) return Status::Unsupported("a scratch buffer would grow while a graph is captured");
      ++generation_;
      GPUFEED_CUDA_RETURN(cudaStreamSynchronize(stream_));
      if (scratch_[id]) cudaFree(scratch_[id]);
      scratch_bytes_ -= scratch_size_[id];
      scratch_[id] = nullptr;
      scratch_size_[id] = 0;
      GPUFEED_CUDA_RETURN(cudaMalloc(&scratch_[id], bytes));
      scratch_size_[id] = bytes;
      scratch_bytes_ += bytes;
    }
    return scratch_[id];
  }
  enum ScratchId { kPartialA, kPartialB, kChannelA, kChannelB, kRowLoss, kRowHit, kFilterGrad, kNormPartial, kNormSum };

  Status ConvForward(const ConvShape& s, const void* x, const void* w, void* y) override {
    auto p = plans_.Get(cudnn_, s);
    if (!p.ok()) return p.status();
    GPUFEED_RETURN_IF_ERROR(Workspace((*p)->fwd_ws));
    const float one = 1, zero = 0;
    CUDNN_RETURN(dnn_.convolution_forward(cudnn_, &one, (*p)->x, x, (*p)->w, w, (*p)->fwd, (*p)->fwd_algo, workspace_,
                                          (*p)->fwd_ws, &zero, (*p)->y, y));
    return Status::Ok();
  }
  Status ConvBackwardData(const ConvShape& s, const void* dy, const void* w, void* dx) override {
    auto p = plans_.Get(cudnn_, s);
    if (!p.ok()) return p.status();
    GPUFEED_RETURN_IF_ERROR(Workspace((*p)->data_ws));
    const float one = 1, zero = 0;
    CUDNN_RETURN(dnn_.convolution_backward_data(cudnn_, &one, (*p)->w, w, (*p)->y, dy, (*p)->bwd_data, (*p)->data_algo,
                                                workspace_, (*p)->data_ws, &zero, (*p)->x, dx));
    return Status::Ok();
  }
  Status ConvBackwardFilter(const ConvShape& s, const void* x, const void* dy, float* dw, float beta) override {
    auto p = plans_.Get(cudnn_, s);
    if (!p.ok()) return p.status();
    GPUFEED_RETURN_IF_ERROR(Workspace((*p)->filter_ws));
    const float one = 1, zero = 0;
    if (s.dtype == DType::kFloat32) {
      CUDNN_RETURN(dnn_.convolution_backward_filter(cudnn_, &one, (*p)->x, x, (*p)->y, dy, (*p)->bwd_filter,
                                                    (*p)->filter_algo, workspace_, (*p)->filter_ws, &beta, (*p)->w,
                                                    dw));
      return Status::Ok();
    }
    // cuDNN writes the filter gradient in the data type; add it to fp32.
    auto tmp = Scratch(kFilterGrad, s.w_elems() * DTypeSize(s.dtype));
    if (!tmp.ok()) return tmp.status();
    CUDNN_RETURN(dnn_.convolution_backward_filter(cudnn_, &one, (*p)->x, x, (*p)->y, dy, (*p)->bwd_filter,
                                                  (*p)->filter_algo, workspace_, (*p)->filter_ws, &zero, (*p)->w,
                                                  *tmp));
    const size_t n = s.w_elems();
    DISPATCH(s.dtype, T, AccumulateKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<const T*>(*tmp), dw, n, beta);)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  // Partials for `rows` x C: grid (C/32, groups), each block a slice of rows.
  void BnGrid(size_t rows, int C, dim3* grid, size_t* rows_per_block) {
    const size_t groups = std::min<size_t>(1024, std::max<size_t>(1, rows / 256));
    *rows_per_block = (rows + groups - 1) / groups;
    *grid = dim3((C + 31) / 32, static_cast<unsigned>((rows + *rows_per_block - 1) / *rows_per_block));
  }

  Status BnReluForward(const BnArgs& a, bool training, const void* x, const float* gamma, const float* beta,
                       float* running_mean, float* running_var, float* save_mean, float* save_invstd,
                       void* y) override {
    const size_t n = a.rows * a.c;
    if (training) {
      dim3 grid;
      size_t rpb;
      BnGrid(a.rows, a.c, &grid, &rpb);
      auto pa = Scratch(kPartialA, size_t(grid.y) * a.c * 4), pb = Scratch(kPartialB, size_t(grid.y) * a.c * 4);
      if (!pa.ok()) return pa.status();
      if (!pb.ok()) return pb.status();
      float *fa = static_cast<float*>(*pa), *fb = static_cast<float*>(*pb);
      DISPATCH(a.dtype, T,
               BnPartialKernel<T, 0><<<grid, dim3(32, kBnRowLanes), 0, stream_>>>(
                   static_cast<const T*>(x), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, a.rows, a.c, rpb, fa,
                   fb, a.relu);)
      LAUNCH_CHECK();
      BnStatsFinishKernel<<<(a.c + 127) / 128, 128, 0, stream_>>>(fa, fb, int(grid.y), a.c, a.rows, a.eps, a.momentum,
                                                                  running_mean, running_var, save_mean, save_invstd);
      LAUNCH_CHECK();
    } else {
      BnEvalStatsKernel<<<(a.c + 127) / 128, 128, 0, stream_>>>(running_mean, running_var, a.eps, a.c, save_mean,
                                                                save_invstd);
      LAUNCH_CHECK();
    }
    DISPATCH(a.dtype, T,
             BnReluApplyKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<const T*>(x), gamma, beta, save_mean,
                                                                  save_invstd, n, a.c, static_cast<T*>(y), a.relu);)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status BnReluBackward(const BnArgs& a, const void* x, const void* y, const void* dy, const float* gamma,
                        const float* beta, const float* save_mean, const float* save_invstd, void* dx, float* dgamma,
                        float* dbeta, float beta_acc) override {
    const size_t n = a.rows * a.c;
    dim3 grid;
    size_t rpb;
    BnGrid(a.rows, a.c, &grid, &rpb);
    auto pa = Scratch(kPartialA, size_t(grid.y) * a.c * 4), pb = Scratch(kPartialB, size_t(grid.y) * a.c * 4);
    auto ca = Scratch(kChannelA, size_t(a.c) * 4), cb = Scratch(kChannelB, size_t(a.c) * 4);
    for (auto* r : {&pa, &pb, &ca, &cb})
      if (!r->ok()) return r->status();
    float *fa = static_cast<float*>(*pa), *fb = static_cast<float*>(*pb);
    float *sgx = static_cast<float*>(*ca), *sg = static_cast<float*>(*cb);
    DISPATCH(a.dtype, T,
             BnPartialKernel<T, 1><<<grid, dim3(32, kBnRowLanes), 0, stream_>>>(
                 static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), gamma, beta, save_mean,
                 save_invstd, a.rows, a.c, rpb, fa, fb, a.relu);)
    LAUNCH_CHECK();
    BnBackwardFinishKernel<<<(a.c + 127) / 128, 128, 0, stream_>>>(fa, fb, int(grid.y), a.c, sgx, sg, dgamma, dbeta,
                                                                   beta_acc);
    LAUNCH_CHECK();
    const float inv_m = 1.0f / static_cast<float>(a.rows);
    DISPATCH(a.dtype, T,
             BnReluBackwardApplyKernel<T><<<Blocks(n), 256, 0, stream_>>>(
                 static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), gamma, beta, save_mean,
                 save_invstd, sgx, sg, n, a.c, inv_m, static_cast<T*>(dx), a.relu);)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status MaxPoolForward(int n, int h, int w, int c, DType dt, const void* x, void* y, uint8_t* argmax) override {
    const size_t total = size_t(n) * (h / 2) * (w / 2) * c;
    DISPATCH(dt, T,
             MaxPoolKernel<T>
             <<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(x), n, h, w, c, static_cast<T*>(y), argmax);)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status MaxPoolBackward(int n, int h, int w, int c, DType dt, const void* dy, const uint8_t* argmax,
                         void* dx) override {
    GPUFEED_CUDA_RETURN(cudaMemsetAsync(dx, 0, size_t(n) * h * w * c * DTypeSize(dt), stream_));
    const size_t total = size_t(n) * (h / 2) * (w / 2) * c;
    DISPATCH(dt, T,
             MaxPoolBackwardKernel<T>
             <<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(dy), argmax, n, h, w, c, static_cast<T*>(dx));)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status MaxPool3x3Forward(int n, int h, int w, int c, DType dt, const void* x, void* y, uint8_t* argmax) override {
    const size_t total = size_t(n) * ((h + 1) / 2) * ((w + 1) / 2) * c;
    DISPATCH(dt, T,
             MaxPool3x3Kernel<T>
             <<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(x), n, h, w, c, static_cast<T*>(y), argmax);)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status MaxPool3x3Backward(int n, int h, int w, int c, DType dt, const void* dy, const uint8_t* argmax,
                            void* dx) override {
    const size_t total = size_t(n) * h * w * c;
    DISPATCH(dt, T,
             MaxPool3x3BackwardKernel<T>
             <<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(dy), argmax, n, h, w, c, static_cast<T*>(dx));)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status GlobalAvgPoolForward(int n, int hw, int c, DType dt, const void* x, void* y) override {
    const size_t total = size_t(n) * c;
    DISPATCH(dt, T,
             GlobalAvgPoolKernel<T>
             <<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(x), n, hw, c, static_cast<T*>(y));)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status GlobalAvgPoolBackward(int n, int hw, int c, DType dt, const void* dy, void* dx) override {
    const size_t total = size_t(n) * hw * c;
    DISPATCH(dt, T,
             GlobalAvgPoolBackwardKernel<T>
             <<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(dy), n, hw, c, static_cast<T*>(dx));)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status AddAct(void* y, const void* x, size_t n, bool relu, DType dt) override {
    DISPATCH(dt, T,
             AddActKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<T*>(y), static_cast<const T*>(x), n, relu);)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status SoftmaxXent(int rows, int classes, DType dt, const void* logits, const int32_t* labels, double* loss_sum,
                     int64_t* correct, void* dlogits, const ScalerState* scaler, float denom) override {
    auto rl = Scratch(kRowLoss, size_t(rows) * 4), rh = Scratch(kRowHit, size_t(rows) * 4);
    if (!rl.ok()) return rl.status();
    if (!rh.ok()) return rh.status();
    const unsigned blocks = static_cast<unsigned>((size_t(rows) * 32 + 255) / 256);
    DISPATCH(dt, T,
             SoftmaxXentKernel<T>
             <<<blocks, 256, 0, stream_>>>(static_cast<const T*>(logits), labels, rows, classes, scaler, denom,
                                           static_cast<T*>(dlogits), static_cast<float*>(*rl), static_cast<int*>(*rh));)
    LAUNCH_CHECK();
    SumRowsKernel<<<1, 256, 0, stream_>>>(static_cast<const float*>(*rl), static_cast<const int*>(*rh), rows, loss_sum,
                                          correct);
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status FinishGradients(float* const* grads, const size_t* sizes, int count, float clip_norm,
                         ScalerState* scaler) override {
    auto part = Scratch(kNormPartial, size_t(count) * kNormBlocks * 8);
    if (!part.ok()) return part.status();
    SumSquaresKernel<<<dim3(kNormBlocks, count), 256, 0, stream_>>>(grads, sizes, static_cast<double*>(*part));
    LAUNCH_CHECK();
    FinishGradientsKernel<<<1, 1, 0, stream_>>>(static_cast<const double*>(*part), count * kNormBlocks, clip_norm,
                                                scaler);
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Result<double> SumSquares(float* const* grads, const size_t* sizes, int count, double start) override {
    auto part = Scratch(kNormPartial, size_t(count) * kNormBlocks * 8);
    if (!part.ok()) return part.status();
    auto sum = Scratch(kNormSum, 8);
    if (!sum.ok()) return sum.status();
    if (count > 0) {
      SumSquaresKernel<<<dim3(kNormBlocks, count), 256, 0, stream_>>>(grads, sizes, static_cast<double*>(*part));
      LAUNCH_CHECK();
    }
    SumPartialsKernel<<<1, 1, 0, stream_>>>(static_cast<const double*>(*part), count * kNormBlocks, start,
                                            static_cast<double*>(*sum));
    LAUNCH_CHECK();
    double host = 0;
    GPUFEED_RETURN_IF_ERROR(Download(&host, *sum, 8));
    return host;
  }
  Status FinishGradientsFrom(double sum_squares, float clip_norm, ScalerState* scaler) override {
    ScalerFinishKernel<<<1, 1, 0, stream_>>>(sum_squares, clip_norm, scaler);
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status ApplyOptimizer(const OptimizerStep& o, bool decay, size_t n, float* master, const float* grad, float* state1,
                        float* state2, void* copy, DType dt, const ScalerState* scaler, const StepState* st) override {
    OptimizerKernel<<<Blocks(n), 256, 0, stream_>>>(o, decay, n, master, grad, state1, state2, copy, dt, scaler, st);
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status ApplyOptimizer8bit(const OptimizerStep& o, const Quant8Tensor* tensors, const Quant8Block* blocks,
                            int num_blocks, const float* scode, const float* ucode, DType dt, const ScalerState* scaler,
                            const StepState* st) override {
    if (num_blocks <= 0) return Status::Ok();
    Optimizer8bitKernel<<<unsigned(num_blocks), kQuantBlock, 0, stream_>>>(o, tensors, blocks, scode, ucode, dt, scaler,
                                                                           st);
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status AdvanceSchedule(const Schedule& s, StepState* st) override {
    ScheduleKernel<<<1, 1, 0, stream_>>>(s, st);
    LAUNCH_CHECK();
    return Status::Ok();
  }

  // Thread-local capture: the feed's threads keep using their own streams
  // (and cudaMalloc) while this one records.
  Status BeginCapture() override {
    GPUFEED_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    return Status::Ok();
  }
  Result<void*> EndCapture() override {
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    capturing_ = false;
    if (e != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();  // capture errors are not sticky; clear the last one
      return Status::Unsupported(std::string("a CUDA graph could not be captured: ") + cudaGetErrorName(e) + " (" +
                                 cudaGetErrorString(e) + ")");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ie != cudaSuccess) {
      cudaGetLastError();
      return Status::Unsupported(std::string("a CUDA graph could not be instantiated: ") + cudaGetErrorName(ie));
    }
    return static_cast<void*>(exec);
  }
  Status Replay(void* graph) override {
    GPUFEED_CUDA_RETURN(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_));
    return Status::Ok();
  }
  void DestroyGraph(void* graph) override {
    if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }
  uint64_t buffer_generation() const override { return generation_; }
  Status Mark(int i) override {
    if (!marks_[i & 3]) GPUFEED_CUDA_RETURN(cudaEventCreate(&marks_[i & 3]));
    GPUFEED_CUDA_RETURN(cudaEventRecord(marks_[i & 3], stream_));
    return Status::Ok();
  }
  double MarkElapsedMs(int from, int to) override {
    float ms = 0;
    if (cudaEventSynchronize(marks_[to & 3]) != cudaSuccess ||
        cudaEventElapsedTime(&ms, marks_[from & 3], marks_[to & 3]) != cudaSuccess)
      return -1;
    return ms;
  }
  Result<void*> NewEvent() override {
    cudaEvent_t e = nullptr;
    GPUFEED_CUDA_RETURN(cudaEventCreate(&e));
    return static_cast<void*>(e);
  }
  Status RecordEvent(void* e) override {
    GPUFEED_CUDA_RETURN(cudaEventRecord(static_cast<cudaEvent_t>(e), stream_));
    return Status::Ok();
  }
  void DestroyEvent(void* e) override {
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  double EventMs(void* from, void* to) override {
    float ms = 0;
    if (cudaEventSynchronize(static_cast<cudaEvent_t>(to)) != cudaSuccess ||
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)) != cudaSuccess)
      return -1;
    return ms;
  }
  Status CopyPeer(void* dst, const void* src, size_t bytes) override {
    // Unified addressing: the driver finds both devices from the pointers.
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    return Status::Ok();
  }
  Status SideCopy(void* dst, const void* src, size_t bytes, void* after, void* also_after, void* done) override {
    if (!side_) GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    for (void* e : {after, also_after})
      if (e) GPUFEED_CUDA_RETURN(cudaStreamWaitEvent(side_, static_cast<cudaEvent_t>(e), 0));
    GPUFEED_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side_));
    GPUFEED_CUDA_RETURN(cudaEventRecord(static_cast<cudaEvent_t>(done), side_));
    return Status::Ok();
  }
  Status BindThread() override {
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    return Status::Ok();
  }
  Status EnablePeer(const Ops& other) override {
    int can = 0;
    GPUFEED_CUDA_RETURN(cudaSetDevice(device_));
    if (other.device() < 0 || other.device() == device_ ||
        cudaDeviceCanAccessPeer(&can, device_, other.device()) != cudaSuccess || !can)
      return Status::Ok();
    const cudaError_t e = cudaDeviceEnablePeerAccess(other.device(), 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // clears it
      return Status::Ok();
    }
    GPUFEED_CUDA_RETURN(e);
    return Status::Ok();
  }
  int device() const override { return device_; }

 private:
  int device_;
  std::string describe_, pci_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // SideCopy's
  const CublasApi& blas_;
  const CudnnApi& dnn_;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  ConvPlanCache plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<void*> scratch_;
  std::vector<size_t> scratch_size_;
  size_t scratch_bytes_ = 0;
  // cuBLAS's workspace, set once so a captured GEMM never allocates.
  void* cublas_workspace_ = nullptr;
  bool capturing_ = false;
  cudaEvent_t marks_[4] = {};
  uint64_t generation_ = 0;  // bumped by every reallocation of workspace_ or scratch_
};

}  // namespace

Result<std::unique_ptr<Ops>> MakeCudaOps(int device) {
  const std::string where = "cuda trainer backend on device " + std::to_string(device);
  // The device before the libraries: on a host without a GPU that is the
  // error to report, not a missing cuBLAS.
  if (Status s = gpu::CudaStatus(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__); !s.ok())
    return s.WithContext(where);
  auto lib = LoadCudaLibs();
  if (!lib.ok()) return lib.status().WithContext(where);
  auto ops = std::make_unique<CudaOps>(device, **lib);
  GPUFEED_RETURN_IF_ERROR(ops->Init().WithContext(where));
  return std::unique_ptr<Ops>(std::move(ops));
}

}  // namespace gpufeed::trainer
