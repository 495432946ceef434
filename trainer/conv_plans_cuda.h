// cuDNN convolution plans of the trainer's CUDA backend: for each 3x3
// NHWC shape and dtype, the descriptors and the best-ranked deterministic
// algorithm of each direction (so repeated runs pick the same one and produce
// the same bits) with its workspace size; made once, kept for the run.
#ifndef GPUFEED_TRAINER_CONV_PLANS_CUDA_H_
#define GPUFEED_TRAINER_CONV_PLANS_CUDA_H_

#include <cudnn.h>

#include <map>
#include <tuple>

#include "gpufeed/status.h"
#include "trainer/cuda_libs.h"
#include "trainer/ops.h"

namespace gpufeed::trainer {

struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;
};

// Not thread-safe (the backend's one stream uses it).
class ConvPlanCache {
 public:
  // `dnn`: the loaded cuDNN (cuda_libs.h), which outlives the cache.
  explicit ConvPlanCache(const CudnnApi& dnn) : dnn_(dnn) {}
  ConvPlanCache(const ConvPlanCache&) = delete;
  ConvPlanCache& operator=(const ConvPlanCache&) = delete;
  ~ConvPlanCache();  // destroys every descriptor
  // The plan of `s`, made on first use with `cudnn`'s heuristics.
  Result<const ConvPlan*> Get(cudnnHandle_t cudnn, const ConvShape& s);

 private:
  const CudnnApi& dnn_;
  std::map<std::tuple<int, int, int, int, int, int, int, int, int>, ConvPlan> plans_;
};

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_CONV_PLANS_CUDA_H_
