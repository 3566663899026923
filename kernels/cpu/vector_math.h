// Elementary functions that the compiler can vectorise. libm's expf/tanhf are scalar calls (glibc only offers
// its vector versions under -ffast-math, which we do not want: it would also drop inf/NaN semantics that
// masks and checks rely on), and they made GELU and softmax cost more than the GEMMs around them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

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

// The same exp_fast on 8 floats at once, lane for lane the same operations (bit-identical results). Loops over
// the scalar version vectorise, but GCC turns its two clamps into blends of constant-folded copies of the whole
// computation (about a dozen extra instructions per 8 values); here each clamp is one compare and one blend.
typedef float Float8 __attribute__((vector_size(32)));
inline Float8 exp_fast(Float8 x) {
  typedef int32_t Int8 __attribute__((vector_size(32)));
  x = x < -87.3f ? Float8{} - 87.3f : x;
  x = x > 88.7f ? Float8{} + 88.7f : x;
  const Float8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  Float8 r = n * -0.693145751953125f + x;  // fused multiply-adds (GNU C++ contracts them), as std::fma above
  r = n * -1.428606765330187e-06f + r;
  Float8 p = Float8{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Int8 bits = (__builtin_convertvector(n, Int8) + 127) << 23;
  return p * reinterpret_cast<Float8>(bits);
}

// Double stays on libm: it is the precision of the finite-difference references, not of training.
inline double exp_fast(double x) { return std::exp(x); }

}  // namespace ddplab::cpu
