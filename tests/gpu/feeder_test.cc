// GpuFeeder on index-valued data: the bytes that reach the device are the
// loader's, echo passes are permutations of their upload, slots in use are
// never overwritten, errors surface. Runs on the CPU twins everywhere and, on
// a machine with a GPU, once more on the GPU.
#include "gpufeed/gpu_feed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "gpufeed/convert.h"
#include "gpufeed/dataset.h"
#include "tests/testing/sources.h"
#include "tests/testing/gpu_required.h"

namespace gpufeed {
namespace {

using testing::InMemorySource;

// [C=2, H=4, W=4] uint8 samples: 32 bytes, the first 8 of which are the index.
constexpr uint64_t kSampleBytes = 2 * 4 * 4;

class TensorSource : public InMemorySource {
 public:
  TensorSource(uint64_t n, uint64_t k) : InMemorySource(n, kSampleBytes, k), shape_{2, 4, 4} {}
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }

 private:
  std::vector<uint64_t> shape_;
};

LoaderOptions LoaderOpts() {
  LoaderOptions o;
  o.batch_size = 8;
  o.order = Order::kRandom;
  o.seed = 3;
  o.threads = 2;
  o.prefetch = 6;
  o.pin_memory = true;
  return o;
}

// Recovers the sample index from fp32 output made with mean 0, std 1 and no
// augmentation: the first 8 values are the index's bytes.
int64_t IndexOf(const float* sample) {
  uint64_t idx = 0;
  for (int b = 0; b < 8; ++b) idx |= uint64_t(uint8_t(sample[b])) << (8 * b);
  return static_cast<int64_t>(idx);
}

class FeederTest : public ::testing::TestWithParam<bool> {  // param: use the GPU
 protected:
  void SetUp() override {
    if (GetParam()) {
      TensorSource probe(8, 4);
      Loader l(probe, LoaderOpts());
      GpuFeeder f(l, {});
      if (!f.on_gpu()) GPUFEED_GPU_UNAVAILABLE("the feeder runs on its CPU twins (no GPU, or its start failed)");
    }
  }
  FeedOptions Opts() {
    FeedOptions f;
    f.mean = {0, 0};
    f.stddev = {1, 1};
    f.force_cpu = !GetParam();
    return f;
  }
};

TEST_P(FeederTest, DeliversExactlyTheLoadersBytes) {
  TensorSource src(203, 10);
  Loader loader(src, LoaderOpts());
  GpuFeeder feeder(loader, Opts(), 2);
  std::set<int64_t> seen;
  std::vector<float> img(8 * kSampleBytes);
  std::vector<int64_t> lab(8);
  for (;;) {
    auto b = feeder.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), lab.data()).ok());
    for (int i = 0; i < (*b)->size(); ++i) {
      const int64_t idx = IndexOf(&img[i * kSampleBytes]);
      ASSERT_TRUE(seen.insert(idx).second) << "sample " << idx << " twice";
      std::vector<std::byte> want(kSampleBytes);
      testing::FillIndexSamples(idx, 1, kSampleBytes, want);
      for (uint64_t k = 0; k < kSampleBytes; ++k) ASSERT_EQ(img[i * kSampleBytes + k], float(uint8_t(want[k])));
      EXPECT_EQ(lab[i], testing::IndexLabel(idx));
    }
  }
  EXPECT_EQ(seen.size(), 203u);
  const FeedStats st = feeder.stats();
  EXPECT_EQ(st.fresh_samples, 203u);
  EXPECT_EQ(st.echoed_samples, 0u);
  EXPECT_EQ(st.on_gpu, GetParam());
}

TEST_P(FeederTest, EchoPassesArePermutationsOfTheirUpload) {
  TensorSource src(160, 10);
  Loader loader(src, LoaderOpts());
  FeedOptions o = Opts();
  o.echo = 3;
  o.super_batch = 2;  // uploads of 16 samples, 2 batches a pass
  GpuFeeder feeder(loader, o);
  std::map<int, std::vector<int64_t>> by_pass;  // for the current upload
  std::vector<float> img(8 * kSampleBytes);
  uint64_t batches = 0, uploads = 0;
  auto check_upload = [&] {
    ASSERT_EQ(by_pass.size(), 3u);
    std::multiset<int64_t> fresh(by_pass[0].begin(), by_pass[0].end());
    for (int p = 1; p < 3; ++p) {
      EXPECT_EQ(std::multiset<int64_t>(by_pass[p].begin(), by_pass[p].end()), fresh) << "pass " << p;
      EXPECT_NE(by_pass[p], by_pass[0]) << "pass " << p << " not reshuffled";
    }
    EXPECT_NE(by_pass[1], by_pass[2]);
    by_pass.clear();
    ++uploads;
  };
  for (;;) {
    auto b = feeder.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    if ((*b)->pass() == 0 && by_pass.count(2)) check_upload();
    ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), nullptr).ok());
    ASSERT_EQ((*b)->indices().size(), static_cast<size_t>((*b)->size()));
    for (int i = 0; i < (*b)->size(); ++i) {
      by_pass[(*b)->pass()].push_back(IndexOf(&img[i * kSampleBytes]));
      // indices() names the sample each row holds, through the echo gather.
      EXPECT_EQ(static_cast<int64_t>((*b)->indices()[static_cast<size_t>(i)]), by_pass[(*b)->pass()].back());
    }
    ++batches;
  }
  check_upload();
  EXPECT_EQ(uploads, 10u);
  EXPECT_EQ(batches, 60u);
  const FeedStats st = feeder.stats();
  EXPECT_EQ(st.fresh_samples, 160u);
  EXPECT_EQ(st.echoed_samples, 320u);
}

