// Optimizer<T>: dispatch by kind, step counting, and agreement with the CPU update ops it wraps.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/optimizer.h"

namespace ddplab {
namespace {

TEST(Optimizer, UnknownKindThrowsWithExpectedMessage) {
  OptimizerConfig c;
  c.kind = "adam";
  try {
    Optimizer<float> opt(c, 4);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "unknown optimizer 'adam' (expected adamw or sgd)");
  }
}

TEST(Optimizer, AdamWMatchesOpOverSeveralSteps) {
  OptimizerConfig c;  // defaults: adamw, lr 1e-3, wd 0.01
  constexpr int n = 5;
  std::vector<double> p = {0.1, -0.2, 0.3, -0.4, 0.5}, ref = p, m(n, 0.0), v(n, 0.0);
  Optimizer<double> opt(c, n);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<double> g = {0.5 * t, -1.0, 0.25, 2.0 / t, -0.125 * t};
    opt.step(p.data(), g.data());
    cpu::adamw_update(ref.data(), g.data(), m.data(), v.data(), n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t);
    EXPECT_EQ(opt.steps_taken(), t);
  }
  EXPECT_EQ(p, ref);
}

TEST(Optimizer, SgdWithMomentumMatchesOp) {
  OptimizerConfig c;
  c.kind = "sgd";
  c.lr = 0.1f;
  c.momentum = 0.9f;
  c.weight_decay = 0.0f;
  std::vector<float> p = {1.0f, -1.0f}, ref = p, buf = {0.0f, 0.0f};
  Optimizer<float> opt(c, 2);
  for (int t = 1; t <= 3; ++t) {
    const std::vector<float> g = {0.5f * t, -0.25f};
    opt.step(p.data(), g.data());
    cpu::sgd_update(ref.data(), g.data(), buf.data(), 2, c.lr, c.momentum, c.weight_decay);
  }
  EXPECT_EQ(p, ref);
}

TEST(Optimizer, PlainSgdStep) {
  OptimizerConfig c;
  c.kind = "sgd";
  c.lr = 0.5f;
  c.weight_decay = 0.0f;
  std::vector<double> p = {1.0, 2.0};
  const std::vector<double> g = {0.5, -1.0};
  Optimizer<double> opt(c, 2);
  opt.step(p.data(), g.data());
  EXPECT_EQ(p, (std::vector<double>{0.75, 2.5}));
}

}  // namespace
}  // namespace ddplab
