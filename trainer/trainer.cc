// Train(): the training loop — feed, micro-batches, loss scaling, the
// optimizer step on a warmup + cosine schedule, evaluation, checkpoints, and
// the telemetry that ends in a verdict (input-bound or compute-bound).
//
// The loop never waits on the device in steady state: losses, accuracy and
// the loss scaler stay on the device and are read once per epoch; the
// GpuFeeder's slot events bound how far the host runs ahead.
#include "common/clock.h"
#include "gpufeed/trainer.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <map>
#include <tuple>

#include "common/atomic_file.h"
#include "gpufeed/dataset.h"
#include "gpufeed/device.h"
#include "gpufeed/gpu_feed.h"
#include "loader/batch_pool.h"
#include "loader/chunk_cache.h"
#include "trainer/checkpoint.h"
#include "trainer/comm.h"
#include "trainer/elem.h"
#include "trainer/model.h"
#include "trainer/nvml.h"
#include "trainer/ops.h"
#include "trainer/pipeline.h"

namespace gpufeed {

namespace {

// The loader's position a checkpoint saves: the start of `epoch` of the run
// with `seed` (checkpoints are written between epochs; a resume starts at
// CheckpointMeta::next_epoch). The shard and order fields stay "unknown".
LoaderState EpochStart(uint64_t seed, uint64_t epoch) {
  LoaderState s;
  s.seed = seed;
  s.epoch = epoch;
  return s;
}

using trainer::Model;
using trainer::Ops;
using trainer::ScalerState;

bool IsSgd(Optimizer o) { return o == Optimizer::kSgd || o == Optimizer::kSgd8bit; }

Status Validate(const TrainOptions& o) {
  if (o.epochs < 1) return Status::InvalidArgument("train: --epochs must be >= 1");
  if (o.batch_size < 1 || o.batch_size > 65536) return Status::InvalidArgument("train: --batch-size in 1..65536");
  if (o.accum < 1) return Status::InvalidArgument("train: --accum must be >= 1");
  if (!(o.lr > 0)) return Status::InvalidArgument("train: --lr must be > 0");
  if (o.clip_norm < 0) return Status::InvalidArgument("train: --clip must be >= 0");
  if (o.warmup_epochs < 0) return Status::InvalidArgument("train: --warmup must be >= 0");
  if (o.echo < 0) return Status::InvalidArgument("train: --echo must be >= 0");
  if (o.precision != DType::kFloat32 && o.precision != DType::kBFloat16 && o.precision != DType::kFloat16)
    return Status::InvalidArgument("train: --precision must be fp32, bf16 or fp16");
  if (o.model == ModelKind::kCnn && o.channels.empty())
    return Status::InvalidArgument("train: a cnn needs at least one block (--channels)");
  if (o.resume && o.checkpoint_path.empty()) return Status::InvalidArgument("train: --resume needs --checkpoint PATH");
  if (o.growth_interval < 1 || !(o.init_scale >= 1)) return Status::InvalidArgument("train: bad loss scaler options");
  const auto& p = o.parallel;
  if (p.world_size < 1 || p.rank < 0 || p.rank >= p.world_size)
    return Status::InvalidArgument("train: rank " + std::to_string(p.rank) + " is not in [0, world size " +
                                   std::to_string(p.world_size) + ")");
  if (p.local_world_size < 1 || p.local_world_size > p.world_size)
    return Status::InvalidArgument("train: the ranks on this host (" + std::to_string(p.local_world_size) +
                                   ") must be in [1, world size " + std::to_string(p.world_size) + "]");
  if (!(p.timeout_s > 0)) return Status::InvalidArgument("train: the ranks' timeout must be > 0 s");
  if (o.feed_slots < 2 || o.feed_slots > 64) return Status::InvalidArgument("train: --feed-slots in 2..64");
  const auto& pl = o.pipeline;
  if (pl.stages < 1 || pl.stages > 64) return Status::InvalidArgument("train: --pipeline-stages in 1..64");
  if (pl.stages > 1) {
    if (pl.micro_batches < 1 || pl.micro_batches > 1024)
      return Status::InvalidArgument("train: --micro-batches in 1..1024");
    if (o.accum != 1)
      return Status::InvalidArgument(
          "train: --accum with --pipeline-stages: a pipelined step's micro-batches are --micro-batches");
    if (p.world_size > 1)
      return Status::Unsupported(
          "train: --pipeline-stages under data parallel (--gpus N, torchrun): one process drives every stage; "
          "run one process");
    // Not (yet) with stages: each would need a rule of its own across them.
    const std::pair<bool, const char*> unsupported[] = {
        {!o.checkpoint_path.empty() || o.resume, "--checkpoint/--resume"},
        {!o.init_path.empty(), "--init"},
        {!o.freeze.empty(), "--freeze"},
        {o.lora_rank > 0, "--lora-rank"},
        {o.recompute_blocks, "--recompute blocks"},
        {o.optimizer == Optimizer::kAdamW8bit || o.optimizer == Optimizer::kSgd8bit, "8-bit optimizer states"},
        {o.precision == DType::kFloat16, "--precision fp16 (its loss scaler would need every stage's overflow)"},
        {o.clip_norm > 0, "--clip (the global norm spans the stages)"},
        {o.device_resident_batches > 0, "device-resident batches"},
        {bool(o.train_source), "a batch source other than the file"},
    };
    for (const auto& [on, what] : unsupported)
      if (on) return Status::Unsupported(std::string("train: --pipeline-stages does not take ") + what + " yet");
  }
  return Status::Ok();
}

// Device-side scalars the loop accumulates into; read once per epoch.
struct Counters {
  double loss = 0;
  int64_t correct = 0;
};

// RAII for one backend allocation.
struct Buffer {
  Ops* ops = nullptr;
  void* p = nullptr;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (p) ops->Free(p);
  }
  Status Alloc(Ops* o, size_t bytes) {
    ops = o;
    return o->Alloc(bytes, &p);
  }
};

struct Geometry {
  int c = 0, h = 0, w = 0;
  Layout layout = Layout::kNCHW;
};

Result<Geometry> SampleGeometry(const ChunkSource& src) {
  if (src.fields().size() > 1)
    return Status::Unsupported(src.name() + ": the trainer takes one images field (and labels), this source has " +
                               std::to_string(src.fields().size()) + " fields; name one with --data FILE.h5:/path");
  if (src.dtype() != DType::kUInt8)
    return Status::Unsupported(src.name() + ": the trainer takes uint8 images, this is " +
                               std::string(DTypeName(src.dtype())));
  const auto& s = src.sample_shape();
  if (s.size() != 3)
    return Status::InvalidArgument(src.name() + ": the trainer needs [C, H, W] or [H, W, C] samples, got rank " +
                                   std::to_string(s.size()));
  Geometry g;
  g.layout = LayoutOr(src.attributes().layout, g.layout);
  if (g.layout == Layout::kNCHW)
    g.c = int(s[0]), g.h = int(s[1]), g.w = int(s[2]);
  else
    g.h = int(s[0]), g.w = int(s[1]), g.c = int(s[2]);
  return g;
}

std::string ConfigString(const TrainOptions& o) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "precision=%s optimizer=%s batch=%llu accum=%d seed=%llu",
                std::string(DTypeName(o.precision)).c_str(), OptimizerName(o.optimizer).c_str(),
                (unsigned long long)o.batch_size, o.accum, (unsigned long long)o.seed);
  // Freezing changes which tensors a checkpoint holds (frozen ones keep no
  // optimizer state); absent when nothing is frozen, as before.
  std::string s = buf;
  for (size_t i = 0; i < o.freeze.size(); ++i) s += (i == 0 ? " freeze=" : ",") + o.freeze[i];
  if (o.lora_rank > 0) s += " lora=" + std::to_string(o.lora_rank) + "/" + std::to_string(o.lora_alpha);
  return s;
}