TEST_P(FeederTest, SlotsInUseAreNeverOverwritten) {
  TensorSource src(400, 10);
  Loader loader(src, LoaderOpts());
  FeedOptions o = Opts();
  o.slots = 3;
  GpuFeeder feeder(loader, o);
  std::vector<float> first(8 * kSampleBytes), again(8 * kSampleBytes);
  auto held = feeder.Next();
  ASSERT_TRUE(held.ok() && *held);
  ASSERT_TRUE(feeder.CopyToHost(**held, first.data(), nullptr).ok());
  // Churn through many batches with the other two slots while holding one.
  for (int i = 0; i < 30; ++i) {
    auto b = feeder.Next();
    ASSERT_TRUE(b.ok() && *b) << i;
  }
  ASSERT_TRUE(feeder.CopyToHost(**held, again.data(), nullptr).ok());
  EXPECT_EQ(first, again) << "a held slot was overwritten";
  // Holding every slot is an error, not a hang or a silent overwrite.
  auto b1 = feeder.Next();
  auto b2 = feeder.Next();
  ASSERT_TRUE(b1.ok() && b2.ok());
  auto b3 = feeder.Next();
  ASSERT_FALSE(b3.ok());
  EXPECT_EQ(b3.status().code(), StatusCode::kInvalidArgument);
}

// The refusal for held slots ends nothing: once the consumer frees a batch,
// the next one is the batch that was refused, and the epoch goes on to its
// end with every sample once (it used to end the stream: the next call got
// the epoch's end). JAX's asynchronous steps free their batches late and
// gpufeed.jax asks again.
TEST_P(FeederTest, RefusalForHeldSlotsLosesNoBatch) {
  TensorSource src(200, 10);
  LoaderOptions lo = LoaderOpts();
  lo.order = Order::kSequential;
  Loader loader(src, lo);
  FeedOptions o = Opts();
  o.slots = 2;
  GpuFeeder feeder(loader, o);
  std::vector<float> img(8 * kSampleBytes);
  std::vector<int64_t> seen;
  auto take = [&](const DeviceBatch& b) {
    ASSERT_TRUE(feeder.CopyToHost(b, img.data(), nullptr).ok());
    for (int i = 0; i < b.size(); ++i) seen.push_back(IndexOf(&img[static_cast<size_t>(i) * kSampleBytes]));
  };
  auto b1 = feeder.Next();
  auto b2 = feeder.Next();
  ASSERT_TRUE(b1.ok() && *b1 && b2.ok() && *b2);
  take(**b1);
  take(**b2);
  auto refused = feeder.Next();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("slots"), std::string::npos) << refused.status().ToString();
  b1->reset();  // the consumer frees a batch and asks again
  for (;;) {
    auto b = feeder.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    take(**b);
  }
  std::vector<int64_t> want(200);
  for (int64_t i = 0; i < 200; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(seen, want);
}

// One thread feeding two GPUs (gpufeed.jax: a feed per device of a mesh):
// making the second feeder left its device current, and the first one's
// transform must still be queued on its own device. Every sample once on each.
TEST_P(FeederTest, OneThreadFeedsTwoDevices) {
  if (!GetParam()) GTEST_SKIP() << "a GPU case";
  TensorSource src_a(160, 10), src_b(160, 10);
  Loader la(src_a, LoaderOpts()), lb(src_b, LoaderOpts());
  FeedOptions oa = Opts(), ob = Opts();
  ob.device = 1;
  GpuFeeder a(la, oa);
  GpuFeeder b(lb, ob);
  if (!b.on_gpu()) GTEST_SKIP() << "needs a second GPU";
  std::vector<float> img(8 * kSampleBytes);
  std::vector<int> seen_a(160), seen_b(160);
  for (;;) {
    auto x = a.Next();
    auto y = b.Next();
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    ASSERT_TRUE(y.ok()) << y.status().ToString();
    ASSERT_EQ(x->has_value(), y->has_value());
    if (!*x) break;
    for (auto [feeder, batch, seen] : {std::tuple{&a, &**x, &seen_a}, std::tuple{&b, &**y, &seen_b}}) {
      ASSERT_TRUE(feeder->CopyToHost(*batch, img.data(), nullptr).ok());
      for (int i = 0; i < batch->size(); ++i) ++seen->at(IndexOf(&img[static_cast<size_t>(i) * kSampleBytes]));
    }
  }
  EXPECT_EQ(seen_a, std::vector<int>(160, 1));
  EXPECT_EQ(seen_b, std::vector<int>(160, 1));
}

TEST_P(FeederTest, LoaderErrorsSurface) {
  TensorSource src(200, 10);
  src.set_fail_chunk(12);
  LoaderOptions lo = LoaderOpts();
  lo.order = Order::kSequential;
  Loader loader(src, lo);
  GpuFeeder feeder(loader, Opts());
  Status err;
  int good = 0;
  for (;;) {
    auto b = feeder.Next();
    if (!b.ok()) {
      err = b.status();
      break;
    }
    ASSERT_TRUE(b->has_value()) << "ended without the error";
    ++good;
  }
  EXPECT_EQ(err.code(), StatusCode::kCorrupt);
  EXPECT_NE(err.message().find("chunk 12"), std::string::npos) << err.ToString();
  auto after = feeder.Next();
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
}

