// The classifier's layers, parameters and buffers, and its forward and
// backward passes written once against trainer::Ops (so the CPU and CUDA
// backends run the same sequence of operations).
#ifndef GPUFEED_TRAINER_MODEL_H_
#define GPUFEED_TRAINER_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpufeed/status.h"
#include "gpufeed/trainer.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {

struct ModelSpec {
  ModelKind kind = ModelKind::kMlp;
  std::vector<int> widths;           // mlp hidden widths / cnn channels
  int in_h = 0, in_w = 0, in_c = 0;  // NHWC sample
  int classes = 0;
  int max_batch = 0;
  DType dtype = DType::kFloat32;  // activations and weight copies
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  // 8-bit optimizer states (Quant8Tensor) for tensors of at least
  // kQuantMinElems values; fp32 states for the others.
  bool quantized_states = false;
  uint64_t seed = 0;
  // Parameters whose names start with one of these ("conv0", "linear9.bias")
  // are frozen: no gradient, no optimizer state, never updated.
  std::vector<std::string> freeze;
  // LoRA (rank > 0): every linear and conv layer but the head gets adapters
  // A [rank, fan_in] and B [out, rank] ("conv0.lora_a", "conv0.lora_b"),
  // its weight used as W + (alpha / rank) B A; W and the batchnorm
  // parameters are frozen, the adapters and the head train. B starts at 0,
  // so the model starts as the base. alpha 0: alpha = rank.
  int lora_rank = 0;
  float lora_alpha = 0;
  // cnn: keep each block's input (the pools' outputs) but not its conv and
  // batchnorm outputs: the backward pass recomputes each block's conv output
  // into one block's buffer and makes the ReLU's mask again from it (the
  // same kernels on the same values: the same weights as without). The mlp
  // has no blocks.
  bool recompute_blocks = false;
  // Pipeline stages: this model holds and runs only the whole model's layers
  // [layer_begin, layer_end) (-1: to the last). Parameters are initialised
  // by their index in the whole model, so the stages together start as the
  // one model does. A stage past the first takes the previous stage's output
  // as its input, and Backward leaves that input's gradient in input_grad().
  int layer_begin = 0, layer_end = -1;
  // Activation sets: micro-batches whose forward pass ran and whose backward
  // has not yet (a pipeline's in flight), each with buffers of its own.
  int slots = 1;
  // Counts every byte a model of this spec would hold and allocates none
  // (the partitioner's view of a stage); such a model runs nothing.
  bool plan_only = false;
  // The device bytes the model may hold (weights, gradients, optimizer
  // state, activations); 0: no limit. Init fails past it, naming it.
  uint64_t memory_limit = 0;
};

// One trainable tensor: fp32 master, fp32 gradient, optimizer state, and the
// compute copy (the master itself in fp32).
struct Param {
  std::string name;
  size_t n = 0;
  bool decay = true;  // weight decay applies (not to biases and batchnorm)
  float* master = nullptr;
  float* grad = nullptr;
  float* s1 = nullptr;    // SGD momentum / Adam m (null with 8-bit states)
  float* s2 = nullptr;    // Adam v (null for SGD)
  uint8_t* q1 = nullptr;  // 8-bit states (ModelSpec::quantized_states): m, v
  uint8_t* q2 = nullptr;  // and each block's absmax
  float* a1 = nullptr;
  float* a2 = nullptr;
  bool quantized() const { return q1 != nullptr; }
  void* copy = nullptr;  // compute dtype
  // Frozen (ModelSpec::freeze): grad and the states are null.
  bool is_frozen = false;
  bool frozen() const { return is_frozen; }
};

class Model {
 public:
  Model(Ops* ops, ModelSpec spec) : ops_(ops), spec_(std::move(spec)) {}
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  Status Init();  // allocates, initialises the weights from spec.seed

  // x: batch x in_h x in_w x in_c in spec.dtype (a later stage: the previous
  // stage's output). Leaves the output (the last stage's: logits) in
  // output(slot).
  Status Forward(const void* x, int batch, bool training, int slot = 0);
  // From dlogits() (already filled by the loss): parameter gradients, added
  // to the existing ones when `accumulate`. `on_grads`, when set, is called
  // as soon as a layer's parameter gradients are queued, with their range
  // [first, end) in params() (backward order: the last layer's first), so
  // data parallel can start reducing them while earlier layers still run.
  // `dy`: the output's gradient (a stage before the last: from the next
  // stage); null: dlogits(slot).
  using GradsReady = std::function<Status(int first, int end)>;
  Status Backward(const void* x, int batch, bool accumulate, const GradsReady& on_grads = {}, int slot = 0,
                  const void* dy = nullptr);

