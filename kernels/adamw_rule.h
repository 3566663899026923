// AdamW's update of one parameter, as torch.optim.AdamW's (decoupled weight decay, bias-corrected moments), written
// once for the CPU's loop (kernels/cpu/ops.cpp) and the GPU's kernel (kernels/cuda/adamw_kernels.cuh): plain scalar
// code nvcc also compiles for the device. The two differ only where a compiler contracts a multiply and an add into
// one FMA (nvcc does by default): one rounding instead of two.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define DDPLAB_ADAMW_HD __host__ __device__
#else
#define DDPLAB_ADAMW_HD
#endif

namespace ddplab {

// Step t's constants. The bias corrections bc1 = 1 - beta1^t and bc2 = 1 - beta2^t are folded in, so that each
// element costs one square root and one division:
//   m_hat / (sqrt(v_hat) + eps) = (m / bc1) / (sqrt(v / bc2) + eps) = (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
template <typename T>
struct AdamwRule {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  T step;          // lr / bc1
  T inv_sqrt_bc2;  // 1 / sqrt(bc2)
  T decay;         // lr * weight_decay

  // g: the gradient as the update reads it (times gradient clipping's factor, where there is one).
  DDPLAB_ADAMW_HD void apply(T& p, T g, T& m, T& v) const {
    using std::sqrt;  // the device's sqrtf in nvcc's device code, std::sqrt on the host
    const T m_t = m = beta1 * m + one_minus_beta1 * g;
    const T v_t = v = beta2 * v + one_minus_beta2 * g * g;
    p -= step * m_t / (sqrt(v_t) * inv_sqrt_bc2 + eps) + decay * p;
  }
};

// t counts from 1. The corrections in double on the host, each rounded once to T: 1 - beta2^t in float would lose
// most of its digits for the first steps (beta2 0.999: 1e-3 at t = 1).
template <typename T>
AdamwRule<T> adamw_rule(float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  return AdamwRule<T>{T(beta1),
                      T(1 - beta1),
                      T(beta2),
                      T(1 - beta2),
                      T(eps),
                      static_cast<T>(lr / bc1),
                      static_cast<T>(1.0 / std::sqrt(bc2)),
                      static_cast<T>(lr) * T(weight_decay)};
}

}  // namespace ddplab
