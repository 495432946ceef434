// The trainer's numerical operations behind one interface: the CUDA backend
// (ops_cuda.cu: cuBLAS GEMMs, cuDNN convolutions, our own kernels for the
// rest) and the CPU reference (ops_cpu.cc: Eigen GEMMs, loops), with the same
// signatures so a test can run a layer on both and compare, and the training
// loop (model.cc, trainer.cc) is one piece of code for both.
//
// Conventions. Pointers are backend memory (device memory for CUDA, host
// memory for the CPU). Matrices are row-major. Images are NHWC. Activations
// and their gradients are stored in the compute dtype (fp32, bf16 or fp16);
// parameters have an fp32 master copy, gradients are fp32, and every
// accumulation (GEMM, reductions, batchnorm statistics) is fp32. Calls are
// queued in order on the backend's stream; only Download() and Sync() wait.
#ifndef GPUFEED_TRAINER_OPS_H_
#define GPUFEED_TRAINER_OPS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gpufeed/dtype.h"
#include "gpufeed/status.h"

namespace gpufeed::trainer {

// C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C, row-major. A and B in
// `ab` dtype, C in `c` dtype, fp32 accumulation.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const void* a = nullptr;
  int lda = 0;
  const void* b = nullptr;
  int ldb = 0;
  void* c = nullptr;
  int ldc = 0;
  DType ab = DType::kFloat32, c_dtype = DType::kFloat32;
};

// A square r x r convolution with stride `stride` and zero padding `pad`, no
// bias (batchnorm follows), NHWC activations [n, h, w, c] -> [n, out_h(),
// out_w(), k] and KRSC filters (out channels, r, r, in channels). The
// default is the cnn's 3x3, stride 1, padding 1 (the output the input's
// size); ResNet also uses 7x7/2 pad 3 (stem), 3x3/2 pad 1 and 1x1/2 pad 0
// (a projection shortcut).
struct ConvShape {
  int n = 0, h = 0, w = 0, c = 0, k = 0;
  DType dtype = DType::kFloat32;
  int r = 3, stride = 1, pad = 1;
  int out_h() const { return (h + 2 * pad - r) / stride + 1; }
  int out_w() const { return (w + 2 * pad - r) / stride + 1; }
  size_t x_elems() const { return size_t(n) * h * w * c; }
  size_t y_elems() const { return size_t(n) * out_h() * out_w() * k; }
  size_t w_elems() const { return size_t(k) * r * r * c; }
};

// Training-mode batchnorm + ReLU over the channel (innermost) axis of
// `rows` x `c` values: y = relu(gamma * (x - mean) * invstd + beta).
// `relu` false: batchnorm alone (y = gamma * xhat + beta; a residual
// block's second batchnorm and its projection's, before the add).
struct BnArgs {
  size_t rows = 0;
  int c = 0;
  DType dtype = DType::kFloat32;
  float eps = 1e-5f, momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch
  bool relu = true;
};

// Dynamic loss scaling state, kept where the gradients are (no host round
// trip per step). fp16: scale starts at 2^16, halves on inf/NaN (the step
// is skipped), doubles after `growth_interval` clean steps. fp32/bf16: scale
// stays 1 and a non-finite gradient still skips the step.
struct ScalerState {
  float scale = 1;
  int32_t clean_steps = 0;  // since the last overflow or growth
  int32_t skipped = 0;      // steps skipped for inf/NaN, total
  int32_t dynamic = 0;      // 1: grow/halve the scale
  int32_t growth_interval = 2000;
  // Written by FinishGradients for the optimizer step that follows.
  float step_coef = 1;    // 1/scale_used x clip coefficient
  int32_t step_skip = 0;  // 1: this step's gradients were not finite
  float grad_norm = 0;    // global norm of the unscaled gradients
};

enum class OptimizerKind { kSgd, kAdamW };

// The optimizer's hyperparameters that stay fixed for a run.
struct OptimizerStep {
  OptimizerKind kind = OptimizerKind::kSgd;
  float momentum = 0.9f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0;  // SGD: added to the gradient; AdamW: decoupled
};