class Run {
 public:
  Run(const ChunkSource& train, const ChunkSource* test, const TrainOptions& o) : train_(train), test_(test), o_(o) {}
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  Result<TrainReport> Go();

 private:
  Status Setup();
  Status TrainEpoch(int epoch, EpochReport* r);
  // One micro-batch (and the optimizer step when it ends an accumulation),
  // replayed from a CUDA graph when graphs are on.
  Status Micro(const void* images, const void* labels, int n);
  // What a graph records: forward, loss and backward of a micro-batch
  // (gradients added to when `accumulate`), then the optimizer when `step`.
  Status MicroOps(const void* images, const void* labels, int n, bool accumulate, bool step);
  // Graphs on: copies a batch into graph_images_/graph_labels_ (where the
  // graphs read it) and points the arguments there; else leaves them.
  Status StageInputs(const void** images, const void** labels, int n);
  Status OptimizerStep();
  // --merge-lora: the model without adapters, weights merged, as a checkpoint.
  Status WriteMergedLora();
  void DisableGraphs(const std::string& why);
  // 8-bit optimizer states: the tables ApplyOptimizer8bit walks (one entry
  // per quantized tensor, one per block of kQuantBlock values) and the two
  // codes, in backend memory.
  Status SetupQuantizedStates();
  Status Evaluate(EpochReport* r);
  // Data parallel, at an epoch's end: rank 0's batchnorm statistics to every
  // rank, and the epoch's figures made the node's (own ones kept).
  Status NodeEpoch(EpochReport* r);
  Status NodeReport();
  Result<TrainReport> GoRanks();
  Status ReadCounters(Counters* c);
  Status ZeroCounters();

  const ChunkSource& train_;
  const ChunkSource* test_;
  TrainOptions o_;
  TrainReport report_;
  Geometry geo_;
  int classes_ = 0;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Model> model_;  // null with pipeline stages: pipeline_ holds them
  std::unique_ptr<trainer::Pipeline> pipeline_;
  int pipeline_probes_ = 8;  // steps timed for the bubble, from the third
  Status SetupPipeline(const trainer::ModelSpec& spec);
  // Two loaders over the training split, even and odd epochs, so the next
  // epoch's stream (and its GpuFeeder) starts while this one finishes: no
  // pipeline refill at epoch boundaries. They split the cache budget.
  std::unique_ptr<BatchSource> loaders_[2];  // Loaders over train_, or TrainOptions::train_source's
  std::unique_ptr<Loader> test_loader_;
  // A feeder per loader, kept and restarted (GpuFeeder::Restart) for each of
  // its epochs, so an epoch's start makes no device buffers or decoder
  // again; feeder_epoch_[k]: the epoch feeders_[k] streams (-1: none yet).
  std::unique_ptr<GpuFeeder> feeders_[2];
  int64_t feeder_epoch_[2] = {-1, -1};
  // Feeder k streaming `epoch`: made, or restarted, unless it already is.
  Result<GpuFeeder*> FeederFor(int epoch);
  int last_epoch_ = 0;  // the last epoch this call trains
  std::unique_ptr<trainer::NvmlSampler> nvml_;
  Buffer counters_, scaler_, norm_ptrs_, step_state_;
  Buffer quant_tensors_, quant_blocks_, quant_codes_;  // SetupQuantizedStates (after ops_: freed before it)
  int quant_num_blocks_ = 0;
  trainer::Schedule schedule_;
  trainer::OptimizerStep opt_;
  // CUDA graphs of MicroOps by (batch, accumulate, step), made on a key's
  // second use (the first makes every plan and scratch buffer), with the
  // backend's buffer generation they were recorded at. Inputs are copied into
  // graph_images_/graph_labels_ first: a graph reads fixed addresses.
  struct Graph {
    void* exec = nullptr;
    uint64_t generation = 0;
    int uses = 0;
  };
  std::map<std::tuple<int, bool, bool>, Graph> graphs_;
  bool graphs_on_ = false;
  // Data parallel (o_.parallel.world_size > 1): the collectives, the bucket
  // of gradients being filled during the backward pass, and the all-reduce
  // probes (the first 16 steps from the 8th of the first epoch, run without
  // graphs so their marks can be read).
  std::unique_ptr<trainer::Comm> comm_;
  std::vector<float*> bucket_;
  std::vector<size_t> bucket_sizes_;
  uint64_t bucket_bytes_ = 0;
  int probes_left_ = 16, probes_ = 0;
  double probe_busy_ms_ = 0, probe_exposed_ms_ = 0;
  bool probing_ = false;
  Status FlushBucket();
  int world() const { return o_.parallel.world_size; }
  int rank() const { return o_.parallel.rank; }
  Buffer graph_images_, graph_labels_;
  uint64_t replays_ = 0;
  ScalerState scaler_host_;
  int64_t step_ = 0, total_steps_ = 0, warmup_steps_ = 0;
  uint64_t steps_per_epoch_ = 0;
  int micro_ = 0;
  std::vector<float*> grads_;
  std::vector<size_t> grad_sizes_;
  FeedOptions feed_;
  // device_resident_batches: copies of the first batches, cycled.
  std::vector<std::unique_ptr<Buffer>> resident_images_, resident_labels_;
  std::vector<int> resident_sizes_;
  double run_start_ = 0;
  std::vector<EpochReport> own_epochs_;  // this rank's (the report's are the node's)
};

// Steady state: every epoch after the first when there are several (the
// first pays for cuDNN's plans, the page cache and the pools), else the one.
struct Steady {
  double samples_per_s = 0, gpu_util = -1, wait = 0;
};
Steady SteadyOf(const std::vector<EpochReport>& e) {
  Steady st;
  if (e.empty()) return st;
  size_t first = e.size() > 1 ? 1 : 0;
  double secs = 0, samples = 0, wait = 0, util = 0;
  int util_n = 0;
  for (size_t i = first; i < e.size(); ++i) {
    secs += e[i].seconds, samples += e[i].samples, wait += e[i].data_wait_seconds;
    if (e[i].gpu_util >= 0) util += e[i].gpu_util, ++util_n;
  }
  st.samples_per_s = secs > 0 ? samples / secs : 0;
  st.wait = secs > 0 ? wait / secs : 0;
  st.gpu_util = util_n ? util / util_n : -1;
  return st;
}

std::string VerdictText(double u, double w, const std::string& telemetry) {
  char buf[512];
  if (u >= 0) {
    if (u >= 95 && w < 0.05) {
      std::snprintf(buf, sizeof buf,
                    "compute-bound: the GPU was busy %.1f%% of the time and the trainer waited for data %.1f%% of it; "
                    "a faster model or GPU would go faster, a faster input would not",
                    u, 100 * w);
    } else if (w < 0.05) {
      // Idle GPU, yet the data was always there: the host's work per step
      // (kernel launches without graphs; the feed's hand-offs and the
      // step's launch with them) is the limit, not the input.
      std::snprintf(buf, sizeof buf,
                    "host-bound: the GPU was busy only %.1f%% of the time but the trainer waited for data just %.1f%% "
                    "of it: the host's work per step (launches, the feed's hand-offs) limits this small model (a "
                    "larger batch would help); the "
                    "input is not the limit",
                    u, 100 * w);
    } else {
      std::snprintf(buf, sizeof buf,
                    "input-bound: the GPU was busy only %.1f%% of the time; the trainer waited for data %.1f%% of "
                    "it, so the input must deliver about %.2fx faster to keep the GPU busy",
                    u, 100 * w, w < 0.999 ? 1.0 / (1.0 - w) : 1000.0);
    }
  } else if (w < 0.05) {
    std::snprintf(buf, sizeof buf,
                  "compute-bound: the trainer waited for data %.1f%% of the time (no GPU utilization: %s)", 100 * w,
                  telemetry.c_str());
  } else {
    std::snprintf(buf, sizeof buf,
                  "input-bound: the trainer waited for data %.1f%% of the time; the input must deliver about "
                  "%.2fx faster (no GPU utilization: %s)",
                  100 * w, w < 0.999 ? 1.0 / (1.0 - w) : 1000.0, telemetry.c_str());
  }
  return buf;
}

