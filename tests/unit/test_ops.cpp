// CPU reference ops: every backward against central finite differences in double, forwards against naive loops
// and hand-computed values, float against double, and the optimizer updates against their defining recurrences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/rng.h"
#include "kernels/grad_clip.h"
#include "tests/unit/fd_check.h"

namespace ddplab::cpu {
namespace {

using fd::Dot;
using fd::ExpectGradNear;
using fd::NumericGrad;
using fd::RandomNormal;

// Non-square, non-power-of-two sizes so a transposed or swapped dimension cannot pass by accident.
constexpr int kB = 5, kC = 7, kOC = 3;

TEST(MatmulForward, MatchesNaiveTripleLoop) {
  const auto inp = RandomNormal(kB * kC, 1), weight = RandomNormal(kOC * kC, 2);
  std::vector<double> out(kB * kOC, -99.0);  // overwritten, not accumulated
  matmul_forward(out.data(), inp.data(), weight.data(), kB, kC, kOC);
  for (int b = 0; b < kB; ++b) {
    for (int o = 0; o < kOC; ++o) {
      double ref = 0;
      for (int c = 0; c < kC; ++c) ref += inp[b * kC + c] * weight[o * kC + c];
      EXPECT_NEAR(out[b * kOC + o], ref, 1e-12) << "b=" << b << " o=" << o;
    }
  }
}

TEST(MatmulBackward, DinpMatchesFiniteDifferences) {
  auto inp = RandomNormal(kB * kC, 3);
  const auto weight = RandomNormal(kOC * kC, 4), w = RandomNormal(kB * kOC, 5);
  std::vector<double> out(kB * kOC), dinp(kB * kC, -99.0), dweight(kOC * kC, 0.0);
  const auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), kB, kC, kOC);
    return Dot(out, w);
  };
  matmul_backward(dinp.data(), dweight.data(), w.data(), inp.data(), weight.data(), kB, kC, kOC);
  ExpectGradNear(dinp, NumericGrad(inp, loss), "dinp");
}

TEST(MatmulBackward, DweightMatchesFiniteDifferencesAndAccumulates) {
  const auto inp = RandomNormal(kB * kC, 6), w = RandomNormal(kB * kOC, 8);
  auto weight = RandomNormal(kOC * kC, 7);
  std::vector<double> out(kB * kOC), dinp(kB * kC), dweight(kOC * kC, 0.0);
  const auto loss = [&] {
    matmul_forward(out.data(), inp.data(), weight.data(), kB, kC, kOC);
    return Dot(out, w);
  };
  matmul_backward(dinp.data(), dweight.data(), w.data(), inp.data(), weight.data(), kB, kC, kOC);
  const auto numeric = NumericGrad(weight, loss);
  ExpectGradNear(dweight, numeric, "dweight");

  // A second backward adds on top (+=) instead of overwriting; null dinp skips only the input gradient.
  const std::vector<double> first = dweight;
  matmul_backward<double>(nullptr, dweight.data(), w.data(), inp.data(), weight.data(), kB, kC, kOC);
  for (size_t i = 0; i < dweight.size(); ++i) EXPECT_NEAR(dweight[i], 2 * first[i], 1e-12) << i;
  // accumulate = false overwrites what was there, rows [1, kOC) only here.
  std::vector<double> rows = dweight;
  matmul_backward_weight<double>(rows.data(), w.data(), inp.data(), kB, kC, kOC, 1, kOC, /*accumulate=*/false);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_NEAR(rows[i], i < size_t(kC) ? 2 * first[i] : first[i], 1e-12) << i;
  // An empty batch overwrites with the empty sum, zeros (a NaN left there would stay), and adds nothing otherwise.
  std::vector<double> empty(kOC * kC, std::numeric_limits<double>::quiet_NaN());
  matmul_backward_weight<double>(empty.data(), w.data(), inp.data(), 0, kC, kOC, 0, kOC, /*accumulate=*/false);
  EXPECT_EQ(empty, std::vector<double>(kOC * kC, 0.0));
  matmul_backward_weight<double>(rows.data(), w.data(), inp.data(), 0, kC, kOC, 0, kOC);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_NEAR(rows[i], i < size_t(kC) ? 2 * first[i] : first[i], 1e-12) << i;
}

