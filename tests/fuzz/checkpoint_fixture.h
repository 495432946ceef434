// The model and config the checkpoint fuzz target loads into, shared with the
// seed generator so the seeds are checkpoints of exactly this model.
#ifndef GPUFEED_TESTS_FUZZ_CHECKPOINT_FIXTURE_H_
#define GPUFEED_TESTS_FUZZ_CHECKPOINT_FIXTURE_H_

#include <memory>

#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint.h"
#include "trainer/model.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {

struct CheckpointFixture {
  std::unique_ptr<Ops> ops = MakeCpuOps();
  std::unique_ptr<Model> model;
  CheckpointMeta expect;
  CheckpointFixture() {
    ModelSpec spec;
    spec.kind = ModelKind::kMlp;
    spec.widths = {3};
    spec.in_h = 2, spec.in_w = 2, spec.in_c = 1;
    spec.classes = 2;
    spec.max_batch = 1;
    model = std::make_unique<Model>(ops.get(), spec);
    if (!model->Init().ok()) fuzz::Fail("model init");
    expect.model = model->Describe();
    expect.config = "fuzz";
  }
};

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TESTS_FUZZ_CHECKPOINT_FIXTURE_H_
