// Per-channel statistics (gpufeed/stats.h): known values in CHW and HWC
// layouts, uint8/int16/float16/float32, over several chunks and files,
// against a plain double-precision computation; NaN/Inf counted apart; the
// attributes and the sidecar that --store writes, and the loader (through
// the feeder's CPU path) normalizing with them.
#include "gpufeed/stats.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <utime.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "gpufeed/dataset.h"
#include "gpufeed/fields.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"
#include "hdf5io/convert/channel_stats.h"
#include "tests/testing/capturing_logger.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;

// IEEE half from a float that it represents exactly (the test's values are).
uint16_t FloatToHalfExact(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  const int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  if ((b & 0x7fffffff) == 0) return sign;
  if (exp <= 0 || exp >= 31) ADD_FAILURE() << f << " is not a normal half";
  return static_cast<uint16_t>(sign | (exp << 10) | ((b >> 13) & 0x3ff));
}

hid_t HalfType() {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

enum class T { kU8, kI16, kF16, kF32 };

size_t Size(T t) { return t == T::kU8 ? 1 : t == T::kF32 ? 4 : 2; }

// Element value of sample n, channel c, position p within the channel.
double Val(T t, uint64_t n, uint64_t c, uint64_t p) {
  switch (t) {
    case T::kU8:
      return static_cast<double>((n * 7 + c * 40 + p * 3) % 256);
    case T::kI16:
      return static_cast<double>(static_cast<int64_t>((n * 131 + c * 1000 + p * 17) % 30000) - 15000);
    case T::kF16:
      return c * 8.0 + static_cast<double>((n + p) % 16) * 0.25 - 2;
    case T::kF32:  // a mean far from 0: the naive sum of squares would lose the variance
      return static_cast<double>(10000.0f + static_cast<float>(c) + static_cast<float>((n * 13 + p * 7) % 100) * 0.01f);
  }
  return 0;
}

void Put(T t, double v, std::byte* dst) {
  switch (t) {
    case T::kU8: {
      const uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(dst, &x, 1);
      break;
    }
    case T::kI16: {
      const int16_t x = static_cast<int16_t>(v);
      std::memcpy(dst, &x, 2);
      break;
    }
    case T::kF16: {
      const uint16_t x = FloatToHalfExact(static_cast<float>(v));
      std::memcpy(dst, &x, 2);
      break;
    }
    case T::kF32: {
      const float x = static_cast<float>(v);
      std::memcpy(dst, &x, 4);
      break;
    }
  }
}

hid_t TypeOf(T t) {
  switch (t) {
    case T::kU8:
      return H5Tcopy(H5T_NATIVE_UINT8);
    case T::kI16:
      return H5Tcopy(H5T_NATIVE_INT16);
    case T::kF16:
      return HalfType();
    case T::kF32:
      return H5Tcopy(H5T_NATIVE_FLOAT);
  }
  return -1;
}

constexpr uint64_t kC = 3, kH = 4, kW = 5;

// Writes /x with samples [first, first + n) in CHW or HWC order, chunked 2
// samples a chunk, with the layout attribute.
void WriteFile(const std::string& path, T t, bool hwc, uint64_t first, uint64_t n,
               const std::function<double(uint64_t, uint64_t, uint64_t)>& val = nullptr) {
  const uint64_t es = Size(t), per = kC * kH * kW;
  std::vector<std::byte> data(n * per * es);
  for (uint64_t s = 0; s < n; ++s) {
    for (uint64_t c = 0; c < kC; ++c) {
      for (uint64_t p = 0; p < kH * kW; ++p) {
        const uint64_t e = hwc ? p * kC + c : c * kH * kW + p;
        const double v = val ? val(first + s, c, p) : Val(t, first + s, c, p);
        Put(t, v, &data[(s * per + e) * es]);
      }
    }
  }
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  std::vector<hsize_t> dims = hwc ? std::vector<hsize_t>{n, kH, kW, kC} : std::vector<hsize_t>{n, kC, kH, kW};
  std::vector<hsize_t> chunk = dims;
  chunk[0] = std::min<hsize_t>(2, n);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 4, chunk.data());
  hid_t space = H5Screate_simple(4, dims.data(), nullptr);
  hid_t type = TypeOf(t);
  hid_t ds = H5Dcreate2(file, "x", type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  ASSERT_GE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
  const std::string layout = hwc ? "NHWC" : "NCHW";
  hid_t st = H5Tcopy(H5T_C_S1);
  H5Tset_size(st, layout.size());
  hid_t scalar = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(ds, "layout", st, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, st, layout.data());
  H5Aclose(a);
  H5Sclose(scalar);
  H5Tclose(st);
  H5Dclose(ds);
  H5Tclose(type);
  H5Sclose(space);
  H5Pclose(dcpl);
  H5Fclose(file);
}

// Plain two-pass mean and population std of channel c over samples [0, n).
std::pair<double, double> Expected(T t, uint64_t n, uint64_t c) {
  double sum = 0;
  for (uint64_t s = 0; s < n; ++s) {
    for (uint64_t p = 0; p < kH * kW; ++p) sum += Val(t, s, c, p);
  }
  const double count = static_cast<double>(n * kH * kW);
  const double mean = sum / count;
  double sq = 0;
  for (uint64_t s = 0; s < n; ++s) {
    for (uint64_t p = 0; p < kH * kW; ++p) sq += (Val(t, s, c, p) - mean) * (Val(t, s, c, p) - mean);
  }
  return {mean, std::sqrt(sq / count)};
}

std::vector<FieldStats> StatsOf(const std::string& data, int threads = 2) {
  OpenOptions o;
  o.fields = {"x=/x"};
  o.trust_files = true;
  auto src = FieldSource::Open(data, o);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  if (!src.ok()) return {};
  auto ds = Dataset::Open((*src)->files()[0] + ":/x", o);
  const int axis = ChannelAxisFromLayout(ds->info().layout, 3);
  StatsOptions so;
  so.channel_axes = {axis};
  so.threads = threads;
  auto st = ComputeStats(**src, so);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  return st.ok() ? *st : std::vector<FieldStats>{};
}

class StatsKnownValuesTest : public ::testing::TestWithParam<std::tuple<T, bool>> {};

TEST_P(StatsKnownValuesTest, EqualsAPlainComputationOverChunksAndFiles) {
  const auto [t, hwc] = GetParam();
  const std::string dir = testing::MakeTempDir("stats_known");
  const uint64_t counts[] = {5, 4, 6};  // chunks of 2: partial chunks in two files
  uint64_t first = 0;
  for (int f = 0; f < 3; ++f) {
    WriteFile(dir + "/part" + std::to_string(f) + ".h5", t, hwc, first, counts[f]);
    first += counts[f];
  }
  for (int threads : {1, 3}) {
    const std::vector<FieldStats> st = StatsOf(dir + "/*.h5", threads);
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].channel_axis, hwc ? 2 : 0);
    ASSERT_EQ(st[0].channels.size(), kC);
    for (uint64_t c = 0; c < kC; ++c) {
      const auto [mean, sd] = Expected(t, first, c);
      const ChannelStats& got = st[0].channels[c];
      EXPECT_EQ(got.count, first * kH * kW);
      EXPECT_NEAR(got.mean, mean, 1e-10 * std::max(1.0, std::abs(mean))) << "channel " << c;
      EXPECT_NEAR(got.stddev, sd, 1e-9 * std::max(1.0, sd)) << "channel " << c;
      double mn = 1e300, mx = -1e300;
      for (uint64_t s = 0; s < first; ++s) {
        for (uint64_t p = 0; p < kH * kW; ++p) {
          mn = std::min(mn, Val(t, s, c, p));
          mx = std::max(mx, Val(t, s, c, p));
        }
      }
      EXPECT_EQ(got.min, mn);
      EXPECT_EQ(got.max, mx);
      EXPECT_EQ(got.nan + got.inf, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndLayouts, StatsKnownValuesTest,
                         ::testing::Combine(::testing::Values(T::kU8, T::kI16, T::kF16, T::kF32), ::testing::Bool()));

TEST(StatsTest, NanAndInfAreCountedApartAndDoNotPoisonTheMean) {
  const std::string dir = testing::MakeTempDir("stats_nan");
  // Channel 1: every 7th value NaN, every 11th +Inf (when not NaN); others as Val.
  auto val = [](uint64_t n, uint64_t c, uint64_t p) {
    const uint64_t e = n * kH * kW + p;
    if (c == 1 && e % 7 == 0) return std::nan("");
    if (c == 1 && e % 11 == 0) return -HUGE_VAL;
    return static_cast<double>(static_cast<float>(c * 10 + (n + p) % 5));
  };
  WriteFile(dir + "/a.h5", T::kF32, false, 0, 9, val);
  const std::vector<FieldStats> st = StatsOf(dir + "/a.h5");
  ASSERT_EQ(st.size(), 1u);
  uint64_t nan = 0, inf = 0, n = 0;
  double sum = 0;
  for (uint64_t s = 0; s < 9; ++s) {
    for (uint64_t p = 0; p < kH * kW; ++p) {
      const double v = val(s, 1, p);
      if (std::isnan(v)) {
        ++nan;
      } else if (std::isinf(v)) {
        ++inf;
      } else {
        sum += v;
        ++n;
      }
    }
  }
  const ChannelStats& c1 = st[0].channels[1];
  EXPECT_GT(nan, 0u);
  EXPECT_GT(inf, 0u);
  EXPECT_EQ(c1.nan, nan);
  EXPECT_EQ(c1.inf, inf);
  EXPECT_EQ(c1.count, n);
  EXPECT_NEAR(c1.mean, sum / static_cast<double>(n), 1e-12);
  EXPECT_TRUE(std::isfinite(c1.stddev));
  EXPECT_EQ(st[0].channels[0].nan, 0u);
  EXPECT_EQ(st[0].channels[0].count, 9 * kH * kW);
}

TEST(StatsTest, LayoutNamesTheChannelAxis) {
  EXPECT_EQ(ChannelAxisFromLayout("NCHW", 3), 0);
  EXPECT_EQ(ChannelAxisFromLayout("NHWC", 3), 2);
  EXPECT_EQ(ChannelAxisFromLayout("NCDHW", 4), 0);
  EXPECT_EQ(ChannelAxisFromLayout("HWC", 3), 2);
  EXPECT_EQ(ChannelAxisFromLayout("NCHW", 2), -1);  // does not match the rank
  EXPECT_EQ(ChannelAxisFromLayout("", 3), -1);
  EXPECT_EQ(ChannelAxisFromLayout("encoded", 1), -1);
}

TEST(StatsTest, BadChannelAxisIsAClearError) {
  const std::string dir = testing::MakeTempDir("stats_bad_axis");
  WriteFile(dir + "/a.h5", T::kU8, false, 0, 3);
  OpenOptions o;
  o.fields = {"x=/x"};
  o.trust_files = true;
  auto src = FieldSource::Open(dir + "/a.h5", o);
  ASSERT_TRUE(src.ok());
  StatsOptions so;
  so.channel_axes = {3};
  auto st = ComputeStats(**src, so);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("channel axis 3"), std::string::npos) << st.status().ToString();
}

// The merge is exact in exact arithmetic: merging halves equals one pass.
TEST(StatsTest, ChanMergeMatchesOnePass) {
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e6f + static_cast<float>(i % 37) * 0.5f;
  stats::Accumulator whole(DType::kFloat32, {}), a(DType::kFloat32, {}), b(DType::kFloat32, {});
  whole.Add(reinterpret_cast<const std::byte*>(v.data()), v.size());
  a.Add(reinterpret_cast<const std::byte*>(v.data()), 313);
  b.Add(reinterpret_cast<const std::byte*>(v.data() + 313), v.size() - 313);
  a.Merge(b);
  EXPECT_NEAR(a.Result()[0].mean, whole.Result()[0].mean, 1e-9);
  EXPECT_NEAR(a.Result()[0].stddev, whole.Result()[0].stddev, 1e-9);
}

// Long channel runs (8-bit sums go through 4096-element blocks) and NHWC
// (inner == 1), against a plain computation.
TEST(StatsTest, AccumulatorLongRunsAndInterleavedChannels) {
  for (const stats::Geometry g : {stats::Geometry{1, 2, 10007}, stats::Geometry{5003, 3, 1}}) {
    const uint64_t per = g.outer * g.channels * g.inner, samples = 3;
    std::vector<uint8_t> v(per * samples);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    stats::Accumulator acc(DType::kUInt8, g);
    acc.Add(reinterpret_cast<const std::byte*>(v.data()), samples);
    const std::vector<ChannelStats> got = acc.Result();
    for (uint64_t c = 0; c < g.channels; ++c) {
      std::vector<double> x;
      for (uint64_t s = 0; s < samples; ++s) {
        for (uint64_t o = 0; o < g.outer; ++o) {
          for (uint64_t k = 0; k < g.inner; ++k) x.push_back(v[s * per + (o * g.channels + c) * g.inner + k]);
        }
      }
      double sum = 0, sq = 0;
      for (double e : x) sum += e;
      const double mean = sum / static_cast<double>(x.size());
      for (double e : x) sq += (e - mean) * (e - mean);
      EXPECT_EQ(got[c].count, x.size());
      EXPECT_NEAR(got[c].mean, mean, 1e-12 * mean);
      EXPECT_NEAR(got[c].stddev, std::sqrt(sq / static_cast<double>(x.size())), 1e-10);
      EXPECT_EQ(got[c].min, *std::min_element(x.begin(), x.end()));
      EXPECT_EQ(got[c].max, *std::max_element(x.begin(), x.end()));
    }
  }
}

// Float runs long enough for the blocked path, a NaN and an Inf in some
// blocks, a mean far from 0: equal to a plain two-pass computation.
TEST(StatsTest, AccumulatorLongFloatRunsWithNonFinite) {
  const stats::Geometry g{1, 2, 5000};
  const uint64_t per = g.channels * g.inner, samples = 3;
  std::vector<float> v(per * samples);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e4f + static_cast<float>((i * 2654435761u) % 1000) * 0.01f;
  v[1500] = std::nanf("");
  v[per + 7000 % per] = HUGE_VALF;
  v[2 * per + 4999] = -HUGE_VALF;
  stats::Accumulator acc(DType::kFloat32, g);
  acc.Add(reinterpret_cast<const std::byte*>(v.data()), samples);
  const std::vector<ChannelStats> got = acc.Result();
  for (uint64_t c = 0; c < g.channels; ++c) {
    std::vector<double> x;
    uint64_t bad = 0;
    for (uint64_t s = 0; s < samples; ++s) {
      for (uint64_t k = 0; k < g.inner; ++k) {
        const float e = v[s * per + c * g.inner + k];
        if (std::isfinite(e)) {
          x.push_back(e);
        } else {
          ++bad;
        }
      }
    }
    double sum = 0, sq = 0;
    for (double e : x) sum += e;
    const double mean = sum / static_cast<double>(x.size());
    for (double e : x) sq += (e - mean) * (e - mean);
    EXPECT_EQ(got[c].count, x.size());
    EXPECT_EQ(got[c].nan + got[c].inf, bad);
    EXPECT_NEAR(got[c].mean, mean, 1e-12 * mean);
    EXPECT_NEAR(got[c].stddev, std::sqrt(sq / static_cast<double>(x.size())), 1e-9);
    EXPECT_EQ(got[c].min, *std::min_element(x.begin(), x.end()));
    EXPECT_EQ(got[c].max, *std::max_element(x.begin(), x.end()));
  }
  EXPECT_EQ(got[0].nan + got[1].nan, 1u);
  EXPECT_EQ(got[0].inf + got[1].inf, 2u);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Normalized fp32 of the first batch through the feeder's CPU path, with
// mean/std taken from the dataset (FeedOptions left empty).
std::vector<float> FirstBatchNormalized(const std::string& file, std::vector<uint8_t>* raw) {
  OpenOptions o;
  o.trust_files = true;
  auto ds = Dataset::Open(file + ":/x", o);
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.order = Order::kSequential;
  lo.threads = 1;
  Loader loader(*ds, lo);
  FeedOptions fo;
  fo.force_cpu = true;
  GpuFeeder feeder(loader, fo);
  auto b = feeder.Next();
  EXPECT_TRUE(b.ok() && *b) << (b.ok() ? "end" : b.status().ToString());
  std::vector<float> out(4 * kC * kH * kW);
  EXPECT_TRUE(feeder.CopyToHost(**b, out.data(), nullptr).ok());
  raw->resize(out.size());
  EXPECT_TRUE(ds->ReadSamples(0, 4, std::as_writable_bytes(std::span(*raw))).ok());
  return out;
}

void ExpectNormalizedWith(const std::string& file, const FieldStats& st) {
  std::vector<uint8_t> raw;
  const std::vector<float> out = FirstBatchNormalized(file, &raw);
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t c = (i / (kH * kW)) % kC;
    const double want = (raw[i] - st.channels[c].mean) / st.channels[c].stddev;
    ASSERT_NEAR(out[i], want, 1e-4) << "element " << i;
  }
}

TEST(StatsStoreTest, WritableFileGetsAttributesTheLoaderUses) {
  const std::string dir = testing::MakeTempDir("stats_store_rw");
  const std::string file = dir + "/a.h5";
  WriteFile(file, T::kU8, false, 0, 7);
  const std::vector<FieldStats> st = StatsOf(file);
  ASSERT_EQ(st.size(), 1u);
  auto where = StoreStats(file, st, StoreMode::kAuto);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  EXPECT_EQ(*where, "attributes");
  EXPECT_FALSE(fs::exists(StatsSidecarPath(file)));
  auto ds = Dataset::Open(file + ":/x");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->info().stats_from, "attributes");
  EXPECT_EQ(ds->info().mean, st[0].means());
  EXPECT_EQ(ds->info().stddev, st[0].stddevs());
  EXPECT_EQ(ds->info().layout, "NCHW");  // the rest of the file is kept
  ExpectNormalizedWith(file, st[0]);
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST(StatsStoreTest, ReadOnlyFileGetsASidecarAndStaysByteForByte) {
  const std::string dir = testing::MakeTempDir("stats_store_ro");
  const std::string file = dir + "/a.h5";
  WriteFile(file, T::kU8, false, 0, 7);
  ASSERT_EQ(::chmod(file.c_str(), 0444), 0);
  const std::string before = Slurp(file);
  struct stat st0 {};
  ASSERT_EQ(::stat(file.c_str(), &st0), 0);
  const std::vector<FieldStats> st = StatsOf(file);
  auto attrs = StoreStats(file, st, StoreMode::kAttributes);  // asked for attributes: refused, says why
  ASSERT_FALSE(attrs.ok());
  EXPECT_NE(attrs.status().message().find("not writable"), std::string::npos) << attrs.status().ToString();
  auto where = StoreStats(file, st, StoreMode::kAuto);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  EXPECT_EQ(*where, StatsSidecarPath(file));
  EXPECT_EQ(Slurp(file), before);
  struct stat st1 {};
  ASSERT_EQ(::stat(file.c_str(), &st1), 0);
  EXPECT_EQ(st0.st_ino, st1.st_ino);
  auto ds = Dataset::Open(file + ":/x");
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->info().stats_from, StatsSidecarPath(file));
  ASSERT_EQ(ds->info().mean.size(), kC);
  for (size_t c = 0; c < kC; ++c) EXPECT_DOUBLE_EQ(ds->info().mean[c], st[0].channels[c].mean);
  ExpectNormalizedWith(file, st[0]);
  // The file changes (its mtime here): the sidecar no longer describes it.
  struct utimbuf t {
    st1.st_atime, st1.st_mtime + 10
  };
  ASSERT_EQ(::utime(file.c_str(), &t), 0);
  auto again = Dataset::Open(file + ":/x");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->info().mean.empty());
}

