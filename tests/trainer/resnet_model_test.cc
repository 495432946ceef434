// --model resnet18 (issue 51): torchvision's layout (its parameter count),
// a tiny version's gradients against finite differences and its loss
// falling on a small synthetic task on the CPU, the refusals, and the CUDA
// model against its CPU twin (skipped without a GPU, failed under
// GPUFEED_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "tests/testing/gpu_required.h"
#include "trainer/model.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {
namespace {

ModelSpec TinySpec() {
  ModelSpec s;
  s.kind = ModelKind::kResnet18;
  s.widths = {3, 3, 4, 4};
  s.in_h = 16, s.in_w = 13, s.in_c = 2, s.classes = 3, s.max_batch = 6, s.seed = 5;
  s.optimizer = OptimizerKind::kSgd;
  return s;
}

std::vector<float> Randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Mean loss over the batch; with `grads`, the gradients too.
double LossAndGradients(Ops* ops, Model& m, const std::vector<float>& x, const std::vector<int32_t>& labels,
                        bool grads) {
  const int b = static_cast<int>(labels.size());
  double loss = 0;
  int64_t correct = 0;
  ScalerState scaler;
  EXPECT_TRUE(m.Forward(x.data(), b, true).ok());
  EXPECT_TRUE(ops->SoftmaxXent(b, m.spec().classes, DType::kFloat32, m.logits(), labels.data(), &loss, &correct,
                               grads ? m.dlogits() : nullptr, grads ? &scaler : nullptr, float(b))
                  .ok());
  if (grads) {
    EXPECT_TRUE(m.Backward(x.data(), b, false).ok());
  }
  return loss / b;
}

// The full-size model counted (nothing allocated): torchvision's
// resnet18(num_classes=1000) has 11,689,512 parameters, 20 convolutions
// (3 of them the 1x1 projections) and 20 batchnorms.
TEST(ResnetModelTest, FullSizeHasTorchvisionsParameters) {
  auto ops = MakeCpuOps();
  ModelSpec s;
  s.kind = ModelKind::kResnet18;
  s.widths = {64, 128, 256, 512};
  s.in_h = s.in_w = 224, s.in_c = 3, s.classes = 1000, s.max_batch = 2;
  s.plan_only = true;
  Model m(ops.get(), s);
  ASSERT_TRUE(m.Init().ok());
  EXPECT_EQ(m.num_parameters(), 11689512u);
  int convs = 0, projections = 0, bns = 0;
  for (const Param& p : m.params()) {
    if (p.name.find(".bn.gamma") != std::string::npos) ++bns;
    if (p.name.find(".weight") != std::string::npos && p.name.find("conv") == 0) {
      ++convs;
      projections += p.n == 64u * 128 || p.n == 128u * 256 || p.n == 256u * 512;
    }
  }
  EXPECT_EQ(convs, 20);
  EXPECT_EQ(projections, 3);
  EXPECT_EQ(bns, 20);
  EXPECT_EQ(m.Describe(), "resnet18 3x224x224-c64-c128-c256-c512-1000");
}

// Every parameter of a tiny resnet18 (odd input width: the strided convs'
// and pools' floors) against central differences: the residual sums, the
// projections, batchnorm with and without ReLU, both poolings. A model this
// small (batchnorm over a few values, many ReLU and pooling kinks) is smooth
// only at small scales: a step crosses kinks often (a ReLU of the last
// stages carries a sixth of the loss), so an element is compared at the
// largest of three steps whose one-sided differences agree, and left out
// where none's do.
TEST(ResnetModelTest, TinyGradientsMatchFiniteDifferences) {
  auto ops = MakeCpuOps();
  ModelSpec s = TinySpec();
  Model m(ops.get(), s);
  ASSERT_TRUE(m.Init().ok());
  const auto x = Randn(size_t(s.max_batch) * s.in_h * s.in_w * s.in_c, 9);
  std::vector<int32_t> labels;
  for (int i = 0; i < s.max_batch; ++i) labels.push_back(i % s.classes);
  LossAndGradients(ops.get(), m, x, labels, true);
  const double center = LossAndGradients(ops.get(), m, x, labels, false);
  int checked = 0, kinks = 0, tensors = 0;
  const double tol_abs = 3e-3, tol_rel = 0.03;
  for (Param& p : m.params()) {
    ++tensors;
    const std::vector<float> analytic(p.grad, p.grad + p.n);
    for (size_t i = 0; i < p.n; i += std::max<size_t>(1, p.n / 3)) {
      const float saved = p.master[i];
      bool compared = false;
      for (float step : {1e-3f, 3e-4f, 1e-4f}) {
        const float eps = step * std::max(1.0f, std::fabs(saved));
        p.master[i] = saved + eps;
        const double up = LossAndGradients(ops.get(), m, x, labels, false);
        p.master[i] = saved - eps;
        const double down = LossAndGradients(ops.get(), m, x, labels, false);
        p.master[i] = saved;
        const double fwd = (up - center) / eps, bwd = (center - down) / eps;
        // A kink inside the step moves the central difference by up to half
        // the one-sided ones' gap: past the tolerance, try a smaller step.
        if (std::fabs(fwd - bwd) > tol_abs + tol_rel * std::max(std::fabs(fwd), std::fabs(bwd))) continue;
        const double numeric = (up - down) / (2 * eps);
        EXPECT_NEAR(analytic[i], numeric, tol_abs + tol_rel * std::fabs(numeric)) << p.name << "[" << i << "]";
        compared = true;
        break;
      }
      ++(compared ? checked : kinks);
    }
  }
  EXPECT_EQ(tensors, 20 + 2 * 20 + 2);  // 20 conv weights, 20 bns (gamma, beta), the head's 2
  EXPECT_GT(checked, 100);
  EXPECT_LE(kinks, checked / 4) << "too many elements at a kink to say anything (" << kinks << ")";
}

// Three classes told apart by where channel 0 is bright; SGD with
// momentum on 48 fixed samples: the mean loss falls to under half its start.
TEST(ResnetModelTest, TinyLossFallsOnASyntheticTask) {
  auto ops = MakeCpuOps();
  ModelSpec s = TinySpec();
  s.max_batch = 16;
  Model m(ops.get(), s);
  ASSERT_TRUE(m.Init().ok());
  const size_t px = size_t(s.in_h) * s.in_w * s.in_c;
  std::vector<std::vector<float>> xs(3);
  std::vector<std::vector<int32_t>> ys(3);
  std::mt19937_64 g(3);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  for (int b = 0; b < 3; ++b)
    for (int k = 0; k < s.max_batch; ++k) {
      const int cls = int(g() % 3);
      ys[b].push_back(cls);
      for (int y = 0; y < s.in_h; ++y)
        for (int x = 0; x < s.in_w; ++x)
          for (int c = 0; c < s.in_c; ++c) {
            const bool lit = c == 0 && (cls == 0   ? y < s.in_h / 2 && x < s.in_w / 2
                                        : cls == 1 ? y < s.in_h / 2 && x >= s.in_w / 2
                                                   : y >= s.in_h / 2);
            xs[b].push_back(noise(g) + (lit ? 1.5f : 0.0f));
          }
      ASSERT_EQ(xs[b].size(), (k + 1) * px);
    }
  OptimizerStep opt;
  opt.kind = OptimizerKind::kSgd;
  StepState st;
  st.lr = 0.05f;
  auto epoch_loss = [&](bool train) {
    double sum = 0;
    for (int b = 0; b < 3; ++b) {
      sum += LossAndGradients(ops.get(), m, xs[b], ys[b], train);
      if (!train) continue;
      ScalerState scaler;
      std::vector<float*> grads;
      std::vector<size_t> sizes;
      for (Param& p : m.params()) grads.push_back(p.grad), sizes.push_back(p.n);
      EXPECT_TRUE(ops->FinishGradients(grads.data(), sizes.data(), int(grads.size()), 0, &scaler).ok());
      for (Param& p : m.params())
        EXPECT_TRUE(
            ops->ApplyOptimizer(opt, p.decay, p.n, p.master, p.grad, p.s1, p.s2, nullptr, DType::kFloat32, &scaler, &st)
                .ok());
    }
    return sum / 3;
  };
  const double start = epoch_loss(false);
  for (int e = 0; e < 12; ++e) epoch_loss(true);
  const double end = epoch_loss(false);
  EXPECT_LT(end, 0.5 * start) << "start " << start << " end " << end;
}

TEST(ResnetModelTest, RefusesWhatItDoesNotRunNamingIt) {
  auto ops = MakeCpuOps();
  auto refused = [&](ModelSpec s, const char* what) {
    Model m(ops.get(), s);
    const Status st = m.Init();
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.ToString().find(what), std::string::npos) << st.ToString();
  };
  ModelSpec s = TinySpec();
  s.widths = {8, 16};
  refused(s, "four stages' channels");
  s = TinySpec();
  s.layer_end = 10;  // block 8-12's add reads its input, layer 7, from the stage before
  refused(s, "inside a basic block");
  s = TinySpec();
  s.layer_begin = 16;  // block 13-19's projection (17) reads layer 12
  refused(s, "inside a basic block");
  s = TinySpec();
  s.recompute_blocks = true;
  refused(s, "--recompute blocks");
  s = TinySpec();
  s.lora_rank = 2;
  refused(s, "LoRA");
}

