// `gpufeed bench ...`: benchmarks that verify what they read before timing.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <nlohmann/json.hpp>

#include "bench/gpu_bench.h"
#include "bench/jpeg_workload.h"
#include "bench/loader_bench.h"
#include "bench/order_stats.h"
#include "bench/read_bench.h"
#include "bench/sci_workloads.h"
#include "bench/serve_bench.h"
#include "bench/synthetic_source.h"
#include "cli/progress.h"
#include "cli/commands.h"
#include "gpufeed/device.h"
#include "gpufeed/gpu_feed.h"

namespace gpufeed::cli {
namespace {

int RunReadBenchCmd(const bench::ReadBenchOptions& o, bool json) {
  auto r = bench::RunReadBench(o);
  if (!r.ok()) {
    std::fprintf(stderr, "gpufeed bench read: FAILED: %s\n", r.status().ToString().c_str());
    return 1;
  }
  if (json) {
    nlohmann::json j = {{"data", o.data},
                        {"read_path", r->read_path},
                        {"samples", r->samples},
                        {"threads", r->threads},
                        {"raw_bytes", r->raw_bytes},
                        {"stored_bytes", r->stored_bytes},
                        {"direct_seconds", r->direct_seconds},
                        {"direct_samples_per_s", r->direct_samples_per_s()},
                        {"direct_gb_per_s", r->direct_gb_per_s()},
                        {"direct_one_thread_seconds", r->direct_one_thread_seconds},
                        {"baseline", "hdf5 H5Dread, 1 thread, tuned chunk cache"},
                        {"baseline_seconds", r->baseline_seconds},
                        {"baseline_samples_per_s", r->baseline_samples_per_s()},
                        {"speedup", r->speedup()},
                        {"speedup_threads", r->threads},
                        {"one_thread_speedup", r->one_thread_speedup()},
                        {"repeats", o.repeats},
                        {"verified", true},
                        {"verified_passes", r->verified_passes},
                        {"checksum", r->checksum}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "read %s: %llu samples, %.1f MB decoded from %.1f MB stored; every sample's hash of all %d passes (timed "
      "ones included) equal to HDF5's; medians of %d passes\n",
      o.data.c_str(), static_cast<unsigned long long>(r->samples), r->raw_bytes / 1e6, r->stored_bytes / 1e6,
      r->verified_passes, std::max(1, o.repeats));
  std::printf("  gpufeed %s path, %d threads: %10.0f samples/s  %6.2f GB/s\n", r->read_path.c_str(), r->threads,
              r->direct_samples_per_s(), r->direct_gb_per_s());
  std::printf("  gpufeed %s path, 1 thread:  %10.0f samples/s  %6.2f GB/s\n", r->read_path.c_str(),
              r->samples / r->direct_one_thread_seconds, r->raw_bytes / r->direct_one_thread_seconds / 1e9);
  std::printf("  HDF5 H5Dread, 1 thread:        %10.0f samples/s  %6.2f GB/s\n", r->baseline_samples_per_s(),
              r->raw_bytes / r->baseline_seconds / 1e9);
  std::printf("  ratio, 1 thread vs 1 thread: %.2fx; gpufeed on %d threads vs HDF5 on 1: %.2fx\n",
              r->one_thread_speedup(), r->threads, r->speedup());
  return 0;
}

struct LoaderArgs {
  bench::LoaderBenchOptions bench;
  DecodeArgs decode;
  std::string where;  // --decode: "" (the loader alone), auto, cpu, gpu
  std::string order = "block";
  bool json = false;
};

// bench loader --decode: the loader and the feed, JPEGs decoded where asked,
// against the loader's CPU decode in the same run.
int RunJpegFeedBenchCmd(LoaderArgs& a) {
  auto where = DecodeDeviceFromName(a.where);
  if (!where.ok()) {
    std::fprintf(stderr, "gpufeed bench loader: --decode %s\n", where.status().message().c_str());
    return 2;
  }
  bench::JpegFeedBenchOptions o;
  o.data = a.bench.data;
  o.loader = a.bench.loader;
  o.decode = a.bench.decode;
  o.where = *where;
  o.epochs = a.bench.epochs;
  auto r = bench::RunJpegFeedBench(o);
  if (!r.ok()) {
    std::fprintf(stderr, "gpufeed bench loader: FAILED: %s\n", r.status().ToString().c_str());
    return 1;
  }
  auto rates = [](const std::vector<bench::JpegFeedEpoch>& es) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : es) j.push_back(e.samples_per_s());
    return j;
  };
  const FeedStats& s = r->stats;
  const LoaderStats& ls = r->loader_stats;
  if (a.json) {
    std::printf("%s\n", nlohmann::json({{"data", o.data},
                                        {"decode", r->decode},
                                        {"threads", o.loader.threads},
                                        {"samples_per_s", rates(r->epochs)},
                                        {"cpu_decode_samples_per_s", rates(r->cpu_epochs)},
                                        {"decoder", s.decoder},
                                        {"decoded_on_device", s.decoded_on_device},
                                        {"decoded_by_loader", s.decoded_by_loader},
                                        {"decode_fallbacks", s.decode_fallbacks},
                                        {"decode_host_seconds", s.decode_seconds},
                                        {"loader_host_decode_reason", ls.host_decode_reason},
                                        {"loader_balanced_samples", ls.balanced_samples},
                                        {"loader_host_decode_share", ls.host_decode_share},
                                        {"data_wait_s", s.data_wait_seconds},
                                        {"verified_samples", r->verified_samples},
                                        {"pixels_checked", r->pixels_checked},
                                        {"pixel_tolerance_mean_levels", bench::kJpegMeanLevels},
                                        {"worst_mean_levels", r->worst_mean_levels}})
                            .dump(2)
                            .c_str());
    return 0;
  }
  std::printf("bench loader --decode %s: %s, %d loader threads, bf16 NHWC %s\n", a.where.c_str(), r->decode.c_str(),
              o.loader.threads, s.on_gpu ? "on the GPU" : "on the feed's CPU twins (no GPU here)");
  for (size_t e = 0; e < r->epochs.size(); ++e) {
    std::printf("  epoch %zu: %.0f samples/s", e + 1, r->epochs[e].samples_per_s());
    if (e < r->cpu_epochs.size()) {
      std::printf("   (the loader's CPU decode, same threads, same run: %.0f samples/s; %.2fx)",
                  r->cpu_epochs[e].samples_per_s(), r->epochs[e].samples_per_s() / r->cpu_epochs[e].samples_per_s());
    }
    std::printf("\n");
  }
  if (!s.decoder.empty()) {
    const double total = double(s.decoded_on_device + s.decoded_by_loader + s.decode_fallbacks);
    std::printf(
        "  split (last epoch): %s %llu (%.1f%%), the loader's threads %llu (%.1f%%%s%s), host fallback %llu; "
        "decode stage host time %.2f s; feed waited on the loader %.2f s\n",
        s.decoder.c_str(), (unsigned long long)s.decoded_on_device, 100 * s.decoded_on_device / total,
        (unsigned long long)s.decoded_by_loader, 100 * s.decoded_by_loader / total,
        ls.host_decode_reason.empty() ? "" : ": last because ", ls.host_decode_reason.c_str(),
        (unsigned long long)s.decode_fallbacks, s.decode_seconds, s.data_wait_seconds);
    if (ls.balanced_samples > 0) {
      std::printf("  of the loader's, %llu by the measured share (last batch's share %.3f of what the engine takes)\n",
                  (unsigned long long)ls.balanced_samples, ls.host_decode_share);
    }
  }
  std::printf(
      "  %llu samples verified as timed (every epoch of both decodes: every index once, each label equal to the "
      "file's); %llu samples' pixels (one of every 16th batch) within %.1f levels of 255 on average of the CPU "
      "decode of the same sample (worst %.2f)\n",
      (unsigned long long)r->verified_samples, (unsigned long long)r->pixels_checked, bench::kJpegMeanLevels,
      r->worst_mean_levels);
  return 0;
}

// bench loader's figures and checks as JSON (--json).
void PrintLoaderBenchJson(const LoaderArgs& a, const bench::LoaderBenchResult& r, const LoaderOptions& lo) {
  const LoaderStats& s = r.stats;
  nlohmann::json j = {
      {"data", a.bench.data}, {"order", a.order}, {"threads", lo.threads}, {"batch_size", lo.batch_size},
      {"prefetch", lo.prefetch}, {"cache_bytes", lo.cache_bytes}, {"shuffle_window", lo.shuffle_window},
      {"samples", r.samples}, {"seconds", r.seconds}, {"samples_per_s", r.samples_per_s()},
      {"gb_per_s", r.gb_per_s()}, {"epochs", a.bench.epochs}, {"first_epoch_seconds", r.first_epoch_seconds},
      {"open_seconds", r.open_seconds}, {"first_epoch_first_batch_seconds", r.first_epoch_first_batch_seconds},
      {"first_batch_seconds", r.first_batch_seconds}, {"full_epoch", r.full_epoch}, {"spot_checked", r.spot_checked},
      {"verified", true}, {"coverage", r.coverage}, {"checksum_checked", r.checksum_checked},
      {"world_size", lo.world_size}, {"rank", lo.rank}, {"bytes_verified", r.bytes_verified},
      {"encoded", r.encoded}, {"stored_bytes", r.stored_bytes}, {"skipped", r.skipped},
      {"decode_one_core_per_s", r.decode_one_core_per_s},
      {"transform_one_core_per_s", r.transform_one_core_per_s},
      {"parallel_decode_per_s", r.parallel_decode_per_s},
      {"ceiling_per_s", r.ceiling_per_s(lo.threads)},
      {"ratio_to_ceiling", r.ceiling_per_s(lo.threads) > 0 ? r.samples_per_s() / r.ceiling_per_s(lo.threads) : 0.0},
      {"stages", {{"plan_s", s.plan_seconds}, {"fetch_decode_s", s.fetch_seconds},
                  {"assemble_s", s.assemble_seconds}, {"consumer_wait_s", s.consumer_wait_seconds}}},
      {"mean_queue_depth", s.mean_queue_depth()},
      {"per_epoch", [&] {
         nlohmann::json arr = nlohmann::json::array();
         for (const bench::LoaderBenchEpoch& e : r.epochs) {
           arr.push_back({{"epoch", e.epoch}, {"samples", e.samples}, {"seconds", e.seconds},
                          {"samples_per_s", e.seconds > 0 ? e.samples / e.seconds : 0.0},
                          {"chunk_reads", e.stats.chunk_reads}, {"chunk_reads_ahead", e.stats.chunk_reads_ahead},
                          {"hit_rate", e.stats.hit_rate()}, {"bytes_decoded", e.stats.bytes_decoded},
                          {"minor_faults", e.stats.minor_faults}, {"major_faults", e.stats.major_faults},
                          {"chunk_bytes_mapped", e.stats.chunk_bytes_mapped},
                          {"chunk_bytes_held", e.stats.chunk_bytes_held}});
         }
         return arr;
       }()},
      {"max_rss_bytes", r.max_rss_bytes}, {"rss_before_bytes", r.rss_before_bytes},
      {"memory_bound_bytes", r.memory_bound_bytes},
      {"cold", a.bench.cold ? nlohmann::json{{"file", r.file}, {"file_bytes", r.file_bytes}, {"io", r.io},
                                             {"io_note", r.io_note}, {"ceiling_gb_per_s", r.ceiling_gb_per_s}, {"ceiling_runs_gb_per_s", r.ceiling_runs_gb_per_s},
                                             {"ceiling_note", r.ceiling_note}, {"epochs", [&] {
                                               nlohmann::json arr = nlohmann::json::array();
                                               for (const bench::LoaderBenchEpoch& e : r.epochs) {
                                                 arr.push_back({{"resident_before", e.resident_before},
                                                                {"resident_after", e.resident_after},
                                                                {"bytes_read", e.stats.bytes_read},
                                                                {"seconds", e.seconds}});
                                               }
                                               return arr;
                                             }()}}
                            : nlohmann::json(nullptr)},
      {"cache", {{"chunk_reads", s.chunk_reads}, {"hits", s.chunk_hits}, {"misses", s.chunk_misses},
                 {"prefetched", s.prefetched}, {"hit_rate", s.hit_rate()},
                 {"read_amplification", s.read_amplification()}, {"bytes_read", s.bytes_read},
                 {"bytes_decoded", s.bytes_decoded}}}};
  std::printf("%s\n", j.dump(2).c_str());
}

// bench loader's figures and checks as text.
void PrintLoaderBenchText(const LoaderArgs& a, const bench::LoaderBenchResult& r, const LoaderOptions& lo) {
  const LoaderStats& s = r.stats;
  std::printf("loader %s: order %s, %d threads, batch %llu, prefetch %d, cache %.0f MiB, window %llu\n",
              a.bench.data.c_str(), a.order.c_str(), lo.threads, static_cast<unsigned long long>(lo.batch_size),
              lo.prefetch, lo.cache_bytes / 1048576.0, static_cast<unsigned long long>(lo.shuffle_window));
  if (r.encoded) {
    std::printf("  encoded images decoded in the loader: %s to %ux%u %s, %.1f MB of files (%.0f KB a sample)%s\n",
                std::string(ImageTransformName(a.bench.decode.transform)).c_str(), a.bench.decode.height,
                a.bench.decode.width, a.bench.decode.layout.c_str(), r.stored_bytes / 1e6,
                r.samples ? r.stored_bytes / 1e3 / r.samples : 0.0,
                r.skipped ? (", " + std::to_string(r.skipped) + " corrupt samples replaced").c_str() : "");
  }
  if (r.encoded) {
    const double ceiling = r.ceiling_per_s(lo.threads);
    std::printf(
        "  ceiling (same run): libjpeg-turbo full-size decode %.0f samples/s on one core (%llu samples) x %d "
        "threads = %.0f samples/s; the loader's last epoch is %.2fx of it\n",
        r.decode_one_core_per_s, static_cast<unsigned long long>(r.ceiling_samples), lo.threads, ceiling,
        ceiling > 0 ? r.samples_per_s() / ceiling : 0.0);
    std::printf(
        "  full-size decode on %d threads at once (same run, after the epochs): %.0f samples/s; the loader is "
        "%.2fx of it\n",
        lo.threads, r.parallel_decode_per_s,
        r.parallel_decode_per_s > 0 ? r.samples_per_s() / r.parallel_decode_per_s : 0.0);
    std::printf("  one core, same files, interleaved: decode + %s %.0f samples/s vs full-size decode %.0f: %.2fx\n",
                std::string(ImageTransformName(a.bench.decode.transform)).c_str(), r.transform_one_core_per_s,
                r.decode_one_core_per_s,
                r.decode_one_core_per_s > 0 ? r.transform_one_core_per_s / r.decode_one_core_per_s : 0.0);
  }
  const char* checksum = r.checksum_checked ? ", index/label checksum equal to the file's" : "";
  if (r.bytes_verified) {
    std::printf("  verified every epoch: %s, %s%s, labels equal, %llu samples' bytes compared\n",
                r.full_epoch ? "full epoch" : "partial epoch", r.coverage.c_str(), checksum,
                static_cast<unsigned long long>(r.spot_checked));
  } else {
    std::printf(
        "  verified every epoch: %s, %s%s (the daemon's file is not readable here: "
        "labels and bytes not compared)\n",
        r.full_epoch ? "full epoch" : "partial epoch", r.coverage.c_str(), checksum);
  }
  for (const bench::LoaderBenchEpoch& e : r.epochs) {
    std::printf(
        "  epoch %llu: %.0f samples/s, %llu chunk reads (+%llu ahead for the next), hit rate %.3f, "
        "%.1f MB decoded, %llu minor / %llu major page faults, %.1f MB of chunk buffers mapped (%.1f MB held)\n",
        static_cast<unsigned long long>(e.epoch), e.seconds > 0 ? e.samples / e.seconds : 0.0,
        static_cast<unsigned long long>(e.stats.chunk_reads),
        static_cast<unsigned long long>(e.stats.chunk_reads_ahead), e.stats.hit_rate(), e.stats.bytes_decoded / 1e6,
        static_cast<unsigned long long>(e.stats.minor_faults), static_cast<unsigned long long>(e.stats.major_faults),
        e.stats.chunk_bytes_mapped / 1e6, e.stats.chunk_bytes_held / 1e6);
  }
  if (a.bench.cold) {
    std::printf("  cold: %s (%.2f GB), I/O %s%s%s%s; O_DIRECT sequential ceiling ", r.file.c_str(), r.file_bytes / 1e9,
                r.io.c_str(), r.io_note.empty() ? "" : " (", r.io_note.c_str(), r.io_note.empty() ? "" : ")");
    if (r.ceiling_gb_per_s > 0) {
      std::printf("%.2f GB/s (runs before / after the epochs: %.2f / %.2f)\n", r.ceiling_gb_per_s,
                  r.ceiling_runs_gb_per_s.at(0), r.ceiling_runs_gb_per_s.at(1));
    } else {
      std::printf("not measured (%s)\n", r.ceiling_note.c_str());
    }
    for (const bench::LoaderBenchEpoch& e : r.epochs) {
      const double file_gbs = e.seconds > 0 ? e.stats.bytes_read / e.seconds / 1e9 : 0;
      const double delivered_gbs = e.seconds > 0 ? e.samples * double(r.sample_bytes) / e.seconds / 1e9 : 0;
      std::printf(
          "  cold epoch %llu: in page cache %.1f%% at start, %.1f%% at end; file read at %.2f GB/s, "
          "samples delivered at %.2f GB/s",
          static_cast<unsigned long long>(e.epoch), 100 * e.resident_before, 100 * e.resident_after, file_gbs,
          delivered_gbs);
      if (r.ceiling_gb_per_s > 0) {
        std::printf(" (%.2f and %.2f of the ceiling)", file_gbs / r.ceiling_gb_per_s,
                    delivered_gbs / r.ceiling_gb_per_s);
      }
      std::printf("\n");
    }
  }
  std::printf(
      "  last of %d epochs: %llu samples in %.3f s: %.0f samples/s, %.2f GB/s (first batch after %.3f s; "
      "the first epoch took %.3f s)\n",
      a.bench.epochs, static_cast<unsigned long long>(r.samples), r.seconds, r.samples_per_s(), r.gb_per_s(),
      r.first_batch_seconds, r.first_epoch_seconds);
  std::printf(
      "  stages (busy s, summed over threads): plan %.3f, fetch+decode %.3f, assemble %.3f; consumer waited %.3f s; "
      "mean ready queue %.1f\n",
      s.plan_seconds, s.fetch_seconds, s.assemble_seconds, s.consumer_wait_seconds, s.mean_queue_depth());
  std::printf("  memory: peak RSS %.0f MiB, %.0f MiB of it before the loader existed; loader bound %.0f MiB\n",
              r.max_rss_bytes / 1048576.0, r.rss_before_bytes / 1048576.0, r.memory_bound_bytes / 1048576.0);
  std::printf("  cache: %llu chunk reads, hit rate %.3f, %llu prefetched, read amplification %.2f\n",
              static_cast<unsigned long long>(s.chunk_reads), s.hit_rate(),
              static_cast<unsigned long long>(s.prefetched), s.read_amplification());
  if (s.source_opens > 0) {
    std::printf(
        "  files: %llu opened (%llu from the probe's plan, without HDF5) in %.3f s, probed in %.3f s (since the source "
        "was opened; summed over threads); the data opened in %.3f s, the first epoch's first batch %.3f s after\n",
        static_cast<unsigned long long>(s.source_opens), static_cast<unsigned long long>(s.source_planned_opens),
        s.source_open_seconds, s.source_probe_seconds, r.open_seconds, r.first_epoch_first_batch_seconds);
  }
}

int RunLoaderBenchCmd(LoaderArgs& a) {
  auto order = OrderFromName(a.order);
  if (!order.ok()) {
    std::fprintf(stderr, "gpufeed bench loader: %s\n", order.status().message().c_str());
    return 2;
  }
  a.bench.loader.order = *order;
  auto decode = ParseDecodeArgs(a.decode);
  if (!decode.ok()) {
    std::fprintf(stderr, "gpufeed bench loader: %s\n", decode.status().message().c_str());
    return 2;
  }
  a.bench.decode = *decode;
  if (!a.where.empty()) return RunJpegFeedBenchCmd(a);
  auto r = bench::RunLoaderBench(a.bench);
  if (!r.ok()) {
    std::fprintf(stderr, "gpufeed bench loader: FAILED: %s\n", r.status().ToString().c_str());
    return 1;
  }
  for (const std::string& w : r->warnings) std::fprintf(stderr, "gpufeed bench loader: warning: %s\n", w.c_str());
  LoaderOptions lo = a.bench.loader;
  lo.batch_size = r->batch_size;
  if (a.json) {
    PrintLoaderBenchJson(a, *r, lo);
    return 0;
  }
  PrintLoaderBenchText(a, *r, lo);
  return 0;
}

struct GenArgs {
  std::string workload = "celeba-deflate", output;
  uint64_t samples = 20000, seed = 1, scale = 1, per_file = 16;
  bool samples_set = false;
  int threads = 0;
};

int RunSciGen(const GenArgs& a) {
  bench::SciGenOptions o;
  o.workload = a.workload;
  o.output = a.output;
  o.samples = a.samples_set ? a.samples : 64;
  o.scale = a.scale;
  o.per_file = a.per_file;
  o.seed = a.seed;
  o.threads = a.threads;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = bench::GenerateSciWorkload(o);
  if (!r.ok()) {
    std::fprintf(stderr, "gpufeed bench gen: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "wrote %s/: %s, %llu samples in %llu files, %.1f MB raw, %.1f MB of files (%.2fx), %.1f s\n"
      "read it with: --data '%s/*.h5' %s\n",
      a.output.c_str(), a.workload.c_str(), static_cast<unsigned long long>(r->samples),
      static_cast<unsigned long long>(r->files), r->raw_bytes / 1e6, r->file_bytes / 1e6,
      static_cast<double>(r->raw_bytes) / std::max<uint64_t>(1, r->file_bytes),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), a.output.c_str(),
      r->fields.c_str());
  return 0;
}

int RunJpegGen(const GenArgs& a) {
  bench::JpegGenOptions o;
  o.output = a.output;
  o.samples = a.samples;
  o.seed = a.seed;
  o.threads = a.threads;
  Progress progress("gen " + a.workload);
  o.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto s = bench::GenImagenetJpeg(o);
  progress.Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "gpufeed bench gen: %s\n", s.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "wrote %s: imagenet-jpeg, %llu JPEGs (quality 90, 400..500 x 350..375), %.1f MB of files, "
      "%.1f KB a file, %.1f MB file; the same files as a folder in %s\n",
      a.output.c_str(), static_cast<unsigned long long>(s->samples), s->file_bytes / 1e6,
      s->file_bytes / 1e3 / std::max<uint64_t>(1, s->samples), s->convert.output_bytes / 1e6, s->folder.c_str());
  return 0;
}

