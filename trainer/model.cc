// Model: layer list, parameter initialisation, forward and backward passes.
#include "trainer/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "gpu/transform.h"  // Mix64

namespace gpufeed::trainer {

Model::~Model() {
  for (void* p : owned_) ops_->Free(p);
}

Status Model::Allocate(size_t bytes, void** p, uint64_t* counter) {
  if (spec_.plan_only) {  // counted, not allocated
    *p = nullptr;
    *counter += bytes;
    return Status::Ok();
  }
  GPUFEED_RETURN_IF_ERROR(ops_->Alloc(bytes, p));
  owned_.push_back(*p);
  *counter += bytes;
  return Status::Ok();
}

// Uniform in [-bound, bound] (fill when bound == 0), from (seed, tensor):
// the same weights on every backend and run.
Status Model::AddParam(const std::string& name, size_t n, bool decay, float bound, float fill, int* index, Role role) {
  const uint64_t serial = uint64_t(serial_++);  // the whole model's index: its init key
  if (!building_in_stage_) {                    // another stage's
    *index = -1;
    return Status::Ok();
  }
  Param p;
  p.name = name;
  p.n = n;
  p.decay = decay;
  void* v;
  GPUFEED_RETURN_IF_ERROR(Allocate(n * 4, &v, &weights_));
  p.master = static_cast<float*>(v);
  const bool frozen = (lora() && role == Role::kBase) ||
                      std::any_of(spec_.freeze.begin(), spec_.freeze.end(),
                                  [&](const std::string& f) { return name.compare(0, f.size(), f) == 0; });
  const bool adam = spec_.optimizer == OptimizerKind::kAdamW;
  p.is_frozen = frozen;
  if (!frozen) {
    GPUFEED_RETURN_IF_ERROR(Allocate(n * 4, &v, &grads_));
    p.grad = static_cast<float*>(v);
  }
  if (frozen) {
    // Neither gradient nor optimizer state.
  } else if (spec_.quantized_states && n >= kQuantMinElems) {
    // 8-bit states: a byte a value and an absmax a block (zero: every state 0).
    const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
    GPUFEED_RETURN_IF_ERROR(Allocate(n, &v, &opt_));
    p.q1 = static_cast<uint8_t*>(v);
    GPUFEED_RETURN_IF_ERROR(Allocate(blocks * 4, &v, &opt_));
    p.a1 = static_cast<float*>(v);
    if (adam) {
      GPUFEED_RETURN_IF_ERROR(Allocate(n, &v, &opt_));
      p.q2 = static_cast<uint8_t*>(v);
      GPUFEED_RETURN_IF_ERROR(Allocate(blocks * 4, &v, &opt_));
      p.a2 = static_cast<float*>(v);
    }
  } else {
    GPUFEED_RETURN_IF_ERROR(Allocate(n * 4, &v, &opt_));
    p.s1 = static_cast<float*>(v);
    if (adam) {
      GPUFEED_RETURN_IF_ERROR(Allocate(n * 4, &v, &opt_));
      p.s2 = static_cast<float*>(v);
    }
  }
  std::vector<float> init(spec_.plan_only ? 0 : n, fill);
  if (bound > 0 && !spec_.plan_only) {
    const uint64_t key = gpu::Mix64(spec_.seed ^ gpu::Mix64(0x5EED0000ull + serial));
    for (size_t i = 0; i < n; ++i) {
      const double u = double(gpu::Mix64(key + i) >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
      init[i] = static_cast<float>((2 * u - 1) * bound);
    }
  }
  if (!spec_.plan_only) GPUFEED_RETURN_IF_ERROR(ops_->Upload(p.master, init.data(), n * 4));
  // Weights of GEMMs/convolutions get a compute copy in the compute dtype
  // (with LoRA also in fp32: W + scale B A); biases, batchnorm parameters
  // and adapters are used in fp32 directly.
  if (decay && role != Role::kLora && (spec_.dtype != DType::kFloat32 || (lora() && role == Role::kBase))) {
    GPUFEED_RETURN_IF_ERROR(Allocate(n * DTypeSize(spec_.dtype), &p.copy, &weights_));
    if (!spec_.plan_only) GPUFEED_RETURN_IF_ERROR(ops_->Cast(p.master, p.copy, spec_.dtype, n));
  } else if (decay && role != Role::kLora) {
    p.copy = p.master;
  }
  *index = static_cast<int>(params_.size());
  params_.push_back(std::move(p));
  return Status::Ok();
}

Status Model::AddLora(Layer& l, const std::string& name) {
  const int r = spec_.lora_rank;
  // A like a layer's weights (uniform in +-1/sqrt(fan_in)), B zero: the
  // adapters add nothing until B has trained.
  GPUFEED_RETURN_IF_ERROR(AddParam(name + ".lora_a", size_t(r) * l.fan_in, false, 1.0f / std::sqrt(float(l.fan_in)), 0,
                                   &l.pa, Role::kLora));
  return AddParam(name + ".lora_b", size_t(l.fan_out) * r, false, 0, 0, &l.pb, Role::kLora);
}

Status Model::Init() {
  GPUFEED_RETURN_IF_ERROR(CheckSpec());
  GPUFEED_RETURN_IF_ERROR(BuildLayers());
  const ModelSpec& s = spec_;
  building_in_stage_ = true;
  if (end_ < 0) end_ = static_cast<int>(layers_.size());
  if (end_ > static_cast<int>(layers_.size()))
    return Status::InvalidArgument("model: a stage ends at layer " + std::to_string(end_) + " of " + Describe() +
                                   ", which has " + std::to_string(layers_.size()));
  if (!StageMayBeginAt(begin_) || !StageMayBeginAt(end_))
    return Status::InvalidArgument("model: a pipeline stage [" + std::to_string(begin_) + ", " + std::to_string(end_) +
                                   ") of " + Describe() +
                                   " begins or ends inside a basic block, whose shortcut would cross to another "
                                   "stage: a stage of resnet18 begins or ends only where one activation crosses "
                                   "(in the stem, between basic blocks, before the pooling or the head)");
  const size_t es = DTypeSize(s.dtype);
  size_t widest = input_elems();
  if (s.recompute_blocks && s.kind == ModelKind::kMlp)
    return Status::InvalidArgument(
        "model: --recompute blocks recomputes the cnn's conv-bn-relu-pool blocks; an mlp "
        "has none (--recompute none)");
  // Recomputing, a block's conv and batchnorm outputs live in one buffer every
  // slot shares: a pipeline stage begins and ends at a block's edge (never
  // after its conv or its batchnorm), so what it passes on is its own.
  auto inside_block = [&](int i) {
    return i > 0 && i < static_cast<int>(layers_.size()) &&
           (layers_[size_t(i - 1)].kind == Kind::kConv || layers_[size_t(i - 1)].kind == Kind::kBnRelu);
  };
  if (s.recompute_blocks && (inside_block(begin_) || inside_block(end_)))
    return Status::InvalidArgument("model: --recompute blocks: a pipeline stage [" + std::to_string(begin_) + ", " +
                                   std::to_string(end_) + ") of " + Describe() +
                                   " begins or ends inside a conv-bn-relu-pool block");
  // recompute_blocks: every block's conv output, and its batchnorm-ReLU
  // output in place over it, go to one buffer of the widest block's size,
  // which the backward pass fills again with each block's conv output; that
  // buffer and one of gradients are the backward's only two (see Backward).
  void* rc = nullptr;
  if (s.recompute_blocks) {
    size_t block = 0;
    for (const Layer& l : layers_)
      if (l.kind == Kind::kConv) block = std::max(block, l.out_elems);
    GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * block * es, &rc, &acts_bytes_));
  }
  GPUFEED_RETURN_IF_ERROR(AllocateSlots(rc, &widest));
  if (s.kind == ModelKind::kResnet18) {
    // The stage's layers' but its last's (its gradient comes from outside),
    // and a stage past the first its input's.
    out_grads_.assign(layers_.size(), nullptr);
    for (size_t i = size_t(std::max(begin_ - 1, 0)); i + 1 < size_t(end_); ++i)
      GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * layers_[i].out_elems * es, &out_grads_[i], &acts_bytes_));
  }
  GPUFEED_RETURN_IF_ERROR(SetUpFreezing());
  if (end_ == static_cast<int>(layers_.size()))
    for (Slot& slot : slots_)
      GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * s.classes * es, &slot.dlogits, &acts_bytes_));
  if (rc) {
    // The gradients' ping-pong: the recompute buffer (the head's and each
    // conv's input gradient, never larger than a block) and one more; each
    // batchnorm works in place (Backward).
    grad_a_ = rc;
    GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * widest * es, &grad_b_, &acts_bytes_));
    return Status::Ok();
  }
  GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * widest * es, &grad_a_, &acts_bytes_));
  GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * widest * es, &grad_b_, &acts_bytes_));
  return Status::Ok();
}

