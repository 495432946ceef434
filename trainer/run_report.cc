// The run's ranks and report (trainer/run.h): the epochs in order, a
// checkpoint after each, the node's figures joined across data parallel
// ranks, the final weights' hash every rank must agree on, the verdict, and
// --merge-lora's checkpoint.
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "common/clock.h"
#include "trainer/checkpoint.h"
#include "trainer/run.h"

namespace gpufeed::training {

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

Status Run::WriteMergedLora() {
  // With stages the merged model is made in host memory (a CPU backend's)
  // from every stage's merged weights and statistics.
  std::unique_ptr<Ops> host;
  Ops* ops = ops_.get();
  std::vector<std::vector<float>> stage_buffers;
  Result<std::vector<std::vector<float>>> merged = std::vector<std::vector<float>>{};
  if (pipeline_) {
    host = trainer::MakeCpuOps();
    ops = host.get();
    GPUFEED_RETURN_IF_ERROR(pipeline_->MergedLora(&*merged, &stage_buffers));
  } else {
    merged = model_->MergedMasters();
  }
  if (!merged.ok()) return merged.status();
  // The same model without adapters, freezing or 8-bit states: what --init
  // and a plain run of these layers read.
  TrainOptions po = o_;
  po.lora_rank = 0, po.lora_alpha = 0, po.freeze.clear(), po.optimizer = Optimizer::kAdamW;
  trainer::ModelSpec spec = pipeline_ ? whole_spec_ : model_->spec();
  spec.lora_rank = 0, spec.lora_alpha = 0, spec.freeze.clear();
  spec.optimizer = trainer::OptimizerKind::kAdamW, spec.quantized_states = false;
  spec.memory_limit = 0;
  Model plain(ops, spec);
  GPUFEED_RETURN_IF_ERROR(plain.Init());
  if (plain.params().size() != merged->size()) return Status::Internal("--merge-lora: the merged model's parameters");
  for (size_t i = 0; i < merged->size(); ++i) {
    trainer::Param& p = plain.params()[i];
    if ((*merged)[i].size() != p.n) return Status::Internal("--merge-lora: " + p.name + "'s size");
    GPUFEED_RETURN_IF_ERROR(ops->Upload(p.master, (*merged)[i].data(), p.n * 4));
  }
  auto to = plain.buffers();
  if (pipeline_) {
    if (stage_buffers.size() != to.size()) return Status::Internal("--merge-lora: the stages' batchnorm statistics");
    for (size_t i = 0; i < to.size(); ++i) {
      if (stage_buffers[i].size() != to[i].second) return Status::Internal("--merge-lora: a statistic's size");
      GPUFEED_RETURN_IF_ERROR(ops->Upload(to[i].first, stage_buffers[i].data(), to[i].second * 4));
    }
  } else {
    auto from = model_->buffers();
    for (size_t i = 0; i < from.size() && i < to.size(); ++i)
      GPUFEED_RETURN_IF_ERROR(ops->Copy(to[i].first, from[i].first, from[i].second * 4));
  }
  const int epochs = report_.epochs.empty() ? report_.start_epoch : report_.epochs.back().epoch + 1;
  trainer::CheckpointMeta meta{
      plain.Describe(), ConfigString(po), epochs, step_, scaler_host_, EpochStart(o_.seed, uint64_t(epochs))};
  GPUFEED_RETURN_IF_ERROR(trainer::SaveCheckpoint(o_.merge_lora_path, ops, &plain, meta));
  report_.lora += "; merged into " + o_.merge_lora_path;
  return Status::Ok();
}

Status Run::NodeEpoch(EpochReport* r) {
  own_epochs_.push_back(*r);
  if (!comm_) return Status::Ok();
  if (pipeline_) {
    GPUFEED_RETURN_IF_ERROR(pipeline_->BroadcastBuffers());
  } else {
    for (auto& [p, n] : model_->buffers()) GPUFEED_RETURN_IF_ERROR(comm_->Broadcast(p, n, 0));
    GPUFEED_RETURN_IF_ERROR(comm_->Join());
  }
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
  MemoryBeforeTraining();
  MemoryBreakdown& m = report_.memory;
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
      GPUFEED_RETURN_IF_ERROR(pipeline_ ? pipeline_->SaveCheckpoint(o_.checkpoint_path, meta)
                                        : trainer::SaveCheckpoint(o_.checkpoint_path, ops_.get(), model_.get(), meta));
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
  GPUFEED_RETURN_IF_ERROR(HashWeights());
  GPUFEED_RETURN_IF_ERROR(FinishReport());
  return report_;
}

void Run::MemoryBeforeTraining() {
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
}

// The final weights' hash: resumed and uninterrupted runs must agree on it.
Status Run::HashWeights() {
  if (pipeline_) {
    auto hash = pipeline_->WeightsHash();
    if (!hash.ok()) return hash.status();
    report_.weights_hash = *hash;
    pipeline_->Report(&report_);
  } else {
    // Freed on every return: a failed download (a CUDA error) returned
    // past XXH64_freeState and leaked the state.
    std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> h(XXH64_createState(), &XXH64_freeState);
    if (!h) return Status::Internal("weights hash: no memory for xxHash's state");
    XXH64_reset(h.get(), 0);
    std::vector<float> host;
    for (auto& p : model_->params()) {
      host.resize(p.n);
      GPUFEED_RETURN_IF_ERROR(ops_->Download(host.data(), p.master, p.n * 4));
      XXH64_update(h.get(), host.data(), p.n * 4);
    }
    report_.weights_hash = XXH64_digest(h.get());
  }
  return Status::Ok();
}

// --merge-lora's checkpoint, the run's time, the node's steady figures and
// verdict, the graphs used, and (data parallel) every rank's figures.
Status Run::FinishReport() {
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
  return NodeReport();
}

Run::~Run() {
  for (auto& [key, g] : graphs_) ops_->DestroyGraph(g.exec);
}

}  // namespace gpufeed::training