TEST_P(FeederTest, BadShapesAndOptionsAreRefused) {
  InMemorySource flat(50, 32, 10);  // rank-1 samples
  Loader loader(flat, LoaderOpts());
  GpuFeeder feeder(loader, Opts());
  auto b = feeder.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);

  TensorSource src(50, 10);
  Loader loader2(src, LoaderOpts());
  FeedOptions o = Opts();
  o.stddev = {1, 0};
  GpuFeeder bad(loader2, o);
  EXPECT_EQ(bad.Next().status().code(), StatusCode::kInvalidArgument);
}

// The feeder holds up to 2 x super_batch loader batches; a loader pool
// smaller than that is refused at the start with the option to raise (it
// was a hang: `bench feed --super-batch 5` with the default prefetch 8).
TEST_P(FeederTest, SuperBatchLargerThanThePoolIsRefusedNotAHang) {
  TensorSource src(400, 10);
  LoaderOptions lo = LoaderOpts();
  lo.prefetch = 8;  // pool of 9
  Loader loader(src, lo);
  FeedOptions o = Opts();
  o.super_batch = 5;
  GpuFeeder feeder(loader, o);
  auto b = feeder.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("prefetch to at least 9"), std::string::npos) << b.status().ToString();

  lo.prefetch = 9;  // pool of 10: works
  Loader enough(src, lo);
  GpuFeeder ok(enough, o);
  uint64_t samples = 0;
  for (;;) {
    auto r = ok.Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->has_value()) break;
    samples += static_cast<uint64_t>((*r)->size());
  }
  EXPECT_EQ(samples, 400u);
}

TEST_P(FeederTest, MeanAndStdDefaultToTheDatasetsAttributes) {
  // A converted file carries per-channel mean/std; the feeder uses them.
  const std::string dir = testing::MakeTempDir("feed_attrs");
  const uint64_t n = 40;
  std::vector<std::byte> data(n * kSampleBytes);
  for (uint64_t k = 0; k < n; ++k)
    for (uint64_t q = 0; q < kSampleBytes; ++q) data[k * kSampleBytes + q] = std::byte(q < 16 ? 10 : 30);
  ASSERT_TRUE(testing::WriteH5(dir + "/in.h5", {n, 2, 4, 4}, H5T_NATIVE_UINT8, data, {.chunk = {8, 2, 4, 4}}));
  auto src = OpenHdf5Source(dir + "/in.h5", "");
  ASSERT_TRUE(src.ok());
  ConvertOptions co;
  co.write.layout = "NCHW";                               // [2, 4, 4] is too ambiguous to guess
  ASSERT_TRUE(Convert(**src, dir + "/out.h5", co).ok());  // channel 0 all 10, channel 1 all 30
  auto ds = Dataset::Open(dir + "/out.h5");
  ASSERT_TRUE(ds.ok());
  ASSERT_EQ(ds->info().mean, (std::vector<double>{10, 30}));
  Loader loader(*ds, LoaderOpts());
  FeedOptions o;
  o.force_cpu = !GetParam();
  GpuFeeder feeder(loader, o);
  auto b = feeder.Next();
  ASSERT_TRUE(b.ok() && *b) << b.status().ToString();
  std::vector<float> img((*b)->size() * kSampleBytes);
  ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), nullptr).ok());
  for (float v : img) EXPECT_EQ(v, 0.0f);  // (x - mean) / std with std 0 treated as 1
}

// A feeder started at loader batch k yields exactly the output batches an
// uninterrupted one yields from there: same samples, same crops and flips,
// same echo permutations (what resuming mid-epoch through the C API needs).
TEST_P(FeederTest, ResumeAtStartBatchContinuesTheSameOutputs) {
  TensorSource src(203, 10);
  FeedOptions o = Opts();
  o.echo = 2;
  o.super_batch = 2;
  o.crop_padding = 1;
  o.flip = true;
  o.seed = 11;
  auto run = [&](uint64_t start) {
    Loader loader(src, LoaderOpts());
    GpuFeeder feeder(loader, o, 3, start);
    std::vector<std::vector<float>> out;
    std::vector<float> img(8 * kSampleBytes);
    for (;;) {
      auto b = feeder.Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok() || !*b) break;
      EXPECT_TRUE(feeder.CopyToHost(**b, img.data(), nullptr).ok());
      out.emplace_back(img.begin(), img.begin() + (*b)->size() * kSampleBytes);
    }
    return out;
  };
  const auto full = run(0);
  const auto resumed = run(4);  // after 2 uploads of 2 batches, each used twice: 8 outputs
  ASSERT_EQ(full.size(), resumed.size() + 8);
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], full[i + 8]) << "output batch " << i + 8;

  Loader loader(src, LoaderOpts());
  GpuFeeder odd(loader, o, 3, 3);  // not a whole upload
  auto b = odd.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("super_batch"), std::string::npos) << b.status().ToString();
}

