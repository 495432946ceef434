// Train(): the training loop — feed, micro-batches, loss scaling, the
// optimizer step on a warmup + cosine schedule, evaluation, checkpoints, and
// the telemetry that ends in a verdict (input-bound or compute-bound).
//
// The loop never waits on the device in steady state: losses, accuracy and
// the loss scaler stay on the device and are read once per epoch; the
// GpuFeeder's slot events bound how far the host runs ahead.
//
// The run itself is training::Run (trainer/run.h), in three files by what it
// does: trainer/run_setup.cc, trainer/run_epoch.cc, trainer/run_report.cc.
#include "gpufeed/trainer.h"

#include "trainer/run.h"

namespace gpufeed {

Result<TrainReport> Train(const ChunkSource& train, const ChunkSource* test, const TrainOptions& options) {
  training::Run run(train, test, options);
  return run.Go();
}

}  // namespace gpufeed
