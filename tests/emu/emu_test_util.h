// What the emulated kernels' tests share: bit patterns to compare results exactly, seeded normal inputs, and host
// memory aligned as cudaMalloc's.
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
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

// 256-byte aligned, as cudaMalloc's memory: a kernel's widest pack (32 bytes: 8 fp32 beside 8 bf16) compiles to
// aligned vector instructions on the host too, which fault on operator new's 16-byte alignment.
template <typename T>
struct CudaMallocAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{256};
  CudaMallocAligned() = default;
  template <typename U>
  CudaMallocAligned(const CudaMallocAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlignment); }
  bool operator==(const CudaMallocAligned&) const { return true; }
  bool operator!=(const CudaMallocAligned&) const { return false; }
};
template <typename T>
using DeviceLikeVector = std::vector<T, CudaMallocAligned<T>>;

}  // namespace ddplab::emu_test
