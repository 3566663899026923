// The update's launchers (kernels: adamw_kernels.cuh; contracts: adamw.h).
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {

using adamw::adamw_kernel;

void adamw_update(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t, cudaStream_t stream,
                  const int* skip_if_set, const float* grad_scale) {
  if (n <= 0) return;
  const AdamwRule<float> rule = adamw_rule<float>(lr, beta1, beta2, eps, weight_decay, t);
  // __nv_bfloat16 is 16 bits without padding (convert.h): its words are written as such.
  uint16_t* const copy = reinterpret_cast<uint16_t*>(params_bf16);
  const bool packed = detail::all_aligned(16, params, grads, m, v) && detail::all_aligned(8, copy);
  detail::launch_packed(packed, n, stream, adamw_kernel<4>, adamw_kernel<1>, params, copy, grads, m, v, n, rule,
                        skip_if_set, grad_scale);
  cudaCheck(cudaGetLastError());
}

size_t grad_norm_workspace_bytes() { return adamw::kMaxNormBlocks * sizeof(double); }

void grad_norm(const float* x, int64_t n, float max_norm, ClippedNorm* out, void* workspace, cudaStream_t stream) {
  const int blocks = adamw::norm_blocks(n);
  double* const partials = static_cast<double*>(workspace);
  if (detail::all_aligned(16, x))
    adamw::sum_of_squares_kernel<4><<<blocks, adamw::kNormThreads, adamw::kNormSharedBytes, stream>>>(x, n, partials);
  else
    adamw::sum_of_squares_kernel<1><<<blocks, adamw::kNormThreads, adamw::kNormSharedBytes, stream>>>(x, n, partials);
  cudaCheck(cudaGetLastError());
  adamw::finish_norm_kernel<<<1, adamw::kNormThreads, adamw::kNormSharedBytes, stream>>>(partials, blocks, max_norm,
                                                                                         out);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
