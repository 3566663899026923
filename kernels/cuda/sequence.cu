// Sequence kernels first, launchers last (see sequence.h for the contracts).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sequence.h"

namespace ddplab::cuda {
namespace {

using detail::from_float;
using detail::to_float;

using detail::length_of;

// A thread per (b, c), columns across threads (coalesced), sequences across blockIdx.y: each thread walks its column
// down the sequence's valid rows in order, as the CPU does, so fp32 sums are bitwise equal.
template <typename T>
__global__ void mean_pool_forward_kernel(T* out, const T* inp, const int32_t* lengths, int B, int S, int C) {
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int L = length_of(lengths, b, S);
    const float inv = L > 0 ? 1.0f / static_cast<float>(L) : 0.0f;
    for (int64_t c = detail::global_index(); c < C; c += detail::grid_stride()) {
      float sum = 0.0f;
      for (int t = 0; t < L; ++t) sum += to_float(inp[(int64_t{b} * S + t) * C + c]);
      out[int64_t{b} * C + c] = from_float<T>(sum * inv);
    }
  }
}

template <typename T>
__global__ void mean_pool_backward_kernel(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C) {
  const int64_t n = int64_t{B} * S * C;
  for (int64_t i = detail::global_index(); i < n; i += detail::grid_stride()) {
    const int64_t row = i / C;
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    const int L = length_of(lengths, b, S);
    const float inv = L > 0 ? 1.0f / static_cast<float>(L) : 0.0f;  // as the CPU: dout * (1 / L)
    dinp[i] = from_float<T>(t < L ? to_float(dout[int64_t{b} * C + i % C]) * inv : 0.0f);
  }
}

__global__ void next_token_targets_kernel(int32_t* targets, const int32_t* tokens, const int32_t* lengths, int B,
                                          int S) {
  const int64_t n = int64_t{B} * S;
  for (int64_t i = detail::global_index(); i < n; i += detail::grid_stride()) {
    const int b = static_cast<int>(i / S), t = static_cast<int>(i % S);
    targets[i] = t + 1 < length_of(lengths, b, S) ? tokens[i + 1] : -1;
  }
}

__global__ void zero_padded_rows_kernel(__nv_bfloat16* x, const int32_t* lengths, int B, int S, int width) {
  const int64_t n = int64_t{B} * S * width;
  for (int64_t i = detail::global_index(); i < n; i += detail::grid_stride()) {
    const int64_t row = i / width;  // b * S + t
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    if (t >= length_of(lengths, b, S)) x[i] = __float2bfloat16(0.0f);
  }
}

void check_sizes(const char* what, int B, int S, int C) {
  if (B < 0 || S < 0 || C <= 0)
    throw std::invalid_argument(std::string(what) + ": need B >= 0, S >= 0 and C > 0, got B=" + std::to_string(B) +
                                " S=" + std::to_string(S) + " C=" + std::to_string(C));
}

}  // namespace

template <typename T>
void mean_pool_forward(T* out, const T* inp, const int32_t* lengths, int B, int S, int C, cudaStream_t stream) {
  check_sizes("mean_pool_forward", B, S, C);
  if (B == 0) return;
  const dim3 grid(detail::grid_size(C), static_cast<unsigned>(std::min(B, 65535)));
  mean_pool_forward_kernel<T><<<grid, detail::kBlockSize, 0, stream>>>(out, inp, lengths, B, S, C);
  cudaCheck(cudaGetLastError());
}

template <typename T>
void mean_pool_backward(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C, cudaStream_t stream) {
  check_sizes("mean_pool_backward", B, S, C);
  const int64_t n = int64_t{B} * S * C;
  if (n == 0) return;
  mean_pool_backward_kernel<T><<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(dinp, dout, lengths, B, S, C);
  cudaCheck(cudaGetLastError());
}

void next_token_targets(int32_t* targets, const int32_t* tokens, const int32_t* lengths, int B, int S,
                        cudaStream_t stream) {
  check_sizes("next_token_targets", B, S, 1);
  const int64_t n = int64_t{B} * S;
  if (n == 0) return;
  next_token_targets_kernel<<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(targets, tokens, lengths, B, S);
  cudaCheck(cudaGetLastError());
}

void zero_padded_rows(__nv_bfloat16* x, const int32_t* lengths, int B, int S, int width, cudaStream_t stream) {
  check_sizes("zero_padded_rows", B, S, width);
  const int64_t n = int64_t{B} * S * width;
  if (n == 0 || lengths == nullptr) return;
  zero_padded_rows_kernel<<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(x, lengths, B, S, width);
  cudaCheck(cudaGetLastError());
}

#define DDPLAB_INSTANTIATE(T)                                                                    \
  template void mean_pool_forward<T>(T*, const T*, const int32_t*, int, int, int, cudaStream_t); \
  template void mean_pool_backward<T>(T*, const T*, const int32_t*, int, int, int, cudaStream_t);
DDPLAB_INSTANTIATE(float)
DDPLAB_INSTANTIATE(__nv_bfloat16)
#undef DDPLAB_INSTANTIATE

}  // namespace ddplab::cuda
