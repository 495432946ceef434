// The image decode stage of the feed (LoaderOptions::defer_decode +
// gpu::ImageBatchDecoder): the resample kernel's CPU twin against the CPU
// decoder's resample, deferred batches against the loader's own decode, the
// loader's split between encoded and host-decoded samples, corrupt streams;
// on a GPU host, ResizeCropGpu against its twin and nvJPEG's batches against
// the CPU twin's. Image k is a gradient whose offset encodes k.
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gpu/device_ops.h"
#include "gpu/image_decoder.h"
#include "gpu/resize_crop.h"
#include "gpufeed/convert.h"
#include "gpufeed/encoded.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/loader.h"
#include "hdf5io/image/image_decode.h"
#include "tests/testing/test_data.h"
#include "tests/testing/gpu_required.h"

namespace gpufeed {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

enum class Kind { kBaseline, kProgressive, kGrey, kPng, k444 };

// A smooth gradient offset by k (JPEG keeps it to a few levels; the CPU
// path's scaled DCT and the device's full decode + resample agree on smooth
// content, and differ more on edges: the GPU host's benchmark measures them
// on photographs). Sides up to 120.
std::vector<uint8_t> Pixels(uint64_t k, int h, int w, int comps) {
  std::vector<uint8_t> px(size_t(h) * w * comps);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < comps; ++c)
        px[(size_t(y) * w + x) * comps + c] = uint8_t(10 + (k * 7) % 60 + y + x / 2 + c * 10);
  return px;
}

Bytes Encode(uint64_t k, int h, int w, Kind kind) {
  if (kind == Kind::kPng) {
    std::vector<uint8_t> px = Pixels(k, h, w, 3);
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = w;
    img.height = h;
    img.format = PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    EXPECT_TRUE(png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr));
    Bytes out(size);
    EXPECT_TRUE(png_image_write_to_memory(&img, out.data(), &size, 0, px.data(), 0, nullptr));
    out.resize(size);
    return out;
  }
  const int comps = kind == Kind::kGrey ? 1 : 3;
  std::vector<uint8_t> px = Pixels(k, h, w, comps);
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int sub = kind == Kind::kGrey ? TJSAMP_GRAY : kind == Kind::k444 ? TJSAMP_444 : TJSAMP_420;
  const int flags = kind == Kind::kProgressive ? TJFLAG_PROGRESSIVE : 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, comps == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size, sub, 95, flags), 0);
  Bytes out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

struct Dataset {
  std::string path;
  std::vector<Kind> kinds;
};

