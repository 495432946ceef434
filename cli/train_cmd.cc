// `gpufeed train`: parses options, opens the datasets, calls gpufeed::Train,
// prints the memory breakdown, per-epoch lines and the verdict (or --json).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include "cli/commands.h"
#include "common/job.h"
#include "common/launch_ranks.h"
#include "gpufeed/device.h"
#include "gpufeed/dataset.h"
#include "gpufeed/encoded.h"
#include "gpufeed/fields.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/names.h"
#include "gpufeed/open_source.h"
#include "gpufeed/remote_loader.h"
#include "gpufeed/trainer.h"

namespace gpufeed::cli {
namespace {

// The names of train's own choices (the library's enums' are in gpufeed/names.h).
constexpr NameRow<DType> kPrecisionRows[] = {
    {DType::kFloat32, "fp32"}, {DType::kBFloat16, "bf16"}, {DType::kFloat16, "fp16"}};
constexpr NameTable<DType> kPrecisionNames{kPrecisionRows, {}, "--precision: {names}, not '{name}'"};
constexpr NameRow<bool> kRecomputeRows[] = {{false, "none"}, {true, "blocks"}};
constexpr NameTable<bool> kRecomputeNames{kRecomputeRows, {}, "--recompute '{name}': {names}"};
constexpr NameRow<bool> kScheduleRows[] = {{false, "gpipe", "alias simple"},
                                           {true, "1f1b", "alias interleaved"}};  // true: 1F1B
// The names model-parallel configurations use for the same two schedules.
constexpr NameAlias<bool> kScheduleAliases[] = {{"simple", false}, {"interleaved", true}};
constexpr NameTable<bool> kScheduleNames{kScheduleRows, kScheduleAliases, "--schedule '{name}': {names}"};
constexpr NameRow<bool> kPartitionRows[] = {{false, "time"}, {true, "memory"}};  // true: by memory
constexpr NameTable<bool> kPartitionNames{kPartitionRows, {}, "--partition-by '{name}': {names}"};

// A list of positive integers as --widths and --channels take it: "256,128".
std::string JoinList(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

// The flags' values as given. Each default is TrainOptions' (or the
// loader's), spelled by its name table, not restated here.
struct TrainArgs {
  TrainOptions o;
  std::string data, test, checkpoint, json, freeze;
  std::string model = ModelKindName(o.model);
  std::string precision{kPrecisionNames.Name(o.precision)};
  std::string optimizer = OptimizerName(o.optimizer);
  std::string device{TrainDeviceName(o.device)};
  std::string order{OrderName(o.loader.order)};
  std::string widths = JoinList(o.widths), channels = JoinList(o.channels);
  std::string recompute{kRecomputeNames.Name(o.recompute_blocks)};
  std::string schedule{kScheduleNames.Name(o.pipeline.one_f_one_b)};  // --pipeline-stages
  std::string partition_by{kPartitionNames.Name(o.pipeline.by_memory)};
  std::vector<std::string> fields;  // --field: images=/path, labels=/path
  std::string dataset, token_file;  // with a daemon --data
  DecodeArgs decode;                // encoded image datasets
  // --decode: train's own default, the loader's threads (the same pixels,
  // and so the same weights, every run).
  std::string decode_where{DecodeDeviceName(DecodeDevice::kCpu)};
  int gpus = 0;  // 0: the job's environment (torchrun), else 1
  bool no_graphs = !o.cuda_graphs;
  int bucket_kb = static_cast<int>(o.parallel.bucket_bytes >> 10);
  bool gpu_given = false;
  int threads = o.loader.threads;
  uint64_t cache_bytes = o.loader.cache_bytes;
};

// What a flag of the table below must be besides its type.
struct FlagCheck {
  bool required = false;
  std::optional<CLI::Validator> check;
};
const FlagCheck kAny;
const FlagCheck kRequired{true, std::nullopt};
FlagCheck Checked(CLI::Validator v) { return {false, std::move(v)}; }

// The trainer's flags, one row each (practice 21): X(flag, target in
// TrainArgs, what it is, whether --help shows its default, check). What
// the loader and the feed take comes from the C API's option table instead
// (AddTrainCommand); a choice's names from its name table.
#define GPUFEED_TRAIN_FLAGS(X)                                                                                        \
  X("--data", data,                                                                                                   \
    "training split (FILE.h5 with /images and /labels; many files: a glob, a directory or a list), or a daemon "      \
    "serving it: unix:PATH | tcp://HOST:PORT",                                                                        \
    false, kRequired)                                                                                                 \
  X("--field", fields,                                                                                                \
    "images=/path or labels=/path: the fields to train on (both; default /images and /labels); --data may then "      \
    "name many files (a glob, a directory or a list)",                                                                \
    false, kAny)                                                                                                      \
  X("--test", test, "test split, evaluated after every epoch", false, kAny)                                           \
  X("--model", model, kModelKindNames.List(), true, kAny)                                                             \
  X("--widths", widths, "mlp hidden widths", true, kAny)                                                              \
  X("--channels", channels,                                                                                           \
    "cnn block channels (conv-bn-relu-pool each); resnet18: its 4 stages' (default 64,128,256,512)", true, kAny)      \
  X("--precision", precision, kPrecisionNames.List() + " (mixed, fp32 master weights)", true, kAny)                   \
  X("--optimizer", optimizer, "sgd (momentum), adamw, or adamw8bit / sgd8bit (8-bit states, blockwise quantized)",    \
    true, kAny)                                                                                                       \
  X("--lr", o.lr, "peak learning rate", true, kAny)                                                                   \
  X("--momentum", o.momentum, "SGD momentum", true, kAny)                                                             \
  X("--weight-decay", o.weight_decay, "weight decay (not on biases/batchnorm)", true, kAny)                           \
  X("--warmup", o.warmup_epochs, "linear warmup, in epochs; then cosine to 0", true, kAny)                            \
  X("--epochs", o.epochs, "epochs", true, kAny)                                                                       \
  X("--accum", o.accum, "micro-batches per optimizer step", true, kAny)                                               \
  X("--clip", o.clip_norm, "clip the global gradient norm (0: off)", true, kAny)                                      \
  X("--device", device, kTrainDeviceNames.List(), true, kAny)                                                         \
  X("--gpu", o.cuda_device, "CUDA device index", true, kAny)                                                          \
  X("--gpus", gpus,                                                                                                   \
    "data parallel over this many GPUs of this host, one process each (with --device cpu: CPU ranks); under "         \
    "torchrun the ranks come from its environment",                                                                   \
    false, Checked(CLI::Range(1, 4096)))                                                                              \
  X("--no-graphs", no_graphs, "launch every kernel from the host (no CUDA graphs)", false, kAny)                      \
  X("--bucket-kb", bucket_kb, "data parallel: gradients all-reduced in buckets of about this size", true,             \
    Checked(CLI::Range(1, 1 << 20)))                                                                                  \
  X("--checkpoint", checkpoint, "checkpoint file, written after every epoch", false, kAny)                            \
  X("--resume", o.resume, "continue from --checkpoint", false, kAny)                                                  \
  X("--init", o.init_path,                                                                                            \
    "start from the weights of this checkpoint (any optimizer; a head of other classes starts fresh)", false, kAny)   \
  X("--recompute", recompute,                                                                                         \
    "none, or blocks: the cnn's backward pass recomputes each block's conv and batchnorm outputs instead of "         \
    "keeping them (the same weights, less activation memory)",                                                        \
    true, kAny)                                                                                                       \
  X("--lora-rank", o.lora_rank,                                                                                       \
    "LoRA: adapters of this rank on every linear and conv layer but the head; they and the head train, the rest "     \
    "is frozen (0: off)",                                                                                             \
    false, kAny)                                                                                                      \
  X("--lora-alpha", o.lora_alpha, "LoRA: the adapters' scale is alpha / rank (default: alpha = rank)", false, kAny)   \
  X("--merge-lora", o.merge_lora_path,                                                                                \
    "LoRA: after training, write a checkpoint of the model without adapters (weights merged) here", false, kAny)      \
  X("--freeze", freeze,                                                                                               \
    "parameters to freeze, by name prefix, comma-separated (conv0,conv3 or linear0.weight): no gradient, no "         \
    "optimizer state",                                                                                                \
    false, kAny)                                                                                                      \
  X("--pipeline-stages", o.pipeline.stages,                                                                           \
    "split the model's layers into this many stages, one a GPU from --gpu on (the CPU: a thread each), trained "      \
    "with micro-batches",                                                                                             \
    true, kAny)                                                                                                       \
  X("--micro-batches", o.pipeline.micro_batches, "pipeline: loader batches (each --batch-size) an optimizer step",    \
    true, kAny)                                                                                                       \
  X("--schedule", schedule,                                                                                           \
    "pipeline: gpipe or simple (all forwards, then all backwards), 1f1b or interleaved (at most "                     \
    "--pipeline-stages micro-batches in flight)",                                                                     \
    true, kAny)                                                                                                       \
  X("--partition-by", partition_by, "pipeline: balance the stages' measured layer time, or their memory", true, kAny) \
  X("--memory-limit", o.memory_limit,                                                                                 \
    "bytes a GPU (each pipeline stage) may hold for weights, gradients, optimizer state and activations (0: no "      \
    "limit)",                                                                                                         \
    true, kAny)                                                                                                       \
  X("--stop-after", o.stop_after_epochs, "stop after this many epochs (as if interrupted)", false, kAny)              \
  X("--device-resident", o.device_resident_batches,                                                                   \
    "compute ceiling: cycle the first N batches kept on the device (0: off)", false, kAny)                            \
  X("--json", json, "write the report as JSON to this file ('-': stdout only)", false, kAny)

template <typename T>
void AddTrainFlag(CLI::App* cmd, const std::string& flag, T* target, const std::string& what, bool shown,
                  const FlagCheck& c) {
  CLI::Option* opt = nullptr;
  if constexpr (std::is_same_v<T, bool>) {
    opt = cmd->add_flag(flag, *target, what);
  } else {
    opt = cmd->add_option(flag, *target, what);
  }
  if (shown) opt->capture_default_str();
  if (c.required) opt->required();
  if (c.check) opt->check(*c.check);
}

Result<std::vector<int>> ParseList(const std::string& s, const char* what) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      const int x = std::stoi(item, &used);
      if (used != item.size() || x <= 0) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      return Status::InvalidArgument(std::string(what) + ": '" + item + "' is not a positive integer");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

std::string Mb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%9.1f MB", b / 1e6);
  return buf;
}

nlohmann::json ToJson(const TrainReport& r) {
  nlohmann::json j;
  j["backend"] = r.backend;
  j["model"] = r.model;
  j["parameters"] = r.parameters;
  j["trainable_parameters"] = r.trainable_parameters;
  j["parameter_names"] = r.parameter_names;  // what --freeze takes
  j["init"] = r.init;
  j["lora"] = r.lora;
  j["memory_bytes"] = {{"weights", r.memory.weights},        {"gradients", r.memory.gradients},
                       {"optimizer", r.memory.optimizer},    {"activations", r.memory.activations},
                       {"workspace", r.memory.workspace},    {"total", r.memory.total()},
                       {"device_used", r.memory.device_used}};
  for (const EpochReport& e : r.epochs) {
    j["epochs"].push_back({{"epoch", e.epoch},
                           {"train_loss", e.train_loss},
                           {"train_accuracy", e.train_accuracy},
                           {"test_loss", e.test_loss},
                           {"test_accuracy", e.test_accuracy},
                           {"steps", e.steps},
                           {"samples", e.samples},
                           {"skipped_steps", e.skipped_steps},
                           {"loss_scale", e.loss_scale},
                           {"seconds", e.seconds},
                           {"samples_per_s", e.samples_per_s},
                           {"step_ms", e.step_ms},
                           {"data_wait_seconds", e.data_wait_seconds},
                           {"gpu_util", e.gpu_util},
                           {"gpu_mem_used_mb", e.gpu_mem_used_mb},
                           {"eval_seconds", e.eval_seconds}});
  }
  j["start_epoch"] = r.start_epoch;
  j["wall_seconds"] = r.wall_seconds;
  j["steady_gpu_util"] = r.steady_gpu_util;
  j["steady_samples_per_s"] = r.steady_samples_per_s;
  j["data_wait_fraction"] = r.data_wait_fraction;
  j["telemetry"] = r.telemetry;
  j["verdict"] = r.verdict;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(r.weights_hash));
  j["weights_hash"] = hash;
  j["graphs"] = r.graphs;
  if (!r.parallel.empty()) {
    j["parallel"] = r.parallel;
    for (const RankReport& k : r.ranks) {
      j["ranks"].push_back({{"rank", k.rank},
                            {"samples_per_s", k.samples_per_s},
                            {"gpu_util", k.gpu_util},
                            {"data_wait_fraction", k.data_wait_fraction},
                            {"verdict", k.verdict}});
    }
    j["allreduce_ms"] = r.allreduce_ms;
    j["allreduce_exposed_ms"] = r.allreduce_exposed_ms;
  }
  if (!r.pipeline.empty()) {
    j["pipeline"] = r.pipeline;
    for (const TrainReport::Stage& s : r.stages) {
      j["stages"].push_back({{"layers", s.layers},
                             {"backend", s.backend},
                             {"busy", s.busy},
                             {"profiled_ms", s.profiled_ms},
                             {"measured_ms", s.measured_ms},
                             {"memory_bytes",
                              {{"weights", s.memory.weights},
                               {"gradients", s.memory.gradients},
                               {"optimizer", s.memory.optimizer},
                               {"activations", s.memory.activations},
                               {"workspace", s.memory.workspace},
                               {"total", s.memory.total()}}}});
    }
    j["bubble"] = r.bubble;
    j["bubble_bound"] = r.bubble_bound;
    j["bubble_stage_bound"] = r.bubble_stage_bound;
  }
  return j;
}

// The memory breakdown, as the training starts.
void PrintMemory(const std::string& backend, const std::string& model, const MemoryBreakdown& m) {
  std::printf("train: %s on %s\n", model.c_str(), backend.c_str());
  std::printf("memory   weights %s  gradients %s  optimizer %s\n", Mb(m.weights).c_str(), Mb(m.gradients).c_str(),
              Mb(m.optimizer).c_str());
  std::printf("         activations %s  workspace %s  = %s", Mb(m.activations).c_str(), Mb(m.workspace).c_str(),
              Mb(m.total()).c_str());
  if (m.device_used) std::printf("  (device reports %s in use)", Mb(m.device_used).c_str());
  std::printf("\n");
  std::fflush(stdout);
}

// The progress bar on stderr (a terminal's), redrawn each step and cleared
// at the epoch's end.
void PrintProgress(const TrainProgress& p) {
  const int width = 30;
  const int filled = p.steps_in_epoch ? int(width * p.step_in_epoch / p.steps_in_epoch) : 0;
  std::string bar(size_t(std::min(filled, width)), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\repoch %d/%d [%s] %llu/%llu steps  %.0f samples/s", p.epoch + 1, p.epochs, bar.c_str(),
               (unsigned long long)p.step_in_epoch, (unsigned long long)p.steps_in_epoch, p.samples_per_s);
  if (p.gpu_util >= 0) std::fprintf(stderr, "  GPU %3.0f%%", p.gpu_util);
  if (p.step_in_epoch == p.steps_in_epoch) std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

// An epoch's line, as it ends (Ctrl-C later keeps the finished ones).
void PrintEpoch(const EpochReport& e) {
  std::printf("epoch %3d  loss %.4f acc %.4f", e.epoch + 1, e.train_loss, e.train_accuracy);
  if (e.test_accuracy >= 0) std::printf("  test loss %.4f acc %.4f", e.test_loss, e.test_accuracy);
  std::printf("  %.2f s  %.0f samples/s  step %.2f ms  data wait %.2f s", e.seconds, e.samples_per_s, e.step_ms,
              e.data_wait_seconds);
  if (e.gpu_util >= 0) std::printf("  GPU %.1f%%", e.gpu_util);
  if (e.skipped_steps) std::printf("  skipped %llu (scale %g)", (unsigned long long)e.skipped_steps, e.loss_scale);
  std::printf("\n");
  std::fflush(stdout);
}

// Pipeline stages: the cut, each stage's layers, memory and times, the bubble.
void PrintStages(const TrainReport& r) {
  std::printf("pipeline: %s\n", r.pipeline.c_str());
  for (size_t s = 0; s < r.stages.size(); ++s) {
    const TrainReport::Stage& st = r.stages[s];
    std::printf("  stage %zu: layers %s on %s; weights%s gradients%s optimizer%s activations%s", s, st.layers.c_str(),
                st.backend.c_str(), Mb(st.memory.weights).c_str(), Mb(st.memory.gradients).c_str(),
                Mb(st.memory.optimizer).c_str(), Mb(st.memory.activations).c_str());
    if (st.busy >= 0) std::printf("; busy %.1f%% of a step", 100 * st.busy);
    if (st.measured_ms >= 0) std::printf(", %.3f ms a micro-batch", st.measured_ms);
    if (st.profiled_ms >= 0) std::printf(" (its layers timed alone: %.3f ms)", st.profiled_ms);
    std::printf("\n");
  }
  if (r.bubble >= 0)
    std::printf(
        "  bubble: %.3f of a step idle, measured; its bound (stages-1)/(micro-batches+stages-1) %.3f, and %.3f "
        "for these stages' measured times\n",
        r.bubble, r.bubble_bound, r.bubble_stage_bound);
}

// Data parallel: the all-reduce's time and overlap, each rank's throughput.
void PrintRanks(const TrainReport& r) {
  std::printf("data parallel: %s", r.parallel.c_str());
  if (r.allreduce_ms >= 0) {
    std::printf("; all-reduce %.3f ms a step, %.3f ms of it not overlapped (%.0f%% overlapped)", r.allreduce_ms,
                r.allreduce_exposed_ms,
                r.allreduce_ms > 0 ? 100.0 * std::max(0.0, 1.0 - r.allreduce_exposed_ms / r.allreduce_ms) : 0);
  }
  std::printf("\n");
  for (const RankReport& k : r.ranks) {
    std::printf("  rank %d: %.0f samples/s", k.rank, k.samples_per_s);
    if (k.gpu_util >= 0) std::printf(", GPU %.1f%%", k.gpu_util);
    std::printf(", data wait %.1f%%\n", 100 * k.data_wait_fraction);
  }
}

// The text report after the last epoch; `freeze` is --freeze as given.
void PrintSummary(const TrainReport& r, const std::string& freeze) {
  std::printf("total %.2f s (data loading included); steady state %.0f samples/s", r.wall_seconds,
              r.steady_samples_per_s);
  if (r.steady_gpu_util >= 0) std::printf(", GPU utilization %.1f%%", r.steady_gpu_util);
  std::printf("\nsteps: CUDA graphs %s\n", r.graphs.c_str());
  if (r.trainable_parameters != r.parameters) {
    std::printf("parameters: %llu, %llu of them trained (%.1f%%%s%s)\n", (unsigned long long)r.parameters,
                (unsigned long long)r.trainable_parameters,
                100.0 * double(r.trainable_parameters) / double(std::max<uint64_t>(1, r.parameters)),
                freeze.empty() ? "" : "; --freeze ", freeze.c_str());
  }
  if (!r.init.empty()) std::printf("init: %s\n", r.init.c_str());
  if (!r.lora.empty()) std::printf("lora: %s\n", r.lora.c_str());
  if (!r.pipeline.empty()) PrintStages(r);
  if (!r.parallel.empty()) PrintRanks(r);
  std::printf("verdict: %s\n", r.verdict.c_str());
  if (!r.telemetry.empty()) std::printf("telemetry: %s\n", r.telemetry.c_str());
}

// --json: the report on stdout ('-') or in the file `path`.
Status WriteJsonReport(const TrainReport& r, const std::string& path) {
  const std::string text = ToJson(r).dump(2) + "\n";
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return Status::Ok();
  }
  std::ofstream f(path);
  f << text;
  if (!f) return Status::IOError("cannot write " + path);
  return Status::Ok();
}

// Runs the training and prints its report (train and test already open).
int Finish(TrainArgs& a, const ChunkSource& train, const ChunkSource* test) {
  auto fail = [&a](const Status& s) {
    if (a.o.parallel.world_size > 1) {
      std::fprintf(stderr, "gpufeed train (rank %d of %d): %s\n", a.o.parallel.rank, a.o.parallel.world_size,
                   s.ToString().c_str());
    } else {
      std::fprintf(stderr, "gpufeed train: %s\n", s.ToString().c_str());
    }
    return 1;
  };
  TrainOptions& o = a.o;
  // One report for a job: rank 0's (it holds every rank's figures).
  const bool quiet = (!a.json.empty() && a.json == "-") || o.parallel.rank != 0;
  const bool tty = isatty(fileno(stderr));
  o.on_start = [quiet](const std::string& backend, const std::string& model, const MemoryBreakdown& m) {
    if (!quiet) PrintMemory(backend, model, m);
  };
  o.on_progress = [tty, quiet](const TrainProgress& p) {
    if (tty && !quiet) PrintProgress(p);
  };
  o.on_epoch = [quiet](const EpochReport& e) {
    if (!quiet) PrintEpoch(e);
  };
  auto r = Train(train, test, o);
  if (!r.ok()) return fail(r.status());
  if (!quiet) PrintSummary(*r, a.freeze);
  if (!a.json.empty() && o.parallel.rank == 0) {
    if (Status s = WriteJsonReport(*r, a.json); !s.ok()) return fail(s);
  }
  return 0;
}

// The ranks: torchrun's environment, or --gpus N (this program started once a
// rank with the same variables set: *launched, the ranks ran). Pipeline
// stages: a rank is a replica of the pipeline and takes --pipeline-stages
// GPUs (rank k from GPU k x stages on), so --gpus N makes N / stages ranks.
// Non-zero: the exit code of an error (printed).
int PlaceRanks(TrainArgs& a, std::optional<TrainDevice> device, bool* launched) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "gpufeed train: %s\n", s.ToString().c_str());
    return 1;
  };
  TrainOptions& o = a.o;
  const int stages = std::max(1, o.pipeline.stages);
  const std::string each = stages > 1 ? " x --pipeline-stages " + std::to_string(stages) : "";
  auto job = JobRanksFromEnv();
  if (!job.ok()) return fail(job.status());
  if (job->world_size > 1) {
    if (a.gpus > 0 && a.gpus != job->world_size * stages) {
      return fail(Status::InvalidArgument("--gpus " + std::to_string(a.gpus) + ", but the job's WORLD_SIZE is " +
                                          std::to_string(job->world_size) + each +
                                          " (leave --gpus out under torchrun)"));
    }
    o.parallel.rank = job->rank;
    o.parallel.world_size = job->world_size;
    o.parallel.local_world_size = job->local_world_size;
    if (a.gpu_given) {
      return fail(
          Status::InvalidArgument("--gpu: each rank trains on GPU LOCAL_RANK (x --pipeline-stages); to choose the "
                                  "GPUs, set CUDA_VISIBLE_DEVICES"));
    }
    o.cuda_device = job->local_rank * stages;
    auto fail_rank = [&](const Status& s) {
      std::fprintf(stderr, "gpufeed train (rank %d of %d): %s\n", job->rank, job->world_size, s.ToString().c_str());
      return 1;
    };
    if (device != TrainDevice::kCpu) {
      const size_t visible = QueryGpus().devices.size();
      if (visible > 0 && size_t(job->local_rank + 1) * size_t(stages) > visible) {
        return fail_rank(Status::InvalidArgument(
            "LOCAL_RANK " + std::to_string(job->local_rank) + each + ", but " + std::to_string(visible) +
            " GPU(s) are visible here" + (stages > 1 ? " (each rank takes " + std::to_string(stages) + ")" : "")));
      }
    }
  } else if (a.gpus > 1) {
    if (a.gpus % stages != 0) {
      return fail(Status::InvalidArgument("--gpus " + std::to_string(a.gpus) + " with --pipeline-stages " +
                                          std::to_string(stages) +
                                          ": --gpus must be a multiple of the stages (each replica of the pipeline "
                                          "takes " +
                                          std::to_string(stages) + " GPUs)"));
    }
    if (device != TrainDevice::kCpu) {
      const GpuReport gpus = QueryGpus();
      if (gpus.devices.size() < size_t(a.gpus)) {
        return fail(Status::InvalidArgument(
            "--gpus " + std::to_string(a.gpus) + ", but " + std::to_string(gpus.devices.size()) +
            " GPU(s) are visible" + (gpus.devices.empty() ? " (" + gpus.reason + ")" : std::string()) +
            (device == TrainDevice::kAuto ? "; add --device cpu to train " + std::to_string(a.gpus) + " CPU ranks"
                                          : "")));
      }
      if (a.gpu_given) return fail(Status::InvalidArgument("--gpu: with --gpus, rank k trains on GPU k"));
    }
    if (a.gpus == stages) return 0;  // one pipeline: this process drives every stage
    *launched = true;
    Status st = LaunchLocalRanks(a.gpus / stages);
    if (!st.ok()) return fail(st);
  }
  return 0;
}

