// Optimizer<T>: dispatch by kind, step counting, and agreement with the CPU update ops it wraps.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/optimizer.h"

namespace ddplab {
namespace {

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

// The update against AdamW as PyTorch documents it (decoupled decay p *= 1 - lr wd, then the bias-corrected moments),
// written out here step by step in double: 20 steps, so a bias correction that ignored t, or a decay that was not
// decoupled, would show.
TEST(Optimizer, AdamWFollowsTheTextbookRecurrence) {
  OptimizerConfig c;
  c.lr = 0.01f;
  c.weight_decay = 0.1f;
  constexpr int n = 4;
  std::vector<double> p = {0.5, -1.5, 2.0, 0.0}, ref = p, m(n, 0.0), v(n, 0.0);
  Optimizer<double> opt(c, n);
  for (int t = 1; t <= 20; ++t) {
    std::vector<double> g(n);
    for (int i = 0; i < n; ++i) g[i] = std::sin(0.7 * t + i) * (i + 1);
    opt.step(p.data(), g.data());
    const double lr = c.lr, wd = c.weight_decay, b1 = c.beta1, b2 = c.beta2, eps = c.eps;
    for (int i = 0; i < n; ++i) {
      ref[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      ref[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    for (int i = 0; i < n; ++i) EXPECT_NEAR(p[i], ref[i], 1e-12 * (1 + std::fabs(ref[i]))) << "step " << t << ", " << i;
  }
}

// A step's gradient scale (gradient clipping's factor) holds for every update of that step, sliced or whole, and for
// that step only: the next begin_step() without one reads the gradients as they are.
TEST(Optimizer, AStepsGradScaleHoldsForThatStepOnly) {
  OptimizerConfig c;
  constexpr int n = 6;
  const std::vector<float> g = {0.5f, -1.0f, 0.25f, 2.0f, -0.125f, 3.0f};
  std::vector<float> p(n, 0.1f), ref = p, m(n, 0.0f), v(n, 0.0f);
  Optimizer<float> opt(c, n);
  opt.begin_step(0.25f);
  opt.update(p.data(), g.data(), 0, 2);
  opt.update(p.data(), g.data(), 2, n - 2);
  cpu::adamw_update(ref.data(), g.data(), m.data(), v.data(), n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, 1,
                    0.25f);
  EXPECT_EQ(p, ref);
  opt.begin_step();
  opt.update(p.data(), g.data(), 0, n);
  cpu::adamw_update(ref.data(), g.data(), m.data(), v.data(), n, c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, 2);
  EXPECT_EQ(p, ref);
}

// The schedule against llm.c's get_learning_rate written out here in double: the warm-up's ramp to --lr, then --lr
// (constant) or the cosine from --lr down towards --lr x --lr-final, never below it; a warm-up longer than the run.
TEST(LearningRate, FollowsTheWarmupThenTheSchedule) {
  OptimizerConfig c;
  c.lr = 6e-4f;
  c.lr_warmup = 10;
  c.lr_final = 0.1f;
  const int steps = 100;
  for (LrSchedule schedule : {LrSchedule::kConstant, LrSchedule::kCosine}) {
    c.lr_schedule = schedule;
    for (int step = 0; step < steps; ++step) {
      const double lr = c.lr, lr_min = lr * double(c.lr_final);
      double want = lr;
      if (step < c.lr_warmup)
        want = lr * (step + 1) / c.lr_warmup;
      else if (schedule == LrSchedule::kCosine)
        want = lr_min + (lr - lr_min) * 0.5 * (1 + std::cos(M_PI * (step - c.lr_warmup) / (steps - c.lr_warmup)));
      EXPECT_NEAR(learning_rate(c, step, steps), want, 1e-7 * want) << to_string(schedule) << ", step " << step;
    }
  }
  EXPECT_EQ(learning_rate(c, 9, steps), c.lr) << "the warm-up ends at --lr";
  EXPECT_EQ(learning_rate(c, 10, steps), c.lr) << "the decay starts from --lr";
  EXPECT_NEAR(learning_rate(c, 55, steps), 0.55 * c.lr, 1e-6 * c.lr) << "halfway down: the mean of lr and lr_min";
  EXPECT_GT(learning_rate(c, steps - 1, steps), c.lr * c.lr_final) << "the last step above lr_min, as llm.c's";
  EXPECT_EQ(learning_rate(c, 5 * steps, steps), c.lr * c.lr_final) << "past the last step: held at lr_min";
  c.lr_warmup = 2 * steps;
  EXPECT_NEAR(learning_rate(c, steps - 1, steps), c.lr / 2, 1e-7 * c.lr) << "a warm-up longer than the run";
  OptimizerConfig plain;
  for (int step : {0, 1, 49}) EXPECT_EQ(learning_rate(plain, step, 50), plain.lr) << "no schedule: --lr, exactly";
}

TEST(Optimizer, SgdWithMomentumMatchesOp) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
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

// --optimizer-in-backward updates bucket by bucket: slices of odd lengths at odd offsets (the vector loop's tails
// and heads), in a shuffled order, must give the bits of the whole-buffer step, for AdamW and SGD with momentum.
TEST(Optimizer, UpdateInSlicesEqualsTheWholeStepBitwise) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    OptimizerConfig c;
    c.kind = kind;
    c.momentum = 0.9f;
    constexpr int n = 1000;
    std::vector<float> whole(n), sliced(n), g(n);
    for (int i = 0; i < n; ++i) whole[i] = sliced[i] = 0.01f * static_cast<float>((i * 37) % 101 - 50);
    Optimizer<float> a(c, n), b(c, n);
    const std::vector<std::pair<int64_t, int64_t>> slices = {{613, 387}, {0, 1}, {100, 513}, {1, 99}};
    for (int t = 1; t <= 3; ++t) {
      for (int i = 0; i < n; ++i) g[i] = 0.001f * static_cast<float>((i * 53 + t * 7) % 97 - 48);
      a.step(whole.data(), g.data());
      b.begin_step();
      for (const auto& [offset, count] : slices) b.update(sliced.data(), g.data(), offset, count);
      ASSERT_EQ(whole, sliced) << to_string(kind) << " step " << t;
      EXPECT_EQ(a.first_moment(), b.first_moment()) << to_string(kind);
      EXPECT_EQ(a.second_moment(), b.second_moment()) << to_string(kind);
    }
  }
}

// The update that leaves the gradients zero (in blocks of its own) moves the parameters and moments bitwise as the
// plain update, zeroes exactly its slice's gradients, and leaves the rest as they were.
TEST(Optimizer, UpdateAndZeroGradsEqualsTheUpdateAndZeroesItsSliceOnly) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    OptimizerConfig c;
    c.kind = kind;
    c.momentum = 0.9f;
    constexpr int n = 20000;  // more than one of its blocks
    std::vector<float> plain(n), zeroing(n), g(n);
    for (int i = 0; i < n; ++i) plain[i] = zeroing[i] = 0.01f * static_cast<float>((i * 37) % 101 - 50);
    Optimizer<float> a(c, n), b(c, n);
    for (int t = 1; t <= 3; ++t) {
      for (int i = 0; i < n; ++i) g[i] = 0.001f * static_cast<float>((i * 53 + t * 7) % 97 - 47);
      std::vector<float> g_zeroed = g;
      a.step(plain.data(), g.data());
      b.begin_step();
      b.update_and_zero_grads(zeroing.data(), g_zeroed.data(), 0, 3);
      b.update_and_zero_grads(zeroing.data(), g_zeroed.data(), 3, n - 3);
      ASSERT_EQ(plain, zeroing) << to_string(kind) << " step " << t;
      EXPECT_EQ(a.first_moment(), b.first_moment()) << to_string(kind);
      EXPECT_EQ(a.second_moment(), b.second_moment()) << to_string(kind);
      EXPECT_EQ(g_zeroed, std::vector<float>(n, 0.0f)) << to_string(kind);
    }
    std::vector<float> g_part = g;
    b.begin_step();
    b.update_and_zero_grads(zeroing.data(), g_part.data(), 100, 9000);
    for (int i : {0, 99, 100, 9099, 9100, n - 1})
      EXPECT_EQ(g_part[i], i >= 100 && i < 9100 ? 0.0f : g[i]) << to_string(kind) << " element " << i;
  }
}

TEST(Optimizer, UpdateRefusesASliceOutsideTheBufferOrBeforeBeginStep) {
  std::vector<float> p(8), g(8);
  Optimizer<float> opt(OptimizerConfig{}, 8);
  EXPECT_THROW(opt.update(p.data(), g.data(), 0, 8), std::logic_error);  // no begin_step(): t would be 0
  opt.begin_step();
  EXPECT_THROW(opt.update(p.data(), g.data(), 4, 5), std::logic_error);
  EXPECT_THROW(opt.update(p.data(), g.data(), -1, 2), std::logic_error);
  EXPECT_NO_THROW(opt.update(p.data(), g.data(), 4, 4));
}

TEST(Optimizer, PlainSgdStep) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
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
