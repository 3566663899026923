// The exp passes of one row's softmax: the cross-entropy's (ops.cpp) and the attention's (transformer_ops.cpp).
// Internal to kernels/cpu: its loops rely on the library's -fopenmp-simd.
#pragma once
#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vector_math.h"

namespace ddplab::cpu {

// out[j] = exp(in[j] - shift) for j < n (out may be in); returns their sum. Float takes W lanes at a time with the
// vector exp_fast: a loop over the scalar one vectorises, but into blends that cost twice the time (vector_math.h).
template <typename T>
T exp_shifted(T* out, const T* in, int n, T shift) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) sum += (out[j] = exp_fast(in[j] - shift));
  return sum;
}

// The float sum goes through 16 partial sums, one per lane of a 16-lane vector or of two 8-lane ones, folded in the
// same order at either width; so 8 and 16 lanes give the same bits (and two 8-lane chains hide the adder's latency).
template <int W>
inline float exp_shifted_lanes(float* out, const float* in, int n, float shift) {
  using V = typename FloatLanes<W>::V;
  V acc[16 / W] = {};
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    for (int k = 0; k < 16 / W; ++k) {
      const V e = exp_fast_nonpositive(load_lanes<W>(in + j + k * W) - shift);
      store_lanes<W>(out + j + k * W, e);
      acc[k] += e;
    }
  }
  Float8 rest = {};  // a block of 8 left over, at either width
  if (j + 8 <= n) {
    rest = exp_fast_nonpositive(load_lanes<8>(in + j) - shift);
    store_lanes<8>(out + j, rest);
    j += 8;
  }
  float partial[16];
  for (int k = 0; k < 16 / W; ++k) store_lanes<W>(partial + k * W, acc[k]);
  float sum = 0;
  for (int l = 0; l < 8; ++l) sum += (partial[l] + partial[l + 8]) + rest[l];
  for (; j < n; ++j) sum += (out[j] = exp_fast(in[j] - shift));
  return sum;
}
#ifdef DDPLAB_AVX512_KERNELS
[[DDPLAB_AVX512_TARGET]] inline float exp_shifted_16(float* out, const float* in, int n, float shift) {
  return exp_shifted_lanes<16>(out, in, n, shift);
}
#endif
template <>
inline float exp_shifted(float* out, const float* in, int n, float shift) {
#ifdef DDPLAB_AVX512_KERNELS
  if (float_lanes() == 16) return exp_shifted_16(out, in, n, shift);
#endif
  return exp_shifted_lanes<8>(out, in, n, shift);
}

// One row of the cross-entropy's softmax, left unnormalised: e[j] = exp(z[j] - max z) for j < n (e may be z), the
// row's max subtracted so exp never overflows. Returns sum e (for a finite row at least 1: the max term is exp(0)) and
// sets *zmax_out: the cross-entropy is then log(sum) - (z[target] - zmax), finite even when e[target] underflows to 0.
// The probabilities e / sum are formed where they are read (the cross-entropy's backward scales every element anyway),
// which saves a pass over the row here.
template <typename T>
T exp_row(T* e, const T* z, int n, T* zmax_out) {
  T zmax = z[0];
#pragma omp simd reduction(max : zmax)
  for (int v = 0; v < n; ++v) zmax = z[v] > zmax ? z[v] : zmax;
  *zmax_out = zmax;
  return exp_shifted(e, z, n, zmax);
}

// Float: both passes W lanes at a time (the compiler's own vectorisation of the max keeps one 8-lane chain).
template <int W>
inline float exp_row_lanes(float* e, const float* z, int n, float* zmax_out) {
  using V = typename FloatLanes<W>::V;
  V lane_max[2] = {V{} + z[0], V{} + z[0]};  // two chains: each max waits on the one before
  int v = 0;
  for (; v + 2 * W <= n; v += 2 * W)
    for (int k = 0; k < 2; ++k)
      lane_max[k] = max_keeping_nan(load_lanes<W>(z + v + k * W), lane_max[k]);  // z > m ? z : m
  if (v + W <= n) {
    lane_max[0] = max_keeping_nan(load_lanes<W>(z + v), lane_max[0]);
    v += W;
  }
  const V both = max_keeping_nan(lane_max[1], lane_max[0]);
  float zmax = z[0];
  for (int l = 0; l < W; ++l) zmax = both[l] > zmax ? both[l] : zmax;
  for (; v < n; ++v) zmax = z[v] > zmax ? z[v] : zmax;
  *zmax_out = zmax;
  return exp_shifted_lanes<W>(e, z, n, zmax);
}
#ifdef DDPLAB_AVX512_KERNELS
[[DDPLAB_AVX512_TARGET]] inline float exp_row_16(float* e, const float* z, int n, float* zmax_out) {
  return exp_row_lanes<16>(e, z, n, zmax_out);
}
#endif
template <>
inline float exp_row(float* e, const float* z, int n, float* zmax_out) {
#ifdef DDPLAB_AVX512_KERNELS
  if (float_lanes() == 16) return exp_row_16(e, z, n, zmax_out);
#endif
  return exp_row_lanes<8>(e, z, n, zmax_out);
}

}  // namespace ddplab::cpu