// --decode: where encoded images are decoded: the loader's threads (cpu,
// the default: the same pixels, and so the same weights, every run), or the
// GPU's JPEG decoder in the feed (gpu; auto: where the GPU has one, the
// loader taking a share measured to keep pace, which varies from run to
// run). A daemon decodes them itself.
Status PlaceTrainDecode(TrainArgs& a) {
  TrainOptions& o = a.o;
  auto where = DecodeDeviceFromName(a.decode_where);
  if (!where.ok()) return where.status().WithContext("--decode");
  if (IsDaemonAddress(a.data) && *where == DecodeDevice::kGpu) {
    return Status::InvalidArgument("--decode gpu: " + a.data +
                                   " decodes the images itself (leave --decode out, or train from the file)");
  }
  auto placed =
      PlaceDecode(IsDaemonAddress(a.data) ? DecodeDevice::kCpu : *where, o.device != TrainDevice::kCpu, o.cuda_device);
  if (!placed.ok())
    return placed.status().WithContext("--decode gpu (--decode auto falls back to the loader's threads)");
  o.loader.defer_decode = placed->defer;
  o.loader.balance_decode = placed->balance;
  return Status::Ok();
}

// --freeze: comma-separated name prefixes, none empty.
Status ParseFreeze(TrainArgs& a) {
  for (size_t at = 0; !a.freeze.empty() && at <= a.freeze.size();) {
    size_t comma = a.freeze.find(',', at);
    if (comma == std::string::npos) comma = a.freeze.size();
    const std::string name = a.freeze.substr(at, comma - at);
    if (name.empty()) return Status::InvalidArgument("--freeze '" + a.freeze + "': an empty name");
    a.o.freeze.push_back(name);
    at = comma + 1;
  }
  return Status::Ok();
}