Status Run::Setup() {
  GPUFEED_RETURN_IF_ERROR(Validate(o_));
  auto g = SampleGeometry(train_);
  if (!g.ok()) return g.status();
  geo_ = *g;
  if (train_.labels().empty()) return Status::InvalidArgument(train_.name() + ": no labels to train on");
  int64_t max_label = 0;
  for (int64_t l : train_.labels()) {
    if (l < 0) return Status::InvalidArgument(train_.name() + ": negative label " + std::to_string(l));
    max_label = std::max(max_label, l);
  }
  if (test_) {
    auto tg = SampleGeometry(*test_);
    if (!tg.ok()) return tg.status();
    if (tg->c != geo_.c || tg->h != geo_.h || tg->w != geo_.w || tg->layout != geo_.layout) {
      auto text = [](const auto& g) {
        return std::string(LayoutName(g.layout)) + " " + std::to_string(g.c) + "x" + std::to_string(g.h) + "x" +
               std::to_string(g.w);
      };
      return Status::InvalidArgument(test_->name() + ": test samples have another shape than the training samples: " +
                                     text(*tg) + ", but training samples (" + train_.name() + ") are " + text(geo_) +
                                     "; convert both splits with the same --size and --layout");
    }
    if (test_->labels().empty()) return Status::InvalidArgument(test_->name() + ": no labels to evaluate on");
    for (int64_t l : test_->labels())
      if (l < 0 || l > max_label)
        return Status::InvalidArgument(test_->name() + ": label " + std::to_string(l) +
                                       " never occurs in the training split");
  }
  // Labels are class indices: [0, classes), classes from the class names
  // when the dataset has them, else 1 + the largest label, within reason.
  constexpr int64_t kMaxClasses = 1 << 20;
  size_t named = 0;
  named = train_.attributes().class_names.size();
  if (named > 0 && max_label >= static_cast<int64_t>(named)) {
    return Status::InvalidArgument(train_.name() + ": label " + std::to_string(max_label) + " is outside [0, " +
                                   std::to_string(named) + "): the dataset names " + std::to_string(named) +
                                   " classes");
  }
  if (max_label >= kMaxClasses) {
    return Status::InvalidArgument(train_.name() + ": label " + std::to_string(max_label) +
                                   " would make a classifier of " + std::to_string(max_label + 1) +
                                   " classes; labels must be class indices in [0, classes) (at most " +
                                   std::to_string(kMaxClasses) + ")");
  }
  classes_ = std::max<int>(static_cast<int>(max_label + 1), static_cast<int>(named));
  if (classes_ < 2) {
    return Status::InvalidArgument(train_.name() + ": a classifier needs at least 2 classes (every label is " +
                                   std::to_string(max_label) + ")");
  }
  if (!o_.checkpoint_path.empty() && !o_.resume && rank() == 0) {
    // Found now, not after the first epoch's work: the path must be writable.
    AtomicFile probe(o_.checkpoint_path);
    if (Status st = probe.Write("", 0); !st.ok()) return st.WithContext("train: --checkpoint");
  }
  if (o_.device == TrainDevice::kCuda && QueryGpus().devices.empty()) {
    return Status::Unsupported("train: --device cuda, but no CUDA GPU is visible on this machine (" +
                               QueryGpus().reason + "); use --device cpu or auto");
  }

  // Backend.
  if (o_.device == TrainDevice::kCpu || (o_.device == TrainDevice::kAuto && QueryGpus().devices.empty())) {
    ops_ = trainer::MakeCpuOps();
  } else {
    auto ops = trainer::MakeCudaOps(o_.cuda_device);
    if (!ops.ok()) return ops.status();
    ops_ = std::move(*ops);
  }
  report_.backend = ops_->Describe();
  if (world() > 1) {
    trainer::CommOptions co;
    co.rank = rank(), co.world_size = world(), co.timeout_s = o_.parallel.timeout_s;
    co.prefix = o_.parallel.rendezvous;
    if (co.prefix.empty()) {
      auto prefix = trainer::RendezvousPrefix(world(), o_.parallel.local_world_size);
      if (!prefix.ok()) return prefix.status();
      co.prefix = *prefix;
    }
    auto comm = ops_->on_gpu() ? trainer::MakeNcclComm(co, o_.cuda_device, ops_->stream()) : trainer::MakeShmComm(co);
    if (!comm.ok()) return comm.status();
    comm_ = std::move(*comm);
    report_.parallel = std::to_string(world()) + " ranks, " + comm_->Describe();
  }

  trainer::ModelSpec spec;
  spec.kind = o_.model;
  spec.widths = o_.model == ModelKind::kMlp ? o_.widths : o_.channels;
  spec.in_c = geo_.c, spec.in_h = geo_.h, spec.in_w = geo_.w;
  spec.classes = classes_;
  spec.max_batch = static_cast<int>(o_.batch_size);
  spec.dtype = o_.precision;
  spec.optimizer = IsSgd(o_.optimizer) ? trainer::OptimizerKind::kSgd : trainer::OptimizerKind::kAdamW;
  spec.quantized_states = o_.optimizer == Optimizer::kAdamW8bit || o_.optimizer == Optimizer::kSgd8bit;
  spec.seed = o_.seed;
  spec.freeze = o_.freeze;
  spec.recompute_blocks = o_.recompute_blocks;
  spec.lora_rank = o_.lora_rank;
  spec.lora_alpha = o_.lora_alpha;
  if (o_.lora_rank < 0 || o_.lora_alpha < 0)
    return Status::InvalidArgument("--lora-rank and --lora-alpha must be >= 0 (rank 0: no LoRA)");
  if (!o_.merge_lora_path.empty() && o_.lora_rank == 0)
    return Status::InvalidArgument("--merge-lora needs --lora-rank (there are no adapters to merge)");
  spec.memory_limit = o_.memory_limit;
  const bool piped = o_.pipeline.stages > 1;
  if (piped) {
    o_.accum = o_.pipeline.micro_batches;  // a step: that many loader batches
  } else {
    model_ = std::make_unique<Model>(ops_.get(), spec);
    GPUFEED_RETURN_IF_ERROR(model_->Init());
    report_.model = model_->Describe();
    report_.parameters = model_->num_parameters();
  }
  if (o_.lora_rank > 0 && !piped) {
    int layers = 0;
    for (const auto& p : model_->params()) layers += p.name.find(".lora_a") != std::string::npos;
    char buf[128];
    std::snprintf(buf, sizeof buf, "rank %d, alpha %g, adapters on %d layers", o_.lora_rank,
                  o_.lora_alpha > 0 ? double(o_.lora_alpha) : double(o_.lora_rank), layers);
    report_.lora = buf;
  }
  if (!piped) {
    for (auto& p : model_->params()) {
      report_.parameter_names.push_back(p.name);
      if (p.frozen()) continue;  // no gradient to reduce, clip or apply
      report_.trainable_parameters += p.n;
      grads_.push_back(p.grad);
      grad_sizes_.push_back(p.n);
    }
  }
  if (!o_.init_path.empty() && !o_.resume && !piped) {
    GPUFEED_RETURN_IF_ERROR(trainer::LoadWeights(o_.init_path, ops_.get(), model_.get(), &report_.init));
    GPUFEED_RETURN_IF_ERROR(model_->RefreshLoraWeights());
  }

  LoaderOptions lo = o_.loader;
  lo.batch_size = o_.batch_size;
  lo.seed = o_.seed;
  lo.drop_last = true;  // every micro-batch full: the same step shapes and loss weights
  lo.rank = rank(), lo.world_size = world();
  lo.pin_memory = ops_->on_gpu();
  lo.cache_bytes = std::max<uint64_t>(1, lo.cache_bytes / 2);
  if (o_.train_source) {
    for (auto& l : loaders_) {
      auto src = o_.train_source(lo);
      if (!src.ok()) return src.status();
      l = std::move(*src);
    }
    const BatchSourceInfo& info = loaders_[0]->info();
    if (info.num_samples != train_.num_samples() || info.sample_shape != train_.sample_shape()) {
      return Status::InvalidArgument(info.name + ": the batch source's samples are not those of " + train_.name() +
                                     " (" + std::to_string(info.num_samples) + " vs " +
                                     std::to_string(train_.num_samples()) + " samples, or another shape)");
    }
  } else {
    auto a = std::make_unique<Loader>(train_, lo);
    auto b = std::make_unique<Loader>(train_, lo);
    // The two loaders run alternate epochs (the next one starts while this
    // one ends). Each keeps the chunks the following epoch needs soonest
    // (issue 14's cross-epoch cache), and that epoch runs on the other
    // loader: sharing their decoded chunks lets it find them.
    auto shared = std::make_shared<loader::SharedChunks>();
    LoaderInternal::ShareChunks(*a, shared);
    LoaderInternal::ShareChunks(*b, shared);
    loaders_[0] = std::move(a);
    loaders_[1] = std::move(b);
  }
  if (loaders_[0]->num_batches() == 0)
    return Status::InvalidArgument(train_.name() + ": fewer samples than one batch of " +
                                   std::to_string(o_.batch_size));
  if (test_) {
    LoaderOptions tl = lo;
    tl.order = Order::kSequential;
    tl.drop_last = false;
    tl.rank = 0, tl.world_size = 1;
    test_loader_ = std::make_unique<Loader>(*test_, tl);
  }
  feed_.dtype = o_.precision;
  feed_.layout = Layout::kNHWC;
  feed_.input_layout = geo_.layout;
  feed_.echo = o_.echo;
  feed_.crop_padding = o_.crop_padding;
  feed_.flip = o_.flip;
  feed_.seed = o_.seed;
  feed_.slots = o_.feed_slots;
  feed_.labels_int32 = true;
  feed_.force_cpu = !ops_->on_gpu();
  feed_.skip_corrupt = o_.skip_corrupt;
  feed_.device = o_.cuda_device;

  steps_per_epoch_ = (loaders_[0]->num_batches() * std::max(1, o_.echo) + o_.accum - 1) / o_.accum;
  total_steps_ = int64_t(steps_per_epoch_) * o_.epochs;
  warmup_steps_ = static_cast<int64_t>(std::llround(o_.warmup_epochs * double(steps_per_epoch_)));

  GPUFEED_RETURN_IF_ERROR(counters_.Alloc(ops_.get(), sizeof(Counters)));
  GPUFEED_RETURN_IF_ERROR(scaler_.Alloc(ops_.get(), sizeof(ScalerState)));
  scaler_host_.dynamic = o_.precision == DType::kFloat16;
  scaler_host_.scale = scaler_host_.dynamic ? o_.init_scale : 1.0f;
  scaler_host_.growth_interval = o_.growth_interval;
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(scaler_.p, &scaler_host_, sizeof scaler_host_));
  // The gradient pointer table, where the backend can read it.
  GPUFEED_RETURN_IF_ERROR(norm_ptrs_.Alloc(ops_.get(), grads_.size() * (sizeof(float*) + sizeof(size_t))));
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(norm_ptrs_.p, grads_.data(), grads_.size() * sizeof(float*)));
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(static_cast<char*>(norm_ptrs_.p) + grads_.size() * sizeof(float*),
                                       grad_sizes_.data(), grads_.size() * sizeof(size_t)));

  GPUFEED_RETURN_IF_ERROR(step_state_.Alloc(ops_.get(), sizeof(trainer::StepState)));
  schedule_.peak_lr = o_.lr;
  schedule_.warmup = warmup_steps_;
  schedule_.total = total_steps_;
  schedule_.beta1 = o_.beta1, schedule_.beta2 = o_.beta2;
  opt_.kind = IsSgd(o_.optimizer) ? trainer::OptimizerKind::kSgd : trainer::OptimizerKind::kAdamW;
  if (!piped) GPUFEED_RETURN_IF_ERROR(SetupQuantizedStates());
  opt_.momentum = o_.momentum, opt_.beta1 = o_.beta1, opt_.beta2 = o_.beta2, opt_.eps = o_.eps;
  opt_.weight_decay = o_.weight_decay;
  if (piped) {
    GPUFEED_RETURN_IF_ERROR(SetupPipeline(spec));
    report_.graphs = "off (pipeline stages: each stage's kernels launched per micro-batch)";
  } else if (o_.cuda_graphs && ops_->on_gpu()) {
    graphs_on_ = true;
    const size_t img_bytes = size_t(geo_.c) * geo_.h * geo_.w * DTypeSize(o_.precision);
    GPUFEED_RETURN_IF_ERROR(graph_images_.Alloc(ops_.get(), img_bytes * o_.batch_size));
    GPUFEED_RETURN_IF_ERROR(graph_labels_.Alloc(ops_.get(), 4 * o_.batch_size));
    report_.graphs = "on";
  } else {
    report_.graphs = ops_->on_gpu() ? "off (--no-graphs)" : "off (the CPU backend)";
  }

  if (o_.resume) {
    trainer::CheckpointMeta expect, meta;
    expect.model = report_.model;
    expect.config = ConfigString(o_);
    GPUFEED_RETURN_IF_ERROR(trainer::LoadCheckpoint(o_.checkpoint_path, ops_.get(), model_.get(), expect, &meta));
    GPUFEED_RETURN_IF_ERROR(model_->RefreshLoraWeights());
    step_ = meta.step;
    trainer::StepState st;
    st.step = step_;
    GPUFEED_RETURN_IF_ERROR(ops_->Upload(step_state_.p, &st, sizeof st));
    report_.start_epoch = meta.next_epoch;
    scaler_host_ = meta.scaler;
    GPUFEED_RETURN_IF_ERROR(ops_->Upload(scaler_.p, &scaler_host_, sizeof scaler_host_));
  }

  if (ops_->on_gpu() && o_.telemetry) {
    nvml_ = std::make_unique<trainer::NvmlSampler>(ops_->PciBusId(), 0.1);
    if (!nvml_->ok()) report_.telemetry = nvml_->error();
  } else if (!ops_->on_gpu()) {
    report_.telemetry = "no GPU";
  }
  return Status::Ok();
}