// 8-bit optimizer states ("8-bit Optimizers via Block-wise Quantization"):
// each state tensor in blocks of kQuantBlock values, a block stored as one
// byte a value (an index into a 256-entry dynamic code, Quant8Code) and its
// absmax (fp32); a value is code[q] * absmax. Tensors of fewer than
// kQuantMinElems values keep fp32 states.
constexpr int kQuantBlock = 256;
constexpr size_t kQuantMinElems = 4096;
// One parameter tensor with 8-bit states; s2/a2 null for SGD's momentum.
struct Quant8Tensor {
  float* master = nullptr;
  const float* grad = nullptr;
  uint8_t* q1 = nullptr;  // m (signed code)
  uint8_t* q2 = nullptr;  // v (unsigned code)
  float* a1 = nullptr;    // absmax of each block of q1
  float* a2 = nullptr;
  void* copy = nullptr;  // compute copy (null: the master is used directly)
  uint64_t n = 0;
  int32_t decay = 1;
};
// A block of kQuantBlock values of tensor `tensor` from value `first`.
struct Quant8Block {
  int32_t tensor = 0;
  uint32_t index = 0;  // the block's number in its tensor (first = index * kQuantBlock)
};

// The learning-rate schedule: linear warmup over `warmup` steps to `peak_lr`,
// then cosine to 0 at `total` steps.
struct Schedule {
  float peak_lr = 0;
  int64_t warmup = 0, total = 1;
  float beta1 = 0.9f, beta2 = 0.999f;  // for Adam's bias corrections
};
// What changes from one optimizer step to the next, kept where the weights
// are and advanced there (AdvanceSchedule), so a step replayed from a CUDA
// graph reads this step's values without the host writing them.
struct StepState {
  int64_t step = 0;                // optimizer steps taken (skipped ones too)
  float lr = 0, bc1 = 1, bc2 = 1;  // this step's rate, 1 - beta^step (Adam)
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual bool on_gpu() const = 0;
  virtual std::string Describe() const = 0;  // "cuda:0 NVIDIA H200 (sm_90)" / "cpu"
  virtual std::string PciBusId() const = 0;  // for NVML; empty on the CPU
  virtual void* stream() const = 0;          // cudaStream_t on the GPU, nullptr on the CPU

  virtual Status Alloc(size_t bytes, void** p) = 0;  // zero-filled
  virtual void Free(void* p) = 0;
  virtual Status Upload(void* dst, const void* src, size_t bytes) = 0;
  virtual Status Download(void* dst, const void* src, size_t bytes) = 0;  // waits for queued work
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;      // queued, device to device
  virtual Status Sync() = 0;
  // Makes later work wait for `event` (a cudaEvent_t; ignored on the CPU).
  virtual Status WaitEvent(void* event) = 0;
  // Bytes the device reports in use (0 on the CPU) and the backend's own
  // scratch (cuDNN/cuBLAS workspaces, reduction partials).
  virtual size_t DeviceBytesUsed() const = 0;
  virtual size_t WorkspaceBytes() const = 0;

  virtual Status Gemm(const GemmArgs& g) = 0;
  // dst[i] = dtype(src[i]) for n fp32 values (a parameter's compute copy).
  virtual Status Cast(const float* src, void* dst, DType dtype, size_t n) = 0;
  // y[r, j] = act(y[r, j] + bias[j]); relu when `relu`.
  virtual Status BiasAct(void* y, const float* bias, int rows, int cols, bool relu, DType dtype) = 0;
  // dy[i] = y[i] > 0 ? dy[i] : 0.
  virtual Status ReluBackward(void* dy, const void* y, size_t n, DType dtype) = 0;
  // db[j] = beta * db[j] + sum_r dy[r, j] (fp32).
  virtual Status ColumnSum(const void* dy, int rows, int cols, DType dtype, float* db, float beta) = 0;

  virtual Status ConvForward(const ConvShape& s, const void* x, const void* w, void* y) = 0;
  virtual Status ConvBackwardData(const ConvShape& s, const void* dy, const void* w, void* dx) = 0;
  // dw (fp32) = beta * dw + dL/dw.
  virtual Status ConvBackwardFilter(const ConvShape& s, const void* x, const void* dy, float* dw, float beta) = 0;

