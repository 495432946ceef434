// The CUDA backend of the trainer's operations: cuBLAS GEMMs (fp32
// accumulation, tensor cores for bf16/fp16), cuDNN convolutions (NHWC,
// deterministic algorithms), and our kernels for everything else — each with
// its CPU reference of the same signature in ops_cpu.cc and the per-element
// math shared through elem.h. Every reduction has a fixed order (block
// partials, then one block), so a run's results do not depend on scheduling:
// a resumed run reproduces an uninterrupted one bit for bit.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/trace.h"
#include "gpu/cuda_check.h"
#include "trainer/elem.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {
namespace {

Status CublasStatus(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(call) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) +
                          ") at " + file + ":" + std::to_string(line));
}
Status CudnnStatus(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(call) + " failed: " + cudnnGetErrorString(s) + " at " + file + ":" +
                          std::to_string(line));
}
#define CUBLAS_RETURN(call) GPUFEED_RETURN_IF_ERROR(CublasStatus((call), #call, __FILE__, __LINE__))
#define CUDNN_RETURN(call) GPUFEED_RETURN_IF_ERROR(CudnnStatus((call), #call, __FILE__, __LINE__))
#define LAUNCH_CHECK() GPUFEED_CUDA_RETURN(cudaGetLastError())

// Storage type <-> fp32, round to nearest even (as StoreAs on the CPU).
template <class T> __device__ __forceinline__ float ToF(T v);
template <> __device__ __forceinline__ float ToF(float v) { return v; }
template <> __device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ float FromF(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 FromF(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half FromF(float v) { return __float2half_rn(v); }

#define DISPATCH(dt, T, ...)                                       \
  switch (dt) {                                                    \
    case DType::kFloat32: { using T = float; __VA_ARGS__ } break;  \
    case DType::kBFloat16: { using T = __nv_bfloat16; __VA_ARGS__ } break; \
    case DType::kFloat16: { using T = __half; __VA_ARGS__ } break; \
    default: return Status::Unsupported("trainer: dtype " + std::string(DTypeName(dt))); \
  }

cudaDataType_t CudaType(DType d) {
  return d == DType::kFloat32 ? CUDA_R_32F : d == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
}
cudnnDataType_t CudnnType(DType d) {
  return d == DType::kFloat32 ? CUDNN_DATA_FLOAT : d == DType::kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

unsigned Blocks(size_t n, unsigned threads = 256) {
  return static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 65535u * 16));
}

// --- elementwise kernels ------------------------------------------------------

template <class T>
__global__ void CastKernel(const float* src, T* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = FromF<T>(src[i]);
}

template <class T>
__global__ void BiasActKernel(T* y, const float* bias, size_t n, int cols, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v = ToF(y[i]) + bias[i % cols];
    if (relu) v = v > 0 ? v : 0;
    y[i] = FromF<T>(v);
  }
}

template <class T>
__global__ void ReluBackwardKernel(T* dy, const T* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (!(ToF(y[i]) > 0)) dy[i] = FromF<T>(0.0f);
}

// One thread per column, rows in order: deterministic.
template <class T>
__global__ void ColumnSumKernel(const T* dy, int rows, int cols, float* db, float beta) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0;
  for (int r = 0; r < rows; ++r) s += ToF(dy[size_t(r) * cols + j]);
  db[j] = beta != 0 ? beta * db[j] + s : s;  // beta 0 overwrites, NaN included
}

// grad (fp32) = beta * grad + tmp (compute dtype): conv filter gradients.
template <class T>
__global__ void AccumulateKernel(const T* tmp, float* grad, size_t n, float beta) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    grad[i] = beta != 0 ? beta * grad[i] + ToF(tmp[i]) : ToF(tmp[i]);
}

// --- batchnorm ----------------------------------------------------------------
// Statistics in two phases: blocks of 32 channels x 8 row lanes sum a slice
// of rows into partials[g][c] (fixed order), then one thread per channel sums
// the partials in double.

constexpr int kBnRowLanes = 8;