int RunGen(const GenArgs& a) {
  if (bench::IsSciWorkload(a.workload)) return RunSciGen(a);
  if (a.workload == "imagenet-jpeg") return RunJpegGen(a);
  ConvertOptions o;
  if (Status s = bench::WorkloadWriteOptions(a.workload, &o.write); !s.ok()) {
    std::fprintf(stderr, "gpufeed bench gen: %s\n", s.message().c_str());
    return 2;
  }
  o.threads = a.threads;
  Progress progress("gen " + a.workload);
  o.progress = [&](uint64_t done, uint64_t total) { progress.Update(done, total); };
  auto source = bench::MakeCelebaLikeSource(a.samples, a.seed);
  auto s = Convert(*source, a.output, o);
  progress.Finish();
  if (!s.ok()) {
    std::fprintf(stderr, "gpufeed bench gen: %s\n", s.status().ToString().c_str());
    return 1;
  }
  std::printf("wrote %s: %s, %llu samples, %.1f MB raw, %.1f MB file (%.2fx), %.1f s\n", a.output.c_str(),
              a.workload.c_str(), static_cast<unsigned long long>(s->samples), s->raw_bytes / 1e6,
              s->output_bytes / 1e6, static_cast<double>(s->raw_bytes) / s->output_bytes, s->seconds);
  return 0;
}

