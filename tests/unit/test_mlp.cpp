// The hand-written MLP: gradients against finite differences in double, the reverse flat layout, the order and
// finality of the gradient-ready hook, accumulation, deterministic init, float/double agreement, and overfitting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/rng.h"
#include "model/mlp.h"
#include "model/optimizer.h"
#include "tests/unit/ready_hook_check.h"

namespace ddplab {
namespace {

// Small but with every feature: 3 hidden layers (so GELU backward runs between Linears) and unequal sizes.
MlpConfig SmallConfig() {
  MlpConfig c;
  c.input_dim = 7;
  c.hidden_dim = 5;
  c.num_hidden_layers = 3;
  c.num_classes = 4;
  return c;
}
constexpr int kBatch = 3;

struct Batch {
  std::vector<double> x;
  std::vector<int32_t> y;
};

Batch MakeBatch(const MlpConfig& c, int batch, uint64_t seed) {
  Batch b;
  b.x.resize(static_cast<size_t>(batch) * c.input_dim);
  for (size_t i = 0; i < b.x.size(); ++i) b.x[i] = normal(seed, i);
  for (int i = 0; i < batch; ++i) b.y.push_back(static_cast<int32_t>(hash64(seed + 1, i) % c.num_classes));
  return b;
}

TEST(Mlp, GradientsMatchFiniteDifferences) {
  Mlp<double> model(SmallConfig(), 42);
  const Batch batch = MakeBatch(model.config(), kBatch, 7);
  model.forward(batch.x.data(), batch.y.data(), kBatch);
  model.zero_grad();
  model.backward();
  const std::vector<double> analytic(model.flat_grads(), model.flat_grads() + model.flat_size());

  constexpr double eps = 1e-6;
  double* p = model.flat_params();
  int checked_nonzero = 0;
  for (const Parameter<double>& param : model.parameters()) {
    for (int64_t k = 0; k < param.numel; ++k) {
      const int64_t i = param.offset + k;
      const double saved = p[i];
      p[i] = saved + eps;
      const double up = model.forward(batch.x.data(), batch.y.data(), kBatch);
      p[i] = saved - eps;
      const double down = model.forward(batch.x.data(), batch.y.data(), kBatch);
      p[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double tol = 1e-9 + 1e-6 * std::max(std::abs(numeric), std::abs(analytic[i]));
      EXPECT_NEAR(analytic[i], numeric, tol) << param.name << "[" << k << "]";
      checked_nonzero += std::abs(numeric) > 1e-6;
    }
  }
  // Guard against a vacuous pass (e.g. a dead network where every gradient is 0).
  EXPECT_GT(checked_nonzero, model.flat_size() / 2);
}

// The count the up-front memory check uses, before any model is built, is the built model's.
TEST(Mlp, ParameterCountFromTheConfigIsTheModels) {
  for (const MlpConfig c : {MlpConfig{7, 5, 3, 4}, MlpConfig{6, 9, 0, 2}, MlpConfig{3, 8, 1, 10}})
    EXPECT_EQ(mlp_parameter_count(c), static_cast<double>(Mlp<float>(c, 1).num_parameters()))
        << c.input_dim << "-" << c.hidden_dim << "x" << c.num_hidden_layers << "-" << c.num_classes;
}

TEST(Mlp, ParametersInForwardOrderStoredInReverse) {
  const MlpConfig c = SmallConfig();
  Mlp<double> model(c, 1);
  const auto& params = model.parameters();
  ASSERT_EQ(params.size(), 8u);
  const int dims[] = {7, 5, 5, 5, 4};
  int64_t total = 0;
  for (int l = 0; l < 4; ++l) {
    const auto& w = params[2 * l];
    const auto& b = params[2 * l + 1];
    EXPECT_EQ(w.name, "fc" + std::to_string(l) + ".weight");
    EXPECT_EQ(b.name, "fc" + std::to_string(l) + ".bias");
    EXPECT_EQ(w.shape, (std::vector<int64_t>{dims[l + 1], dims[l]}));
    EXPECT_EQ(b.shape, (std::vector<int64_t>{dims[l + 1]}));
    EXPECT_EQ(w.numel, int64_t{dims[l + 1]} * dims[l]);
    EXPECT_EQ(b.numel, dims[l + 1]);
    total += w.numel + b.numel;
  }
  EXPECT_EQ(model.num_parameters(), total);
  EXPECT_EQ(total, 124);

  // Walking the parameters last to first: each at the next aligned offset after the previous one, no overlap, and
  // the buffer ends with the last.
  int64_t expected_offset = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    expected_offset = (expected_offset + kParameterAlignment - 1) / kParameterAlignment * kParameterAlignment;
    EXPECT_EQ(it->offset, expected_offset) << it->name;
    EXPECT_EQ(it->data, model.flat_params() + it->offset) << it->name;
    EXPECT_EQ(it->grad, model.flat_grads() + it->offset) << it->name;
    expected_offset += it->numel;
  }
  EXPECT_EQ(expected_offset, model.flat_size());
  EXPECT_EQ(params.back().offset, 0);
}

// The hook contract (ready_hook_check.h), and every piece of the MLP carries gradient.
void CheckReadyHook(Mlp<double>& model, const Batch& batch) {
  model.forward(batch.x.data(), batch.y.data(), kBatch);
  const std::vector<double> norms = test::CheckReadyHookOrderAndFinality(model);
  for (size_t k = 0; k < norms.size(); ++k) EXPECT_GT(norms[k], 0.0) << "piece " << k;
}

TEST(Mlp, OnReadyOncePerParamInReverseOrderWithFinalGrad) {
  Mlp<double> model(SmallConfig(), 3);
  const int n = static_cast<int>(model.parameters().size());
  ASSERT_EQ(static_cast<int>(model.grad_pieces().size()), n);  // default: one piece per parameter
  for (int k = 0; k < n; ++k) {
    const Parameter<double>& p = model.parameters()[n - 1 - k];
    EXPECT_EQ(model.grad_pieces()[k].param, n - 1 - k);
    EXPECT_EQ(model.grad_pieces()[k].offset, p.offset);
    EXPECT_EQ(model.grad_pieces()[k].numel, p.numel);
  }
  CheckReadyHook(model, MakeBatch(model.config(), kBatch, 11));
}

TEST(Mlp, RowBlockPiecesTileTheBufferAndGiveTheSameGradients) {
  const Batch batch = MakeBatch(SmallConfig(), kBatch, 11);
  Mlp<double> whole(SmallConfig(), 3), sliced(SmallConfig(), 3);
  sliced.set_grad_piece_elements(12);  // small enough to cut every weight into several row blocks
  const auto& pieces = sliced.grad_pieces();
  EXPECT_GT(pieces.size(), 2 * whole.grad_pieces().size());
  int64_t at = 0;
  for (const GradPiece& g : pieces) {
    // Ready order is ascending offset: pieces of one parameter are adjacent, the next parameter starts aligned.
    EXPECT_EQ(g.offset, g.first_row == 0 ? (at + kParameterAlignment - 1) / kParameterAlignment * kParameterAlignment
                                         : at);
    const auto& p = sliced.parameters()[g.param];
    EXPECT_GE(g.offset, p.offset);
    EXPECT_LE(g.offset + g.numel, p.offset + p.numel);
    if (p.shape.size() == 2) {
      EXPECT_EQ(g.numel % p.shape[1], 0) << "whole rows";
    }
    at = g.offset + g.numel;
  }
  EXPECT_EQ(at, sliced.flat_size());
  CheckReadyHook(sliced, batch);

  for (Mlp<double>* m : {&whole, &sliced}) {
    m->zero_grad();
    m->forward(batch.x.data(), batch.y.data(), kBatch);
    m->backward();
  }
  for (int64_t i = 0; i < whole.flat_size(); ++i)
    EXPECT_NEAR(whole.flat_grads()[i], sliced.flat_grads()[i], 1e-12) << i;
}

TEST(Mlp, BackwardAccumulatesAndZeroGradClears) {
  Mlp<double> model(SmallConfig(), 5);
  const Batch batch = MakeBatch(model.config(), kBatch, 13);
  model.forward(batch.x.data(), batch.y.data(), kBatch);
  model.zero_grad();
  model.backward();
  const std::vector<double> once(model.flat_grads(), model.flat_grads() + model.flat_size());
  model.backward();
  for (int64_t i = 0; i < model.flat_size(); ++i) {
    EXPECT_NEAR(model.flat_grads()[i], 2 * once[i], 1e-14 * (1 + std::abs(once[i]))) << i;
  }
  model.zero_grad();
  for (int64_t i = 0; i < model.flat_size(); ++i) ASSERT_EQ(model.flat_grads()[i], 0.0) << i;
}

// discard_grad: the next backward overwrites whatever the buffer held (bitwise the zero_grad result, gaps still 0),
// and only that one: the backward after it accumulates again. Row-block pieces write each row once too.
TEST(Mlp, BackwardAfterDiscardGradOverwritesOnce) {
  for (int64_t piece_elements : {0, 14}) {
    Mlp<float> model(SmallConfig(), 5);
    model.set_grad_piece_elements(piece_elements);
    const Batch batch = MakeBatch(model.config(), kBatch, 13);
    const std::vector<float> x(batch.x.begin(), batch.x.end());
    model.forward(x.data(), batch.y.data(), kBatch);
    model.zero_grad();
    model.backward();
    const std::vector<float> once(model.flat_grads(), model.flat_grads() + model.flat_size());
    model.backward();  // the buffer now holds twice the gradient: discard_grad must not add to it
    model.discard_grad();
    model.backward();
    for (int64_t i = 0; i < model.flat_size(); ++i) ASSERT_EQ(model.flat_grads()[i], once[i]) << i;
    model.backward();  // BLAS may fuse the += into its products: equal up to rounding
    for (int64_t i = 0; i < model.flat_size(); ++i)
      ASSERT_NEAR(model.flat_grads()[i], 2 * once[i], 1e-6 * (1 + std::abs(once[i]))) << i;
  }
}

TEST(Mlp, InitIsDeterministicInSeedAndWithinFanInBound) {
  const MlpConfig c = SmallConfig();
  Mlp<double> a(c, 123), b(c, 123), other(c, 124);
  const int64_t n = a.flat_size();
  EXPECT_TRUE(std::equal(a.flat_params(), a.flat_params() + n, b.flat_params()));
  int64_t differ = 0;  // every parameter, not the alignment gaps (zeros in every model)
  for (const Parameter<double>& p : a.parameters())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) differ += a.flat_params()[i] != other.flat_params()[i];
  EXPECT_EQ(differ, a.num_parameters());

  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias, with fan_in = the layer's input size.
  const auto& params = a.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter<double>& p = params[i];
    const double fan_in = static_cast<double>(params[i & ~size_t{1}].shape[1]);  // the layer's weight [out, in]
    const double bound = 1.0 / std::sqrt(fan_in);
    double lo = bound, hi = -bound;
    for (int64_t k = 0; k < p.numel; ++k) {
      lo = std::min(lo, p.data[k]);
      hi = std::max(hi, p.data[k]);
    }
    EXPECT_GE(lo, -bound) << p.name;
    EXPECT_LT(hi, bound) << p.name;
    if (p.numel >= 20) {
      EXPECT_GT(hi - lo, bound) << p.name;  // spread over the range, not a constant
    }
  }
}