// mode 0: sum x and x^2. mode 1: with g = (y > 0 ? dy : 0), xhat from
// mean/invstd: sum g*xhat and g.
template <class T, int kMode>
__global__ void BnPartialKernel(const T* x, const T* y, const T* dy, const float* mean, const float* invstd,
                                size_t rows, int C, size_t rows_per_block, float* partial_a, float* partial_b) {
  const int c = blockIdx.x * 32 + threadIdx.x;
  const size_t r0 = blockIdx.y * rows_per_block;
  const size_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  float a = 0, b = 0;
  if (c < C) {
    const float m = kMode ? mean[c] : 0.f, is = kMode ? invstd[c] : 0.f;
    for (size_t r = r0 + threadIdx.y; r < r1; r += kBnRowLanes) {
      const size_t i = r * C + c;
      const float v = ToF(x[i]);
      if (kMode == 0) {
        a += v;
        b += v * v;
      } else {
        const float g = ToF(y[i]) > 0 ? ToF(dy[i]) : 0.f;
        a += g * ((v - m) * is);
        b += g;
      }
    }
  }
  __shared__ float sa[kBnRowLanes][32], sb[kBnRowLanes][32];
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 1; k < kBnRowLanes; ++k) a += sa[k][threadIdx.x], b += sb[k][threadIdx.x];
    partial_a[blockIdx.y * size_t(C) + c] = a;
    partial_b[blockIdx.y * size_t(C) + c] = b;
  }
}

__global__ void BnStatsFinishKernel(const float* pa, const float* pb, int groups, int C, size_t rows, float eps,
                                    float momentum, float* run_mean, float* run_var, float* save_mean,
                                    float* save_invstd) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double s = 0, ss = 0;
  for (int g = 0; g < groups; ++g) s += pa[size_t(g) * C + c], ss += pb[size_t(g) * C + c];
  const double m = s / double(rows), var = fmax(0.0, ss / double(rows) - m * m);
  save_mean[c] = float(m);
  save_invstd[c] = float(1.0 / sqrt(var + eps));
  const double unbiased = rows > 1 ? var * double(rows) / double(rows - 1) : var;
  run_mean[c] = float((1 - momentum) * run_mean[c] + momentum * m);
  run_var[c] = float((1 - momentum) * run_var[c] + momentum * unbiased);
}

__global__ void BnEvalStatsKernel(const float* run_mean, const float* run_var, float eps, int C, float* mean,
                                  float* invstd) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  mean[c] = run_mean[c];
  invstd[c] = 1.0f / sqrtf(run_var[c] + eps);
}

template <class T>
__global__ void BnReluApplyKernel(const T* x, const float* gamma, const float* beta, const float* mean,
                                  const float* invstd, size_t n, int C, T* y) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % C);
    const float v = gamma[c] * ((ToF(x[i]) - mean[c]) * invstd[c]) + beta[c];
    y[i] = FromF<T>(v > 0 ? v : 0.f);
  }
}

__global__ void BnBackwardFinishKernel(const float* pa, const float* pb, int groups, int C, float* sum_gx,
                                       float* sum_g, float* dgamma, float* dbeta, float beta_acc) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double a = 0, b = 0;
  for (int g = 0; g < groups; ++g) a += pa[size_t(g) * C + c], b += pb[size_t(g) * C + c];
  sum_gx[c] = float(a);
  sum_g[c] = float(b);
  dgamma[c] = beta_acc != 0 ? float(beta_acc * dgamma[c] + a) : float(a);
  dbeta[c] = beta_acc != 0 ? float(beta_acc * dbeta[c] + b) : float(b);
}

template <class T>
__global__ void BnReluBackwardApplyKernel(const T* x, const T* y, const T* dy, const float* gamma, const float* mean,
                                          const float* invstd, const float* sum_gx, const float* sum_g, size_t n,
                                          int C, float inv_m, T* dx) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % C);
    const float g = ToF(y[i]) > 0 ? ToF(dy[i]) : 0.f;
    const float xhat = (ToF(x[i]) - mean[c]) * invstd[c];
    dx[i] = FromF<T>(gamma[c] * invstd[c] * (g - inv_m * sum_g[c] - xhat * inv_m * sum_gx[c]));
  }
}

// --- pooling --------------------------------------------------------------------

// The input index of quadrant q (0-3: row-major in the 2x2 window) of NHWC
// output element o of a 2x2/2 pooling over an [n, h, w, C] input.
__device__ inline size_t PoolInputIndex(size_t o, int h, int w, int C, int q) {
  const int oh = h / 2, ow = w / 2;
  const int c = int(o % C);
  size_t t = o / C;
  const int j = int(t % ow);
  t /= ow;
  const int i = int(t % oh);
  const int b = int(t / oh);
  return ((size_t(b) * h + 2 * i + q / 2) * w + 2 * j + q % 2) * C + c;
}