// float32 [2, 4, 4] samples: element e of sample k is k * 100 + e - 50.5.
class Float32Source : public InMemorySource {
 public:
  Float32Source(uint64_t n, uint64_t k) : InMemorySource(n, 32 * 4, k), n_(n), k_(k), shape_{2, 4, 4} {}
  DType dtype() const override { return DType::kFloat32; }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  static float Value(uint64_t k, int e) { return float(k) * 100.0f + float(e) - 50.5f; }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    for (uint64_t s = 0; s < std::min(k_, n_ - i * k_); ++s) {
      for (int e = 0; e < 32; ++e) {
        const float v = Value(i * k_ + s, e);
        std::memcpy(dst.data() + (s * 32 + e) * 4, &v, 4);
      }
    }
    return Status::Ok();
  }

 private:
  uint64_t n_, k_;
  std::vector<uint64_t> shape_;
};

// Restart: the same feeder, the next epoch (or a resumed one), delivers
// what a new feeder would, batch for batch and label for label, whether the
// last epoch ended or was left half way, and a batch of the last epoch the
// consumer still holds keeps its bytes.
TEST_P(FeederTest, RestartDeliversWhatANewFeederWould) {
  TensorSource src(203, 10);
  FeedOptions o = Opts();
  o.echo = 2;
  o.super_batch = 2;
  o.crop_padding = 1;
  o.flip = true;
  o.seed = 11;
  using Outputs = std::vector<std::pair<std::vector<float>, std::vector<int64_t>>>;
  auto drain = [&](GpuFeeder& feeder, size_t at_most) {
    Outputs out;
    std::vector<float> img(8 * kSampleBytes);
    std::vector<int64_t> labels(8);
    while (out.size() < at_most) {
      auto b = feeder.Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok() || !*b) break;
      EXPECT_TRUE(feeder.CopyToHost(**b, img.data(), labels.data()).ok());
      out.emplace_back(std::vector<float>(img.begin(), img.begin() + (*b)->size() * kSampleBytes),
                       std::vector<int64_t>(labels.begin(), labels.begin() + (*b)->size()));
    }
    return out;
  };
  auto fresh = [&](uint64_t epoch, uint64_t start) {
    Loader loader(src, LoaderOpts());
    GpuFeeder feeder(loader, o, epoch, start);
    return drain(feeder, SIZE_MAX);
  };
  Loader loader(src, LoaderOpts());
  GpuFeeder feeder(loader, o, 3);
  const Outputs first = drain(feeder, SIZE_MAX);
  EXPECT_EQ(first, fresh(3, 0));
  // Epoch 4 after a whole epoch 3.
  ASSERT_TRUE(feeder.Restart(4).ok());
  const Outputs second = drain(feeder, 5);  // left half way
  const Outputs want4 = fresh(4, 0);
  ASSERT_GE(want4.size(), 5u);
  EXPECT_EQ(second, Outputs(want4.begin(), want4.begin() + 5));
  EXPECT_GT(feeder.stats().fresh_batches, 0u);
  // Epoch 5 after a half epoch, with a batch of epoch 4 still held.
  auto held = feeder.Next();
  ASSERT_TRUE(held.ok() && *held);
  std::vector<float> held_img(8 * kSampleBytes);
  ASSERT_TRUE(feeder.CopyToHost(**held, held_img.data(), nullptr).ok());
  ASSERT_TRUE(feeder.Restart(5).ok());
  EXPECT_EQ(feeder.stats().fresh_batches, 0u);  // the epoch's own
  EXPECT_EQ(drain(feeder, SIZE_MAX), fresh(5, 0));
  std::vector<float> again(8 * kSampleBytes);
  ASSERT_TRUE(feeder.CopyToHost(**held, again.data(), nullptr).ok());
  EXPECT_EQ(again, held_img);
  held->reset();
  // A resumed epoch, as the constructor's start_batch.
  ASSERT_TRUE(feeder.Restart(3, 4).ok());
  EXPECT_EQ(drain(feeder, SIZE_MAX), fresh(3, 4));
  EXPECT_FALSE(feeder.Restart(3, 3).ok());  // not a whole upload
  auto b = feeder.Next();
  EXPECT_FALSE(b.ok());
}

TEST_P(FeederTest, Float32SamplesAreNormalizedAsStored) {
  Float32Source src(37, 5);
  Loader loader(src, LoaderOpts());
  FeedOptions o = Opts();
  o.mean.clear();  // defaults for float input: mean 0, std 1 (not 255)
  o.stddev.clear();
  GpuFeeder feeder(loader, o);
  std::vector<float> img(8 * 32);
  std::vector<int64_t> lab(8);
  uint64_t seen = 0;
  for (;;) {
    auto b = feeder.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), lab.data()).ok());
    for (int i = 0; i < (*b)->size(); ++i) {
      const uint64_t k = uint64_t((img[i * 32] + 50.5f) / 100.0f + 0.5f);
      for (int e = 0; e < 32; ++e) ASSERT_EQ(img[i * 32 + e], Float32Source::Value(k, e)) << k << " " << e;
      EXPECT_EQ(lab[i], testing::IndexLabel(k));
      ++seen;
    }
  }
  EXPECT_EQ(seen, 37u);
}