// One micro-batch: forward, loss (gradient scaled by loss_scale / (n x
// accum)), backward into the fp32 gradients (added to when `accumulate`),
// then the optimizer step when `step`.
Status Run::SetupPipeline(const trainer::ModelSpec& spec) {
  const int stages = o_.pipeline.stages;
  if (ops_->on_gpu() && int(QueryGpus().devices.size()) < o_.cuda_device + stages) {
    return Status::InvalidArgument("train: --pipeline-stages " + std::to_string(stages) + " from GPU " +
                                   std::to_string(o_.cuda_device) + " needs " +
                                   std::to_string(o_.cuda_device + stages) + " GPUs; this machine shows " +
                                   std::to_string(QueryGpus().devices.size()));
  }
  trainer::PipelineSetup ps;
  ps.whole = spec;
  ps.stages = stages;
  ps.micro = o_.pipeline.micro_batches;
  ps.one_f_one_b = o_.pipeline.one_f_one_b;
  ps.by_memory = o_.pipeline.by_memory;
  ps.memory_limit = o_.memory_limit;
  const bool gpu = ops_->on_gpu();
  const int first = o_.cuda_device;
  ps.make_ops = [gpu, first](int s) -> Result<std::unique_ptr<Ops>> {
    if (!gpu) return trainer::MakeCpuOps();
    return trainer::MakeCudaOps(first + s);
  };
  ps.opt = opt_;
  ps.schedule = schedule_;
  ps.scaler = scaler_host_;
  ps.timeout_s = o_.parallel.timeout_s;
  auto p = trainer::Pipeline::Create(ops_.get(), ps);
  if (!p.ok()) return p.status();
  pipeline_ = std::move(*p);
  report_.model = pipeline_->model();
  report_.parameters = pipeline_->parameters();
  report_.parameter_names = pipeline_->parameter_names();
  report_.trainable_parameters = report_.parameters;
  return Status::Ok();
}

