// The conversion and gradient-check kernels (launchers and contracts: convert.h). All three are streaming maps
// (map_elements and for_each_pack, launch.cuh): 4 elements per thread and step (16 bytes of fp32, 8 of bf16) when the
// pointers allow it, then the n % 4 tail by the first threads of the grid. Included by convert.cu and, compiled by
// g++, by tests/emu/test_adamw_convert_emu.cpp.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/float16.h"

namespace ddplab::cuda::convert {

// kernels/float16.h's bf16 rounding, the CPU's own, on the device: the optimizer's bf16 copy of the weights rounds
// alike.
struct ToBf16Bits {
  __device__ uint16_t operator()(float x) const { return float16::f32_to_bf16(x); }
};
struct FromBf16Bits {
  __device__ float operator()(uint16_t h) const { return float16::bf16_to_f32(h); }
};

template <int V>
__global__ void f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  detail::map_elements<V>(dst, src, n, ToBf16Bits{});
}

template <int V>
__global__ void bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  detail::map_elements<V>(dst, src, n, FromBf16Bits{});
}

// The flag is written by at most one lane per warp that saw a non-finite value, with a plain store of 1: every
// writer stores the same value, so no atomic is needed, and the common case (all finite) writes nothing. With s == 1
// (one rank, one micro-batch) the gradients are only read: half the traffic of a pass over every gradient.
template <int V>
__global__ void scale_and_check_finite_kernel(float* x, float s, int64_t n, int* flag) {
  const bool scale = s != 1.0f;
  bool bad = false;
  detail::for_each_pack<V>(
      n,
      [&](int64_t i) {
        detail::Pack<float, V> v = detail::load_pack<V>(x + i);
        for (float& e : v.v) {
          e *= s;
          bad |= !isfinite(e);
        }
        if (scale) detail::store_pack(x + i, v);
      },
      [&](int64_t i) {
        const float v = x[i] * s;
        bad |= !isfinite(v);
        if (scale) x[i] = v;
      });
  // Every thread of the grid gets here (no early return), so the full-warp vote is well defined.
  if (__any_sync(detail::kFullMask, bad) && threadIdx.x % 32 == 0) *flag = 1;
}

}  // namespace ddplab::cuda::convert
