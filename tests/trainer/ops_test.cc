// The trainer's operations: the CPU reference against finite differences
// (every layer's gradients, through whole small models), the loss scaler's
// rules, and every CUDA operation against the CPU reference (skipped without
// a GPU; run on the GPU host).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpufeed/dtype.h"
#include "trainer/elem.h"
#include "trainer/model.h"
#include "trainer/ops.h"
#include "tests/testing/gpu_required.h"

namespace gpufeed::trainer {
namespace {

std::vector<float> Randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Host buffers in a dtype, converted with the reference conversions.
std::vector<uint8_t> Encode(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> b(v.size() * DTypeSize(dt));
  for (size_t i = 0; i < v.size(); ++i) StoreAs(b.data(), i, dt, v[i]);
  return b;
}
std::vector<float> Decode(const void* p, size_t n, DType dt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = LoadAs(p, i, dt);
  return v;
}

// --- finite differences through whole models on the CPU reference -------------

struct Fixture {
  std::unique_ptr<Ops> ops = MakeCpuOps();
  std::unique_ptr<Model> model;
  std::vector<float> x;
  std::vector<int32_t> labels;
  ScalerState scaler;
  int batch = 0;

  void Build(ModelKind kind, std::vector<int> widths, int h, int w, int c, int classes, int b) {
    ModelSpec s;
    s.kind = kind;
    s.widths = std::move(widths);
    s.in_h = h, s.in_w = w, s.in_c = c, s.classes = classes, s.max_batch = b, s.seed = 7;
    model = std::make_unique<Model>(ops.get(), s);
    ASSERT_TRUE(model->Init().ok());
    batch = b;
    x = Randn(size_t(b) * h * w * c, 11);
    for (int i = 0; i < b; ++i) labels.push_back(i % classes);
  }
  // Mean loss over the batch (training-mode batchnorm).
  double Loss() {
    double loss = 0;
    int64_t correct = 0;
    EXPECT_TRUE(model->Forward(x.data(), batch, true).ok());
    EXPECT_TRUE(ops->SoftmaxXent(batch, model->spec().classes, DType::kFloat32, model->logits(), labels.data(), &loss,
                                 &correct, nullptr, nullptr, 1.0f)
                    .ok());
    return loss / batch;
  }
  void Gradients() {
    double loss = 0;
    int64_t correct = 0;
    ASSERT_TRUE(model->Forward(x.data(), batch, true).ok());
    ASSERT_TRUE(ops->SoftmaxXent(batch, model->spec().classes, DType::kFloat32, model->logits(), labels.data(), &loss,
                                 &correct, model->dlogits(), &scaler, float(batch))
                    .ok());
    ASSERT_TRUE(model->Backward(x.data(), batch, false).ok());
  }
};

// Central differences on a sample of each parameter's elements. ReLU and
// max pooling are not smooth: where the two one-sided differences disagree,
// the step crossed a kink and the element is not comparable (few are).
void CheckAgainstFiniteDifferences(Fixture& f) {
  f.Gradients();
  const double center = f.Loss();
  int checked = 0, kinks = 0;
  for (Param& p : f.model->params()) {
    std::vector<float> analytic(p.grad, p.grad + p.n);
    const size_t step = std::max<size_t>(1, p.n / 7);
    for (size_t i = 0; i < p.n; i += step) {
      const float saved = p.master[i];
      const float eps = 3e-3f * std::max(1.0f, std::fabs(saved));
      p.master[i] = saved + eps;
      const double up = f.Loss();
      p.master[i] = saved - eps;
      const double down = f.Loss();
      p.master[i] = saved;
      const double fwd = (up - center) / eps, bwd = (center - down) / eps;
      if (std::fabs(fwd - bwd) > 0.2 * std::max(std::fabs(fwd), std::fabs(bwd)) + 2e-3) {
        ++kinks;
        continue;
      }
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(analytic[i], numeric, 1e-3 + 0.02 * std::fabs(numeric)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
  EXPECT_LE(kinks, checked / 10) << "too many elements at a kink to say anything";
}

TEST(TrainerOpsTest, MlpGradientsMatchFiniteDifferences) {
  Fixture f;
  f.Build(ModelKind::kMlp, {16, 12}, 4, 4, 2, 5, 8);
  CheckAgainstFiniteDifferences(f);
}

// conv -> batchnorm -> ReLU -> pool, twice, then linear: every CNN layer's
// backward (odd sizes exercise the pool's floor).
TEST(TrainerOpsTest, CnnGradientsMatchFiniteDifferences) {
  Fixture f;
  f.Build(ModelKind::kCnn, {4, 6}, 7, 6, 3, 4, 6);
  CheckAgainstFiniteDifferences(f);
}

// A loss that ignores the input gradient of layer 0 would still pass the
// parameter checks of layer 0; so check dL/dx of a conv directly.
TEST(TrainerOpsTest, ConvBackwardDataMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  ConvShape s{2, 5, 4, 3, 4, DType::kFloat32};
  std::vector<float> x = Randn(s.x_elems(), 1), w = Randn(s.w_elems(), 2), r = Randn(s.y_elems(), 3);
  std::vector<float> y(s.y_elems()), dx(s.x_elems());
  // L = sum(y * r): dL/dy = r.
  ASSERT_TRUE(ops->ConvBackwardData(s, r.data(), w.data(), dx.data()).ok());
  for (size_t i = 0; i < x.size(); i += 5) {
    double l[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<float> xp = x;
      xp[i] += k ? -1e-2f : 1e-2f;
      ASSERT_TRUE(ops->ConvForward(s, xp.data(), w.data(), y.data()).ok());
      l[k] = 0;
      for (size_t j = 0; j < y.size(); ++j) l[k] += double(y[j]) * r[j];
    }
    EXPECT_NEAR(dx[i], (l[0] - l[1]) / 2e-2, 1e-3 + 1e-3 * std::fabs(dx[i])) << i;
  }
}

// --- the loss scaler ------------------------------------------------------------

TEST(LossScalerTest, OverflowSkipsTheStepAndHalvesTheScale) {
  ScalerState s;
  s.dynamic = 1;
  s.scale = 65536;
  s.clean_steps = 5;
  ScalerFinish(INFINITY, 0, &s);
  EXPECT_EQ(s.step_skip, 1);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.scale, 32768);
  EXPECT_EQ(s.clean_steps, 0);
  ScalerFinish(NAN, 0, &s);
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.scale, 16384);
}

TEST(LossScalerTest, GrowsAfterTheIntervalOfCleanSteps) {
  ScalerState s;
  s.dynamic = 1;
  s.scale = 1024;
  s.growth_interval = 3;
  ScalerFinish(4.0, 0, &s);
  ScalerFinish(4.0, 0, &s);
  EXPECT_EQ(s.scale, 1024);
  ScalerFinish(4.0, 0, &s);
  EXPECT_EQ(s.scale, 2048);
  EXPECT_EQ(s.clean_steps, 0);
  EXPECT_EQ(s.step_skip, 0);
  EXPECT_EQ(s.skipped, 0);
}

TEST(LossScalerTest, UnscalesAndClipsTheGlobalNorm) {
  ScalerState s;
  s.scale = 4;
  // Scaled gradient norm 40 -> true norm 10; clip to 2.5: coef = 1/4 * 0.25.
  ScalerFinish(1600.0, 2.5f, &s);
  EXPECT_NEAR(s.grad_norm, 10.0f, 1e-5);
  EXPECT_NEAR(s.step_coef, 0.25f * 0.25f, 1e-6);
  ScalerFinish(1600.0, 0, &s);  // no clipping: just 1/scale
  EXPECT_FLOAT_EQ(s.step_coef, 0.25f);
  EXPECT_EQ(s.scale, 4);  // static scaling never changes
}

TEST(LossScalerTest, SkippedStepLeavesWeightsAndStateAlone) {
  auto ops = MakeCpuOps();
  std::vector<float> w = {1, 2, 3}, g = {INFINITY, 1, 1}, m(3, 0.5f), v(3, 0.25f);
  std::vector<float> grads_sq = g;
  float* ptr = grads_sq.data();
  size_t n = 3;
  ScalerState s;
  s.dynamic = 1;
  s.scale = 8;
  ASSERT_TRUE(ops->FinishGradients(&ptr, &n, 1, 0, &s).ok());
  OptimizerStep o;
  o.kind = OptimizerKind::kAdamW;
  StepState st;
  st.lr = 0.1f;
  ASSERT_TRUE(
      ops->ApplyOptimizer(o, true, 3, w.data(), g.data(), m.data(), v.data(), nullptr, DType::kFloat32, &s, &st).ok());
  EXPECT_EQ(w, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(m, (std::vector<float>(3, 0.5f)));
  EXPECT_EQ(s.scale, 4);
}

TEST(OptimizerTest, SgdMomentumAndAdamWFollowTheirDefinitions) {
  OptimizerStep o;
  o.kind = OptimizerKind::kSgd;
  o.momentum = 0.9f, o.weight_decay = 0.01f;
  const float lr = 0.1f;
  float m = 1.0f, unused = 0;
  // g' = 0.5 + 0.01 * 2 = 0.52; m = 0.9 + 0.52 = 1.42; w = 2 - 0.142.
  EXPECT_FLOAT_EQ(OptimizerUpdate(o, true, 2.0f, 0.5f, &m, &unused, lr, 1, 1), 2.0f - 0.1f * 1.42f);
  EXPECT_FLOAT_EQ(m, 1.42f);
  o.kind = OptimizerKind::kAdamW;
  float m1 = 0, v1 = 0;
  const float bc1 = 1 - 0.9f, bc2 = 1 - 0.999f;
  // First step: m/bc1 = g, v/bc2 = g^2, update = lr * g/(|g| + eps) ~ lr;
  // decoupled decay multiplies w by (1 - lr * wd) first.
  const float w = OptimizerUpdate(o, true, 2.0f, 0.5f, &m1, &v1, lr, bc1, bc2);
  EXPECT_NEAR(w, 2.0f * (1 - 0.1f * 0.01f) - 0.1f, 1e-5);
}

// The 8-bit codes: 256 ascending values in [-1, 1] holding 0 and 1, the
// signed one symmetric but for its 1 (no -1); nearest-value rounding.
TEST(Quant8Test, CodesAreAscendingAndRoundToTheNearest) {
  float s[256], u[256];
  Quant8Code(true, s);
  Quant8Code(false, u);
  for (int i = 1; i < 256; ++i) {
    EXPECT_LT(s[i - 1], s[i]);
    EXPECT_LT(u[i - 1], u[i]);
  }
  EXPECT_EQ(u[0], 0.0f);
  EXPECT_EQ(u[255], 1.0f);
  EXPECT_EQ(s[255], 1.0f);
  EXPECT_EQ(s[127], 0.0f);  // 127 negatives below it
  for (int i = 0; i < 127; ++i) EXPECT_EQ(s[i], -s[254 - i]) << i;
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(Quant8Nearest(s, s[i]), i);
    EXPECT_EQ(Quant8Nearest(u, u[i]), i);
  }
  // Relative precision where it matters for Adam's v: small values too.
  for (float x : {0.5f, 0.05f, 0.005f, 5e-4f, 5e-5f}) {
    const float q = u[Quant8Nearest(u, x)];
    EXPECT_NEAR(q, x, 0.06 * x) << x;
  }
  EXPECT_EQ(Quant8Nearest(s, -2.0f), 0);
  EXPECT_EQ(Quant8Nearest(s, 2.0f), 255);
}

// One 8-bit AdamW step from zero states: the weights move as fp32 AdamW's
// (up to the quantization of m and v, which a first step does not read),
// and the states come back within the code's resolution of fp32's.
TEST(Quant8Test, An8bitStepFollowsTheFp32Step) {
  auto ops = MakeCpuOps();
  const size_t n = 1000;
  std::vector<float> w = Randn(n, 21), w8 = w, g = Randn(n, 22), m(n), v(n);
  std::vector<uint8_t> q1(n), q2(n);
  std::vector<float> a1(4), a2(4);
  OptimizerStep o;
  o.kind = OptimizerKind::kAdamW, o.weight_decay = 0.01f;
  StepState st;
  st.lr = 1e-2f, st.bc1 = 0.1f, st.bc2 = 0.001f;
  ScalerState sc;
  ASSERT_TRUE(
      ops->ApplyOptimizer(o, true, n, w.data(), g.data(), m.data(), v.data(), nullptr, DType::kFloat32, &sc, &st).ok());
  Quant8Tensor t;
  t.master = w8.data(), t.grad = g.data(), t.q1 = q1.data(), t.q2 = q2.data(), t.a1 = a1.data(), t.a2 = a2.data();
  t.n = n;
  std::vector<Quant8Block> blocks = {{0, 0}, {0, 1}, {0, 2}, {0, 3}};
  float codes[512];
  Quant8Code(true, codes);
  Quant8Code(false, codes + 256);
  ASSERT_TRUE(ops->ApplyOptimizer8bit(o, &t, blocks.data(), 4, codes, codes + 256, DType::kFloat32, &sc, &st).ok());
  EXPECT_EQ(w8, w);  // zero states read back as zero: the same update
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / kQuantBlock;
    EXPECT_NEAR(codes[q1[i]] * a1[b], m[i], 0.07 * std::fabs(m[i]) + 1e-3f * a1[b]) << i;
    EXPECT_NEAR(codes[256 + q2[i]] * a2[b], v[i], 0.07 * v[i] + 1e-3f * a2[b]) << i;
  }
  // The last block holds 1000 - 768 = 232 values: nothing past the tensor.
  EXPECT_GT(a1[3], 0.0f);
}

// The schedule the optimizer reads from the device: warmup, then cosine to
// 0, Adam's bias corrections of the step, and the step counted.
TEST(OptimizerTest, ScheduleWarmsUpThenFollowsTheCosine) {
  Schedule s;
  s.peak_lr = 0.5f, s.warmup = 4, s.total = 104, s.beta1 = 0.9f, s.beta2 = 0.99f;
  StepState st;
  std::vector<float> lr;
  for (int i = 0; i < 105; ++i) {
    ScheduleAdvance(s, &st);
    lr.push_back(st.lr);
    EXPECT_EQ(st.step, i + 1);
    EXPECT_FLOAT_EQ(st.bc1, 1.0f - std::pow(0.9f, float(i + 1)));
    EXPECT_FLOAT_EQ(st.bc2, 1.0f - std::pow(0.99f, float(i + 1)));
  }
  EXPECT_FLOAT_EQ(lr[0], 0.125f);  // (0 + 1) / 4 of the peak
  EXPECT_FLOAT_EQ(lr[3], 0.5f);
  EXPECT_FLOAT_EQ(lr[4], 0.5f);      // the cosine's start
  EXPECT_NEAR(lr[54], 0.25f, 1e-6);  // halfway
  EXPECT_FLOAT_EQ(lr[104], 0.0f);    // its end, and it stays there
  for (int i = 5; i < 105; ++i) EXPECT_LE(lr[i], lr[i - 1]);
}

// --- CUDA against the CPU reference -----------------------------------------------

class CudaVsCpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto g = MakeCudaOps(0);
    if (!g.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << g.status().ToString() << ")");
    gpu = std::move(*g);
  }
  // Device copy of host bytes, freed with the fixture.
  void* Dev(const void* host, size_t bytes) {
    void* p;
    EXPECT_TRUE(gpu->Alloc(bytes, &p).ok());
    if (host) {
      EXPECT_TRUE(gpu->Upload(p, host, bytes).ok());
    }
    owned.push_back(p);
    return p;
  }
  std::vector<uint8_t> Host(const void* dev, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    EXPECT_TRUE(gpu->Download(h.data(), dev, bytes).ok());
    return h;
  }
  void TearDown() override {
    for (void* p : owned) gpu->Free(p);
  }
  // Relative tolerance of results stored in the dtype (one rounding of the
  // output plus accumulation-order differences).
  double Tol() const { return GetParam() == DType::kFloat32 ? 2e-5 : GetParam() == DType::kFloat16 ? 4e-3 : 2e-2; }
  void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (float w : want) scale = std::max(scale, double(std::fabs(w)));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::fabs(got[i] - want[i]) > rel * (std::fabs(want[i]) + 0.05 * scale) + 1e-6) {
        if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " cpu " << want[i];
      }
    }
    EXPECT_EQ(bad, 0) << what;
  }
  std::unique_ptr<Ops> cpu = MakeCpuOps();
  std::unique_ptr<Ops> gpu;
  std::vector<void*> owned;
};

