#include "comm/wire.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define DDPLAB_WIRE_F16C 1
#endif

namespace ddplab::wire {

uint16_t f32_to_fp16_scalar(float x) {
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

float fp16_to_f32_scalar(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

namespace {

#ifdef DDPLAB_WIRE_F16C
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif

// One loop per operation and format; the 16-bit conversions inline into each, so the compiler vectorises bf16
// (plain integer arithmetic) and F16C does fp16 eight at a time.
template <Format F>
inline uint16_t to16(float x) {
  if constexpr (F == Format::kBf16)
    return f32_to_bf16(x);
  else
    return f32_to_fp16_scalar(x);
}
template <Format F>
inline float to32(uint16_t h) {
  if constexpr (F == Format::kBf16)
    return bf16_to_f32(h);
  else
    return fp16_to_f32_scalar(h);
}

template <Format F>
void encode_t(uint16_t* dst, const float* src, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
#endif
  for (; i < n; ++i) dst[i] = to16<F>(src[i]);
}

template <Format F>
void decode_t(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = to32<F>(src[i]);
}

template <Format F>
void reduce_encode_t(float* acc, uint16_t* out, const uint16_t* in, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8) {
      const __m256 s = _mm256_add_ps(_mm256_loadu_ps(acc + i),
                                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
      _mm256_storeu_ps(acc + i, s);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(s, kRound));
    }
#endif
  for (; i < n; ++i) {
    acc[i] += to32<F>(in[i]);
    out[i] = to16<F>(acc[i]);
  }
}

template <Format F>
void reduce_round_t(float* acc, uint16_t* out, const uint16_t* in, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8) {
      const __m256 s = _mm256_add_ps(_mm256_loadu_ps(acc + i),
                                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
      const __m128i h = _mm256_cvtps_ph(s, kRound);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
      _mm256_storeu_ps(acc + i, _mm256_cvtph_ps(h));
    }
#endif
  for (; i < n; ++i) {
    out[i] = to16<F>(acc[i] + to32<F>(in[i]));
    acc[i] = to32<F>(out[i]);
  }
}

}  // namespace

void encode(Format f, uint16_t* dst, const float* src, size_t n) {
  f == Format::kBf16 ? encode_t<Format::kBf16>(dst, src, n) : encode_t<Format::kFp16>(dst, src, n);
}
void decode(Format f, float* dst, const uint16_t* src, size_t n) {
  f == Format::kBf16 ? decode_t<Format::kBf16>(dst, src, n) : decode_t<Format::kFp16>(dst, src, n);
}
void reduce_encode(Format f, float* acc, uint16_t* out, const uint16_t* in, size_t n) {
  f == Format::kBf16 ? reduce_encode_t<Format::kBf16>(acc, out, in, n)
                     : reduce_encode_t<Format::kFp16>(acc, out, in, n);
}
void reduce_round(Format f, float* acc, uint16_t* out, const uint16_t* in, size_t n) {
  f == Format::kBf16 ? reduce_round_t<Format::kBf16>(acc, out, in, n) : reduce_round_t<Format::kFp16>(acc, out, in, n);
}

}  // namespace ddplab::wire