// Pipeline stages (issue 51): a stage begins only where one activation
// crosses (layers 0-2 the stem, then blocks of 5 layers, or 7 with a
// projection, from stage 2 of the four on; 49 the pooling, 50 the head).
// Two stages cut between blocks, the second's input the first's output and
// its input gradient the first's output gradient, give the whole model's
// logits and every parameter gradient, bit for bit; so do three, one of
// them beginning at a projection block (whose shortcut reads the stage's
// input) and one a single block with an identity shortcut.
TEST(ResnetModelTest, StagesCutBetweenBlocksGiveTheWholeModelsGradients) {
  auto ops = MakeCpuOps();
  ModelSpec s = TinySpec();
  Model whole(ops.get(), s);
  ASSERT_TRUE(whole.Init().ok());
  ASSERT_EQ(whole.num_layers(), 51);
  std::vector<int> may;
  for (int i = 1; i < whole.num_layers(); ++i)
    if (whole.StageMayBeginAt(i)) may.push_back(i);
  EXPECT_EQ(may, (std::vector<int>{1, 2, 3, 8, 13, 20, 25, 32, 37, 44, 49, 50}));
  const auto x = Randn(size_t(s.max_batch) * s.in_h * s.in_w * s.in_c, 11);
  std::vector<int32_t> labels;
  for (int i = 0; i < s.max_batch; ++i) labels.push_back((i * 2 + 1) % s.classes);
  LossAndGradients(ops.get(), whole, x, labels, true);
  const size_t classes = size_t(s.classes) * s.max_batch;
  const std::vector<float> logits(static_cast<const float*>(whole.logits()),
                                  static_cast<const float*>(whole.logits()) + classes);
  std::vector<std::vector<float>> grads;
  for (Param& p : whole.params()) grads.emplace_back(p.grad, p.grad + p.n);
  for (const std::vector<int>& cuts : {std::vector<int>{0, 13, 51}, std::vector<int>{0, 8, 20, 51}}) {
    SCOPED_TRACE("cut at " + std::to_string(cuts[1]) + (cuts.size() > 3 ? ", " + std::to_string(cuts[2]) : ""));
    std::vector<std::unique_ptr<Model>> st;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      ModelSpec part = s;
      part.layer_begin = cuts[k], part.layer_end = cuts[k + 1];
      st.push_back(std::make_unique<Model>(ops.get(), part));
      ASSERT_TRUE(st.back()->Init().ok());
    }
    const void* in = x.data();
    for (auto& m : st) {
      ASSERT_TRUE(m->Forward(in, s.max_batch, true).ok());
      in = m->output();
    }
    Model& last = *st.back();
    double loss = 0;
    int64_t correct = 0;
    ScalerState scaler;
    ASSERT_TRUE(ops->SoftmaxXent(s.max_batch, s.classes, DType::kFloat32, last.logits(), labels.data(), &loss, &correct,
                                 last.dlogits(), &scaler, float(s.max_batch))
                    .ok());
    EXPECT_EQ(std::vector<float>(static_cast<const float*>(last.logits()),
                                 static_cast<const float*>(last.logits()) + classes),
              logits);
    const void* dy = nullptr;
    for (size_t k = st.size(); k-- > 0;) {
      const void* input = k == 0 ? x.data() : st[k - 1]->output();
      ASSERT_TRUE(st[k]->Backward(input, s.max_batch, false, {}, 0, dy).ok());
      dy = st[k]->input_grad();
      EXPECT_EQ(dy == nullptr, k == 0);
    }
    size_t at = 0;
    for (auto& m : st)
      for (Param& p : m->params()) {
        ASSERT_LT(at, grads.size());
        EXPECT_EQ(p.name, whole.params()[at].name);
        EXPECT_EQ(std::vector<float>(p.grad, p.grad + p.n), grads[at]) << p.name;
        ++at;
      }
    EXPECT_EQ(at, grads.size());
  }
}

