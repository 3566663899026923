// One row's softmax, shared by the classifier's and the LM head's cross-entropy (ops.cpp, transformer_ops.cpp).
// Internal to kernels/cpu: its loops rely on the library's -fopenmp-simd.
#pragma once
#include <cmath>

#include "kernels/cpu/vector_math.h"

namespace ddplab::cpu {

// p = softmax(z) over one row of n (p may be z), with the row's max subtracted so exp never overflows. Returns
// log(sum exp(z - max)) and sets *zmax_out: a cross-entropy is then log_sum - (z[target] - zmax), finite even
// when p[target] underflows to 0.
template <typename T>
T softmax_row(T* p, const T* z, int n, T* zmax_out) {
  T zmax = z[0];
#pragma omp simd reduction(max : zmax)
  for (int v = 0; v < n; ++v) zmax = z[v] > zmax ? z[v] : zmax;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int v = 0; v < n; ++v) sum += (p[v] = exp_fast(z[v] - zmax));
  const T inv = T(1) / sum;
#pragma omp simd
  for (int v = 0; v < n; ++v) p[v] *= inv;
  *zmax_out = zmax;
  return std::log(sum);
}

}  // namespace ddplab::cpu
