// The sequence kernels (launchers and contracts: sequence.h). Included by sequence.cu and, compiled by g++, by
// tests/emu/test_sequence_emu.cpp.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/mean_pool.h"

namespace ddplab::cuda::sequence {

using detail::from_float;
using detail::to_float;

using detail::length_of;

// A block per (32 columns, sequence): lane c of every warp takes column c, and the block's warps take the parts of
// kernels/mean_pool.h (part p to warp p % warps), each walked down its rows in order; warp 0 then adds the parts in
// order. So the fp32 pool is bitwise the CPU's whatever the block's size, and the launcher's 16 warps give each
// column 16 walks at once. Lanes past C sum nothing but reach the barriers.
constexpr size_t mean_pool_smem_bytes = sizeof(float) * mean_pool::kParts * 32;
template <typename T>
__global__ void mean_pool_forward_kernel(T* out, const T* inp, const int32_t* lengths, int B, int S, int C) {
  using mean_pool::kParts;
  using mean_pool::part_begin;
  extern __shared__ __align__(16) unsigned char smem[];
  float(*const part_sums)[32] = reinterpret_cast<float(*)[32]>(smem);  // [kParts][32]: mean_pool_smem_bytes
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int b = blockIdx.y; b < B; b += gridDim.y) {
    const int L = length_of(lengths, b, S);
    const float inv = L > 0 ? 1.0f / static_cast<float>(L) : 0.0f;
    for (int64_t first = int64_t{blockIdx.x} * 32; first < C; first += int64_t{gridDim.x} * 32) {
      const int64_t c = first + lane;
      const T* column = inp + int64_t{b} * S * C + c;
      for (int p = warp; p < kParts; p += warps) {
        float sum = 0.0f;
        const int begin = part_begin(L, p), end = c < C ? part_begin(L, p + 1) : begin;
        // Unrolled, so that a lane has several rows' loads in flight (the adds stay in order).
#pragma unroll 8
        for (int t = begin; t < end; ++t) sum += to_float(column[int64_t{t} * C]);
        part_sums[p][lane] = sum;
      }
      __syncthreads();
      if (warp == 0 && c < C) {
        float total = 0.0f;
        for (int p = 0; p < kParts; ++p) total += part_sums[p][lane];
        out[int64_t{b} * C + c] = from_float<T>(total * inv);
      }
      __syncthreads();  // the next columns' parts overwrite part_sums
    }
  }
}

// A warp per row of dinp, its lanes across the columns V at a time (one 16-byte access each where the launcher finds
// the rows aligned, else V = 1): the row's sequence, length and scale found once per row, not per element (a thread
// per element, with three 64-bit divisions each, moved 12% of the copy bandwidth on an H200; a warp per row one
// element a lane, 53% of its size's copy).
template <typename T, int V>
__global__ void mean_pool_backward_kernel(T* dinp, const T* dout, const int32_t* lengths, int B, int S, int C) {
  const int64_t rows = int64_t{B} * S;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t row = detail::global_index() / 32; row < rows; row += detail::grid_stride() / 32) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    const int L = length_of(lengths, b, S);
    const float inv = L > 0 ? 1.0f / static_cast<float>(L) : 0.0f;  // as the CPU: dout * (1 / L)
    T* out = dinp + row * C;
    const T* grad = dout + int64_t{b} * C;
    for (int c = lane * V; c < C; c += 32 * V) {
      const detail::Pack<T, V> g = detail::load_pack<V>(grad + c);
      detail::Pack<T, V> d;
#pragma unroll
      for (int k = 0; k < V; ++k) d.v[k] = from_float<T>(t < L ? to_float(g.v[k]) * inv : 0.0f);
      detail::store_pack<V>(out + c, d);
    }
  }
}

// Packed (positions non-null), a token's next one in the row may begin the next sequence (position 0): no target.
static __global__ void next_token_targets_kernel(int32_t* targets, const int32_t* tokens, const int32_t* lengths,
                                                 const int32_t* positions, int B, int S) {
  const int64_t n = int64_t{B} * S;
  for (int64_t i = detail::global_index(); i < n; i += detail::grid_stride()) {
    const int b = static_cast<int>(i / S), t = static_cast<int>(i % S);
    const bool next_in_sequence = t + 1 < length_of(lengths, b, S) && (!positions || positions[i + 1] != 0);
    targets[i] = next_in_sequence ? tokens[i + 1] : -1;
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