// The spec's checks, and with a memory limit the plan's bytes against it,
// before anything is allocated.
Status Model::CheckSpec() {
  const ModelSpec& s = spec_;
  if (s.lora_rank < 0 || s.lora_alpha < 0) return Status::InvalidArgument("model: LoRA rank and alpha must be >= 0");
  lora_scale_ = s.lora_rank > 0 ? (s.lora_alpha > 0 ? s.lora_alpha : float(s.lora_rank)) / float(s.lora_rank) : 0;
  if (s.in_h <= 0 || s.in_w <= 0 || s.in_c <= 0 || s.classes < 2 || s.max_batch <= 0)
    return Status::InvalidArgument("model: bad input geometry or classes");
  for (const std::string& f : s.freeze)
    if (f.empty())
      return Status::InvalidArgument("model: an empty name to freeze (--freeze takes names such as conv0)");
  for (int w : s.widths)
    if (w <= 0) return Status::InvalidArgument("model: layer widths must be positive");
  if (s.kind == ModelKind::kResnet18) {
    if (s.widths.size() != 4)
      return Status::InvalidArgument(
          "model: resnet18 takes its four stages' channels (--channels 64,128,256,512), not " +
          std::to_string(s.widths.size()));
    if (s.recompute_blocks)
      return Status::InvalidArgument("model: resnet18 runs without --recompute blocks (not yet supported)");
    if (s.lora_rank > 0) return Status::InvalidArgument("model: resnet18 runs without LoRA (not yet supported)");
  }
  if (s.layer_begin < 0 || (s.layer_end >= 0 && s.layer_end <= s.layer_begin) || s.slots < 1)
    return Status::InvalidArgument("model: a stage needs layers [begin, end) with begin < end, and >= 1 slot");
  if (s.memory_limit > 0 && !s.plan_only) {
    // Found before anything is allocated, with what the model needs.
    ModelSpec plan = s;
    plan.plan_only = true;
    Model counted(ops_, plan);
    GPUFEED_RETURN_IF_ERROR(counted.Init());
    const uint64_t need =
        counted.weight_bytes() + counted.grad_bytes() + counted.optimizer_bytes() + counted.activation_bytes();
    if (need > s.memory_limit) {
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "model: %s needs %.1f MiB (weights %.1f, gradients %.1f, optimizer %.1f, activations %.1f) but "
                    "the memory limit is %.1f MiB: raise --memory-limit, or split the model over more "
                    "--pipeline-stages",
                    counted.Describe().c_str(), need / 1048576.0, counted.weight_bytes() / 1048576.0,
                    counted.grad_bytes() / 1048576.0, counted.optimizer_bytes() / 1048576.0,
                    counted.activation_bytes() / 1048576.0, s.memory_limit / 1048576.0);
      return Status::InvalidArgument(buf);
    }
  }
  return Status::Ok();
}

