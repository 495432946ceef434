// The run's setup (trainer/run.h): the options and samples checked, then the
// backend, collectives, model, loaders, feed and step state made, in that
// order, and a checkpoint resumed.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/atomic_file.h"
#include "gpufeed/device.h"
#include "loader/batch_pool.h"
#include "loader/chunk_cache.h"
#include "trainer/checkpoint.h"
#include "trainer/elem.h"
#include "trainer/run.h"

namespace gpufeed::training {

// The loader's position a checkpoint saves: the start of `epoch` of the run
// with `seed` (checkpoints are written between epochs; a resume starts at
// CheckpointMeta::next_epoch). The shard and order fields stay "unknown".
LoaderState EpochStart(uint64_t seed, uint64_t epoch) {
  LoaderState s;
  s.seed = seed;
  s.epoch = epoch;
  return s;
}

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
  if (o.model == ModelKind::kResnet18 && o.channels.size() != 4)
    return Status::InvalidArgument(
        "train: resnet18 takes its four stages' channels (--channels 64,128,256,512, or smaller such as 8,8,16,16)");
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
  }
  return Status::Ok();
}

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
  // world: the data-parallel ranks (pipeline stages: the replicas), so that
  // a resume knows the global batch, batch x accum x world
  // (trainer::CheckResumeConfig).
  std::snprintf(buf, sizeof buf, "precision=%s optimizer=%s batch=%llu accum=%d world=%d seed=%llu",
                std::string(DTypeName(o.precision)).c_str(), OptimizerName(o.optimizer).c_str(),
                (unsigned long long)o.batch_size, o.accum, o.parallel.world_size, (unsigned long long)o.seed);
  // Freezing changes which tensors a checkpoint holds (frozen ones keep no
  // optimizer state); absent when nothing is frozen, as before.
  std::string s = buf;
  for (size_t i = 0; i < o.freeze.size(); ++i) s += (i == 0 ? " freeze=" : ",") + o.freeze[i];
  if (o.lora_rank > 0) s += " lora=" + std::to_string(o.lora_rank) + "/" + std::to_string(o.lora_alpha);
  return s;
}

std::string Run::LoraText(const std::vector<std::string>& names) const {
  int layers = 0;
  for (const std::string& n : names) layers += n.find(".lora_a") != std::string::npos;
  char buf[128];
  std::snprintf(buf, sizeof buf, "rank %d, alpha %g, adapters on %d layers", o_.lora_rank,
                o_.lora_alpha > 0 ? double(o_.lora_alpha) : double(o_.lora_rank), layers);
  return buf;
}

Status Run::Setup() {
  GPUFEED_RETURN_IF_ERROR(Validate(o_));
  GPUFEED_RETURN_IF_ERROR(CheckSamples());
  GPUFEED_RETURN_IF_ERROR(CheckOutputAndDevice());
  GPUFEED_RETURN_IF_ERROR(MakeBackend());
  trainer::ModelSpec spec;
  GPUFEED_RETURN_IF_ERROR(MakeModel(&spec));
  GPUFEED_RETURN_IF_ERROR(MakeLoaders());
  SetFeedOptions();
  GPUFEED_RETURN_IF_ERROR(MakeStepState(spec));
  if (o_.resume) GPUFEED_RETURN_IF_ERROR(Resume());
  StartTelemetry();
  return Status::Ok();
}

// The samples' geometry, the labels (class indices), the test split's
// agreement with the training split, and the number of classes.
Status Run::CheckSamples() {
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
  return Status::Ok();
}

// Found now, not after the first epoch's work: the checkpoint path must be
// writable, and the device asked for must be there.
Status Run::CheckOutputAndDevice() {
  if (!o_.checkpoint_path.empty() && !o_.resume && rank() == 0) {
    // Found now, not after the first epoch's work: the path must be writable.
    AtomicFile probe(o_.checkpoint_path);
    if (Status st = probe.Write("", 0); !st.ok()) return st.WithContext("train: --checkpoint");
  }
  if (o_.device == TrainDevice::kCuda && QueryGpus().devices.empty()) {
    return Status::Unsupported("train: --device cuda, but no CUDA GPU is visible on this machine (" +
                               QueryGpus().reason + "); use --device cpu or auto");
  }
  return Status::Ok();
}

