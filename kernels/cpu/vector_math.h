// Elementary functions that the compiler can vectorise. libm's expf/tanhf are scalar calls (glibc only offers
// its vector versions under -ffast-math, which we do not want: it would also drop inf/NaN semantics that
// masks and checks rely on), and they made GELU and softmax cost more than the GEMMs around them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#ifdef __AVX__
#include <immintrin.h>
#endif

namespace ddplab::cpu {

// exp(x) in float: x = n ln2 + r with |r| <= ln2/2 (Cody–Waite split of ln2), e^r by its degree-6 Taylor
// polynomial (truncation error r^7/7! < 1.2e-7 relative, about 1 ulp), 2^n built in the exponent bits.
// Inputs are clamped to [-87.3, 88.7], so the result is always a normal float: exp of a very negative
// number is ~1e-38 instead of 0, which is harmless wherever it is added to something of order 1.
inline float exp_fast(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23: plain arithmetic, so it vectorises.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = std::fma(n, -0.693145751953125f, x);  // ln2 high part: n * it is exact
  r = std::fma(n, -1.428606765330187e-06f, r);     // ln2 low part
  float p = 1.0f / 720;
  p = std::fma(p, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// The same exp_fast on 8 floats at once, lane for lane the same values (bit-identical results). Loops over the
// scalar version vectorise, but GCC turns its two clamps into blends of constant-folded copies of the whole
// computation (about a dozen extra instructions per 8 values). Here each clamp is one max or min (argument order
// keeps a NaN: they return the second operand when either is NaN), and 2^n comes from the bits of the rounding sum
// (its low mantissa bits hold n) instead of a float-to-int conversion.
typedef float Float8 __attribute__((vector_size(32)));
inline Float8 exp_fast(Float8 x) {
  typedef int32_t Int8 __attribute__((vector_size(32)));
#ifdef __AVX__
  x = reinterpret_cast<Float8>(_mm256_max_ps(reinterpret_cast<__m256>(Float8{} - 87.3f), reinterpret_cast<__m256>(x)));
  x = reinterpret_cast<Float8>(_mm256_min_ps(reinterpret_cast<__m256>(Float8{} + 88.7f), reinterpret_cast<__m256>(x)));
#else
  x = x < -87.3f ? Float8{} - 87.3f : x;
  x = x > 88.7f ? Float8{} + 88.7f : x;
#endif
  const Float8 rounded = x * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23 + n: n in the low mantissa bits
  const Float8 n = rounded - 12582912.0f;
  Float8 r = n * -0.693145751953125f + x;  // fused multiply-adds (GNU C++ contracts them), as std::fma above
  r = n * -1.428606765330187e-06f + r;
  Float8 p = Float8{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Int8 bits = (reinterpret_cast<Int8>(rounded) << 23) + (127 << 23);  // the sum's exponent bits shift out
  return p * reinterpret_cast<Float8>(bits);
}

// 256-bit vectors of T (8 floats or 4 doubles) and their unaligned loads and stores: with -march=x86-64-v3 one
// vector is one ymm register.
template <typename T>
struct Simd {
  static constexpr int W = 32 / static_cast<int>(sizeof(T));  // lanes of one vector
  typedef T V __attribute__((vector_size(32)));
  typedef T VU __attribute__((vector_size(32), aligned(sizeof(T)), may_alias));  // unaligned access
};
template <typename T>
inline typename Simd<T>::V vload(const T* p) {
  return *reinterpret_cast<const typename Simd<T>::VU*>(p);
}
template <typename T>
inline void vstore(T* p, typename Simd<T>::V v) {
  *reinterpret_cast<typename Simd<T>::VU*>(p) = v;
}

// Double stays on libm: it is the precision of the finite-difference references, not of training.
inline double exp_fast(double x) { return std::exp(x); }

}  // namespace ddplab::cpu