// n images in two classes; kinds cycle so each batch mixes the device's
// JPEGs with the loader's (progressive, PNG). `patch(k, bytes)` may alter one.
Dataset Make(const std::string& tag, uint64_t n, const std::function<void(uint64_t, Bytes*)>& patch = nullptr) {
  Dataset d;
  const fs::path dir = fs::path(testing::MakeTempDir(tag)) / "images";
  fs::create_directories(dir / "c0");
  fs::create_directories(dir / "c1");
  const Kind kinds[] = {Kind::kBaseline, Kind::kBaseline, Kind::kProgressive, Kind::kGrey,
                        Kind::kBaseline, Kind::kPng,      Kind::k444};
  for (uint64_t k = 0; k < n; ++k) {
    const Kind kind = kinds[k % 7];
    Bytes b = Encode(k, 40 + int(k % 5) * 17, 50 + int(k % 3) * 23, kind);
    if (patch) patch(k, &b);
    char name[32];
    std::snprintf(name, sizeof name, "%s/%04llu.%s", k < n / 2 ? "c0" : "c1", (unsigned long long)k,
                  kind == Kind::kPng ? "png" : "jpg");
    std::ofstream f(dir / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    d.kinds.push_back(kind);
  }
  d.path = (dir.parent_path() / "x.h5").string();
  auto s = ConvertEncodedImageFolder(dir.string(), d.path, {});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return d;
}

TEST(ResizeCropTest, TwinTracksTheCpuDecodersResample) {
  std::mt19937 rng(3);
  const int h = 97, w = 131;
  std::vector<uint8_t> img(size_t(h) * w * 3);
  for (auto& v : img) v = uint8_t(rng() % 256);
  struct Case {
    int top, left, height, width, out_h, out_w;
  } cases[] = {{0, 0, 97, 131, 32, 32},
               {10, 20, 50, 60, 24, 40},
               {5, 7, 9, 11, 33, 29},
               {0, 0, 97, 131, 97, 131},
               {90, 120, 7, 11, 16, 16}};
  for (const Case& c : cases) {
    for (bool nchw : {true, false}) {
      gpu::ResizeJob j;
      j.src = img.data();
      j.pitch = uint64_t(3) * w;
      j.src_h = h;
      j.src_w = w;
      j.box = {.top = c.top, .left = c.left, .height = c.height, .width = c.width};
      std::vector<uint8_t> twin(size_t(3) * c.out_h * c.out_w), ref(twin.size());
      ASSERT_TRUE(gpu::ResizeCropCpu(&j, 1, c.out_h, c.out_w, nchw, twin.data()).ok());
      image::ResampleBox(img.data(), h, w, c.top, c.left, c.height, c.width, ref.data(), c.out_h, c.out_w, nchw);
      int worst = 0;
      double sum = 0;
      for (size_t i = 0; i < twin.size(); ++i) {
        const int d = std::abs(int(twin[i]) - int(ref[i]));
        worst = std::max(worst, d);
        sum += d;
      }
      // The same filter; the CPU decoder rounds its two passes in another
      // order (vertical in float, then horizontal), so a level at most.
      EXPECT_LE(worst, 1) << c.height << "x" << c.width << " -> " << c.out_h << "x" << c.out_w;
      EXPECT_LT(sum / twin.size(), 0.1);
    }
  }
}

TEST(ResizeCropTest, BoxesOutsideTheImageAreRefused) {
  std::vector<uint8_t> img(30);
  gpu::ResizeJob j;
  j.src = img.data();
  j.pitch = 6;
  j.src_h = 5;
  j.src_w = 2;
  j.box = {.top = 3, .left = 0, .height = 3, .width = 2};
  std::vector<uint8_t> out(3 * 4 * 4);
  Status st = gpu::ResizeCropCpu(&j, 1, 4, 4, true, out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not inside"), std::string::npos) << st.ToString();
  j.box.top = 2;
  EXPECT_TRUE(gpu::ResizeCropCpu(&j, 1, 4, 4, true, out.data()).ok());
}

// Every fresh batch of one epoch through a CPU feed (fp32, mean 0, std 1:
// the uint8 values), in order, with labels.
struct Fed {
  std::vector<std::vector<float>> images;
  std::vector<std::vector<int64_t>> labels;
  FeedStats stats;
  LoaderStats loader;
  Status error;
};
// The loader options every run here uses (so runs agree batch for batch).
LoaderOptions TestLoaderOptions(bool defer, bool pinned) {
  LoaderOptions lo;
  lo.batch_size = 7;
  lo.threads = 2;
  lo.seed = 11;
  lo.pin_memory = pinned;
  lo.order = Order::kRandom;
  lo.defer_decode = defer;
  return lo;
}
Fed Feed(const ChunkSource& src, bool defer, bool skip_corrupt = false, bool gpu = false) {
  Loader loader(src, TestLoaderOptions(defer, gpu));
  FeedOptions fo;
  fo.force_cpu = !gpu;
  fo.mean = {0, 0, 0};
  fo.stddev = {1, 1, 1};
  fo.skip_corrupt = skip_corrupt;
  GpuFeeder feeder(loader, fo, 1);
  Fed out;
  for (;;) {
    auto b = feeder.Next();
    if (!b.ok()) {
      out.error = b.status();
      break;
    }
    if (!*b) break;
    const DeviceBatch& db = **b;
    std::vector<float> img(size_t(db.size()) * src.sample_bytes());
    std::vector<int64_t> lab(db.size());
    EXPECT_TRUE(feeder.CopyToHost(db, img.data(), lab.data()).ok());
    out.images.push_back(std::move(img));
    out.labels.push_back(std::move(lab));
  }
  out.stats = feeder.stats();
  out.loader = feeder.loader_stats();
  return out;
}

DecodeOptions Decode32() {
  DecodeOptions d;
  d.height = 32;
  d.width = 28;
  return d;
}

TEST(ImageDecoderTest, DeferredBatchesMatchTheLoadersDecode) {
  const uint64_t n = 35;
  Dataset ds = Make("dec_match", n);
  auto src = OpenEncodedImages(ds.path, {}, Decode32());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  Fed plain = Feed(**src, false), deferred = Feed(**src, true);
  ASSERT_TRUE(plain.error.ok()) << plain.error.ToString();
  ASSERT_TRUE(deferred.error.ok()) << deferred.error.ToString();
  ASSERT_EQ(plain.images.size(), deferred.images.size());
  EXPECT_EQ(plain.labels, deferred.labels);
  EXPECT_EQ(plain.stats.decoder, "");
  EXPECT_EQ(deferred.stats.decoder, "cpu");
  // The loader's batches say which sample went which way; the feed's output
  // follows the loader's order, so the k-th sample of the epoch is the same
  // dataset sample in both runs.
  Loader loader(**src, TestLoaderOptions(/*defer=*/true, /*pinned=*/false));
  const uint64_t sb = (*src)->sample_bytes();
  size_t batch = 0;
  uint64_t on_device = 0, by_loader = 0;
  for (const Batch& b : loader.Epoch(1)) {
    ASSERT_EQ(b.encoded().size(), b.size());
    for (uint64_t i = 0; i < b.size(); ++i) {
      const uint64_t k = b.indices()[i];
      const EncodedSample& e = b.encoded()[i];
      const Kind kind = ds.kinds[k];
      const bool device = kind == Kind::kBaseline || kind == Kind::kGrey || kind == Kind::k444;
      EXPECT_EQ(e.bytes > 0, device) << "sample " << k << " kind " << int(kind);
      const float* p = plain.images[batch].data() + i * sb;
      const float* q = deferred.images[batch].data() + i * sb;
      double diff = 0;
      for (uint64_t x = 0; x < sb; ++x) diff += std::abs(p[x] - q[x]);
      if (device) {
        ++on_device;
        // The crop the CPU decoder takes for (seed, epoch, sample).
        const CropRect box = image::PlanCrop(e.height, e.width, Decode32(), image::RandomKey(11, 1, k));
        EXPECT_EQ(e.crop, box);
        // A full-size decode and one resample, against libjpeg's scaled
        // decode: a couple of levels on average.
        EXPECT_LT(diff / sb, 2.0) << "sample " << k;
      } else {
        ++by_loader;
        EXPECT_EQ(diff, 0.0) << "sample " << k << " was decoded by the loader in both runs";
      }
    }
    ++batch;
  }
  EXPECT_EQ(deferred.stats.decoded_on_device, on_device);
  EXPECT_EQ(deferred.stats.decoded_by_loader, by_loader);
  EXPECT_EQ(deferred.loader.deferred_samples, on_device);
  EXPECT_EQ(deferred.loader.host_decoded_samples, by_loader);
  EXPECT_GT(on_device, n / 2);
  EXPECT_GT(by_loader, 0u);
}

// A baseline JPEG cut short with an EOI marker after it passes the loader's
// header checks and goes to the device decoder; that decoder's failure is the
// CPU path's error naming the sample, or with skip_corrupt a replacement.
TEST(ImageDecoderTest, CorruptDeferredSampleIsNamedOrReplaced) {
  const uint64_t n = 14, bad = 4;  // sample 4 is a baseline JPEG
  Dataset ds = Make("dec_bad", n, [&](uint64_t k, Bytes* b) {
    if (k != bad) return;
    b->resize(b->size() * 2 / 3);
    b->push_back(0xFF);
    b->push_back(0xD9);
  });
  auto src = OpenEncodedImages(ds.path, {}, Decode32());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  Fed failed = Feed(**src, true);
  ASSERT_FALSE(failed.error.ok());
  EXPECT_EQ(failed.error.code(), StatusCode::kCorrupt);
  EXPECT_NE(failed.error.message().find("sample " + std::to_string(bad) + ":"), std::string::npos)
      << failed.error.ToString();
  EXPECT_NE(failed.error.message().find("skip_corrupt"), std::string::npos) << failed.error.ToString();
  Fed skipped = Feed(**src, true, /*skip_corrupt=*/true);
  ASSERT_TRUE(skipped.error.ok()) << skipped.error.ToString();
  EXPECT_EQ(skipped.stats.decode_skipped, 1u);
  uint64_t delivered = 0;
  for (const auto& l : skipped.labels) delivered += l.size();
  EXPECT_EQ(delivered, n);  // batch sizes kept
}

// LoaderOptions::balance_decode: the loader decodes the share of the
// device's samples that the reported device rate leaves to it (none without
// a report, nearly all beside a very slow device, next to none beside a
// very fast one), every sample still once with its label; through a feed
// (its CPU twin reports its own rate) the output's labels are the plain
// loader's, batch for batch.
TEST(ImageDecoderTest, TheLoadersShareFollowsTheDeviceDecodersRate) {
  const uint64_t n = 140;
  Dataset ds = Make("dec_share", n);
  auto src = OpenEncodedImages(ds.path, {}, Decode32());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  uint64_t device_kinds = 0;
  for (Kind k : ds.kinds) device_kinds += k == Kind::kBaseline || k == Kind::kGrey || k == Kind::k444;
  // Three epochs at a reported rate; the last epoch's balanced samples.
  auto run = [&](double rate, uint64_t* label_sum) {
    LoaderOptions lo = TestLoaderOptions(/*defer=*/true, /*pinned=*/false);
    lo.balance_decode = true;
    Loader loader(**src, lo);
    if (rate > 0) loader.ReportDeviceDecodeRate(rate);
    LoaderStats last;
    for (uint64_t e = 0; e < 3; ++e) {
      EpochStream stream = loader.Epoch(e);
      uint64_t seen = 0, sum = 0;
      for (const Batch& b : stream) {
        for (uint64_t i = 0; i < b.size(); ++i) sum += uint64_t(b.labels()[i]);
        seen += b.size();
      }
      EXPECT_EQ(seen, n);
      *label_sum = sum;
      last = stream.stats();
    }
    return last;
  };
  uint64_t want = 0, sum = 0;
  for (uint64_t k = 0; k < n; ++k) want += k < n / 2 ? 0 : 1;  // Make(): the first half in c0
  LoaderStats none = run(0, &sum);
  EXPECT_EQ(sum, want);
  EXPECT_EQ(none.balanced_samples, 0u);
  EXPECT_EQ(none.deferred_samples, device_kinds);
  LoaderStats slow = run(1.0, &sum);  // a device that takes a second a sample
  EXPECT_EQ(sum, want);
  // host / (host + 1): above 0.9 while a decode here takes under 0.18 s
  // (2 threads at 0.8), sanitizers included.
  EXPECT_GT(slow.host_decode_share, 0.9);
  EXPECT_GT(slow.balanced_samples, device_kinds * 8 / 10);
  LoaderStats fast = run(1e12, &sum);
  EXPECT_EQ(sum, want);
  EXPECT_LT(fast.host_decode_share, 1e-3);
  EXPECT_LE(fast.balanced_samples, 1u);

  // Through a feed: the CPU twin reports its rate; labels as the plain loader's.
  Fed plain = Feed(**src, false);
  LoaderOptions lo = TestLoaderOptions(true, false);
  lo.balance_decode = true;
  Loader loader(**src, lo);
  FeedOptions fo;
  fo.force_cpu = true;
  std::vector<std::vector<int64_t>> labels;
  LoaderStats ls;
  for (uint64_t e = 0; e < 2; ++e) {  // the second epoch starts with a measured share
    GpuFeeder feeder(loader, fo, 1);
    labels.clear();
    for (;;) {
      auto b = feeder.Next();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      if (!*b) break;
      std::vector<int64_t> l((*b)->size());
      ASSERT_TRUE(feeder.CopyToHost(**b, nullptr, l.data()).ok());
      labels.push_back(std::move(l));
    }
    ls = feeder.loader_stats();
  }
  EXPECT_EQ(labels, plain.labels);
  EXPECT_GT(ls.host_decode_share, 0.0);
  EXPECT_LT(ls.host_decode_share, 1.0);
}

// With encoded batches the feed's fills (and the decode stage) run on its
// fill worker: every output batch, echoed passes and super-batches included,
// carries the labels the consumer-thread fills of a plain loader give;
// stats() and loader_stats() while a fill runs are safe (TSan checks it); a
// feeder left in the middle of an epoch, its worker busy, ends without a
// hang; Restart mid-epoch starts the next epoch as a new feeder would.
TEST(ImageDecoderTest, TheFillWorkerKeepsTheFeedsOrderAndStopsMidEpoch) {
  const uint64_t n = 61;
  Dataset ds = Make("dec_worker", n);
  auto src = OpenEncodedImages(ds.path, {}, Decode32());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  using Labels = std::vector<std::vector<int64_t>>;
  auto take = [](GpuFeeder& feeder, size_t stop_after, Labels* labels, FeedStats* stats) {
    for (size_t k = 0; k < stop_after; ++k) {
      auto b = feeder.Next();
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      if (!*b) break;
      std::vector<int64_t> l((*b)->size());
      ASSERT_TRUE(feeder.CopyToHost(**b, nullptr, l.data()).ok());
      labels->push_back(std::move(l));
      *stats = feeder.stats();  // the worker may be filling the next slot now
      (void)feeder.loader_stats();
    }
  };
  FeedOptions fo;
  fo.force_cpu = true;
  fo.super_batch = 2;
  fo.echo = 2;
  auto run = [&](bool defer, size_t stop_after, Labels* labels, FeedStats* stats) {
    LoaderOptions lo = TestLoaderOptions(defer, false);
    lo.prefetch = 5;
    Loader loader(**src, lo);
    GpuFeeder feeder(loader, fo, 3);
    take(feeder, stop_after, labels, stats);
  };
  Labels plain, deferred, part;
  FeedStats ps, dstats, part_stats;
  run(false, SIZE_MAX, &plain, &ps);
  run(true, SIZE_MAX, &deferred, &dstats);
  ASSERT_EQ(plain.size(), 2 * ((n + 6) / 7));  // every loader batch, twice
  EXPECT_EQ(plain, deferred);
  EXPECT_EQ(dstats.fresh_samples, n);
  EXPECT_EQ(dstats.echoed_samples, n);
  EXPECT_EQ(dstats.decoder, "cpu");
  EXPECT_EQ(dstats.decoded_on_device + dstats.decoded_by_loader, n);  // the last fill's counted too
  EXPECT_GT(dstats.decoded_on_device, 0u);
  run(true, 3, &part, &part_stats);  // the worker fills while the feeder goes
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part[0], deferred[0]);
  EXPECT_EQ(part[2], deferred[2]);

  // Restart in the middle of epoch 3 (the worker busy) into epoch 4: what a
  // new feeder of epoch 4 delivers.
  LoaderOptions lo = TestLoaderOptions(true, false);
  Loader loader(**src, lo);
  GpuFeeder feeder(loader, fo, 3);
  Labels before, restarted, fresh;
  FeedStats a, b, c;
  take(feeder, 3, &before, &a);
  ASSERT_TRUE(feeder.Restart(4).ok());
  take(feeder, SIZE_MAX, &restarted, &b);
  {
    Loader other(**src, lo);
    GpuFeeder feeder4(other, fo, 4);
    take(feeder4, SIZE_MAX, &fresh, &c);
  }
  EXPECT_EQ(restarted, fresh);
  EXPECT_EQ(b.fresh_samples, n);
}

// NextFor and Interrupt with the fill worker: an Interrupt before the first
// NextFor ends its wait for the worker's first fill with nothing taken; then
// NextFor with a short timeout, called until the end, delivers every batch
// of the epoch in the plain feed's order.
TEST(ImageDecoderTest, NextForWaitsOnTheFillWorkerAndIsInterrupted) {
  const uint64_t n = 40;
  Dataset ds = Make("dec_worker_wait", n);
  auto src = OpenEncodedImages(ds.path, {}, Decode32());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const Fed plain = Feed(**src, /*defer=*/false);
  ASSERT_TRUE(plain.error.ok()) << plain.error.ToString();
  Loader loader(**src, TestLoaderOptions(/*defer=*/true, false));
  FeedOptions fo;
  fo.force_cpu = true;
  fo.mean = {0, 0, 0};
  fo.stddev = {1, 1, 1};
  GpuFeeder feeder(loader, fo, 1);
  feeder.Interrupt();
  auto first = feeder.NextFor(std::chrono::seconds(30));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->wait, WaitResult::kInterrupted);
  EXPECT_FALSE(first->batch.has_value());
  std::vector<std::vector<int64_t>> labels;
  uint64_t timeouts = 0;
  for (int guard = 0; guard < 100000; ++guard) {
    auto r = feeder.NextFor(std::chrono::milliseconds(1));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->wait == WaitResult::kTimeout) {
      ++timeouts;
      continue;
    }
    ASSERT_EQ(r->wait, WaitResult::kReady);
    if (!r->batch) break;
    std::vector<int64_t> l(r->batch->size());
    ASSERT_TRUE(feeder.CopyToHost(*r->batch, nullptr, l.data()).ok());
    labels.push_back(std::move(l));
  }
  EXPECT_EQ(labels, plain.labels);
  std::printf("NextFor(1 ms) over the worker's fills: %zu batches, %llu timeouts\n", labels.size(),
              static_cast<unsigned long long>(timeouts));
}

