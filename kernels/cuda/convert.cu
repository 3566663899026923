// Conversion and gradient-check kernels first, launchers last (see convert.h for the contracts).
//
// All three are streaming maps: grid-stride loops moving 4 elements per thread and step (16 bytes of fp32, 8 of
// bf16) when the pointers allow it, then the n % 4 tail by the first threads of the grid.
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using detail::global_index;
using detail::grid_stride;

// comm/wire.h's f32_to_bf16, on the device: integer round to nearest even on the top 16 bits; NaN keeps its sign
// and top payload bits and is made quiet (a payload in the low bits only would otherwise round to inf).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t{h} << 16); }

template <int V>
__global__ void f32_to_bf16_kernel(uint16_t* dst, const float* src, int64_t n) {
  const int64_t groups = n / V;
  for (int64_t i = global_index(); i < groups; i += grid_stride()) {
    if constexpr (V == 4) {
      const float4 x = reinterpret_cast<const float4*>(src)[i];
      const uint32_t lo = f32_to_bf16_bits(x.x) | uint32_t{f32_to_bf16_bits(x.y)} << 16;
      const uint32_t hi = f32_to_bf16_bits(x.z) | uint32_t{f32_to_bf16_bits(x.w)} << 16;
      reinterpret_cast<uint2*>(dst)[i] = make_uint2(lo, hi);  // little-endian: element 0 in the low half
    } else {
      dst[i] = f32_to_bf16_bits(src[i]);
    }
  }
  const int64_t tail = groups * V + global_index();
  if (tail < n) dst[tail] = f32_to_bf16_bits(src[tail]);
}

template <int V>
__global__ void bf16_to_f32_kernel(float* dst, const uint16_t* src, int64_t n) {
  const int64_t groups = n / V;
  for (int64_t i = global_index(); i < groups; i += grid_stride()) {
    if constexpr (V == 4) {
      const uint2 h = reinterpret_cast<const uint2*>(src)[i];
      reinterpret_cast<float4*>(dst)[i] = make_float4(__uint_as_float(h.x << 16), __uint_as_float(h.x & 0xffff0000u),
                                                      __uint_as_float(h.y << 16), __uint_as_float(h.y & 0xffff0000u));
    } else {
      dst[i] = bf16_bits_to_f32(src[i]);
    }
  }
  const int64_t tail = groups * V + global_index();
  if (tail < n) dst[tail] = bf16_bits_to_f32(src[tail]);
}

// The flag is written by at most one lane per warp that saw a non-finite value, with a plain store of 1: every
// writer stores the same value, so no atomic is needed, and the common case (all finite) writes nothing.
template <int V>
__global__ void scale_and_check_finite_kernel(float* x, float s, int64_t n, int* flag) {
  bool bad = false;
  const int64_t groups = n / V;
  for (int64_t i = global_index(); i < groups; i += grid_stride()) {
    if constexpr (V == 4) {
      float4 v = reinterpret_cast<float4*>(x)[i];
      v.x *= s, v.y *= s, v.z *= s, v.w *= s;
      bad |= !(isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w));
      reinterpret_cast<float4*>(x)[i] = v;
    } else {
      const float v = x[i] * s;
      bad |= !isfinite(v);
      x[i] = v;
    }
  }
  const int64_t tail = groups * V + global_index();
  if (tail < n) {
    const float v = x[tail] * s;
    bad |= !isfinite(v);
    x[tail] = v;
  }
  // Every thread of the grid gets here (no early return), so the full-warp vote is well defined.
  if (__any_sync(detail::kFullMask, bad) && threadIdx.x % 32 == 0) *flag = 1;
}

void check_count(const char* what, int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string(what) + ": negative n " + std::to_string(n));
}

}  // namespace

void f32_to_bf16(__nv_bfloat16* dst, const float* src, int64_t n, cudaStream_t stream) {
  check_count("f32_to_bf16", n);
  if (n == 0) return;
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  if (detail::all_aligned(16, src) && detail::all_aligned(8, d))
    f32_to_bf16_kernel<4><<<detail::grid_size(n / 4 + 1), detail::kBlockSize, 0, stream>>>(d, src, n);
  else
    f32_to_bf16_kernel<1><<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(d, src, n);
  cudaCheck(cudaGetLastError());
}

void bf16_to_f32(float* dst, const __nv_bfloat16* src, int64_t n, cudaStream_t stream) {
  check_count("bf16_to_f32", n);
  if (n == 0) return;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  if (detail::all_aligned(16, dst) && detail::all_aligned(8, s))
    bf16_to_f32_kernel<4><<<detail::grid_size(n / 4 + 1), detail::kBlockSize, 0, stream>>>(dst, s, n);
  else
    bf16_to_f32_kernel<1><<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(dst, s, n);
  cudaCheck(cudaGetLastError());
}

void scale_and_check_finite(float* x, float s, int64_t n, int* flag, cudaStream_t stream) {
  check_count("scale_and_check_finite", n);
  if (n == 0) return;
  if (flag == nullptr) throw std::invalid_argument("scale_and_check_finite: flag is null");
  if (detail::all_aligned(16, x))
    scale_and_check_finite_kernel<4><<<detail::grid_size(n / 4 + 1), detail::kBlockSize, 0, stream>>>(x, s, n, flag);
  else
    scale_and_check_finite_kernel<1><<<detail::grid_size(n), detail::kBlockSize, 0, stream>>>(x, s, n, flag);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