TEST(BiasBackward, MatchesFiniteDifferencesAndAccumulates) {
  auto bias = RandomNormal(kOC, 9);
  const auto base = RandomNormal(kB * kOC, 10), w = RandomNormal(kB * kOC, 11);
  std::vector<double> out(kB * kOC);
  const auto loss = [&] {
    out = base;
    bias_forward(out.data(), bias.data(), kB, kOC);
    return Dot(out, w);
  };
  std::vector<double> dbias(kOC, 0.0);
  bias_backward(dbias.data(), w.data(), kB, kOC);
  ExpectGradNear(dbias, NumericGrad(bias, loss), "dbias");

  std::vector<double> acc(kOC, 0.5);
  bias_backward(acc.data(), w.data(), kB, kOC);
  for (int o = 0; o < kOC; ++o) EXPECT_NEAR(acc[o], 0.5 + dbias[o], 1e-12) << o;
  bias_backward(acc.data(), w.data(), kB, kOC, /*accumulate=*/false);
  EXPECT_EQ(acc, dbias);
}

TEST(BiasForward, AddsInPlaceOnEveryRow) {
  std::vector<double> out = {1, 2, 3, 4, 5, 6};
  const std::vector<double> bias = {10, 20, 30};
  bias_forward(out.data(), bias.data(), 2, 3);
  EXPECT_EQ(out, (std::vector<double>{11, 22, 33, 14, 25, 36}));
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  constexpr int n = 40;
  auto inp = RandomNormal(n, 12, 2.0);  // wide enough to cover both tails and the curved middle
  const auto w = RandomNormal(n, 13);
  std::vector<double> out(n), dinp(n, -99.0);
  const auto loss = [&] {
    gelu_forward(out.data(), inp.data(), n);
    return Dot(out, w);
  };
  gelu_backward(dinp.data(), inp.data(), w.data(), n);
  ExpectGradNear(dinp, NumericGrad(inp, loss), "dinp");
}

TEST(Gelu, ForwardKnownValues) {
  const std::vector<double> x = {0.0, 1.0, -1.0, 10.0, -10.0};
  std::vector<double> y(x.size());
  gelu_forward(y.data(), x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0);
  // Reference: 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) evaluated independently.
  const double t1 = std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (1.0 + 0.044715));
  EXPECT_NEAR(y[1], 0.5 * (1 + t1), 1e-15);
  EXPECT_NEAR(y[1], 0.8411919906082768, 1e-12);  // the tanh approximation, not the erf GELU (0.841344746)
  EXPECT_NEAR(y[2], -0.5 * (1 - t1), 1e-15);
  EXPECT_NEAR(y[3], 10.0, 1e-12);
  EXPECT_NEAR(y[4], 0.0, 1e-12);
}

// The float kernels with two widths (GELU, the softmax; vector_math.h). Inputs over GELU's and exp's whole range:
// both tails, the clamps, zeros, inf and NaN.
std::vector<float> WideRangeFloats(int n) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1e-30f,
                          -1e-30f,
                          30.0f,
                          -30.0f,
                          88.8f,
                          -87.4f,
                          1e30f,
                          -1e30f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; static_cast<int>(x.size()) < n; ++i) x.push_back(static_cast<float>(6.0 * normal(70, i)));
  return x;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

// Sets the kernels' width for one scope.
class FloatLanesForScope {
 public:
  explicit FloatLanesForScope(int lanes) : before_(float_lanes()) { set_float_lanes(lanes); }
  ~FloatLanesForScope() { set_float_lanes(before_); }

 private:
  int before_;
};

std::vector<int> LanesThisCpuRuns() {
  return sixteen_lanes_available() ? std::vector<int>{8, 16} : std::vector<int>{8};
}

// Far out in either tail gelu is x or 0 and gelu' 1 or 0: the float kernels say so at every width, where exp's clamp
// once let x and x^3 grow the value to -1e-3 at x = -1e35 and the derivative to -inf and NaN.
TEST(Gelu, TheFloatGeluIsXOrZeroAndItsDerivativeOneOrZeroFarOutInTheTails) {
  const float big[] = {
      12.0f, 1e6f, 1e12f, 1e13f, 1e20f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()};
  std::vector<float> x;
  for (int copy = 0; copy < 3; ++copy)  // 42 values: the vector body at 8 and 16 lanes, and a tail
    for (float b : big) x.push_back(b), x.push_back(-b);
  const int n = static_cast<int>(x.size());
  const std::vector<float> ones(n, 1.0f);
  for (int lanes : LanesThisCpuRuns()) {
    FloatLanesForScope width(lanes);
    std::vector<float> y(n), dx(n);
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), ones.data(), n);
    for (int i = 0; i < n; ++i) {
      if (x[i] > 0) {
        EXPECT_EQ(y[i], x[i]) << lanes << " lanes, x=" << x[i];
        EXPECT_EQ(dx[i], 1.0f) << lanes << " lanes, x=" << x[i];
      } else {
        EXPECT_LE(std::fabs(y[i]), 1e-30f) << lanes << " lanes, x=" << x[i];
        EXPECT_LE(std::fabs(dx[i]), 1e-30f) << lanes << " lanes, x=" << x[i];
      }
    }
  }
}

