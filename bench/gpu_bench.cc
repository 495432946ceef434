// GPU benchmarks: h2d, transform kernel, feed. CUDA runtime calls are used
// directly here (benchmarks measure the hardware), checked through
// GPUFEED_CUDA_RETURN.
#include "bench/gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstring>
#include <random>
#include <vector>

#include "bench/loader_bench.h"
#include "gpufeed/dataset.h"

namespace gpufeed::bench {
Result<FeedBenchResult> RunFeedBench(const FeedBenchOptions& o) {
  auto opened = OpenBenchSource(o.data, o.dataset, o.loader, o.token_file, "bench-feed");
  if (!opened.ok()) return opened.status();
  std::optional<Dataset> remote_file;
  const Dataset* ds = VerificationFile(**opened, o.dataset, &remote_file);
  if (ds == nullptr) {
    return Status::Unsupported(o.data + ": bench feed verifies against the file, and the daemon's file (" +
                               (*opened)->source().info().name + ") cannot be opened here");
  }
  // What reaches the GPU is verified by the index each `bench gen` sample
  // carries in its first 8 bytes: any other file is named as such up front.
  {
    const uint64_t sb = ds->sample_bytes();
    std::vector<std::byte> s(sb);
    for (uint64_t k : {uint64_t{0}, ds->num_samples() / 2, ds->num_samples() - 1}) {
      uint64_t idx = UINT64_MAX;
      if (sb >= 8 && ds->num_samples() > 0 && ds->ReadSamples(k, 1, s).ok()) {
        idx = 0;
        for (int q = 0; q < 8; ++q) idx |= uint64_t(uint8_t(s[q])) << (8 * q);
      }
      if (idx != k) {
        return Status::InvalidArgument(
            ds->name() + ": not a `gpufeed bench gen` file (sample " + std::to_string(k) +
            " does not carry its index in its first 8 bytes, which bench feed needs to verify what reaches the GPU); "
            "make one with `gpufeed bench gen --workload celeba-raw --samples 2000 -o FILE.h5`");
      }
    }
  }
  FeedBenchResult r;
  BatchSource& loader = (*opened)->source();
  // The loader alone, same options, same run (its last epoch).
  for (int ep = 0; ep < o.epochs; ++ep) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t n = 0;
    EpochStream stream = loader.Epoch(ep);
    for (;;) {
      auto b = stream.Next();
      if (!b.ok()) return b.status();
      if (!*b) break;
      n += (*b)->size();
    }
    r.loader_samples_per_s = n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Through the feeder. The first epoch checks what reaches the GPU: with
  // mean 0, std 1, fp32, no augmentation and no layout change a sample's
  // values are its bytes, and the WORKLOADS files (bench gen) hold each
  // sample's index in its first 8, so every 16th batch's first sample is
  // compared with the file. The following epochs run the options asked for
  // and are timed; the last is reported.
  const uint64_t sb = ds->sample_bytes();
  std::vector<float> img;
  std::vector<std::byte> want(sb);
  for (int ep = 0; ep < std::max(2, o.epochs); ++ep) {
    const bool verify = ep == 0;
    FeedOptions f = o.feed;
    if (verify) {
      f.dtype = DType::kFloat32;
      f.layout = f.input_layout;
      f.crop_padding = 0;
      f.flip = false;
      f.echo = 1;
      f.mean.assign(ds->sample_shape()[f.input_layout == Layout::kNCHW ? 0 : 2], 0.0);
      f.stddev.assign(f.mean.size(), 1.0);
    }
    GpuFeeder feeder(loader, f, 100 + ep);
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<DeviceBatch> last;
    uint64_t k = 0;
    for (;;) {
      auto b = feeder.Next();
      if (!b.ok()) return b.status();
      if (!*b) break;
      if (verify && (k++ % 16) == 0) {
        img.resize((*b)->size() * sb);
        GPUFEED_RETURN_IF_ERROR(feeder.CopyToHost(**b, img.data(), nullptr));
        uint64_t idx = 0;
        for (int q = 0; q < 8; ++q) idx |= uint64_t(uint8_t(img[q])) << (8 * q);
        if (idx >= ds->num_samples()) {
          return Status::Corrupt(o.data + ": a fed sample carries no valid index (not a `bench gen` file?)");
        }
        GPUFEED_RETURN_IF_ERROR(ds->ReadSamples(idx, 1, want));
        for (uint64_t q = 0; q < sb; ++q) {
          if (img[q] != float(uint8_t(want[q]))) {
            return Status::Corrupt(o.data + ": sample " + std::to_string(idx) + " reached the GPU with wrong bytes");
          }
        }
        ++r.verified_samples;
      }
      last = std::move(**b);  // releases the previous one
    }
    if (last) GPUFEED_RETURN_IF_ERROR(feeder.CopyToHost(*last, nullptr, nullptr));  // wait for the GPU
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.stats = feeder.stats();
  }
  if (r.verified_samples == 0) return Status::Internal(o.data + ": nothing was verified");
  return r;
}

Result<JpegFeedBenchResult> RunJpegFeedBench(const JpegFeedBenchOptions& o) {
  JpegFeedBenchResult r;
  auto placed = PlaceDecode(o.where, /*feed_on_gpu=*/true, o.device);
  if (!placed.ok()) return placed.status().WithContext("--decode gpu");
  const bool defer = placed->defer;
  // Runs `epochs` epochs with the JPEGs decoded on the GPU (defer) or in
  // the loader; verifies each.
  auto run = [&](bool gpu_decode, std::vector<JpegFeedEpoch>* out) -> Status {
    LoaderOptions lo = o.loader;
    lo.defer_decode = gpu_decode;
    lo.balance_decode = gpu_decode && placed->balance;
    lo.pin_memory = true;
    auto opened = OpenBenchSource(o.data, "", lo, "", "bench-loader", {}, o.decode);
    if (!opened.ok()) return opened.status();
    const EncodedImageSource* enc = (*opened)->encoded();
    if (enc == nullptr) return Status::InvalidArgument(o.data + ": --decode needs an encoded image dataset");
    int64_t want_sum = 0;
    for (int64_t l : enc->labels()) want_sum += l;
    const uint64_t n = enc->num_samples();
    BatchSource& loader = (*opened)->source();
    FeedOptions fo;
    fo.device = o.device;
    fo.dtype = DType::kBFloat16;
    fo.layout = Layout::kNHWC;
    fo.input_layout = o.decode.layout == "NHWC" ? Layout::kNHWC : Layout::kNCHW;
    fo.skip_corrupt = o.decode.skip_corrupt;
    std::vector<int64_t> labels(loader.info().batch_size);
    for (int ep = 0; ep < std::max(1, o.epochs); ++ep) {
      GpuFeeder feeder(loader, fo, static_cast<uint64_t>(ep));
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t samples = 0;
      int64_t sum = 0;
      for (;;) {
        auto b = feeder.Next();
        if (!b.ok()) return b.status();
        if (!*b) break;
        // Waits for the batch (a consumer that uses it), and checks it.
        GPUFEED_RETURN_IF_ERROR(feeder.CopyToHost(**b, nullptr, labels.data()));
        for (int i = 0; i < (*b)->size(); ++i) sum += labels[static_cast<size_t>(i)];
        samples += static_cast<uint64_t>((*b)->size());
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (samples != n || sum != want_sum) {
        return Status::Internal(o.data + ": epoch " + std::to_string(ep) + " delivered " + std::to_string(samples) +
                                " samples with labels summing to " + std::to_string(sum) + "; the file has " +
                                std::to_string(n) + " summing to " + std::to_string(want_sum));
      }
      r.verified_samples += samples;
      out->push_back({sec, samples});
      if (gpu_decode || !defer) {
        r.stats = feeder.stats();
        r.loader_stats = feeder.loader_stats();
      }
    }
    return Status::Ok();
  };
  r.decode = placed->Describe();
  GPUFEED_RETURN_IF_ERROR(run(defer, &r.epochs));
  if (defer) GPUFEED_RETURN_IF_ERROR(run(false, &r.cpu_epochs));
  return r;
}

}  // namespace gpufeed::bench