// The layers (an mlp's linears, or a cnn's conv-bn-relu-pool blocks and
// its head) and their parameters; a stage allocates only its own.
Status Model::BuildLayers() {
  const ModelSpec& s = spec_;
  begin_ = s.layer_begin, end_ = s.layer_end;
  int h = s.in_h, w = s.in_w, c = s.in_c;
  if (s.kind == ModelKind::kMlp) {
    int in = h * w * c;
    for (int width : s.widths) {
      GPUFEED_RETURN_IF_ERROR(AddLinear(in, width, true, false));
      in = width;
    }
    return AddLinear(in, s.classes, false, true);
  }
  if (s.kind == ModelKind::kResnet18) return BuildResnet();
  for (int k : s.widths) GPUFEED_RETURN_IF_ERROR(AddConvBlock(k, &h, &w, &c));
  return AddLinear(h * w * c, s.classes, false, true);
}

// torchvision's ResNet-18: a 7x7/2 conv (the first stage's channels), its
// batchnorm and ReLU, 3x3/2 max pooling; four stages of two basic blocks
// (the first block of stages 2-4 strided, with a 1x1/2 projection and its
// batchnorm as the shortcut); global average pooling; the linear head.
Status Model::BuildResnet() {
  const ModelSpec& s = spec_;
  int h = s.in_h, w = s.in_w, c = s.in_c;
  GPUFEED_RETURN_IF_ERROR(AddConvBn(s.widths[0], 7, 2, 3, true, -2, &h, &w, &c));
  Layer pool;
  pool.kind = Kind::kPool3;
  pool.h = h, pool.w = w, pool.c = c;
  pool.pbegin = pool.pend = static_cast<int>(params_.size());
  h = (h + 1) / 2, w = (w + 1) / 2;
  pool.out_elems = size_t(h) * w * c;
  layers_.push_back(pool);
  for (size_t stage = 0; stage < 4; ++stage)
    for (int block = 0; block < 2; ++block)
      GPUFEED_RETURN_IF_ERROR(AddBasicBlock(s.widths[stage], stage > 0 && block == 0 ? 2 : 1, &h, &w, &c));
  Layer gap;
  gap.kind = Kind::kGap;
  gap.h = h, gap.w = w, gap.c = c;
  gap.pbegin = gap.pend = static_cast<int>(params_.size());
  gap.out_elems = size_t(c);
  layers_.push_back(gap);
  return AddLinear(c, s.classes, false, true);
}

// conv(r x r, stride, pad) of layer `in`'s output, then batchnorm (+ ReLU).
Status Model::AddConvBn(int k, int r, int stride, int pad, bool relu, int in, int* h_io, int* w_io, int* c_io) {
  const ModelSpec& s = spec_;
  int &h = *h_io, &w = *w_io, &c = *c_io;
  Layer conv;
  conv.kind = Kind::kConv;
  conv.in = in;
  conv.conv = ConvShape{s.max_batch, h, w, c, k, s.dtype};
  conv.conv.r = r, conv.conv.stride = stride, conv.conv.pad = pad;
  conv.fan_in = r * r * c, conv.fan_out = k;
  building_in_stage_ = InStage(layers_.size());
  conv.pbegin = static_cast<int>(params_.size());
  const std::string name = "conv" + std::to_string(layers_.size());
  GPUFEED_RETURN_IF_ERROR(
      AddParam(name + ".weight", conv.conv.w_elems(), true, std::sqrt(6.0f / float(r * r * c)), 0, &conv.p));
  conv.pend = static_cast<int>(params_.size());
  h = conv.conv.out_h(), w = conv.conv.out_w(), c = k;
  conv.out_elems = size_t(h) * w * k;
  layers_.push_back(conv);
  return AddBatchNorm(name, h, w, k, relu, conv.out_elems);
}

// The batchnorm (and, with relu, its ReLU) after conv layer `name`, on an
// h x w x k output: gamma and beta, and in a stage the running statistics
// its own (another stage's are not this model's).
Status Model::AddBatchNorm(const std::string& name, int h, int w, int k, bool relu, size_t out_elems) {
  Layer bn;
  bn.kind = Kind::kBnRelu;
  bn.bn_relu = relu;
  bn.h = h, bn.w = w, bn.c = k;
  building_in_stage_ = InStage(layers_.size());
  bn.pbegin = static_cast<int>(params_.size());
  GPUFEED_RETURN_IF_ERROR(AddParam(name + ".bn.gamma", k, false, 0, 1, &bn.p));
  GPUFEED_RETURN_IF_ERROR(AddParam(name + ".bn.beta", k, false, 0, 0, &bn.p2));
  bn.pend = static_cast<int>(params_.size());
  if (building_in_stage_) {
    void* v;
    for (float** f : {&bn.run_mean, &bn.run_var}) {
      GPUFEED_RETURN_IF_ERROR(Allocate(size_t(k) * 4, &v, &weights_));
      *f = static_cast<float*>(v);
    }
    std::vector<float> ones(k, 1.0f);
    if (!spec_.plan_only) GPUFEED_RETURN_IF_ERROR(ops_->Upload(bn.run_var, ones.data(), size_t(k) * 4));
  }
  bn.out_elems = out_elems;
  layers_.push_back(bn);
  return Status::Ok();
}

// conv-bn-relu, conv-bn, the shortcut (the block's input, or a 1x1
// projection and its batchnorm where the size or channels change), add,
// ReLU.
Status Model::AddBasicBlock(int k, int stride, int* h_io, int* w_io, int* c_io) {
  const int input = static_cast<int>(layers_.size()) - 1;
  const int h0 = *h_io, w0 = *w_io, c0 = *c_io;
  GPUFEED_RETURN_IF_ERROR(AddConvBn(k, 3, stride, 1, true, -2, h_io, w_io, c_io));
  GPUFEED_RETURN_IF_ERROR(AddConvBn(k, 3, 1, 1, false, -2, h_io, w_io, c_io));
  const int main = static_cast<int>(layers_.size()) - 1;
  int shortcut = input;
  if (stride != 1 || c0 != k) {
    int h = h0, w = w0, c = c0;
    GPUFEED_RETURN_IF_ERROR(AddConvBn(k, 1, stride, 0, false, input, &h, &w, &c));
    shortcut = static_cast<int>(layers_.size()) - 1;
  }
  Layer add;
  add.kind = Kind::kAdd;
  add.in = main, add.in2 = shortcut;
  add.c = k;
  add.pbegin = add.pend = static_cast<int>(params_.size());
  add.out_elems = layers_[size_t(main)].out_elems;
  layers_.push_back(add);
  return Status::Ok();
}

