// Pipeline stages: one model's layers split into consecutive stages, each on
// a backend of its own (a GPU, or a CPU thread), trained with micro-batches
// on a GPipe or 1F1B schedule. Stage 0 runs in the caller's thread on the
// caller's backend; every later stage in a thread of its own. A stage hands
// its output forward, the last stage the gradient back, by a copy into the
// receiver's buffer for that micro-batch's slot, ordered by events: the
// sender waits until the receiver has freed the slot (its event), copies on
// its own stream, records its event and posts the slot full; the receiver
// waits for that, and frees the slot once its last read is queued. So no
// stage waits on the device for another; host threads only wait for the
// other's calls to be queued. The labels go from stage 0 to the last stage
// the same way. Each stage steps its own parameters after its last backward
// (data parallel: after summing its gradients with the other replicas').
#ifndef GPUFEED_TRAINER_PIPELINE_H_
#define GPUFEED_TRAINER_PIPELINE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpufeed/status.h"
#include "gpufeed/trainer.h"
#include "trainer/checkpoint.h"
#include "trainer/comm.h"
#include "trainer/model.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {

struct PipelineSetup {
  ModelSpec whole;  // the whole model; max_batch is the micro-batch
  int stages = 2;
  int micro = 4;  // micro-batches a step
  bool one_f_one_b = true;
  bool by_memory = false;
  uint64_t memory_limit = 0;  // a stage's bytes (model and pipeline buffers); 0: none
  // Makes stage s's backend (s >= 1), called in that stage's thread.
  std::function<Result<std::unique_ptr<Ops>>(int stage)> make_ops;
  OptimizerStep opt;
  Schedule schedule;
  ScalerState scaler;
  // Clip the whole model's gradient norm to this (0: off). The stages finish
  // their gradients together: the sum of squares chained through the stages
  // in order (the whole model's sum, bit for bit; each stage waits for its
  // device once a step for it), so every stage clips by the whole model's
  // norm and skips a step, and halves its scale, when any stage's gradients
  // are not finite; every stage's scaler stays the same.
  float clip_norm = 0;
  double timeout_s = 300;  // any wait for another stage
  // Data parallel (replicas > 1): this pipeline is replica `replica` of
  // `replicas`, each fed its own shard; each stage's gradients are summed
  // with the same stage's of the other replicas (a communicator per stage:
  // stage 0's is first_comm, the caller's; make_comm makes stage s's, s >= 1,
  // in that stage's thread with its backend) in buckets of about
  // bucket_bytes while the step's last backward pass goes on, before the
  // stage's optimizer step. So every replica's stage s steps with the same
  // sums and ends with the same weights.
  int replicas = 1;
  Comm* first_comm = nullptr;
  std::function<Result<std::unique_ptr<Comm>>(int stage, Ops* ops)> make_comm;
  uint64_t bucket_bytes = 1u << 20;
};

// Where the layers are cut: stage s holds [cuts[s], cuts[s + 1]). Minimizes
// the largest stage's cost, cost(first, end, stage); fits(first, end, stage)
// false rules a stage out. Empty when no cut fits.
std::vector<int> PartitionLayers(int layers, int stages, const std::function<double(int, int, int)>& cost,
                                 const std::function<bool(int, int, int)>& fits);