// A source of any named fields whose every value encodes its sample: field
// j of sample k is Value(k, j) (bytes), stored planar in each chunk as the
// loader's named-field sources store them (field j at chunk_samples x offset).
class FieldsSource : public InMemorySource {
 public:
  using ValueFn = std::function<std::vector<std::byte>(uint64_t k, size_t j)>;
  FieldsSource(uint64_t n, uint64_t k, std::vector<FieldInfo> fields, ValueFn value)
      : InMemorySource(n, Total(fields), k), n_(n), k_(k), fields_(std::move(fields)), value_(std::move(value)) {
    uint64_t off = 0;
    for (FieldInfo& f : fields_) {
      f.offset = off;
      off += f.sample_bytes;
    }
    shape_ = {off};
  }
  const std::vector<uint64_t>& sample_shape() const override { return shape_; }
  std::vector<FieldInfo> fields() const override { return fields_; }
  Status ReadChunk(uint64_t i, std::span<std::byte> dst) const override {
    const uint64_t n = std::min(k_, n_ - i * k_);
    for (uint64_t s = 0; s < n; ++s) {
      for (size_t j = 0; j < fields_.size(); ++j) {
        const auto v = value_(i * k_ + s, j);
        std::memcpy(dst.data() + k_ * fields_[j].offset + s * fields_[j].sample_bytes, v.data(), v.size());
      }
    }
    return Status::Ok();
  }

 private:
  static uint64_t Total(const std::vector<FieldInfo>& f) {
    uint64_t t = 0;
    for (const auto& x : f) t += x.sample_bytes;
    return t;
  }
  uint64_t n_, k_;
  std::vector<FieldInfo> fields_;
  ValueFn value_;
  std::vector<uint64_t> shape_;
};

FieldInfo Field(const char* name, DType t, std::vector<uint64_t> shape) {
  FieldInfo f;
  f.name = name;
  f.dtype = t;
  f.sample_shape = shape;
  f.sample_bytes = DTypeSize(t);
  for (uint64_t d : shape) f.sample_bytes *= d;
  return f;
}

template <typename T>
std::vector<std::byte> Bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Two named fields: "image" float32 [1, H, W] and "mask" int32 [H, W], both
// pixel (y, x) of sample k = k * 10000 + y * 100 + x + 1, so the feed's image
// and mask outputs must be equal element for element whatever crop and flip
// they got.
struct ImageMask {
  static constexpr int kH = 6, kW = 7;
  static int32_t Pixel(uint64_t k, int y, int x) { return int32_t(k * 10000 + y * 100 + x + 1); }
  static std::vector<int32_t> Pixels(uint64_t k) {
    std::vector<int32_t> m(kH * kW);
    for (int e = 0; e < kH * kW; ++e) m[e] = Pixel(k, e / kW, e % kW);
    return m;
  }
  static FieldsSource Make(uint64_t n, uint64_t k) {
    return FieldsSource(n, k, {Field("image", DType::kFloat32, {1, kH, kW}), Field("mask", DType::kInt32, {kH, kW})},
                        [](uint64_t s, size_t j) {
                          const auto m = Pixels(s);
                          return j == 0 ? Bytes(std::vector<float>(m.begin(), m.end())) : Bytes(m);
                        });
  }
};

TEST_P(FeederTest, MaskFieldGetsTheImagesCropAndFlip) {
  constexpr int H = ImageMask::kH, W = ImageMask::kW;
  FieldsSource src = ImageMask::Make(29, 4);
  Loader loader(src, LoaderOpts());
  FeedOptions o = Opts();
  o.mean = {0};
  o.stddev = {1};
  o.crop_padding = 2;
  o.flip = true;
  o.echo = 2;
  o.labels_int32 = true;
  o.mask_fill = 0;  // the image's zero padding
  GpuFeeder feeder(loader, o);
  std::vector<float> img(8 * H * W);
  std::vector<int32_t> mask(8 * H * W);
  std::set<int64_t> fresh;
  int moved = 0;
  for (;;) {
    auto b = feeder.Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!*b) break;
    ASSERT_NE((*b)->mask(), nullptr);
    ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), nullptr).ok());
    ASSERT_TRUE(feeder.CopyMaskToHost(**b, mask.data()).ok());
    for (int e = 0; e < (*b)->size() * H * W; ++e) {
      ASSERT_EQ(int32_t(img[e]), mask[e]) << "element " << e << " of batch " << (*b)->index();
      const int y = (e / W) % H, x = e % W;
      if (mask[e] != 0 && mask[e] % 10000 != y * 100 + x + 1) ++moved;
    }
    if (!(*b)->echoed()) {
      for (int i = 0; i < (*b)->size(); ++i) {
        // Some pixel of the sample survives any crop of padding 2 in 6 x 7.
        int32_t any = 0;
        for (int e = 0; e < H * W && any == 0; ++e) any = mask[i * H * W + e];
        ASSERT_NE(any, 0);
        EXPECT_TRUE(fresh.insert(any / 10000).second) << "sample " << any / 10000 << " twice";
      }
    }
  }
  EXPECT_EQ(fresh.size(), 29u);
  EXPECT_GT(moved, 0) << "nothing was cropped or flipped: the test checks nothing";
}

// Two named fields: "image" float32 [1, H, W] whose every pixel of sample k
// is k + 1, and "class" uint16 (one a sample) = 3k + 7: the class field
// travels as the labels, through the same echo gather, as int32 or int64.
struct ImageClass {
  static constexpr int kH = 4, kW = 5;
  static uint16_t Class(uint64_t k) { return static_cast<uint16_t>(3 * k + 7); }
  static FieldsSource Make(uint64_t n, uint64_t k) {
    return FieldsSource(n, k, {Field("image", DType::kFloat32, {1, kH, kW}), Field("class", DType::kUInt16, {})},
                        [](uint64_t s, size_t j) {
                          return j == 0 ? Bytes(std::vector<float>(kH * kW, float(s + 1)))
                                        : Bytes(std::vector<uint16_t>{Class(s)});
                        });
  }
};

