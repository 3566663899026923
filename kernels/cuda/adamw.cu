// AdamW kernel first, launcher last (see adamw.h for the contract).
#include <cmath>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

// Divides by the bias corrections rather than multiplying by their inverses, as the CPU reference does, so the
// two agree to rounding.
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float bc1, float bc2) {
  for (int64_t i = detail::global_index(); i < n; i += detail::grid_stride()) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    params[i] = p - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p);
  }
}

}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t, cudaStream_t stream) {
  if (n <= 0) return;
  // In double on the host and rounded once, as the CPU reference does: 1 - beta2^t loses digits in float.
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  adamw_kernel<<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(params, grads, m, v, n, lr, beta1, beta2, eps,
                                                                        weight_decay, bc1, bc2);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