Status Run::MicroOps(const void* images, const void* labels, int n, bool accumulate, bool step) {
  GPUFEED_RETURN_IF_ERROR(model_->Forward(images, n, true));
  auto* c = static_cast<Counters*>(counters_.p);
  GPUFEED_RETURN_IF_ERROR(ops_->SoftmaxXent(
      n, classes_, o_.precision, model_->logits(), static_cast<const int32_t*>(labels), &c->loss, &c->correct,
      model_->dlogits(), static_cast<const ScalerState*>(scaler_.p), float(n) * float(o_.accum) * float(world())));
  if (!comm_ || !step) {
    GPUFEED_RETURN_IF_ERROR(model_->Backward(images, n, accumulate));
    return step ? OptimizerStep() : Status::Ok();
  }
  // The step's last micro-batch: each layer's gradients join the bucket as
  // the backward pass produces them (last layer first); a full bucket is
  // summed across the ranks on the collectives' stream while the backward
  // pass goes on. Then the optimizer waits for the sums.
  if (probing_) GPUFEED_RETURN_IF_ERROR(ops_->Mark(0));
  // Empty at the start even after a capture that failed halfway (its
  // recording is discarded and the step runs again without it).
  bucket_.clear();
  bucket_sizes_.clear();
  bucket_bytes_ = 0;
  GPUFEED_RETURN_IF_ERROR(model_->Backward(images, n, accumulate, [this](int first, int end) -> Status {
    for (int i = first; i < end; ++i) {
      const trainer::Param& p = model_->params()[size_t(i)];
      if (p.frozen()) continue;
      bucket_.push_back(p.grad);
      bucket_sizes_.push_back(p.n);
      bucket_bytes_ += 4 * p.n;
    }
    return bucket_bytes_ >= o_.parallel.bucket_bytes ? FlushBucket() : Status::Ok();
  }));
  GPUFEED_RETURN_IF_ERROR(FlushBucket());
  if (probing_) GPUFEED_RETURN_IF_ERROR(ops_->Mark(1));
  GPUFEED_RETURN_IF_ERROR(comm_->Join());
  if (probing_) GPUFEED_RETURN_IF_ERROR(ops_->Mark(2));
  return OptimizerStep();
}

Status Run::FlushBucket() {
  if (bucket_.empty()) return Status::Ok();
  Status st = comm_->AllReduce(bucket_.data(), bucket_sizes_.data(), static_cast<int>(bucket_.size()));
  bucket_.clear();
  bucket_sizes_.clear();
  bucket_bytes_ = 0;
  return st;
}

Status Run::OptimizerStep() {
  auto* sc = static_cast<ScalerState*>(scaler_.p);
  auto* st = static_cast<trainer::StepState*>(step_state_.p);
  auto* ptrs = static_cast<float* const*>(norm_ptrs_.p);
  auto* sizes = reinterpret_cast<const size_t*>(static_cast<char*>(norm_ptrs_.p) + grads_.size() * sizeof(float*));
  GPUFEED_RETURN_IF_ERROR(ops_->FinishGradients(ptrs, sizes, static_cast<int>(grads_.size()), o_.clip_norm, sc));
  GPUFEED_RETURN_IF_ERROR(ops_->AdvanceSchedule(schedule_, st));
  for (auto& p : model_->params()) {
    if (p.quantized() || p.frozen()) continue;
    GPUFEED_RETURN_IF_ERROR(ops_->ApplyOptimizer(opt_, p.decay, p.n, p.master, p.grad, p.s1, p.s2,
                                                 p.copy != p.master ? p.copy : nullptr, o_.precision, sc, st));
  }
  if (quant_num_blocks_ > 0) {
    const auto* codes = static_cast<const float*>(quant_codes_.p);
    GPUFEED_RETURN_IF_ERROR(ops_->ApplyOptimizer8bit(opt_, static_cast<const trainer::Quant8Tensor*>(quant_tensors_.p),
                                                     static_cast<const trainer::Quant8Block*>(quant_blocks_.p),
                                                     quant_num_blocks_, codes, codes + 256, o_.precision, sc, st));
  }
  // LoRA: the weights the next step uses, W + scale B A, from the new adapters.
  return model_->RefreshLoraWeights();
}

Status Run::WriteMergedLora() {
  auto merged = model_->MergedMasters();
  if (!merged.ok()) return merged.status();
  // The same model without adapters, freezing or 8-bit states: what --init
  // and a plain run of these layers read.
  TrainOptions po = o_;
  po.lora_rank = 0, po.lora_alpha = 0, po.freeze.clear(), po.optimizer = Optimizer::kAdamW;
  trainer::ModelSpec spec = model_->spec();
  spec.lora_rank = 0, spec.lora_alpha = 0, spec.freeze.clear();
  spec.optimizer = trainer::OptimizerKind::kAdamW, spec.quantized_states = false;
  Model plain(ops_.get(), spec);
  GPUFEED_RETURN_IF_ERROR(plain.Init());
  if (plain.params().size() != merged->size()) return Status::Internal("--merge-lora: the merged model's parameters");
  for (size_t i = 0; i < merged->size(); ++i) {
    trainer::Param& p = plain.params()[i];
    if ((*merged)[i].size() != p.n) return Status::Internal("--merge-lora: " + p.name + "'s size");
    GPUFEED_RETURN_IF_ERROR(ops_->Upload(p.master, (*merged)[i].data(), p.n * 4));
  }
  auto from = model_->buffers();
  auto to = plain.buffers();
  for (size_t i = 0; i < from.size() && i < to.size(); ++i)
    GPUFEED_RETURN_IF_ERROR(ops_->Copy(to[i].first, from[i].first, from[i].second * 4));
  const int epochs = report_.epochs.empty() ? report_.start_epoch : report_.epochs.back().epoch + 1;
  trainer::CheckpointMeta meta{
      plain.Describe(), ConfigString(po), epochs, step_, scaler_host_, EpochStart(o_.seed, uint64_t(epochs))};
  GPUFEED_RETURN_IF_ERROR(trainer::SaveCheckpoint(o_.merge_lora_path, ops_.get(), &plain, meta));
  report_.lora += "; merged into " + o_.merge_lora_path;
  return Status::Ok();
}