// The whole tiny model on the GPU against its CPU twin (fp32): logits and
// every parameter gradient.
TEST(ResnetModelTest, CudaMatchesTheCpuTwin) {
  auto g = MakeCudaOps(0);
  if (!g.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << g.status().ToString() << ")");
  auto cpu = MakeCpuOps();
  ModelSpec s = TinySpec();
  Model mc(cpu.get(), s), mg(g->get(), s);
  ASSERT_TRUE(mc.Init().ok());
  ASSERT_TRUE(mg.Init().ok());
  const auto x = Randn(size_t(s.max_batch) * s.in_h * s.in_w * s.in_c, 9);
  std::vector<int32_t> labels;
  for (int i = 0; i < s.max_batch; ++i) labels.push_back(i % s.classes);
  LossAndGradients(cpu.get(), mc, x, labels, true);
  Ops& gpu = **g;
  void *xg, *lg, *loss, *correct, *scaler;
  ASSERT_TRUE(gpu.Alloc(x.size() * 4, &xg).ok());
  ASSERT_TRUE(gpu.Alloc(labels.size() * 4, &lg).ok());
  ASSERT_TRUE(gpu.Alloc(8, &loss).ok());
  ASSERT_TRUE(gpu.Alloc(8, &correct).ok());
  ASSERT_TRUE(gpu.Alloc(sizeof(ScalerState), &scaler).ok());
  ScalerState sc;
  ASSERT_TRUE(gpu.Upload(xg, x.data(), x.size() * 4).ok());
  ASSERT_TRUE(gpu.Upload(lg, labels.data(), labels.size() * 4).ok());
  ASSERT_TRUE(gpu.Upload(scaler, &sc, sizeof sc).ok());
  ASSERT_TRUE(mg.Forward(xg, s.max_batch, true).ok());
  ASSERT_TRUE(gpu.SoftmaxXent(s.max_batch, s.classes, DType::kFloat32, mg.logits(), static_cast<int32_t*>(lg),
                              static_cast<double*>(loss), static_cast<int64_t*>(correct), mg.dlogits(),
                              static_cast<ScalerState*>(scaler), float(s.max_batch))
                  .ok());
  ASSERT_TRUE(mg.Backward(xg, s.max_batch, false).ok());
  std::vector<float> logits(size_t(s.max_batch) * s.classes);
  ASSERT_TRUE(gpu.Download(logits.data(), mg.logits(), logits.size() * 4).ok());
  const float* want = static_cast<const float*>(mc.logits());
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(logits[i], want[i], 1e-3 + 1e-3 * std::fabs(want[i])) << i;
  for (size_t q = 0; q < mc.params().size(); ++q) {
    const Param& pc = mc.params()[q];
    std::vector<float> got(pc.n);
    ASSERT_TRUE(gpu.Download(got.data(), mg.params()[q].grad, pc.n * 4).ok());
    double scale = 0;
    for (size_t i = 0; i < pc.n; ++i) scale = std::max(scale, double(std::fabs(pc.grad[i])));
    for (size_t i = 0; i < pc.n; ++i)
      EXPECT_NEAR(got[i], pc.grad[i], 1e-3 * scale + 1e-5) << pc.name << "[" << i << "]";
  }
  for (void* p : {xg, lg, loss, correct, scaler}) gpu.Free(p);
}

}  // namespace
}  // namespace gpufeed::trainer
