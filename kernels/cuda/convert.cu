// Conversion and gradient-check kernels first, launchers last (see convert.h for the contracts).
//
// All three are streaming maps (map_elements and for_each_pack, launch.cuh): 4 elements per thread and step (16 bytes
// of fp32, 8 of bf16) when the pointers allow it, then the n % 4 tail by the first threads of the grid.
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.cuh"

namespace ddplab::cuda {
namespace {

using detail::bf16_bits_to_f32;
using detail::f32_to_bf16_bits;

struct ToBf16Bits {
  __device__ uint16_t operator()(float x) const { return f32_to_bf16_bits(x); }
};
struct FromBf16Bits {
  __device__ float operator()(uint16_t h) const { return bf16_bits_to_f32(h); }
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
// writer stores the same value, so no atomic is needed, and the common case (all finite) writes nothing.
template <int V>
__global__ void scale_and_check_finite_kernel(float* x, float s, int64_t n, int* flag) {
  bool bad = false;
  detail::for_each_pack<V>(
      n,
      [&](int64_t i) {
        detail::Pack<float, V> v = detail::load_pack<V>(x + i);
        for (float& e : v.v) {
          e *= s;
          bad |= !isfinite(e);
        }
        detail::store_pack(x + i, v);
      },
      [&](int64_t i) {
        const float v = x[i] * s;
        bad |= !isfinite(v);
        x[i] = v;
      });
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
  detail::launch_packed(detail::map_packs_fit(d, src), n, stream, f32_to_bf16_kernel<4>, f32_to_bf16_kernel<1>, d, src,
                        n);
  cudaCheck(cudaGetLastError());
}

void bf16_to_f32(float* dst, const __nv_bfloat16* src, int64_t n, cudaStream_t stream) {
  check_count("bf16_to_f32", n);
  if (n == 0) return;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  detail::launch_packed(detail::map_packs_fit(dst, s), n, stream, bf16_to_f32_kernel<4>, bf16_to_f32_kernel<1>, dst, s,
                        n);
  cudaCheck(cudaGetLastError());
}

void scale_and_check_finite(float* x, float s, int64_t n, int* flag, cudaStream_t stream) {
  check_count("scale_and_check_finite", n);
  if (n == 0) return;
  if (flag == nullptr) throw std::invalid_argument("scale_and_check_finite: flag is null");
  detail::launch_packed(detail::all_aligned(16, x), n, stream, scale_and_check_finite_kernel<4>,
                        scale_and_check_finite_kernel<1>, x, s, n, flag);
  cudaCheck(cudaGetLastError());
}

}  // namespace ddplab::cuda