Status Run::SetupQuantizedStates() {
  std::vector<trainer::Quant8Tensor> tensors;
  std::vector<trainer::Quant8Block> blocks;
  for (auto& p : model_->params()) {
    if (!p.quantized()) continue;
    trainer::Quant8Tensor t;
    t.master = p.master, t.grad = p.grad, t.q1 = p.q1, t.q2 = p.q2, t.a1 = p.a1, t.a2 = p.a2;
    t.copy = p.copy != p.master ? p.copy : nullptr;
    t.n = p.n;
    t.decay = p.decay ? 1 : 0;
    const uint32_t count = static_cast<uint32_t>((p.n + trainer::kQuantBlock - 1) / trainer::kQuantBlock);
    for (uint32_t b = 0; b < count; ++b) blocks.push_back({static_cast<int32_t>(tensors.size()), b});
    tensors.push_back(t);
  }
  if (tensors.empty()) return Status::Ok();
  float codes[512];
  trainer::Quant8Code(true, codes);
  trainer::Quant8Code(false, codes + 256);
  GPUFEED_RETURN_IF_ERROR(quant_tensors_.Alloc(ops_.get(), tensors.size() * sizeof tensors[0]));
  GPUFEED_RETURN_IF_ERROR(quant_blocks_.Alloc(ops_.get(), blocks.size() * sizeof blocks[0]));
  GPUFEED_RETURN_IF_ERROR(quant_codes_.Alloc(ops_.get(), sizeof codes));
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(quant_tensors_.p, tensors.data(), tensors.size() * sizeof tensors[0]));
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(quant_blocks_.p, blocks.data(), blocks.size() * sizeof blocks[0]));
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(quant_codes_.p, codes, sizeof codes));
  quant_num_blocks_ = static_cast<int>(blocks.size());
  return Status::Ok();
}

void Run::DisableGraphs(const std::string& why) {
  for (auto& [key, g] : graphs_) ops_->DestroyGraph(g.exec);
  graphs_.clear();
  graphs_on_ = false;
  report_.graphs = "off: " + why + "; every kernel was launched from the host";
}

Status Run::StageInputs(const void** images, const void** labels, int n) {
  if (!graphs_on_ || *images == graph_images_.p) return Status::Ok();
  const size_t img_bytes = size_t(geo_.c) * geo_.h * geo_.w * DTypeSize(o_.precision);
  GPUFEED_RETURN_IF_ERROR(ops_->Copy(graph_images_.p, *images, img_bytes * size_t(n)));
  GPUFEED_RETURN_IF_ERROR(ops_->Copy(graph_labels_.p, *labels, 4 * size_t(n)));
  *images = graph_images_.p;
  *labels = graph_labels_.p;
  return Status::Ok();
}

Status Run::Micro(const void* images, const void* labels, int n) {
  if (pipeline_) {  // the step runs once its micro-batches are in
    const bool step = micro_ + 1 == o_.accum;
    micro_ = step ? 0 : micro_ + 1;
    GPUFEED_RETURN_IF_ERROR(pipeline_->Add(images, labels, n));
    if (!step) return Status::Ok();
    ++step_;
    const bool probe = pipeline_probes_ > 0 && step_ > 2;
    pipeline_probes_ -= probe;
    return pipeline_->Step(probe);
  }
  const bool accumulate = micro_ > 0, step = micro_ + 1 == o_.accum;
  micro_ = step ? 0 : micro_ + 1;
  if (step) ++step_;
  if (comm_ && step && ops_->on_gpu() && probes_left_ > 0 && step_ > 8) {
    // An all-reduce probe: this step runs without a graph, timed.
    --probes_left_;
    probing_ = true;
    comm_->SetTiming(true);
    Status st = MicroOps(images, labels, n, accumulate, step);
    probing_ = false;
    comm_->SetTiming(false);
    GPUFEED_RETURN_IF_ERROR(st);
    const double busy = comm_->BusyMs(), exposed = ops_->MarkElapsedMs(1, 2);
    if (busy >= 0 && exposed >= 0) probe_busy_ms_ += busy, probe_exposed_ms_ += exposed, ++probes_;
    return Status::Ok();
  }
  if (!graphs_on_) return MicroOps(images, labels, n, accumulate, step);
  GPUFEED_RETURN_IF_ERROR(StageInputs(&images, &labels, n));
  Graph& g = graphs_[{n, accumulate, step}];
  if (g.exec && g.generation != ops_->buffer_generation()) {  // the backend reallocated what it reads
    ops_->DestroyGraph(g.exec);
    g.exec = nullptr;
  }
  if (!g.exec && g.uses++ > 0) {
    GPUFEED_RETURN_IF_ERROR(ops_->BeginCapture());
    const uint64_t generation = ops_->buffer_generation();
    Status recorded = MicroOps(graph_images_.p, graph_labels_.p, n, accumulate, step);
    auto exec = ops_->EndCapture();
    if (!recorded.ok() || !exec.ok()) {
      if (exec.ok()) ops_->DestroyGraph(*exec);
      DisableGraphs(!recorded.ok() ? recorded.message() : exec.status().message());
      return MicroOps(images, labels, n, accumulate, step);  // nothing of the recording ran
    }
    g.exec = *exec;
    g.generation = generation;
  }
  if (!g.exec) return MicroOps(graph_images_.p, graph_labels_.p, n, accumulate, step);
  ++replays_;
  return ops_->Replay(g.exec);
}

Status Run::ZeroCounters() {
  if (pipeline_) return pipeline_->ZeroCounters();
  Counters z;
  return ops_->Upload(counters_.p, &z, sizeof z);
}
Status Run::ReadCounters(Counters* c) {
  if (pipeline_) return pipeline_->ReadCounters(&c->loss, &c->correct);
  return ops_->Download(c, counters_.p, sizeof *c);
}