// The vector body gives each element the bits the scalar tail gives it (a call with n = 1 is all tail).
TEST(FloatLanes, GeluIsTheScalarGeluLaneForLane) {
  const int n = 4013;  // a tail at either width
  const std::vector<float> x = WideRangeFloats(n);
  const std::vector<double> dout = fd::RandomNormal(n, 71);
  const std::vector<float> w(dout.begin(), dout.end());
  for (int lanes : LanesThisCpuRuns()) {
    FloatLanesForScope width(lanes);
    std::vector<float> y(n), dx(n);
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), w.data(), n);
    for (int i = 0; i < n; ++i) {
      float y1, dx1;
      gelu_forward(&y1, &x[i], 1);
      gelu_backward(&dx1, &x[i], &w[i], 1);
      ASSERT_TRUE(SameBits(y[i], y1)) << lanes << " lanes, x=" << x[i] << ": " << y[i] << " vs " << y1;
      ASSERT_TRUE(SameBits(dx[i], dx1)) << lanes << " lanes, x=" << x[i] << ": " << dx[i] << " vs " << dx1;
    }
    EXPECT_TRUE(std::isnan(y[12]) && std::isnan(dx[12]));  // NaN in, NaN out
  }
}

// 16 lanes (AVX-512) give the bits of 8, so ranks on CPUs with and without AVX-512 keep identical replicas. Row
// lengths around both widths and their tails; logits of both signs, and rows with inf, -inf and NaN.
TEST(FloatLanes, SixteenLanesGiveTheBitsOfEight) {
  if (!sixteen_lanes_available()) {
    GTEST_SKIP() << "no 16-lane kernels here (this CPU has no AVX-512, or the build is not optimised): 8 lanes only";
  }
  const int n = 4013;
  const std::vector<float> x = WideRangeFloats(n);
  const std::vector<double> dout = fd::RandomNormal(n, 72);
  const std::vector<float> w(dout.begin(), dout.end());
  std::vector<float> y[2], dx[2];
  for (int k = 0; k < 2; ++k) {
    FloatLanesForScope width(k == 0 ? 8 : 16);
    y[k].resize(n);
    dx[k].resize(n);
    gelu_forward(y[k].data(), x.data(), n);
    gelu_backward(dx[k].data(), x.data(), w.data(), n);
  }
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(SameBits(y[0][i], y[1][i])) << "gelu_forward, x=" << x[i];
    ASSERT_TRUE(SameBits(dx[0][i], dx[1][i])) << "gelu_backward, x=" << x[i];
  }
  for (int V : {1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 1000}) {
    // Rows 0-2 with an inf, a -inf (exp gives 0) and a NaN; the other rows' logits spread little, so that many
    // terms of each sum are of the same size and the order of its additions shows in the last bits.
    const int B = 16;
    std::vector<float> logits(static_cast<size_t>(B) * V);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(1.5 * normal(73, static_cast<int>(i)));
    logits[V - 1] = std::numeric_limits<float>::infinity();
    if (V > 2) {
      logits[V + 1] = -std::numeric_limits<float>::infinity();
    }
    logits[static_cast<size_t>(2) * V + V / 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int32_t> targets(B);
    for (int b = 0; b < B; ++b) targets[b] = (b * 5) % V;
    std::vector<float> exps[2], sums[2], losses[2];
    float mean[2];
    for (int k = 0; k < 2; ++k) {
      FloatLanesForScope width(k == 0 ? 8 : 16);
      exps[k].resize(logits.size());
      sums[k].resize(B);
      losses[k].resize(B);
      mean[k] = softmax_cross_entropy_forward(exps[k].data(), sums[k].data(), losses[k].data(), logits.data(),
                                              targets.data(), B, V);
    }
    for (size_t i = 0; i < logits.size(); ++i) ASSERT_TRUE(SameBits(exps[0][i], exps[1][i])) << "V=" << V << " i=" << i;
    for (int b = 0; b < B; ++b) {
      ASSERT_TRUE(SameBits(sums[0][b], sums[1][b])) << "V=" << V << " row " << b;
      ASSERT_TRUE(SameBits(losses[0][b], losses[1][b])) << "V=" << V << " row " << b;
    }
    ASSERT_TRUE(SameBits(mean[0], mean[1])) << "V=" << V;
    EXPECT_TRUE(std::isfinite(losses[0][3])) << "V=" << V;  // the row with nothing special
  }
}