TEST_P(CudaVsCpu, GemmEveryTransposition) {
  const DType dt = GetParam();
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int m = 37, n = 29, k = 53;
      auto a = Encode(Randn(size_t(m) * k, 1), dt), b = Encode(Randn(size_t(k) * n, 2), dt);
      auto c0 = Randn(size_t(m) * n, 3);
      for (DType cd : {dt, DType::kFloat32}) {
        auto c = Encode(c0, cd);
        GemmArgs g;
        g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k, g.alpha = 0.5f, g.beta = 1.0f;
        g.lda = ta ? m : k, g.ldb = tb ? k : n, g.ldc = n, g.ab = dt, g.c_dtype = cd;
        std::vector<uint8_t> cc = c;
        g.a = a.data(), g.b = b.data(), g.c = cc.data();
        ASSERT_TRUE(cpu->Gemm(g).ok());
        g.a = Dev(a.data(), a.size()), g.b = Dev(b.data(), b.size()), g.c = Dev(c.data(), c.size());
        ASSERT_TRUE(gpu->Gemm(g).ok());
        ExpectClose(Decode(Host(g.c, c.size()).data(), c0.size(), cd), Decode(cc.data(), c0.size(), cd),
                    cd == DType::kFloat32 ? 1e-4 : Tol(), "gemm");
      }
    }
}