Status Run::TrainEpoch(int epoch, EpochReport* r) {
  const double t0 = NowSeconds();
  GPUFEED_RETURN_IF_ERROR(ZeroCounters());
  const ScalerState before = scaler_host_;
  uint64_t samples = 0, micro_batches = 0;
  double wait = 0;
  const uint64_t micro_total = steps_per_epoch_ * o_.accum;
  auto progress = [&](bool force) {
    if (!o_.on_progress) return;
    const uint64_t s = (micro_batches + o_.accum - 1) / o_.accum;
    if (!force && s % std::max(1, o_.progress_every) != 0) return;
    TrainProgress p;
    p.epoch = epoch, p.epochs = o_.epochs;
    p.step_in_epoch = s, p.steps_in_epoch = steps_per_epoch_;
    const double dt = NowSeconds() - t0;
    p.samples_per_s = dt > 0 ? samples / dt : 0;
    if (nvml_ && nvml_->ok()) {
      double mem;
      nvml_->Mean(std::max(t0, NowSeconds() - 2.0), NowSeconds(), &p.gpu_util, &mem);
    }
    o_.on_progress(p);
  };
  auto after_micro = [&](int n) -> Status {
    samples += n;
    ++micro_batches;
    if (micro_ == 0) progress(false);
    return Status::Ok();
  };

  const bool cycle_resident = o_.device_resident_batches > 0 && !resident_images_.empty();
  if (cycle_resident) {
    for (uint64_t i = 0; i < micro_total; ++i) {
      const size_t k = i % resident_images_.size();
      GPUFEED_RETURN_IF_ERROR(Micro(resident_images_[k]->p, resident_labels_[k]->p, resident_sizes_[k]));
      GPUFEED_RETURN_IF_ERROR(after_micro(resident_sizes_[k]));
    }
  } else {
    auto current = FeederFor(epoch);
    if (!current.ok()) return current.status().WithContext("epoch " + std::to_string(epoch));
    GpuFeeder& feeder = **current;
    bool next_started = false;
    // Start the next epoch's stream halfway through this one (not when this
    // epoch fills the device-resident cache: the next one cycles it).
    const bool prefetch_next = epoch < last_epoch_ && o_.device_resident_batches == 0;
    const size_t img_bytes = size_t(geo_.c) * geo_.h * geo_.w * DTypeSize(o_.precision);
    for (;;) {
      auto next = feeder.Next();
      if (!next.ok()) return next.status().WithContext("epoch " + std::to_string(epoch));
      if (!*next) break;
      DeviceBatch& b = **next;
      GPUFEED_RETURN_IF_ERROR(ops_->WaitEvent(b.ready_event()));
      if (o_.device_resident_batches > 0 && int(resident_images_.size()) < o_.device_resident_batches) {
        auto im = std::make_unique<Buffer>(), lb = std::make_unique<Buffer>();
        GPUFEED_RETURN_IF_ERROR(im->Alloc(ops_.get(), img_bytes * b.size()));
        GPUFEED_RETURN_IF_ERROR(lb->Alloc(ops_.get(), 4 * size_t(b.size())));
        GPUFEED_RETURN_IF_ERROR(ops_->Copy(im->p, b.images(), img_bytes * b.size()));
        GPUFEED_RETURN_IF_ERROR(ops_->Copy(lb->p, b.labels(), 4 * size_t(b.size())));
        resident_images_.push_back(std::move(im));
        resident_labels_.push_back(std::move(lb));
        resident_sizes_.push_back(b.size());
      }
      // With graphs the batch is copied to the graphs' inputs first, and its
      // slot goes back to the feed at once (the feed transforms the next
      // batches while this step runs).
      const void *images = b.images(), *labels = b.labels();
      const int n = b.size();
      GPUFEED_RETURN_IF_ERROR(StageInputs(&images, &labels, n));
      // Staged: the step reads the copy, the slot can go. Else the slot goes
      // after the step's work (Release's event must follow every read of it).
      const bool staged = images != b.images();
      if (staged) b.Release(ops_->stream());
      GPUFEED_RETURN_IF_ERROR(Micro(images, labels, n));
      if (!staged) b.Release(ops_->stream());
      GPUFEED_RETURN_IF_ERROR(after_micro(n));
      if (prefetch_next && !next_started && 2 * micro_batches >= micro_total) {
        auto next = FeederFor(epoch + 1);
        if (!next.ok()) return next.status().WithContext("epoch " + std::to_string(epoch + 1));
        next_started = true;
      }
    }
    wait = feeder.stats().data_wait_seconds;
  }
  if (micro_ > 0) {  // a trailing partial accumulation: step with what there is
    GPUFEED_RETURN_IF_ERROR(pipeline_ ? pipeline_->Step(false) : OptimizerStep());
    ++step_;
    micro_ = 0;
  }
  Counters c;
  GPUFEED_RETURN_IF_ERROR(ReadCounters(&c));  // waits for the epoch's work
  GPUFEED_RETURN_IF_ERROR(pipeline_ ? pipeline_->ReadScaler(&scaler_host_)
                                    : ops_->Download(&scaler_host_, scaler_.p, sizeof scaler_host_));
  const double t1 = NowSeconds();
  progress(true);
  r->epoch = epoch;
  r->samples = samples;
  r->steps = (micro_batches + o_.accum - 1) / o_.accum;
  r->train_loss = samples ? c.loss / samples : 0;
  r->train_accuracy = samples ? double(c.correct) / samples : 0;
  r->skipped_steps = uint64_t(scaler_host_.skipped - before.skipped);
  r->loss_scale = scaler_host_.scale;
  r->seconds = t1 - t0;
  r->samples_per_s = samples / r->seconds;
  r->step_ms = r->steps ? 1000.0 * r->seconds / r->steps : 0;
  r->data_wait_seconds = wait;
  if (nvml_ && nvml_->ok()) nvml_->Mean(t0, t1, &r->gpu_util, &r->gpu_mem_used_mb);
  return Status::Ok();
}

Result<GpuFeeder*> Run::FeederFor(int epoch) {
  const int k = epoch % 2;
  if (feeders_[k] && feeder_epoch_[k] == epoch) return feeders_[k].get();  // started mid-way through the last epoch
  if (feeders_[k]) {
    GPUFEED_RETURN_IF_ERROR(feeders_[k]->Restart(uint64_t(epoch)));
  } else {
    feeders_[k] = std::make_unique<GpuFeeder>(*loaders_[k], feed_, uint64_t(epoch));
  }
  feeder_epoch_[k] = epoch;
  return feeders_[k].get();
}

Status Run::Evaluate(EpochReport* r) {
  r->test_loss = r->test_accuracy = -1;
  if (!test_loader_) return Status::Ok();
  const double t0 = NowSeconds();
  GPUFEED_RETURN_IF_ERROR(ZeroCounters());
  FeedOptions fo = feed_;
  fo.echo = 1, fo.crop_padding = 0, fo.flip = false;
  GpuFeeder feeder(*test_loader_, fo, 0);
  uint64_t samples = 0;
  auto* c = static_cast<Counters*>(counters_.p);
  for (;;) {
    auto next = feeder.Next();
    if (!next.ok()) return next.status().WithContext("evaluation");
    if (!*next) break;
    DeviceBatch& b = **next;
    GPUFEED_RETURN_IF_ERROR(ops_->WaitEvent(b.ready_event()));
    if (pipeline_) {
      GPUFEED_RETURN_IF_ERROR(pipeline_->Evaluate(b.images(), b.labels(), b.size()));
    } else {
      GPUFEED_RETURN_IF_ERROR(model_->Forward(b.images(), b.size(), false));
      GPUFEED_RETURN_IF_ERROR(ops_->SoftmaxXent(b.size(), classes_, o_.precision, model_->logits(),
                                                static_cast<const int32_t*>(b.labels()), &c->loss, &c->correct, nullptr,
                                                nullptr, 1.0f));
    }
    b.Release(ops_->stream());
    samples += b.size();
  }
  Counters h;
  GPUFEED_RETURN_IF_ERROR(ReadCounters(&h));
  r->test_loss = samples ? h.loss / samples : 0;
  r->test_accuracy = samples ? double(h.correct) / samples : 0;
  r->eval_seconds = NowSeconds() - t0;
  return Status::Ok();
}

Status Run::NodeEpoch(EpochReport* r) {
  own_epochs_.push_back(*r);
  if (!comm_) return Status::Ok();
  for (auto& [p, n] : model_->buffers()) GPUFEED_RETURN_IF_ERROR(comm_->Broadcast(p, n, 0));
  GPUFEED_RETURN_IF_ERROR(comm_->Join());
  struct Figures {
    double samples, loss, correct, seconds, wait, util, mem;
  };
  const Figures mine{double(r->samples),
                     r->train_loss * double(r->samples),
                     r->train_accuracy * double(r->samples),
                     r->seconds,
                     r->data_wait_seconds,
                     r->gpu_util,
                     r->gpu_mem_used_mb};
  std::vector<Figures> all(static_cast<size_t>(world()));
  GPUFEED_RETURN_IF_ERROR(comm_->AllGather(&mine, sizeof mine, all.data()));
  Figures node{};
  int util_n = 0;
  for (const Figures& f : all) {
    node.samples += f.samples, node.loss += f.loss, node.correct += f.correct;
    node.seconds = std::max(node.seconds, f.seconds);
    node.wait = std::max(node.wait, f.wait);
    if (f.util >= 0) node.util += f.util, ++util_n;
  }
  r->samples = uint64_t(node.samples);
  r->train_loss = node.samples ? node.loss / node.samples : 0;
  r->train_accuracy = node.samples ? std::round(node.correct) / node.samples : 0;
  r->seconds = node.seconds;
  r->samples_per_s = node.seconds > 0 ? node.samples / node.seconds : 0;
  r->step_ms = r->steps ? 1000.0 * node.seconds / r->steps : 0;
  r->data_wait_seconds = node.wait;
  r->gpu_util = util_n ? node.util / util_n : -1;
  return Status::Ok();
}

