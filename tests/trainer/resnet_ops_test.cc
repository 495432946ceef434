// The operations ResNet-18 adds to the trainer (issue 51): strided and 1x1
// convolutions, batchnorm without its ReLU, the stem's 3x3/2 max pooling,
// global average pooling and the residual add. The CPU reference against
// definitions and finite differences on small shapes; every CUDA version
// against its CPU twin (skipped without a GPU, failed under
// GPUFEED_REQUIRE_GPU=1 as the other GPU trainer cases).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gpufeed/dtype.h"
#include "tests/testing/gpu_required.h"
#include "trainer/elem.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {
namespace {

std::vector<float> Randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
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
double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// The shapes ResNet-18 convolves with, shrunk: its 7x7/2 stem (pad 3), a
// strided 3x3/2 (pad 1), a 1x1/2 projection (pad 0), and odd input sizes.
std::vector<ConvShape> ResnetConvShapes(DType dt) {
  std::vector<ConvShape> v;
  ConvShape stem{2, 11, 9, 3, 4, dt};
  stem.r = 7, stem.stride = 2, stem.pad = 3;
  ConvShape down{2, 7, 6, 4, 5, dt};
  down.r = 3, down.stride = 2, down.pad = 1;
  ConvShape proj{2, 7, 6, 4, 5, dt};
  proj.r = 1, proj.stride = 2, proj.pad = 0;
  v.push_back(stem);
  v.push_back(down);
  v.push_back(proj);
  return v;
}

// The output geometry and values against a direct loop over the definition
// (the finite differences below only check backward against forward).
TEST(ResnetOpsTest, StridedConvForwardFollowsTheDefinition) {
  auto ops = MakeCpuOps();
  for (const ConvShape& s : ResnetConvShapes(DType::kFloat32)) {
    EXPECT_EQ(s.out_h(), (s.h + 2 * s.pad - s.r) / s.stride + 1);
    if (s.r == 7) {
      EXPECT_EQ(s.out_h(), 6);  // 11 -> 6 as torchvision's stem (floor)
    }
    std::vector<float> x = Randn(s.x_elems(), 1), w = Randn(s.w_elems(), 2), y(s.y_elems());
    ASSERT_TRUE(ops->ConvForward(s, x.data(), w.data(), y.data()).ok());
    for (int b = 0; b < s.n; ++b)
      for (int i = 0; i < s.out_h(); ++i)
        for (int j = 0; j < s.out_w(); ++j)
          for (int k = 0; k < s.k; ++k) {
            double want = 0;
            for (int r = 0; r < s.r; ++r)
              for (int q = 0; q < s.r; ++q) {
                const int iy = i * s.stride + r - s.pad, ix = j * s.stride + q - s.pad;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                for (int c = 0; c < s.c; ++c)
                  want += double(x[((size_t(b) * s.h + iy) * s.w + ix) * s.c + c]) *
                          w[((size_t(k) * s.r + r) * s.r + q) * s.c + c];
              }
            const size_t yi = ((size_t(b) * s.out_h() + i) * s.out_w() + j) * s.k + k;
            ASSERT_NEAR(y[yi], want, 1e-4 * (1 + std::fabs(want))) << "r=" << s.r << " at " << yi;
          }
  }
}

// L = sum(y * r) for a fixed r: dL/dx and dL/dw against central differences.
TEST(ResnetOpsTest, StridedConvGradientsMatchFiniteDifferences) {
  auto ops = MakeCpuOps();
  for (const ConvShape& s : ResnetConvShapes(DType::kFloat32)) {
    std::vector<float> x = Randn(s.x_elems(), 3), w = Randn(s.w_elems(), 4, 0.3f), r = Randn(s.y_elems(), 5);
    std::vector<float> y(s.y_elems()), dx(s.x_elems()), dw(s.w_elems());
    ASSERT_TRUE(ops->ConvBackwardData(s, r.data(), w.data(), dx.data()).ok());
    ASSERT_TRUE(ops->ConvBackwardFilter(s, x.data(), r.data(), dw.data(), 0.0f).ok());
    auto loss = [&] {
      EXPECT_TRUE(ops->ConvForward(s, x.data(), w.data(), y.data()).ok());
      return Dot(y, r);
    };
    for (auto [v, g] : {std::pair{&x, &dx}, std::pair{&w, &dw}}) {
      for (size_t i = 0; i < v->size(); i += 1 + v->size() / 40) {
        const float saved = (*v)[i];
        (*v)[i] = saved + 1e-2f;
        const double up = loss();
        (*v)[i] = saved - 1e-2f;
        const double down = loss();
        (*v)[i] = saved;
        EXPECT_NEAR((*g)[i], (up - down) / 2e-2, 2e-3 + 1e-3 * std::fabs((*g)[i]))
            << "r=" << s.r << (v == &x ? " dx[" : " dw[") << i << "]";
      }
    }
    // An input pixel no window reads (the 1x1/2's odd rows) gets no gradient.
    if (s.r == 1) {
      EXPECT_EQ(dx[size_t(s.w) * s.c], 0.0f);
    }
  }
}

// Batchnorm alone (BnArgs::relu false): y = gamma xhat + beta (negative
// values kept), and dx, dgamma, dbeta against central differences.
TEST(ResnetOpsTest, BatchNormWithoutReluMatchesFiniteDifferences) {
  auto ops = MakeCpuOps();
  const int rows = 18, c = 5;
  BnArgs a{size_t(rows), c, DType::kFloat32};
  a.relu = false;
  std::vector<float> x = Randn(size_t(rows) * c, 6, 2.0f), r = Randn(x.size(), 7);
  std::vector<float> gamma = Randn(c, 8), beta = Randn(c, 9);
  std::vector<float> rm(c, 0), rv(c, 1), sm(c), si(c), y(x.size()), dx(x.size()), dg(c), db(c);
  auto loss = [&] {
    EXPECT_TRUE(ops->BnReluForward(a, true, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), sm.data(),
                                   si.data(), y.data())
                    .ok());
    return Dot(y, r);
  };
  loss();
  int negative = 0;
  for (float v : y) negative += v < 0;
  EXPECT_GT(negative, 0) << "no ReLU: negative outputs stay";
  ASSERT_TRUE(ops->BnReluBackward(a, x.data(), y.data(), r.data(), gamma.data(), beta.data(), sm.data(), si.data(),
                                  dx.data(), dg.data(), db.data(), 0.0f)
                  .ok());
  for (auto [v, g] : {std::pair{&x, &dx}, std::pair{&gamma, &dg}, std::pair{&beta, &db}}) {
    for (size_t i = 0; i < v->size(); i += 1 + v->size() / 30) {
      const float saved = (*v)[i];
      (*v)[i] = saved + 1e-2f;
      const double up = loss();
      (*v)[i] = saved - 1e-2f;
      const double down = loss();
      (*v)[i] = saved;
      EXPECT_NEAR((*g)[i], (up - down) / 2e-2, 2e-3 + 2e-3 * std::fabs((*g)[i])) << i;
    }
  }
  // The mask made again from x (y null) is no mask either.
  std::vector<float> dx2(x.size()), dg2(c), db2(c);
  ASSERT_TRUE(ops->BnReluBackward(a, x.data(), nullptr, r.data(), gamma.data(), beta.data(), sm.data(), si.data(),
                                  dx2.data(), dg2.data(), db2.data(), 0.0f)
                  .ok());
  EXPECT_EQ(dx2, dx);
}