// gpufeed bench read
void AddReadBench(CLI::App* parent, const std::shared_ptr<bool>& json, int* exit_code) {
  auto ro = std::make_shared<bench::ReadBenchOptions>();
  CLI::App* read = parent->add_subcommand(
      "read", "Decode every chunk: gpufeed's direct path on 1 and N threads vs HDF5 H5Dread on one, same run");
  read->add_option("--data", ro->data, "FILE.h5 or FILE.h5:/path")->required();
  read->add_option("--threads", ro->threads, "decode threads (default: all cores)");
  read->add_option("--repeats", ro->repeats, "timed passes of each path; the medians are reported");
  read->add_flag("--json", *json, "print as JSON");
  read->callback([ro, json, exit_code] { *exit_code = RunReadBenchCmd(*ro, *json); });
}

// gpufeed bench loader
void AddLoaderBench(CLI::App* parent, int* exit_code) {
  auto la = std::make_shared<LoaderArgs>();
  la->bench.loader.threads = static_cast<int>(std::thread::hardware_concurrency());
  la->bench.loader.pin_memory = false;  // no GPU consumer here
  CLI::App* lcmd = parent->add_subcommand(
      "loader", "Run the loader with a do-nothing consumer; verify every sample, then report throughput");
  lcmd->add_option("--data", la->bench.data,
                   "FILE.h5[:/path], many files ('dir/*.h5', a directory, a .txt list), or a daemon: unix:PATH | "
                   "tcp://HOST:PORT")
      ->required();
  lcmd->add_option("--field", la->bench.open.fields, "NAME=/hdf5/path: a named field (repeatable, in order)");
  AddTableOption(lcmd, "max_open_files", &la->bench.open.max_open_files);
  AddTableOption(lcmd, "no_sample_axis", &la->bench.open.no_sample_axis, "DeepCAM's reference files");
  lcmd->add_option("--dataset", la->bench.dataset,
                   "with a daemon --data: the dataset to read there (default: its first)");
  lcmd->add_option("--token-file", la->bench.token_file, "with a tcp:// daemon: its shared secret");
  AddTableOption(lcmd, "order", &la->order)->check(CLI::IsMember(NamesOf(kOrderNames)));
  AddTableOption(lcmd, "threads", &la->bench.loader.threads, "here the default is all cores");
  lcmd->add_option("--decode", la->where,
                   "encoded images: run the GPU feed too, JPEGs decoded by the GPU's decoder (gpu), the loader (cpu) "
                   "or the GPU where it has one (auto), against the loader's CPU decode in the same run")
      ->check(CLI::IsMember(NamesOf(kDecodeDeviceNames)));
  AddTableOption(lcmd, "batch_size", &la->bench.loader.batch_size);
  AddTableOption(lcmd, "prefetch", &la->bench.loader.prefetch);
  AddTableOption(lcmd, "pool_bytes", &la->bench.loader.pool_bytes);
  AddCacheBytesOption(lcmd, &la->bench.loader.cache_bytes, "decoded-chunk cache budget");
  AddTableOption(lcmd, "shuffle_window", &la->bench.loader.shuffle_window, "block order");
  AddTableOption(lcmd, "seed", &la->bench.loader.seed);
  lcmd->add_flag("--cold", la->bench.cold,
                 "drop the file from the page cache before each epoch (posix_fadvise, checked with mincore) and "
                 "measure the O_DIRECT sequential read ceiling of the same file in the same run");
  lcmd->add_option("--epoch", la->bench.epoch, "first epoch to run");
  lcmd->add_option("--epochs", la->bench.epochs, "epochs run back to back; the last one is reported (default 2)");
  lcmd->add_option("--batches", la->bench.batches, "stop after N batches (default: the epoch)");
  lcmd->add_option("--world-size", la->bench.loader.world_size,
                   "time one rank of this many (the other ranks run after the timed epochs, to check the union)")
      ->check(CLI::PositiveNumber);
  lcmd->add_option("--rank", la->bench.loader.rank, "the rank timed (default 0)")->check(CLI::NonNegativeNumber);
  lcmd->add_flag("--drop-last", la->bench.loader.drop_last, "ranks get whole batches of floor(N / world size)");
  AddDecodeOptions(lcmd, &la->decode, "random_resized_crop");
  lcmd->add_flag("--json,--stats", la->json, "print everything as JSON");
  lcmd->callback([la, exit_code] { *exit_code = RunLoaderBenchCmd(*la); });
}