// The last linear layer is the head: it trains whole under LoRA.
Status Model::AddLinear(int in, int out, bool relu, bool head) {
  Layer l;
  l.kind = Kind::kLinear;
  l.in_features = in;
  l.out_features = out;
  l.relu = relu;
  l.fan_in = in, l.fan_out = out;
  building_in_stage_ = InStage(layers_.size());
  l.pbegin = static_cast<int>(params_.size());
  const std::string name = "linear" + std::to_string(layers_.size());
  const Role role = head ? Role::kHead : Role::kBase;
  GPUFEED_RETURN_IF_ERROR(AddParam(name + ".weight", size_t(in) * out, true,
                                   relu ? std::sqrt(6.0f / in) : 1.0f / std::sqrt(float(in)), 0, &l.p, role));
  if (lora() && !head) GPUFEED_RETURN_IF_ERROR(AddLora(l, name));
  GPUFEED_RETURN_IF_ERROR(AddParam(name + ".bias", out, false, 0, 0, &l.p2, role));
  l.pend = static_cast<int>(params_.size());
  l.out_elems = out;
  layers_.push_back(l);
  return Status::Ok();
}

// A conv-bn-relu-pool block of k channels on an h x w x c input (which it
// halves: *h, *w, *c become its output's).
Status Model::AddConvBlock(int k, int* h_io, int* w_io, int* c_io) {
  const ModelSpec& s = spec_;
  int &h = *h_io, &w = *w_io, &c = *c_io;
  if (h < 2 || w < 2)
    return Status::InvalidArgument("model: too many cnn blocks for a " + std::to_string(s.in_h) + "x" +
                                   std::to_string(s.in_w) + " input (each halves the size)");
  Layer conv;
  conv.kind = Kind::kConv;
  conv.conv = ConvShape{s.max_batch, h, w, c, k, s.dtype};
  conv.fan_in = 9 * c, conv.fan_out = k;  // KRSC filters as a [k, 9c] matrix
  building_in_stage_ = InStage(layers_.size());
  conv.pbegin = static_cast<int>(params_.size());
  const std::string name = "conv" + std::to_string(layers_.size());
  GPUFEED_RETURN_IF_ERROR(AddParam(name + ".weight", conv.conv.w_elems(), true, std::sqrt(6.0f / (9 * c)), 0, &conv.p));
  if (lora()) GPUFEED_RETURN_IF_ERROR(AddLora(conv, name));
  conv.pend = static_cast<int>(params_.size());
  conv.out_elems = size_t(h) * w * k;
  layers_.push_back(conv);
  GPUFEED_RETURN_IF_ERROR(AddBatchNorm(name, h, w, k, /*relu=*/true, conv.out_elems));
  Layer pool;
  pool.kind = Kind::kPool;
  pool.h = h, pool.w = w, pool.c = k;
  pool.pbegin = pool.pend = static_cast<int>(params_.size());
  h /= 2, w /= 2, c = k;
  pool.out_elems = size_t(h) * w * c;
  layers_.push_back(pool);
  return Status::Ok();
}

// Each slot's activations (in the recompute buffer `rc` where blocks are
// recomputed), batchnorm statistics and pooling argmaxes; *widest grows to
// the widest layer's output.
Status Model::AllocateSlots(void* rc, size_t* widest_io) {
  const ModelSpec& s = spec_;
  const size_t es = DTypeSize(s.dtype);
  size_t& widest = *widest_io;
  slots_.resize(size_t(s.slots));
  for (Slot& slot : slots_) {
    slot.acts.assign(layers_.size(), nullptr);
    slot.save_mean.assign(layers_.size(), nullptr);
    slot.save_invstd.assign(layers_.size(), nullptr);
    slot.argmax.assign(layers_.size(), nullptr);
    for (size_t i = size_t(begin_); i < size_t(end_); ++i) {
      const Layer& l = layers_[i];
      widest = std::max(widest, l.out_elems);
      void* v;
      if (l.kind == Kind::kBnRelu) {
        GPUFEED_RETURN_IF_ERROR(Allocate(size_t(l.c) * 4, &v, &weights_));
        slot.save_mean[i] = static_cast<float*>(v);
        GPUFEED_RETURN_IF_ERROR(Allocate(size_t(l.c) * 4, &v, &weights_));
        slot.save_invstd[i] = static_cast<float*>(v);
      }
      if (l.kind == Kind::kPool || l.kind == Kind::kPool3) {
        GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * l.out_elems, &v, &acts_bytes_));
        slot.argmax[i] = static_cast<uint8_t*>(v);
      }
      if (rc && (l.kind == Kind::kConv || l.kind == Kind::kBnRelu)) {
        slot.acts[i] = rc;
        continue;
      }
      GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * l.out_elems * es, &v, &acts_bytes_));
      slot.acts[i] = v;
    }
  }
  return Status::Ok();
}

