// The CPU reference of every trainer operation (Eigen for the GEMMs, loops
// for the rest): the backend of `gpufeed train --device cpu`, and what the
// GPU kernels are tested against. Every reduction accumulates in double here,
// so it is the more exact side of each comparison.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "trainer/elem.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;

// A float view of an fp32 buffer, or a converted copy of a bf16/fp16 one.
struct FloatView {
  std::vector<float> copy;
  const float* p = nullptr;
  FloatView(const void* src, size_t n, DType dt) {
    if (dt == DType::kFloat32) {
      p = static_cast<const float*>(src);
      return;
    }
    copy.resize(n);
    for (size_t i = 0; i < n; ++i) copy[i] = LoadAs(src, i, dt);
    p = copy.data();
  }
};

class CpuOps final : public Ops {
 public:
  bool on_gpu() const override { return false; }
  std::string Describe() const override {
    return "cpu (Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + ")";
  }
  std::string PciBusId() const override { return ""; }
  void* stream() const override { return nullptr; }

  Status Alloc(size_t bytes, void** p) override {
    *p = std::calloc(std::max<size_t>(bytes, 1), 1);
    return *p ? Status::Ok()
              : Status::Internal("cpu trainer: out of memory allocating " + std::to_string(bytes) + " bytes");
  }
  void Free(void* p) override { std::free(p); }
  // Zero bytes copy nothing (an empty table's data() may be null, which
  // memcpy may not be given).
  Status Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Download(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  Status WaitEvent(void*) override { return Status::Ok(); }
  size_t DeviceBytesUsed() const override { return 0; }
  size_t WorkspaceBytes() const override { return 0; }

  Status Gemm(const GemmArgs& g) override {
    const int ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
    const int br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
    FloatView av(g.a, size_t(ar - 1) * g.lda + ac, g.ab), bv(g.b, size_t(br - 1) * g.ldb + bc, g.ab);
    Eigen::Map<const RowMat, 0, Stride> A(av.p, ar, ac, Stride(g.lda)), B(bv.p, br, bc, Stride(g.ldb));
    RowMat prod;
    if (g.trans_a && g.trans_b)
      prod.noalias() = A.transpose() * B.transpose();
    else if (g.trans_a)
      prod.noalias() = A.transpose() * B;
    else if (g.trans_b)
      prod.noalias() = A * B.transpose();
    else
      prod.noalias() = A * B;
    for (int i = 0; i < g.m; ++i) {
      for (int j = 0; j < g.n; ++j) {
        const size_t ci = size_t(i) * g.ldc + j;
        float v = g.alpha * prod(i, j);
        if (g.beta != 0) v += g.beta * LoadAs(g.c, ci, g.c_dtype);
        StoreAs(g.c, ci, g.c_dtype, v);
      }
    }
    return Status::Ok();
  }

  Status Cast(const float* src, void* dst, DType dt, size_t n) override {
    for (size_t i = 0; i < n; ++i) StoreAs(dst, i, dt, src[i]);
    return Status::Ok();
  }

  Status BiasAct(void* y, const float* bias, int rows, int cols, bool relu, DType dt) override {
    for (size_t r = 0; r < size_t(rows); ++r) {
      for (int j = 0; j < cols; ++j) {
        const size_t i = r * cols + j;
        float v = LoadAs(y, i, dt) + bias[j];
        if (relu) v = v > 0 ? v : 0;
        StoreAs(y, i, dt, v);
      }
    }
    return Status::Ok();
  }

  Status ReluBackward(void* dy, const void* y, size_t n, DType dt) override {
    for (size_t i = 0; i < n; ++i) {
      if (!(LoadAs(y, i, dt) > 0)) StoreAs(dy, i, dt, 0.0f);
    }
    return Status::Ok();
  }

  Status ColumnSum(const void* dy, int rows, int cols, DType dt, float* db, float beta) override {
    for (int j = 0; j < cols; ++j) {
      double s = 0;
      for (size_t r = 0; r < size_t(rows); ++r) s += LoadAs(dy, r * cols + j, dt);
      db[j] = static_cast<float>(beta != 0 ? beta * db[j] + s : s);  // beta 0 overwrites (NaN too)
    }
    return Status::Ok();
  }

  // im2col of one r x r window per output pixel (stride, zero padding):
  // [n*oh*ow, r*r*c], (r, s, c) order to match KRSC filters.
  static std::vector<float> Im2Col(const ConvShape& s, const void* x) {
    const int oh = s.out_h(), ow = s.out_w(), kk = s.r * s.r * s.c;
    std::vector<float> col(size_t(s.n) * oh * ow * kk, 0.0f);
    for (int b = 0; b < s.n; ++b)
      for (int y = 0; y < oh; ++y)
        for (int xx = 0; xx < ow; ++xx) {
          float* row = &col[((size_t(b) * oh + y) * ow + xx) * kk];
          for (int r = 0; r < s.r; ++r)
            for (int q = 0; q < s.r; ++q) {
              const int iy = y * s.stride + r - s.pad, ix = xx * s.stride + q - s.pad;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              const size_t base = ((size_t(b) * s.h + iy) * s.w + ix) * s.c;
              for (int c = 0; c < s.c; ++c) row[(r * s.r + q) * s.c + c] = LoadAs(x, base + c, s.dtype);
            }
        }
    return col;
  }

  Status ConvForward(const ConvShape& s, const void* x, const void* w, void* y) override {
    std::vector<float> col = Im2Col(s, x);
    FloatView wv(w, s.w_elems(), s.dtype);
    const int rows = s.n * s.out_h() * s.out_w(), kk = s.r * s.r * s.c;
    Eigen::Map<const RowMat> C(col.data(), rows, kk), W(wv.p, s.k, kk);
    RowMat out = C * W.transpose();
    for (size_t i = 0; i < s.y_elems(); ++i) StoreAs(y, i, s.dtype, out.data()[i]);
    return Status::Ok();
  }

  Status ConvBackwardData(const ConvShape& s, const void* dy, const void* w, void* dx) override {
    FloatView dyv(dy, s.y_elems(), s.dtype), wv(w, s.w_elems(), s.dtype);
    const int oh = s.out_h(), ow = s.out_w();
    const int rows = s.n * oh * ow, kk = s.r * s.r * s.c;
    Eigen::Map<const RowMat> DY(dyv.p, rows, s.k), W(wv.p, s.k, kk);
    RowMat dcol = DY * W;  // [rows, r*r*c]
    std::vector<double> acc(s.x_elems(), 0.0);
    for (int b = 0; b < s.n; ++b)
      for (int y = 0; y < oh; ++y)
        for (int xx = 0; xx < ow; ++xx) {
          const float* row = &dcol(((size_t(b) * oh + y) * ow + xx), 0);
          for (int r = 0; r < s.r; ++r)
            for (int q = 0; q < s.r; ++q) {
              const int iy = y * s.stride + r - s.pad, ix = xx * s.stride + q - s.pad;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              const size_t base = ((size_t(b) * s.h + iy) * s.w + ix) * s.c;
              for (int c = 0; c < s.c; ++c) acc[base + c] += row[(r * s.r + q) * s.c + c];
            }
        }
    for (size_t i = 0; i < acc.size(); ++i) StoreAs(dx, i, s.dtype, static_cast<float>(acc[i]));
    return Status::Ok();
  }

  Status ConvBackwardFilter(const ConvShape& s, const void* x, const void* dy, float* dw, float beta) override {
    std::vector<float> col = Im2Col(s, x);
    FloatView dyv(dy, s.y_elems(), s.dtype);
    const int rows = s.n * s.out_h() * s.out_w(), kk = s.r * s.r * s.c;
    Eigen::Map<const RowMat> C(col.data(), rows, kk), DY(dyv.p, rows, s.k);
    RowMat g = DY.transpose() * C;  // [k, r*r*c]
    for (size_t i = 0; i < s.w_elems(); ++i) dw[i] = beta != 0 ? beta * dw[i] + g.data()[i] : g.data()[i];
    return Status::Ok();
  }

  Status BnReluForward(const BnArgs& a, bool training, const void* x, const float* gamma, const float* beta,
                       float* running_mean, float* running_var, float* save_mean, float* save_invstd,
                       void* y) override {
    std::vector<float> mean(a.c), invstd(a.c);
    if (training) {
      for (int c = 0; c < a.c; ++c) {
        double s = 0, ss = 0;
        for (size_t r = 0; r < a.rows; ++r) {
          const double v = LoadAs(x, r * a.c + c, a.dtype);
          s += v;
          ss += v * v;
        }
        const double m = s / a.rows, var = std::max(0.0, ss / a.rows - m * m);
        mean[c] = static_cast<float>(m);
        invstd[c] = static_cast<float>(1.0 / std::sqrt(var + a.eps));
        save_mean[c] = mean[c];
        save_invstd[c] = invstd[c];
        const double unbiased = a.rows > 1 ? var * a.rows / (a.rows - 1) : var;
        running_mean[c] = static_cast<float>((1 - a.momentum) * running_mean[c] + a.momentum * m);
        running_var[c] = static_cast<float>((1 - a.momentum) * running_var[c] + a.momentum * unbiased);
      }
    } else {
      for (int c = 0; c < a.c; ++c) {
        mean[c] = running_mean[c];
        invstd[c] = 1.0f / std::sqrt(running_var[c] + a.eps);
      }
    }
    for (size_t r = 0; r < a.rows; ++r)
      for (int c = 0; c < a.c; ++c) {
        const size_t i = r * a.c + c;
        const float v = gamma[c] * ((LoadAs(x, i, a.dtype) - mean[c]) * invstd[c]) + beta[c];
        StoreAs(y, i, a.dtype, !a.relu || v > 0 ? v : 0.0f);
      }
    return Status::Ok();
  }

  Status BnReluBackward(const BnArgs& a, const void* x, const void* y, const void* dy, const float* gamma,
                        const float* beta, const float* save_mean, const float* save_invstd, void* dx, float* dgamma,
                        float* dbeta, float beta_acc) override {
    // The ReLU's mask: y > 0 as stored, or (y null) that y made again from x.
    auto on = [&](size_t i, int c) {
      if (!a.relu) return true;
      if (y) return LoadAs(y, i, a.dtype) > 0;
      const float v = gamma[c] * ((LoadAs(x, i, a.dtype) - save_mean[c]) * save_invstd[c]) + beta[c];
      return RoundTo(a.dtype, v > 0 ? v : 0.0f) > 0;
    };
    std::vector<double> sg(a.c, 0), sb(a.c, 0);
    for (size_t r = 0; r < a.rows; ++r)
      for (int c = 0; c < a.c; ++c) {
        const size_t i = r * a.c + c;
        const float g = on(i, c) ? LoadAs(dy, i, a.dtype) : 0.0f;
        const float xhat = (LoadAs(x, i, a.dtype) - save_mean[c]) * save_invstd[c];
        sg[c] += double(g) * xhat;
        sb[c] += g;
      }
    const float inv_m = 1.0f / static_cast<float>(a.rows);
    for (size_t r = 0; r < a.rows; ++r)
      for (int c = 0; c < a.c; ++c) {
        const size_t i = r * a.c + c;
        const float g = on(i, c) ? LoadAs(dy, i, a.dtype) : 0.0f;
        const float xhat = (LoadAs(x, i, a.dtype) - save_mean[c]) * save_invstd[c];
        const float v = gamma[c] * save_invstd[c] *
                        (g - inv_m * static_cast<float>(sb[c]) - xhat * inv_m * static_cast<float>(sg[c]));
        StoreAs(dx, i, a.dtype, v);
      }
    for (int c = 0; c < a.c; ++c) {
      dgamma[c] = static_cast<float>(beta_acc != 0 ? beta_acc * dgamma[c] + sg[c] : sg[c]);
      dbeta[c] = static_cast<float>(beta_acc != 0 ? beta_acc * dbeta[c] + sb[c] : sb[c]);
    }
    return Status::Ok();
  }

  Status MaxPoolForward(int n, int h, int w, int c, DType dt, const void* x, void* y, uint8_t* argmax) override {
    const int oh = h / 2, ow = w / 2;
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j)
          for (int ch = 0; ch < c; ++ch) {
            float best = -INFINITY;
            int arg = 0;
            for (int t = 0; t < 4; ++t) {
              const size_t xi = ((size_t(b) * h + 2 * i + t / 2) * w + 2 * j + t % 2) * c + ch;
              const float v = LoadAs(x, xi, dt);
              if (v > best) best = v, arg = t;
            }
            const size_t yi = ((size_t(b) * oh + i) * ow + j) * c + ch;
            StoreAs(y, yi, dt, best);
            argmax[yi] = static_cast<uint8_t>(arg);
          }
    return Status::Ok();
  }

  Status MaxPoolBackward(int n, int h, int w, int c, DType dt, const void* dy, const uint8_t* argmax,
                         void* dx) override {
    std::memset(dx, 0, size_t(n) * h * w * c * DTypeSize(dt));
    const int oh = h / 2, ow = w / 2;
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j)
          for (int ch = 0; ch < c; ++ch) {
            const size_t yi = ((size_t(b) * oh + i) * ow + j) * c + ch;
            const int t = argmax[yi];
            const size_t xi = ((size_t(b) * h + 2 * i + t / 2) * w + 2 * j + t % 2) * c + ch;
            StoreAs(dx, xi, dt, LoadAs(dy, yi, dt));
          }
    return Status::Ok();
  }

  Status MaxPool3x3Forward(int n, int h, int w, int c, DType dt, const void* x, void* y, uint8_t* argmax) override {
    const int oh = (h + 1) / 2, ow = (w + 1) / 2;
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j)
          for (int ch = 0; ch < c; ++ch) {
            float best = -INFINITY;
            int arg = -1;
            for (int t = 0; t < 9; ++t) {
              const int iy = 2 * i - 1 + t / 3, ix = 2 * j - 1 + t % 3;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              const float v = LoadAs(x, ((size_t(b) * h + iy) * w + ix) * c + ch, dt);
              if (arg < 0 || v > best) best = v, arg = t;
            }
            const size_t yi = ((size_t(b) * oh + i) * ow + j) * c + ch;
            StoreAs(y, yi, dt, best);
            argmax[yi] = static_cast<uint8_t>(arg);
          }
    return Status::Ok();
  }

  // A gather per input element (the windows that may hold it, in row-major
  // order), as the GPU kernel does, so both add in the same order.
  Status MaxPool3x3Backward(int n, int h, int w, int c, DType dt, const void* dy, const uint8_t* argmax,
                            void* dx) override {
    const int oh = (h + 1) / 2, ow = (w + 1) / 2;
    for (int b = 0; b < n; ++b)
      for (int iy = 0; iy < h; ++iy)
        for (int ix = 0; ix < w; ++ix)
          for (int ch = 0; ch < c; ++ch) {
            float g = 0;
            for (int i = iy / 2; i <= (iy + 1) / 2 && i < oh; ++i)
              for (int j = ix / 2; j <= (ix + 1) / 2 && j < ow; ++j) {
                const size_t yi = ((size_t(b) * oh + i) * ow + j) * c + ch;
                const int t = argmax[yi];
                if (2 * i - 1 + t / 3 == iy && 2 * j - 1 + t % 3 == ix) g += LoadAs(dy, yi, dt);
              }
            StoreAs(dx, ((size_t(b) * h + iy) * w + ix) * c + ch, dt, g);
          }
    return Status::Ok();
  }

  Status GlobalAvgPoolForward(int n, int hw, int c, DType dt, const void* x, void* y) override {
    for (int b = 0; b < n; ++b)
      for (int ch = 0; ch < c; ++ch) {
        float s = 0;
        for (int p = 0; p < hw; ++p) s += LoadAs(x, (size_t(b) * hw + p) * c + ch, dt);
        StoreAs(y, size_t(b) * c + ch, dt, s / float(hw));
      }
    return Status::Ok();
  }

  Status GlobalAvgPoolBackward(int n, int hw, int c, DType dt, const void* dy, void* dx) override {
    for (int b = 0; b < n; ++b)
      for (int p = 0; p < hw; ++p)
        for (int ch = 0; ch < c; ++ch)
          StoreAs(dx, (size_t(b) * hw + p) * c + ch, dt, LoadAs(dy, size_t(b) * c + ch, dt) / float(hw));
    return Status::Ok();
  }

  Status AddAct(void* y, const void* x, size_t n, bool relu, DType dt) override {
    for (size_t i = 0; i < n; ++i) {
      const float v = LoadAs(y, i, dt) + LoadAs(x, i, dt);
      StoreAs(y, i, dt, relu && !(v > 0) ? 0.0f : v);
    }
    return Status::Ok();
  }

  Status SoftmaxXent(int rows, int classes, DType dt, const void* logits, const int32_t* labels, double* loss_sum,
                     int64_t* correct, void* dlogits, const ScalerState* scaler, float denom) override {
    const float gs = scaler ? scaler->scale / denom : 1.0f / denom;
    std::vector<float> p(classes);
    for (int r = 0; r < rows; ++r) {
      float mx = -INFINITY;
      int arg = 0;
      for (int j = 0; j < classes; ++j) {
        p[j] = LoadAs(logits, size_t(r) * classes + j, dt);
        if (p[j] > mx) mx = p[j], arg = j;
      }
      double sum = 0;
      for (int j = 0; j < classes; ++j) sum += std::exp(double(p[j]) - mx);
      const int label = labels[r];
      *loss_sum += std::log(sum) - (double(p[label]) - mx);
      *correct += arg == label;
      if (dlogits) {
        for (int j = 0; j < classes; ++j) {
          const float sm = static_cast<float>(std::exp(double(p[j]) - mx) / sum);
          StoreAs(dlogits, size_t(r) * classes + j, dt, (sm - (j == label ? 1.0f : 0.0f)) * gs);
        }
      }
    }
    return Status::Ok();
  }

  Status FinishGradients(float* const* grads, const size_t* sizes, int count, float clip_norm,
                         ScalerState* scaler) override {
    double ss = 0;
    for (int t = 0; t < count; ++t)
      for (size_t i = 0; i < sizes[t]; ++i) ss += double(grads[t][i]) * grads[t][i];
    ScalerFinish(ss, clip_norm, scaler);
    return Status::Ok();
  }
  Result<double> SumSquares(float* const* grads, const size_t* sizes, int count, double start) override {
    double ss = start;
    for (int t = 0; t < count; ++t)
      for (size_t i = 0; i < sizes[t]; ++i) ss += double(grads[t][i]) * grads[t][i];
    return ss;
  }
  Status FinishGradientsFrom(double sum_squares, float clip_norm, ScalerState* scaler) override {
    ScalerFinish(sum_squares, clip_norm, scaler);
    return Status::Ok();
  }

  Status ApplyOptimizer(const OptimizerStep& o, bool decay, size_t n, float* master, const float* grad, float* state1,
                        float* state2, void* copy, DType dt, const ScalerState* scaler, const StepState* st) override {
    if (scaler->step_skip) return Status::Ok();
    for (size_t i = 0; i < n; ++i) {
      master[i] = OptimizerUpdate(o, decay, master[i], grad[i] * scaler->step_coef, &state1[i],
                                  state2 ? &state2[i] : &state1[i], st->lr, st->bc1, st->bc2);
      if (copy) StoreAs(copy, i, dt, master[i]);
    }
    return Status::Ok();
  }
  Status ApplyOptimizer8bit(const OptimizerStep& o, const Quant8Tensor* tensors, const Quant8Block* blocks,
                            int num_blocks, const float* scode, const float* ucode, DType dt, const ScalerState* scaler,
                            const StepState* st) override {
    if (scaler->step_skip) return Status::Ok();
    float m[kQuantBlock], v[kQuantBlock];
    for (int b = 0; b < num_blocks; ++b) {
      const Quant8Tensor& t = tensors[blocks[b].tensor];
      const uint64_t first = uint64_t(blocks[b].index) * kQuantBlock;
      const int count = static_cast<int>(std::min<uint64_t>(kQuantBlock, t.n - first));
      const float a1 = t.a1[blocks[b].index], a2 = t.a2 ? t.a2[blocks[b].index] : 0.0f;
      float max1 = 0, max2 = 0;
      for (int i = 0; i < count; ++i) {
        const uint64_t e = first + i;
        const float w = Quant8Update(o, t.decay != 0, t.master[e], t.grad[e] * scaler->step_coef, scode, ucode, t.q1[e],
                                     a1, t.q2 ? t.q2[e] : 0, a2, &m[i], &v[i], st->lr, st->bc1, st->bc2);
        t.master[e] = w;
        if (t.copy) StoreAs(t.copy, e, dt, w);
        max1 = std::max(max1, std::fabs(m[i]));
        max2 = std::max(max2, v[i]);
      }
      t.a1[blocks[b].index] = max1;
      for (int i = 0; i < count; ++i) t.q1[first + i] = Quant8Store(scode, m[i], max1);
      if (t.q2) {
        t.a2[blocks[b].index] = max2;
        for (int i = 0; i < count; ++i) t.q2[first + i] = Quant8Store(ucode, v[i], max2);
      }
    }
    return Status::Ok();
  }
  Status AdvanceSchedule(const Schedule& s, StepState* st) override {
    ScheduleAdvance(s, st);
    return Status::Ok();
  }
  Status BeginCapture() override {
    return Status::Unsupported("the CPU backend runs each operation as it is called (no graphs)");
  }
  Result<void*> EndCapture() override { return Status::Unsupported("no graphs on the CPU backend"); }
  Status Replay(void*) override { return Status::Unsupported("no graphs on the CPU backend"); }
  void DestroyGraph(void*) override {}
  uint64_t buffer_generation() const override { return 0; }
  Status Mark(int i) override {
    marks_[i & 3] = NowSeconds();
    return Status::Ok();
  }
  double MarkElapsedMs(int from, int to) override { return 1e3 * (marks_[to & 3] - marks_[from & 3]); }
  Result<void*> NewEvent() override { return static_cast<void*>(new double(0)); }
  Status RecordEvent(void* e) override {
    *static_cast<double*>(e) = NowSeconds();
    return Status::Ok();
  }
  void DestroyEvent(void* e) override { delete static_cast<double*>(e); }
  double EventMs(void* from, void* to) override {
    return 1e3 * (*static_cast<double*>(to) - *static_cast<double*>(from));
  }
  Status CopyPeer(void* dst, const void* src, size_t bytes) override { return Copy(dst, src, bytes); }
  Status SideCopy(void* dst, const void* src, size_t bytes, void*, void*, void* done) override {
    GPUFEED_RETURN_IF_ERROR(Copy(dst, src, bytes));
    return RecordEvent(done);
  }
  Status BindThread() override { return Status::Ok(); }
  Status EnablePeer(const Ops&) override { return Status::Ok(); }
  int device() const override { return -1; }
  double marks_[4] = {};
};

}  // namespace

std::unique_ptr<Ops> MakeCpuOps() { return std::make_unique<CpuOps>(); }

#ifndef GPUFEED_WITH_CUDA
Result<std::unique_ptr<Ops>> MakeCudaOps(int) {
  return Status::Unsupported("this gpufeed was built without CUDA (GPUFEED_CUDA=OFF); use --device cpu");
}
#endif

}  // namespace gpufeed::trainer