TEST(Mlp, BatchLossIsMeanOfRowLossesAndBuffersShrinkSafely) {
  Mlp<double> model(SmallConfig(), 9);
  const Batch batch = MakeBatch(model.config(), kBatch, 17);
  const double full = model.forward(batch.x.data(), batch.y.data(), kBatch);
  double mean = 0;
  // Smaller batches after a larger one reuse the grown buffers.
  for (int r = 0; r < kBatch; ++r) mean += model.forward(&batch.x[r * model.config().input_dim], &batch.y[r], 1);
  EXPECT_NEAR(full, mean / kBatch, 1e-14);
  EXPECT_DOUBLE_EQ(model.forward(batch.x.data(), batch.y.data(), kBatch), full);
}

TEST(Mlp, RejectsBadTargetsAndBackwardBeforeForward) {
  Mlp<double> model(SmallConfig(), 1);
  EXPECT_THROW(model.backward(), std::logic_error);
  const Batch batch = MakeBatch(model.config(), kBatch, 19);
  std::vector<int32_t> bad = batch.y;
  bad[1] = model.config().num_classes;
  EXPECT_THROW(model.forward(batch.x.data(), bad.data(), kBatch), std::out_of_range);
  bad[1] = -1;
  EXPECT_THROW(model.forward(batch.x.data(), bad.data(), kBatch), std::out_of_range);
  MlpConfig broken = SmallConfig();
  broken.input_dim = 0;
  EXPECT_THROW(Mlp<double>(broken, 1), std::invalid_argument);
}

