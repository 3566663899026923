#include "comm/wire.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define DDPLAB_WIRE_F16C 1
#endif

namespace ddplab::wire {

using float16::Format;

namespace {

#ifdef DDPLAB_WIRE_F16C
constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif

// One loop per operation and format (F a constant, so float16's conversion inlines to its one branch): the compiler
// vectorises bf16 (plain integer arithmetic) and F16C does fp16 eight at a time.
template <Format F>
void encode_t(uint16_t* dst, const float* src, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound));
#endif
  for (; i < n; ++i) dst[i] = float16::from_f32(F, src[i]);
}

template <Format F>
void decode_t(float* dst, const uint16_t* src, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = float16::to_f32(F, src[i]);
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
    acc[i] += float16::to_f32(F, in[i]);
    out[i] = float16::from_f32(F, acc[i]);
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
    out[i] = float16::from_f32(F, acc[i] + float16::to_f32(F, in[i]));
    acc[i] = float16::to_f32(F, out[i]);
  }
}

template <Format F>
void add_encode_t(uint16_t* io, const float* own, size_t n) {
  size_t i = 0;
#ifdef DDPLAB_WIRE_F16C
  if constexpr (F == Format::kFp16)
    for (; i + 8 <= n; i += 8) {
      __m128i* words = reinterpret_cast<__m128i*>(io + i);
      const __m256 s = _mm256_add_ps(_mm256_loadu_ps(own + i), _mm256_cvtph_ps(_mm_loadu_si128(words)));
      _mm_storeu_si128(words, _mm256_cvtps_ph(s, kRound));
    }
#endif
  for (; i < n; ++i) io[i] = float16::from_f32(F, own[i] + float16::to_f32(F, io[i]));
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
void add_encode(Format f, uint16_t* io, const float* own, size_t n) {
  f == Format::kBf16 ? add_encode_t<Format::kBf16>(io, own, n) : add_encode_t<Format::kFp16>(io, own, n);
}

}  // namespace ddplab::wire
