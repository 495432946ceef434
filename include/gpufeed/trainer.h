// The built-in trainer: a small image classifier (MLP or CNN) trained on a
// gpufeed Dataset through the Loader and GpuFeeder, on cuBLAS/cuDNN or on
// the CPU, with the telemetry that shows whether the input keeps the GPU
// busy. It exists so users can see their pipeline feed a GPU, measured, and
// so the loader and feed are exercised end to end.
//
//   auto train = gpufeed::Dataset::Open("fmnist-train.h5");
//   auto test = gpufeed::Dataset::Open("fmnist-t10k.h5");
//   gpufeed::TrainOptions o;            // mlp 256-128, AdamW, fp32, 10 epochs
//   auto report = gpufeed::Train(*train, &*test, o);   // Result<TrainReport>
//   if (report.ok()) printf("%.4f\n", report->epochs.back().test_accuracy);
//
// Models (NHWC activations throughout):
//   mlp: flatten -> [linear -> ReLU] per width -> linear to the classes.
//   cnn: per channel count: conv3x3 (pad 1, no bias) -> batchnorm -> ReLU ->
//        maxpool 2x2; then flatten -> linear to the classes.
// Precision: fp32; bf16 or fp16 activations and weight copies with fp32
// master weights, fp32 gradients and fp32 accumulation; fp16 adds dynamic
// loss scaling (start 2^16, halve and skip the step on inf/NaN, double after
// `growth_interval` clean steps).
//
// Determinism: with the same options and data, the losses and weights are
// the same on every run of the same backend (fixed-order reductions,
// deterministic cuDNN algorithms, seeded initialisation, augmentation keyed by
// (seed, epoch, batch)); so a run resumed from a checkpoint reproduces an
// uninterrupted run bit for bit. The CPU and CUDA backends agree to within
// rounding, not bit for bit.
//
// Thread-safety: Train() is a blocking call; run one per process per device.
#ifndef GPUFEED_TRAINER_H_
#define GPUFEED_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpufeed/chunk_source.h"
#include "gpufeed/dtype.h"
#include "gpufeed/loader.h"
#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// ModelKind, Optimizer and TrainDevice, and their names: gpufeed/names.h.

