// The training run behind Train() (gpufeed/trainer.h), split by what it does:
// trainer/run_setup.cc checks the inputs and makes the backend, model,
// loaders and step state; trainer/run_epoch.cc runs an epoch's micro-batches
// and steps, and the evaluation; trainer/run_report.cc joins the ranks'
// figures and writes the report and verdict. Internal to the trainer module.
#ifndef GPUFEED_TRAINER_RUN_H_
#define GPUFEED_TRAINER_RUN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpufeed/dataset.h"
#include "gpufeed/gpu_feed.h"
#include "gpufeed/trainer.h"
#include "trainer/comm.h"
#include "trainer/model.h"
#include "trainer/nvml.h"
#include "trainer/ops.h"
#include "trainer/pipeline.h"

namespace gpufeed::training {

using trainer::Model;
using trainer::Ops;
using trainer::ScalerState;

// The loader's position a checkpoint saves: the start of `epoch` of the run
// with `seed` (checkpoints are written between epochs; a resume starts at
// CheckpointMeta::next_epoch). The shard and order fields stay "unknown".
LoaderState EpochStart(uint64_t seed, uint64_t epoch);

bool IsSgd(Optimizer o);
Status Validate(const TrainOptions& o);

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

Result<Geometry> SampleGeometry(const ChunkSource& src);
std::string ConfigString(const TrainOptions& o);

// Steady state: every epoch after the first when there are several (the
// first pays for cuDNN's plans, the page cache and the pools), else the one.
struct Steady {
  double samples_per_s = 0, gpu_util = -1, wait = 0;
};
Steady SteadyOf(const std::vector<EpochReport>& e);
// The verdict for a GPU busy `u` percent of the time (-1: unknown) that
// waited for data a fraction `w` of it.
std::string VerdictText(double u, double w, const std::string& telemetry);

class Run {
 public:
  Run(const ChunkSource& train, const ChunkSource* test, const TrainOptions& o) : train_(train), test_(test), o_(o) {}
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  Result<TrainReport> Go();

 private:
  // Setup's steps, in order: the samples and labels (the classes), the
  // checkpoint path and device asked for, the backend and collectives, the
  // model, the loaders and the feed, the step's device state, a resume, and
  // the telemetry.
  Status Setup();
  Status CheckSamples();
  Status CheckOutputAndDevice();
  Status MakeBackend();
  Status MakeModel(trainer::ModelSpec* spec);
  Status MakeLoaders();
  void SetFeedOptions();
  Status MakeStepState(const trainer::ModelSpec& spec);
  Status Resume();
  void StartTelemetry();
  Status TrainEpoch(int epoch, EpochReport* r);
  // device_resident_batches: a copy of `b` kept while fewer are kept.
  Status KeepResident(DeviceBatch& b, size_t img_bytes);
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
  // An epoch's trailing partial accumulation: its gradients summed across
  // the ranks (the pipeline's Step does that itself), then the step.
  Status PartialStep();
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
  // The report's parts: the memory known before the first epoch, the final
  // weights' hash, and the node's figures and verdict at the end.
  void MemoryBeforeTraining();
  Status HashWeights();
  Status FinishReport();
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
  trainer::ModelSpec whole_spec_;  // with stages: the whole model's (--merge-lora)
  int pipeline_probes_ = 8;        // steps timed for the bubble, from the third
  Status SetupPipeline(const trainer::ModelSpec& spec);
  // TrainReport::lora for a model with these parameters.
  std::string LoraText(const std::vector<std::string>& names) const;
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
  trainer::CommOptions comm_options_;  // comm_'s (pipeline stages derive theirs from it)
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

}  // namespace gpufeed::training

#endif  // GPUFEED_TRAINER_RUN_H_