// The stem's pooling on distinct values (no ties, so the loss is smooth
// away from the windows' maxima): the forward against the definition, the
// backward against central differences (overlapping windows add).
TEST(ResnetOpsTest, MaxPool3x3Stride2FollowsTheDefinitionAndItsGradient) {
  auto ops = MakeCpuOps();
  const int n = 2, h = 7, w = 6, c = 3, oh = 4, ow = 3;
  std::vector<float> x(size_t(n) * h * w * c);
  std::mt19937_64 g(10);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.01f - 1.0f;  // spaced wider than the steps
  std::shuffle(x.begin(), x.end(), g);
  std::vector<float> y(size_t(n) * oh * ow * c), r = Randn(y.size(), 11), dx(x.size());
  std::vector<uint8_t> am(y.size());
  ASSERT_TRUE(ops->MaxPool3x3Forward(n, h, w, c, DType::kFloat32, x.data(), y.data(), am.data()).ok());
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j)
        for (int ch = 0; ch < c; ++ch) {
          float best = -INFINITY;
          for (int iy = 2 * i - 1; iy <= 2 * i + 1; ++iy)
            for (int ix = 2 * j - 1; ix <= 2 * j + 1; ++ix)
              if (iy >= 0 && iy < h && ix >= 0 && ix < w)
                best = std::max(best, x[((size_t(b) * h + iy) * w + ix) * c + ch]);
          ASSERT_EQ(y[((size_t(b) * oh + i) * ow + j) * c + ch], best);
        }
  ASSERT_TRUE(ops->MaxPool3x3Backward(n, h, w, c, DType::kFloat32, r.data(), am.data(), dx.data()).ok());
  auto loss = [&] {
    EXPECT_TRUE(ops->MaxPool3x3Forward(n, h, w, c, DType::kFloat32, x.data(), y.data(), am.data()).ok());
    return Dot(y, r);
  };
  int shared = 0;  // inputs that win two windows or more
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i], hi = saved + 1e-3f, lo = saved - 1e-3f;
    x[i] = hi;
    const double up = loss();
    x[i] = lo;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (double(hi) - lo);
    EXPECT_NEAR(dx[i], numeric, 1e-3 + 1e-3 * std::fabs(numeric)) << i;
    int wins = 0;
    for (float rv : r) wins += std::fabs(numeric - rv) < 1e-3;
    shared += dx[i] != 0 && wins == 0;
  }
  EXPECT_GT(shared, 0) << "no input won two overlapping windows: the sum is untested";
}