Status Model::SetUpFreezing() {
  const ModelSpec& s = spec_;
  // Freezing: every name must match a parameter, and something must train
  // (checked on the whole model: a pipeline stage may hold neither).
  const bool whole = begin_ == 0 && end_ == static_cast<int>(layers_.size());
  for (const std::string& f : whole ? s.freeze : std::vector<std::string>{}) {
    if (std::none_of(params_.begin(), params_.end(),
                     [&](const Param& p) { return p.name.compare(0, f.size(), f) == 0; })) {
      std::string names;
      for (const Param& p : params_) names += (names.empty() ? "" : ", ") + p.name;
      return Status::InvalidArgument("model: --freeze " + f + " names no parameter of " + Describe() + " (" + names +
                                     ")");
    }
  }
  first_trainable_ = size_t(end_);
  size_t widest_bn = 0;
  size_t widest_lora = 0;
  for (size_t i = size_t(end_); i-- > size_t(begin_);) {
    const Layer& l = layers_[i];
    bool trainable = false;
    for (int q = l.pbegin; q < l.pend; ++q) trainable = trainable || !params_[q].frozen();
    if (trainable) first_trainable_ = i;
    if (l.pa >= 0) widest_lora = std::max(widest_lora, size_t(l.fan_in) * l.fan_out);
    if (l.kind == Kind::kBnRelu && l.p >= 0 && (params_[l.p].frozen() || params_[l.p2].frozen()))
      widest_bn = std::max(widest_bn, size_t(l.c));
  }
  // A stage past the first passes its input's gradient back, trainable or not.
  if (begin_ > 0) first_trainable_ = size_t(begin_);
  if (first_trainable_ == size_t(end_) && whole)
    return Status::InvalidArgument("model: --freeze leaves nothing of " + Describe() + " to train");
  if (widest_bn > 0) {
    void* v;
    GPUFEED_RETURN_IF_ERROR(Allocate(2 * widest_bn * 4, &v, &grads_));
    frozen_grad_ = static_cast<float*>(v);
    frozen_grad_beta_ = frozen_grad_ ? frozen_grad_ + widest_bn : nullptr;
  }
  if (widest_lora > 0) {
    void* v;
    GPUFEED_RETURN_IF_ERROR(Allocate(widest_lora * 4, &v, &grads_));
    lora_scratch_ = static_cast<float*>(v);
    if (!s.plan_only) GPUFEED_RETURN_IF_ERROR(RefreshLoraWeights());
  }
  return Status::Ok();
}

Status Model::ForwardLayer(size_t i, const void* x, int batch, bool training, Slot& sl) {
  const DType dt = spec_.dtype;
  Layer& l = layers_[i];
  const void* in = InputOf(i, x, sl);
  void* out = sl.acts[i];
  switch (l.kind) {
    case Kind::kLinear: {
      GemmArgs g;
      g.trans_b = true;
      g.m = batch, g.n = l.out_features, g.k = l.in_features;
      g.a = in, g.lda = l.in_features;
      g.b = params_[l.p].copy, g.ldb = l.in_features;
      g.c = out, g.ldc = l.out_features;
      g.ab = g.c_dtype = dt;
      GPUFEED_RETURN_IF_ERROR(ops_->Gemm(g));
      return ops_->BiasAct(out, params_[l.p2].master, batch, l.out_features, l.relu, dt);
    }
    case Kind::kConv: {
      ConvShape s = l.conv;
      s.n = batch;
      return ops_->ConvForward(s, in, params_[l.p].copy, out);
    }
    case Kind::kBnRelu: {
      BnArgs a{size_t(batch) * l.h * l.w, l.c, dt};
      a.relu = l.bn_relu;
      return ops_->BnReluForward(a, training, in, params_[l.p].master, params_[l.p2].master, l.run_mean, l.run_var,
                                 sl.save_mean[i], sl.save_invstd[i], out);
    }
    case Kind::kPool:
      return ops_->MaxPoolForward(batch, l.h, l.w, l.c, dt, in, out, sl.argmax[i]);
    case Kind::kPool3:
      return ops_->MaxPool3x3Forward(batch, l.h, l.w, l.c, dt, in, out, sl.argmax[i]);
    case Kind::kGap:
      return ops_->GlobalAvgPoolForward(batch, l.h * l.w, l.c, dt, in, out);
    case Kind::kAdd: {
      const size_t n = size_t(batch) * l.out_elems;
      GPUFEED_RETURN_IF_ERROR(ops_->Copy(out, in, n * DTypeSize(dt)));
      return ops_->AddAct(out, Act(l.in2, x, sl), n, true, dt);
    }
  }
  return Status::Ok();
}

Status Model::Forward(const void* x, int batch, bool training, int slot) {
  if (batch <= 0 || batch > spec_.max_batch) return Status::InvalidArgument("model: batch size out of range");
  if (spec_.plan_only) return Status::Internal("model: a plan-only model runs nothing");
  Slot& sl = slots_[size_t(slot)];
  for (size_t i = size_t(begin_); i < size_t(end_); ++i)
    GPUFEED_RETURN_IF_ERROR(ForwardLayer(i, x, batch, training, sl));
  return Status::Ok();
}

const void* Model::InputOf(size_t i, const void* x, const Slot& sl) const {
  const int in = layers_[i].in;
  return Act(in == -2 ? int(i) - 1 : in, x, sl);
}

bool Model::StageMayBeginAt(int c) const {
  for (size_t i = size_t(std::max(c, 0)); i < layers_.size() && c > 0; ++i) {
    const Layer& l = layers_[i];
    const int in = l.in == -2 ? int(i) - 1 : l.in;
    if (in < c - 1 || (l.kind == Kind::kAdd && l.in2 < c - 1)) return false;
  }
  return true;
}

