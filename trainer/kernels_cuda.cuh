// The trainer's own CUDA kernels (device code, included by ops_cuda.cu
// alone, which launches them): elementwise, batchnorm, pooling, loss,
// gradient norm and loss scaler, optimizer. Each has its CPU reference in
// ops_cpu.cc with the per-element math shared through elem.h. Reductions have
// a fixed order (block partials, then one block): results do not depend on
// scheduling.
#ifndef GPUFEED_TRAINER_KERNELS_CUDA_CUH_
#define GPUFEED_TRAINER_KERNELS_CUDA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "trainer/elem.h"
#include "trainer/ops.h"

namespace gpufeed::trainer::kernels {

// Storage type <-> fp32, round to nearest even (as StoreAs on the CPU).
template <class T>
__device__ __forceinline__ float ToF(T v);
template <>
__device__ __forceinline__ float ToF(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToF(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float ToF(__half v) {
  return __half2float(v);
}
template <class T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromF(float v) {
  return __float2half_rn(v);
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

// The batchnorm-ReLU's mask at i: y > 0 as stored, or (y null) that y made
// again from x, gamma and beta, rounded to T as the forward stored it.
template <class T>
__device__ inline bool ReluOn(bool relu, const T* x, const T* y, const float* gamma, const float* beta,
                              const float* mean, const float* invstd, size_t i, int c) {
  if (!relu) return true;  // batchnorm alone
  if (y) return ToF(y[i]) > 0;
  const float v = gamma[c] * ((ToF(x[i]) - mean[c]) * invstd[c]) + beta[c];
  return ToF(FromF<T>(v > 0 ? v : 0.f)) > 0;
}

// mode 0: sum x and x^2. mode 1: with g = (ReLU on ? dy : 0), xhat from
// mean/invstd: sum g*xhat and g.
template <class T, int kMode>
__global__ void BnPartialKernel(const T* x, const T* y, const T* dy, const float* gamma, const float* beta,
                                const float* mean, const float* invstd, size_t rows, int C, size_t rows_per_block,
                                float* partial_a, float* partial_b, bool relu) {
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
        const float g = ReluOn(relu, x, y, gamma, beta, mean, invstd, i, c) ? ToF(dy[i]) : 0.f;
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
                                  const float* invstd, size_t n, int C, T* y, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % C);
    const float v = gamma[c] * ((ToF(x[i]) - mean[c]) * invstd[c]) + beta[c];
    y[i] = FromF<T>(!relu || v > 0 ? v : 0.f);
  }
}

__global__ void BnBackwardFinishKernel(const float* pa, const float* pb, int groups, int C, float* sum_gx, float* sum_g,
                                       float* dgamma, float* dbeta, float beta_acc) {
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
__global__ void BnReluBackwardApplyKernel(const T* x, const T* y, const T* dy, const float* gamma, const float* beta,
                                          const float* mean, const float* invstd, const float* sum_gx,
                                          const float* sum_g, size_t n, int C, float inv_m, T* dx, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int c = int(i % C);
    const float g = ReluOn(relu, x, y, gamma, beta, mean, invstd, i, c) ? ToF(dy[i]) : 0.f;
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

// ResNet's stem pooling: 3x3 windows, stride 2, padding 1 (never the winner).
template <class T>
__global__ void MaxPool3x3Kernel(const T* x, int n, int h, int w, int C, T* y, uint8_t* argmax) {
  const int oh = (h + 1) / 2, ow = (w + 1) / 2;
  const size_t total = size_t(n) * oh * ow * C;
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < total; o += size_t(gridDim.x) * blockDim.x) {
    const int c = int(o % C);
    size_t t = o / C;
    const int j = int(t % ow);
    t /= ow;
    const int i = int(t % oh);
    const int b = int(t / oh);
    float best = -INFINITY;
    int arg = -1;
    for (int q = 0; q < 9; ++q) {
      const int iy = 2 * i - 1 + q / 3, ix = 2 * j - 1 + q % 3;
      if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
      const float v = ToF(x[((size_t(b) * h + iy) * w + ix) * C + c]);
      if (arg < 0 || v > best) best = v, arg = q;
    }
    y[o] = FromF<T>(best);
    argmax[o] = uint8_t(arg);
  }
}

// One thread an input element: the sum of dy over the windows (row-major
// order) whose winner it is, as the CPU reference adds them.
template <class T>
__global__ void MaxPool3x3BackwardKernel(const T* dy, const uint8_t* argmax, int n, int h, int w, int C, T* dx) {
  const int oh = (h + 1) / 2, ow = (w + 1) / 2;
  const size_t total = size_t(n) * h * w * C;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total; e += size_t(gridDim.x) * blockDim.x) {
    const int c = int(e % C);
    size_t t = e / C;
    const int ix = int(t % w);
    t /= w;
    const int iy = int(t % h);
    const int b = int(t / h);
    float g = 0;
    for (int i = iy / 2; i <= (iy + 1) / 2 && i < oh; ++i)
      for (int j = ix / 2; j <= (ix + 1) / 2 && j < ow; ++j) {
        const size_t yi = ((size_t(b) * oh + i) * ow + j) * C + c;
        const int q = argmax[yi];
        if (2 * i - 1 + q / 3 == iy && 2 * j - 1 + q % 3 == ix) g += ToF(dy[yi]);
      }
    dx[e] = FromF<T>(g);
  }
}

// One thread a (sample, channel): the positions summed in order in fp32.
template <class T>
__global__ void GlobalAvgPoolKernel(const T* x, int n, int hw, int C, T* y) {
  const size_t total = size_t(n) * C;
  for (size_t o = blockIdx.x * size_t(blockDim.x) + threadIdx.x; o < total; o += size_t(gridDim.x) * blockDim.x) {
    const size_t b = o / C;
    const int c = int(o % C);
    float s = 0;
    for (int p = 0; p < hw; ++p) s += ToF(x[(b * hw + p) * C + c]);
    y[o] = FromF<T>(s / float(hw));
  }
}

template <class T>
__global__ void GlobalAvgPoolBackwardKernel(const T* dy, int n, int hw, int C, T* dx) {
  const size_t total = size_t(n) * hw * C;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < total; e += size_t(gridDim.x) * blockDim.x) {
    const int c = int(e % C);
    const size_t b = e / C / size_t(hw);
    dx[e] = FromF<T>(ToF(dy[b * C + c]) / float(hw));
  }
}

template <class T>
__global__ void AddActKernel(T* y, const T* x, size_t n, bool relu) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = ToF(y[i]) + ToF(x[i]);
    y[i] = FromF<T>(relu && !(v > 0) ? 0.f : v);
  }
}

