// Model: layer list, parameter initialisation, forward and backward passes.
#include "trainer/model.h"

#include <algorithm>
#include <cmath>

#include "gpu/transform.h"  // Mix64

namespace gpufeed::trainer {

Model::~Model() {
  for (void* p : owned_) ops_->Free(p);
}

Status Model::Allocate(size_t bytes, void** p, uint64_t* counter) {
  GPUFEED_RETURN_IF_ERROR(ops_->Alloc(bytes, p));
  owned_.push_back(*p);
  *counter += bytes;
  return Status::Ok();
}

// Uniform in [-bound, bound] (fill when bound == 0), from (seed, tensor):
// the same weights on every backend and run.
Status Model::AddParam(const std::string& name, size_t n, bool decay, float bound, float fill, int* index) {
  Param p;
  p.name = name;
  p.n = n;
  p.decay = decay;
  void* v;
  GPUFEED_RETURN_IF_ERROR(Allocate(n * 4, &v, &weights_));
  p.master = static_cast<float*>(v);
  const bool frozen = std::any_of(spec_.freeze.begin(), spec_.freeze.end(),
                                  [&](const std::string& f) { return name.compare(0, f.size(), f) == 0; });
  const bool adam = spec_.optimizer == OptimizerKind::kAdamW;
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
  std::vector<float> init(n, fill);
  if (bound > 0) {
    const uint64_t key = gpu::Mix64(spec_.seed ^ gpu::Mix64(0x5EED0000ull + params_.size()));
    for (size_t i = 0; i < n; ++i) {
      const double u = double(gpu::Mix64(key + i) >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
      init[i] = static_cast<float>((2 * u - 1) * bound);
    }
  }
  GPUFEED_RETURN_IF_ERROR(ops_->Upload(p.master, init.data(), n * 4));
  // Weights of GEMMs/convolutions get a compute copy in the compute dtype;
  // biases and batchnorm parameters are used in fp32 directly.
  if (spec_.dtype != DType::kFloat32 && decay) {
    GPUFEED_RETURN_IF_ERROR(Allocate(n * DTypeSize(spec_.dtype), &p.copy, &weights_));
    GPUFEED_RETURN_IF_ERROR(ops_->Cast(p.master, p.copy, spec_.dtype, n));
  } else if (decay) {
    p.copy = p.master;
  }
  *index = static_cast<int>(params_.size());
  params_.push_back(std::move(p));
  return Status::Ok();
}

Status Model::Init() {
  const ModelSpec& s = spec_;
  if (s.in_h <= 0 || s.in_w <= 0 || s.in_c <= 0 || s.classes < 2 || s.max_batch <= 0)
    return Status::InvalidArgument("model: bad input geometry or classes");
  for (const std::string& f : s.freeze)
    if (f.empty())
      return Status::InvalidArgument("model: an empty name to freeze (--freeze takes names such as conv0)");
  for (int w : s.widths)
    if (w <= 0) return Status::InvalidArgument("model: layer widths must be positive");
  int h = s.in_h, w = s.in_w, c = s.in_c;
  auto linear = [&](int in, int out, bool relu) -> Status {
    Layer l;
    l.kind = Kind::kLinear;
    l.in_features = in;
    l.out_features = out;
    l.relu = relu;
    const std::string name = "linear" + std::to_string(layers_.size());
    GPUFEED_RETURN_IF_ERROR(AddParam(name + ".weight", size_t(in) * out, true,
                                     relu ? std::sqrt(6.0f / in) : 1.0f / std::sqrt(float(in)), 0, &l.p));
    GPUFEED_RETURN_IF_ERROR(AddParam(name + ".bias", out, false, 0, 0, &l.p2));
    l.out_elems = out;
    layers_.push_back(l);
    return Status::Ok();
  };
  if (s.kind == ModelKind::kMlp) {
    int in = h * w * c;
    for (int width : s.widths) {
      GPUFEED_RETURN_IF_ERROR(linear(in, width, true));
      in = width;
    }
    GPUFEED_RETURN_IF_ERROR(linear(in, s.classes, false));
  } else {
    for (int k : s.widths) {
      if (h < 2 || w < 2)
        return Status::InvalidArgument("model: too many cnn blocks for a " + std::to_string(s.in_h) + "x" +
                                       std::to_string(s.in_w) + " input (each halves the size)");
      Layer conv;
      conv.kind = Kind::kConv;
      conv.conv = ConvShape{s.max_batch, h, w, c, k, s.dtype};
      const std::string name = "conv" + std::to_string(layers_.size());
      GPUFEED_RETURN_IF_ERROR(
          AddParam(name + ".weight", conv.conv.w_elems(), true, std::sqrt(6.0f / (9 * c)), 0, &conv.p));
      conv.out_elems = size_t(h) * w * k;
      layers_.push_back(conv);
      Layer bn;
      bn.kind = Kind::kBnRelu;
      bn.h = h, bn.w = w, bn.c = k;
      GPUFEED_RETURN_IF_ERROR(AddParam(name + ".bn.gamma", k, false, 0, 1, &bn.p));
      GPUFEED_RETURN_IF_ERROR(AddParam(name + ".bn.beta", k, false, 0, 0, &bn.p2));
      void* v;
      for (float** f : {&bn.run_mean, &bn.run_var, &bn.save_mean, &bn.save_invstd}) {
        GPUFEED_RETURN_IF_ERROR(Allocate(size_t(k) * 4, &v, &weights_));
        *f = static_cast<float*>(v);
      }
      std::vector<float> ones(k, 1.0f);
      GPUFEED_RETURN_IF_ERROR(ops_->Upload(bn.run_var, ones.data(), size_t(k) * 4));
      bn.out_elems = conv.out_elems;
      layers_.push_back(bn);
      Layer pool;
      pool.kind = Kind::kPool;
      pool.h = h, pool.w = w, pool.c = k;
      h /= 2, w /= 2, c = k;
      pool.out_elems = size_t(h) * w * c;
      GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * pool.out_elems, &v, &acts_bytes_));
      pool.argmax = static_cast<uint8_t*>(v);
      layers_.push_back(pool);
    }
    GPUFEED_RETURN_IF_ERROR(linear(h * w * c, s.classes, false));
  }
  const size_t es = DTypeSize(s.dtype);
  size_t widest = size_t(s.in_h) * s.in_w * s.in_c;
  for (Layer& l : layers_) {
    void* v;
    GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * l.out_elems * es, &v, &acts_bytes_));
    acts_.push_back(v);
    widest = std::max(widest, l.out_elems);
  }
  // Freezing: every name must match a parameter, and something must train.
  for (const std::string& f : s.freeze) {
    if (std::none_of(params_.begin(), params_.end(),
                     [&](const Param& p) { return p.name.compare(0, f.size(), f) == 0; })) {
      std::string names;
      for (const Param& p : params_) names += (names.empty() ? "" : ", ") + p.name;
      return Status::InvalidArgument("model: --freeze " + f + " names no parameter of " + Describe() + " (" + names +
                                     ")");
    }
  }
  first_trainable_ = layers_.size();
  size_t widest_bn = 0;
  for (size_t i = layers_.size(); i-- > 0;) {
    const Layer& l = layers_[i];
    const bool trainable = (l.p >= 0 && !params_[l.p].frozen()) || (l.p2 >= 0 && !params_[l.p2].frozen());
    if (trainable) first_trainable_ = i;
    if (l.kind == Kind::kBnRelu && l.p >= 0 && (params_[l.p].frozen() || params_[l.p2].frozen()))
      widest_bn = std::max(widest_bn, size_t(l.c));
  }
  if (first_trainable_ == layers_.size())
    return Status::InvalidArgument("model: --freeze leaves nothing of " + Describe() + " to train");
  if (widest_bn > 0) {
    void* v;
    GPUFEED_RETURN_IF_ERROR(Allocate(2 * widest_bn * 4, &v, &grads_));
    frozen_grad_ = static_cast<float*>(v);
    frozen_grad_beta_ = frozen_grad_ + widest_bn;
  }
  GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * s.classes * es, &dlogits_, &acts_bytes_));
  GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * widest * es, &grad_a_, &acts_bytes_));
  GPUFEED_RETURN_IF_ERROR(Allocate(size_t(s.max_batch) * widest * es, &grad_b_, &acts_bytes_));
  return Status::Ok();
}

