// Pipeline stages: the cut, the stages' threads, the schedules and the
// hand-offs between stages (see pipeline.h).
#include "trainer/pipeline.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include "common/clock.h"
#include "common/mutex.h"
#include "gpufeed/logger.h"
#include "trainer/elem.h"

namespace gpufeed::trainer {

std::vector<int> PartitionLayers(int layers, int stages, const std::function<double(int, int, int)>& cost,
                                 const std::function<bool(int, int, int)>& fits) {
  // best[s][i]: the smallest largest cost of stages 0..s over layers [0, i).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages), std::vector<double>(size_t(layers) + 1, inf));
  std::vector<std::vector<int>> from(size_t(stages), std::vector<int>(size_t(layers) + 1, -1));
  for (int i = 1; i <= layers; ++i)
    if (fits(0, i, 0)) best[0][size_t(i)] = cost(0, i, 0);
  for (int s = 1; s < stages; ++s)
    for (int i = s + 1; i <= layers; ++i)
      for (int j = s; j < i; ++j) {
        if (best[size_t(s - 1)][size_t(j)] == inf || !fits(j, i, s)) continue;
        const double c = std::max(best[size_t(s - 1)][size_t(j)], cost(j, i, s));
        if (c < best[size_t(s)][size_t(i)]) best[size_t(s)][size_t(i)] = c, from[size_t(s)][size_t(i)] = j;
      }
  if (best[size_t(stages - 1)][size_t(layers)] == inf) return {};
  std::vector<int> cuts(size_t(stages) + 1, 0);
  cuts[size_t(stages)] = layers;
  for (int s = stages - 1, i = layers; s > 0; --s) i = cuts[size_t(s)] = from[size_t(s)][size_t(i)];
  return cuts;
}

namespace {

struct Counters {  // as the trainer's: summed on the last stage
  double loss = 0;
  int64_t correct = 0;
};

// The end of a wait of `seconds` from now, rounded up to the clock's tick as
// std::condition_variable::wait_for rounds it.
std::chrono::steady_clock::time_point WaitDeadline(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::ceil<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

// A slot's hand-off from a sending stage to a receiving one.
struct Pipeline::Mailbox {
  // Under Shared::mu (not annotated: a mailbox does not name its mutex). `n`
  // is read without it by the receiver once it has seen `full`.
  bool full = false;
  int n = 0;
  void* produced = nullptr;  // the sender's, when what it sends is computed
  void* ready = nullptr;     // the sender's, recorded after its copy
  void* freed = nullptr;     // the receiver's, recorded after its last read
  Ops* sender = nullptr;
  Ops* receiver = nullptr;
};

struct Pipeline::Stage {
  int index = 0;
  Ops* ops = nullptr;
  std::unique_ptr<Ops> owned_ops;
  std::unique_ptr<Model> model;
  std::vector<void*> buffers;   // freed with the stage
  uint64_t pipeline_bytes = 0;  // input, gradient and label slots
  // Inputs: stage 0 a micro-batch a slot (from Add), later stages the
  // previous stage's outputs; the gradients from the next stage; the labels
  // (the last stage).
  std::vector<void*> x, dy, labels;
  std::vector<int> n;  // each micro-batch's size, as it arrived
  // The copies out of this stage's buffers run on its copy stream: before
  // the compute stream writes a buffer again, it waits for the last copy
  // out of it (the event of the mailbox it went to; a later copy's record
  // there is later still, so the wait is never short).
  std::vector<void*> sent_out;  // by activation slot
  void* sent_grad = nullptr;    // the input gradient's buffers
  std::vector<void*> sent_lab;  // stage 0: by input slot
  // Optimizer: scaler, step state, the gradients' pointer table; the loss
  // counters on the last stage; 8-bit states' tables (Quant8Tables).
  void *scaler = nullptr, *step = nullptr, *ptrs = nullptr, *counters = nullptr;
  void *quant_tensors = nullptr, *quant_table = nullptr, *quant_codes = nullptr;
  int quant_blocks = 0;
  int grads = 0;
  // Timing of probe steps: an event pair a forward or backward, the step's
  // start and the end of its last backward.
  std::vector<void*> marks;
  void *start = nullptr, *end = nullptr;
  bool probing = false;
  int op = 0;                       // the probe step's computations so far
  double busy_ms = 0, span_ms = 0;  // the last probe step's
  double busy_ms_sum = 0;           // every probe step's
  // Data parallel: the collectives among this stage's replicas (stage 0:
  // the caller's), and the bucket the last backward fills.
  Comm* comm = nullptr;
  std::unique_ptr<Comm> owned_comm;
  std::vector<float*> bucket;
  std::vector<size_t> bucket_sizes;
  uint64_t bucket_bytes = 0;
  std::vector<float> host;  // kHash: this stage's masters
  // kSave: this stage's tensors' bytes (ParamTensors, BufferTensors); kLoad:
  // the bytes to restore.
  std::vector<std::string> saved_params, saved_buffers;
  std::vector<std::vector<float>> merged, merged_buffers;  // kMerge
  Counters read;                                           // kRead: the last stage's counters
  std::thread thread;
  ~Stage() {
    owned_comm.reset();  // before the backend its stream belongs to
    if (!ops) return;
    for (void* p : buffers) ops->Free(p);
    for (void* e : marks) ops->DestroyEvent(e);
    ops->DestroyEvent(start);
    ops->DestroyEvent(end);
  }
  Status Alloc(size_t bytes, void** p, uint64_t* counter) {
    GPUFEED_RETURN_IF_ERROR(ops->Alloc(bytes, p));
    buffers.push_back(*p);
    if (counter) *counter += bytes;
    return Status::Ok();
  }
};

// What the threads share: the hand-offs, the work posted to the stages and
// their answers, the barrier of probe steps, and the first failure.
struct Pipeline::Shared {
  Mutex mu;
  CondVar cv;
  // fwd[s][k]: stage s to s + 1 into its slot k; bwd[s][k]: stage s + 1 to
  // s into s's slot k; lab[k]: the labels, stage 0 to the last. The vectors
  // are sized before the threads start; each mailbox's full and n are under mu.
  std::vector<std::vector<Mailbox>> fwd, bwd;
  std::vector<Mailbox> lab;
  Work work GUARDED_BY(mu) = Work::kStop;
  bool probe GUARDED_BY(mu) = false;
  uint64_t generation GUARDED_BY(mu) = 0;  // of `work`
  int done GUARDED_BY(mu) = 0;
  int arrived GUARDED_BY(mu) = 0;
  uint64_t barrier_round GUARDED_BY(mu) = 0;
  // ChainSumSquares: the stage whose turn it is, and the sum so far (reset
  // by Step before the stages start).
  int chain_next GUARDED_BY(mu) = 0;
  double chain_sum GUARDED_BY(mu) = 0;
  bool failed GUARDED_BY(mu) = false;
  Status failure GUARDED_BY(mu);
};

Result<std::unique_ptr<Pipeline>> Pipeline::Create(Ops* first, const PipelineSetup& setup) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->setup_ = setup;
  p->sh_ = std::make_unique<Shared>();
  const int P = setup.stages, M = setup.micro;
  if (P < 2) return Status::InvalidArgument("pipeline: --pipeline-stages must be >= 2");
  if (M < 1) return Status::InvalidArgument("pipeline: --micro-batches must be >= 1");

  // The whole model's layers, counted (nothing allocated).
  ModelSpec plan = setup.whole;
  plan.plan_only = true;
  plan.memory_limit = 0;
  Model whole(first, plan);
  GPUFEED_RETURN_IF_ERROR(whole.Init());
  const int L = whole.num_layers();
  if (L < P)
    return Status::InvalidArgument("pipeline: " + whole.Describe() + " has " + std::to_string(L) +
                                   " layers, fewer than --pipeline-stages " + std::to_string(P));
  p->describe_ = whole.Describe();
  p->parameters_ = whole.num_parameters();
  for (const Param& q : whole.params()) {
    p->names_.push_back(q.name);
    if (!q.frozen()) p->trainable_ += q.n;
  }
  GPUFEED_RETURN_IF_ERROR(p->Cut(first, plan, whole));
  GPUFEED_RETURN_IF_ERROR(p->StartStages(first));
  return p;
}

Result<uint64_t> Pipeline::StageBytes(Ops* first, const ModelSpec& plan, int a, int b, int s) const {
  const int P = setup_.stages, M = setup_.micro;
  const size_t es = DTypeSize(setup_.whole.dtype);
  const uint64_t batch = uint64_t(setup_.whole.max_batch);
  ModelSpec sp = plan;
  sp.layer_begin = a, sp.layer_end = b, sp.slots = Slots(s);
  Model m(first, sp);
  GPUFEED_RETURN_IF_ERROR(m.Init());
  const uint64_t mb = m.weight_bytes() + m.grad_bytes() + m.optimizer_bytes() + m.activation_bytes();
  uint64_t extra = 0;
  if (s == 0) extra += uint64_t(M) * batch * (m.input_elems() * es + 4);
  if (s > 0) extra += uint64_t(Slots(s)) * batch * m.input_elems() * es;
  if (s + 1 < P) extra += uint64_t(Slots(s)) * batch * m.output_elems() * es;
  if (s + 1 == P) extra += uint64_t(Slots(s)) * batch * 4;
  return mb + extra;
}

Result<std::vector<double>> Pipeline::TimeLayers(Ops* first) const {
  ModelSpec prof = setup_.whole;
  prof.memory_limit = 0, prof.slots = 1;
  Model m(first, prof);
  GPUFEED_RETURN_IF_ERROR(m.Init());
  const int batch = setup_.whole.max_batch;
  void* x = nullptr;
  GPUFEED_RETURN_IF_ERROR(first->Alloc(uint64_t(batch) * m.input_elems() * DTypeSize(setup_.whole.dtype), &x));
  auto ms = m.ProfileLayers(x, batch, 7);
  first->Free(x);
  return ms;
}

Status Pipeline::Cut(Ops* first, const ModelSpec& plan, const Model& whole) {
  const int P = setup_.stages, L = whole.num_layers();
  // Each (first, end, stage) planned once: the cut asks both whether it
  // fits and, by memory, what it costs.
  std::map<std::tuple<int, int, int>, double> planned;
  auto bytes_of = [&](int a, int b, int s) {
    auto [it, fresh] = planned.try_emplace({a, b, s}, 0.0);
    if (fresh) {
      auto r = StageBytes(first, plan, a, b, s);
      it->second = r.ok() ? double(*r) : std::numeric_limits<double>::infinity();
    }
    return it->second;
  };
  auto fits = [&](int a, int b, int s) {  // a stage the model refuses (inf) never fits
    const double bytes = bytes_of(a, b, s);
    return bytes < std::numeric_limits<double>::infinity() &&
           (setup_.memory_limit == 0 || bytes <= double(setup_.memory_limit));
  };
  bool by_memory = setup_.by_memory;
  std::string why;
  if (!by_memory && setup_.memory_limit > 0 && bytes_of(0, L, 0) > double(setup_.memory_limit)) {
    by_memory = true;
    why = " (the whole model exceeds --memory-limit, so its layers were not timed on one device)";
  }
  if (!by_memory) {  // each layer's forward and backward, timed on a model of its own
    auto ms = TimeLayers(first);
    if (!ms.ok()) return ms.status();
    layer_ms_ = std::move(*ms);
  }
  auto cost = [&](int a, int b, int s) {
    if (by_memory) return bytes_of(a, b, s);
    double t = 0;
    for (int i = a; i < b; ++i) t += layer_ms_[size_t(i)];
    return t;
  };
  cuts_ = PartitionLayers(L, P, cost, fits);
  if (cuts_.empty() && setup_.whole.recompute_blocks && setup_.memory_limit == 0) return RecomputeCutRefused(whole);
  if (cuts_.empty() && setup_.memory_limit == 0) return ShortcutCutRefused(whole);
  if (cuts_.empty()) return MemoryCutRefused(bytes_of(0, L, 0));
  char buf[200];
  std::snprintf(buf, sizeof buf, "%d stages, %s, %d micro-batches a step, cut by %s%s", P,
                setup_.one_f_one_b ? "1f1b" : "gpipe", setup_.micro, by_memory ? "memory" : "measured time",
                why.c_str());
  partition_ = buf;
  if (setup_.replicas > 1)
    partition_ += ", " + std::to_string(setup_.replicas) + " replicas (each stage's gradients summed among them)";
  return Status::Ok();
}

Status Pipeline::RecomputeCutRefused(const Model& whole) const {
  const int L = whole.num_layers();
  int pieces = 1;  // recomputing, a stage begins only after a pool or a linear layer
  for (int i = 1; i < L; ++i) pieces += whole.LayerName(i - 1).rfind("conv", 0) != 0;
  return Status::InvalidArgument("pipeline: " + describe_ + " cannot be cut into " + std::to_string(setup_.stages) +
                                 " stages with --recompute blocks, which cuts only at a conv-bn-relu-pool block's "
                                 "edge: use at most " +
                                 std::to_string(pieces) + " --pipeline-stages");
}

Status Pipeline::ShortcutCutRefused(const Model& whole) const {
  const int L = whole.num_layers();
  int pieces = 1;  // a stage begins only where one activation crosses
  for (int i = 1; i < L; ++i) pieces += whole.StageMayBeginAt(i);
  return Status::InvalidArgument("pipeline: " + describe_ + " cannot be cut into " + std::to_string(setup_.stages) +
                                 " stages: a stage begins only where no residual shortcut crosses (in the stem, "
                                 "between basic blocks, before the pooling or the head), so use at most " +
                                 std::to_string(pieces) + " --pipeline-stages");
}

Status Pipeline::MemoryCutRefused(double whole_bytes) const {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "pipeline: %s does not fit %d stages of --memory-limit %.1f MiB (each stage holds its layers' "
                "weights, gradients, optimizer state and up to %d activation sets; the whole model as one stage "
                "would need %.1f MiB); raise the limit or add stages",
                describe_.c_str(), setup_.stages, setup_.memory_limit / 1048576.0, Slots(0), whole_bytes / 1048576.0);
  return Status::InvalidArgument(buf);
}

Status Pipeline::StartStages(Ops* first) {
  const int P = setup_.stages;
  Shared& sh = *sh_;
  sh.fwd.resize(size_t(P - 1));
  sh.bwd.resize(size_t(P - 1));
  for (int s = 0; s + 1 < P; ++s) {
    sh.fwd[size_t(s)].resize(size_t(Slots(s + 1)));
    sh.bwd[size_t(s)].resize(size_t(Slots(s)));
  }
  sh.lab.resize(size_t(Slots(P - 1)));
  for (int s = 0; s < P; ++s) {
    auto st = std::make_unique<Stage>();
    st->index = s;
    stages_.push_back(std::move(st));
  }
  stages_[0]->ops = first;
  for (int s = 1; s < P; ++s)
    stages_[size_t(s)]->thread = std::thread(&Pipeline::WorkerLoop, this, stages_[size_t(s)].get());
  GPUFEED_RETURN_IF_ERROR(Everyone(Work::kSetup));
  return Everyone(Work::kPeers);
}

Pipeline::~Pipeline() {
  if (sh_) {
    {
      MutexLock lock(&sh_->mu);
      sh_->work = Work::kStop;
      ++sh_->generation;
      sh_->failed = true;  // ends any wait
    }
    sh_->cv.SignalAll();
  }
  for (auto& st : stages_)
    if (st->thread.joinable()) st->thread.join();
  // Events of the mailboxes belong to the stages' backends, freed below.
  if (sh_) {
    auto destroy = [](Mailbox& m) {
      if (m.sender && m.ready) m.sender->DestroyEvent(m.ready);
      if (m.sender && m.produced) m.sender->DestroyEvent(m.produced);
      if (m.receiver && m.freed) m.receiver->DestroyEvent(m.freed);
    };
    for (auto* v : {&sh_->fwd, &sh_->bwd})
      for (auto& link : *v)
        for (Mailbox& m : link) destroy(m);
    for (Mailbox& m : sh_->lab) destroy(m);
  }
  // Each stage's memory freed with its device current; stage 0's backend is
  // the caller's, the others' go with their stages.
  for (auto it = stages_.rbegin(); it != stages_.rend(); ++it) {
    if ((*it)->ops) {
      // A device that cannot be made current has lost its context (a sticky
      // CUDA error, which the step that met it returned): its memory went
      // with it. A destructor has no caller to tell: logged, and the frees go on.
      if (const Status bound = (*it)->ops->BindThread(); !bound.ok())
        StderrLogger()->Log(
            LogLevel::kWarning, "pipeline_stage_unbound",
            "pipeline stage " + std::to_string((*it)->index) + " freed without its device: " + bound.ToString());
    }
    (*it)->model.reset();
    it->reset();
  }
  stages_.clear();
}

void Pipeline::Fail(const Status& st) {
  MutexLock lock(&sh_->mu);
  if (!sh_->failed) sh_->failed = true, sh_->failure = st;
  sh_->cv.SignalAll();
}

void Pipeline::WorkerLoop(Stage* st) {
  uint64_t seen = 0;
  for (;;) {
    Work w;
    bool probe;
    {
      MutexLock lock(&sh_->mu);
      while (sh_->generation == seen) sh_->cv.Wait(&sh_->mu);
      seen = sh_->generation;
      w = sh_->work, probe = sh_->probe;
    }
    if (w == Work::kStop) return;
    Status s = RunStage(*st, w, probe);
    if (!s.ok()) Fail(s);
    MutexLock lock(&sh_->mu);
    ++sh_->done;
    sh_->cv.SignalAll();
  }
}

Status Pipeline::Everyone(Work w, bool probe) {
  Shared& sh = *sh_;
  {
    MutexLock lock(&sh.mu);
    if (sh.failed) return sh.failure.ok() ? Status::Internal("pipeline: stopped") : sh.failure;
    sh.work = w, sh.probe = probe, sh.done = 0;
    ++sh.generation;
  }
  sh.cv.SignalAll();
  Status mine = RunStage(*stages_[0], w, probe);
  if (!mine.ok()) Fail(mine);
  MutexLock lock(&sh.mu);
  while (sh.done != int(stages_.size()) - 1) sh.cv.Wait(&sh.mu);
  if (sh.failed) return sh.failure;
  return Status::Ok();
}

Status Pipeline::Barrier() {
  Shared& sh = *sh_;
  MutexLock lock(&sh.mu);
  const uint64_t round = sh.barrier_round;
  if (++sh.arrived == int(stages_.size())) {
    sh.arrived = 0;
    ++sh.barrier_round;
    sh.cv.SignalAll();
    return Status::Ok();
  }
  while (sh.barrier_round == round && !sh.failed) sh.cv.Wait(&sh.mu);
  return sh.failed ? Status::Internal("pipeline: another stage failed") : Status::Ok();
}

Status Pipeline::SetupStage(Stage& st) {
  const int P = int(stages_.size()), s = st.index;
  if (s > 0) {
    auto ops = setup_.make_ops(s);
    if (!ops.ok()) return ops.status().WithContext("pipeline stage " + std::to_string(s));
    st.owned_ops = std::move(*ops);
    st.ops = st.owned_ops.get();
  }
  GPUFEED_RETURN_IF_ERROR(st.ops->BindThread());
  if (setup_.replicas > 1) {
    if (s == 0) {
      st.comm = setup_.first_comm;
    } else {
      auto comm = setup_.make_comm(s, st.ops);
      if (!comm.ok()) return comm.status().WithContext("pipeline stage " + std::to_string(s));
      st.owned_comm = std::move(*comm);
      st.comm = st.owned_comm.get();
    }
    if (!st.comm) return Status::Internal("pipeline: data parallel without a communicator");
  }
  ModelSpec sp = setup_.whole;
  sp.layer_begin = cuts_[size_t(s)], sp.layer_end = cuts_[size_t(s) + 1], sp.slots = Slots(s);
  sp.memory_limit = 0;  // checked for the whole stage by the cut
  st.model = std::make_unique<Model>(st.ops, sp);
  GPUFEED_RETURN_IF_ERROR(st.model->Init().WithContext("pipeline stage " + std::to_string(s)));
  const size_t es = DTypeSize(sp.dtype);
  const size_t batch = size_t(sp.max_batch);
  const int inputs = s == 0 ? setup_.micro : Slots(s);
  st.x.resize(size_t(inputs));
  for (void*& b : st.x) GPUFEED_RETURN_IF_ERROR(st.Alloc(batch * st.model->input_elems() * es, &b, &st.pipeline_bytes));
  if (s + 1 < P) {
    st.dy.resize(size_t(Slots(s)));
    for (void*& b : st.dy)
      GPUFEED_RETURN_IF_ERROR(st.Alloc(batch * st.model->output_elems() * es, &b, &st.pipeline_bytes));
  }
  if (s == 0 || s + 1 == P) {
    st.labels.resize(size_t(s == 0 ? setup_.micro : Slots(s)));
    for (void*& b : st.labels) GPUFEED_RETURN_IF_ERROR(st.Alloc(batch * 4, &b, &st.pipeline_bytes));
  }
  st.n.assign(size_t(setup_.micro), 0);
  GPUFEED_RETURN_IF_ERROR(st.Alloc(sizeof(ScalerState), &st.scaler, nullptr));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.scaler, &setup_.scaler, sizeof(ScalerState)));
  GPUFEED_RETURN_IF_ERROR(st.Alloc(sizeof(StepState), &st.step, nullptr));
  std::vector<float*> grads;
  std::vector<size_t> sizes;
  for (Param& q : st.model->params())
    if (!q.frozen()) grads.push_back(q.grad), sizes.push_back(q.n);
  st.grads = int(grads.size());
  GPUFEED_RETURN_IF_ERROR(st.Alloc(grads.size() * (sizeof(float*) + sizeof(size_t)) + 1, &st.ptrs, nullptr));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.ptrs, grads.data(), grads.size() * sizeof(float*)));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(static_cast<char*>(st.ptrs) + grads.size() * sizeof(float*), sizes.data(),
                                         sizes.size() * sizeof(size_t)));
  if (s + 1 == P) GPUFEED_RETURN_IF_ERROR(st.Alloc(sizeof(Counters), &st.counters, nullptr));
  GPUFEED_RETURN_IF_ERROR(SetupQuantized(st));
  // This stage's events: what it sends (ready) and receives (freed).
  Shared& sh = *sh_;
  auto event = [&](void** e) -> Status {
    auto r = st.ops->NewEvent();
    if (!r.ok()) return r.status();
    *e = *r;
    return Status::Ok();
  };
  // Each end names its backend beside the events it makes (the destructor
  // frees them with it, after a failed setup too); each field has one writer.
  auto sender = [&](Mailbox& m) -> Status {
    m.sender = st.ops;
    GPUFEED_RETURN_IF_ERROR(event(&m.ready));
    return event(&m.produced);
  };
  auto receiver = [&](Mailbox& m) -> Status {
    m.receiver = st.ops;
    return event(&m.freed);
  };
  if (s + 1 < P) {
    for (Mailbox& m : sh.fwd[size_t(s)]) GPUFEED_RETURN_IF_ERROR(sender(m));
    for (Mailbox& m : sh.bwd[size_t(s)]) GPUFEED_RETURN_IF_ERROR(receiver(m));
  }
  if (s > 0) {
    for (Mailbox& m : sh.fwd[size_t(s - 1)]) GPUFEED_RETURN_IF_ERROR(receiver(m));
    for (Mailbox& m : sh.bwd[size_t(s - 1)]) GPUFEED_RETURN_IF_ERROR(sender(m));
  }
  for (Mailbox& m : sh.lab) {
    if (s == 0) GPUFEED_RETURN_IF_ERROR(sender(m));
    if (s + 1 == P) GPUFEED_RETURN_IF_ERROR(receiver(m));
  }
  st.sent_out.assign(size_t(Slots(s)), nullptr);
  st.sent_lab.assign(size_t(setup_.micro), nullptr);
  st.marks.resize(size_t(4 * setup_.micro));
  for (void*& e : st.marks) GPUFEED_RETURN_IF_ERROR(event(&e));
  GPUFEED_RETURN_IF_ERROR(event(&st.start));
  GPUFEED_RETURN_IF_ERROR(event(&st.end));
  return st.ops->Sync();
}