// gpufeed bench order
void AddOrderBench(CLI::App* parent, int* exit_code) {
  struct OrderArgs {
    uint64_t samples = 20000, chunk = 100, seed = 1;
    std::vector<uint64_t> windows{1, 4, 16, 64, 200};
  };
  auto oa = std::make_shared<OrderArgs>();
  CLI::App* ocmd = parent->add_subcommand(
      "order", "How far apart one chunk's samples land in an epoch: block windows against random (no I/O)");
  ocmd->add_option("--samples", oa->samples, "N");
  ocmd->add_option("--chunk-samples", oa->chunk, "samples per chunk");
  ocmd->add_option("--windows", oa->windows, "shuffle windows (chunks) to measure")->delimiter(',');
  ocmd->add_option("--seed", oa->seed, "seed");
  ocmd->callback([oa, exit_code] {
    std::printf("N %llu, %llu samples a chunk; per chunk: span = (last - first position) / N, std of positions / N\n",
                static_cast<unsigned long long>(oa->samples), static_cast<unsigned long long>(oa->chunk));
    std::printf("  %-22s %8s %8s %14s\n", "order", "span", "std", "displacement");
    auto row = [&](const std::string& name, Order o, uint64_t w) {
      const bench::OrderStats s = bench::MeasureOrder(oa->samples, oa->chunk, o, w, oa->seed);
      std::printf("  %-22s %8.4f %8.4f %14.4f\n", name.c_str(), s.mean_span, s.mean_std, s.mean_abs_displacement);
    };
    row("sequential", Order::kSequential, 1);
    for (uint64_t w : oa->windows) row("block W=" + std::to_string(w), Order::kBlock, w);
    row("random", Order::kRandom, 1);
    *exit_code = 0;
  });
}

