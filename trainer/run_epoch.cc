// The run's epochs (trainer/run.h): micro-batches from the feed (or the
// device-resident copies), each step's work recorded once as a CUDA graph
// and replayed, data parallel gradients bucketed into all-reduces during the
// backward pass, the optimizer step, and the evaluation.
//
// The loop never waits on the device in steady state: losses, accuracy and
// the loss scaler stay on the device and are read once per epoch; the
// GpuFeeder's slot events bound how far the host runs ahead.
#include <algorithm>

#include "common/clock.h"
#include "trainer/run.h"

namespace gpufeed::training {

// One micro-batch: forward, loss (gradient scaled by loss_scale / (n x
// accum)), backward into the fp32 gradients (added to when `accumulate`),
// then the optimizer step when `step`.
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

Status Run::PartialStep() {
  if (comm_ && !pipeline_) {
    // Its last micro-batch did not end a step, so nothing summed its
    // gradients across the ranks yet (each rank would step on its own).
    GPUFEED_RETURN_IF_ERROR(comm_->AllReduce(grads_.data(), grad_sizes_.data(), int(grads_.size())));
    GPUFEED_RETURN_IF_ERROR(comm_->Join());
  }
  GPUFEED_RETURN_IF_ERROR(pipeline_ ? pipeline_->Step(false) : OptimizerStep());
  ++step_;
  micro_ = 0;
  return Status::Ok();
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
      GPUFEED_RETURN_IF_ERROR(KeepResident(b, img_bytes));
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
  if (micro_ > 0) GPUFEED_RETURN_IF_ERROR(PartialStep());
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

Status Run::KeepResident(DeviceBatch& b, size_t img_bytes) {
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

}  // namespace gpufeed::training