Status Pipeline::Send(Stage& st, Mailbox& m, void* dst, const void* src, size_t bytes, int n) {
  Shared& sh = *sh_;
  {
    MutexLock lock(&sh.mu);
    const auto deadline = WaitDeadline(setup_.timeout_s);
    while (m.full && !sh.failed) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        return Status::Internal("pipeline stage " + std::to_string(st.index) + ": the next stage freed no slot in " +
                                std::to_string(setup_.timeout_s) + " s");
      sh.cv.WaitFor(&sh.mu, deadline - now);
    }
    if (sh.failed) return Status::Internal("pipeline: another stage failed");
  }
  // On the copy stream, after what it copies is computed and the receiver's
  // last read of the slot.
  GPUFEED_RETURN_IF_ERROR(st.ops->RecordEvent(m.produced));
  GPUFEED_RETURN_IF_ERROR(st.ops->SideCopy(dst, src, bytes, m.produced, m.freed, m.ready));
  MutexLock lock(&sh.mu);
  m.full = true, m.n = n;
  sh.cv.SignalAll();
  return Status::Ok();
}

Status Pipeline::Receive(Stage& st, Mailbox& m) {
  Shared& sh = *sh_;
  {
    MutexLock lock(&sh.mu);
    const auto deadline = WaitDeadline(setup_.timeout_s);
    while (!m.full && !sh.failed) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        return Status::Internal("pipeline stage " + std::to_string(st.index) +
                                ": nothing arrived from the other stage in " + std::to_string(setup_.timeout_s) + " s");
      sh.cv.WaitFor(&sh.mu, deadline - now);
    }
    if (sh.failed) return Status::Internal("pipeline: another stage failed");
  }
  return st.ops->WaitEvent(m.ready);
}