// Opens file:/x with a capturing logger; the events it got.
std::vector<std::pair<std::string, std::string>> OpenAndListen(const std::string& file, Result<Dataset>* out) {
  auto logger = std::make_shared<testing::CapturingLogger>();
  OpenOptions o;
  o.logger = logger;
  *out = Dataset::Open(file + ":/x", o);
  return logger->events();
}

// A sidecar that is there but not used is said, to the logger, naming it
// and how to write it again; never silently dropped.
TEST(StatsStoreTest, MalformedSidecarIsIgnoredAndSaidSo) {
  const std::string dir = testing::MakeTempDir("stats_store_bad");
  const std::string file = dir + "/a.h5";
  WriteFile(file, T::kU8, false, 0, 3);
  for (const char* text : {"{", "[]", "{\"gpufeed_stats\": 1, \"file_size\": \"x\"}", "\x01\x02"}) {
    std::ofstream(StatsSidecarPath(file)) << text;
    Result<Dataset> ds = Status::Internal("unset");
    const auto events = OpenAndListen(file, &ds);
    ASSERT_TRUE(ds.ok()) << text;
    EXPECT_TRUE(ds->info().mean.empty()) << text;
    ASSERT_EQ(events.size(), 1u) << text;
    EXPECT_EQ(events[0].first, "stats_sidecar_ignored");
    EXPECT_NE(events[0].second.find(StatsSidecarPath(file)), std::string::npos) << events[0].second;
    EXPECT_NE(events[0].second.find("--stats --store"), std::string::npos) << events[0].second;
  }
}