// The flags given by name or as lists, into a.o, in the order they are
// checked (the first one wrong is the one named). `device`: --device's.
Status ApplyTrainChoices(TrainArgs& a, std::optional<TrainDevice> device) {
  TrainOptions& o = a.o;
  auto model = ModelKindFromName(a.model);
  if (!model.ok()) return model.status();
  o.model = *model;
  auto opt = OptimizerFromName(a.optimizer);
  if (!opt.ok()) return opt.status();
  o.optimizer = *opt;
  auto precision = kPrecisionNames.Parse(a.precision);
  if (!precision.ok()) return precision.status();
  o.precision = *precision;
  if (!device) return Status::InvalidArgument("--device: " + kTrainDeviceNames.List() + ", not '" + a.device + "'");
  o.device = *device;
  GPUFEED_RETURN_IF_ERROR(PlaceTrainDecode(a));
  auto w = ParseList(a.widths, "--widths");
  if (!w.ok()) return w.status();
  o.widths = *w;
  auto c = ParseList(a.channels, "--channels");
  if (!c.ok()) return c.status();
  o.channels = *c;
  // resnet18 without --channels: torchvision's widths.
  if (o.model == ModelKind::kResnet18 && a.channels == JoinList(TrainOptions{}.channels))
    o.channels = {64, 128, 256, 512};
  auto order = OrderFromName(a.order);
  if (!order.ok()) return order.status();
  o.loader.order = *order;
  o.loader.threads = a.threads;
  o.loader.cache_bytes = a.cache_bytes;
  o.checkpoint_path = a.checkpoint;
  auto recompute = kRecomputeNames.Parse(a.recompute);
  if (!recompute.ok()) return recompute.status();
  o.recompute_blocks = *recompute;
  auto schedule = kScheduleNames.Parse(a.schedule);
  if (!schedule.ok()) return schedule.status();
  o.pipeline.one_f_one_b = *schedule;
  auto partition_by = kPartitionNames.Parse(a.partition_by);
  if (!partition_by.ok()) return partition_by.status();
  o.pipeline.by_memory = *partition_by;
  return ParseFreeze(a);
}