Status Pipeline::Free(Stage& st, Mailbox& m) {
  // After every read queued so far. Without the event the slot is not free:
  // the sender would overwrite what this stage may still read.
  GPUFEED_RETURN_IF_ERROR(st.ops->RecordEvent(m.freed));
  MutexLock lock(&sh_->mu);
  m.full = false;
  sh_->cv.SignalAll();
  return Status::Ok();
}

Status Pipeline::Forward(Stage& st, int j, bool training) {
  // Slot k here; the next stage's and the last's slots for what goes there.
  const int P = int(stages_.size()), s = st.index, k = j % Slots(s);
  Shared& sh = *sh_;
  Model& m = *st.model;
  const size_t es = DTypeSize(setup_.whole.dtype);
  const void* x = st.x[size_t(s == 0 ? j : k)];
  if (s > 0) {
    Mailbox& in = sh.fwd[size_t(s - 1)][size_t(k)];
    GPUFEED_RETURN_IF_ERROR(Receive(st, in));
    st.n[size_t(j)] = in.n;
  }
  const int n = st.n[size_t(j)];
  GPUFEED_RETURN_IF_ERROR(st.ops->WaitEvent(st.sent_out[size_t(k)]));  // slot k copied out before
  // Recomputing, the input gradient sent last may be in the recompute buffer,
  // which this forward writes: copied out first.
  if (setup_.whole.recompute_blocks && training) GPUFEED_RETURN_IF_ERROR(st.ops->WaitEvent(st.sent_grad));
  GPUFEED_RETURN_IF_ERROR(Mark(st, true));
  GPUFEED_RETURN_IF_ERROR(m.Forward(x, n, training, k));
  if (s + 1 < P) GPUFEED_RETURN_IF_ERROR(Mark(st, false));
  if (s > 0 && !training) GPUFEED_RETURN_IF_ERROR(Free(st, sh.fwd[size_t(s - 1)][size_t(k)]));  // no backward reads it
  if (s + 1 < P) {
    Stage& next = *stages_[size_t(s) + 1];
    const size_t kn = size_t(j % Slots(s + 1));
    GPUFEED_RETURN_IF_ERROR(
        Send(st, sh.fwd[size_t(s)][kn], next.x[kn], m.output(k), size_t(n) * m.output_elems() * es, n));
    st.sent_out[size_t(k)] = sh.fwd[size_t(s)][kn].ready;
  }
  if (s == 0) {
    const size_t kl = size_t(j % Slots(P - 1));
    GPUFEED_RETURN_IF_ERROR(Send(st, sh.lab[kl], stages_.back()->labels[kl], st.labels[size_t(j)], size_t(n) * 4, n));
    st.sent_lab[size_t(j)] = sh.lab[kl].ready;
  }
  if (s + 1 == P) {
    const void* labels = st.labels[size_t(k)];
    GPUFEED_RETURN_IF_ERROR(Receive(st, sh.lab[size_t(k)]));
    auto* c = static_cast<Counters*>(st.counters);
    GPUFEED_RETURN_IF_ERROR(st.ops->SoftmaxXent(
        n, setup_.whole.classes, setup_.whole.dtype, m.output(k), static_cast<const int32_t*>(labels), &c->loss,
        &c->correct, training ? m.dlogits(k) : nullptr, training ? static_cast<const ScalerState*>(st.scaler) : nullptr,
        training ? float(n) * float(setup_.micro) * float(setup_.replicas) : 1.0f));
    GPUFEED_RETURN_IF_ERROR(Mark(st, false));
    GPUFEED_RETURN_IF_ERROR(Free(st, sh.lab[size_t(k)]));
  }
  return Status::Ok();
}