  const void* output(int slot = 0) const { return slots_[size_t(slot)].acts[size_t(end_ - 1)]; }
  const void* logits() const { return output(0); }
  void* dlogits(int slot = 0) { return slots_[size_t(slot)].dlogits; }
  // After Backward of a stage past the first: the gradient of its input.
  const void* input_grad() const { return input_grad_; }
  // This stage's layers [layer_begin(), layer_end()) of the whole model's
  // num_layers(); a sample's values at its input and output.
  int layer_begin() const { return begin_; }
  int layer_end() const { return end_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  size_t input_elems() const;
  size_t output_elems() const { return layers_[size_t(end_ - 1)].out_elems; }
  std::string LayerName(int i) const;  // "conv0", "conv0.bn", "pool2", "linear9"
  // Whether a pipeline stage may begin at layer i (or the one before end
  // there): no layer from i on reads an output from before layer i - 1, so
  // only layer i - 1's output crosses. resnet18: not inside a basic block,
  // whose shortcut reads the block's input; the mlp and cnn: anywhere.
  bool StageMayBeginAt(int i) const;
  // Milliseconds of each of this stage's layers, forward and backward, on a
  // batch of `batch` (x as Forward's), the median of `reps` runs, each layer
  // waited for alone. Trains nothing: the gradients are overwritten.
  Result<std::vector<double>> ProfileLayers(const void* x, int batch, int reps);
  std::vector<Param>& params() { return params_; }
  const ModelSpec& spec() const { return spec_; }
  std::string Describe() const;  // "mlp 784-256-128-10"
  uint64_t num_parameters() const;
  // Bytes by category, for the memory breakdown.
  uint64_t weight_bytes() const, grad_bytes() const, optimizer_bytes() const, activation_bytes() const;

  // Batchnorm running statistics (part of the checkpoint), fp32, in order.
  std::vector<std::pair<float*, size_t>> buffers();
  // The number of trailing params() that form the classifier head (the last
  // linear layer's weight and bias).
  static constexpr int kHeadParams = 2;
  // LoRA: the weights' compute copies from their masters and adapters
  // (W + scale B A); queued after every optimizer step and after weights
  // are loaded. Nothing without LoRA.
  Status RefreshLoraWeights();
  // LoRA: the masters of the model without adapters, by parameter (the
  // weights merged: W + scale B A, in fp32 on the host), in the order of a
  // model built from the same spec without lora_rank.
  Result<std::vector<std::vector<float>>> MergedMasters();
  bool lora() const { return spec_.lora_rank > 0; }

 private:
  // kPool3: the stem's 3x3/2 max pooling; kGap: global average pooling;
  // kAdd: a residual join, relu(layer in + layer in2).
  enum class Kind { kLinear, kConv, kBnRelu, kPool, kPool3, kGap, kAdd };
  struct Layer {
    Kind kind = Kind::kLinear;
    // The layer whose output is the input: -2 the one before (mlp, cnn),
    // -1 the model's input; in2 the add's shortcut (resnet18).
    int in = -2, in2 = -1;
    bool bn_relu = true;                    // bn: followed by its ReLU (not before an add)
    int in_features = 0, out_features = 0;  // linear
    bool relu = false;                      // linear
    ConvShape conv;                         // conv (n = max batch)
    int h = 0, w = 0, c = 0;                // bn/pool input geometry
    int p = -1, p2 = -1;                    // indices into params_ (weight/gamma, bias/beta)
    int pa = -1, pb = -1;                   // LoRA adapters A, B (linear/conv but the head)
    int pbegin = 0, pend = 0;               // the layer's params: [pbegin, pend)
    int fan_in = 0, fan_out = 0;            // linear/conv weight as a matrix [fan_out, fan_in]
    float* run_mean = nullptr;              // bn
    float* run_var = nullptr;
    size_t out_elems = 0;  // per sample
  };
  // One micro-batch's buffers, by layer (null outside the stage).
  struct Slot {
    std::vector<void*> acts;                     // acts[i]: output of layer i (max batch)
    std::vector<float*> save_mean, save_invstd;  // bn
    std::vector<uint8_t*> argmax;                // pool
    void* dlogits = nullptr;                     // the last stage
  };
  bool InStage(size_t i) const { return int(i) >= begin_ && (end_ < 0 || int(i) < end_); }
  // Layer i's forward pass; x is the stage's input (InputOf).
  Status ForwardLayer(size_t i, const void* x, int batch, bool training, Slot& s);
  // dy -> dx (when need_dx) and the layer's parameter gradients.
  Status BackwardLayer(size_t i, const void* x, const void* dy, void* dx, bool need_dx, int batch, float beta, Slot& s);
  Status Allocate(size_t bytes, void** p, uint64_t* counter);
  // A LoRA adapter trains and has no compute copy; a base parameter with
  // LoRA on is frozen unless it belongs to the head.
  enum class Role { kBase, kHead, kLora };
  Status AddParam(const std::string& name, size_t n, bool decay, float bound, float fill, int* index,
                  Role role = Role::kBase);
  Status AddLora(Layer& l, const std::string& name);
  // Init's steps, in order.
  Status CheckSpec();
  Status BuildLayers();
  Status AddLinear(int in, int out, bool relu, bool head);
  Status AddConvBlock(int k, int* h, int* w, int* c);
  // resnet18: the stem, four stages of two basic blocks, global pooling and
  // the head; a conv (r x r, stride, pad) and its batchnorm from layer `in`.
  Status BuildResnet();
  Status AddConvBn(int k, int r, int stride, int pad, bool relu, int in, int* h, int* w, int* c);
  Status AddBatchNorm(const std::string& name, int h, int w, int k, bool relu, size_t out_elems);
  Status AddBasicBlock(int k, int stride, int* h, int* w, int* c);
  const void* InputOf(size_t i, const void* x, const Slot& s) const;
  // Layer j's output: before the stage (the one before its first layer, the
  // only one a stage reads from before it), the stage's input x.
  const void* Act(int j, const void* x, const Slot& s) const { return j < begin_ ? x : s.acts[size_t(j)]; }
  // resnet18's backward: a gradient buffer a layer (out_grads_), two summed
  // where a layer's output feeds two (a block's input).
  Status BackwardGraph(const void* x, int batch, float beta, const GradsReady& on_grads, Slot& s, const void* dy);
  Status AllocateSlots(void* rc, size_t* widest);
  // Freezing: every name matches a parameter, something trains; the lowest
  // trained layer, and the scratch frozen batchnorms and LoRA need.
  Status SetUpFreezing();
  // The adapters' gradients from the layer's full weight gradient in
  // lora_scratch_ (fp32 [fan_out, fan_in]): dB = scale dW A^T, dA = scale
  // B^T dW, added to the existing ones when beta is 1.
  Status LoraGrads(const Layer& l, float beta);

  Ops* ops_;
  ModelSpec spec_;
  std::vector<Layer> layers_;
  std::vector<Param> params_;
  std::vector<Slot> slots_;
  int begin_ = 0, end_ = -1;  // the stage's layers
  int serial_ = 0;            // parameters of the whole model so far (their init key)
  bool building_in_stage_ = true;
  const void* input_grad_ = nullptr;
  void* grad_a_ = nullptr;  // ping-pong activation gradients
  void* grad_b_ = nullptr;
  // resnet18: each layer's output gradient (a stage past the first: also
  // its input's, the layer before it, which input_grad() returns).
  std::vector<void*> out_grads_;
  // ProfileLayers on resnet18: BackwardGraph runs each layer's step through
  // this (which times it).
  std::function<Status(size_t, const std::function<Status()>&)> layer_timer_;
  std::vector<void*> owned_;
  // Layers below this index have no trainable parameter: the backward pass
  // stops there (their input gradients are never needed).
  size_t first_trainable_ = 0;
  float* frozen_grad_ = nullptr;  // scratch for a frozen batchnorm's parameter gradients
  float* frozen_grad_beta_ = nullptr;
  // LoRA: a layer's full weight gradient (fp32, the largest weight), from
  // which its adapters' gradients are taken; the merged weight in fp32 when
  // the compute copy is refreshed.
  float* lora_scratch_ = nullptr;
  float lora_scale_ = 0;
  uint64_t weights_ = 0, grads_ = 0, opt_ = 0, acts_bytes_ = 0;
};

// The tables Ops::ApplyOptimizer8bit walks for `m`'s quantized parameters
// (one entry a tensor, one a block of kQuantBlock values), in parameter order.
void Quant8Tables(Model& m, std::vector<Quant8Tensor>* tensors, std::vector<Quant8Block>* blocks);

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_MODEL_H_