TEST_P(CudaVsCpu, ElementwiseOpsAreBitExact) {
  const DType dt = GetParam();
  const int rows = 33, cols = 70;
  const size_t n = size_t(rows) * cols;
  auto y0 = Encode(Randn(n, 4), dt);
  auto bias = Randn(cols, 5);
  std::vector<uint8_t> yc = y0;
  ASSERT_TRUE(cpu->BiasAct(yc.data(), bias.data(), rows, cols, true, dt).ok());
  void* yg = Dev(y0.data(), y0.size());
  ASSERT_TRUE(gpu->BiasAct(yg, static_cast<float*>(Dev(bias.data(), cols * 4)), rows, cols, true, dt).ok());
  EXPECT_EQ(Host(yg, y0.size()), yc) << "bias+relu";
  auto dy0 = Encode(Randn(n, 6), dt);
  std::vector<uint8_t> dyc = dy0;
  ASSERT_TRUE(cpu->ReluBackward(dyc.data(), yc.data(), n, dt).ok());
  void* dyg = Dev(dy0.data(), dy0.size());
  ASSERT_TRUE(gpu->ReluBackward(dyg, yg, n, dt).ok());
  EXPECT_EQ(Host(dyg, dy0.size()), dyc) << "relu backward";
  auto master = Randn(n, 7);
  std::vector<uint8_t> cc(n * DTypeSize(dt));
  ASSERT_TRUE(cpu->Cast(master.data(), cc.data(), dt, n).ok());
  void* cg = Dev(nullptr, cc.size());
  ASSERT_TRUE(gpu->Cast(static_cast<float*>(Dev(master.data(), n * 4)), cg, dt, n).ok());
  EXPECT_EQ(Host(cg, cc.size()), cc) << "cast";
  // Column sums: fp32 accumulation in another order: close, not exact.
  std::vector<float> db(cols, 1.0f);
  ASSERT_TRUE(cpu->ColumnSum(dyc.data(), rows, cols, dt, db.data(), 1.0f).ok());
  std::vector<float> ones(cols, 1.0f);
  void* dbg = Dev(ones.data(), cols * 4);
  ASSERT_TRUE(gpu->ColumnSum(dyg, rows, cols, dt, static_cast<float*>(dbg), 1.0f).ok());
  ExpectClose(Decode(Host(dbg, cols * 4).data(), cols, DType::kFloat32), db, 1e-5, "column sum");
}