  // Training: computes the batch statistics into save_mean/save_invstd (c
  // fp32 each), updates running_mean/var, writes y. Eval (`training` false):
  // uses the running statistics.
  virtual Status BnReluForward(const BnArgs& a, bool training, const void* x, const float* gamma, const float* beta,
                               float* running_mean, float* running_var, float* save_mean, float* save_invstd,
                               void* y) = 0;
  // From x, y (the forward's output, for the ReLU mask) and dy: dx, and
  // dgamma/dbeta accumulated with `beta_acc` (0: overwrite, 1: add). y null:
  // the mask from x, gamma and beta as the forward made y (rounded to the
  // dtype as stored), so a pass that recomputes x alone gets the same bits.
  // dx may be dy (in place).
  virtual Status BnReluBackward(const BnArgs& a, const void* x, const void* y, const void* dy, const float* gamma,
                                const float* beta, const float* save_mean, const float* save_invstd, void* dx,
                                float* dgamma, float* dbeta, float beta_acc) = 0;

  // 2x2 max pooling, stride 2, floor: [n, h, w, c] -> [n, h/2, w/2, c];
  // argmax (uint8, 0..3) remembers the winner for the backward pass.
  virtual Status MaxPoolForward(int n, int h, int w, int c, DType dtype, const void* x, void* y, uint8_t* argmax) = 0;
  // dx (zeroed here) receives dy at each window's winner.
  virtual Status MaxPoolBackward(int n, int h, int w, int c, DType dtype, const void* dy, const uint8_t* argmax,
                                 void* dx) = 0;

  // ResNet's stem pooling: 3x3 max pooling, stride 2, padding 1 (padding
  // never wins): [n, h, w, c] -> [n, (h + 1) / 2, (w + 1) / 2, c]; argmax
  // (uint8, 0..8, row-major in the window) remembers the winner.
  virtual Status MaxPool3x3Forward(int n, int h, int w, int c, DType dtype, const void* x, void* y,
                                   uint8_t* argmax) = 0;
  // dx (every element written) = the sum of dy over the windows whose winner
  // it is, added in the windows' row-major order (windows overlap).
  virtual Status MaxPool3x3Backward(int n, int h, int w, int c, DType dtype, const void* dy, const uint8_t* argmax,
                                    void* dx) = 0;
  // Global average pooling: y[b, ch] = mean of x[b, :, ch] over `hw`
  // positions (fp32 accumulation), [n, hw, c] -> [n, c].
  virtual Status GlobalAvgPoolForward(int n, int hw, int c, DType dtype, const void* x, void* y) = 0;
  // dx[b, p, ch] = dy[b, ch] / hw.
  virtual Status GlobalAvgPoolBackward(int n, int hw, int c, DType dtype, const void* dy, void* dx) = 0;
  // y[i] = act(y[i] + x[i]) for n values (relu when `relu`): a residual
  // block's join (relu), and the sum of a block input's two gradients (not).
  virtual Status AddAct(void* y, const void* x, size_t n, bool relu, DType dtype) = 0;

  // Softmax cross-entropy over `rows` x `classes` logits with int32 labels.
  // Adds sum of the rows' losses to *loss_sum and their correct predictions
  // to *correct (both fp32/int64 backend scalars). When dlogits is not null:
  // dlogits = (softmax - onehot) * grad_scale, where grad_scale is
  // *scale_ptr / denom (the loss scale lives on the device).
  virtual Status SoftmaxXent(int rows, int classes, DType dtype, const void* logits, const int32_t* labels,
                             double* loss_sum, int64_t* correct, void* dlogits, const ScalerState* scaler,
                             float denom) = 0;