Status Pipeline::FlushBucket(Stage& st) {
  if (st.bucket.empty()) return Status::Ok();
  Status s = st.comm->AllReduce(st.bucket.data(), st.bucket_sizes.data(), int(st.bucket.size()));
  st.bucket.clear();
  st.bucket_sizes.clear();
  st.bucket_bytes = 0;
  return s;
}

Status Pipeline::Backward(Stage& st, int j, bool last) {
  const int P = int(stages_.size()), s = st.index, k = j % Slots(s);
  Shared& sh = *sh_;
  Model& m = *st.model;
  const size_t es = DTypeSize(setup_.whole.dtype);
  const int n = st.n[size_t(j)];
  const void* dy = nullptr;
  if (s + 1 < P) {
    GPUFEED_RETURN_IF_ERROR(Receive(st, sh.bwd[size_t(s)][size_t(k)]));
    dy = st.dy[size_t(k)];
  }
  GPUFEED_RETURN_IF_ERROR(st.ops->WaitEvent(st.sent_grad));  // the last input gradient copied out
  GPUFEED_RETURN_IF_ERROR(Mark(st, true));
  Model::GradsReady reduce;
  if (last && st.comm) {
    // Each layer's gradients join the bucket as the backward pass produces
    // them; a full bucket is summed across the replicas (on the GPU on the
    // collectives' stream) while the pass goes on.
    st.bucket.clear(), st.bucket_sizes.clear(), st.bucket_bytes = 0;
    reduce = [&st, &m, this](int first, int end) -> Status {
      for (int i = first; i < end; ++i) {
        const Param& q = m.params()[size_t(i)];
        if (q.frozen()) continue;
        st.bucket.push_back(q.grad), st.bucket_sizes.push_back(q.n), st.bucket_bytes += 4 * q.n;
      }
      return st.bucket_bytes >= setup_.bucket_bytes ? FlushBucket(st) : Status::Ok();
    };
  }
  GPUFEED_RETURN_IF_ERROR(m.Backward(st.x[size_t(s == 0 ? j : k)], n, j > 0, reduce, k, dy));
  if (reduce) GPUFEED_RETURN_IF_ERROR(FlushBucket(st));
  GPUFEED_RETURN_IF_ERROR(Mark(st, false));
  if (s + 1 < P) GPUFEED_RETURN_IF_ERROR(Free(st, sh.bwd[size_t(s)][size_t(k)]));
  if (s > 0) {
    Stage& prev = *stages_[size_t(s) - 1];
    const size_t kp = size_t(j % Slots(s - 1));
    GPUFEED_RETURN_IF_ERROR(
        Send(st, sh.bwd[size_t(s - 1)][kp], prev.dy[kp], m.input_grad(), size_t(n) * m.input_elems() * es, n));
    st.sent_grad = sh.bwd[size_t(s - 1)][kp].ready;
    GPUFEED_RETURN_IF_ERROR(Free(st, sh.fwd[size_t(s - 1)][size_t(k)]));  // its input is read no more
  }
  return Status::Ok();
}