Status Model::Forward(const void* x, int batch, bool training) {
  if (batch <= 0 || batch > spec_.max_batch) return Status::InvalidArgument("model: batch size out of range");
  const DType dt = spec_.dtype;
  const void* in = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    void* out = acts_[i];
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
        GPUFEED_RETURN_IF_ERROR(ops_->BiasAct(out, params_[l.p2].master, batch, l.out_features, l.relu, dt));
        break;
      }
      case Kind::kConv: {
        ConvShape s = l.conv;
        s.n = batch;
        GPUFEED_RETURN_IF_ERROR(ops_->ConvForward(s, in, params_[l.p].copy, out));
        break;
      }
      case Kind::kBnRelu: {
        BnArgs a{size_t(batch) * l.h * l.w, l.c, dt};
        GPUFEED_RETURN_IF_ERROR(ops_->BnReluForward(a, training, in, params_[l.p].master, params_[l.p2].master,
                                                    l.run_mean, l.run_var, l.save_mean, l.save_invstd, out));
        break;
      }
      case Kind::kPool:
        GPUFEED_RETURN_IF_ERROR(ops_->MaxPoolForward(batch, l.h, l.w, l.c, dt, in, out, l.argmax));
        break;
    }
    in = out;
  }
  return Status::Ok();
}

