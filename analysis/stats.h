// Order statistics the analysis shares: the median, and a spread that one outlying step cannot inflate.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace ddplab {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + mid));
}

// 1.4826 x the median absolute deviation: the standard deviation for normal samples, robust to a few slow steps.
inline double robust_spread(const std::vector<double>& v) {
  const double m = median(v);
  std::vector<double> deviation;
  deviation.reserve(v.size());
  for (double x : v) deviation.push_back(std::fabs(x - m));
  return 1.4826 * median(deviation);
}

}  // namespace ddplab
