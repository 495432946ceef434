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

#include "bench/bench_checks.h"
#include "bench/loader_bench.h"
#include "gpufeed/dataset.h"

namespace gpufeed::bench {

Result<FeedSampleSpec> FeedSpecFor(const BatchSourceInfo& info, const FeedOptions& f) {
  if (info.dtype != DType::kUInt8 || info.sample_shape.size() != 3) {
    return Status::InvalidArgument("bench feed checks uint8 images [C,H,W] or [H,W,C] (a `bench gen` file)");
  }
  FeedSampleSpec s;
  const bool chw = f.input_layout == Layout::kNCHW;
  s.channels = static_cast<int>(info.sample_shape[chw ? 0 : 2]);
  s.height = static_cast<int>(info.sample_shape[chw ? 1 : 0]);
  s.width = static_cast<int>(info.sample_shape[chw ? 2 : 1]);
  s.in_layout = f.input_layout;
  s.out_layout = f.layout;
  s.dtype = f.dtype;
  s.crop_padding = f.crop_padding;
  s.flip = f.flip;
  // The normalization the feed applies (FeedOptions::mean): the options',
  // else the dataset's attributes, else x / 255.
  std::vector<double> mean = f.mean, sd = f.stddev;
  const size_t c = static_cast<size_t>(s.channels);
  if (mean.empty() && sd.empty() && info.mean.size() == c && info.stddev.size() == c) {
    mean = info.mean;
    sd = info.stddev;
    for (double& v : sd) v = v > 0 ? v : 1.0;
  }
  for (size_t k = 0; k < c; ++k) {
    s.mean.push_back(static_cast<float>(mean.empty() ? 0.0 : mean[k]));
    s.inv_std.push_back(static_cast<float>(1.0 / (sd.empty() ? 255.0 : sd[k])));
  }
  return s;
}

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
  const BatchSourceInfo& info = loader.info();
  if (loader.sharding().world_size != 1) {
    return Status::Unsupported(o.data + ": bench feed verifies a whole epoch of one rank; this stream is rank " +
                               std::to_string(loader.sharding().rank) + " of " +
                               std::to_string(loader.sharding().world_size));
  }
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
  auto spec = FeedSpecFor(info, o.feed);
  if (!spec.ok()) return spec.status().WithContext(o.data);
  const uint64_t sb = ds->sample_bytes(), n = ds->num_samples(), out_sb = spec->out_sample_bytes();
  const std::vector<int64_t>& file_labels = ds->labels();
  // Every epoch runs the options asked for and is timed; the last is
  // reported. Each is verified twice over:
  //  - the timed run itself, from the rows' indices (DeviceBatch::indices(),
  //    host metadata: no copy, no wait): its fresh passes deliver every index
  //    once, each echo pass is a permutation of its upload, and the counts
  //    equal the feed's statistics;
  //  - an untimed re-run of the same epoch (the feed's output is a function
  //    of seed, epoch and batch), whose fresh batches must list the timed
  //    run's indices in the same order: every row's label is compared with
  //    the file's, and one row of every batch (a different position each
  //    batch) with an independent CPU reference of the transform from the
  //    file's bytes (CheckFeedSample). Copying every batch back would be
  //    timed otherwise.
  std::vector<std::byte> img, want(sb);
  std::vector<int64_t> labels(info.batch_size);
  for (int ep = 0; ep < std::max(1, o.epochs); ++ep) {
    const uint64_t epoch = 100 + static_cast<uint64_t>(ep);
    const std::string what = o.data + ", epoch " + std::to_string(epoch);
    std::vector<uint64_t> fresh_order;  // the fresh rows' indices, in delivery order
    uint64_t echoed = 0;
    IndexTally tally(n);
    {
      GpuFeeder feeder(loader, o.feed, epoch);
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<DeviceBatch> last;
      struct Delivered {
        uint64_t upload;
        int pass;
        std::vector<uint64_t> indices;
      };
      std::vector<Delivered> batches;  // checked after the clock
      for (;;) {
        auto b = feeder.Next();
        if (!b.ok()) return b.status();
        if (!*b) break;
        const auto idx = (*b)->indices();
        batches.push_back({(*b)->upload(), (*b)->pass(), std::vector<uint64_t>(idx.begin(), idx.end())});
        last = std::move(**b);  // releases the previous one
      }
      if (last) GPUFEED_RETURN_IF_ERROR(feeder.CopyToHost(*last, nullptr, nullptr));  // wait for the GPU
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.stats = feeder.stats();
      // Auto echo (0) starts at 1 while it measures: each upload is then
      // checked for permutations, not for the final factor's count.
      EchoCheck echo(o.feed.echo > 0 ? r.stats.echo : 4, /*exact=*/o.feed.echo > 0);
      for (const auto& [upload, pass, idx] : batches) {
        GPUFEED_RETURN_IF_ERROR(echo.Add(upload, pass, idx).WithContext(what));
        if (pass == 0) {
          GPUFEED_RETURN_IF_ERROR(tally.Add(idx).WithContext(what));
          fresh_order.insert(fresh_order.end(), idx.begin(), idx.end());
        } else {
          echoed += idx.size();
        }
      }
      GPUFEED_RETURN_IF_ERROR(echo.Finish().WithContext(what));
    }
    GPUFEED_RETURN_IF_ERROR(CheckCoverage(tally, {Coverage::kEveryIndexOnce}, what + ", fresh passes"));
    if (r.stats.fresh_samples != tally.delivered() || r.stats.echoed_samples != echoed) {
      return Status::Corrupt(what + ": the feed counted " + std::to_string(r.stats.fresh_samples) + " fresh and " +
                             std::to_string(r.stats.echoed_samples) + " echoed samples, its batches held " +
                             std::to_string(tally.delivered()) + " and " + std::to_string(echoed));
    }
    r.timed_samples = tally.delivered() + echoed;
    r.verified_samples += r.timed_samples;
    // The re-run, untimed.
    FeedOptions fv = o.feed;
    GpuFeeder feeder(loader, fv, epoch);
    uint64_t fresh_seen = 0, k = 0;
    for (;;) {
      auto b = feeder.Next();
      if (!b.ok()) return b.status();
      if (!*b) break;
      const DeviceBatch& batch = **b;
      const auto idx = batch.indices();
      if (batch.pass() == 0) {
        for (uint64_t i : idx) {
          if (fresh_seen >= fresh_order.size() || fresh_order[fresh_seen++] != i) {
            return Status::Corrupt(what + ": the verifying re-run's fresh batches differ from the timed run's at row " +
                                   std::to_string(fresh_seen - 1) + " (the feed is not reproducible)");
          }
        }
      }
      img.resize(static_cast<size_t>(batch.size()) * out_sb);
      GPUFEED_RETURN_IF_ERROR(feeder.CopyToHost(batch, img.data(), labels.data()));
      for (int i = 0; i < batch.size(); ++i) {
        const uint64_t id = idx[static_cast<size_t>(i)];
        if (id >= n) return Status::Corrupt(what + ": a row carries index " + std::to_string(id));
        if (!file_labels.empty() && labels[static_cast<size_t>(i)] != file_labels[id]) {
          return Status::Corrupt(what + ": sample " + std::to_string(id) + " reached the GPU with label " +
                                 std::to_string(labels[static_cast<size_t>(i)]) + ", the file has " +
                                 std::to_string(file_labels[id]));
        }
      }
      const int row = static_cast<int>((k++ * 7919) % static_cast<uint64_t>(batch.size()));
      const uint64_t id = idx[static_cast<size_t>(row)];
      GPUFEED_RETURN_IF_ERROR(ds->ReadSamples(id, 1, want));
      GPUFEED_RETURN_IF_ERROR(CheckFeedSample(*spec, reinterpret_cast<const uint8_t*>(want.data()),
                                              img.data() + static_cast<size_t>(row) * out_sb,
                                              what + ", batch " + std::to_string(batch.index()) + ", sample " +
                                                  std::to_string(id) + " (pass " + std::to_string(batch.pass()) + ")"));
      ++r.values_checked;
      r.labels_checked += static_cast<uint64_t>(batch.size());
    }
    if (fresh_seen != fresh_order.size()) {
      return Status::Corrupt(what + ": the verifying re-run delivered " + std::to_string(fresh_seen) +
                             " fresh samples, the timed run " + std::to_string(fresh_order.size()));
    }
    ++r.epochs_verified;
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
    const std::vector<int64_t>& file_labels = enc->labels();
    const uint64_t n = enc->num_samples();
    BatchSource& loader = (*opened)->source();
    FeedOptions fo;
    fo.device = o.device;
    fo.dtype = DType::kBFloat16;
    fo.layout = Layout::kNHWC;
    fo.input_layout = LayoutOr(o.decode.layout, Layout::kNCHW);
    fo.skip_corrupt = o.decode.skip_corrupt;
    auto spec = FeedSpecFor(loader.info(), fo);
    if (!spec.ok()) return spec.status().WithContext(o.data);
    const uint64_t out_sb = spec->out_sample_bytes(), sb = loader.info().sample_bytes;
    std::vector<int64_t> labels(loader.info().batch_size);
    std::vector<std::byte> img;
    std::vector<uint8_t> stored, reference(sb);
    for (int ep = 0; ep < std::max(1, o.epochs); ++ep) {
      const uint64_t epoch = static_cast<uint64_t>(ep);
      const std::string what =
          o.data + ", epoch " + std::to_string(epoch) + (gpu_decode ? " (" + r.decode + ")" : " (the loader's decode)");
      GpuFeeder feeder(loader, fo, epoch);
      IndexTally tally(n);
      const auto t0 = std::chrono::steady_clock::now();
      for (uint64_t k = 0;; ++k) {
        auto b = feeder.Next();
        if (!b.ok()) return b.status();
        if (!*b) break;
        const DeviceBatch& batch = **b;
        const auto idx = batch.indices();
        GPUFEED_RETURN_IF_ERROR(tally.Add(idx).WithContext(what));
        // Waits for the batch (a consumer that uses it), and checks it;
        // every 16th batch's images come back too (timed: about 1/16 of a
        // copy of the epoch).
        const bool pixels = !fo.skip_corrupt && k % 16 == 0;
        img.resize(pixels ? static_cast<size_t>(batch.size()) * out_sb : 0);
        GPUFEED_RETURN_IF_ERROR(feeder.CopyToHost(batch, pixels ? img.data() : nullptr, labels.data()));
        for (int i = 0; i < batch.size() && !fo.skip_corrupt; ++i) {
          const uint64_t id = idx[static_cast<size_t>(i)];
          if (labels[static_cast<size_t>(i)] != file_labels[id]) {
            return Status::Corrupt(what + ": sample " + std::to_string(id) + " arrived with label " +
                                   std::to_string(labels[static_cast<size_t>(i)]) + ", the file has " +
                                   std::to_string(file_labels[id]));
          }
        }
        if (pixels) {
          const int row = static_cast<int>((k / 16 * 7919) % static_cast<uint64_t>(batch.size()));
          const uint64_t id = idx[static_cast<size_t>(row)];
          GPUFEED_RETURN_IF_ERROR(enc->ReadEncoded(id, &stored));
          GPUFEED_RETURN_IF_ERROR(DecodeImage(stored, o.decode, o.loader.seed, epoch, id, reference.data()));
          double levels = 0;
          GPUFEED_RETURN_IF_ERROR(CheckDecodedSample(*spec, reference.data(),
                                                     img.data() + static_cast<size_t>(row) * out_sb, kJpegMeanLevels,
                                                     what + ", sample " + std::to_string(id), &levels));
          r.worst_mean_levels = std::max(r.worst_mean_levels, levels);
          ++r.pixels_checked;
        }
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      GPUFEED_RETURN_IF_ERROR(CheckCoverage(tally, {Coverage::kEveryIndexOnce}, what));
      r.verified_samples += tally.delivered();
      out->push_back({sec, tally.delivered()});
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