// The node's verdict and every rank's figures (data parallel), and the check
// that every rank ended with the same weights.
Status Run::NodeReport() {
  const Steady own = SteadyOf(own_epochs_);
  if (!comm_) return Status::Ok();
  struct Figures {
    double samples_per_s, util, wait;
    uint64_t hash;
  };
  const Figures mine{own.samples_per_s, own.gpu_util, own.wait, report_.weights_hash};
  std::vector<Figures> all(static_cast<size_t>(world()));
  GPUFEED_RETURN_IF_ERROR(comm_->AllGather(&mine, sizeof mine, all.data()));
  int limit = 0;
  for (int k = 0; k < world(); ++k) {
    const Figures& f = all[size_t(k)];
    if (f.hash != report_.weights_hash) {
      return Status::Internal("train: rank " + std::to_string(k) + " ended with other weights than rank " +
                              std::to_string(rank()) + " (data parallel ranks must agree bit for bit)");
    }
    RankReport rr;
    rr.rank = k;
    rr.samples_per_s = f.samples_per_s, rr.gpu_util = f.util, rr.data_wait_fraction = f.wait;
    rr.verdict = VerdictText(f.util, f.wait, report_.telemetry);
    report_.ranks.push_back(rr);
  }
  // The limit: the rank that waited for data longest when one waited 5% of
  // the time, else the least busy GPU.
  bool waited = false;
  for (const Figures& f : all) waited = waited || f.wait >= 0.05;
  for (int k = 1; k < world(); ++k) {
    const Figures &f = all[size_t(k)], &l = all[size_t(limit)];
    if (waited ? f.wait > l.wait : f.util < l.util) limit = k;
  }
  report_.verdict = "rank " + std::to_string(limit) + " of " + std::to_string(world()) +
                    " sets the node's pace: " + report_.ranks[size_t(limit)].verdict;
  if (probes_ > 0) {
    report_.allreduce_ms = probe_busy_ms_ / probes_;
    report_.allreduce_exposed_ms = probe_exposed_ms_ / probes_;
  }
  return Status::Ok();
}

Result<TrainReport> Run::Go() {
  auto r = GoRanks();
  // Another rank waiting on this one hears that it failed.
  if (!r.ok() && comm_) comm_->Abort();
  return r;
}

Result<TrainReport> Run::GoRanks() {
  run_start_ = NowSeconds();
  GPUFEED_RETURN_IF_ERROR(Setup());
  MemoryBreakdown& m = report_.memory;
  const MemoryBreakdown stages = pipeline_ ? pipeline_->memory() : MemoryBreakdown{};
  m.weights = pipeline_ ? stages.weights : model_->weight_bytes();
  m.gradients = pipeline_ ? stages.gradients : model_->grad_bytes();
  m.optimizer = pipeline_ ? stages.optimizer : model_->optimizer_bytes();
  // Activations: the model's buffers plus the device slots of the two feeds
  // alive at an epoch boundary (each: feed_slots output slots of a batch in
  // the compute dtype, 2 input slots of uint8), and the graphs' input copy.
  const uint64_t sample = uint64_t(geo_.c) * geo_.h * geo_.w;
  m.activations =
      (pipeline_ ? stages.activations : model_->activation_bytes()) +
      (ops_->on_gpu() ? 2 * o_.batch_size * sample * (uint64_t(o_.feed_slots) * DTypeSize(o_.precision) + 2) : 0) +
      (graphs_on_ ? o_.batch_size * (sample * DTypeSize(o_.precision) + 4) : 0);
  last_epoch_ = o_.epochs - 1;
  if (o_.stop_after_epochs > 0) last_epoch_ = std::min(last_epoch_, report_.start_epoch + o_.stop_after_epochs - 1);
  int ran = 0;
  for (int epoch = report_.start_epoch; epoch < o_.epochs; ++epoch) {
    if (o_.stop_after_epochs > 0 && ran == o_.stop_after_epochs) break;
    EpochReport r;
    GPUFEED_RETURN_IF_ERROR(TrainEpoch(epoch, &r));
    if (ran == 0) {  // after the first epoch every workspace exists
      m.workspace = pipeline_ ? pipeline_->memory().workspace : ops_->WorkspaceBytes();
      m.device_used = ops_->DeviceBytesUsed();
      if (o_.on_start) o_.on_start(report_.backend, report_.model, m);
    }
    GPUFEED_RETURN_IF_ERROR(NodeEpoch(&r));
    GPUFEED_RETURN_IF_ERROR(Evaluate(&r));
    report_.epochs.push_back(r);
    ++ran;
    if (!o_.checkpoint_path.empty() && rank() == 0) {
      trainer::CheckpointMeta meta{report_.model, ConfigString(o_), epoch + 1,
                                   step_,         scaler_host_,     EpochStart(o_.seed, uint64_t(epoch + 1))};
      GPUFEED_RETURN_IF_ERROR(trainer::SaveCheckpoint(o_.checkpoint_path, ops_.get(), model_.get(), meta));
    }
    if (o_.on_epoch) o_.on_epoch(r);
    if (o_.on_progress) {
      TrainProgress p;
      p.epoch = epoch, p.epochs = o_.epochs;
      p.step_in_epoch = p.steps_in_epoch = steps_per_epoch_;
      p.samples_per_s = r.samples_per_s;
      p.gpu_util = r.gpu_util;
      o_.on_progress(p);
    }
  }
  // Final weights' hash: resumed and uninterrupted runs must agree on it.
  if (pipeline_) {
    auto hash = pipeline_->WeightsHash();
    if (!hash.ok()) return hash.status();
    report_.weights_hash = *hash;
    pipeline_->Report(&report_);
  } else {
    XXH64_state_t* h = XXH64_createState();
    XXH64_reset(h, 0);
    std::vector<float> host;
    for (auto& p : model_->params()) {
      host.resize(p.n);
      GPUFEED_RETURN_IF_ERROR(ops_->Download(host.data(), p.master, p.n * 4));
      XXH64_update(h, host.data(), p.n * 4);
    }
    report_.weights_hash = XXH64_digest(h);
    XXH64_freeState(h);
  }
  if (!o_.merge_lora_path.empty() && rank() == 0) GPUFEED_RETURN_IF_ERROR(WriteMergedLora());
  report_.wall_seconds = NowSeconds() - run_start_;
  const Steady node = SteadyOf(report_.epochs);
  report_.steady_samples_per_s = node.samples_per_s;
  report_.steady_gpu_util = node.gpu_util;
  report_.data_wait_fraction = node.wait;
  report_.verdict = VerdictText(node.gpu_util, node.wait, report_.telemetry);
  if (graphs_on_) {
    report_.graphs =
        "on: " + std::to_string(graphs_.size()) + " step graph(s), " + std::to_string(replays_) + " replays";
  }
  GPUFEED_RETURN_IF_ERROR(NodeReport());
  return report_;
}

}  // namespace

Run::~Run() {
  for (auto& [key, g] : graphs_) ops_->DestroyGraph(g.exec);
}

Result<TrainReport> Train(const ChunkSource& train, const ChunkSource* test, const TrainOptions& options) {
  Run run(train, test, options);
  return run.Go();
}

}  // namespace gpufeed