TEST(ResnetOpsTest, GlobalAveragePoolAndResidualAdd) {
  auto ops = MakeCpuOps();
  const int n = 3, hw = 5, c = 4;
  std::vector<float> x = Randn(size_t(n) * hw * c, 12), y(size_t(n) * c), r = Randn(y.size(), 13), dx(x.size());
  ASSERT_TRUE(ops->GlobalAvgPoolForward(n, hw, c, DType::kFloat32, x.data(), y.data()).ok());
  for (int b = 0; b < n; ++b)
    for (int ch = 0; ch < c; ++ch) {
      double s = 0;
      for (int p = 0; p < hw; ++p) s += x[(size_t(b) * hw + p) * c + ch];
      EXPECT_NEAR(y[size_t(b) * c + ch], s / hw, 1e-6);
    }
  ASSERT_TRUE(ops->GlobalAvgPoolBackward(n, hw, c, DType::kFloat32, r.data(), dx.data()).ok());
  auto loss = [&] {
    EXPECT_TRUE(ops->GlobalAvgPoolForward(n, hw, c, DType::kFloat32, x.data(), y.data()).ok());
    return Dot(y, r);
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + 1e-2f;
    const double up = loss();
    x[i] = saved - 1e-2f;
    const double down = loss();
    x[i] = saved;
    EXPECT_NEAR(dx[i], (up - down) / 2e-2, 1e-4) << i;
  }
  // The residual join: relu(main + shortcut); without relu, a plain sum.
  std::vector<float> a = Randn(40, 14), b = Randn(40, 15), sum = a, joined = a;
  ASSERT_TRUE(ops->AddAct(sum.data(), b.data(), a.size(), false, DType::kFloat32).ok());
  ASSERT_TRUE(ops->AddAct(joined.data(), b.data(), a.size(), true, DType::kFloat32).ok());
  int clipped = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(joined[i], std::max(0.0f, a[i] + b[i]));
    clipped += a[i] + b[i] < 0;
  }
  EXPECT_GT(clipped, 0);
}

// --- every CUDA version against its CPU twin -----------------------------------

class ResnetCudaVsCpu : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    auto g = MakeCudaOps(0);
    if (!g.ok()) GPUFEED_GPU_UNAVAILABLE("no GPU here (" << g.status().ToString() << ")");
    gpu = std::move(*g);
  }
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
  double Tol() const { return GetParam() == DType::kFloat32 ? 2e-5 : GetParam() == DType::kFloat16 ? 4e-3 : 2e-2; }
  void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rel, const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0;
    for (float w : want) scale = std::max(scale, double(std::fabs(w)));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::fabs(got[i] - want[i]) > rel * (std::fabs(want[i]) + 0.05 * scale) + 1e-6)
        if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << got[i] << " cpu " << want[i];
    EXPECT_EQ(bad, 0) << what;
  }
  std::unique_ptr<Ops> cpu = MakeCpuOps();
  std::unique_ptr<Ops> gpu;
  std::vector<void*> owned;
};

// cuDNN with stride and padding against the CPU's im2col, the three shapes.
TEST_P(ResnetCudaVsCpu, StridedConvolutions) {
  const DType dt = GetParam();
  for (const ConvShape& s : ResnetConvShapes(dt)) {
    const std::string tag = "r=" + std::to_string(s.r) + " ";
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
    ASSERT_TRUE(gpu->ConvForward(s, xg, wg, yg).ok()) << tag;
    ASSERT_TRUE(gpu->ConvBackwardData(s, dyg, wg, dxg).ok()) << tag;
    ASSERT_TRUE(gpu->ConvBackwardFilter(s, xg, dyg, static_cast<float*>(dwg), 1.0f).ok()) << tag;
    ExpectClose(Decode(Host(yg, y.size()).data(), s.y_elems(), dt), Decode(y.data(), s.y_elems(), dt), 4 * Tol(),
                tag + "conv forward");
    ExpectClose(Decode(Host(dxg, dx.size()).data(), s.x_elems(), dt), Decode(dx.data(), s.x_elems(), dt), 4 * Tol(),
                tag + "conv backward data");
    ExpectClose(Decode(Host(dwg, dw.size() * 4).data(), s.w_elems(), DType::kFloat32), dw, 4 * Tol(),
                tag + "conv backward filter");
  }
}