Status Pipeline::Mark(Stage& st, bool begin) {
  // Probe steps: the stage's computations (not its waits and copies) timed.
  if (!st.probing) return Status::Ok();
  GPUFEED_RETURN_IF_ERROR(st.ops->RecordEvent(st.marks[size_t(2 * st.op + (begin ? 0 : 1))]));
  if (!begin) ++st.op;
  return Status::Ok();
}

Status Pipeline::StepStage(Stage& st, bool probe) {
  const int P = int(stages_.size()), s = st.index;
  const int M = int(sizes_.size());
  if (s == 0)
    for (int j = 0; j < M; ++j) st.n[size_t(j)] = sizes_[size_t(j)];
  if (probe) {
    GPUFEED_RETURN_IF_ERROR(st.ops->Sync());
    GPUFEED_RETURN_IF_ERROR(Barrier());  // every stage idle: one start
    GPUFEED_RETURN_IF_ERROR(st.ops->RecordEvent(st.start));
  }
  st.probing = probe, st.op = 0;
  auto F = [&](int j) { return Forward(st, j, true); };
  auto B = [&](int j) { return Backward(st, j, j + 1 == M); };
  if (setup_.one_f_one_b) {
    // Warm-up forwards, then one forward and one backward in turn, then the
    // remaining backwards: at most P - s micro-batches in flight here.
    const int warm = std::min(P - s - 1, M);
    for (int j = 0; j < warm; ++j) GPUFEED_RETURN_IF_ERROR(F(j));
    for (int i = 0; i + warm < M; ++i) {
      GPUFEED_RETURN_IF_ERROR(F(i + warm));
      GPUFEED_RETURN_IF_ERROR(B(i));
    }
    for (int j = M - warm; j < M; ++j) GPUFEED_RETURN_IF_ERROR(B(j));
  } else {
    for (int j = 0; j < M; ++j) GPUFEED_RETURN_IF_ERROR(F(j));
    for (int j = 0; j < M; ++j) GPUFEED_RETURN_IF_ERROR(B(j));
  }
  st.probing = false;
  if (probe) GPUFEED_RETURN_IF_ERROR(st.ops->RecordEvent(st.end));
  // The sums of the replicas' gradients, before they are read.
  if (st.comm) GPUFEED_RETURN_IF_ERROR(st.comm->Join());
  // Its gradients finished together with the other stages' (the whole
  // model's norm, one skip, one scale), then its optimizer step.
  auto* sc = static_cast<ScalerState*>(st.scaler);
  auto* ptrs = static_cast<float* const*>(st.ptrs);
  auto* sizes = reinterpret_cast<const size_t*>(static_cast<char*>(st.ptrs) + size_t(st.grads) * sizeof(float*));
  auto total = ChainSumSquares(st, ptrs, sizes);
  if (!total.ok()) return total.status();
  GPUFEED_RETURN_IF_ERROR(st.ops->FinishGradientsFrom(*total, setup_.clip_norm, sc));
  if (st.grads > 0) GPUFEED_RETURN_IF_ERROR(OptimizeStage(st));  // else all frozen here: nothing to step
  if (probe) {
    GPUFEED_RETURN_IF_ERROR(st.ops->Sync());
    st.busy_ms = 0;
    for (int i = 0; i < st.op; ++i) st.busy_ms += st.ops->EventMs(st.marks[size_t(2 * i)], st.marks[size_t(2 * i + 1)]);
    st.span_ms = st.ops->EventMs(st.start, st.end);
  }
  return Status::Ok();
}