struct TrainOptions {
  // Where the training batches come from. Empty: Loaders over `train`. Set
  // (the CLI sets it for a daemon address): called twice with the trainer's
  // loader options (epochs overlap on two streams), e.g. to make
  // RemoteLoaders of a `gpufeed serve` daemon; `train` still describes the
  // samples (shape, labels, class names, layout, mean/std) and must hold the
  // same dataset (its shape and sample count are checked against the
  // source's).
  std::function<Result<std::unique_ptr<BatchSource>>(const LoaderOptions&)> train_source;
  ModelKind model = ModelKind::kMlp;
  std::vector<int> widths = {256, 128};  // mlp hidden layers
  std::vector<int> channels = {32, 64};  // cnn blocks
  DType precision = DType::kFloat32;     // kFloat32, kBFloat16, kFloat16
  Optimizer optimizer = Optimizer::kAdamW;
  float lr = 1e-3f;                                 // peak learning rate
  float momentum = 0.9f;                            // SGD
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW
  float weight_decay = 1e-4f;                       // not applied to biases and batchnorm
  float warmup_epochs = 0.5f;                       // linear warmup, then cosine to 0 at the end
  int epochs = 10;
  uint64_t batch_size = 256;  // micro-batch: one loader batch
  int accum = 1;              // micro-batches per optimizer step
  float clip_norm = 0;        // clip the global gradient norm (0: off)
  int echo = 1;               // GpuFeeder echo factor (0: auto; the schedule then assumes 1)
  int crop_padding = 0;       // random crop with this padding (0: off)
  // Batches the feed may have ready on the device (FeedOptions::slots), each
  // a batch in the compute dtype: more absorb the host's jitter (6 against 3
  // took the mlp from 50% to 58% busy and two ranks' cnn from 1.80x to 1.86x
  // one GPU, H100, 2026-11-25).
  int feed_slots = 6;
  bool flip = false;  // random horizontal flip
  uint64_t seed = 0;
  int growth_interval = 2000;  // fp16 loss scaler
  float init_scale = 65536;    // fp16 loss scaler
  TrainDevice device = TrainDevice::kAuto;
  int cuda_device = 0;
  // Loader settings (order, threads, prefetch, cache...). batch_size, seed,
  // drop_last (true: every micro-batch full) and pin_memory are set by the
  // trainer. Two loaders run over the training split — this epoch's and,
  // from its middle on, the next one's, so epochs meet without a pipeline
  // refill — and they split cache_bytes between them.
  LoaderOptions loader;
  // Encoded images the feed decodes (loader.defer_decode, the GPU's JPEG
  // decoder): a sample that does not decode is replaced by its batch's
  // next one, as the loader's decode stage does with DecodeOptions::
  // skip_corrupt; false: the error names it.
  bool skip_corrupt = false;
  // Checkpoint file written after every epoch (atomically: tmp + rename).
  // Empty: none.
  std::string checkpoint_path;
  bool resume = false;  // continue from checkpoint_path
  // Start from the weights of this checkpoint (fp32 masters and batchnorm
  // statistics; not its optimizer state, step or loader position), trained
  // with any optimizer, precision or freezing. The layers must be the same;
  // a head of another size (other classes) starts fresh. Ignored when
  // resuming (the checkpoint being resumed holds the weights).
  std::string init_path;
  // Parameters to freeze, by name prefix ("conv0" freezes conv0.weight,
  // conv0.bn.gamma and conv0.bn.beta; "linear9.bias" only that): no
  // gradient, no optimizer state (no memory for either), never updated; the
  // backward pass stops below the first layer that trains. Batchnorm layers
  // still update their running statistics, as PyTorch's do in train mode.
  // Names are those of TrainReport::parameter_names.
  std::vector<std::string> freeze;
  // LoRA (rank > 0): low-rank adapters A [rank, fan_in], B [out, rank] on
  // every linear and conv layer but the head (a conv's filters taken as a
  // [out, 9 x in] matrix: A a 3x3 conv to `rank` channels, B a 1x1 conv),
  // each weight used as W + (lora_alpha / rank) B A. The adapters and the
  // head train; every other parameter is frozen (no gradient, no optimizer
  // state). alpha 0: alpha = rank.
  int lora_rank = 0;
  float lora_alpha = 0;
  // After training (rank 0): a checkpoint of the model without adapters,
  // each weight W + (alpha / rank) B A, for --init or evaluation. Needs
  // lora_rank > 0.
  std::string merge_lora_path;
  // cnn: the backward pass recomputes each block's conv and batchnorm
  // outputs from the block's input instead of keeping them (activation
  // memory: one block's instead of every block's), with the same kernels on
  // the same values, so the weights are the same bits as without.
  bool recompute_blocks = false;
  int stop_after_epochs = 0;  // stop (as if interrupted) after this many epochs (0: run all)
  // Compute ceiling: train on the first `device_resident_batches` batches
  // kept on the device, cycled, for as many steps as a real epoch (0: off).
  int device_resident_batches = 0;
  bool telemetry = true;  // NVML sampling thread (when NVML loads)
  // Called once, when the first epoch has ended (every workspace exists then,
  // so the memory breakdown is complete), with the model and its memory.
  std::function<void(const std::string& backend, const std::string& model, const struct MemoryBreakdown&)> on_start;
  // Called as each epoch ends (after its evaluation and checkpoint), so a
  // run stopped later keeps every finished epoch's figures.
  std::function<void(const struct EpochReport&)> on_epoch;
  // Called about every `progress_every` steps and at each epoch's end.
  std::function<void(const struct TrainProgress&)> on_progress;
  int progress_every = 20;
  // CUDA backend: record each training step (forward, loss, backward,
  // all-reduce, optimizer) once as a CUDA graph and replay it, one launch a
  // step instead of one per kernel. The weights are the same bits as without
  // graphs. Where a step cannot be captured, TrainReport::graphs says why and
  // the kernels are launched one by one.
  bool cuda_graphs = true;
  // Data parallel: this process is rank `rank` of `world_size` (one GPU or
  // CPU backend each, cuda_device its GPU), fed its shard of the training
  // split (LoaderOptions::rank/world_size; every batch full), its gradients
  // summed with the other ranks' (NCCL on GPUs, shared memory for CPU
  // ranks) in buckets of about bucket_bytes while the backward pass goes on.
  // Every rank ends with the same weights; rank 0 writes the checkpoints
  // (taken at epoch ends; the learning-rate schedule goes on from the saved
  // step count over the steps an epoch has at the new size). A checkpoint
  // resumes at another world size with the same global batch
  // (batch_size x accum x world_size: 2 x 128 as 1 x 256 or 1 x 128 x accum
  // 2, the same steps an epoch), or with the same batch_size and accum (the
  // global batch changes with the ranks); any other split is refused. Every
  // rank evaluates the whole test split with rank 0's batchnorm statistics.
  // Batchnorm normalizes over each rank's own batch (as PyTorch's DDP without
  // SyncBatchNorm). `gpufeed train --gpus N` and torchrun set these from
  // RANK, WORLD_SIZE and LOCAL_WORLD_SIZE.
  struct Parallel {
    int rank = 0, world_size = 1;
    int local_world_size = 1;  // ranks on this host (rendezvous through its node directory when all are)
    std::string rendezvous;    // path prefix the ranks meet at; empty: derived from the job (trainer/comm.h)
    double timeout_s = 300;    // rendezvous and every wait on another rank (CPU ranks)
    uint64_t bucket_bytes = 1u << 20;
  } parallel;
  // Pipeline stages (stages > 1): the model's layers split into `stages`
  // consecutive stages, stage s on GPU cuda_device + s (the CPU backend: a
  // thread each), activations passed forward and their gradients back by
  // peer copies ordered by events. An optimizer step takes micro_batches
  // loader batches (each --batch-size; as accum = micro_batches without
  // stages, whose weights a pipelined run reproduces), scheduled GPipe (all
  // forwards, then all backwards: micro_batches activation sets a stage) or
  // 1F1B (at most `stages` in flight). The cut balances each stage's
  // measured layer time (by_memory: its bytes), within memory_limit.
  // With data parallel (parallel.world_size > 1) each rank is a replica of
  // the pipeline (its stages on GPUs cuda_device .. cuda_device + stages - 1;
  // `gpufeed train` sets cuda_device to LOCAL_RANK x stages), fed its shard;
  // each stage's gradients are summed with the other replicas' same stage
  // (a communicator per stage, in buckets of parallel.bucket_bytes during
  // the step's last backward pass), so the replicas train the weights of
  // accum = micro_batches without stages at the same world size.
  // With stages too: clip_norm over the whole model's norm; fp16 with one
  // loss scale (a non-finite gradient in any stage skips the step in all);
  // 8-bit states; freeze, LoRA (merge_lora_path too) and init_path;
  // device_resident_batches and train_source; checkpoint_path/resume (one
  // checkpoint in the whole model's order: it resumes with other stages or
  // none); recompute_blocks (the cut then falls only at a block's edge).
  struct Pipeline {
    int stages = 1;
    int micro_batches = 4;
    bool one_f_one_b = true;
    bool by_memory = false;
  } pipeline;
  // Device bytes one GPU (pipeline: each stage) may hold for the model's
  // weights, gradients, optimizer state and activations; 0: no limit. A
  // model that needs more is an error naming what it needs.
  uint64_t memory_limit = 0;
};