// gpufeed bench h2d (a GPU benchmark)
void AddH2dBench(CLI::App* parent, const std::shared_ptr<bool>& json, int* exit_code) {
  auto h2d = std::make_shared<std::pair<uint64_t, int>>(256ull * 3 * 218 * 178, 9);
  CLI::App* hcmd = parent->add_subcommand("h2d", "Host-to-device copies from a pinned pool vs pinned bandwidth");
  hcmd->add_option("--batch-bytes", h2d->first, "bytes per pool slot (default: a CelebA batch of 256)");
  hcmd->add_option("--slots", h2d->second, "pool slots");
  hcmd->add_flag("--json", *json, "print as JSON");
  hcmd->callback([h2d, json, exit_code] {
    auto r = bench::RunH2dBench(h2d->first, h2d->second);
    if (!r.ok()) {
      std::fprintf(stderr, "gpufeed bench h2d: %s\n", r.status().ToString().c_str());
      *exit_code = r.status().code() == StatusCode::kUnsupported ? 0 : 1;
      return;
    }
    if (*json) {
      std::printf("%s\n", nlohmann::json({{"batch_bytes", r->batch_bytes},
                                          {"pinned_gb_per_s", r->pinned_gb_per_s},
                                          {"pool_gb_per_s", r->pool_gb_per_s},
                                          {"pageable_gb_per_s", r->pageable_gb_per_s},
                                          {"ratio", r->ratio()}})
                              .dump(2)
                              .c_str());
    } else {
      std::printf(
          "h2d: pinned %.1f GB/s (ceiling, one %.0f MB buffer); pool of batch slots %.1f GB/s = %.1f%%; "
          "pageable %.1f GB/s\n",
          r->pinned_gb_per_s, r->batch_bytes * h2d->second / 1e6, r->pool_gb_per_s, 100 * r->ratio(),
          r->pageable_gb_per_s);
    }
    *exit_code = 0;
  });
}