template <class T>
__global__ void MaxPoolKernel(const T* x, int n, int h, int w, int C, T* y, uint8_t* argmax) {
  const size_t total = size_t(n) * (h / 2) * (w / 2) * C;
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < total; o += size_t(gridDim.x) * blockDim.x) {
    float best = -INFINITY;
    int arg = 0;
    for (int q = 0; q < 4; ++q) {
      const float v = ToF(x[PoolInputIndex(o, h, w, C, q)]);
      if (v > best) best = v, arg = q;
    }
    y[o] = FromF<T>(best);
    argmax[o] = uint8_t(arg);
  }
}

template <class T>
__global__ void MaxPoolBackwardKernel(const T* dy, const uint8_t* argmax, int n, int h, int w, int C, T* dx) {
  const size_t total = size_t(n) * (h / 2) * (w / 2) * C;
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < total; o += size_t(gridDim.x) * blockDim.x) {
    dx[PoolInputIndex(o, h, w, C, argmax[o])] = dy[o];
  }
}

// --- loss -------------------------------------------------------------------------

// One warp per row: the row's loss and hit go to scratch (summed in order by
// SumRowsKernel), dlogits = (softmax - onehot) * scale / denom.
template <class T>
__global__ void SoftmaxXentKernel(const T* logits, const int32_t* labels, int rows, int classes,
                                  const ScalerState* scaler, float denom, T* dlogits, float* row_loss,
                                  int* row_hit) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= rows) return;
  const T* z = logits + size_t(warp) * classes;
  float mx = -INFINITY;
  int arg = 0;
  for (int j = lane; j < classes; j += 32) {
    const float v = ToF(z[j]);
    if (v > mx) mx = v, arg = j;
  }
  for (int off = 16; off > 0; off /= 2) {  // argmax, lowest index on ties (as the CPU's first-max)
    const float om = __shfl_down_sync(0xffffffffu, mx, off);
    const int oa = __shfl_down_sync(0xffffffffu, arg, off);
    if (om > mx || (om == mx && oa < arg)) mx = om, arg = oa;
  }
  mx = __shfl_sync(0xffffffffu, mx, 0);
  arg = __shfl_sync(0xffffffffu, arg, 0);
  float sum = 0;
  for (int j = lane; j < classes; j += 32) sum += expf(ToF(z[j]) - mx);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const int label = labels[warp];
  if (lane == 0) {
    row_loss[warp] = logf(sum) - (ToF(z[label]) - mx);
    row_hit[warp] = arg == label;
  }
  if (dlogits) {
    const float gs = (scaler ? scaler->scale : 1.0f) / denom;
    for (int j = lane; j < classes; j += 32) {
      const float sm = expf(ToF(z[j]) - mx) / sum;
      dlogits[size_t(warp) * classes + j] = FromF<T>((sm - (j == label ? 1.f : 0.f)) * gs);
    }
  }
}

__global__ void SumRowsKernel(const float* row_loss, const int* row_hit, int rows, double* loss_sum,
                              int64_t* correct) {
  __shared__ double sl[256];
  __shared__ long long sh[256];
  double l = 0;
  long long h = 0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) l += row_loss[r], h += row_hit[r];
  sl[threadIdx.x] = l;
  sh[threadIdx.x] = h;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < blockDim.x; ++k) l += sl[k], h += sh[k];
    *loss_sum += l;
    *correct += h;
  }
}

// --- gradient norm, scaler, optimizer -----------------------------------------------

constexpr int kNormBlocks = 64;

__global__ void SumSquaresKernel(float* const* grads, const size_t* sizes, double* partial) {
  const int t = blockIdx.y;
  const float* g = grads[t];
  const size_t n = sizes[t];
  double s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    s += double(g[i]) * g[i];
  __shared__ double sh[256];
  sh[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < blockDim.x; ++k) s += sh[k];
    partial[size_t(t) * gridDim.x + blockIdx.x] = s;
  }
}

__global__ void FinishGradientsKernel(const double* partial, int n, float clip_norm, ScalerState* s) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += partial[i];
  ScalerFinish(sum, clip_norm, s);
}