TEST(ImageDecoderTest, DecodeDeviceNames) {
  EXPECT_EQ(*DecodeDeviceFromName("gpu"), DecodeDevice::kGpu);
  EXPECT_EQ(*DecodeDeviceFromName("cpu"), DecodeDevice::kCpu);
  EXPECT_EQ(*DecodeDeviceFromName("auto"), DecodeDevice::kAuto);
  auto bad = DecodeDeviceFromName("nvjpeg");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto, cpu or gpu"), std::string::npos);
}

// --- on a GPU host -------------------------------------------------------

TEST(ImageDecoderGpuTest, ResizeCropGpuEqualsItsTwin) {
  auto ops = gpu::MakeCudaOps(0);
  if (!ops.ok()) GPUFEED_GPU_UNAVAILABLE(ops.status().ToString());
  std::mt19937 rng(5);
  const int out_h = 40, out_w = 36, n = 6;
  std::vector<std::vector<uint8_t>> imgs(n);
  std::vector<gpu::ResizeJob> host(n), dev(n);
  std::vector<gpu::DeviceBuffer> bufs(n);
  for (int k = 0; k < n; ++k) {
    const int h = 30 + k * 41, w = 20 + k * 53;
    imgs[k].resize(size_t(h) * w * 3);
    for (auto& v : imgs[k]) v = uint8_t(rng() % 256);
    auto buf = (*ops)->Alloc(imgs[k].size());
    ASSERT_TRUE(buf.ok());
    bufs[k] = std::move(*buf);
    // On the legacy default stream, as the resample below.
    ASSERT_TRUE((*ops)->CopyToDevice(bufs[k].get(), imgs[k].data(), imgs[k].size(), gpu::StreamRef{}).ok());
    gpu::ResizeJob j;
    j.pitch = uint64_t(3) * w;
    j.src_h = h;
    j.src_w = w;
    j.box = {.top = k, .left = 2 * k, .height = h - k, .width = w - 2 * k};
    j.dst_index = uint32_t(n - 1 - k);
    host[k] = dev[k] = j;
    host[k].src = imgs[k].data();
    dev[k].src = static_cast<const uint8_t*>(bufs[k].get());
  }
  for (bool nchw : {true, false}) {
    std::vector<uint8_t> want(size_t(n) * 3 * out_h * out_w), got(want.size());
    ASSERT_TRUE(gpu::ResizeCropCpu(host.data(), n, out_h, out_w, nchw, want.data()).ok());
    auto jobs = (*ops)->Alloc(n * sizeof(gpu::ResizeJob));
    ASSERT_TRUE(jobs.ok());
    auto out = (*ops)->Alloc(got.size());
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*ops)->CopyToDevice(jobs->get(), dev.data(), n * sizeof(gpu::ResizeJob), gpu::StreamRef{}).ok());
    ASSERT_TRUE(gpu::ResizeCropGpu(static_cast<gpu::ResizeJob*>(jobs->get()), n, out_h, out_w, nchw,
                                   static_cast<uint8_t*>(out->get()), nullptr)
                    .ok());
    ASSERT_TRUE((*ops)->StreamSync(gpu::StreamRef{}).ok());
    ASSERT_TRUE((*ops)->CopyToHost(got.data(), out->get(), got.size(), gpu::EventRef{}).ok());
    EXPECT_EQ(got, want) << (nchw ? "NCHW" : "NHWC");
  }
}