class Pipeline {
 public:
  // Cuts the model (measuring each layer's time on `first` unless
  // by_memory), starts the stages' threads and builds each stage there.
  static Result<std::unique_ptr<Pipeline>> Create(Ops* first, const PipelineSetup& setup);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Copies a micro-batch (stage 0's memory, its images in the model's dtype,
  // int32 labels, ready for stage 0's stream) into input slot pending().
  Status Add(const void* images, const void* labels, int n);
  int pending() const { return static_cast<int>(sizes_.size()); }
  // One optimizer step of every stage over the added micro-batches (their
  // gradients summed as accumulation over `micro` would). `probe`: the step
  // runs alone and each stage's compute is timed (TrainReport::bubble).
  Status Step(bool probe);
  // A forward pass of one batch in evaluation mode; its loss and correct
  // predictions are counted on the last stage.
  Status Evaluate(const void* images, const void* labels, int n);
  Status ZeroCounters();
  // Data parallel: every stage's batchnorm statistics from replica 0's.
  Status BroadcastBuffers();
  // A checkpoint of every stage, in the whole model's order (trainer/
  // checkpoint.h): it resumes with these stages, another cut or none. Load
  // restores the tensors, the step count and the loss scaler of each stage.
  Status SaveCheckpoint(const std::string& path, const CheckpointMeta& meta);
  Status LoadCheckpoint(const std::string& path, const CheckpointMeta& expect, CheckpointMeta* meta);
  // --init: every stage's parameters (by name) and batchnorm statistics from
  // `whole`, the whole model in host memory (a CPU backend's) that LoadWeights
  // filled; must outlive the call.
  Status InitFrom(Model& whole);
  // --merge-lora: every stage's Model::MergedMasters in the whole model's
  // order, and its batchnorm statistics (fp32 values, in order).
  Status MergedLora(std::vector<std::vector<float>>* masters, std::vector<std::vector<float>>* buffers);
  Status ReadCounters(double* loss, int64_t* correct);
  Status ReadScaler(ScalerState* s);  // stage 0's
  // XXH64 of every stage's fp32 masters, in the whole model's order (the
  // unpipelined model's weights_hash).
  Result<uint64_t> WeightsHash();

  const std::string& model() const { return describe_; }
  uint64_t parameters() const { return parameters_; }
  uint64_t trainable_parameters() const { return trainable_; }  // not frozen
  const std::vector<std::string>& parameter_names() const { return names_; }
  MemoryBreakdown memory() const;  // every stage's
  void Report(TrainReport* r) const;

 private:
  struct Stage;
  struct Mailbox;
  enum class Work { kSetup, kPeers, kStep, kEval, kZero, kRead, kHash, kBroadcast, kSave, kLoad, kInit, kMerge, kStop };
  Pipeline() = default;
  // Create's steps. Cut: cuts_, partition_ and layer_ms_ for `whole` (a
  // plan from `plan`, nothing allocated), by measured time or by memory;
  // StageBytes: what stage s holds with layers [a, b) (its model's bytes, a
  // plan, and the pipeline's slots for its inputs, gradients and labels);
  // TimeLayers: each layer's forward and backward, timed on a model of its
  // own on `first`; the *Refused: why no cut fits (ShortcutCutRefused:
  // resnet18's stages begin only between its basic blocks, where no
  // shortcut crosses, Model::StageMayBeginAt). StartStages: the
  // hand-offs, and the stages (stage 0 on `first` here, the others in their
  // threads), each built and its peers enabled.
  Status Cut(Ops* first, const ModelSpec& plan, const Model& whole);
  Result<uint64_t> StageBytes(Ops* first, const ModelSpec& plan, int a, int b, int s) const;
  Result<std::vector<double>> TimeLayers(Ops* first) const;
  Status RecomputeCutRefused(const Model& whole) const;
  Status ShortcutCutRefused(const Model& whole) const;
  Status MemoryCutRefused(double whole_bytes) const;
  Status StartStages(Ops* first);
  Status Everyone(Work w, bool probe = false);  // runs w on every stage, stage 0 here
  Status RunStage(Stage& st, Work w, bool probe);
  Status SetupStage(Stage& st);
  Status StepStage(Stage& st, bool probe);
  Status Forward(Stage& st, int j, bool training);
  // `last`: the step's last micro-batch (data parallel: its gradients are
  // summed across the replicas as they are produced).
  Status Backward(Stage& st, int j, bool last);
  Status FlushBucket(Stage& st);
  // The stage's optimizer step (its gradients finished): ApplyOptimizer, the
  // 8-bit states' ApplyOptimizer8bit, LoRA's refreshed weights.
  Status OptimizeStage(Stage& st);
  Status SetupQuantized(Stage& st);
  Status SaveStage(Stage& st);
  Status LoadStage(Stage& st);
  Status InitStage(Stage& st);
  // The whole model's sum of squares: this stage's added to the previous
  // stages' (it waits for them), then the last stage's total (it waits for it).
  Result<double> ChainSumSquares(Stage& st, float* const* ptrs, const size_t* sizes);
  Status Mark(Stage& st, bool begin);
  Status Send(Stage& st, Mailbox& m, void* dst, const void* src, size_t bytes, int n);
  Status Receive(Stage& st, Mailbox& m);
  Status Free(Stage& st, Mailbox& m);
  Status Barrier();
  void Fail(const Status& st);
  void WorkerLoop(Stage* st);

  PipelineSetup setup_;
  std::vector<int> cuts_;
  std::string partition_;
  std::vector<std::unique_ptr<Stage>> stages_;
  // Activation sets stage s keeps: 1F1B has at most stages - s micro-batches
  // in flight there, GPipe every one of the step.
  int Slots(int s) const { return setup_.one_f_one_b ? std::min(setup_.micro, setup_.stages - s) : setup_.micro; }
  std::vector<int> sizes_;  // the pending micro-batches' sizes
  std::string describe_;
  uint64_t parameters_ = 0, trainable_ = 0;
  std::vector<std::string> names_;
  // kInit's source: the whole model's parameters by name, its buffers.
  std::map<std::string, const Param*> init_params_;
  std::vector<std::pair<float*, size_t>> init_buffers_;
  // kLoad's step count and scaler, set before the stages run it.
  int64_t load_step_ = 0;
  ScalerState load_scaler_;
  std::vector<double> layer_ms_;  // each layer's, measured for the cut (empty: cut by memory)
  double busy_ms_total_ = 0, span_ms_total_ = 0;
  int probes_ = 0;
  struct Shared;
  std::unique_ptr<Shared> sh_;
};

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_PIPELINE_H_