TEST_P(ResnetCudaVsCpu, BatchNormWithoutRelu) {
  const DType dt = GetParam();
  const int n = 3, h = 5, w = 5, c = 40;
  const size_t rows = size_t(n) * h * w, e = rows * c;
  auto x = Encode(Randn(e, 11, 2.0f), dt), dy = Encode(Randn(e, 12), dt);
  auto gamma = Randn(c, 13), beta = Randn(c, 14);
  std::vector<float> rm(c, 0.1f), rv(c, 2.0f), sm(c), si(c), dg(c, 1.0f), dbt(c, 1.0f);
  std::vector<uint8_t> y(e * DTypeSize(dt)), dx(e * DTypeSize(dt));
  BnArgs a{rows, c, dt};
  a.relu = false;
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
  auto fl = [&](float* p) { return Decode(Host(p, c * 4).data(), c, DType::kFloat32); };
  ExpectClose(Decode(Host(yg, y.size()).data(), e, dt), Decode(y.data(), e, dt), 2 * Tol(), "bn forward");
  ExpectClose(Decode(Host(dxg, dx.size()).data(), e, dt), Decode(dx.data(), e, dt), 4 * Tol() + 1e-4, "bn backward");
  ExpectClose(fl(f[6]), dg, 1e-3, "dgamma");
  ExpectClose(fl(f[7]), dbt, 1e-3, "dbeta");
}

// Selection, gathers and elementwise sums in the same order: bit for bit.
TEST_P(ResnetCudaVsCpu, StemPoolGlobalPoolAndResidualAddAreBitExact) {
  const DType dt = GetParam();
  const int n = 3, h = 9, w = 8, c = 37, oh = 5, ow = 4;
  const size_t e = size_t(n) * h * w * c, pe = size_t(n) * oh * ow * c;
  auto x = Encode(Randn(e, 16), dt), dyp = Encode(Randn(pe, 17), dt);
  std::vector<uint8_t> py(pe * DTypeSize(dt)), pdx(e * DTypeSize(dt)), am(pe);
  ASSERT_TRUE(cpu->MaxPool3x3Forward(n, h, w, c, dt, x.data(), py.data(), am.data()).ok());
  ASSERT_TRUE(cpu->MaxPool3x3Backward(n, h, w, c, dt, dyp.data(), am.data(), pdx.data()).ok());
  void *xg = Dev(x.data(), x.size()), *dypg = Dev(dyp.data(), dyp.size());
  void *pyg = Dev(nullptr, py.size()), *pdxg = Dev(nullptr, pdx.size());
  auto* amg = static_cast<uint8_t*>(Dev(nullptr, pe));
  ASSERT_TRUE(gpu->MaxPool3x3Forward(n, h, w, c, dt, xg, pyg, amg).ok());
  ASSERT_TRUE(gpu->MaxPool3x3Backward(n, h, w, c, dt, dypg, amg, pdxg).ok());
  EXPECT_EQ(Host(pyg, py.size()), py) << "3x3/2 pool forward";
  EXPECT_EQ(Host(amg, pe), am) << "3x3/2 pool argmax";
  EXPECT_EQ(Host(pdxg, pdx.size()), pdx) << "3x3/2 pool backward";
  const int hw = h * w;
  const size_t ge = size_t(n) * c;
  auto dyg0 = Encode(Randn(ge, 18), dt);
  std::vector<uint8_t> gy(ge * DTypeSize(dt)), gdx(e * DTypeSize(dt));
  ASSERT_TRUE(cpu->GlobalAvgPoolForward(n, hw, c, dt, x.data(), gy.data()).ok());
  ASSERT_TRUE(cpu->GlobalAvgPoolBackward(n, hw, c, dt, dyg0.data(), gdx.data()).ok());
  void *gyg = Dev(nullptr, gy.size()), *gdxg = Dev(nullptr, gdx.size()), *gdyg = Dev(dyg0.data(), dyg0.size());
  ASSERT_TRUE(gpu->GlobalAvgPoolForward(n, hw, c, dt, xg, gyg).ok());
  ASSERT_TRUE(gpu->GlobalAvgPoolBackward(n, hw, c, dt, gdyg, gdxg).ok());
  EXPECT_EQ(Host(gyg, gy.size()), gy) << "global average pool";
  EXPECT_EQ(Host(gdxg, gdx.size()), gdx) << "global average pool backward";
  auto b = Encode(Randn(e, 19), dt);
  for (bool relu : {false, true}) {
    std::vector<uint8_t> yc = x;
    ASSERT_TRUE(cpu->AddAct(yc.data(), b.data(), e, relu, dt).ok());
    void* yg = Dev(x.data(), x.size());
    ASSERT_TRUE(gpu->AddAct(yg, Dev(b.data(), b.size()), e, relu, dt).ok());
    EXPECT_EQ(Host(yg, yc.size()), yc) << "residual add, relu " << relu;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ResnetCudaVsCpu, ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace gpufeed::trainer