  // Global norm of the gradients (fp32 tensors grads[i] of sizes[i]),
  // unscaling, clipping coefficient (clip_norm <= 0: none), inf/NaN check and
  // the loss scale update: fills scaler->step_coef/step_skip/grad_norm, then
  // updates scale/clean_steps/skipped.
  virtual Status FinishGradients(float* const* grads, const size_t* sizes, int count, float clip_norm,
                                 ScalerState* scaler) = 0;
  // FinishGradients in two halves, for gradients spread over backends
  // (pipeline stages): SumSquares waits for the device and returns `start`
  // plus the sum of squares of these gradients, added in the order
  // FinishGradients adds them, so stages that chain it (each starting from
  // the last one's result) get FinishGradients' sum over all of them, bit for
  // bit; FinishGradientsFrom queues the rest (coefficient, skip, norm, scale
  // update) from such a sum.
  virtual Result<double> SumSquares(float* const* grads, const size_t* sizes, int count, double start) = 0;
  virtual Status FinishGradientsFrom(double sum_squares, float clip_norm, ScalerState* scaler) = 0;
  // One optimizer step on an fp32 master tensor with gradient `grad` (scaled:
  // multiplied by scaler->step_coef), skipped when scaler->step_skip; writes
  // the compute copy (`copy`, may be null) in `dtype`. `decay` false for
  // biases and batchnorm parameters.
  virtual Status ApplyOptimizer(const OptimizerStep& o, bool decay, size_t n, float* master, const float* grad,
                                float* state1, float* state2, void* copy, DType dtype, const ScalerState* scaler,
                                const StepState* step) = 0;
  // One optimizer step over every 8-bit tensor at once (one launch): each
  // block's states dequantized, updated as ApplyOptimizer would (the same
  // per-element math), requantized with the block's new absmax. `tensors`
  // and `blocks` (count of each) and the two codes (Quant8Code: signed for m,
  // unsigned for v) are backend memory. Skipped when scaler->step_skip.
  virtual Status ApplyOptimizer8bit(const OptimizerStep& o, const Quant8Tensor* tensors, const Quant8Block* blocks,
                                    int num_blocks, const float* signed_code, const float* unsigned_code, DType dtype,
                                    const ScalerState* scaler, const StepState* step) = 0;
  // Before a step's ApplyOptimizer calls: this step's learning rate and bias
  // corrections from `step->step`, which then counts this step.
  virtual Status AdvanceSchedule(const Schedule& s, StepState* step) = 0;

  // CUDA Graphs. Between BeginCapture and EndCapture the calls above are
  // recorded, not run; Replay runs the recording (the same kernels on the
  // same buffers) with one launch. Unsupported on the CPU, and EndCapture
  // fails when a recorded call could not be captured (the caller then runs
  // the calls directly). A recording reads the buffers it was made with:
  // buffer_generation() changes whenever the backend reallocates its own
  // scratch, and a recording older than that must not be replayed.
  virtual Status BeginCapture() = 0;
  virtual Result<void*> EndCapture() = 0;
  virtual Status Replay(void* graph) = 0;
  virtual void DestroyGraph(void* graph) = 0;
  virtual uint64_t buffer_generation() const = 0;
  // Timing marks 0..3 on the stream (a timed cudaEvent; the host clock on the
  // CPU) and the milliseconds between two of them once both have passed.
  virtual Status Mark(int i) = 0;
  virtual double MarkElapsedMs(int from, int to) = 0;

  // Pipeline stages: several backends, one a thread, ordered by events.
  // An event is recorded on this backend's stream; any backend's stream can
  // wait for it (WaitEvent). On the CPU, where a call is done when it
  // returns, an event holds the time it was recorded.
  virtual Result<void*> NewEvent() = 0;
  virtual Status RecordEvent(void* event) = 0;
  virtual void DestroyEvent(void* event) = 0;
  // Milliseconds between two events of this backend once both have passed.
  virtual double EventMs(void* from, void* to) = 0;
  // A copy from another backend's memory (another GPU's), queued here.
  virtual Status CopyPeer(void* dst, const void* src, size_t bytes) = 0;
  // A copy to another backend's memory on this backend's copy stream (so it
  // overlaps the compute stream's work): after events `after` and
  // `also_after` (either may be null), then records `done`.
  virtual Status SideCopy(void* dst, const void* src, size_t bytes, void* after, void* also_after, void* done) = 0;
  // The calling thread drives this backend from now on (its GPU current).
  virtual Status BindThread() = 0;
  // This backend's GPU reads and writes `other`'s memory directly where the
  // hardware allows (else the driver stages peer copies); nothing on the CPU.
  virtual Status EnablePeer(const Ops& other) = 0;
  virtual int device() const = 0;  // the GPU's index, -1 on the CPU
};

std::unique_ptr<Ops> MakeCpuOps();
// cuBLAS/cuDNN on `device`; Unsupported in a build without CUDA.
Result<std::unique_ptr<Ops>> MakeCudaOps(int device);

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_OPS_H_