TEST_P(CudaVsCpu, ConvolutionForwardAndBackward) {
  const DType dt = GetParam();
  ConvShape s{3, 9, 7, 8, 16, dt};
  auto x = Encode(Randn(s.x_elems(), 8), dt), w = Encode(Randn(s.w_elems(), 9, 0.2f), dt);
  auto dy = Encode(Randn(s.y_elems(), 10), dt);
  std::vector<uint8_t> y(s.y_elems() * DTypeSize(dt)), dx(s.x_elems() * DTypeSize(dt));
  std::vector<float> dw(s.w_elems(), 0.5f);
  ASSERT_TRUE(cpu->ConvForward(s, x.data(), w.data(), y.data()).ok());
  ASSERT_TRUE(cpu->ConvBackwardData(s, dy.data(), w.data(), dx.data()).ok());
  ASSERT_TRUE(cpu->ConvBackwardFilter(s, x.data(), dy.data(), dw.data(), 1.0f).ok());
  void *xg = Dev(x.data(), x.size()), *wg = Dev(w.data(), w.size()), *dyg = Dev(dy.data(), dy.size());
  void *yg = Dev(nullptr, y.size()), *dxg = Dev(nullptr, dx.size());
  std::vector<float> half(s.w_elems(), 0.5f);
  void* dwg = Dev(half.data(), half.size() * 4);
  ASSERT_TRUE(gpu->ConvForward(s, xg, wg, yg).ok());
  ASSERT_TRUE(gpu->ConvBackwardData(s, dyg, wg, dxg).ok());
  ASSERT_TRUE(gpu->ConvBackwardFilter(s, xg, dyg, static_cast<float*>(dwg), 1.0f).ok());
  ExpectClose(Decode(Host(yg, y.size()).data(), s.y_elems(), dt), Decode(y.data(), s.y_elems(), dt), 4 * Tol(),
              "conv forward");
  ExpectClose(Decode(Host(dxg, dx.size()).data(), s.x_elems(), dt), Decode(dx.data(), s.x_elems(), dt), 4 * Tol(),
              "conv backward data");
  ExpectClose(Decode(Host(dwg, dw.size() * 4).data(), s.w_elems(), DType::kFloat32), dw, 4 * Tol(),
              "conv backward filter");
}

