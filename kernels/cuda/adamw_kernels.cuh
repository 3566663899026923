// The update's kernels (launchers and contracts: adamw.h): AdamW, and the gradients' global norm that gradient
// clipping scales it by. Included by adamw.cu and, compiled by g++, by tests/emu/test_adamw_convert_emu.cpp.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/adamw_rule.h"  // the update of one parameter, the CPU's
#include "kernels/cuda/adamw.h"  // ClippedNorm
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/float16.h"    // the bf16 copy rounds as the CPU wire and convert.cu do
#include "kernels/grad_clip.h"  // the clip factor, as the CPU computes it

namespace ddplab::cuda::adamw {

// copy: null, or the bf16 words of the updated params (a uniform branch: every thread takes the same side).
// grad_scale: null, or the factor every gradient is read times (ClippedNorm::scale, written by a kernel before).
template <int V>
__global__ void adamw_kernel(float* params, uint16_t* copy, const float* grads, float* m, float* v, int64_t n,
                             AdamwRule<float> rule, const int* skip_if_set, const float* grad_scale) {
  if (skip_if_set && *skip_if_set) return;  // uniform: every thread reads the same flag, and no barrier follows
  const float s = grad_scale ? *grad_scale : 1.0f;  // g * 1 is g: without clipping every bit is as before
  detail::for_each_pack<V>(
      n,
      [=](int64_t i) {
        detail::Pack<float, V> p = detail::load_pack<V>(params + i), mi = detail::load_pack<V>(m + i),
                               vi = detail::load_pack<V>(v + i);
        const detail::Pack<float, V> g = detail::load_pack<V>(grads + i);
        for (int k = 0; k < V; ++k) rule.apply(p.v[k], g.v[k] * s, mi.v[k], vi.v[k]);
        detail::store_pack(params + i, p), detail::store_pack(m + i, mi), detail::store_pack(v + i, vi);
        if (copy) {
          detail::Pack<uint16_t, V> h;
          for (int k = 0; k < V; ++k) h.v[k] = float16::f32_to_bf16(p.v[k]);
          detail::store_pack(copy + i, h);
        }
      },
      [=](int64_t i) {
        rule.apply(params[i], grads[i] * s, m[i], v[i]);
        if (copy) copy[i] = float16::f32_to_bf16(params[i]);
      });
}

// The norm in two passes, each in an order fixed by n (and the launcher's packed or scalar kernel, by x's alignment),
// not by the GPU's size: every GPU, every run, sums the same gradients to the same bits, so replicas that clip by it
// stay identical. Pass 1: norm_blocks(n) blocks of kNormThreads threads, each thread summing the squares of its
// grid-stride share in double, each block its threads' sums into partials[block]. Pass 2: one block adds the
// partials, and writes the norm and the clip factor.
constexpr int kNormThreads = 256;
// An H100 or H200 holds 8 blocks of 256 threads on each of its 132 SMs, 1056 in all: the cap is one wave there. The
// cap, not the GPU, fixes the grid.
constexpr int kMaxNormBlocks = 1024;
inline int norm_blocks(int64_t n) {
  const int64_t wanted = (n + 4 * kNormThreads - 1) / (4 * kNormThreads);  // 4 elements a thread at least
  return static_cast<int>(wanted < 1 ? 1 : wanted > kMaxNormBlocks ? kMaxNormBlocks : wanted);
}

// Both take kNormSharedBytes of dynamic shared memory: the block reduction's 32 doubles.
constexpr size_t kNormSharedBytes = 32 * sizeof(double);

template <int V>
__global__ void sum_of_squares_kernel(const float* x, int64_t n, double* partials) {
  extern __shared__ __align__(16) unsigned char smem[];
  double* const shared = reinterpret_cast<double*>(smem);
  double sum = 0;
  detail::for_each_pack<V>(
      n,
      [&](int64_t i) {
        const detail::Pack<float, V> p = detail::load_pack<V>(x + i);
        for (int k = 0; k < V; ++k) sum += static_cast<double>(p.v[k]) * p.v[k];
      },
      [&](int64_t i) { sum += static_cast<double>(x[i]) * x[i]; });
  sum = detail::block_reduce<detail::Sum>(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void finish_norm_kernel(const double* partials, int blocks, float max_norm, ClippedNorm* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  double* const shared = reinterpret_cast<double*>(smem);
  double sum = 0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) sum += partials[b];
  sum = detail::block_reduce<detail::Sum>(sum, shared);
  if (threadIdx.x == 0) {
    const double norm = sqrt(sum);
    *out = ClippedNorm{norm, max_norm > 0 ? clip_scale(norm, max_norm) : 1.0f};
  }
}

}  // namespace ddplab::cuda::adamw