// A daemon's --data: batches from the daemon (two streams: epochs overlap)
// through a.o.train_source; the model's shape, classes and normalization
// from the daemon's file, which the trainer needs readable on this host (the
// daemon's own host): the spec returned.
Result<std::string> ConnectTrainDaemon(TrainArgs& a, const DecodeOptions& decode) {
  RemoteLoaderOptions r;
  r.address = a.data;
  r.dataset = a.dataset;
  r.token_file = a.token_file;
  r.client_name = "train";
  r.decode = decode;
  auto probe = RemoteLoader::Connect(r);
  if (!probe.ok()) return probe.status();
  const std::string& name = (*probe)->info().name;  // "ADDRESS SPEC"
  a.o.train_source = [r](const LoaderOptions& lo) -> Result<std::unique_ptr<BatchSource>> {
    RemoteLoaderOptions ro = r;
    ro.loader = lo;
    auto remote = RemoteLoader::Connect(ro);
    if (!remote.ok()) return remote.status();
    return std::unique_ptr<BatchSource>(std::move(*remote));
  };
  return a.dataset.empty() ? name.substr(name.find(' ') + 1) : a.dataset;
}

// The training split (a file's, or a daemon's) and the test split, if any.
Status OpenTrainSources(TrainArgs& a, const DecodeOptions& decode, std::unique_ptr<ChunkSource>* train,
                        std::unique_ptr<ChunkSource>* test) {
  std::string train_spec = a.data;
  if (IsDaemonAddress(a.data)) {
    auto spec = ConnectTrainDaemon(a, decode);
    if (!spec.ok()) return spec.status();
    train_spec = *spec;
  }
  OpenOptions open;
  open.fields = a.fields;
  // Through the door every local spec takes: a file (encoded images decoded
  // with --image-size's crop), named fields, many files or a virtual dataset
  // (its images and labels fields). With a daemon, its file (readable here)
  // gives the shape and labels; the batches come from the daemon, decoded
  // there with the same options.
  auto t = OpenClassifierSource(train_spec, open, decode);
  if (!t.ok()) {
    if (a.o.train_source) {
      return t.status().WithContext("train: the daemon's dataset must be readable here for its labels and shape");
    }
    return t.status();
  }
  *train = std::move(*t);
  if (!a.test.empty()) {
    DecodeOptions eval = decode;  // the test split's images: resize + center crop
    eval.transform = ImageTransform::kCenterCrop;
    auto e = OpenClassifierSource(a.test, open, eval);
    if (!e.ok()) return e.status();
    *test = std::move(*e);
  }
  return Status::Ok();
}