Status Model::BackwardLayer(size_t i, const void* x, const void* dy_in, void* dx, bool need_dx, int batch, float beta,
                            Slot& sl) {
  const DType dt = spec_.dtype;
  Layer& l = layers_[i];
  void* dy = const_cast<void*>(dy_in);  // ReluBackward masks it in place
  const void* in = InputOf(i, x, sl);
  switch (l.kind) {
    case Kind::kLinear: {
      if (l.relu) GPUFEED_RETURN_IF_ERROR(ops_->ReluBackward(dy, sl.acts[i], size_t(batch) * l.out_features, dt));
      if (!params_[l.p].frozen() || l.pa >= 0) {
        GemmArgs gw;  // dW[out, in] = dY^T X (LoRA: into the scratch, for the adapters')
        gw.trans_a = true;
        gw.m = l.out_features, gw.n = l.in_features, gw.k = batch;
        gw.a = dy, gw.lda = l.out_features;
        gw.b = in, gw.ldb = l.in_features;
        gw.c = l.pa >= 0 ? lora_scratch_ : params_[l.p].grad, gw.ldc = l.in_features;
        gw.beta = l.pa >= 0 ? 0.0f : beta;
        gw.ab = dt, gw.c_dtype = DType::kFloat32;
        GPUFEED_RETURN_IF_ERROR(ops_->Gemm(gw));
        if (l.pa >= 0) GPUFEED_RETURN_IF_ERROR(LoraGrads(l, beta));
      }
      if (!params_[l.p2].frozen())
        GPUFEED_RETURN_IF_ERROR(ops_->ColumnSum(dy, batch, l.out_features, dt, params_[l.p2].grad, beta));
      if (need_dx) {
        GemmArgs gx;  // dX[B, in] = dY W
        gx.m = batch, gx.n = l.in_features, gx.k = l.out_features;
        gx.a = dy, gx.lda = l.out_features;
        gx.b = params_[l.p].copy, gx.ldb = l.in_features;
        gx.c = dx, gx.ldc = l.in_features;
        gx.ab = gx.c_dtype = dt;
        GPUFEED_RETURN_IF_ERROR(ops_->Gemm(gx));
      }
      return Status::Ok();
    }
    case Kind::kConv: {
      ConvShape s = l.conv;
      s.n = batch;
      if (l.pa >= 0) {
        GPUFEED_RETURN_IF_ERROR(ops_->ConvBackwardFilter(s, in, dy, lora_scratch_, 0.0f));
        GPUFEED_RETURN_IF_ERROR(LoraGrads(l, beta));
      } else if (!params_[l.p].frozen()) {
        GPUFEED_RETURN_IF_ERROR(ops_->ConvBackwardFilter(s, in, dy, params_[l.p].grad, beta));
      }
      if (need_dx) GPUFEED_RETURN_IF_ERROR(ops_->ConvBackwardData(s, dy, params_[l.p].copy, dx));
      return Status::Ok();
    }
    case Kind::kBnRelu: {
      BnArgs a{size_t(batch) * l.h * l.w, l.c, dt};
      a.relu = l.bn_relu;
      const void* y = sl.acts[i];
      if (spec_.recompute_blocks) {
        // This block's conv output again, from its kept input (the same
        // kernel on the same values as the forward pass), into the buffer
        // where the forward's batchnorm-ReLU output was: the ReLU's mask is
        // made again from it (y null), the statistics are the forward's.
        const Layer& c = layers_[i - 1];
        ConvShape cs = c.conv;
        cs.n = batch;
        GPUFEED_RETURN_IF_ERROR(
            ops_->ConvForward(cs, i - 1 == size_t(begin_) ? x : sl.acts[i - 2], params_[c.p].copy, sl.acts[i - 1]));
        y = nullptr;
      }
      // A frozen gamma or beta: its gradient goes to scratch, unused.
      float* dgamma = params_[l.p].frozen() ? frozen_grad_ : params_[l.p].grad;
      float* dbeta = params_[l.p2].frozen() ? frozen_grad_beta_ : params_[l.p2].grad;
      return ops_->BnReluBackward(a, in, y, dy, params_[l.p].master, params_[l.p2].master, sl.save_mean[i],
                                  sl.save_invstd[i], dx, dgamma, dbeta, beta);
    }
    case Kind::kPool:
      return ops_->MaxPoolBackward(batch, l.h, l.w, l.c, dt, dy, sl.argmax[i], dx);
    case Kind::kPool3:
      return ops_->MaxPool3x3Backward(batch, l.h, l.w, l.c, dt, dy, sl.argmax[i], dx);
    case Kind::kGap:
      return ops_->GlobalAvgPoolBackward(batch, l.h * l.w, l.c, dt, dy, dx);
    case Kind::kAdd:  // BackwardGraph passes an add's gradient on itself
      return Status::Internal("model: an add's backward runs in BackwardGraph");
  }
  return Status::Ok();
}

Status Model::Backward(const void* x, int batch, bool accumulate, const GradsReady& on_grads, int slot,
                       const void* dy_in) {
  if (spec_.plan_only) return Status::Internal("model: a plan-only model runs nothing");
  Slot& sl = slots_[size_t(slot)];
  const float beta = accumulate ? 1.0f : 0.0f;
  const void* dy = dy_in ? dy_in : sl.dlogits;
  if (spec_.kind == ModelKind::kResnet18) return BackwardGraph(x, batch, beta, on_grads, sl, dy);
  // Down to the first layer with a trainable parameter: below it no
  // gradient is needed (frozen layers, ModelSpec::freeze). A stage past the
  // first goes down to its input, whose gradient the previous stage takes.
  for (size_t i = size_t(end_); i-- > first_trainable_;) {
    void* dx = (dy == grad_a_) ? grad_b_ : grad_a_;
    // Recomputing, a pool's input gradient must not go to the recompute
    // buffer (grad_a_), which its batchnorm refills next: in the whole model
    // its gradient arrives there; a stage's last pool gets it from outside.
    if (spec_.recompute_blocks && layers_[i].kind == Kind::kPool && dy != grad_a_) dx = grad_b_;
    // Recomputing blocks, the batchnorm's gradient goes where its output's
    // was: the other buffer holds its recomputed input.
    if (spec_.recompute_blocks && layers_[i].kind == Kind::kBnRelu) dx = const_cast<void*>(dy);
    const bool need_dx = i > first_trainable_ || begin_ > 0;
    GPUFEED_RETURN_IF_ERROR(BackwardLayer(i, x, dy, dx, need_dx, batch, beta, sl));
    const Layer& l = layers_[i];
    if (on_grads && l.pend > l.pbegin) GPUFEED_RETURN_IF_ERROR(on_grads(l.pbegin, l.pend));
    dy = dx;
  }
  input_grad_ = begin_ > 0 ? dy : nullptr;
  return Status::Ok();
}

