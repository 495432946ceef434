// `gpufeed bench ...`: benchmarks that verify what they read before timing.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/read_bench.h"
#include "bench/synthetic_source.h"
#include "cli/progress.h"
#include "cli/commands.h"
#include "gpufeed/device.h"

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
                        {"baseline", "hdf5 H5Dread, 1 thread, tuned chunk cache"},
                        {"baseline_seconds", r->baseline_seconds},
                        {"baseline_samples_per_s", r->baseline_samples_per_s()},
                        {"speedup", r->speedup()},
                        {"verified", true},
                        {"checksum", r->checksum}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("read %s: %llu samples, %.1f MB decoded from %.1f MB stored, every sample verified against HDF5\n",
              o.data.c_str(), static_cast<unsigned long long>(r->samples), r->raw_bytes / 1e6, r->stored_bytes / 1e6);
  std::printf("  gpufeed %s path, %d threads: %10.0f samples/s  %6.2f GB/s\n", r->read_path.c_str(), r->threads,
              r->direct_samples_per_s(), r->direct_gb_per_s());
  std::printf("  HDF5 H5Dread, 1 thread:        %10.0f samples/s  %6.2f GB/s\n", r->baseline_samples_per_s(),
              r->raw_bytes / r->baseline_seconds / 1e9);
  std::printf("  ratio: %.2fx\n", r->speedup());
  return 0;
}

struct GenArgs {
  std::string workload = "celeba-deflate", output;
  uint64_t samples = 20000, seed = 1;
  int threads = 0;
};

int RunGen(const GenArgs& a) {
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

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  CLI::App* bench_cmd = app.add_subcommand("bench", "Benchmarks (each verifies what it delivered before timing)");
  bench_cmd->require_subcommand(1);
  auto ro = std::make_shared<bench::ReadBenchOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* read = bench_cmd->add_subcommand(
      "read", "Decode every chunk: gpufeed's direct path on N threads vs HDF5 H5Dread on one, same run");
  read->add_option("--data", ro->data, "FILE.h5 or FILE.h5:/path")->required();
  read->add_option("--threads", ro->threads, "decode threads (default: all cores)");
  read->add_option("--repeats", ro->repeats, "timed passes; the median is reported");
  read->add_flag("--json", *json, "print as JSON");
  read->callback([ro, json, exit_code] { *exit_code = RunReadBenchCmd(*ro, *json); });

  auto ga = std::make_shared<GenArgs>();
  CLI::App* gen = bench_cmd->add_subcommand("gen", "Write a benchmark workload of ../shared/WORKLOADS.md");
  gen->add_option("--workload", ga->workload, "celeba-raw, celeba-deflate or celeba-zstd");
  gen->add_option("--samples", ga->samples, "N (default 20000)");
  gen->add_option("--seed", ga->seed, "generator seed");
  gen->add_option("--threads", ga->threads, "threads (default: all cores)");
  gen->add_option("-o,--output", ga->output, "output .h5")->required();
  gen->callback([ga, exit_code] { *exit_code = RunGen(*ga); });
}

void AddDevicesCommand(CLI::App& app, int* exit_code) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("devices", "List the CUDA devices gpufeed can use");
  cmd->add_flag("--json", *json, "print as JSON");
  cmd->callback([json, exit_code] {
    const GpuReport r = QueryGpus();
    if (*json) {
      nlohmann::json devs = nlohmann::json::array();
      for (const GpuDevice& d : r.devices) {
        devs.push_back({{"index", d.index}, {"name", d.name}, {"memory_bytes", d.memory_bytes},
                        {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)}});
      }
      std::printf("%s\n", nlohmann::json({{"built_with_cuda", r.built_with_cuda}, {"driver_version", r.driver_version},
                                          {"runtime_version", r.runtime_version}, {"devices", devs},
                                          {"reason", r.reason}})
                              .dump(2)
                              .c_str());
    } else {
      std::printf("built with CUDA: %s (runtime %d), driver %d\n", r.built_with_cuda ? "yes" : "no",
                  r.runtime_version, r.driver_version);
      for (const GpuDevice& d : r.devices) {
        std::printf("  %d: %s, %.1f GiB, sm_%d%d\n", d.index, d.name.c_str(), d.memory_bytes / 1073741824.0,
                    d.cc_major, d.cc_minor);
      }
      if (r.devices.empty()) std::printf("  no device: %s\n", r.reason.c_str());
    }
    *exit_code = 0;
  });
}

}  // namespace gpufeed::cli