// gpufeed bench kernel (a GPU benchmark)
void AddKernelBench(CLI::App* parent, const std::shared_ptr<bool>& json, int* exit_code) {
  auto kbatch = std::make_shared<int>(256);
  CLI::App* kcmd = parent->add_subcommand("kernel", "The fused transform kernel vs device memory bandwidth");
  kcmd->add_option("--batch", *kbatch, "samples of 3x218x178");
  kcmd->add_flag("--json", *json, "print as JSON");
  kcmd->callback([kbatch, json, exit_code] {
    auto r = bench::RunKernelBench(*kbatch);
    if (!r.ok()) {
      std::fprintf(stderr, "gpufeed bench kernel: %s\n", r.status().ToString().c_str());
      *exit_code = r.status().code() == StatusCode::kUnsupported ? 0 : 1;
      return;
    }
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& k : *r) {
      rows.push_back({{"dtype", k.dtype},
                      {"layout", k.layout},
                      {"ms", k.ms},
                      {"gb_per_s", k.kernel_gb_per_s},
                      {"memcpy_gb_per_s", k.memcpy_gb_per_s},
                      {"ratio", k.ratio()}});
      if (!*json) {
        std::printf(
            "transform %s %s (crop+flip, normalize): %.3f ms, %.0f GB/s = %.1f%% of D2D copy %.0f GB/s "
            "(verified against the CPU reference)\n",
            k.dtype.c_str(), k.layout.c_str(), k.ms, k.kernel_gb_per_s, 100 * k.ratio(), k.memcpy_gb_per_s);
      }
    }
    if (*json) std::printf("%s\n", rows.dump(2).c_str());
    *exit_code = 0;
  });
}

struct FeedArgs {
  bench::FeedBenchOptions o;
  std::string order = "block", dtype = "bfloat16";
  bool json = false;
};

void RunFeedBenchCmd(const std::shared_ptr<FeedArgs>& fa, int* exit_code) {
  auto order = OrderFromName(fa->order);
  auto dt = DTypeFromName(fa->dtype);
  if (!dt) {
    std::fprintf(stderr, "gpufeed bench feed: unknown dtype %s\n", fa->dtype.c_str());
    *exit_code = 2;
    return;
  }
  fa->o.loader.order = *order;
  fa->o.feed.dtype = *dt;
  auto r = bench::RunFeedBench(fa->o);
  if (!r.ok()) {
    std::fprintf(stderr, "gpufeed bench feed: FAILED: %s\n", r.status().ToString().c_str());
    *exit_code = 1;
    return;
  }
  const FeedStats& s = r->stats;
  if (fa->json) {
    std::printf("%s\n", nlohmann::json({{"data", fa->o.data},
                                        {"on_gpu", s.on_gpu},
                                        {"dtype", fa->dtype},
                                        {"echo", s.echo},
                                        {"loader_samples_per_s", r->loader_samples_per_s},
                                        {"fresh_samples_per_s", s.fresh_samples / r->seconds},
                                        {"echoed_samples_per_s", s.echoed_samples / r->seconds},
                                        {"fresh_share_of_loader", r->fresh_share()},
                                        {"data_wait_s", s.data_wait_seconds},
                                        {"seconds", r->seconds},
                                        {"timed_samples", r->timed_samples},
                                        {"epochs_verified", r->epochs_verified},
                                        {"verified_samples", r->verified_samples},
                                        {"labels_checked", r->labels_checked},
                                        {"values_checked", r->values_checked}})
                            .dump(2)
                            .c_str());
  } else {
    std::printf(
        "feed %s (%s, %s, echo %d): %.0f fresh samples/s = %.1f%% of the loader alone (%.0f); "
        "%.0f echoed samples/s; data wait %.2f s of %.2f s\n",
        fa->o.data.c_str(), s.on_gpu ? "GPU" : "CPU twins", fa->dtype.c_str(), s.echo, s.fresh_samples / r->seconds,
        100 * r->fresh_share(), r->loader_samples_per_s, s.echoed_samples / r->seconds, s.data_wait_seconds,
        r->seconds);
    std::printf(
        "  verified, as timed (%s, crop padding %d, flip %s, echo %d): all %d epochs, %llu samples delivered on the "
        "%s (the reported epoch's %llu among them): every index once per fresh pass, each echo pass a permutation "
        "of its upload; in a re-run of each epoch with the same indices, %llu labels equal to the file's and %llu "
        "samples' values (one of every batch) equal to the CPU reference of the transform\n",
        fa->dtype.c_str(), fa->o.feed.crop_padding, fa->o.feed.flip ? "on" : "off", s.echo, r->epochs_verified,
        static_cast<unsigned long long>(r->verified_samples), s.on_gpu ? "GPU" : "CPU twins",
        static_cast<unsigned long long>(r->timed_samples), static_cast<unsigned long long>(r->labels_checked),
        static_cast<unsigned long long>(r->values_checked));
  }
  *exit_code = 0;
}