// Down from the head: each layer's output gradient complete once every
// layer reading it has run its backward (they all come later); the first
// to deliver one writes it, the others add theirs.
Status Model::BackwardGraph(const void* x, int batch, float beta, const GradsReady& on_grads, Slot& sl,
                            const void* dy_head) {
  const DType dt = spec_.dtype;
  const size_t es = DTypeSize(dt);
  std::vector<char> written(layers_.size(), 0);
  // The lowest layer whose output gradient is needed: a stage past the
  // first passes its input's back (the layer before it), whole or not.
  const int lowest = begin_ > 0 ? begin_ - 1 : int(first_trainable_);
  auto deliver = [&](int to, const void* g) -> Status {
    if (to < lowest) return Status::Ok();  // nothing below trains
    const size_t n = size_t(batch) * layers_[size_t(to)].out_elems;
    void* dst = out_grads_[size_t(to)];
    if (written[size_t(to)]) return ops_->AddAct(dst, g, n, false, dt);
    written[size_t(to)] = 1;
    return ops_->Copy(dst, g, n * es);
  };
  auto step = [&](size_t i) -> Status {
    const Layer& l = layers_[i];
    void* dy = i + 1 == size_t(end_) ? const_cast<void*>(dy_head) : out_grads_[i];
    if (i + 1 != size_t(end_) && !written[i]) return Status::Ok();  // feeds nothing that trains
    const int from = l.in == -2 ? int(i) - 1 : l.in;
    if (l.kind == Kind::kAdd) {
      GPUFEED_RETURN_IF_ERROR(ops_->ReluBackward(dy, sl.acts[i], size_t(batch) * l.out_elems, dt));
      GPUFEED_RETURN_IF_ERROR(deliver(from, dy));
      return deliver(l.in2, dy);
    }
    const bool need_dx = from >= lowest;
    // A second gradient for `from` goes to scratch first, then is added; so
    // does one nobody needs (batchnorm and pooling always write theirs).
    const bool add = need_dx && written[size_t(from)];
    void* dx = !need_dx || add ? grad_a_ : out_grads_[size_t(from)];
    GPUFEED_RETURN_IF_ERROR(BackwardLayer(i, x, dy, dx, need_dx, batch, beta, sl));
    if (add)
      GPUFEED_RETURN_IF_ERROR(
          ops_->AddAct(out_grads_[size_t(from)], grad_a_, size_t(batch) * layers_[size_t(from)].out_elems, false, dt));
    if (need_dx) written[size_t(from)] = 1;
    if (on_grads && l.pend > l.pbegin) GPUFEED_RETURN_IF_ERROR(on_grads(l.pbegin, l.pend));
    return Status::Ok();
  };
  for (size_t i = size_t(end_); i-- > first_trainable_;)
    GPUFEED_RETURN_IF_ERROR(layer_timer_ ? layer_timer_(i, [&] { return step(i); }) : step(i));
  input_grad_ = begin_ > 0 ? out_grads_[size_t(begin_ - 1)] : nullptr;
  return Status::Ok();
}

size_t Model::input_elems() const {
  return begin_ == 0 ? size_t(spec_.in_h) * spec_.in_w * spec_.in_c : layers_[size_t(begin_ - 1)].out_elems;
}

std::string Model::LayerName(int i) const {
  const Layer& l = layers_[size_t(i)];
  switch (l.kind) {
    case Kind::kLinear:
      return "linear" + std::to_string(i);
    case Kind::kConv:
      return "conv" + std::to_string(i);
    case Kind::kBnRelu:
      return "conv" + std::to_string(i - 1) + ".bn";
    case Kind::kPool:
    case Kind::kPool3:
      return "pool" + std::to_string(i);
    case Kind::kGap:
      return "avgpool" + std::to_string(i);
    case Kind::kAdd:
      return "add" + std::to_string(i);
  }
  return "?";
}

Result<std::vector<double>> Model::ProfileLayers(const void* x, int batch, int reps) {
  if (spec_.plan_only) return Status::Internal("model: a plan-only model runs nothing");
  const size_t n = size_t(end_ - begin_);
  std::vector<std::vector<double>> ms(n);
  Slot& sl = slots_[0];
  auto timed = [&](size_t k, const std::function<Status()>& f) -> Status {
    GPUFEED_RETURN_IF_ERROR(ops_->Sync());
    const auto t0 = std::chrono::steady_clock::now();
    GPUFEED_RETURN_IF_ERROR(f());
    GPUFEED_RETURN_IF_ERROR(ops_->Sync());
    ms[k].back() += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return Status::Ok();
  };
  for (int r = 0; r < reps; ++r) {
    for (auto& m : ms) m.push_back(0);
    for (size_t i = size_t(begin_); i < size_t(end_); ++i)
      GPUFEED_RETURN_IF_ERROR(timed(i - begin_, [&] { return ForwardLayer(i, x, batch, true, sl); }));
    const void* dy = sl.dlogits ? sl.dlogits : grad_b_;
    if (spec_.kind == ModelKind::kResnet18) {  // each layer's step of the backward pass, timed
      layer_timer_ = [&](size_t i, const std::function<Status()>& f) { return timed(i - begin_, f); };
      const Status st = BackwardGraph(x, batch, 0.0f, {}, sl, dy);
      layer_timer_ = nullptr;
      GPUFEED_RETURN_IF_ERROR(st);
      continue;
    }
    for (size_t i = size_t(end_); i-- > size_t(begin_);) {
      void* dx = (dy == grad_a_) ? grad_b_ : grad_a_;
      // Recomputing, a pool's input gradient must not go to the recompute
      // buffer (grad_a_), which its batchnorm refills next: in the whole model
      // its gradient arrives there; a stage's last pool gets it from outside.
      if (spec_.recompute_blocks && layers_[i].kind == Kind::kPool && dy != grad_a_) dx = grad_b_;
      GPUFEED_RETURN_IF_ERROR(timed(
          i - begin_, [&] { return BackwardLayer(i, x, dy, dx, i > size_t(begin_) || begin_ > 0, batch, 0.0f, sl); }));
      dy = dx;
    }
  }
  std::vector<double> out(n);
  for (size_t k = 0; k < n; ++k) {
    std::sort(ms[k].begin(), ms[k].end());
    out[k] = ms[k][ms[k].size() / 2];
  }
  return out;
}