TEST(FloatLanes, RefusesAWidthThisCpuCannotRun) {
  EXPECT_THROW(set_float_lanes(4), std::invalid_argument);
  if (!sixteen_lanes_available()) {
    EXPECT_THROW(set_float_lanes(16), std::invalid_argument);
  }
  EXPECT_EQ(float_lanes(), sixteen_lanes_available() ? 16 : 8);  // the default: the widest this CPU runs
}

// The probabilities that softmax_cross_entropy_forward leaves unnormalised: exps[n, v] / row_sums[n].
template <typename T>
std::vector<T> Probabilities(const std::vector<T>& exps, const std::vector<T>& row_sums, int V) {
  std::vector<T> p(exps.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = exps[i] / row_sums[i / V];
  return p;
}

TEST(SoftmaxCrossEntropy, BackwardIsGradientOfMeanLoss) {
  constexpr int B = 4, V = 6;
  auto logits = RandomNormal(B * V, 14, 2.0);
  const std::vector<int32_t> targets = {0, 5, 2, 2};
  std::vector<double> exps(B * V), sums(B), losses(B), dlogits(B * V, -99.0);
  const auto loss = [&] {
    return softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), B, V);
  };
  loss();
  softmax_cross_entropy_backward(dlogits.data(), exps.data(), sums.data(), targets.data(), B, V);
  ExpectGradNear(dlogits, NumericGrad(logits, loss), "dlogits");

  // exps / sums form a distribution per row; the mean loss is the mean of the per-row losses.
  loss();
  const std::vector<double> probs = Probabilities(exps, sums, V);
  double mean = 0;
  for (int b = 0; b < B; ++b) {
    double row = 0;
    for (int v = 0; v < V; ++v) {
      EXPECT_GT(probs[b * V + v], 0.0);
      row += probs[b * V + v];
    }
    EXPECT_NEAR(row, 1.0, 1e-14) << "row " << b;
    EXPECT_NEAR(losses[b], -std::log(probs[b * V + targets[b]]), 1e-12) << "row " << b;
    mean += losses[b] / B;
  }
  EXPECT_NEAR(loss(), mean, 1e-14);
}

TEST(SoftmaxCrossEntropy, HandCheckableTinyCase) {
  // Row 0: logits log(1..4) give probs exactly 0.1, 0.2, 0.3, 0.4. Row 1: equal logits give 1/4 each.
  const std::vector<double> logits = {0.0, std::log(2.0), std::log(3.0), std::log(4.0), 5.0, 5.0, 5.0, 5.0};
  const std::vector<int32_t> targets = {3, 1};
  std::vector<double> exps(8), sums(2), losses(2);
  const double mean =
      softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), 2, 4);
  // Unnormalised: exp(z - max z) and each row's sum.
  const double expected_e[8] = {0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(exps[i], expected_e[i], 1e-15) << i;
  EXPECT_NEAR(sums[0], 2.5, 1e-15);
  EXPECT_NEAR(sums[1], 4.0, 1e-15);
  const std::vector<double> probs = Probabilities(exps, sums, 4);
  const double expected_p[8] = {0.1, 0.2, 0.3, 0.4, 0.25, 0.25, 0.25, 0.25};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(probs[i], expected_p[i], 1e-15) << i;
  EXPECT_NEAR(losses[0], -std::log(0.4), 1e-15);
  EXPECT_NEAR(losses[1], std::log(4.0), 1e-15);
  EXPECT_NEAR(mean, 0.5 * (std::log(4.0) - std::log(0.4)), 1e-15);

  std::vector<double> d(8);
  softmax_cross_entropy_backward(d.data(), exps.data(), sums.data(), targets.data(), 2, 4);
  const double expected_d[8] = {0.05, 0.1, 0.15, -0.3, 0.125, -0.375, 0.125, 0.125};  // (p - onehot) / 2
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(d[i], expected_d[i], 1e-15) << i;
}

