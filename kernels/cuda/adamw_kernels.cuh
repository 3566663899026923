// AdamW's kernel (launcher and contract: adamw.h). Included by adamw.cu and, compiled by g++, by
// tests/emu/test_adamw_convert_emu.cpp.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/float16.h"  // the bf16 copy rounds as the CPU wire and convert.cu do

namespace ddplab::cuda::adamw {

// One parameter's step: cpu::adamw_update's, which folds the bias corrections into per-call constants where this
// divides by them; the two agree to rounding.
struct AdamwStep {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  __device__ void operator()(float& p, float g, float& m, float& v) const {
    m = beta1 * m + (1.0f - beta1) * g;
    v = beta2 * v + (1.0f - beta2) * g * g;
    p = p - lr * ((m / bc1) / (sqrtf(v / bc2) + eps) + weight_decay * p);
  }
};

// Step t's constants: the bias corrections in double on the host and rounded once, as the CPU reference does
// (1 - beta2^t loses digits in float).
inline AdamwStep adamw_step(float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  return AdamwStep{lr, beta1, beta2, eps, weight_decay, bc1, bc2};
}

// copy: null, or the bf16 words of the updated params (a uniform branch: every thread takes the same side).
template <int V>
__global__ void adamw_kernel(float* params, uint16_t* copy, const float* grads, float* m, float* v, int64_t n,
                             AdamwStep step, const int* skip_if_set) {
  if (skip_if_set && *skip_if_set) return;  // uniform: every thread reads the same flag, and no barrier follows
  detail::for_each_pack<V>(
      n,
      [=](int64_t i) {
        detail::Pack<float, V> p = detail::load_pack<V>(params + i), mi = detail::load_pack<V>(m + i),
                               vi = detail::load_pack<V>(v + i);
        const detail::Pack<float, V> g = detail::load_pack<V>(grads + i);
        for (int k = 0; k < V; ++k) step(p.v[k], g.v[k], mi.v[k], vi.v[k]);
        detail::store_pack(params + i, p), detail::store_pack(m + i, mi), detail::store_pack(v + i, vi);
        if (copy) {
          detail::Pack<uint16_t, V> h;
          for (int k = 0; k < V; ++k) h.v[k] = float16::f32_to_bf16(p.v[k]);
          detail::store_pack(copy + i, h);
        }
      },
      [=](int64_t i) {
        step(params[i], grads[i], m[i], v[i]);
        if (copy) copy[i] = float16::f32_to_bf16(params[i]);
      });
}

}  // namespace ddplab::cuda::adamw