struct TrainProgress {
  int epoch = 0, epochs = 0;
  uint64_t step_in_epoch = 0, steps_in_epoch = 0;
  double samples_per_s = 0;
  double gpu_util = -1;  // percent, -1 when unknown
};

struct MemoryBreakdown {
  uint64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, workspace = 0;  // bytes
  uint64_t device_used = 0;  // what the device reports in use (0 on the CPU)
  uint64_t total() const { return weights + gradients + optimizer + activations + workspace; }
};

struct EpochReport {
  int epoch = 0;
  double train_loss = 0, train_accuracy = 0;  // over the epoch's (fresh and echoed) samples
  double test_loss = 0, test_accuracy = 0;    // -1 without a test split
  uint64_t steps = 0, samples = 0, skipped_steps = 0;
  double loss_scale = 1;
  double seconds = 0, samples_per_s = 0, step_ms = 0;
  double data_wait_seconds = 0;                // the trainer waited for the feed
  double gpu_util = -1, gpu_mem_used_mb = -1;  // NVML means over the epoch (-1: not available)
  double eval_seconds = 0;
};

// One rank's steady-state figures and verdict (TrainReport::ranks).
struct RankReport {
  int rank = 0;
  double samples_per_s = 0, gpu_util = -1, data_wait_fraction = 0;
  std::string verdict;
};