template <typename T>
void CheckHugeLogitsStayFinite() {
  // exp(1e4) overflows both float and double unless the row max is subtracted first.
  const std::vector<T> logits = {T(1e4), T(-1e4), T(0), T(1e4), T(1e4), T(-1e4)};
  const std::vector<int32_t> targets = {1, 0};
  std::vector<T> exps(6), sums(2), losses(2), d(6);
  const T mean =
      softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), 2, 3);
  softmax_cross_entropy_backward(d.data(), exps.data(), sums.data(), targets.data(), 2, 3);
  const std::vector<T> probs = Probabilities(exps, sums, 3);
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isfinite(probs[i])) << i;
    EXPECT_TRUE(std::isfinite(d[i])) << i;
  }
  EXPECT_NEAR(losses[0], 2e4, 1e-3);  // -log softmax of the -1e4 entry against a +1e4 max
  EXPECT_NEAR(losses[1], std::log(2.0), 1e-6);
  EXPECT_TRUE(std::isfinite(mean));
  EXPECT_NEAR(probs[0], 1.0, 1e-6);
  EXPECT_NEAR(probs[3], 0.5, 1e-6);
}
TEST(SoftmaxCrossEntropy, HugeLogitsStayFiniteDouble) { CheckHugeLogitsStayFinite<double>(); }
TEST(SoftmaxCrossEntropy, HugeLogitsStayFiniteFloat) { CheckHugeLogitsStayFinite<float>(); }