// gpufeed bench feed (a GPU benchmark)
void AddFeedBench(CLI::App* parent, int* exit_code) {
  auto fa = std::make_shared<FeedArgs>();
  fa->o.loader.threads = static_cast<int>(std::thread::hardware_concurrency());
  CLI::App* fcmd = parent->add_subcommand(
      "feed", "Loader -> GPU -> transformed batches, no model, vs the loader alone (needs a `gpufeed bench gen` file)");
  fcmd->add_option("--data", fa->o.data,
                   "a `gpufeed bench gen` file (samples carry their index), or a daemon serving one: "
                   "unix:PATH | tcp://HOST:PORT")
      ->required();
  fcmd->add_option("--dataset", fa->o.dataset, "with a daemon --data: the dataset to read there (default: its first)");
  fcmd->add_option("--token-file", fa->o.token_file, "with a tcp:// daemon: its shared secret");
  AddTableOption(fcmd, "prefetch", &fa->o.loader.prefetch, ">= 2 x super-batch - 1")->capture_default_str();
  AddTableOption(fcmd, "order", &fa->order)->check(CLI::IsMember(NamesOf(kOrderNames)));
  AddTableOption(fcmd, "threads", &fa->o.loader.threads, "here the default is all cores");
  AddTableOption(fcmd, "batch_size", &fa->o.loader.batch_size);
  AddTableOption(fcmd, "feed_dtype", &fa->dtype);
  AddTableOption(fcmd, "feed_echo", &fa->o.feed.echo);
  AddTableOption(fcmd, "feed_super_batch", &fa->o.feed.super_batch);
  AddTableOption(fcmd, "feed_crop_padding", &fa->o.feed.crop_padding, "random crop");
  AddTableOption(fcmd, "feed_flip", &fa->o.feed.flip);
  fcmd->add_option("--epochs", fa->o.epochs, "epochs, each timed and verified; the last is reported");
  fcmd->add_flag("--json", fa->json, "print as JSON");
  fcmd->callback([fa, exit_code] { RunFeedBenchCmd(fa, exit_code); });
}

struct ServeArgs {
  bench::ServeBenchOptions o;
  std::string order = "block";
  bool json = false;
};

void RunServeBenchCmd(const std::shared_ptr<ServeArgs>& sa, int* exit_code) {
  sa->o.loader.order = *OrderFromName(sa->order);
  auto r = bench::RunServeBench(sa->o);
  if (!r.ok()) {
    std::fprintf(stderr, "gpufeed bench serve: FAILED: %s\n", r.status().ToString().c_str());
    *exit_code = 1;
    return;
  }
  const auto& o = sa->o;
  const double growth = static_cast<double>(r->rss_later) - static_cast<double>(r->rss_before);
  if (sa->json) {
    std::printf("%s\n", nlohmann::json({{"data", o.data},
                                        {"order", sa->order},
                                        {"threads", o.loader.threads},
                                        {"batch_size", o.loader.batch_size},
                                        {"samples", r->samples},
                                        {"compress", o.compress},
                                        {"local_samples_per_s", r->local_sps},
                                        {"shared_memory", o.shared_memory},
                                        {"remote1_samples_per_s", r->remote1_sps},
                                        {"remote1_socket_samples_per_s", r->remote1_socket_sps},
                                        {"remote1_socket_ratio", r->remote1_socket_ratio()},
                                        {"remote_n_samples_per_s", r->remote4_sps},
                                        {"clients", o.clients},
                                        {"remote1_ratio", r->remote1_ratio()},
                                        {"remote_n_ratio", r->remote4_ratio()},
                                        {"verified", true},
                                        {"spot_checked", r->spot_checked},
                                        {"memory",
                                         {{"idle_clients", o.idle_clients},
                                          {"stalled_clients", o.stalled_clients},
                                          {"stalled_streams_admitted", r->stalled_streams},
                                          {"rss_before", r->rss_before},
                                          {"rss_attached", r->rss_attached},
                                          {"rss_later", r->rss_later},
                                          {"reserved_bytes", r->reserved_bytes},
                                          {"budget_bytes", r->budget_bytes},
                                          {"within_budget", growth <= double(r->budget_bytes)}}}})
                            .dump(2)
                            .c_str());
  } else {
    std::printf(
        "serve %s: order %s, batch %llu, %d loader threads, %llu samples an epoch; every run verified "
        "(each sample once, labels, %llu samples' bytes)\n",
        o.data.c_str(), sa->order.c_str(), static_cast<unsigned long long>(o.loader.batch_size), o.loader.threads,
        static_cast<unsigned long long>(r->samples), static_cast<unsigned long long>(r->spot_checked));
    std::printf("  local Loader:                   %9.0f samples/s\n", r->local_sps);
    std::printf("  daemon, 1 client (unix%s):  %9.0f samples/s = %5.1f%% of local\n",
                o.shared_memory ? ", shm"
                : o.compress    ? "+zstd"
                                : ", socket",
                r->remote1_sps, 100 * r->remote1_ratio());
    if (o.shared_memory) {
      std::printf(
          "  daemon, 1 client (unix, socket): %9.0f samples/s = %5.1f%% of local (batches copied "
          "through the socket)\n",
          r->remote1_socket_sps, 100 * r->remote1_socket_ratio());
    }
    std::printf("  daemon, %d clients (ranks of %d): %9.0f samples/s = %5.1f%% of local (together)\n", o.clients,
                o.clients, r->remote4_sps, 100 * r->remote4_ratio());
    std::printf(
        "  memory: %d idle + %d stalled clients (%llu streams admitted, %llu batches sent before they "
        "stalled): RSS %.0f -> %.0f -> %.0f MiB (+%.0f MiB; 2 s later %.0f); reserved %.0f MiB of a "
        "%.0f MiB budget: %s\n",
        o.idle_clients, o.stalled_clients, static_cast<unsigned long long>(r->stalled_streams),
        static_cast<unsigned long long>(r->stalled_batches_sent), r->rss_before / 1048576.0,
        r->rss_attached / 1048576.0, r->rss_later / 1048576.0, growth / 1048576.0, r->rss_later / 1048576.0,
        r->reserved_bytes / 1048576.0, r->budget_bytes / 1048576.0,
        growth <= double(r->budget_bytes) ? "within budget" : "OVER BUDGET");
  }
  *exit_code = 0;
}

