// Finite-difference gradient checks in double, shared by the op and model tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "kernels/cpu/rng.h"

namespace ddplab::fd {

constexpr double kEps = 1e-6;
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-9;  // for gradients near 0, where a relative bound means nothing

inline std::vector<double> RandomNormal(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * normal(seed, i);
  return v;
}

// Central differences of loss() w.r.t. every element of x (x is perturbed in place and restored).
inline std::vector<double> NumericGrad(std::vector<double>& x, const std::function<double()>& loss) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kEps;
    const double up = loss();
    x[i] = saved - kEps;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * kEps);
  }
  return g;
}

// Expects analytic ≈ numeric elementwise; returns how many gradients are clearly nonzero, so callers can rule out
// a vacuous pass.
inline int ExpectGradNear(const std::vector<double>& analytic, const std::vector<double>& numeric, const char* what) {
  EXPECT_EQ(analytic.size(), numeric.size());
  int nonzero = 0;
  for (size_t i = 0; i < analytic.size() && i < numeric.size(); ++i) {
    const double tol = kAtol + kRtol * std::max(std::abs(analytic[i]), std::abs(numeric[i]));
    EXPECT_NEAR(analytic[i], numeric[i], tol) << what << "[" << i << "]";
    nonzero += std::abs(numeric[i]) > 1e-6;
  }
  return nonzero;
}

// L = sum(out * w): with random w every output element contributes, and dL/dout = w.
inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace ddplab::fd