TEST(Mlp, GemmFlopsPerSample) {
  Mlp<float> model(SmallConfig(), 1);
  EXPECT_EQ(model.gemm_flops_per_sample(), 2 * (7 * 5 + 5 * 5 + 5 * 5 + 5 * 4));
  MlpConfig seed_lab;  // defaults: 1024 → 1024 → 1024 → 1000
  EXPECT_EQ(Mlp<float>(seed_lab, 1).gemm_flops_per_sample(), 2LL * (1024 * 1024 * 2 + 1024 * 1000));
}

TEST(Mlp, FloatGradientsAgreeWithDouble) {
  const MlpConfig c = SmallConfig();
  Mlp<double> md(c, 77);
  Mlp<float> mf(c, 77);
  // Same init in both: round the double params to float and copy the rounded values back.
  for (int64_t i = 0; i < md.flat_size(); ++i) {
    mf.flat_params()[i] = static_cast<float>(md.flat_params()[i]);
    md.flat_params()[i] = mf.flat_params()[i];
  }
  const Batch batch = MakeBatch(c, kBatch, 23);
  std::vector<float> xf(batch.x.size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = static_cast<float>(batch.x[i]);
  std::vector<double> xd(xf.begin(), xf.end());
  const double ld = md.forward(xd.data(), batch.y.data(), kBatch);
  const float lf = mf.forward(xf.data(), batch.y.data(), kBatch);
  EXPECT_NEAR(lf, ld, 1e-5 * (1 + std::abs(ld)));
  md.zero_grad();
  mf.zero_grad();
  md.backward();
  mf.backward();
  double scale = 0;
  for (int64_t i = 0; i < md.flat_size(); ++i) scale = std::max(scale, std::abs(md.flat_grads()[i]));
  for (int64_t i = 0; i < md.flat_size(); ++i) {
    EXPECT_NEAR(mf.flat_grads()[i], md.flat_grads()[i], 1e-5 * scale) << i;
  }
}

TEST(Mlp, AdamWOverfitsTinyBatchInFloat) {
  MlpConfig c;
  c.input_dim = 16;
  c.hidden_dim = 32;
  c.num_hidden_layers = 2;
  c.num_classes = 5;
  constexpr int batch = 8;
  Mlp<float> model(c, 2024);
  const Batch b = MakeBatch(c, batch, 31);
  const std::vector<float> x(b.x.begin(), b.x.end());
  OptimizerConfig oc;
  oc.lr = 1e-2f;
  Optimizer<float> opt(oc, model.flat_size());
  const float initial = model.forward(x.data(), b.y.data(), batch);
  float loss = initial;
  for (int step = 0; step < 300; ++step) {
    loss = model.forward(x.data(), b.y.data(), batch);
    model.zero_grad();
    model.backward();
    opt.step(model.flat_params(), model.flat_grads());
  }
  loss = model.forward(x.data(), b.y.data(), batch);
  EXPECT_EQ(opt.steps_taken(), 300);
  EXPECT_GT(initial, 1.0f);  // near log(5) at init
  EXPECT_LT(loss, 0.05f) << "initial " << initial;
}

}  // namespace
}  // namespace ddplab