// --recompute blocks keeps no batchnorm-ReLU output: the backward pass makes
// the ReLU's mask again from the recomputed input. That gives the same bits
// as the stored output's mask, in place over dy too, for every dtype (bf16
// and fp16 round small positives the way the stored output did).
TEST(OpsTest, BatchNormReluMaskFromItsInputIsTheStoredOnes) {
  auto cpu = MakeCpuOps();
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const int c = 24;
    const size_t rows = 300, e = rows * c;
    // Inputs near the ReLU's edge: beta ~ -gamma*xhat for many elements.
    auto x = Encode(Randn(e, 31, 1.0f), dt), dy = Encode(Randn(e, 32), dt);
    auto gamma = Randn(c, 33);
    std::vector<float> beta(c), rm(c, 0), rv(c, 1), sm(c), si(c);
    for (int k = 0; k < c; ++k) beta[k] = (k % 3 == 0 ? 1e-6f : 0.0f) * gamma[k];
    std::vector<uint8_t> y(e * DTypeSize(dt)), dx(e * DTypeSize(dt));
    BnArgs a{rows, c, dt};
    ASSERT_TRUE(cpu->BnReluForward(a, true, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), sm.data(),
                                   si.data(), y.data())
                    .ok());
    std::vector<float> g1(c, 0.5f), b1(c, 0.5f), g2(c, 0.5f), b2(c, 0.5f);
    ASSERT_TRUE(cpu->BnReluBackward(a, x.data(), y.data(), dy.data(), gamma.data(), beta.data(), sm.data(), si.data(),
                                    dx.data(), g1.data(), b1.data(), 1.0f)
                    .ok());
    std::vector<uint8_t> inplace = dy;
    ASSERT_TRUE(cpu->BnReluBackward(a, x.data(), nullptr, inplace.data(), gamma.data(), beta.data(), sm.data(),
                                    si.data(), inplace.data(), g2.data(), b2.data(), 1.0f)
                    .ok());
    EXPECT_EQ(inplace, dx) << DTypeName(dt);
    EXPECT_EQ(g1, g2) << DTypeName(dt);
    EXPECT_EQ(b1, b2) << DTypeName(dt);
  }
}