Status Model::Backward(const void* x, int batch, bool accumulate, const GradsReady& on_grads) {
  const DType dt = spec_.dtype;
  const float beta = accumulate ? 1.0f : 0.0f;
  void* dy = dlogits_;
  // Down to the first layer with a trainable parameter: below it no
  // gradient is needed (frozen layers, ModelSpec::freeze).
  for (size_t i = layers_.size(); i-- > first_trainable_;) {
    Layer& l = layers_[i];
    const void* in = i == 0 ? x : acts_[i - 1];
    void* dx = (dy == grad_a_) ? grad_b_ : grad_a_;
    const bool need_dx = i > first_trainable_;
    switch (l.kind) {
      case Kind::kLinear: {
        if (l.relu) GPUFEED_RETURN_IF_ERROR(ops_->ReluBackward(dy, acts_[i], size_t(batch) * l.out_features, dt));
        if (!params_[l.p].frozen()) {
          GemmArgs gw;  // dW[out, in] = dY^T X
          gw.trans_a = true;
          gw.m = l.out_features, gw.n = l.in_features, gw.k = batch;
          gw.a = dy, gw.lda = l.out_features;
          gw.b = in, gw.ldb = l.in_features;
          gw.c = params_[l.p].grad, gw.ldc = l.in_features;
          gw.beta = beta;
          gw.ab = dt, gw.c_dtype = DType::kFloat32;
          GPUFEED_RETURN_IF_ERROR(ops_->Gemm(gw));
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
        break;
      }
      case Kind::kConv: {
        ConvShape s = l.conv;
        s.n = batch;
        if (!params_[l.p].frozen())
          GPUFEED_RETURN_IF_ERROR(ops_->ConvBackwardFilter(s, in, dy, params_[l.p].grad, beta));
        if (need_dx) GPUFEED_RETURN_IF_ERROR(ops_->ConvBackwardData(s, dy, params_[l.p].copy, dx));
        break;
      }
      case Kind::kBnRelu: {
        BnArgs a{size_t(batch) * l.h * l.w, l.c, dt};
        // A frozen gamma or beta: its gradient goes to scratch, unused.
        float* dgamma = params_[l.p].frozen() ? frozen_grad_ : params_[l.p].grad;
        float* dbeta = params_[l.p2].frozen() ? frozen_grad_beta_ : params_[l.p2].grad;
        GPUFEED_RETURN_IF_ERROR(ops_->BnReluBackward(a, in, acts_[i], dy, params_[l.p].master, l.save_mean,
                                                     l.save_invstd, dx, dgamma, dbeta, beta));
        break;
      }
      case Kind::kPool:
        GPUFEED_RETURN_IF_ERROR(ops_->MaxPoolBackward(batch, l.h, l.w, l.c, dt, dy, l.argmax, dx));
        break;
    }
    if (on_grads && l.p >= 0) GPUFEED_RETURN_IF_ERROR(on_grads(l.p, (l.p2 >= 0 ? l.p2 : l.p) + 1));
    dy = dx;
  }
  return Status::Ok();
}

std::string Model::Describe() const {
  std::string d = spec_.kind == ModelKind::kMlp ? "mlp " : "cnn ";
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
    if (l.kind == Kind::kBnRelu) {
      b.emplace_back(l.run_mean, size_t(l.c));
      b.emplace_back(l.run_var, size_t(l.c));
    }
  return b;
}

}  // namespace gpufeed::trainer
