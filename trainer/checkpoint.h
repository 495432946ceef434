// Training checkpoints: everything a resumed run needs to continue bit for
// bit — fp32 master weights, optimizer state, batchnorm running statistics,
// the loss scaler, the step counter and the loader position. The RNG needs no
// state: initialisation and augmentation are pure functions of (seed, epoch,
// batch).
//
// Format (little-endian): "GPFDCKPT" magic, u32 version, u32 0, u64 payload
// bytes, u64 XXH64(payload), payload. Written to PATH.tmp-PID and renamed, so
// a crash never leaves a half checkpoint under PATH.
#ifndef GPUFEED_TRAINER_CHECKPOINT_H_
#define GPUFEED_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpufeed/loader.h"
#include "gpufeed/status.h"
#include "trainer/model.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {

// 2: each tensor's length in bytes (8-bit optimizer states); 1 (fp32 values
// only, lengths in values) is still read.
constexpr uint32_t kCheckpointVersion = 2;

struct CheckpointMeta {
  std::string model;   // Model::Describe(): must match on load
  std::string config;  // precision/optimizer/accum...: must match on load
  int next_epoch = 0;
  int64_t step = 0;  // optimizer steps taken
  ScalerState scaler;
  LoaderState loader;
};

// Whether a run whose ConfigString is `ours` continues one trained with
// `saved` (both "precision=.. optimizer=.. batch=.. accum=.. world=.. .."):
// everything but the batch split must be the same, and the split must give
// the same global batch (batch x accum x world: the same training, at any
// width), or the same batch and accum per rank (another world size: the
// global batch changes with it, as before the global batch was recorded).
// A checkpoint without world= (an older gpufeed's) resumes by the second
// rule only. InvalidArgument naming both global batches and a split that fits.
Status CheckResumeConfig(const std::string& path, const std::string& saved, const std::string& ours);

Status SaveCheckpoint(const std::string& path, Ops* ops, Model* model, const CheckpointMeta& meta);

// The tensors a checkpoint holds, as (backend address, bytes): a model's
// parameters (each master, then its optimizer state), then its batchnorm
// buffers. A checkpoint of one model is ParamTensors then BufferTensors; of
// pipeline stages, every stage's ParamTensors in order, then every stage's
// BufferTensors: the order of the whole model's, so either resumes the other.
std::vector<std::pair<void*, size_t>> ParamTensors(Model* model);
std::vector<std::pair<void*, size_t>> BufferTensors(Model* model);
// The file with these tensors' bytes, in order (atomically).
Status WriteCheckpoint(const std::string& path, const CheckpointMeta& meta, const std::vector<std::string>& tensors);
// The tensors' bytes of a checkpoint whose model and config fit `expect`
// (as LoadCheckpoint), checked against the `sizes` the run holds.
Status ReadCheckpoint(const std::string& path, const CheckpointMeta& expect, const std::vector<size_t>& sizes,
                      CheckpointMeta* meta, std::vector<std::string>* tensors);
// Restores into `model` (already Init()ed with the same spec) and fills meta.
// `expect` gives the model that must match and the config that must fit
// (CheckResumeConfig).
Status LoadCheckpoint(const std::string& path, Ops* ops, Model* model, const CheckpointMeta& expect,
                      CheckpointMeta* meta);
// Starts `model` from the weights of a checkpoint (TrainOptions::init_path):
// fp32 masters and batchnorm statistics, whatever optimizer, precision or
// freezing it was trained with; not its optimizer state, step or position.
// The layers must be the same; a head of another size (other classes) keeps
// its fresh initialisation. *note says what was taken.
Status LoadWeights(const std::string& path, Ops* ops, Model* model, std::string* note);

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_CHECKPOINT_H_
