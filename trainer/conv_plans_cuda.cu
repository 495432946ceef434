#include "trainer/conv_plans_cuda.h"

#include <string>

#include "trainer/cuda_status.h"

namespace gpufeed::trainer {
namespace {

// The heuristics' first (best-ranked) deterministic algorithm, so repeated
// runs pick the same one and produce the same bits.
template <class Perf, class Algo>
Status PickDeterministic(const Perf* perf, int count, Algo* algo, const char* direction) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC) {
      *algo = perf[i].algo;
      return Status::Ok();
    }
  }
  return Status::Unsupported(std::string("cuDNN has no deterministic ") + direction + " convolution for this shape");
}

}  // namespace

ConvPlanCache::~ConvPlanCache() {
  for (auto& [k, p] : plans_) {
    dnn_.destroy_tensor(p.x);
    dnn_.destroy_tensor(p.y);
    dnn_.destroy_filter(p.w);
    dnn_.destroy_conv(p.fwd);
    dnn_.destroy_conv(p.bwd_data);
    dnn_.destroy_conv(p.bwd_filter);
  }
}

Result<const ConvPlan*> ConvPlanCache::Get(cudnnHandle_t cudnn, const ConvShape& s) {
  auto key = std::make_tuple(s.n, s.h, s.w, s.c, s.k, int(s.dtype), s.r, s.stride, s.pad);
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  ConvPlan p;
  const cudnnDataType_t dt = CudnnType(s.dtype);
  CUDNN_RETURN(dnn_.create_tensor(&p.x));
  CUDNN_RETURN(dnn_.create_tensor(&p.y));
  CUDNN_RETURN(dnn_.create_filter(&p.w));
  CUDNN_RETURN(dnn_.set_tensor_4d(p.x, CUDNN_TENSOR_NHWC, dt, s.n, s.c, s.h, s.w));
  CUDNN_RETURN(dnn_.set_tensor_4d(p.y, CUDNN_TENSOR_NHWC, dt, s.n, s.k, s.out_h(), s.out_w()));
  CUDNN_RETURN(dnn_.set_filter_4d(p.w, dt, CUDNN_TENSOR_NHWC, s.k, s.c, s.r, s.r));
  // fp32: plain FMA math (no TF32), so the CPU reference comparison is
  // tight; bf16/fp16: tensor cores, fp32 accumulation.
  const cudnnMathType_t math = s.dtype == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
  for (cudnnConvolutionDescriptor_t* d : {&p.fwd, &p.bwd_data, &p.bwd_filter}) {
    CUDNN_RETURN(dnn_.create_conv(d));
    CUDNN_RETURN(
        dnn_.set_conv_2d(*d, s.pad, s.pad, s.stride, s.stride, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_RETURN(dnn_.set_conv_math(*d, math));
  }
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  CUDNN_RETURN(dnn_.forward_algorithms(cudnn, p.x, p.w, p.fwd, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, fp));
  GPUFEED_RETURN_IF_ERROR(PickDeterministic(fp, got, &p.fwd_algo, "forward"));
  CUDNN_RETURN(dnn_.forward_workspace(cudnn, p.x, p.w, p.fwd, p.y, p.fwd_algo, &p.fwd_ws));
  cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  CUDNN_RETURN(
      dnn_.backward_data_algorithms(cudnn, p.w, p.y, p.bwd_data, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dp));
  GPUFEED_RETURN_IF_ERROR(PickDeterministic(dp, got, &p.data_algo, "backward-data"));
  CUDNN_RETURN(dnn_.backward_data_workspace(cudnn, p.w, p.y, p.bwd_data, p.x, p.data_algo, &p.data_ws));
  cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  CUDNN_RETURN(dnn_.backward_filter_algorithms(cudnn, p.x, p.y, p.bwd_filter, p.w,
                                               CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wp));
  GPUFEED_RETURN_IF_ERROR(PickDeterministic(wp, got, &p.filter_algo, "backward-filter"));
  CUDNN_RETURN(dnn_.backward_filter_workspace(cudnn, p.x, p.y, p.bwd_filter, p.w, p.filter_algo, &p.filter_ws));
  return &(plans_[key] = p);
}

}  // namespace gpufeed::trainer
