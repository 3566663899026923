// The elementwise launchers (kernels: elementwise_kernels.cuh; contracts: elementwise.h).
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using elementwise::gelu_backward_kernel;
using elementwise::residual_forward_kernel;
using elementwise::scale_kernel;

// One launcher for both activation types.
template <typename T>
void launch_gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::launch_packed(detail::all_aligned(alignof(detail::Pack<T, 4>), dinp, inp, dout), n, stream,
                        gelu_backward_kernel<T, 4>, gelu_backward_kernel<T, 1>, dinp, inp, dout, n);
  cudaCheck(cudaGetLastError());
}

}  // namespace

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  launch_gelu_backward(dinp, inp, dout, n, stream);
}

void gelu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout, int64_t n,
                   cudaStream_t stream) {
  launch_gelu_backward(dinp, inp, dout, n, stream);
}

void residual_forward(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::launch_packed(detail::all_aligned(alignof(detail::Pack<float, 4>), out, a, b), n, stream,
                        residual_forward_kernel<4>, residual_forward_kernel<1>, out, a, b, n);
  cudaCheck(cudaGetLastError());
}

void scale(float* y, float alpha, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::launch_packed(detail::map_packs_fit(y, y), n, stream, scale_kernel<4>, scale_kernel<1>, y, alpha, n);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