Status Model::LoraGrads(const Layer& l, float beta) {
  const Param& a = params_[l.pa];
  const Param& b = params_[l.pb];
  const int r = spec_.lora_rank;
  if (!b.frozen()) {
    GemmArgs g;  // dB[out, r] = scale dW[out, in] A^T
    g.trans_b = true;
    g.m = l.fan_out, g.n = r, g.k = l.fan_in;
    g.alpha = lora_scale_, g.beta = beta;
    g.a = lora_scratch_, g.lda = l.fan_in;
    g.b = a.master, g.ldb = l.fan_in;
    g.c = b.grad, g.ldc = r;
    GPUFEED_RETURN_IF_ERROR(ops_->Gemm(g));
  }
  if (!a.frozen()) {
    GemmArgs g;  // dA[r, in] = scale B^T dW[out, in]
    g.trans_a = true;
    g.m = r, g.n = l.fan_in, g.k = l.fan_out;
    g.alpha = lora_scale_, g.beta = beta;
    g.a = b.master, g.lda = r;
    g.b = lora_scratch_, g.ldb = l.fan_in;
    g.c = a.grad, g.ldc = l.fan_in;
    GPUFEED_RETURN_IF_ERROR(ops_->Gemm(g));
  }
  return Status::Ok();
}

Status Model::RefreshLoraWeights() {
  for (const Layer& l : layers_) {
    if (l.pa < 0) continue;
    const Param& w = params_[l.p];
    GPUFEED_RETURN_IF_ERROR(ops_->Copy(lora_scratch_, w.master, w.n * 4));
    GemmArgs g;  // W + scale B[out, r] A[r, in], in fp32, then to the compute copy
    g.m = l.fan_out, g.n = l.fan_in, g.k = spec_.lora_rank;
    g.alpha = lora_scale_, g.beta = 1;
    g.a = params_[l.pb].master, g.lda = spec_.lora_rank;
    g.b = params_[l.pa].master, g.ldb = l.fan_in;
    g.c = lora_scratch_, g.ldc = l.fan_in;
    GPUFEED_RETURN_IF_ERROR(ops_->Gemm(g));
    GPUFEED_RETURN_IF_ERROR(ops_->Cast(lora_scratch_, w.copy, spec_.dtype, w.n));
  }
  return Status::Ok();
}

Result<std::vector<std::vector<float>>> Model::MergedMasters() {
  std::vector<std::vector<float>> out;
  auto fetch = [&](const Param& p) -> Result<std::vector<float>> {
    std::vector<float> v(p.n);
    GPUFEED_RETURN_IF_ERROR(ops_->Download(v.data(), p.master, p.n * 4));
    return v;
  };
  for (const Layer& l : layers_) {
    for (int q = l.pbegin; q < l.pend; ++q) {
      if (q == l.pa || q == l.pb) continue;
      auto v = fetch(params_[q]);
      if (!v.ok()) return v.status();
      if (q == l.p && l.pa >= 0) {
        auto a = fetch(params_[l.pa]);
        if (!a.ok()) return a.status();
        auto b = fetch(params_[l.pb]);
        if (!b.ok()) return b.status();
        const int r = spec_.lora_rank;
        for (int o = 0; o < l.fan_out; ++o)
          for (int i = 0; i < l.fan_in; ++i) {
            double s = 0;
            for (int k = 0; k < r; ++k) s += double((*b)[size_t(o) * r + k]) * (*a)[size_t(k) * l.fan_in + i];
            (*v)[size_t(o) * l.fan_in + i] += static_cast<float>(lora_scale_ * s);
          }
      }
      out.push_back(std::move(*v));
    }
  }
  return out;
}

std::string Model::Describe() const {
  std::string d = spec_.kind == ModelKind::kMlp ? "mlp " : spec_.kind == ModelKind::kCnn ? "cnn " : "resnet18 ";
  if (spec_.kind == ModelKind::kMlp) {
    d += std::to_string(spec_.in_h * spec_.in_w * spec_.in_c);
    for (int w : spec_.widths) d += "-" + std::to_string(w);
  } else {
    d += std::to_string(spec_.in_c) + "x" + std::to_string(spec_.in_h) + "x" + std::to_string(spec_.in_w);
    for (int w : spec_.widths) d += "-c" + std::to_string(w);
  }
  return d + "-" + std::to_string(spec_.classes);
}

uint64_t Model::num_parameters() const {
  uint64_t n = 0;
  for (const Param& p : params_) n += p.n;
  return n;
}
uint64_t Model::weight_bytes() const { return weights_; }
uint64_t Model::grad_bytes() const { return grads_; }
uint64_t Model::optimizer_bytes() const { return opt_; }
uint64_t Model::activation_bytes() const { return acts_bytes_; }

std::vector<std::pair<float*, size_t>> Model::buffers() {
  std::vector<std::pair<float*, size_t>> b;
  for (Layer& l : layers_)
    if (l.kind == Kind::kBnRelu && l.run_mean) {
      b.emplace_back(l.run_mean, size_t(l.c));
      b.emplace_back(l.run_var, size_t(l.c));
    }
  return b;
}

void Quant8Tables(Model& m, std::vector<Quant8Tensor>* tensors, std::vector<Quant8Block>* blocks) {
  for (auto& p : m.params()) {
    if (!p.quantized()) continue;
    Quant8Tensor t;
    t.master = p.master, t.grad = p.grad, t.q1 = p.q1, t.q2 = p.q2, t.a1 = p.a1, t.a2 = p.a2;
    t.copy = p.copy != p.master ? p.copy : nullptr;
    t.n = p.n;
    t.decay = p.decay ? 1 : 0;
    const uint32_t count = static_cast<uint32_t>((p.n + kQuantBlock - 1) / kQuantBlock);
    for (uint32_t b = 0; b < count; ++b) blocks->push_back({static_cast<int32_t>(tensors->size()), b});
    tensors->push_back(t);
  }
}

}  // namespace gpufeed::trainer