std::vector<float> ToFloat(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// |f - d| within float rounding of the magnitudes involved.
void ExpectFloatAgrees(const std::vector<float>& f, const std::vector<double>& d, double rtol, const char* what) {
  ASSERT_EQ(f.size(), d.size());
  for (size_t i = 0; i < d.size(); ++i)
    EXPECT_NEAR(f[i], d[i], rtol * (1.0 + std::abs(d[i]))) << what << "[" << i << "]";
}

TEST(FloatVsDouble, ForwardOpsAgree) {
  constexpr int B = 8, C = 64, OC = 10;
  // Inputs are rounded to float first so only the arithmetic differs, not the data.
  auto round = [](std::vector<double> v) {
    for (double& x : v) x = static_cast<float>(x);
    return v;
  };
  const auto inp = round(RandomNormal(B * C, 20)), weight = round(RandomNormal(OC * C, 21, 0.125));
  const auto bias = round(RandomNormal(OC, 22));
  std::vector<double> out_d(B * OC), act_d(B * OC), exps_d(B * OC), sums_d(B), loss_d(B);
  std::vector<float> out_f(B * OC), act_f(B * OC), exps_f(B * OC), sums_f(B), loss_f(B);
  const auto inp_f = ToFloat(inp), weight_f = ToFloat(weight), bias_f = ToFloat(bias);
  std::vector<int32_t> targets(B);
  for (int b = 0; b < B; ++b) targets[b] = static_cast<int32_t>(hash64(23, b) % OC);

  matmul_forward(out_d.data(), inp.data(), weight.data(), B, C, OC);
  matmul_forward(out_f.data(), inp_f.data(), weight_f.data(), B, C, OC);
  ExpectFloatAgrees(out_f, out_d, 1e-5, "matmul");
  bias_forward(out_d.data(), bias.data(), B, OC);
  bias_forward(out_f.data(), bias_f.data(), B, OC);
  ExpectFloatAgrees(out_f, out_d, 1e-5, "bias");
  gelu_forward(act_d.data(), out_d.data(), B * OC);
  gelu_forward(act_f.data(), out_f.data(), B * OC);
  ExpectFloatAgrees(act_f, act_d, 1e-5, "gelu");
  const double mean_d =
      softmax_cross_entropy_forward(exps_d.data(), sums_d.data(), loss_d.data(), act_d.data(), targets.data(), B, OC);
  const float mean_f =
      softmax_cross_entropy_forward(exps_f.data(), sums_f.data(), loss_f.data(), act_f.data(), targets.data(), B, OC);
  ExpectFloatAgrees(exps_f, exps_d, 1e-5, "exps");
  ExpectFloatAgrees(sums_f, sums_d, 1e-5, "row sums");
  ExpectFloatAgrees(loss_f, loss_d, 1e-5, "losses");
  EXPECT_NEAR(mean_f, mean_d, 1e-5 * (1 + std::abs(mean_d)));
}

// The cross-entropy's float lanes (the vector max and exp passes and their tails) against double, at vocabulary sizes
// around the lane widths and at the MLP's 1000 classes, with logits of order 1 and around 1e4 (the shift by the
// row's max is what keeps them finite). Float inputs, so only the arithmetic differs: the shifted logit z rounds to
// float (|z| up to ~20 here: ~1e-6 relative in exp z), exp_fast adds ~1 ulp, a row's sum of V terms a few more.
TEST(FloatVsDouble, CrossEntropyAgreesAtEveryWidth) {
  constexpr int N = 3;
  for (int V : {1, 7, 8, 9, 15, 16, 17, 33, 1000}) {
    for (double offset : {0.0, 1e4}) {
      std::vector<double> logits = RandomNormal(N * V, 40 + V, 3.0);
      for (double& x : logits) x = static_cast<float>(x + offset);
      std::vector<int32_t> targets(N);
      for (int n = 0; n < N; ++n) targets[n] = static_cast<int32_t>(hash64(41, n) % V);
      std::vector<double> exps_d(N * V), sums_d(N), loss_d(N), dlogits_d(N * V);
      std::vector<float> exps_f(N * V), sums_f(N), loss_f(N), dlogits_f(N * V);
      const auto logits_f = ToFloat(logits);
      softmax_cross_entropy_forward(exps_d.data(), sums_d.data(), loss_d.data(), logits.data(), targets.data(), N, V);
      softmax_cross_entropy_forward(exps_f.data(), sums_f.data(), loss_f.data(), logits_f.data(), targets.data(), N,
                                    V);
      softmax_cross_entropy_backward(dlogits_d.data(), exps_d.data(), sums_d.data(), targets.data(), N, V);
      softmax_cross_entropy_backward(dlogits_f.data(), exps_f.data(), sums_f.data(), targets.data(), N, V);
      SCOPED_TRACE("V " + std::to_string(V) + ", logits around " + std::to_string(offset));
      for (int i = 0; i < N * V; ++i) EXPECT_NEAR(exps_f[i], exps_d[i], 2e-6 * exps_d[i]) << "exps[" << i << "]";
      for (int n = 0; n < N; ++n) {
        EXPECT_NEAR(sums_f[n], sums_d[n], 3e-6 * sums_d[n]) << "row sum " << n;
        EXPECT_NEAR(loss_f[n], loss_d[n], 4e-6 * (1 + loss_d[n])) << "loss " << n;
      }
      for (int i = 0; i < N * V; ++i) EXPECT_NEAR(dlogits_f[i], dlogits_d[i], 4e-6 / N) << "dlogits[" << i << "]";
    }
  }
}

TEST(AdamW, FirstStepMovesEachParamByLrTimesSignOfGrad) {
  // At t=1 from zero moments, m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps): about lr*sign(g)
  // whatever the magnitude of g.
  const std::vector<double> g = {1e-3, -2.0, 500.0, -0.25, 3e-2, -7e2};
  const std::vector<double> p0 = {0.5, -1.0, 2.0, 0.0, -3.0, 1.5};
  std::vector<double> p = p0, m(g.size(), 0.0), v(g.size(), 0.0);
  const float lr = 0.01f;
  adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(g.size()), lr, 0.9f, 0.999f, 1e-8f, 0.0f,
               1);
  for (size_t i = 0; i < g.size(); ++i) {
    const double sign = g[i] > 0 ? 1.0 : -1.0;
    EXPECT_NEAR(p[i] - p0[i], -double(lr) * sign, double(lr) * 1e-4) << i;
  }
}

TEST(AdamW, DecoupledWeightDecayShrinksParamsWithZeroGrad) {
  const std::vector<double> p0 = {1.0, -2.0, 0.5, 4.0};
  const std::vector<double> g(p0.size(), 0.0);
  std::vector<double> p = p0, m(p0.size(), 0.0), v(p0.size(), 0.0);
  const float lr = 0.1f, wd = 0.05f;
  adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<int64_t>(p.size()), lr, 0.9f, 0.999f, 1e-8f, wd, 1);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], p0[i] - double(lr) * double(wd) * p0[i], 1e-12) << i;
}