__global__ void OptimizerKernel(OptimizerStep o, bool decay, size_t n, float* master, const float* grad, float* s1,
                                float* s2, void* copy, DType dt, const ScalerState* scaler, float bc1, float bc2) {
  if (scaler->step_skip) return;
  const float coef = scaler->step_coef;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float w = OptimizerUpdate(o, decay, master[i], grad[i] * coef, &s1[i], s2 ? &s2[i] : &s1[i], bc1, bc2);
    master[i] = w;
    if (copy) StoreAs(copy, i, dt, w);
  }
}

// --- the backend ----------------------------------------------------------------------

// The heuristics' first (best-ranked) deterministic algorithm, so repeated
// runs pick the same one and produce the same bits.
template <class Perf, class Algo>
Status PickDeterministic(const Perf* perf, int count, Algo* algo, const char* direction) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC) {
      *algo = perf[i].algo;
      return Status::Ok();
    }
  }
  return Status::Unsupported(std::string("cuDNN has no deterministic ") + direction +
                             " convolution for this shape");
}

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
};

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device) : device_(device) {}
  ~CudaOps() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [k, p] : plans_) {
      cudnnDestroyTensorDescriptor(p.x);
      cudnnDestroyTensorDescriptor(p.y);
      cudnnDestroyFilterDescriptor(p.w);
      cudnnDestroyConvolutionDescriptor(p.fwd);
      cudnnDestroyConvolutionDescriptor(p.bwd_data);
      cudnnDestroyConvolutionDescriptor(p.bwd_filter);
    }
    for (void* p : scratch_) cudaFree(p);
    if (workspace_) cudaFree(workspace_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (cublas_) cublasDestroy(cublas_);
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
                std::to_string(prop.minor) + ", cuDNN " + std::to_string(cudnnGetVersion()) + ")";
    GPUFEED_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_RETURN(cublasCreate(&cublas_));
    CUBLAS_RETURN(cublasSetStream(cublas_, stream_));
    CUDNN_RETURN(cudnnCreate(&cudnn_));
    CUDNN_RETURN(cudnnSetStream(cudnn_, stream_));
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
  size_t WorkspaceBytes() const override { return workspace_bytes_ + scratch_bytes_; }

  Status Gemm(const GemmArgs& g) override {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    CUBLAS_RETURN(cublasGemmEx(cublas_, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
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
             ColumnSumKernel<T><<<(cols + 127) / 128, 128, 0, stream_>>>(static_cast<const T*>(dy), rows, cols, db,
                                                                          beta);)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Result<ConvPlan*> Plan(const ConvShape& s) {
    auto key = std::make_tuple(s.n, s.h, s.w, s.c, s.k, int(s.dtype));
    auto it = plans_.find(key);
    if (it != plans_.end()) return &it->second;
    ConvPlan p;
    const cudnnDataType_t dt = CudnnType(s.dtype);
    CUDNN_RETURN(cudnnCreateTensorDescriptor(&p.x));
    CUDNN_RETURN(cudnnCreateTensorDescriptor(&p.y));
    CUDNN_RETURN(cudnnCreateFilterDescriptor(&p.w));
    CUDNN_RETURN(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NHWC, dt, s.n, s.c, s.h, s.w));
    CUDNN_RETURN(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NHWC, dt, s.n, s.k, s.h, s.w));
    CUDNN_RETURN(cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NHWC, s.k, s.c, 3, 3));
    // fp32: plain FMA math (no TF32), so the CPU reference comparison is
    // tight; bf16/fp16: tensor cores, fp32 accumulation.
    const cudnnMathType_t math = s.dtype == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    for (cudnnConvolutionDescriptor_t* d : {&p.fwd, &p.bwd_data, &p.bwd_filter}) {
      CUDNN_RETURN(cudnnCreateConvolutionDescriptor(d));
      CUDNN_RETURN(cudnnSetConvolution2dDescriptor(*d, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      CUDNN_RETURN(cudnnSetConvolutionMathType(*d, math));
    }
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_RETURN(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, p.x, p.w, p.fwd, p.y,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fp));
    GPUFEED_RETURN_IF_ERROR(PickDeterministic(fp, got, &p.fwd_algo, "forward"));
    CUDNN_RETURN(cudnnGetConvolutionForwardWorkspaceSize(cudnn_, p.x, p.w, p.fwd, p.y, p.fwd_algo, &p.fwd_ws));
    cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_RETURN(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, p.w, p.y, p.bwd_data, p.x,
                                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dp));
    GPUFEED_RETURN_IF_ERROR(PickDeterministic(dp, got, &p.data_algo, "backward-data"));
    CUDNN_RETURN(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, p.w, p.y, p.bwd_data, p.x, p.data_algo,
                                                              &p.data_ws));
    cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_RETURN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn_, p.x, p.y, p.bwd_filter, p.w,
                                                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wp));
    GPUFEED_RETURN_IF_ERROR(PickDeterministic(wp, got, &p.filter_algo, "backward-filter"));
    CUDNN_RETURN(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, p.x, p.y, p.bwd_filter, p.w, p.filter_algo,
                                                                &p.filter_ws));
    return &(plans_[key] = p);
  }

  // The one cuDNN workspace, grown (after the queued work) when a plan needs more.
  Status Workspace(size_t bytes) {
    if (bytes <= workspace_bytes_) return Status::Ok();
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
  enum ScratchId { kPartialA, kPartialB, kChannelA, kChannelB, kRowLoss, kRowHit, kFilterGrad, kNormPartial };

  Status ConvForward(const ConvShape& s, const void* x, const void* w, void* y) override {
    auto p = Plan(s);
    if (!p.ok()) return p.status();
    GPUFEED_RETURN_IF_ERROR(Workspace((*p)->fwd_ws));
    const float one = 1, zero = 0;
    CUDNN_RETURN(cudnnConvolutionForward(cudnn_, &one, (*p)->x, x, (*p)->w, w, (*p)->fwd, (*p)->fwd_algo, workspace_,
                                         (*p)->fwd_ws, &zero, (*p)->y, y));
    return Status::Ok();
  }
  Status ConvBackwardData(const ConvShape& s, const void* dy, const void* w, void* dx) override {
    auto p = Plan(s);
    if (!p.ok()) return p.status();
    GPUFEED_RETURN_IF_ERROR(Workspace((*p)->data_ws));
    const float one = 1, zero = 0;
    CUDNN_RETURN(cudnnConvolutionBackwardData(cudnn_, &one, (*p)->w, w, (*p)->y, dy, (*p)->bwd_data, (*p)->data_algo,
                                              workspace_, (*p)->data_ws, &zero, (*p)->x, dx));
    return Status::Ok();
  }
  Status ConvBackwardFilter(const ConvShape& s, const void* x, const void* dy, float* dw, float beta) override {
    auto p = Plan(s);
    if (!p.ok()) return p.status();
    GPUFEED_RETURN_IF_ERROR(Workspace((*p)->filter_ws));
    const float one = 1, zero = 0;
    if (s.dtype == DType::kFloat32) {
      CUDNN_RETURN(cudnnConvolutionBackwardFilter(cudnn_, &one, (*p)->x, x, (*p)->y, dy, (*p)->bwd_filter,
                                                  (*p)->filter_algo, workspace_, (*p)->filter_ws, &beta, (*p)->w, dw));
      return Status::Ok();
    }
    // cuDNN writes the filter gradient in the data type; add it to fp32.
    auto tmp = Scratch(kFilterGrad, s.w_elems() * DTypeSize(s.dtype));
    if (!tmp.ok()) return tmp.status();
    CUDNN_RETURN(cudnnConvolutionBackwardFilter(cudnn_, &one, (*p)->x, x, (*p)->y, dy, (*p)->bwd_filter,
                                                (*p)->filter_algo, workspace_, (*p)->filter_ws, &zero, (*p)->w, *tmp));
    const size_t n = s.w_elems();
    DISPATCH(s.dtype, T,
             AccumulateKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<const T*>(*tmp), dw, n, beta);)
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
                   static_cast<const T*>(x), nullptr, nullptr, nullptr, nullptr, a.rows, a.c, rpb, fa, fb);)
      LAUNCH_CHECK();
      BnStatsFinishKernel<<<(a.c + 127) / 128, 128, 0, stream_>>>(fa, fb, int(grid.y), a.c, a.rows, a.eps,
                                                                   a.momentum, running_mean, running_var, save_mean,
                                                                   save_invstd);
      LAUNCH_CHECK();
    } else {
      BnEvalStatsKernel<<<(a.c + 127) / 128, 128, 0, stream_>>>(running_mean, running_var, a.eps, a.c, save_mean,
                                                                 save_invstd);
      LAUNCH_CHECK();
    }
    DISPATCH(a.dtype, T,
             BnReluApplyKernel<T><<<Blocks(n), 256, 0, stream_>>>(static_cast<const T*>(x), gamma, beta, save_mean,
                                                                  save_invstd, n, a.c, static_cast<T*>(y));)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status BnReluBackward(const BnArgs& a, const void* x, const void* y, const void* dy, const float* gamma,
                        const float* save_mean, const float* save_invstd, void* dx, float* dgamma, float* dbeta,
                        float beta_acc) override {
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
                 static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), save_mean, save_invstd,
                 a.rows, a.c, rpb, fa, fb);)
    LAUNCH_CHECK();
    BnBackwardFinishKernel<<<(a.c + 127) / 128, 128, 0, stream_>>>(fa, fb, int(grid.y), a.c, sgx, sg, dgamma, dbeta,
                                                                    beta_acc);
    LAUNCH_CHECK();
    const float inv_m = 1.0f / static_cast<float>(a.rows);
    DISPATCH(a.dtype, T,
             BnReluBackwardApplyKernel<T><<<Blocks(n), 256, 0, stream_>>>(
                 static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(dy), gamma, save_mean,
                 save_invstd, sgx, sg, n, a.c, inv_m, static_cast<T*>(dx));)
    LAUNCH_CHECK();
    return Status::Ok();
  }

  Status MaxPoolForward(int n, int h, int w, int c, DType dt, const void* x, void* y, uint8_t* argmax) override {
    const size_t total = size_t(n) * (h / 2) * (w / 2) * c;
    DISPATCH(dt, T,
             MaxPoolKernel<T><<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(x), n, h, w, c,
                                                                  static_cast<T*>(y), argmax);)
    LAUNCH_CHECK();
    return Status::Ok();
  }
  Status MaxPoolBackward(int n, int h, int w, int c, DType dt, const void* dy, const uint8_t* argmax,
                         void* dx) override {
    GPUFEED_CUDA_RETURN(cudaMemsetAsync(dx, 0, size_t(n) * h * w * c * DTypeSize(dt), stream_));
    const size_t total = size_t(n) * (h / 2) * (w / 2) * c;
    DISPATCH(dt, T,
             MaxPoolBackwardKernel<T><<<Blocks(total), 256, 0, stream_>>>(static_cast<const T*>(dy), argmax, n, h, w,
                                                                          c, static_cast<T*>(dx));)
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
             SoftmaxXentKernel<T><<<blocks, 256, 0, stream_>>>(static_cast<const T*>(logits), labels, rows, classes,
                                                               scaler, denom, static_cast<T*>(dlogits),
                                                               static_cast<float*>(*rl), static_cast<int*>(*rh));)
    LAUNCH_CHECK();
    SumRowsKernel<<<1, 256, 0, stream_>>>(static_cast<const float*>(*rl), static_cast<const int*>(*rh), rows,
                                          loss_sum, correct);
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

  Status ApplyOptimizer(const OptimizerStep& o, bool decay, size_t n, float* master, const float* grad,
                        float* state1, float* state2, void* copy, DType dt, const ScalerState* scaler) override {
    const float bc1 = 1.0f - std::pow(o.beta1, static_cast<float>(o.step));
    const float bc2 = 1.0f - std::pow(o.beta2, static_cast<float>(o.step));
    OptimizerKernel<<<Blocks(n), 256, 0, stream_>>>(o, decay, n, master, grad, state1, state2, copy, dt, scaler, bc1,
                                                    bc2);
    LAUNCH_CHECK();
    return Status::Ok();
  }

 private:
  int device_;
  std::string describe_, pci_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::map<std::tuple<int, int, int, int, int, int>, ConvPlan> plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<void*> scratch_;
  std::vector<size_t> scratch_size_;
  size_t scratch_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<Ops>> MakeCudaOps(int device) {
  auto ops = std::make_unique<CudaOps>(device);
  GPUFEED_RETURN_IF_ERROR(ops->Init().WithContext("cuda trainer backend on device " + std::to_string(device)));
  return std::unique_ptr<Ops>(std::move(ops));
}

}  // namespace gpufeed::trainer
