// What the emulated kernels' tests share: bit patterns to compare results exactly, and seeded normal inputs.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace ddplab::emu_test {

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline uint16_t bits(__nv_bfloat16 x) {
  uint16_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// n draws of N(0, scale^2) from a generator seeded with `seed`: the same inputs on every run and host.
inline std::vector<float> normal_values(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace ddplab::emu_test
