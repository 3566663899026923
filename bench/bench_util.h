// Timing and input helpers shared by the kernel benchmarks.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "analysis/stats.h"
#include "kernels/cpu/rng.h"

namespace ddplab::bench {

// Median wall time of `repeats` calls after one untimed warm-up (page faults, BLAS buffers).
inline double median_ms(const std::function<void()>& fn, int repeats) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  return ddplab::median(std::move(t));
}

// y += x over the two buffers (x and y read, y written: 3 streams), median ms of `repeats`. Over buffers far larger
// than the last-level cache it measures the memory this core streams from: bench_cpu_ops' floor, and allreduce_perf
// --diag's rate before each size.
inline double add_stream_ms(std::vector<float>& y, const std::vector<float>& x, int repeats) {
  float* __restrict dst = y.data();
  const float* __restrict src = x.data();
  const size_t n = std::min(x.size(), y.size());
  return median_ms(
      [&] {
        for (size_t i = 0; i < n; ++i) dst[i] += src[i];
      },
      repeats);
}

inline std::vector<float> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * normal(seed, i));
  return v;
}

}  // namespace ddplab::bench
