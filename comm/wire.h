// 16-bit wire formats for fp32 buffers: bf16 and IEEE fp16, round to nearest even, and the fused loops the ring
// runs on them. Conversion from 16 bits to fp32 is exact; fp32 to 16 bits rounds (fp16 overflows to inf beyond
// 65504 and flushes nothing: subnormals are kept).
//
// Bitwise determinism: every function is a pure elementwise map, so two ranks that convert the same fp32 bits get
// the same 16-bit word. The scalar and vector paths (x86 F16C when compiled with -mf16c, part of x86-64-v3) give
// identical results; tests/mpi/test_wire.cpp checks both against each other on all 2^16 words and edge cases.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ddplab::wire {

inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// bf16: the top 16 bits of an fp32, rounded to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t{h} << 16); }

// IEEE binary16, round to nearest even (software reference; the vector path uses F16C where available).
uint16_t f32_to_fp16_scalar(float x);
float fp16_to_f32_scalar(uint16_t h);

enum class Format { kBf16, kFp16 };

// dst[i] = to16(src[i])
void encode(Format f, uint16_t* dst, const float* src, size_t n);
// dst[i] = to32(src[i])
void decode(Format f, float* dst, const uint16_t* src, size_t n);
// acc[i] += to32(in[i]); out[i] = to16(acc[i])           (a reduce-scatter hop: fp32 sum, 16 bits onward)
void reduce_encode(Format f, float* acc, uint16_t* out, const uint16_t* in, size_t n);
// out[i] = to16(acc[i] + to32(in[i])); acc[i] = to32(out[i])   (the final hop: the owner keeps the rounded value)
void reduce_round(Format f, float* acc, uint16_t* out, const uint16_t* in, size_t n);

}  // namespace ddplab::wire