// gpufeed bench serve
void AddServeBench(CLI::App* parent, int* exit_code) {
  auto sa = std::make_shared<ServeArgs>();
  sa->o.loader.threads = static_cast<int>(std::thread::hardware_concurrency());
  sa->o.loader.pin_memory = false;
  CLI::App* scmd = parent->add_subcommand(
      "serve",
      "Local Loader vs the daemon over a Unix socket (1 client, then N ranks), verified; then memory "
      "with idle and stalled clients");
  scmd->add_option("--data", sa->o.data, "a `bench gen` file")->required();
  AddTableOption(scmd, "order", &sa->order)->check(CLI::IsMember(NamesOf(kOrderNames)));
  AddTableOption(scmd, "threads", &sa->o.loader.threads, "local, and each daemon stream");
  AddTableOption(scmd, "batch_size", &sa->o.loader.batch_size);
  AddTableOption(scmd, "prefetch", &sa->o.loader.prefetch);
  AddCacheBytesOption(scmd, &sa->o.loader.cache_bytes, "decoded-chunk cache per loader");
  scmd->add_option("--epochs", sa->o.epochs, "epochs per run; the last is timed (default 2)");
  scmd->add_option("--clients", sa->o.clients, "concurrent clients (ranks of one world) (default 4)");
  scmd->add_flag("--compress", sa->o.compress, "zstd payloads (with --no-shared-memory)");
  scmd->add_flag("!--no-shared-memory", sa->o.shared_memory, "batches on the socket, not in shared memory");
  scmd->add_option("--idle-clients", sa->o.idle_clients, "memory check: clients that say HELLO only");
  scmd->add_option("--stalled-clients", sa->o.stalled_clients, "memory check: clients that grant credit, never read");
  scmd->add_option("--memory-bytes", sa->o.memory_bytes, "memory check: the daemon's budget");
  scmd->add_option("--socket-dir", sa->o.socket_dir, "where the Unix socket goes");
  scmd->add_option("--server-log", sa->o.server_log, "write the daemon's log lines to this file");
  scmd->add_flag("--json", sa->json, "print as JSON");
  scmd->callback([sa, exit_code] { RunServeBenchCmd(sa, exit_code); });
}

// gpufeed bench gen
void AddGenBench(CLI::App* parent, int* exit_code) {
  auto ga = std::make_shared<GenArgs>();
  CLI::App* gen = parent->add_subcommand("gen", "Write a benchmark workload of docs/benchmarks.md, Workloads");
  gen->add_option("--workload", ga->workload,
                  "celeba-raw, celeba-deflate, celeba-zstd (one file), imagenet-jpeg (one file, and the same JPEGs "
                  "in OUTPUT.jpg.d/), deepcam or cosmoflow (a directory of files)");
  gen->add_option("--samples", ga->samples, "N (default 20000; deepcam and cosmoflow: 64)")
      ->each([ga](const std::string&) { ga->samples_set = true; });
  gen->add_option("--scale", ga->scale, "deepcam, cosmoflow: divide the spatial size by this (default 1)");
  gen->add_option("--samples-per-file", ga->per_file, "cosmoflow: samples per file (default 16)");
  gen->add_option("--seed", ga->seed, "generator seed");
  gen->add_option("--threads", ga->threads, "threads (default: all cores)");
  gen->add_option("-o,--output", ga->output, "output .h5 (deepcam, cosmoflow: a directory)")->required();
  gen->callback([ga, exit_code] { *exit_code = RunGen(*ga); });
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  CLI::App* bench_cmd = app.add_subcommand("bench", "Benchmarks (each verifies what it delivered before timing)");
  bench_cmd->require_subcommand(1);
  auto json = std::make_shared<bool>(false);
  AddReadBench(bench_cmd, json, exit_code);
  AddLoaderBench(bench_cmd, exit_code);
  AddOrderBench(bench_cmd, exit_code);
  AddH2dBench(bench_cmd, json, exit_code);
  AddKernelBench(bench_cmd, json, exit_code);
  AddFeedBench(bench_cmd, exit_code);
  AddServeBench(bench_cmd, exit_code);
  AddGenBench(bench_cmd, exit_code);
}

void AddDevicesCommand(CLI::App& app, int* exit_code) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("devices", "List the CUDA devices gpufeed can use");
  cmd->add_flag("--json", *json, "print as JSON");
  cmd->callback([json, exit_code] {
    const GpuReport r = QueryGpus();
    const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");  // main() sets it unless the job did
    const std::string conn = connections != nullptr ? connections : "";
    if (*json) {
      nlohmann::json devs = nlohmann::json::array();
      for (const GpuDevice& d : r.devices) {
        std::string jpeg;
        const Status av = GpuImageDecoder(d.index, &jpeg);
        devs.push_back({{"index", d.index},
                        {"name", d.name},
                        {"memory_bytes", d.memory_bytes},
                        {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
                        {"nvjpeg", av.ok() ? jpeg : "unavailable: " + av.message()}});
      }
      std::printf("%s\n", nlohmann::json({{"built_with_cuda", r.built_with_cuda},
                                          {"driver_version", r.driver_version},
                                          {"runtime_version", r.runtime_version},
                                          {"devices", devs},
                                          {"cuda_device_max_connections", conn},
                                          {"reason", r.reason}})
                              .dump(2)
                              .c_str());
    } else {
      std::printf("built with CUDA: %s (runtime %d), driver %d; CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
                  r.built_with_cuda ? "yes" : "no", r.runtime_version, r.driver_version, conn.c_str());
      for (const GpuDevice& d : r.devices) {
        std::string jpeg;
        const Status av = GpuImageDecoder(d.index, &jpeg);
        std::printf("  %d: %s, %.1f GiB, sm_%d%d; nvJPEG %s\n", d.index, d.name.c_str(), d.memory_bytes / 1073741824.0,
                    d.cc_major, d.cc_minor, av.ok() ? jpeg.c_str() : ("unavailable (" + av.message() + ")").c_str());
      }
      if (r.devices.empty()) std::printf("  no device: %s\n", r.reason.c_str());
    }
    *exit_code = 0;
  });
}

}  // namespace gpufeed::cli