int RunTrain(TrainArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "gpufeed train: %s\n", s.ToString().c_str());
    return 1;
  };
  TrainOptions& o = a.o;
  const std::optional<TrainDevice> device = kTrainDeviceNames.Find(a.device);
  o.cuda_graphs = !a.no_graphs;
  o.parallel.bucket_bytes = uint64_t(a.bucket_kb) << 10;
  // Ranks: torchrun's environment (or ours: --gpus starts this program once
  // a rank with the same variables set).
  bool launched = false;
  if (const int rc = PlaceRanks(a, device, &launched); rc != 0 || launched) return rc;
  if (const Status s = ApplyTrainChoices(a, device); !s.ok()) return fail(s);
  if (IsDaemonAddress(a.test)) {
    return fail(Status::Unsupported("train: --test " + a.test + ": the test split is read from a file"));
  }
  // Encoded image datasets are decoded by the loader (a daemon's too, with
  // these options): random-resized-crop (or --transform) for training,
  // resize + center crop for the test split.
  auto decode = ParseDecodeArgs(a.decode);
  if (!decode.ok()) return fail(decode.status());
  o.skip_corrupt = decode->skip_corrupt;
  if (LayoutOr(decode->layout, Layout::kNHWC) != Layout::kNCHW) {
    // The trainer learns a sample's layout from a Dataset's attribute only.
    return fail(Status::InvalidArgument("--image-layout " + decode->layout +
                                        ": train decodes encoded images as NCHW (leave --image-layout out)"));
  }
  std::unique_ptr<ChunkSource> train, test;
  if (const Status s = OpenTrainSources(a, *decode, &train, &test); !s.ok()) return fail(s);
  return Finish(a, *train, test.get());
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TrainArgs>();
  TrainOptions& o = a->o;
  CLI::App* cmd =
      app.add_subcommand("train", "Train an mlp, cnn or resnet18 classifier fed by gpufeed (cuBLAS/cuDNN or CPU)");
  // The trainer's own flags: its table.