Status Pipeline::OptimizeStage(Stage& st) {
  auto* sc = static_cast<ScalerState*>(st.scaler);
  auto* ss = static_cast<StepState*>(st.step);
  GPUFEED_RETURN_IF_ERROR(st.ops->AdvanceSchedule(setup_.schedule, ss));
  for (Param& q : st.model->params()) {
    if (q.frozen() || q.quantized()) continue;
    GPUFEED_RETURN_IF_ERROR(st.ops->ApplyOptimizer(setup_.opt, q.decay, q.n, q.master, q.grad, q.s1, q.s2,
                                                   q.copy != q.master ? q.copy : nullptr, setup_.whole.dtype, sc, ss));
  }
  if (st.quant_blocks > 0) {
    const auto* codes = static_cast<const float*>(st.quant_codes);
    GPUFEED_RETURN_IF_ERROR(st.ops->ApplyOptimizer8bit(setup_.opt, static_cast<const Quant8Tensor*>(st.quant_tensors),
                                                       static_cast<const Quant8Block*>(st.quant_table), st.quant_blocks,
                                                       codes, codes + 256, setup_.whole.dtype, sc, ss));
  }
  // LoRA: the weights the next step uses, W + scale B A, from the new adapters.
  return st.model->RefreshLoraWeights();
}

Status Pipeline::SetupQuantized(Stage& st) {
  std::vector<Quant8Tensor> tensors;
  std::vector<Quant8Block> blocks;
  Quant8Tables(*st.model, &tensors, &blocks);
  if (tensors.empty()) return Status::Ok();
  float codes[512];
  Quant8Code(true, codes);
  Quant8Code(false, codes + 256);
  GPUFEED_RETURN_IF_ERROR(st.Alloc(tensors.size() * sizeof tensors[0], &st.quant_tensors, nullptr));
  GPUFEED_RETURN_IF_ERROR(st.Alloc(blocks.size() * sizeof blocks[0], &st.quant_table, nullptr));
  GPUFEED_RETURN_IF_ERROR(st.Alloc(sizeof codes, &st.quant_codes, nullptr));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.quant_tensors, tensors.data(), tensors.size() * sizeof tensors[0]));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.quant_table, blocks.data(), blocks.size() * sizeof blocks[0]));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.quant_codes, codes, sizeof codes));
  st.quant_blocks = int(blocks.size());
  return Status::Ok();
}

Result<double> Pipeline::ChainSumSquares(Stage& st, float* const* ptrs, const size_t* sizes) {
  Shared& sh = *sh_;
  const int P = int(stages_.size());
  const Status late =
      Status::Internal("pipeline stage " + std::to_string(st.index) +
                       ": the other stages' gradient norms did not come in " + std::to_string(setup_.timeout_s) + " s");
  double start = 0;
  {
    MutexLock lock(&sh.mu);
    const auto deadline = WaitDeadline(setup_.timeout_s);
    while (sh.chain_next != st.index && !sh.failed) {  // the previous stages' sum
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return late;
      sh.cv.WaitFor(&sh.mu, deadline - now);
    }
    if (sh.failed) return Status::Internal("pipeline: another stage failed");
    start = sh.chain_sum;
  }
  auto mine = st.ops->SumSquares(ptrs, sizes, st.grads, start);
  if (!mine.ok()) return mine.status();
  MutexLock lock(&sh.mu);
  sh.chain_sum = *mine;
  ++sh.chain_next;
  sh.cv.SignalAll();
  const auto deadline = WaitDeadline(setup_.timeout_s);
  while (sh.chain_next != P && !sh.failed) {  // the whole model's
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return late;
    sh.cv.WaitFor(&sh.mu, deadline - now);
  }
  if (sh.failed) return Status::Internal("pipeline: another stage failed");
  return sh.chain_sum;
}

