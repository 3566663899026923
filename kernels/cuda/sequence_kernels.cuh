// The sequence kernels (launchers and contracts: sequence.h). Included by sequence.cu and, compiled by g++, by
// tests/emu/test_sequence_emu.cpp.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda::sequence {

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
      // Unrolled, so that a thread has several rows' loads in flight (the adds stay in order): B x C threads are few
      // (6144 at gpt2-small's shapes, ~1.5 warps an SM), and one load at a time moved 15% of copy on an H200.
#pragma unroll 8
      for (int t = 0; t < L; ++t) sum += to_float(inp[(int64_t{b} * S + t) * C + c]);
      out[int64_t{b} * C + c] = from_float<T>(sum * inv);
    }
  }
}

// A warp per row of dinp, its lanes across the columns: the row's sequence, length and scale found once per row, not
// per element (a thread per element, with three 64-bit divisions each, moved 12% of the copy bandwidth on an H200).
template <typename T>
__global__ void mean_pool_backward_kernel(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C) {
  const int64_t rows = int64_t{B} * S;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t row = detail::global_index() / 32; row < rows; row += detail::grid_stride() / 32) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    const int L = length_of(lengths, b, S);
    const float inv = L > 0 ? 1.0f / static_cast<float>(L) : 0.0f;  // as the CPU: dout * (1 / L)
    T* out = dinp + row * C;
    const T* grad = dout + int64_t{b} * C;
    for (int c = lane; c < C; c += 32) out[c] = from_float<T>(t < L ? to_float(grad[c]) * inv : 0.0f);
  }
}

static __global__ void next_token_targets_kernel(int32_t* targets, const int32_t* tokens, const int32_t* lengths, int B,
                                                 int S) {
  const int64_t n = int64_t{B} * S;
  for (int64_t i = detail::global_index(); i < n; i += detail::grid_stride()) {
    const int b = static_cast<int>(i / S), t = static_cast<int>(i % S);
    targets[i] = t + 1 < length_of(lengths, b, S) ? tokens[i + 1] : -1;
  }
}

// A warp per row: the row's length is read once, and a row within its sequence (every row, for full-length
// sequences) costs one comparison. A thread per element spent ~49 us on gpt2-small's 8 x 1024 x 768 output with
// nothing to zero: two 64-bit divisions per element (H200).
static __global__ void zero_padded_rows_kernel(__nv_bfloat16* x, const int32_t* lengths, int B, int S, int width) {
  const int64_t rows = int64_t{B} * S;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t row = detail::global_index() / 32; row < rows; row += detail::grid_stride() / 32) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    if (t < length_of(lengths, b, S)) continue;
    for (int c = lane; c < width; c += 32) x[row * width + c] = __float2bfloat16(0.0f);
  }
}

}  // namespace ddplab::cuda::sequence
