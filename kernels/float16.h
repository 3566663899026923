// 16-bit floating-point words, bf16 and IEEE fp16, as every 16-bit path here rounds them: the CPU ring's wire
// (comm/wire.h), the GPU's wire casts (kernels/cuda/wire_cast.h) and the bf16 copies of the weights
// (kernels/cuda/convert.h, the AdamW kernel's). Round to nearest even; NaN stays NaN; fp16 overflows to inf beyond
// 65504 and keeps subnormals. Conversion from 16 bits to fp32 is exact.
//
// Plain scalar code that nvcc also compiles for the device, so the CPU and the GPU round alike by construction.
// tests/mpi/test_wire.cpp checks it against x86's F16C on all 2^16 words and edge cases.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define DDPLAB_FLOAT16_HD __host__ __device__
#else
#define DDPLAB_FLOAT16_HD
#endif

namespace ddplab::float16 {

DDPLAB_FLOAT16_HD inline uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
DDPLAB_FLOAT16_HD inline float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// bf16: the top 16 bits of an fp32, rounded to nearest even; NaN stays a (quiet) NaN.
DDPLAB_FLOAT16_HD inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
DDPLAB_FLOAT16_HD inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t{h} << 16); }

// IEEE binary16, round to nearest even (software reference; the vector path uses F16C where available).
DDPLAB_FLOAT16_HD inline uint16_t f32_to_fp16_scalar(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN stays NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf (and inf)
  const uint32_t e = a >> 23;
  if (e < 113) {                                      // below 2^-14: an fp16 subnormal (in units of 2^-24) or zero
    if (e < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal: still right
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t r = a - (112u << 23);  // rebias the exponent from 127 to 15
  uint32_t q = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

DDPLAB_FLOAT16_HD inline float fp16_to_f32_scalar(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));  // NaN made quiet, as F16C
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

enum class Format { kBf16, kFp16 };

DDPLAB_FLOAT16_HD inline uint16_t from_f32(Format f, float x) {
  return f == Format::kBf16 ? f32_to_bf16(x) : f32_to_fp16_scalar(x);
}
DDPLAB_FLOAT16_HD inline float to_f32(Format f, uint16_t h) {
  return f == Format::kBf16 ? bf16_to_f32(h) : fp16_to_f32_scalar(h);
}

}  // namespace ddplab::float16