// --- loss -------------------------------------------------------------------------

// One warp per row: the row's loss and hit go to scratch (summed in order by
// SumRowsKernel), dlogits = (softmax - onehot) * scale / denom.
template <class T>
__global__ void SoftmaxXentKernel(const T* logits, const int32_t* labels, int rows, int classes,
                                  const ScalerState* scaler, float denom, T* dlogits, float* row_loss, int* row_hit) {
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

__global__ void SumRowsKernel(const float* row_loss, const int* row_hit, int rows, double* loss_sum, int64_t* correct) {
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

// The two halves of FinishGradientsKernel (Ops::SumSquares and
// FinishGradientsFrom): the same additions in the same order, from `start`.
__global__ void SumPartialsKernel(const double* partial, int n, double start, double* out) {
  double sum = start;
  for (int i = 0; i < n; ++i) sum += partial[i];
  *out = sum;
}

__global__ void ScalerFinishKernel(double sum, float clip_norm, ScalerState* s) { ScalerFinish(sum, clip_norm, s); }

__global__ void OptimizerKernel(OptimizerStep o, bool decay, size_t n, float* master, const float* grad, float* s1,
                                float* s2, void* copy, DType dt, const ScalerState* scaler, const StepState* st) {
  if (scaler->step_skip) return;
  const float coef = scaler->step_coef;
  const float lr = st->lr, bc1 = st->bc1, bc2 = st->bc2;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float w = OptimizerUpdate(o, decay, master[i], grad[i] * coef, &s1[i], s2 ? &s2[i] : &s1[i], lr, bc1, bc2);
    master[i] = w;
    if (copy) StoreAs(copy, i, dt, w);
  }
}

__global__ void ScheduleKernel(Schedule s, StepState* st) { ScheduleAdvance(s, st); }

// One quantization block per thread block of kQuantBlock threads: every
// thread updates its value, the block's new absmax comes from a max
// reduction (order-free, so the CPU twin's loop gives the same bits), then
// each thread requantizes its value.
__global__ void __launch_bounds__(kQuantBlock)
    Optimizer8bitKernel(OptimizerStep o, const Quant8Tensor* tensors, const Quant8Block* blocks, const float* scode_g,
                        const float* ucode_g, DType dt, const ScalerState* scaler, const StepState* st) {
  if (scaler->step_skip) return;
  __shared__ float scode[256], ucode[256], max1[kQuantBlock / 32], max2[kQuantBlock / 32];
  scode[threadIdx.x] = scode_g[threadIdx.x];
  ucode[threadIdx.x] = ucode_g[threadIdx.x];
  __syncthreads();
  const Quant8Block blk = blocks[blockIdx.x];
  const Quant8Tensor& t = tensors[blk.tensor];
  const uint64_t e = uint64_t(blk.index) * kQuantBlock + threadIdx.x;
  const bool live = e < t.n;
  float m = 0, v = 0;
  if (live) {
    const float a1 = t.a1[blk.index], a2 = t.a2 ? t.a2[blk.index] : 0.0f;
    const float w = Quant8Update(o, t.decay != 0, t.master[e], t.grad[e] * scaler->step_coef, scode, ucode, t.q1[e], a1,
                                 t.q2 ? t.q2[e] : 0, a2, &m, &v, st->lr, st->bc1, st->bc2);
    t.master[e] = w;
    if (t.copy) StoreAs(t.copy, e, dt, w);
  }
  float r1 = fabsf(m), r2 = v;
  for (int off = 16; off > 0; off /= 2) {
    r1 = fmaxf(r1, __shfl_xor_sync(0xffffffffu, r1, off));
    r2 = fmaxf(r2, __shfl_xor_sync(0xffffffffu, r2, off));
  }
  if (threadIdx.x % 32 == 0) max1[threadIdx.x / 32] = r1, max2[threadIdx.x / 32] = r2;
  __syncthreads();
  float a1 = 0, a2 = 0;
  for (int i = 0; i < kQuantBlock / 32; ++i) a1 = fmaxf(a1, max1[i]), a2 = fmaxf(a2, max2[i]);
  if (threadIdx.x == 0) {
    t.a1[blk.index] = a1;
    if (t.a2) t.a2[blk.index] = a2;
  }
  if (live) {
    t.q1[e] = Quant8Store(scode, m, a1);
    if (t.q2) t.q2[e] = Quant8Store(ucode, v, a2);
  }
}

}  // namespace gpufeed::trainer::kernels

#endif  // GPUFEED_TRAINER_KERNELS_CUDA_CUH_
