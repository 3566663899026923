// One row's softmax, shared by the classifier's and the LM head's cross-entropy (ops.cpp, transformer_ops.cpp).
// Internal to kernels/cpu: its loops rely on the library's -fopenmp-simd.
#pragma once
#include <cmath>

#include "kernels/cpu/vector_math.h"

namespace ddplab::cpu {

// out[j] = exp(in[j] - shift) for j < n (out may be in); returns their sum. Float takes 8 lanes at a time with the
// vector exp_fast: a loop over the scalar one vectorises, but into blends that cost twice the time (vector_math.h).
template <typename T>
T exp_shifted(T* out, const T* in, int n, T shift) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) sum += (out[j] = exp_fast(in[j] - shift));
  return sum;
}
template <>
inline float exp_shifted(float* out, const float* in, int n, float shift) {
  Float8 acc = {};
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const Float8 e = exp_fast(vload(in + j) - shift);
    vstore(out + j, e);
    acc += e;
  }
  float sum = 0;
  for (int i = 0; i < 8; ++i) sum += acc[i];
  for (; j < n; ++j) sum += (out[j] = exp_fast(in[j] - shift));
  return sum;
}

// p = softmax(z) over one row of n (p may be z), with the row's max subtracted so exp never overflows. Returns
// log(sum exp(z - max)) and sets *zmax_out: a cross-entropy is then log_sum - (z[target] - zmax), finite even
// when p[target] underflows to 0.
template <typename T>
T softmax_row(T* p, const T* z, int n, T* zmax_out) {
  T zmax = z[0];
#pragma omp simd reduction(max : zmax)
  for (int v = 0; v < n; ++v) zmax = z[v] > zmax ? z[v] : zmax;
  const T sum = exp_shifted(p, z, n, zmax);
  const T inv = T(1) / sum;
#pragma omp simd
  for (int v = 0; v < n; ++v) p[v] *= inv;
  *zmax_out = zmax;
  return std::log(sum);
}

}  // namespace ddplab::cpu