Status Pipeline::RunStage(Stage& st, Work w, bool probe) {
  if (w != Work::kSetup) GPUFEED_RETURN_IF_ERROR(st.ops->BindThread());
  const bool last = st.index + 1 == int(stages_.size());
  switch (w) {
    case Work::kSetup:
      return SetupStage(st);
    case Work::kPeers:  // every stage has its backend now
      for (auto& other : stages_)
        if (other.get() != &st) GPUFEED_RETURN_IF_ERROR(st.ops->EnablePeer(*other->ops));
      return Status::Ok();
    case Work::kStep:
      return StepStage(st, probe);
    case Work::kEval:
      if (st.index == 0) st.n[0] = sizes_[0];
      return Forward(st, 0, false);
    case Work::kZero: {
      if (!last) return Status::Ok();
      Counters z;
      return st.ops->Upload(st.counters, &z, sizeof z);
    }
    case Work::kRead:
      return last ? st.ops->Download(&st.read, st.counters, sizeof st.read) : Status::Ok();
    case Work::kHash: {
      size_t total = 0;
      for (Param& q : st.model->params()) total += q.n;
      st.host.resize(total);
      size_t at = 0;
      for (Param& q : st.model->params()) {
        GPUFEED_RETURN_IF_ERROR(st.ops->Download(st.host.data() + at, q.master, q.n * 4));
        at += q.n;
      }
      return Status::Ok();
    }
    case Work::kBroadcast:
      if (!st.comm) return Status::Ok();
      for (auto& [b, n] : st.model->buffers()) GPUFEED_RETURN_IF_ERROR(st.comm->Broadcast(b, n, 0));
      return st.comm->Join();
    case Work::kSave:
    case Work::kLoad:
      return w == Work::kSave ? SaveStage(st) : LoadStage(st);
    case Work::kInit:
      return InitStage(st);
    case Work::kMerge: {
      auto merged = st.model->MergedMasters();
      if (!merged.ok()) return merged.status();
      st.merged = std::move(*merged);
      st.merged_buffers.clear();
      for (auto& [b, n] : st.model->buffers()) {
        st.merged_buffers.emplace_back(n);
        GPUFEED_RETURN_IF_ERROR(st.ops->Download(st.merged_buffers.back().data(), b, n * 4));
      }
      return Status::Ok();
    }
    case Work::kStop:
      return Status::Ok();
  }
  return Status::Ok();
}

Status Pipeline::Add(const void* images, const void* labels, int n) {
  Stage& st = *stages_[0];
  const int j = pending();
  if (j >= setup_.micro) return Status::Internal("pipeline: more micro-batches than a step takes");
  if (n <= 0 || n > setup_.whole.max_batch) return Status::InvalidArgument("pipeline: micro-batch size out of range");
  const size_t es = DTypeSize(setup_.whole.dtype);
  GPUFEED_RETURN_IF_ERROR(st.ops->Copy(st.x[size_t(j)], images, size_t(n) * st.model->input_elems() * es));
  GPUFEED_RETURN_IF_ERROR(st.ops->WaitEvent(st.sent_lab[size_t(j)]));  // its last labels sent
  GPUFEED_RETURN_IF_ERROR(st.ops->Copy(st.labels[size_t(j)], labels, size_t(n) * 4));
  sizes_.push_back(n);
  return Status::Ok();
}

Status Pipeline::Step(bool probe) {
  if (sizes_.empty()) return Status::Ok();
  {
    MutexLock lock(&sh_->mu);  // no stage runs between steps
    sh_->chain_next = 0, sh_->chain_sum = 0;
  }
  Status s = Everyone(Work::kStep, probe);
  sizes_.clear();
  GPUFEED_RETURN_IF_ERROR(s);
  if (probe) {
    double busy = 0, span = 0;
    for (auto& st : stages_) busy += st->busy_ms, span = std::max(span, st->span_ms);
    busy_ms_total_ += busy, span_ms_total_ += span;
    for (auto& st : stages_) st->busy_ms_sum += st->busy_ms;
    ++probes_;
  }
  return Status::Ok();
}

Status Pipeline::Evaluate(const void* images, const void* labels, int n) {
  GPUFEED_RETURN_IF_ERROR(Add(images, labels, n));
  Status s = Everyone(Work::kEval);
  sizes_.clear();
  return s;
}

Status Pipeline::ZeroCounters() { return Everyone(Work::kZero); }

Status Pipeline::BroadcastBuffers() { return Everyone(Work::kBroadcast); }

Status Pipeline::SaveStage(Stage& st) {
  auto save = [&](const std::vector<std::pair<void*, size_t>>& tensors, std::vector<std::string>* out) -> Status {
    out->clear();
    for (auto& [p, bytes] : tensors) {
      out->emplace_back(bytes, '\0');
      GPUFEED_RETURN_IF_ERROR(st.ops->Download(out->back().data(), p, bytes));
    }
    return Status::Ok();
  };
  GPUFEED_RETURN_IF_ERROR(save(ParamTensors(st.model.get()), &st.saved_params));
  return save(BufferTensors(st.model.get()), &st.saved_buffers);
}

Status Pipeline::LoadStage(Stage& st) {
  auto load = [&](const std::vector<std::pair<void*, size_t>>& tensors, const std::vector<std::string>& in) -> Status {
    if (in.size() != tensors.size()) return Status::Internal("pipeline: a stage's checkpoint tensors");
    for (size_t i = 0; i < tensors.size(); ++i)
      GPUFEED_RETURN_IF_ERROR(st.ops->Upload(tensors[i].first, in[i].data(), tensors[i].second));
    return Status::Ok();
  };
  GPUFEED_RETURN_IF_ERROR(load(ParamTensors(st.model.get()), st.saved_params));
  GPUFEED_RETURN_IF_ERROR(load(BufferTensors(st.model.get()), st.saved_buffers));
  for (Param& p : st.model->params())  // compute copies follow the restored masters
    if (p.copy && p.copy != p.master)
      GPUFEED_RETURN_IF_ERROR(st.ops->Cast(p.master, p.copy, st.model->spec().dtype, p.n));
  GPUFEED_RETURN_IF_ERROR(st.model->RefreshLoraWeights());
  StepState step;
  step.step = load_step_;
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.step, &step, sizeof step));
  GPUFEED_RETURN_IF_ERROR(st.ops->Upload(st.scaler, &load_scaler_, sizeof load_scaler_));
  st.saved_params.clear(), st.saved_buffers.clear();
  return Status::Ok();
}