// The backend (CPU or a CUDA device) and, data parallel, the collectives.
Status Run::MakeBackend() {
  if (o_.device == TrainDevice::kCpu || (o_.device == TrainDevice::kAuto && QueryGpus().devices.empty())) {
    ops_ = trainer::MakeCpuOps();
  } else {
    auto ops = trainer::MakeCudaOps(o_.cuda_device);
    if (!ops.ok()) return ops.status();
    ops_ = std::move(*ops);
  }
  report_.backend = ops_->Describe();
  if (world() > 1) {
    trainer::CommOptions& co = comm_options_;
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
  return Status::Ok();
}

// The model (or, with pipeline stages, the whole model's spec the stages
// are cut from), its LoRA adapters, the trained parameters, --init's weights.
Status Run::MakeModel(trainer::ModelSpec* spec_out) {
  trainer::ModelSpec& spec = *spec_out;
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
  if (!piped) {
    for (auto& p : model_->params()) {
      report_.parameter_names.push_back(p.name);
      if (p.frozen()) continue;  // no gradient to reduce, clip or apply
      report_.trainable_parameters += p.n;
      grads_.push_back(p.grad);
      grad_sizes_.push_back(p.n);
    }
  }
  if (o_.lora_rank > 0 && !piped) report_.lora = LoraText(report_.parameter_names);
  if (!o_.init_path.empty() && !o_.resume && !piped) {
    GPUFEED_RETURN_IF_ERROR(trainer::LoadWeights(o_.init_path, ops_.get(), model_.get(), &report_.init));
    GPUFEED_RETURN_IF_ERROR(model_->RefreshLoraWeights());
  }
  return Status::Ok();
}

// Two loaders over the training split (alternate epochs) or the batch
// source's, and the test split's.
Status Run::MakeLoaders() {
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
  return Status::Ok();
}

void Run::SetFeedOptions() {
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
}

// The steps' schedule, the device counters, loss scaler and gradient table,
// the optimizer (8-bit states), and the pipeline or the graphs' inputs.
Status Run::MakeStepState(const trainer::ModelSpec& spec) {
  const bool piped = o_.pipeline.stages > 1;
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
  return Status::Ok();
}

// --resume: the weights, step, next epoch and loss scaler of the checkpoint.
Status Run::Resume() {
  trainer::CheckpointMeta expect, meta;
  expect.model = report_.model;
  expect.config = ConfigString(o_);
  if (pipeline_) {  // every stage's tensors, step count and scaler
    GPUFEED_RETURN_IF_ERROR(pipeline_->LoadCheckpoint(o_.checkpoint_path, expect, &meta));
    step_ = meta.step;
    report_.start_epoch = meta.next_epoch;
    scaler_host_ = meta.scaler;
    return Status::Ok();
  }
  GPUFEED_RETURN_IF_ERROR(trainer::LoadCheckpoint(o_.checkpoint_path, ops_.get(), model_.get(), expect, &meta));
  GPUFEED_RETURN_IF_ERROR(model_->RefreshLoraWeights());
  step_ = meta.step;
  trainer::StepState st;
  st.step = step_;
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(step_state_.p, &st, sizeof st));
  report_.start_epoch = meta.next_epoch;
  scaler_host_ = meta.scaler;
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(scaler_.p, &scaler_host_, sizeof scaler_host_));
  return Status::Ok();
}

void Run::StartTelemetry() {
  if (ops_->on_gpu() && o_.telemetry) {
    nvml_ = std::make_unique<trainer::NvmlSampler>(ops_->PciBusId(), 0.1);
    if (!nvml_->ok()) report_.telemetry = nvml_->error();
  } else if (!ops_->on_gpu()) {
    report_.telemetry = "no GPU";
  }
}

Status Run::SetupPipeline(const trainer::ModelSpec& spec) {
  const int stages = o_.pipeline.stages;
  if (ops_->on_gpu() && int(QueryGpus().devices.size()) < o_.cuda_device + stages) {
    return Status::InvalidArgument("train: --pipeline-stages " + std::to_string(stages) + " from GPU " +
                                   std::to_string(o_.cuda_device) + " needs " +
                                   std::to_string(o_.cuda_device + stages) + " GPUs; this machine shows " +
                                   std::to_string(QueryGpus().devices.size()));
  }
  trainer::PipelineSetup ps;
  ps.whole = whole_spec_ = spec;
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
  ps.clip_norm = o_.clip_norm;
  ps.timeout_s = o_.parallel.timeout_s;
  if (comm_) {
    // Replicas: stage 0's gradients go through this rank's collectives, stage
    // s's through its own, among the replicas' stages s (a rendezvous each).
    ps.replicas = world();
    ps.first_comm = comm_.get();
    ps.bucket_bytes = o_.parallel.bucket_bytes;
    ps.make_comm = [co = comm_options_, gpu, first](int s, Ops* ops) -> Result<std::unique_ptr<trainer::Comm>> {
      trainer::CommOptions mine = co;
      mine.prefix += ".stage" + std::to_string(s);
      return gpu ? trainer::MakeNcclComm(mine, first + s, ops->stream()) : trainer::MakeShmComm(mine);
    };
  }
  auto p = trainer::Pipeline::Create(ops_.get(), ps);
  if (!p.ok()) return p.status();
  pipeline_ = std::move(*p);
  report_.model = pipeline_->model();
  report_.parameters = pipeline_->parameters();
  report_.parameter_names = pipeline_->parameter_names();
  report_.trainable_parameters = pipeline_->trainable_parameters();
  if (!o_.init_path.empty() && !o_.resume) {
    // --init: the whole model read on the host (LoadWeights' checks and
    // messages as without stages), then each stage's share of it.
    auto host = trainer::MakeCpuOps();
    trainer::ModelSpec ws = spec;
    ws.memory_limit = 0;
    Model whole(host.get(), ws);
    GPUFEED_RETURN_IF_ERROR(whole.Init());
    GPUFEED_RETURN_IF_ERROR(trainer::LoadWeights(o_.init_path, host.get(), &whole, &report_.init));
    GPUFEED_RETURN_IF_ERROR(pipeline_->InitFrom(whole));
  }
  if (o_.lora_rank > 0) report_.lora = LoraText(report_.parameter_names);
  return Status::Ok();
}

Status Run::SetupQuantizedStates() {
  std::vector<trainer::Quant8Tensor> tensors;
  std::vector<trainer::Quant8Block> blocks;
  trainer::Quant8Tables(*model_, &tensors, &blocks);
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

}  // namespace gpufeed::training