struct TrainReport {
  std::string backend;  // "cuda (NVIDIA H200)" or "cpu"
  std::string model;    // e.g. "mlp 784-256-128-10"
  uint64_t parameters = 0;
  MemoryBreakdown memory;
  std::vector<EpochReport> epochs;  // the epochs this call ran
  int start_epoch = 0;              // > 0 when resumed
  double wall_seconds = 0;          // the whole call, data loading included
  double steady_gpu_util = -1;      // NVML mean after the first epoch (or its first 10%)
  double steady_samples_per_s = 0;
  double data_wait_fraction = 0;             // of the training time
  std::string telemetry;                     // why NVML is off, if it is
  std::string verdict;                       // "compute-bound ...", "input-bound ..." or "host-bound ..."
  uint64_t weights_hash = 0;                 // XXH64 of the fp32 master weights at the end
  std::string graphs;                        // "on: ..." or "off: why"
  std::string init;                          // where the weights started (TrainOptions::init_path), empty: fresh
  std::vector<std::string> parameter_names;  // every parameter, in order ("conv0.weight", ...)
  uint64_t trainable_parameters = 0;         // those not frozen
  std::string lora;                          // "rank 4, alpha 4, adapters on 3 layers[; merged into PATH]"
  // Data parallel (world_size > 1): "2 ranks, nccl 2.28.9"; the epochs'
  // samples, losses and rates are the node's (all ranks), the verdict the
  // limiting rank's; every rank's own figures in `ranks`.
  std::string parallel;
  std::vector<RankReport> ranks;
  // All-reduce per optimizer step, measured on 16 steps of the first epoch
  // (GPU ranks; -1 otherwise): time on the collectives' stream, and the part
  // of it the compute stream waited for after its backward pass.
  double allreduce_ms = -1, allreduce_exposed_ms = -1;
  // Pipeline stages: "2 stages, 1f1b, 8 micro-batches a step, cut by
  // measured time"; each stage's layers, backend, memory and share of a
  // step busy; the bubble (the idle share of a step, measured on 8 steps of
  // the first epoch) and its bound (stages - 1) / (micro-batches + stages - 1).
  struct Stage {
    std::string layers;   // "0-5: conv0 .. pool2"
    std::string backend;  // "cuda:1 ..."
    MemoryBreakdown memory;
    double busy = -1;  // share of the measured steps this stage computed
    // A micro-batch's forward and backward here: as the cut measured the
    // layers alone (-1: cut by memory) and as the measured steps ran them.
    double profiled_ms = -1, measured_ms = -1;
  };
  // bubble_stage_bound: the bound for the stages' measured times, which are
  // never equal: a step at best takes (micro-batches - 1) x the slowest
  // stage's time plus every stage's once.
  std::string pipeline;
  std::vector<Stage> stages;
  double bubble = -1, bubble_bound = -1, bubble_stage_bound = -1;
};

// Trains on `train` (evaluating on `test` after every epoch when not null;
// both must outlive the call). A Dataset's layout/mean/std attributes are used
// when present (see FeedOptions); samples are uint8 [C, H, W], [H, W, C] (an
// "NHWC" layout attribute) or [H, W]; classes = 1 + the largest label.
// Errors: bad options (InvalidArgument naming the option), a dataset that is
// not [N, C, H, W] / [N, H, W, C] uint8 with labels, a loader or CUDA failure,
// an unreadable or mismatched checkpoint (Corrupt / InvalidArgument).
Result<TrainReport> Train(const ChunkSource& train, const ChunkSource* test, const TrainOptions& options);

}  // namespace gpufeed

#endif  // GPUFEED_TRAINER_H_
