// The unfused attention's own kernels (launchers and contracts: attention.h; the GEMMs between them are cuBLAS's).
// Included by attention.cu and, compiled by g++, by tests/emu/test_attention_emu.cpp.
//
// Per head (batch index i = b * NH + h), with Q, K, V, dO [S, hs] and att, dZ [S, S] row-major, the kernels here do
// what the GEMMs cannot: move the heads between [B, S, P*C] and [P][B][NH][S][hs], the masked softmax of the scaled
// scores, and its backward dZ = scale * att * (dP - rowsum(att * dP)).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace ddplab::cuda::attention {

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;

using detail::length_of;

// Keys [0, n) are valid for query t of a sequence of length L; n == 0 for a padded query.
__device__ __forceinline__ int valid_keys(int t, int L, bool causal) { return t >= L ? 0 : (causal ? t + 1 : L); }

// in [B, S, P*C] -> out [P][B][NH][S][hs] (part p of the row, head h, column d), padded rows written as 0 without
// reading the input. A block per (b, t) row: the threads read the row's P*C floats coalesced, and write runs of hs
// contiguous floats.
static __global__ void __launch_bounds__(kBlock)
    split_heads_kernel(float* out, const float* in, const int32_t* lengths, int B, int S, int C, int NH, int P) {
  const int hs = C / NH;
  const int64_t X = int64_t{B} * S * C;  // floats per part
  for (int64_t row = blockIdx.x; row < int64_t{B} * S; row += gridDim.x) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    const bool valid = t < length_of(lengths, b, S);
    for (int col = threadIdx.x; col < P * C; col += blockDim.x) {
      const int p = col / C, c = col % C, h = c / hs, d = c % hs;
      out[p * X + ((int64_t{b} * NH + h) * S + t) * hs + d] = valid ? in[row * P * C + col] : 0.0f;
    }
  }
}

// The inverse: in [P][B][NH][S][hs] -> out [B, S, P*C], padded rows 0 (writes coalesced).
static __global__ void __launch_bounds__(kBlock)
    merge_heads_kernel(float* out, const float* in, const int32_t* lengths, int B, int S, int C, int NH, int P) {
  const int hs = C / NH;
  const int64_t X = int64_t{B} * S * C;
  for (int64_t row = blockIdx.x; row < int64_t{B} * S; row += gridDim.x) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    const bool valid = t < length_of(lengths, b, S);
    for (int col = threadIdx.x; col < P * C; col += blockDim.x) {
      const int p = col / C, c = col % C, h = c / hs, d = c % hs;
      out[row * P * C + col] = valid ? in[p * X + ((int64_t{b} * NH + h) * S + t) * hs + d] : 0.0f;
    }
  }
}

// att [B*NH*S rows of S] holds the scaled scores; overwritten in place with the masked softmax. A warp per row
// (lanes strided over keys, coalesced): pass 1 an online (max, sum of exp) over the valid keys only, so a masked
// score is never read and cannot leak a NaN or inf; pass 2 writes every entry of the row, 0 where masked.
static __global__ void __launch_bounds__(kBlock)
    softmax_forward_kernel(float* att, const int32_t* lengths, int NH, int S, int64_t rows, bool causal) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const int t = static_cast<int>(row % S), b = static_cast<int>(row / S / NH);
    const int n = valid_keys(t, length_of(lengths, b, S), causal);
    float* r = att + row * S;
    float m = -INFINITY, s = 0.0f;
    for (int j = lane; j < n; j += 32) detail::online_softmax_update(m, s, r[j]);
    const float row_max = detail::warp_max(m);
    const float sum = detail::warp_sum(m == -INFINITY ? s : s * expf(m - row_max));  // s: 0, or a NaN
    const float inv = n > 0 ? 1.0f / sum : 0.0f;  // sum >= 1 when n > 0: the max term is exp(0)
    for (int j = lane; j < S; j += 32) r[j] = j < n ? expf(r[j] - row_max) * inv : 0.0f;
  }
}

// dz holds dP = dO V^T; overwritten in place with dZ = scale * att * (dP - sum_j att dP) on valid keys, 0 elsewhere.
static __global__ void __launch_bounds__(kBlock)
    softmax_backward_kernel(float* dz, const float* att, const int32_t* lengths, int NH, int S, int64_t rows,
                            bool causal, float scale) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const int t = static_cast<int>(row % S), b = static_cast<int>(row / S / NH);
    const int n = valid_keys(t, length_of(lengths, b, S), causal);
    float* d = dz + row * S;
    const float* p = att + row * S;
    float dot = 0.0f;
    for (int j = lane; j < n; j += 32) dot += p[j] * d[j];
    dot = detail::warp_sum(dot);
    for (int j = lane; j < S; j += 32) d[j] = j < n ? scale * p[j] * (d[j] - dot) : 0.0f;
  }
}

}  // namespace ddplab::cuda::attention
