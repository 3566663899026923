// The embedding kernels (launchers and contracts: embedding.h). Forward and the dwte scatter are a warp per (b, t)
// row: the row's token and length are read once, by every lane (a broadcast), and the lanes stride over the C columns
// with 16-byte accesses when the row and the tables allow. Included by embedding.cu and, compiled by g++, by
// tests/emu/test_embedding_emu.cpp.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda::embedding {

using detail::load_pack;
using detail::Pack;
using detail::to_float;

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;

using detail::length_of;

template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_forward_kernel(T* out, const int32_t* tokens, const int32_t* lengths, const float* wte, const float* wpe,
                             int B, int S, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t{B} * S;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    T* o = out + row * C;
    if (t >= length_of(lengths, b, S)) {  // padding: zeros, and the token is not read
      Pack<T, V> zero;
#pragma unroll
      for (int k = 0; k < V; ++k) zero.v[k] = detail::from_float<T>(0.0f);
      for (int c = lane * V; c < C; c += 32 * V) detail::store_pack<V>(o + c, zero);
      continue;
    }
    const float* e = wte + int64_t{tokens[row]} * C;
    const float* p = wpe ? wpe + int64_t{t} * C : nullptr;
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<float, V> ev = load_pack<V>(e + c);
      Pack<float, V> pv{};
      if (p) pv = load_pack<V>(p + c);
      Pack<T, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[k] = detail::from_float<T>(ev.v[k] + pv.v[k]);
      detail::store_pack<V>(o + c, r);
    }
  }
}

// dst[0, V) += v[0, V) atomically per element; 16-byte vector atomics where the hardware has them (sm_90).
template <int V>
__device__ __forceinline__ void atomic_add_pack(float* dst, const float (&v)[V]) {
#if __CUDA_ARCH__ >= 900
  constexpr bool kVector = V % 4 == 0;
#else
  constexpr bool kVector = false;
#endif
  if constexpr (kVector) {
#pragma unroll
    for (int k = 0; k < V; k += 4)
      atomicAdd(reinterpret_cast<float4*>(dst + k), make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]));
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) atomicAdd(dst + k, v[k]);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* tokens, const int32_t* lengths, int B,
                                  int S, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t rows = int64_t{B} * S;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const int b = static_cast<int>(row / S), t = static_cast<int>(row % S);
    if (t >= length_of(lengths, b, S)) continue;
    float* e = dwte + int64_t{tokens[row]} * C;
    const T* d = dout + row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
      const Pack<T, V> dv = load_pack<V>(d + c);
      float v[V];
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = to_float(dv.v[k]);
      atomic_add_pack<V>(e + c, v);
    }
  }
}

// One thread per (t, V columns): threads of a block cover consecutive columns of one position (coalesced for each
// b), blockIdx.y walks positions. Each element is summed by exactly one thread, over b in ascending order from
// its current value — the CPU reference's order, so fp32 results are bitwise equal to it.
template <typename T, int V>
__global__ void __launch_bounds__(kBlock)
    embedding_backward_wpe_kernel(float* dwpe, const T* dout, const int32_t* lengths, int B, int S, int C) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= C) return;
  for (int t = blockIdx.y; t < S; t += gridDim.y) {
    Pack<float, V> acc = load_pack<V>(dwpe + int64_t{t} * C + c);
    for (int b = 0; b < B; ++b) {
      if (t >= length_of(lengths, b, S)) continue;
      const Pack<T, V> dv = load_pack<V>(dout + (int64_t{b} * S + t) * C + c);
#pragma unroll
      for (int k = 0; k < V; ++k) acc.v[k] += to_float(dv.v[k]);
    }
    detail::store_pack<V>(dwpe + int64_t{t} * C + c, acc);
  }
}

template <typename T>
constexpr int kVec = 16 / sizeof(T);  // elements of T per 16-byte access

}  // namespace ddplab::cuda::embedding