TEST_P(FeederTest, ClassFieldTravelsAsTheLabels) {
  constexpr int H = ImageClass::kH, W = ImageClass::kW;
  for (bool int32 : {true, false}) {
    FieldsSource src = ImageClass::Make(23, 4);
    Loader loader(src, LoaderOpts());
    FeedOptions o = Opts();
    o.mean = {0};
    o.stddev = {1};
    o.echo = 2;
    o.flip = true;
    o.labels_int32 = int32;
    GpuFeeder feeder(loader, o);
    std::vector<float> img(8 * H * W);
    std::vector<int64_t> lab64(8);
    std::vector<int32_t> lab32(8);
    std::set<uint64_t> fresh;
    uint64_t rows = 0;
    for (;;) {
      auto b = feeder.Next();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      if (!*b) break;
      EXPECT_EQ((*b)->mask(), nullptr);
      ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), int32 ? static_cast<void*>(lab32.data()) : lab64.data()).ok());
      for (int i = 0; i < (*b)->size(); ++i) {
        const uint64_t k = uint64_t(img[i * H * W] + 0.5f) - 1;
        const int64_t got = int32 ? lab32[i] : lab64[i];
        ASSERT_EQ(got, ImageClass::Class(k)) << "row " << i << " of batch " << (*b)->index();
        if (!(*b)->echoed()) {
          EXPECT_TRUE(fresh.insert(k).second) << "sample " << k << " twice";
        }
        ++rows;
      }
    }
    EXPECT_EQ(fresh.size(), 23u);
    EXPECT_EQ(rows, 46u);  // every sample, then its echo
  }
}

// Five fields, the way a scientific sample has them: an image, a class, a
// mask of its pixels, four float targets and a second integer (an id). With
// crop, flip and echo, each arrives as documented and row i of every array
// is the same dataset sample.
TEST_P(FeederTest, EveryLaterFieldTravelsWithItsSample) {
  constexpr int H = ImageMask::kH, W = ImageMask::kW;
  auto target = [](uint64_t k, int t) {
    return t == 0 ? float(k) : t == 1 ? k + 0.25f : t == 2 ? -float(k) : 1.0f / (k + 1);
  };
  FieldsSource src(
      27, 4,
      {Field("image", DType::kFloat32, {1, H, W}), Field("class", DType::kUInt16, {}),
       Field("mask", DType::kInt32, {H, W}), Field("target", DType::kFloat32, {4}), Field("id", DType::kInt64, {1})},
      [&](uint64_t k, size_t j) {
        const std::vector<int32_t> m = ImageMask::Pixels(k);
        switch (j) {
          case 0:
            return Bytes(std::vector<float>(m.begin(), m.end()));
          case 1:
            return Bytes(std::vector<uint16_t>{ImageClass::Class(k)});
          case 2:
            return Bytes(m);
          case 3:
            return Bytes(std::vector<float>{target(k, 0), target(k, 1), target(k, 2), target(k, 3)});
          default:
            return Bytes(std::vector<int64_t>{int64_t(1000 + k)});
        }
      });
  Loader loader(src, LoaderOpts());
  FeedOptions o = Opts();
  o.mean = {0};
  o.stddev = {1};
  o.crop_padding = 2;
  o.flip = true;
  o.echo = 2;
  GpuFeeder feeder(loader, o);
  auto first = feeder.Next();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const auto& f = feeder.fields();
  ASSERT_EQ(f.size(), 5u);
  const FeedFieldRole roles[] = {FeedFieldRole::kImage, FeedFieldRole::kClass, FeedFieldRole::kMask,
                                 FeedFieldRole::kPassThrough, FeedFieldRole::kPassThrough};
  const DType dtypes[] = {DType::kFloat32, DType::kInt64, DType::kInt64, DType::kFloat32, DType::kInt64};
  for (size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(f[j].role, roles[j]) << f[j].name;
    EXPECT_EQ(f[j].dtype, dtypes[j]) << f[j].name;
  }
  EXPECT_EQ(f[0].sample_shape, (std::vector<uint64_t>{1, H, W}));
  EXPECT_EQ(f[3].sample_shape, (std::vector<uint64_t>{4}));
  std::vector<float> img(8 * H * W), tgt(8 * 4);
  std::vector<int64_t> lab(8), cls(8), mask(8 * H * W), id(8);
  std::set<uint64_t> fresh;
  uint64_t rows = 0;
  int moved = 0;
  std::optional<DeviceBatch> b = std::move(*first);
  while (b) {
    ASSERT_EQ(b->field(0), b->images());
    ASSERT_EQ(b->field(1), b->labels());
    ASSERT_EQ(b->field(2), b->mask());
    ASSERT_NE(b->field(4), nullptr);
    ASSERT_EQ(b->field(5), nullptr);
    ASSERT_TRUE(feeder.CopyToHost(*b, img.data(), lab.data()).ok());
    ASSERT_TRUE(feeder.CopyFieldToHost(*b, 1, cls.data()).ok());
    ASSERT_TRUE(feeder.CopyFieldToHost(*b, 2, mask.data()).ok());
    ASSERT_TRUE(feeder.CopyFieldToHost(*b, 3, tgt.data()).ok());
    ASSERT_TRUE(feeder.CopyFieldToHost(*b, 4, id.data()).ok());
    for (int i = 0; i < b->size(); ++i) {
      int64_t any = 0;
      for (int e = 0; e < H * W; ++e) {
        ASSERT_EQ(int64_t(img[i * H * W + e]), mask[i * H * W + e]) << "pixel " << e << " of row " << i;
        if (mask[i * H * W + e] != 0) {
          any = mask[i * H * W + e];
          if (any % 10000 != (e / W) * 100 + e % W + 1) ++moved;
        }
      }
      ASSERT_NE(any, 0);  // some pixel survives any crop of padding 2 in 6 x 7
      const uint64_t k = uint64_t(any / 10000);
      EXPECT_EQ(lab[i], int64_t(ImageClass::Class(k))) << "row " << i;
      EXPECT_EQ(cls[i], lab[i]);
      for (int t = 0; t < 4; ++t) EXPECT_EQ(tgt[i * 4 + t], target(k, t)) << "target " << t << " of sample " << k;
      EXPECT_EQ(id[i], int64_t(1000 + k));
      if (!b->echoed()) {
        EXPECT_TRUE(fresh.insert(k).second) << "sample " << k << " twice";
      }
      ++rows;
    }
    auto r = feeder.Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    b = std::move(*r);
  }
  EXPECT_EQ(fresh.size(), 27u);
  EXPECT_EQ(rows, 54u);  // every sample, then its echo
  EXPECT_GT(moved, 0) << "nothing was cropped or flipped: the test checks nothing";
  float none;
  EXPECT_EQ(feeder.CopyFieldToHost(DeviceBatch(), 3, &none).code(), StatusCode::kInvalidArgument);
}