// A sidecar that matches the file but whose arrays are wrong is not used.
TEST(StatsStoreTest, SidecarWithBadArraysIsIgnored) {
  const std::string dir = testing::MakeTempDir("stats_store_bad_arrays");
  const std::string file = dir + "/a.h5";
  WriteFile(file, T::kU8, false, 0, 3);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  const std::string head = "{\"gpufeed_stats\": 1, \"file_size\": " + std::to_string(st.st_size) +
                           ", \"file_mtime_ns\": " +
                           std::to_string(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec) +
                           ", \"datasets\": {\"/x\": ";
  const char* good = "{\"mean\": [1, 2, 3], \"std\": [1, 1, 1]}";
  std::ofstream(StatsSidecarPath(file)) << head << good << "}}";
  Result<Dataset> ds = Status::Internal("unset");
  EXPECT_TRUE(OpenAndListen(file, &ds).empty());  // nothing to say
  ASSERT_TRUE(ds.ok());
  ASSERT_EQ(ds->info().mean, (std::vector<double>{1, 2, 3}));  // the well-formed one is read
  for (const char* bad :
       {"{\"mean\": [1, 2, 3], \"std\": [1, 1]}", "{\"mean\": [1], \"std\": [-1]}", "{\"mean\": [\"a\"], \"std\": [1]}",
        "{\"mean\": [], \"std\": []}", "{\"mean\": 1, \"std\": 1}", "[]"}) {
    std::ofstream(StatsSidecarPath(file)) << head << bad << "}}";
    Result<Dataset> d = Status::Internal("unset");
    const auto events = OpenAndListen(file, &d);
    ASSERT_TRUE(d.ok()) << bad;
    EXPECT_TRUE(d->info().mean.empty()) << bad;
    EXPECT_EQ(d->info().stats_from, "") << bad;
    ASSERT_EQ(events.size(), 1u) << bad;
    EXPECT_EQ(events[0].first, "stats_sidecar_ignored") << bad;
  }
}

TEST(StatsStoreTest, FailedStoreLeavesTheFileAsItWas) {
  const std::string dir = testing::MakeTempDir("stats_store_fail");
  const std::string file = dir + "/a.h5";
  WriteFile(file, T::kU8, false, 0, 3);
  const std::string before = Slurp(file);
  std::vector<FieldStats> st = StatsOf(file);
  ASSERT_EQ(st.size(), 1u);
  st.push_back(st[0]);
  st[1].path = "/no/such/dataset";  // the second write fails after the first succeeded in the copy
  auto where = StoreStats(file, st, StoreMode::kAttributes);
  ASSERT_FALSE(where.ok());
  EXPECT_NE(where.status().message().find("/no/such/dataset"), std::string::npos) << where.status().ToString();
  EXPECT_EQ(Slurp(file), before);
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace gpufeed