TEST(Sgd, MomentumMatchesHandUnrolledThreeSteps) {
  // PyTorch SGD: d = g + wd*p; buf = mu*buf + d (buf = d on step 1); p -= lr*buf. Written out by hand for n=2.
  const float lr_f = 0.1f, mu_f = 0.9f, wd_f = 0.01f;
  const double lr = lr_f, mu = mu_f, wd = wd_f;  // the op receives floats; compare against the same values
  const double g1[2] = {1.0, -0.5}, g2[2] = {0.25, 2.0}, g3[2] = {-1.5, 0.75};
  double expect[2];
  for (int i = 0; i < 2; ++i) {
    const double p0 = i == 0 ? 1.0 : -2.0;
    const double b1 = g1[i] + wd * p0;
    const double p1 = p0 - lr * b1;
    const double b2 = mu * b1 + (g2[i] + wd * p1);
    const double p2 = p1 - lr * b2;
    const double b3 = mu * b2 + (g3[i] + wd * p2);
    expect[i] = p2 - lr * b3;
  }
  std::vector<double> p = {1.0, -2.0}, buf = {0.0, 0.0};
  sgd_update(p.data(), g1, buf.data(), 2, lr_f, mu_f, wd_f);
  sgd_update(p.data(), g2, buf.data(), 2, lr_f, mu_f, wd_f);
  sgd_update(p.data(), g3, buf.data(), 2, lr_f, mu_f, wd_f);
  EXPECT_NEAR(p[0], expect[0], 1e-14);
  EXPECT_NEAR(p[1], expect[1], 1e-14);
}

TEST(Sgd, PlainStepWithoutMomentumIgnoresBuffer) {
  std::vector<double> p = {1.0, -2.0};
  const double g[2] = {0.5, 0.25};
  sgd_update<double>(p.data(), g, nullptr, 2, 0.5f, 0.0f, 0.0f);  // no momentum: the buffer is never touched
  EXPECT_DOUBLE_EQ(p[0], 0.75);
  EXPECT_DOUBLE_EQ(p[1], -2.125);
}

// Gradient clipping's factor, read in the update: a step on gradients g with factor s is the step on the gradients
// g * s. Bit for bit for AdamW (g * s is rounded before any other use); for SGD within an ulp, as the compiler may fuse
// g * s + wd * p into one FMA, which rounds once where the pre-scaled gradients were rounded first.
TEST(GradScale, TheUpdateReadsTheScaledGradients) {
  const std::vector<float> g = {0.5f, -3.0f, 1e-3f, 7.25f, -0.1f, 2.0f, 1e4f, -6e-5f, 0.3f};
  const int64_t n = static_cast<int64_t>(g.size());
  for (float s : {0.37f, 1.0f}) {
    std::vector<float> scaled(g);
    for (float& x : scaled) x *= s;
    std::vector<float> p(n, 0.25f), m(n, 0.0f), v(n, 0.0f), p2 = p, m2 = m, v2 = v;
    for (int t = 1; t <= 3; ++t) {
      adamw_update(p.data(), g.data(), m.data(), v.data(), n, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, t, s);
      adamw_update(p2.data(), scaled.data(), m2.data(), v2.data(), n, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, t);
    }
    EXPECT_EQ(p, p2) << "AdamW, scale " << s;
    EXPECT_EQ(v, v2) << "AdamW, scale " << s;
    std::vector<float> q(n, 0.25f), buf(n, 0.0f), q2 = q, buf2 = buf;
    for (int t = 1; t <= 3; ++t) {
      sgd_update(q.data(), g.data(), buf.data(), n, 0.1f, 0.9f, 0.01f, s);
      sgd_update(q2.data(), scaled.data(), buf2.data(), n, 0.1f, 0.9f, 0.01f);
    }
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(q[i], q2[i], 2e-7 * std::fabs(q2[i])) << "SGD, scale " << s << ", " << i;
  }
}

// PyTorch's clip_grad_norm_ factor: max_norm / (norm + 1e-6), at most 1.
TEST(ClipScale, IsPyTorchsFactor) {
  EXPECT_EQ(clip_scale(10.0, 1.0f), static_cast<float>(1.0 / (10.0 + 1e-6)));
  EXPECT_EQ(clip_scale(4.0, 2.0f), static_cast<float>(2.0 / (4.0 + 1e-6)));
  EXPECT_LT(clip_scale(1.0, 1.0f), 1.0f) << "a norm at the cap is scaled by 1 / (1 + 1e-6), as PyTorch does";
  EXPECT_EQ(clip_scale(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clip_scale(0.0, 1.0f), 1.0f);
  EXPECT_EQ(clip_scale(std::nan(""), 1.0f), 1.0f) << "a NaN norm (a step stopped before its update) scales nothing";
}

// sum_of_squares against a long double sum over counts around its 32 lanes, with terms that
// overflow a float when squared (it sums in double); exactly summable terms give the exact sum.
TEST(SumOfSquares, IsTheSumInDouble) {
  for (int64_t n : {0, 1, 31, 32, 33, 63, 64, 65, 1001}) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::sin(0.37 * i) * (i % 5 == 0 ? 1e25 : 1.0));
    long double want = 0;
    for (float v : x) want += static_cast<long double>(v) * v;
    EXPECT_NEAR(sum_of_squares(x.data(), n), static_cast<double>(want), 1e-15 * static_cast<double>(want)) << n;
    std::vector<float> exact(n);
    double exact_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      exact[i] = static_cast<float>(i % 17) - 8.0f;
      exact_sum += static_cast<double>(exact[i]) * exact[i];
    }
    EXPECT_EQ(sum_of_squares(exact.data(), n), exact_sum) << n;
  }
}