// CosmoFlow's sample: an int16 volume [C, D, H, W] normalized per channel,
// and its float32 targets passed through; in either output layout, echoed.
TEST_P(FeederTest, VolumesAreNormalizedPerChannelAndTheirTargetsTravel) {
  constexpr int C = 2, D = 3, H = 4, W = 5;
  auto voxel = [](uint64_t k, int c, int d, int y, int x) { return int16_t(k * 500 + c * 200 + d * 40 + y * 8 + x); };
  FieldsSource src(19, 3, {Field("x", DType::kInt16, {C, D, H, W}), Field("y", DType::kFloat32, {4})},
                   [&](uint64_t k, size_t j) {
                     if (j == 1) return Bytes(std::vector<float>{float(k), 0.5f, -1.0f, k / 3.0f});
                     std::vector<int16_t> v;
                     for (int c = 0; c < C; ++c)
                       for (int d = 0; d < D; ++d)
                         for (int y = 0; y < H; ++y)
                           for (int x = 0; x < W; ++x) v.push_back(voxel(k, c, d, y, x));
                     return Bytes(v);
                   });
  for (Layout out : {Layout::kNCHW, Layout::kNHWC}) {
    Loader loader(src, LoaderOpts());
    FeedOptions o = Opts();
    o.mean = {10, 20};
    o.stddev = {2, 4};
    o.layout = out;
    o.echo = 2;
    GpuFeeder feeder(loader, o);
    std::vector<float> vol(8 * C * D * H * W), y(8 * 4);
    std::set<uint64_t> fresh;
    for (;;) {
      auto b = feeder.Next();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      if (!*b) break;
      EXPECT_EQ(feeder.fields()[0].sample_shape,
                out == Layout::kNCHW ? (std::vector<uint64_t>{C, D, H, W}) : (std::vector<uint64_t>{D, H, W, C}));
      ASSERT_TRUE(feeder.CopyToHost(**b, vol.data(), nullptr).ok());
      ASSERT_TRUE(feeder.CopyFieldToHost(**b, 1, y.data()).ok());
      for (int i = 0; i < (*b)->size(); ++i) {
        const uint64_t k = uint64_t(y[i * 4]);
        ASSERT_EQ(y[i * 4 + 3], k / 3.0f);
        for (int c = 0; c < C; ++c)
          for (int d = 0; d < D; ++d)
            for (int yy = 0; yy < H; ++yy)
              for (int x = 0; x < W; ++x) {
                const size_t e = out == Layout::kNCHW ? ((size_t(c) * D + d) * H + yy) * W + x
                                                      : ((size_t(d) * H + yy) * W + x) * C + c;
                const float want = (float(voxel(k, c, d, yy, x)) - o.mean[c]) * float(1.0 / o.stddev[c]);
                ASSERT_EQ(vol[i * C * D * H * W + e], want) << "sample " << k << " c " << c << " d " << d;
              }
        if (!(*b)->echoed()) {
          EXPECT_TRUE(fresh.insert(k).second) << "sample " << k << " twice";
        }
      }
    }
    EXPECT_EQ(fresh.size(), 19u);
  }
  // The feed's augmentation is 2-D: a volume with crop or flip is refused.
  Loader loader(src, LoaderOpts());
  FeedOptions o = Opts();
  o.mean = {0, 0};
  o.flip = true;
  GpuFeeder feeder(loader, o);
  auto b = feeder.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("volume samples"), std::string::npos) << b.status().ToString();
  EXPECT_TRUE(feeder.fields().empty());
}