// nvJPEG's batches against the CPU twin's: IDCTs differ, so a couple of
// levels on average; everything else (order, labels, which sample went
// where) the same.
TEST(ImageDecoderGpuTest, NvjpegBatchesTrackTheTwin) {
  std::string backend;
  if (Status st = GpuImageDecoder(0, &backend); !st.ok()) GPUFEED_GPU_UNAVAILABLE(st.ToString());
  Dataset ds = Make("dec_gpu", 35);
  auto src = OpenEncodedImages(ds.path, {}, Decode32());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  Fed twin = Feed(**src, true), dev = Feed(**src, true, false, /*gpu=*/true);
  ASSERT_TRUE(twin.error.ok()) << twin.error.ToString();
  ASSERT_TRUE(dev.error.ok()) << dev.error.ToString();
  EXPECT_EQ(dev.stats.decoder, "nvjpeg " + backend);
  EXPECT_EQ(twin.labels, dev.labels);
  EXPECT_EQ(twin.stats.decoded_on_device, dev.stats.decoded_on_device + dev.stats.decode_fallbacks);
  ASSERT_EQ(twin.images.size(), dev.images.size());
  double diff = 0, count = 0;
  for (size_t b = 0; b < twin.images.size(); ++b) {
    for (size_t i = 0; i < twin.images[b].size(); ++i) diff += std::abs(twin.images[b][i] - dev.images[b][i]);
    count += double(twin.images[b].size());
  }
  EXPECT_LT(diff / count, 2.0);
  std::printf("nvjpeg %s vs the CPU twin: mean |diff| %.3f levels over %.0f values\n", backend.c_str(), diff / count,
              count);
}

}  // namespace
}  // namespace gpufeed