TEST(Scale, MultipliesInPlace) {
  std::vector<double> y = {1.0, -2.0, 4.0};
  scale(y.data(), 0.5, 3);
  EXPECT_EQ(y, (std::vector<double>{0.5, -1.0, 2.0}));
}

}  // namespace
// all_finite against std::isfinite: one non-finite value anywhere (vector body or tail, either sign) is found;
// the extremes of the finite range are not mistaken for it.
template <typename T>
void CheckAllFinite() {
  for (int n : {0, 1, 15, 16, 17, 100}) {
    std::vector<T> x(n);
    for (int i = 0; i < n; ++i) x[i] = static_cast<T>(i % 3 == 0 ? -1e-40 : i % 3 == 1 ? 3e38 : -3e38);
    EXPECT_TRUE(all_finite(x.data(), n)) << n;
    for (int at = 0; at < n; at += 7) {
      for (T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                    -std::numeric_limits<T>::infinity()}) {
        std::vector<T> y = x;
        y[at] = bad;
        EXPECT_FALSE(all_finite(y.data(), n)) << "n " << n << ", " << bad << " at " << at;
      }
    }
  }
}
TEST(AllFinite, FindsNanAndInfAnywhereFloat) { CheckAllFinite<float>(); }
TEST(AllFinite, FindsNanAndInfAnywhereDouble) { CheckAllFinite<double>(); }

// scale_and_check_finite against its definition, scale then check (std::isfinite, not all_finite, whose vector pass
// it shares): the same bits in y and the same answer, for lengths around the vector body (16 floats per iteration)
// and its tail, with NaN, +Inf and -Inf placed first, in the middle and last, and with finite values that the scale
// takes to Inf (overflow) or to zero and subnormals.
template <typename T>
void CheckScaleAndCheckFinite() {
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  for (int n : {0, 1, 7, 15, 16, 17, 31, 33, 100, 1001}) {
    const std::vector<double> normal = RandomNormal(n, 40 + n);
    const std::vector<T> x(normal.begin(), normal.end());
    std::vector<std::vector<T>> cases = {x};
    for (int at : {0, n / 2, n - 1}) {
      if (n == 0) break;
      for (T bad : {nan, inf, -inf}) {
        cases.push_back(x);
        cases.back()[at] = bad;
      }
      cases.push_back(x);
      cases.back()[at] = std::numeric_limits<T>::max() / 2;  // finite, but not after a scale by 3
    }
    for (T alpha : {T(0.25), T(3), T(1), T(-1e-30), std::numeric_limits<T>::min(), T(0)}) {
      for (const std::vector<T>& input : cases) {
        std::vector<T> expect = input, got = input;
        if (alpha != T(1)) scale(expect.data(), alpha, n);  // how the callers wrote it: no scale by 1
        const bool expect_finite = std::all_of(expect.begin(), expect.end(), [](T v) { return std::isfinite(v); });
        const bool got_finite = scale_and_check_finite(got.data(), alpha, n);
        EXPECT_EQ(got_finite, expect_finite) << "n " << n << " alpha " << alpha;
        ASSERT_EQ(std::memcmp(got.data(), expect.data(), n * sizeof(T)), 0) << "n " << n << " alpha " << alpha;
      }
    }
  }
}
TEST(ScaleAndCheckFinite, BitwiseScaleThenAllFiniteFloat) { CheckScaleAndCheckFinite<float>(); }
TEST(ScaleAndCheckFinite, BitwiseScaleThenAllFiniteDouble) { CheckScaleAndCheckFinite<double>(); }

}  // namespace ddplab::cpu