// A float field of the image's pixels is no mask: taken as stored without
// augmentation, refused (naming it) with crop or flip, which would leave it
// unaligned with its image.
TEST(FeederFieldsTest, AFloatMapOfTheImagesPixelsIsRefusedWithAugmentation) {
  FieldsSource src(16, 4, {Field("data", DType::kUInt8, {1, 4, 4}), Field("heat", DType::kFloat32, {4, 4})},
                   [](uint64_t k, size_t j) {
                     return j == 0 ? Bytes(std::vector<uint8_t>(16, uint8_t(k)))
                                   : Bytes(std::vector<float>(16, k + 0.5f));
                   });
  for (bool flip : {false, true}) {
    Loader loader(src, LoaderOpts());
    FeedOptions o;
    o.force_cpu = true;
    o.flip = flip;
    GpuFeeder feeder(loader, o);
    auto b = feeder.Next();
    if (flip) {
      ASSERT_FALSE(b.ok());
      EXPECT_EQ(b.status().code(), StatusCode::kUnsupported);
      EXPECT_NE(b.status().message().find("field 'heat' (float32) has the image's 4 x 4 pixels"), std::string::npos)
          << b.status().ToString();
      continue;
    }
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_EQ(feeder.fields().size(), 2u);
    EXPECT_EQ(feeder.fields()[1].role, FeedFieldRole::kPassThrough);
    std::vector<float> img(8 * 16), heat(8 * 16);
    ASSERT_TRUE(feeder.CopyToHost(**b, img.data(), nullptr).ok());
    ASSERT_TRUE(feeder.CopyFieldToHost(**b, 1, heat.data()).ok());
    for (int i = 0; i < (*b)->size(); ++i) {
      EXPECT_EQ(heat[i * 16 + 15], std::round(img[i * 16] * 255) + 0.5f) << "row " << i;
    }
  }
}

// What a feed cannot take is said without a device and before a stream
// starts (CheckFeedInput, which the C API calls when a loader opens), in the
// words of the device asked for: a uint32 dataset with dtype float32 on the
// CPU was refused at the first batch, seconds later, as "the GPU feed takes".
TEST(FeederFieldsTest, CheckFeedInputRefusesADtypeInTheWordsOfItsDevice) {
  BatchSourceInfo info;
  info.name = "u32.h5:/images";
  info.dtype = DType::kUInt32;
  info.sample_shape = {3, 4, 4};
  info.sample_bytes = 3 * 4 * 4 * 4;
  FeedOptions cpu;
  cpu.force_cpu = true;
  const Status on_cpu = CheckFeedInput(info, cpu);
  EXPECT_EQ(on_cpu.code(), StatusCode::kUnsupported);
  EXPECT_NE(on_cpu.message().find("on the CPU"), std::string::npos) << on_cpu.message();
  EXPECT_NE(on_cpu.message().find("uint32"), std::string::npos) << on_cpu.message();
  EXPECT_EQ(on_cpu.message().find("GPU"), std::string::npos) << on_cpu.message();
  FeedOptions gpu;
  gpu.device = 1;
  const Status on_gpu = CheckFeedInput(info, gpu);
  EXPECT_NE(on_gpu.message().find("the GPU feed (CUDA device 1)"), std::string::npos) << on_gpu.message();
  // What it takes passes, and so does the same check inside the feeder.
  info.dtype = DType::kUInt16;
  info.sample_bytes = 3 * 4 * 4 * 2;
  EXPECT_TRUE(CheckFeedInput(info, cpu).ok());
  info.sample_shape = {16};
  EXPECT_EQ(CheckFeedInput(info, cpu).code(), StatusCode::kInvalidArgument);
}

// NextFor bounds the wait for the loader: a slow loader's first upload
// times out with nothing taken, an interrupt ends a wait from another
// thread, and then every sample arrives once, as through Next().
TEST_P(FeederTest, NextForTimesOutAndIsInterruptedWithoutLosingABatch) {
  TensorSource src(96, 8);
  src.set_delay_ms(400);
  LoaderOptions lo = LoaderOpts();
  lo.threads = 1;
  Loader loader(src, lo);
  GpuFeeder feeder(loader, Opts(), 0);
  auto early = feeder.NextFor(std::chrono::milliseconds(20));
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  EXPECT_EQ(early->wait, WaitResult::kTimeout);
  EXPECT_FALSE(early->batch.has_value());
  std::thread interrupter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    feeder.Interrupt();
  });
  auto cut = feeder.NextFor(std::chrono::seconds(60));
  interrupter.join();
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(cut->wait, WaitResult::kInterrupted);
  src.set_delay_ms(0);
  std::set<int64_t> seen;
  std::vector<float> img(8 * kSampleBytes);
  for (;;) {
    auto b = feeder.NextFor(std::chrono::seconds(30));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_EQ(b->wait, WaitResult::kReady);
    if (!b->batch) break;
    ASSERT_TRUE(feeder.CopyToHost(*b->batch, img.data(), nullptr).ok());
    for (int i = 0; i < b->batch->size(); ++i) {
      ASSERT_TRUE(seen.insert(IndexOf(&img[i * kSampleBytes])).second);
    }
  }
  EXPECT_EQ(seen.size(), 96u);
}

INSTANTIATE_TEST_SUITE_P(CpuAndGpu, FeederTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Gpu" : "Cpu"; });

}  // namespace
}  // namespace gpufeed