TEST_P(CudaVsCpu, BatchNormReluAndPooling) {
  const DType dt = GetParam();
  const int n = 4, h = 7, w = 5, c = 40;  // c not a multiple of 32; odd h, w
  const size_t rows = size_t(n) * h * w, e = rows * c;
  auto x = Encode(Randn(e, 11, 2.0f), dt), dy = Encode(Randn(e, 12), dt);
  auto gamma = Randn(c, 13), beta = Randn(c, 14);
  std::vector<float> rm(c, 0.1f), rv(c, 2.0f), sm(c), si(c), dg(c, 1.0f), dbt(c, 1.0f);
  std::vector<uint8_t> y(e * DTypeSize(dt)), dx(e * DTypeSize(dt));
  BnArgs a{rows, c, dt};
  ASSERT_TRUE(cpu->BnReluForward(a, true, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), sm.data(),
                                 si.data(), y.data())
                  .ok());
  ASSERT_TRUE(cpu->BnReluBackward(a, x.data(), y.data(), dy.data(), gamma.data(), beta.data(), sm.data(), si.data(),
                                  dx.data(), dg.data(), dbt.data(), 1.0f)
                  .ok());
  std::vector<float> init_rm(c, 0.1f), init_rv(c, 2.0f), ones(c, 1.0f);
  float* f[] = {static_cast<float*>(Dev(gamma.data(), c * 4)),   static_cast<float*>(Dev(beta.data(), c * 4)),
                static_cast<float*>(Dev(init_rm.data(), c * 4)), static_cast<float*>(Dev(init_rv.data(), c * 4)),
                static_cast<float*>(Dev(nullptr, c * 4)),        static_cast<float*>(Dev(nullptr, c * 4)),
                static_cast<float*>(Dev(ones.data(), c * 4)),    static_cast<float*>(Dev(ones.data(), c * 4))};
  void *xg = Dev(x.data(), x.size()), *dyg = Dev(dy.data(), dy.size()), *yg = Dev(nullptr, y.size()),
       *dxg = Dev(nullptr, dx.size());
  ASSERT_TRUE(gpu->BnReluForward(a, true, xg, f[0], f[1], f[2], f[3], f[4], f[5], yg).ok());
  ASSERT_TRUE(gpu->BnReluBackward(a, xg, yg, dyg, f[0], f[1], f[4], f[5], dxg, f[6], f[7], 1.0f).ok());
  {
    // The mask made again from x (y null), in place over dy: the same bits
    // as from the stored y (what --recompute blocks relies on).
    std::vector<float> g6(c, 1.0f);
    void *dy2 = Dev(dy.data(), dy.size()), *g1 = Dev(g6.data(), c * 4), *g2 = Dev(g6.data(), c * 4);
    ASSERT_TRUE(gpu->BnReluBackward(a, xg, nullptr, dy2, f[0], f[1], f[4], f[5], dy2, static_cast<float*>(g1),
                                    static_cast<float*>(g2), 1.0f)
                    .ok());
    EXPECT_EQ(Host(dy2, dx.size()), Host(dxg, dx.size())) << "gpu: dx from the mask made again";
    EXPECT_EQ(Host(g1, c * 4), Host(f[6], c * 4)) << "gpu: dgamma from the mask made again";
    EXPECT_EQ(Host(g2, c * 4), Host(f[7], c * 4)) << "gpu: dbeta from the mask made again";
  }
  auto fl = [&](float* p) { return Decode(Host(p, c * 4).data(), c, DType::kFloat32); };
  ExpectClose(fl(f[4]), sm, 1e-4, "bn mean");
  ExpectClose(fl(f[5]), si, 1e-4, "bn invstd");
  ExpectClose(fl(f[2]), rm, 1e-4, "running mean");
  ExpectClose(fl(f[3]), rv, 1e-4, "running var");
  ExpectClose(Decode(Host(yg, y.size()).data(), e, dt), Decode(y.data(), e, dt), 2 * Tol(), "bn+relu forward");
  ExpectClose(Decode(Host(dxg, dx.size()).data(), e, dt), Decode(dx.data(), e, dt), 4 * Tol() + 1e-4,
              "bn+relu backward");
  ExpectClose(fl(f[6]), dg, 1e-3, "dgamma");
  ExpectClose(fl(f[7]), dbt, 1e-3, "dbeta");
  // Eval mode uses the running statistics.
  ASSERT_TRUE(cpu->BnReluForward(a, false, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), sm.data(),
                                 si.data(), y.data())
                  .ok());
  ASSERT_TRUE(gpu->BnReluForward(a, false, xg, f[0], f[1], f[2], f[3], f[4], f[5], yg).ok());
  ExpectClose(Decode(Host(yg, y.size()).data(), e, dt), Decode(y.data(), e, dt), 2 * Tol(), "bn eval");
  // Pooling: selection and scatter are exact.
  const size_t pe = size_t(n) * (h / 2) * (w / 2) * c;
  std::vector<uint8_t> py(pe * DTypeSize(dt)), pdx(e * DTypeSize(dt)), am(pe);
  ASSERT_TRUE(cpu->MaxPoolForward(n, h, w, c, dt, x.data(), py.data(), am.data()).ok());
  ASSERT_TRUE(cpu->MaxPoolBackward(n, h, w, c, dt, py.data(), am.data(), pdx.data()).ok());
  void *pyg = Dev(nullptr, py.size()), *pdxg = Dev(nullptr, pdx.size());
  auto* amg = static_cast<uint8_t*>(Dev(nullptr, pe));
  ASSERT_TRUE(gpu->MaxPoolForward(n, h, w, c, dt, xg, pyg, amg).ok());
  ASSERT_TRUE(gpu->MaxPoolBackward(n, h, w, c, dt, pyg, amg, pdxg).ok());
  EXPECT_EQ(Host(pyg, py.size()), py) << "pool forward";
  EXPECT_EQ(Host(amg, pe), am) << "pool argmax";
  EXPECT_EQ(Host(pdxg, pdx.size()), pdx) << "pool backward";
}

