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

// exp(x) in float: x = n ln2 + r with |r| <= ln2/2 (Cody–Waite split of ln2), e^r by a degree-5 polynomial
// 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3) fitted for the least maximum relative error on that interval (1.05e-7,
// about 1 ulp: below the degree-6 Taylor polynomial's 1.6e-7, with one multiply-add fewer),
// 2^n built in the exponent bits.
constexpr float kExpC5 = 0.00831265f, kExpC4 = 0.04189006f, kExpC3 = 0.16667113f, kExpC2 = 0.49999232f;
// Inputs are clamped to [-87.3, 87.3], so the result and its reciprocal are always normal floats (e^87.3 = 8.1e37,
// e^-87.3 = 1.2e-38): exp of a very negative number is ~1e-38 instead of 0, which is harmless wherever it is added
// to something of order 1, and GELU's 1 / (1 + exp(-2u)) stays normal where a larger clamp made it denormal (every
// multiply by it then ran on the slow path: GELU's backward at a third of its speed on Zen 4, bench_cpu_ops).
constexpr float kExpFastMin = -87.3f, kExpFastMax = 87.3f;
inline float exp_fast(float x) {
  x = x < kExpFastMin ? kExpFastMin : x;
  x = x > kExpFastMax ? kExpFastMax : x;
  // Round to nearest by adding and subtracting 1.5 * 2^23: plain arithmetic, so it vectorises.
  const float rounded = x * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23 + n: n in the low mantissa bits
  const float n = rounded - 12582912.0f;
  float r = std::fma(n, -0.693145751953125f, x);  // ln2 high part: n * it is exact
  r = std::fma(n, -1.428606765330187e-06f, r);     // ln2 low part
  float p = kExpC5;
  p = std::fma(p, r, kExpC4);
  p = std::fma(p, r, kExpC3);
  p = std::fma(p, r, kExpC2);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // 2^n from the bits of the rounding sum, as the vector form does: no float-to-int conversion, which a NaN would
  // make undefined (the NaN stays in p).
  uint32_t bits;
  std::memcpy(&bits, &rounded, sizeof bits);
  bits = (bits << 23) + (127u << 23);  // the sum's exponent bits shift out
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Vectors of W lanes of T and their unaligned loads and stores. Simd<T> is one 256-bit vector, 8 floats or 4 doubles
// (one ymm register under -march=x86-64-v3); the float kernels with two widths also take 16 floats (one zmm register,
// AVX-512).
template <typename T, int W>
struct Lanes {
  typedef T V __attribute__((vector_size(sizeof(T) * W)));
  typedef T Unaligned __attribute__((vector_size(sizeof(T) * W), aligned(sizeof(T)), may_alias));
};
template <typename T>
struct Simd : Lanes<T, 32 / sizeof(T)> {
  static constexpr int W = 32 / static_cast<int>(sizeof(T));  // lanes of one vector
};
template <int W>
using FloatLanes = Lanes<float, W>;
typedef FloatLanes<8>::V Float8;
typedef FloatLanes<16>::V Float16;

template <int W, typename T>
inline typename Lanes<T, W>::V load_lanes(const T* p) {
  return *reinterpret_cast<const typename Lanes<T, W>::Unaligned*>(p);
}
template <int W, typename T>
inline void store_lanes(T* p, typename Lanes<T, W>::V v) {
  *reinterpret_cast<typename Lanes<T, W>::Unaligned*>(p) = v;
}
template <typename T>
inline typename Simd<T>::V vload(const T* p) {
  return load_lanes<Simd<T>::W>(p);
}
template <typename T>
inline void vstore(T* p, typename Simd<T>::V v) {
  store_lanes<Simd<T>::W>(p, v);
}

// Lane-wise max and min as one instruction each: max_keeping_nan(bound, x) is bound > x ? bound : x, so a NaN in x is
// kept and a NaN in bound is not (MAXPS and MINPS return their second operand when either is NaN). Written as ? : they
// cost a compare and a blend each.
#ifdef __AVX__
inline Float8 max_keeping_nan(Float8 bound, Float8 x) {
  return reinterpret_cast<Float8>(_mm256_max_ps(reinterpret_cast<__m256>(bound), reinterpret_cast<__m256>(x)));
}
inline Float8 min_keeping_nan(Float8 bound, Float8 x) {
  return reinterpret_cast<Float8>(_mm256_min_ps(reinterpret_cast<__m256>(bound), reinterpret_cast<__m256>(x)));
}
#else
inline Float8 max_keeping_nan(Float8 bound, Float8 x) { return bound > x ? bound : x; }
inline Float8 min_keeping_nan(Float8 bound, Float8 x) { return bound < x ? bound : x; }
#endif

// The 16-lane kernels are compiled for AVX-512 inside a build for x86-64-v3 and chosen at run time
// (float_lanes()). Each is a [[gnu::flatten]] function with this target that calls the width-generic template: flatten
// inlines the whole call tree into it, and with it the AVX-512 helpers below, which GCC would refuse to inline into
// a template instance of the build's own target. Only in an optimised GCC build: where nothing is inlined (-O0,
// -fno-inline) the helpers would be called across the two targets' vector ABIs, so there the kernels keep 8 lanes.
#if defined(__x86_64__) && defined(__AVX2__) && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__) && \
    !defined(__NO_INLINE__)
#define DDPLAB_AVX512_KERNELS 1
#define DDPLAB_AVX512_TARGET gnu::flatten, gnu::target("avx512f")
// (The masked forms with every lane selected: the unmasked ones pass GCC 12 an "undefined" source that its
// -Wmaybe-uninitialized reports.)
[[gnu::target("avx512f")]] inline Float16 max_keeping_nan(Float16 bound, Float16 x) {
  const __m512 b = reinterpret_cast<__m512>(bound), v = reinterpret_cast<__m512>(x);
  return reinterpret_cast<Float16>(_mm512_mask_max_ps(v, __mmask16(0xffff), b, v));
}
[[gnu::target("avx512f")]] inline Float16 min_keeping_nan(Float16 bound, Float16 x) {
  const __m512 b = reinterpret_cast<__m512>(bound), v = reinterpret_cast<__m512>(x);
  return reinterpret_cast<Float16>(_mm512_mask_min_ps(v, __mmask16(0xffff), b, v));
}
#endif

// The same exp_fast on a vector of floats, lane for lane the same values (bit-identical results at 8 lanes, at 16,
// and in the scalar tail). Loops over the scalar version vectorise, but GCC turns its two clamps into blends of
// constant-folded copies of the whole computation (about a dozen extra instructions per 8 values). Here each clamp is
// one max or min, and 2^n comes from the bits of the rounding sum (its low mantissa bits hold n) instead of a
// float-to-int conversion.
// exp_fast_nonpositive is the same for x <= 0 (or NaN) without the upper clamp, which such an x never meets: the
// softmax's exp(z - max z), one instruction fewer of about fourteen.
template <typename V, typename = decltype(max_keeping_nan(V{}, V{}))>
inline V exp_fast_nonpositive(V x) {
  typedef int32_t Bits __attribute__((vector_size(sizeof(V))));
  x = max_keeping_nan(V{} + kExpFastMin, x);
  const V rounded = x * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23 + n: n in the low mantissa bits
  const V n = rounded - 12582912.0f;
  V r = n * -0.693145751953125f + x;  // fused multiply-adds (GNU C++ contracts them), as std::fma above
  r = n * -1.428606765330187e-06f + r;
  V p = V{} + kExpC5;
  p = p * r + kExpC4;
  p = p * r + kExpC3;
  p = p * r + kExpC2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Bits bits = (reinterpret_cast<Bits>(rounded) << 23) + (127 << 23);  // the sum's exponent bits shift out
  return p * reinterpret_cast<V>(bits);
}
template <typename V, typename = decltype(max_keeping_nan(V{}, V{}))>
inline V exp_fast(V x) {
  return exp_fast_nonpositive(min_keeping_nan(V{} + kExpFastMax, x));
}

// Double stays on libm: it is the precision of the finite-difference references, not of training.
inline double exp_fast(double x) { return std::exp(x); }

}  // namespace ddplab::cpu
