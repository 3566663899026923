// Counter-based deterministic random numbers (header-only).
//
// Every draw is a pure function of (seed, index): no state, so any rank, thread or shard can produce element i
// of a stream without generating 0..i-1, and results do not depend on the order or the split of the work.
// hash64 is element `index` of a splitmix64 sequence whose starting state is itself mixed from the seed, so
// nearby seeds (0, 1, 2, ...) give unrelated streams.
//
// normal(seed, i) reuses the bits of hash64(seed, i), so do not draw uniform01 and normal from the same
// (seed, index) and expect independence: give each purpose its own seed, e.g. via substream(seed, k).
#pragma once
#include <cmath>
#include <cstdint>

namespace ddplab {

// splitmix64 finaliser (Steele, Lea, Flood 2014): a bijection on 64 bits with full avalanche.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

// Element `index` of the splitmix64 stream for `seed`.
inline uint64_t hash64(uint64_t seed, uint64_t index) {
  const uint64_t start = mix64(seed ^ 0x6A09E667F3BCC909ULL);  // salt: seed 0 does not start at state 0
  return mix64(start + (index + 1) * kGoldenGamma);
}

// A seed for an independent sub-stream (e.g. one per tensor, per rank or per purpose).
inline uint64_t substream(uint64_t seed, uint64_t stream) { return hash64(seed ^ 0xBB67AE8584CAA73BULL, stream); }

// Uniform in [0, 1) with 53 random bits (every value a multiple of 2^-53).
inline double uniform01(uint64_t seed, uint64_t index) {
  return static_cast<double>(hash64(seed, index) >> 11) * 0x1.0p-53;
}

// Standard normal via Box–Muller (cosine branch).
inline double normal(uint64_t seed, uint64_t index) {
  const uint64_t h1 = hash64(seed, index);
  const uint64_t h2 = mix64(h1 ^ 0x3C6EF372FE94F82BULL);
  const double u1 = static_cast<double>((h1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log never sees 0
  const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace ddplab
