// Per-element math shared by the CPU reference (ops_cpu.cc) and the CUDA
// kernels (ops_cuda.cu), so the two cannot drift apart: storage conversions,
// the optimizer updates, and the scaler's bookkeeping.
#ifndef GPUFEED_TRAINER_ELEM_H_
#define GPUFEED_TRAINER_ELEM_H_

#include <cmath>
#include <cstdint>

#include "gpu/transform.h"  // GPUFEED_HD, FloatToBf16Bits, FloatToHalfBits
#include "trainer/ops.h"

namespace gpufeed::trainer {

GPUFEED_HD float BitsToFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

GPUFEED_HD float Bf16BitsToFloat(uint16_t h) { return BitsToFloat(uint32_t(h) << 16); }

GPUFEED_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return BitsToFloat(sign);
    // Subnormal: value = man * 2^-24, exact in fp32.
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// Loads element i of a buffer in `dt` as fp32; stores fp32 into it (RNE).
GPUFEED_HD float LoadAs(const void* p, size_t i, DType dt) {
  if (dt == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return dt == DType::kBFloat16 ? Bf16BitsToFloat(b) : HalfBitsToFloat(b);
}
// v as a buffer of `dt` holds it.
GPUFEED_HD float RoundTo(DType dt, float v) {
  if (dt == DType::kFloat32) return v;
  return dt == DType::kBFloat16 ? Bf16BitsToFloat(gpu::FloatToBf16Bits(v)) : HalfBitsToFloat(gpu::FloatToHalfBits(v));
}
GPUFEED_HD void StoreAs(void* p, size_t i, DType dt, float v) {
  if (dt == DType::kFloat32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = dt == DType::kBFloat16 ? gpu::FloatToBf16Bits(v) : gpu::FloatToHalfBits(v);
  }
}

// One optimizer update of element (w, g already multiplied by the step's
// coefficient). Returns the new weight; updates s1 (momentum / Adam's m) and
// s2 (Adam's v). The CPU and GPU both call this with the same operands, and
// nvcc is built with --fmad=false for the trainer, so fp32 results agree.
GPUFEED_HD float OptimizerUpdate(const OptimizerStep& o, bool decay, float w, float g, float* s1, float* s2, float lr,
                                 float bc1, float bc2) {
  if (o.kind == OptimizerKind::kSgd) {
    if (decay) g += o.weight_decay * w;
    const float m = o.momentum * *s1 + g;
    *s1 = m;
    return w - lr * m;
  }
  const float m = o.beta1 * *s1 + (1.0f - o.beta1) * g;
  const float v = o.beta2 * *s2 + (1.0f - o.beta2) * g * g;
  *s1 = m;
  *s2 = v;
  if (decay) w -= lr * o.weight_decay * w;
  return w - lr * (m / bc1) / (sqrtf(v / bc2) + o.eps);
}

// One step of the schedule (Schedule): the rate and bias corrections of step
// number st->step (0-based), then counts it. The CPU backend calls this on
// the host, the CUDA one in a one-thread kernel; both in fp32 after a double
// cosine, so they agree to the last bit but for cos's last ulp in double.
GPUFEED_HD void ScheduleAdvance(const Schedule& s, StepState* st) {
  const int64_t t = st->step;
  float lr;
  if (t < s.warmup) {
    lr = s.peak_lr * float(t + 1) / float(s.warmup);
  } else {
    const double span = double(s.total - s.warmup > 1 ? s.total - s.warmup : 1);
    const double x = double(t - s.warmup) / span;
    lr = static_cast<float>(double(s.peak_lr) * 0.5 * (1 + cos(3.141592653589793 * (x < 1 ? x : 1.0))));
  }
  st->lr = lr;
  st->bc1 = 1.0f - powf(s.beta1, static_cast<float>(t + 1));
  st->bc2 = 1.0f - powf(s.beta2, static_cast<float>(t + 1));
  st->step = t + 1;
}

// The 256 values of a dynamic 8-bit code, ascending (Dettmers et al.'s
// dynamic tree code in spirit): for each decade e = 0..6 of magnitude
// 10^(e-6), 2^e (signed) or 2^(e+1) (unsigned) linearly spaced fractions in
// (0.1, 1), so small values keep relative precision; plus 0 and 1. Signed:
// those values and their negatives. Built on the host, in double, rounded
// once to fp32; the CPU and CUDA backends use the same table.
inline void Quant8Code(bool is_signed, float* table) {
  double v[256];
  int n = 0;
  for (int e = 0; e < 7; ++e) {
    const int items = is_signed ? (1 << e) : (2 << e);
    const double scale = std::pow(10.0, e - 6);
    for (int k = 0; k < items; ++k) {
      const double lo = 0.1 + 0.9 * k / items, hi = 0.1 + 0.9 * (k + 1) / items;
      v[n++] = scale * (lo + hi) / 2;
      if (is_signed) v[n++] = -scale * (lo + hi) / 2;
    }
  }
  v[n++] = 0;
  v[n++] = 1;
  for (int i = 1; i < n; ++i)  // insertion sort: 256 values, once
    for (int j = i; j > 0 && v[j - 1] > v[j]; --j) {
      const double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  for (int i = 0; i < 256; ++i) table[i] = static_cast<float>(v[i]);
}

// The index of the code value nearest x (ties: the lower index).
GPUFEED_HD uint8_t Quant8Nearest(const float* code, float x) {
  int lo = 0, hi = 255;  // code[lo] <= x <= code[hi] after clamping
  if (x <= code[0]) return 0;
  if (x >= code[255]) return 255;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (code[mid] <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint8_t>(x - code[lo] <= code[hi] - x ? lo : hi);
}

// One element of an 8-bit step: dequantizes m (and v), updates as
// OptimizerUpdate, returns the new weight; *m, *v receive the new states
// (fp32, to be requantized with the block's new absmax).
GPUFEED_HD float Quant8Update(const OptimizerStep& o, bool decay, float w, float g, const float* scode,
                              const float* ucode, uint8_t q1, float a1, uint8_t q2, float a2, float* m, float* v,
                              float lr, float bc1, float bc2) {
  *m = scode[q1] * a1;
  *v = o.kind == OptimizerKind::kAdamW ? ucode[q2] * a2 : 0.0f;
  return OptimizerUpdate(o, decay, w, g, m, v, lr, bc1, bc2);
}

// A state value's byte given its block's absmax (0: every value is 0).
GPUFEED_HD uint8_t Quant8Store(const float* code, float x, float absmax) {
  return Quant8Nearest(code, absmax > 0 ? x / absmax : 0.0f);
}

// From the sum of squares of the scaled gradients: the step's coefficient,
// skip flag and norm, then the scale update for the next step.
GPUFEED_HD void ScalerFinish(double sum_squares, float clip_norm, ScalerState* s) {
  const bool finite = sum_squares == sum_squares && sum_squares < 1e300;
  const float inv = 1.0f / s->scale;
  const float norm = finite ? static_cast<float>(sqrt(sum_squares)) * inv : INFINITY;
  float coef = inv;
  if (finite && clip_norm > 0 && norm > clip_norm) coef = inv * (clip_norm / (norm + 1e-6f));
  s->step_coef = coef;
  s->step_skip = finite ? 0 : 1;
  s->grad_norm = norm;
  if (!finite) {
    s->skipped += 1;
    s->clean_steps = 0;
    if (s->dynamic) s->scale = s->scale * 0.5f;
  } else if (s->dynamic) {
    s->clean_steps += 1;
    if (s->clean_steps >= s->growth_interval) {
      s->scale = s->scale * 2.0f;
      s->clean_steps = 0;
    }
  }
}

}  // namespace gpufeed::trainer

#endif  // GPUFEED_TRAINER_ELEM_H_