#define GPUFEED_ADD_TRAIN_FLAG(flag, target, what, shown, check) \
  AddTrainFlag(cmd, flag, &a->target, what, shown, check);
  GPUFEED_TRAIN_FLAGS(GPUFEED_ADD_TRAIN_FLAG)
#undef GPUFEED_ADD_TRAIN_FLAG
  // The loader's and the feed's: name, description and range from the C
  // API's option table (capi/options.cc), as every command and Python spell
  // them; the remark and the default shown are train's.
  AddTableOption(cmd, "batch_size", &o.batch_size, "a micro-batch")->capture_default_str();
  AddTableOption(cmd, "seed", &o.seed, "and of initialisation and augmentation")->capture_default_str();
  AddTableOption(cmd, "order", &a->order)->capture_default_str();
  AddTableOption(cmd, "threads", &a->threads, "here 0 is all cores")->capture_default_str();
  AddCacheBytesOption(cmd, &a->cache_bytes, "loader chunk cache (default 1 GiB)");
  AddTableOption(cmd, "feed_echo", &o.echo)->capture_default_str();
  AddTableOption(cmd, "feed_crop_padding", &o.crop_padding, "random crop with this zero padding")
      ->capture_default_str();
  AddTableOption(cmd, "feed_flip", &o.flip);
  AddTableOption(cmd, "feed_slots", &o.feed_slots, "batches the feed may have ready on the GPU", "--feed-slots")
      ->capture_default_str();
  AddTableOption(cmd, "dataset", &a->dataset, "with a daemon --data; default: its first");
  AddTableOption(cmd, "token_file", &a->token_file, "with a tcp:// daemon");
  AddTableOption(cmd, "decode", &a->decode_where,
                 "encoded images; cpu, here the default: the loader's threads, the same weights every run; auto: the "
                 "GPU where it has one, the loader taking a measured share")
      ->check(CLI::IsMember(NamesOf(kDecodeDeviceNames)))
      ->capture_default_str();
  AddDecodeOptions(cmd, &a->decode, "random_resized_crop");
  cmd->callback([a, exit_code, cmd] {
    a->gpu_given = cmd->get_option("--gpu")->count() > 0;
    *exit_code = RunTrain(*a);
  });
}

}  // namespace gpufeed::cli