Status Pipeline::InitStage(Stage& st) {
  Model& m = *st.model;
  for (Param& p : m.params()) {
    auto it = init_params_.find(p.name);
    if (it == init_params_.end() || it->second->n != p.n)
      return Status::Internal("pipeline: --init's model has no " + p.name + " of this size");
    GPUFEED_RETURN_IF_ERROR(st.ops->Upload(p.master, it->second->master, p.n * 4));
    if (p.copy && p.copy != p.master) GPUFEED_RETURN_IF_ERROR(st.ops->Cast(p.master, p.copy, m.spec().dtype, p.n));
  }
  // This stage's buffers follow the earlier stages' in the whole model's.
  size_t at = 0;
  for (int s = 0; s < st.index; ++s) at += stages_[size_t(s)]->model->buffers().size();
  for (auto& [b, n] : m.buffers()) {
    if (at >= init_buffers_.size() || init_buffers_[at].second != n)
      return Status::Internal("pipeline: --init's batchnorm statistics");
    GPUFEED_RETURN_IF_ERROR(st.ops->Upload(b, init_buffers_[at++].first, n * 4));
  }
  return m.RefreshLoraWeights();
}

Status Pipeline::InitFrom(Model& whole) {
  init_params_.clear();
  for (const Param& p : whole.params()) init_params_[p.name] = &p;
  init_buffers_ = whole.buffers();
  Status s = Everyone(Work::kInit);
  init_params_.clear(), init_buffers_.clear();
  return s;
}

Status Pipeline::MergedLora(std::vector<std::vector<float>>* masters, std::vector<std::vector<float>>* buffers) {
  GPUFEED_RETURN_IF_ERROR(Everyone(Work::kMerge));
  for (auto& st : stages_) {
    for (auto& m : st->merged) masters->push_back(std::move(m));
    for (auto& b : st->merged_buffers) buffers->push_back(std::move(b));
    st->merged.clear(), st->merged_buffers.clear();
  }
  return Status::Ok();
}

Status Pipeline::SaveCheckpoint(const std::string& path, const CheckpointMeta& meta) {
  GPUFEED_RETURN_IF_ERROR(Everyone(Work::kSave));
  std::vector<std::string> all;
  for (auto& st : stages_)
    for (std::string& t : st->saved_params) all.push_back(std::move(t));
  for (auto& st : stages_)
    for (std::string& t : st->saved_buffers) all.push_back(std::move(t));
  for (auto& st : stages_) st->saved_params.clear(), st->saved_buffers.clear();
  return WriteCheckpoint(path, meta, all);
}

Status Pipeline::LoadCheckpoint(const std::string& path, const CheckpointMeta& expect, CheckpointMeta* meta) {
  // The sizes, from each stage's model (its tensors' addresses are read in
  // its own thread; sizes are plain numbers).
  std::vector<size_t> sizes;
  for (auto& st : stages_)
    for (auto& t : ParamTensors(st->model.get())) sizes.push_back(t.second);
  for (auto& st : stages_)
    for (auto& t : BufferTensors(st->model.get())) sizes.push_back(t.second);
  std::vector<std::string> all;
  GPUFEED_RETURN_IF_ERROR(ReadCheckpoint(path, expect, sizes, meta, &all));
  size_t at = 0;
  for (auto& st : stages_) {
    st->saved_params.clear();
    for (size_t i = 0, n = ParamTensors(st->model.get()).size(); i < n; ++i)
      st->saved_params.push_back(std::move(all[at++]));
  }
  for (auto& st : stages_) {
    st->saved_buffers.clear();
    for (size_t i = 0, n = BufferTensors(st->model.get()).size(); i < n; ++i)
      st->saved_buffers.push_back(std::move(all[at++]));
  }
  load_step_ = meta->step;
  load_scaler_ = meta->scaler;
  return Everyone(Work::kLoad);
}

Status Pipeline::ReadCounters(double* loss, int64_t* correct) {
  GPUFEED_RETURN_IF_ERROR(Everyone(Work::kRead));  // waits for the last stage's work
  *loss = stages_.back()->read.loss, *correct = stages_.back()->read.correct;
  return Status::Ok();
}

Status Pipeline::ReadScaler(ScalerState* s) {
  Stage& st = *stages_[0];
  return st.ops->Download(s, st.scaler, sizeof *s);
}

Result<uint64_t> Pipeline::WeightsHash() {
  for (auto& st : stages_) st->host.clear();
  GPUFEED_RETURN_IF_ERROR(Everyone(Work::kHash));
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  for (auto& st : stages_) XXH64_update(h, st->host.data(), st->host.size() * 4);
  const uint64_t d = XXH64_digest(h);
  XXH64_freeState(h);
  return d;
}

MemoryBreakdown Pipeline::memory() const {
  MemoryBreakdown m;
  for (const auto& st : stages_) {
    m.weights += st->model->weight_bytes();
    m.gradients += st->model->grad_bytes();
    m.optimizer += st->model->optimizer_bytes();
    m.activations += st->model->activation_bytes() + st->pipeline_bytes;
    m.workspace += st->ops->WorkspaceBytes();
  }
  return m;
}

void Pipeline::Report(TrainReport* r) const {
  r->pipeline = partition_;
  r->stages.clear();
  for (const auto& st : stages_) {
    TrainReport::Stage s;
    const Model& m = *st->model;
    s.layers = std::to_string(m.layer_begin()) + "-" + std::to_string(m.layer_end() - 1) + ": " +
               m.LayerName(m.layer_begin()) + " .. " + m.LayerName(m.layer_end() - 1);
    s.backend = st->ops->Describe();
    s.memory.weights = m.weight_bytes();
    s.memory.gradients = m.grad_bytes();
    s.memory.optimizer = m.optimizer_bytes();
    s.memory.activations = m.activation_bytes() + st->pipeline_bytes;
    s.memory.workspace = st->ops->WorkspaceBytes();
    if (span_ms_total_ > 0) s.busy = st->busy_ms_sum / span_ms_total_;
    if (probes_ > 0) s.measured_ms = st->busy_ms_sum / (double(probes_) * setup_.micro);
    if (!layer_ms_.empty()) {
      s.profiled_ms = 0;
      for (int i = m.layer_begin(); i < m.layer_end(); ++i) s.profiled_ms += layer_ms_[size_t(i)];
    }
    r->stages.push_back(s);
  }
  const int P = int(stages_.size()), M = setup_.micro;
  r->bubble_bound = double(P - 1) / double(M + P - 1);
  if (probes_ > 0) {
    double sum = 0, slowest = 0;
    for (const TrainReport::Stage& s : r->stages) sum += s.measured_ms, slowest = std::max(slowest, s.measured_ms);
    const double step = double(M - 1) * slowest + sum;
    if (step > 0) r->bubble_stage_bound = 1.0 - double(M) * sum / (double(P) * step);
  }
  if (span_ms_total_ > 0) r->bubble = 1.0 - busy_ms_total_ / (double(P) * span_ms_total_);
}

}  // namespace gpufeed::trainer