TEST_P(CudaVsCpu, SoftmaxCrossEntropyNormAndOptimizer) {
  const DType dt = GetParam();
  const int rows = 70, classes = 37;
  auto z = Encode(Randn(size_t(rows) * classes, 15, 3.0f), dt);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 7) % classes;
  ScalerState sc;
  sc.scale = 256;
  double loss = 0;
  int64_t correct = 0;
  std::vector<uint8_t> dz(z.size());
  ASSERT_TRUE(
      cpu->SoftmaxXent(rows, classes, dt, z.data(), labels.data(), &loss, &correct, dz.data(), &sc, 70.0f).ok());
  struct Acc {
    double loss = 0;
    int64_t correct = 0;
  } zero;
  auto* acc = static_cast<Acc*>(Dev(&zero, sizeof zero));
  void* dzg = Dev(nullptr, dz.size());
  auto* scg = static_cast<ScalerState*>(Dev(&sc, sizeof sc));
  ASSERT_TRUE(gpu->SoftmaxXent(rows, classes, dt, Dev(z.data(), z.size()),
                               static_cast<int32_t*>(Dev(labels.data(), rows * 4)), &acc->loss, &acc->correct, dzg, scg,
                               70.0f)
                  .ok());
  Acc got;
  ASSERT_TRUE(gpu->Download(&got, acc, sizeof got).ok());
  EXPECT_NEAR(got.loss, loss, 1e-4 * std::fabs(loss));
  EXPECT_EQ(got.correct, correct);
  ExpectClose(Decode(Host(dzg, dz.size()).data(), z.size() / DTypeSize(dt), dt),
              Decode(dz.data(), z.size() / DTypeSize(dt), dt), 2 * Tol() + 1e-5, "dlogits");

  // Norm + scaler + both optimizers over two tensors: fp32 exact but for the
  // norm's summation order (the coefficient then matches to ~1 ulp).
  std::vector<float> g1 = Randn(1000, 16), g2 = Randn(77, 17);
  float* hp[] = {g1.data(), g2.data()};
  size_t hn[] = {1000, 77};
  ScalerState hs;
  hs.scale = 4;
  ASSERT_TRUE(cpu->FinishGradients(hp, hn, 2, 5.0f, &hs).ok());
  float* dp[] = {static_cast<float*>(Dev(g1.data(), 4000)), static_cast<float*>(Dev(g2.data(), 77 * 4))};
  auto* dpp = static_cast<float* const*>(Dev(dp, sizeof dp));
  auto* dn = static_cast<const size_t*>(Dev(hn, sizeof hn));
  ScalerState ds0;
  ds0.scale = 4;
  auto* ds = static_cast<ScalerState*>(Dev(&ds0, sizeof ds0));
  ASSERT_TRUE(gpu->FinishGradients(dpp, dn, 2, 5.0f, ds).ok());
  ScalerState gs;
  ASSERT_TRUE(gpu->Download(&gs, ds, sizeof gs).ok());
  EXPECT_NEAR(gs.grad_norm, hs.grad_norm, 1e-5 * hs.grad_norm);
  EXPECT_NEAR(gs.step_coef, hs.step_coef, 1e-6 * hs.step_coef);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    OptimizerStep o;
    o.kind = kind, o.weight_decay = 0.1f;
    // The schedule advanced on each side from step 2: the same rate and
    // corrections (up to cos's last ulp in double, then rounded to fp32).
    Schedule sched;
    sched.peak_lr = 0.01f, sched.warmup = 1, sched.total = 10;
    StepState hst;
    hst.step = 2;
    auto* dst = static_cast<StepState*>(Dev(&hst, sizeof hst));
    ASSERT_TRUE(cpu->AdvanceSchedule(sched, &hst).ok());
    ASSERT_TRUE(gpu->AdvanceSchedule(sched, dst).ok());
    StepState gst;
    ASSERT_TRUE(gpu->Download(&gst, dst, sizeof gst).ok());
    EXPECT_EQ(gst.step, hst.step);
    EXPECT_NEAR(gst.lr, hst.lr, 1e-6 * hst.lr);  // powf and cos: CUDA's are within 2 ulp
    EXPECT_NEAR(gst.bc1, hst.bc1, 1e-6 * hst.bc1);
    EXPECT_NEAR(gst.bc2, hst.bc2, 1e-6 * hst.bc2);
    ASSERT_TRUE(gpu->Upload(dst, &hst, sizeof hst).ok());
    std::vector<float> w = Randn(1000, 18), m = Randn(1000, 19), v(1000, 0.5f);
    std::vector<uint8_t> copy(1000 * DTypeSize(dt));
    float* dw = static_cast<float*>(Dev(w.data(), 4000));
    float* dm = static_cast<float*>(Dev(m.data(), 4000));
    float* dv = static_cast<float*>(Dev(v.data(), 4000));
    void* dcopy = Dev(nullptr, copy.size());
    // Same coefficient on both sides, so the update itself must be exact.
    ASSERT_TRUE(gpu->Upload(ds, &hs, sizeof hs).ok());
    ASSERT_TRUE(
        cpu->ApplyOptimizer(o, true, 1000, w.data(), g1.data(), m.data(), v.data(), copy.data(), dt, &hs, &hst).ok());
    ASSERT_TRUE(gpu->ApplyOptimizer(o, true, 1000, dw, dp[0], dm, dv, dcopy, dt, ds, dst).ok());
    EXPECT_EQ(Decode(Host(dw, 4000).data(), 1000, DType::kFloat32), w) << "optimizer weights";
    EXPECT_EQ(Decode(Host(dm, 4000).data(), 1000, DType::kFloat32), m) << "optimizer state";
    EXPECT_EQ(Host(dcopy, copy.size()), copy) << "compute copy";
  }
  // 8-bit states: one launch over two tensors (one with a partial last
  // block), bit for bit the CPU's, over three steps (the states requantized
  // each time).
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    OptimizerStep o;
    o.kind = kind, o.weight_decay = 0.1f;
    StepState hst;
    hst.lr = 0.01f, hst.bc1 = 0.3f, hst.bc2 = 0.01f;
    auto* dst = static_cast<StepState*>(Dev(&hst, sizeof hst));
    const size_t sizes[2] = {1000, 4096};
    std::vector<float> hw[2], hg[2], ha1[2], ha2[2];
    std::vector<uint8_t> hq1[2], hq2[2], hcopy[2];
    Quant8Tensor ht[2], dt8[2];
    std::vector<Quant8Block> blocks;
    for (int k = 0; k < 2; ++k) {
      const size_t n = sizes[k], nb = (n + kQuantBlock - 1) / kQuantBlock;
      hw[k] = Randn(n, 30 + k), hg[k] = Randn(n, 40 + k), ha1[k].assign(nb, 0), ha2[k].assign(nb, 0);
      hq1[k].assign(n, 0), hq2[k].assign(n, 0), hcopy[k].assign(n * DTypeSize(dt), 0);
      ht[k].master = hw[k].data(), ht[k].grad = hg[k].data(), ht[k].q1 = hq1[k].data(), ht[k].a1 = ha1[k].data();
      ht[k].q2 = kind == OptimizerKind::kAdamW ? hq2[k].data() : nullptr;
      ht[k].a2 = kind == OptimizerKind::kAdamW ? ha2[k].data() : nullptr;
      ht[k].copy = hcopy[k].data(), ht[k].n = n, ht[k].decay = k;
      dt8[k] = ht[k];
      dt8[k].master = static_cast<float*>(Dev(hw[k].data(), n * 4));
      dt8[k].grad = static_cast<float*>(Dev(hg[k].data(), n * 4));
      dt8[k].q1 = static_cast<uint8_t*>(Dev(hq1[k].data(), n));
      dt8[k].a1 = static_cast<float*>(Dev(ha1[k].data(), nb * 4));
      dt8[k].q2 = ht[k].q2 ? static_cast<uint8_t*>(Dev(hq2[k].data(), n)) : nullptr;
      dt8[k].a2 = ht[k].a2 ? static_cast<float*>(Dev(ha2[k].data(), nb * 4)) : nullptr;
      dt8[k].copy = Dev(nullptr, hcopy[k].size());
      for (uint32_t b = 0; b < nb; ++b) blocks.push_back({k, b});
    }
    float codes[512];
    Quant8Code(true, codes);
    Quant8Code(false, codes + 256);
    auto* dcodes = static_cast<const float*>(Dev(codes, sizeof codes));
    auto* dtensors = static_cast<const Quant8Tensor*>(Dev(dt8, sizeof dt8));
    auto* dblocks = static_cast<const Quant8Block*>(Dev(blocks.data(), blocks.size() * sizeof blocks[0]));
    ScalerState one;
    auto* dscaler = static_cast<const ScalerState*>(Dev(&one, sizeof one));
    const int nblocks = static_cast<int>(blocks.size());
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(cpu->ApplyOptimizer8bit(o, ht, blocks.data(), nblocks, codes, codes + 256, dt, &one, &hst).ok());
      ASSERT_TRUE(gpu->ApplyOptimizer8bit(o, dtensors, dblocks, nblocks, dcodes, dcodes + 256, dt, dscaler, dst).ok());
    }
    for (int k = 0; k < 2; ++k) {
      const size_t n = sizes[k], nb = ha1[k].size();
      EXPECT_EQ(Decode(Host(dt8[k].master, n * 4).data(), n, DType::kFloat32), hw[k]) << "8-bit weights " << k;
      EXPECT_EQ(Host(dt8[k].q1, n), hq1[k]) << "8-bit m " << k;
      EXPECT_EQ(Decode(Host(dt8[k].a1, nb * 4).data(), nb, DType::kFloat32), ha1[k]) << "absmax m " << k;
      if (ht[k].q2) {
        EXPECT_EQ(Host(dt8[k].q2, n), hq2[k]) << "8-bit v " << k;
      }
      EXPECT_EQ(Host(dt8[k].copy, hcopy[k].size()), hcopy[k]) << "compute copy " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaVsCpu, ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace gpufeed::trainer
