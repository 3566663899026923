// Elementwise kernels: kernels first, launchers last (see elementwise.h for the contracts).
#include <algorithm>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using detail::global_index;
using detail::grid_stride;

using detail::kGeluCubic;
using detail::kSqrt2OverPi;
// Rounded to float exactly as the CPU reference's T(3 * kGeluCubic).
constexpr float kGeluCubic3 = static_cast<float>(3 * 0.044715);

// ---- kernels ----------------------------------------------------------------------------------------------------

struct Gelu {
  __device__ float operator()(float x) const { return detail::gelu_tanh(x); }
};

template <int V>
__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  detail::map_elements<V>(out, inp, n, Gelu{});
}

// T is the activation type (float or __nv_bfloat16); the arithmetic is fp32 either way.
template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride()) {
    const float x = detail::to_float(inp[i]);
    const float th = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float du_dx = kSqrt2OverPi * (1.0f + kGeluCubic3 * x * x);
    dinp[i] = detail::from_float<T>(detail::to_float(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx));
  }
}

// Columns across threads (coalesced), rows across blockIdx.y: each thread loads its bias once and no index needs
// a 64-bit division.
__global__ void bias_forward_kernel(float* out, const float* bias, int B, int OC) {
  for (int64_t o = global_index(); o < OC; o += grid_stride()) {
    const float b = bias[o];
    for (int64_t row = blockIdx.y; row < B; row += gridDim.y) out[row * OC + o] += b;
  }
}

template <typename T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = global_index(); i < n; i += grid_stride())
    out[i] = detail::from_float<T>(detail::to_float(a[i]) + detail::to_float(b[i]));
}

struct ScaleBy {
  float alpha;
  __device__ float operator()(float x) const { return x * alpha; }
};

template <int V>
__global__ void scale_kernel(float* y, float alpha, int64_t n) {
  detail::map_elements<V>(y, y, n, ScaleBy{alpha});
}

// ---- launchers --------------------------------------------------------------------------------------------------

// One launcher for both activation types.
template <typename T>
void launch_gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_backward_kernel<T><<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(dinp, inp, dout, n);
  cudaCheck(cudaGetLastError());
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::launch_packed(detail::map_packs_fit(out, inp), n, stream, gelu_forward_kernel<4>, gelu_forward_kernel<1>, out,
                        inp, n);
  cudaCheck(cudaGetLastError());
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  launch_gelu_backward(dinp, inp, dout, n, stream);
}

void gelu_backward(__nv_bfloat16* dinp, const __nv_bfloat16* inp, const __nv_bfloat16* dout, int64_t n,
                   cudaStream_t stream) {
  launch_gelu_backward(dinp, inp, dout, n, stream);
}

void bias_forward(float* out, const float* bias, int B, int OC, cudaStream_t stream) {
  if (B <= 0 || OC <= 0) return;
  // About kTargetBlocks blocks in all, whatever the shape; rows beyond gridDim.y (at most 65535) wrap in the kernel.
  constexpr int64_t kTargetBlocks = 4096;
  const unsigned grid_x = detail::grid_size(OC);
  const unsigned grid_y = static_cast<unsigned>(std::clamp<int64_t>(kTargetBlocks / grid_x, 1, std::min(B, 65535)));
  bias_forward_kernel<<<dim3(grid_x, grid_y), detail::kBlockSize, 0, stream>>>(out, bias, B, OC);
  cudaCheck(cudaGetLastError());
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  residual_forward_kernel<T><<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(out, a, b, n);
  cudaCheck(cudaGetLastError());
}
template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                              cudaStream_t);

void scale(float* y, float alpha, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::launch_packed(detail::map_packs_fit(y, y), n, stream, scale_kernel<4>, scale_kernel<1>, y, alpha, n);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
