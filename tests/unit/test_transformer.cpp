// The hand-written transformer: gradients against finite differences in double (both heads, padded and packed
// batches), padding with exactly zero effect, a padded or packed batch equal to its sequences run alone, the reverse
// flat layout and the gradient-ready hook (order, finality, row blocks), accumulation, init, presets, float/double,
// and overfitting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/rng.h"
#include "model/optimizer.h"
#include "model/transformer.h"
#include "tests/unit/ready_hook_check.h"

namespace ddplab {
namespace {

using Head = TransformerConfig::Head;

// Small, but every feature: two blocks, two heads, unequal sizes, positions, room for padding.
TransformerConfig TestConfig(Head head) {
  TransformerConfig c;
  c.vocab = 11;
  c.d_model = 8;
  c.heads = 2;
  c.layers = 2;
  c.mlp_hidden = 12;
  c.max_len = 7;
  c.num_classes = 3;
  c.learned_pos = true;
  c.head = head;
  return c;
}
constexpr int kB = 3, kS = 6;

struct Batch {
  std::vector<int32_t> tokens, lengths, targets;
  std::vector<int32_t> positions;  // packed batches only
  std::vector<std::vector<int>> sequences;  // packed: the lengths of each row's sequences
};

// Default lengths {6, 3, 1}: one full, one padded, one of a single token (no next-token target). Padded tokens
// are -1.
Batch MakeBatch(const TransformerConfig& c, uint64_t seed, int B = kB, int S = kS, std::vector<int32_t> lengths = {}) {
  Batch b;
  b.lengths = lengths.empty() ? std::vector<int32_t>{S, S / 2, 1} : std::move(lengths);
  b.tokens.assign(static_cast<size_t>(B) * S, -1);
  for (int i = 0; i < B; ++i) {
    for (int t = 0; t < b.lengths[i]; ++t)
      b.tokens[i * S + t] = static_cast<int32_t>(hash64(seed, i * S + t) % c.vocab);
    b.targets.push_back(static_cast<int32_t>(hash64(seed + 1, i) % c.num_classes));
  }
  return b;
}

// Packed rows of S = 6 for the LM: row 0 is full with sequences of 3, 1 (no target) and 2 tokens, row 1 holds 4 and
// 1 and one padded position. Padded tokens are -1, padded positions -5 (never read).
Batch MakePackedBatch(const TransformerConfig& c, uint64_t seed) {
  Batch b;
  b.sequences = {{3, 1, 2}, {4, 1}};
  b.tokens.assign(2 * kS, -1);
  b.positions.assign(2 * kS, -5);
  for (int row = 0; row < 2; ++row) {
    int t = 0;
    for (int len : b.sequences[row]) {
      for (int p = 0; p < len; ++p, ++t) {
        b.positions[row * kS + t] = p;
        b.tokens[row * kS + t] = static_cast<int32_t>(hash64(seed, row * kS + t) % c.vocab);
      }
    }
    b.lengths.push_back(t);
  }
  return b;
}

// Moves every parameter away from the init (LayerNorm weights off 1, biases off 0, larger weights) so that no
// gradient is trivially 0 or tiny and attention is far from uniform.
template <typename T>
void Perturb(Transformer<T>& m, uint64_t seed, double scale = 0.4) {
  for (int64_t i = 0; i < m.flat_size(); ++i) m.flat_params()[i] += static_cast<T>(scale * normal(seed, i));
}

template <typename T>
T Forward(Transformer<T>& m, const Batch& b, int B = kB, int S = kS) {
  if (!b.positions.empty()) B = static_cast<int>(b.lengths.size());
  return m.forward(b.tokens.data(), b.lengths.data(), b.targets.data(), B, S,
                   b.positions.empty() ? nullptr : b.positions.data());
}

template <typename T>
std::vector<T> Grads(Transformer<T>& m) {
  return std::vector<T>(m.flat_grads(), m.flat_grads() + m.flat_size());
}

void CheckFiniteDifferences(Head head, bool packed = false) {
  Transformer<double> model(TestConfig(head), 42);
  Perturb(model, 1);
  const Batch batch = packed ? MakePackedBatch(model.config(), 7) : MakeBatch(model.config(), 7);
  Forward(model, batch);
  model.zero_grad();
  model.backward();
  const std::vector<double> analytic = Grads(model);

  constexpr double eps = 1e-6;
  double* p = model.flat_params();
  int checked_nonzero = 0;
  for (const Parameter<double>& param : model.parameters()) {
    for (int64_t k = 0; k < param.numel; ++k) {
      const int64_t i = param.offset + k;
      const double saved = p[i];
      p[i] = saved + eps;
      const double up = Forward(model, batch);
      p[i] = saved - eps;
      const double down = Forward(model, batch);
      p[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double tol = 1e-9 + 1e-6 * std::max(std::abs(numeric), std::abs(analytic[i]));
      EXPECT_NEAR(analytic[i], numeric, tol) << param.name << "[" << k << "]";
      checked_nonzero += std::abs(numeric) > 1e-6;
    }
  }
  // Not vacuous: beyond wte rows of unused tokens and wpe rows past the longest sequence, gradients are nonzero.
  EXPECT_GT(checked_nonzero, model.flat_size() * 3 / 4);
}

TEST(Transformer, ClassifierGradientsMatchFiniteDifferences) { CheckFiniteDifferences(Head::kClassify); }
TEST(Transformer, CausalLmGradientsMatchFiniteDifferences) { CheckFiniteDifferences(Head::kCausalLM); }
TEST(Transformer, PackedCausalLmGradientsMatchFiniteDifferences) { CheckFiniteDifferences(Head::kCausalLM, true); }

// Padding has exactly zero effect: other tokens at padded positions give the same loss and gradients, bit for bit.
template <typename T>
void CheckPaddingIsInert(Head head) {
  Transformer<T> model(TestConfig(head), 5);
  Perturb(model, 2);
  Batch batch = MakeBatch(model.config(), 9);
  const T loss = Forward(model, batch);
  model.zero_grad();
  model.backward();
  const std::vector<T> grads = Grads(model);
  for (int b = 0; b < kB; ++b) {
    for (int t = batch.lengths[b]; t < kS; ++t) batch.tokens[b * kS + t] = static_cast<int32_t>(3 + b + 7 * t);
  }
  const T loss2 = Forward(model, batch);
  model.zero_grad();
  model.backward();
  EXPECT_EQ(std::memcmp(&loss, &loss2, sizeof(T)), 0) << loss << " vs " << loss2;
  EXPECT_EQ(std::memcmp(grads.data(), model.flat_grads(), sizeof(T) * grads.size()), 0);
}
TEST(Transformer, PaddingIsInertClassifierDouble) { CheckPaddingIsInert<double>(Head::kClassify); }
TEST(Transformer, PaddingIsInertClassifierFloat) { CheckPaddingIsInert<float>(Head::kClassify); }
TEST(Transformer, PaddingIsInertCausalLmDouble) { CheckPaddingIsInert<double>(Head::kCausalLM); }
TEST(Transformer, PaddingIsInertCausalLmFloat) { CheckPaddingIsInert<float>(Head::kCausalLM); }

// A padded batch computes what its sequences compute alone, unpadded: the loss is the mean of theirs (weighted by
// their target counts for the LM) and so is the gradient. This is what "padding contributes nothing" means.
void CheckPaddedBatchEqualsSequencesAlone(Head head) {
  Transformer<double> model(TestConfig(head), 8);
  Perturb(model, 3);
  const Batch batch = MakeBatch(model.config(), 11);
  const double loss = Forward(model, batch);
  const int64_t count = model.loss_count();
  model.zero_grad();
  model.backward();
  const std::vector<double> grads = Grads(model);

  double weighted_loss = 0;
  std::vector<double> weighted_grads(grads.size(), 0.0);
  for (int b = 0; b < kB; ++b) {
    const int L = batch.lengths[b];
    const double l = model.forward(&batch.tokens[b * kS], &L, &batch.targets[b], 1, L);
    const double w = static_cast<double>(model.loss_count()) / count;
    EXPECT_EQ(model.loss_count(), head == Head::kClassify ? 1 : L - 1);
    model.zero_grad();
    model.backward();
    weighted_loss += w * l;
    for (size_t i = 0; i < grads.size(); ++i) weighted_grads[i] += w * model.flat_grads()[i];
  }
  EXPECT_EQ(count, head == Head::kClassify ? kB : kS - 1 + kS / 2 - 1);
  EXPECT_NEAR(loss, weighted_loss, 1e-13);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_NEAR(grads[i], weighted_grads[i], 1e-13) << i;
}
TEST(Transformer, PaddedBatchEqualsSequencesAloneClassifier) { CheckPaddedBatchEqualsSequencesAlone(Head::kClassify); }
TEST(Transformer, PaddedBatchEqualsSequencesAloneCausalLm) { CheckPaddedBatchEqualsSequencesAlone(Head::kCausalLM); }

// Packing is exact: rows of several sequences compute the loss and gradients of those sequences run alone, each in a
// row of its own length (no mask, positions from 0), weighted by their target counts. No attention, position or
// target crosses a sequence boundary.
TEST(Transformer, PackedRowsEqualSequencesAlone) {
  Transformer<double> model(TestConfig(Head::kCausalLM), 9);
  Perturb(model, 4);
  const Batch batch = MakePackedBatch(model.config(), 12);
  const double loss = Forward(model, batch);
  const int64_t count = model.loss_count();
  EXPECT_EQ(count, (3 - 1) + (1 - 1) + (2 - 1) + (4 - 1) + (1 - 1));  // one fewer than tokens, per sequence
  model.zero_grad();
  model.backward();
  const std::vector<double> grads = Grads(model);

  double weighted_loss = 0;
  std::vector<double> weighted_grads(grads.size(), 0.0);
  for (int row = 0; row < 2; ++row) {
    int start = 0;
    for (int len : batch.sequences[row]) {
      const double l = model.forward(&batch.tokens[row * kS + start], nullptr, nullptr, 1, len);
      const double w = static_cast<double>(model.loss_count()) / count;
      model.zero_grad();
      model.backward();
      weighted_loss += w * l;
      for (size_t i = 0; i < grads.size(); ++i) weighted_grads[i] += w * model.flat_grads()[i];
      start += len;
    }
  }
  EXPECT_NEAR(loss, weighted_loss, 1e-13);
  double largest = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_NEAR(grads[i], weighted_grads[i], 1e-13) << i;
    largest = std::max(largest, std::abs(grads[i]));
  }
  EXPECT_GT(largest, 1e-3);
}

TEST(Transformer, ParametersInForwardOrderStoredInReverse) {
  const TransformerConfig c = TestConfig(Head::kClassify);
  Transformer<double> model(c, 1);
  const auto& params = model.parameters();
  std::vector<std::string> names = {"wte", "wpe"};
  for (int l = 0; l < c.layers; ++l) {
    for (const char* n : {"ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "ln2.weight",
                          "ln2.bias", "fc.weight", "fc.bias", "fcproj.weight", "fcproj.bias"}) {
      names.push_back("h." + std::to_string(l) + "." + n);
    }
  }
  for (const char* n : {"lnf.weight", "lnf.bias", "head.weight", "head.bias"}) names.push_back(n);
  ASSERT_EQ(params.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(params[i].name, names[i]);
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(params[1].shape, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(params[4].shape, (std::vector<int64_t>{24, 8}));   // qkv [3C, C]
  EXPECT_EQ(params[10].shape, (std::vector<int64_t>{12, 8}));  // fc [H, C]
  EXPECT_EQ(params[12].shape, (std::vector<int64_t>{8, 12}));  // fcproj [C, H]
  EXPECT_EQ(params.back().shape, (std::vector<int64_t>{3}));

  const int64_t C = 8, H = 12, block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + H * C + H + C * H + C;
  EXPECT_EQ(model.num_parameters(), 11 * C + 7 * C + 2 * block + 2 * C + 3 * C + 3);
  int64_t expected_offset = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    expected_offset = (expected_offset + kParameterAlignment - 1) / kParameterAlignment * kParameterAlignment;
    EXPECT_EQ(it->offset, expected_offset) << it->name;
    EXPECT_EQ(it->data, model.flat_params() + it->offset) << it->name;
    EXPECT_EQ(it->grad, model.flat_grads() + it->offset) << it->name;
    expected_offset += it->numel;
  }
  EXPECT_EQ(expected_offset, model.flat_size());

  TransformerConfig no_pos = c;
  no_pos.learned_pos = false;
  Transformer<double> without(no_pos, 1);
  EXPECT_EQ(without.parameters()[1].name, "h.0.ln1.weight");
  EXPECT_EQ(without.num_parameters(), model.num_parameters() - 7 * C);
}

// The LM head is wte (as GPT-2's): the parameters end with lnf, the classifier's head (classes x C + classes) fewer;
// gpt2-small's shapes then count GPT-2 124M's parameters. (The finite differences check wte's two shares.)
TEST(Transformer, CausalLmHeadIsTiedToWte) {
  const TransformerConfig c = TestConfig(Head::kCausalLM), classify = TestConfig(Head::kClassify);
  ASSERT_TRUE(c.tied_head());
  ASSERT_FALSE(classify.tied_head());
  Transformer<double> lm(c, 1), classifier(classify, 1);
  EXPECT_EQ(lm.parameters().back().name, "lnf.bias");
  EXPECT_EQ(lm.num_parameters(), classifier.num_parameters() - (3 * 8 + 3));
  // GPT-2 124M's count at the vocabulary padded to 50304, as llm.c reports it: the preset's own model (its buffers
  // only; nothing runs).
  const Transformer<float> gpt2(TransformerConfig::preset("gpt2-small"), 1);
  EXPECT_EQ(gpt2.num_parameters(), 124475904);
}

// The hook contract (ready_hook_check.h), and every piece carries gradient, except rows of tokens and positions
// the batch does not use.
void CheckReadyHook(Transformer<double>& model, const Batch& batch) {
  Forward(model, batch);
  const std::vector<double> norms = test::CheckReadyHookOrderAndFinality(model);
  for (size_t k = 0; k < norms.size(); ++k) {
    const std::string& name = model.parameters()[model.grad_pieces()[k].param].name;
    if (name != "wte" && name != "wpe") {
      EXPECT_GT(norms[k], 0.0) << "piece " << k;
    }
  }
}

TEST(Transformer, OnReadyOncePerParamInReverseOrderWithFinalGrad) {
  for (Head head : {Head::kClassify, Head::kCausalLM}) {
    Transformer<double> model(TestConfig(head), 3);
    Perturb(model, 4);
    const int n = static_cast<int>(model.parameters().size());
    ASSERT_EQ(static_cast<int>(model.grad_pieces().size()), n);
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(model.grad_pieces()[k].param, n - 1 - k);
      EXPECT_EQ(model.grad_pieces()[k].offset, model.parameters()[n - 1 - k].offset);
    }
    CheckReadyHook(model, MakeBatch(model.config(), 12));
  }
}

TEST(Transformer, RowBlockPiecesTileTheBufferAndGiveTheSameGradients) {
  const TransformerConfig c = TestConfig(Head::kCausalLM);
  const Batch batch = MakeBatch(c, 13);
  Transformer<double> whole(c, 3), sliced(c, 3);
  Perturb(whole, 5);
  Perturb(sliced, 5);
  sliced.set_grad_piece_elements(20);  // cuts every matrix (rows of 8 or 12) into blocks of 1 or 2 rows
  const auto& pieces = sliced.grad_pieces();
  EXPECT_GT(pieces.size(), 3 * whole.grad_pieces().size());
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
      EXPECT_EQ(g.offset - p.offset, g.first_row * p.shape[1]);
    }
    at = g.offset + g.numel;
  }
  EXPECT_EQ(at, sliced.flat_size());
  CheckReadyHook(sliced, batch);
  for (Transformer<double>* m : {&whole, &sliced}) {
    m->zero_grad();
    Forward(*m, batch);
    m->backward();
  }
  for (int64_t i = 0; i < whole.flat_size(); ++i) {
    EXPECT_NEAR(whole.flat_grads()[i], sliced.flat_grads()[i], 1e-14 * (1 + std::abs(whole.flat_grads()[i]))) << i;
  }
}

TEST(Transformer, BackwardAccumulatesAndZeroGradClears) {
  Transformer<double> model(TestConfig(Head::kCausalLM), 5);
  Perturb(model, 6);
  Forward(model, MakeBatch(model.config(), 14));
  model.zero_grad();
  model.backward();
  const std::vector<double> once = Grads(model);
  model.backward();  // again for the same forward: the saved exps and row sums were not overwritten
  for (int64_t i = 0; i < model.flat_size(); ++i) {
    EXPECT_NEAR(model.flat_grads()[i], 2 * once[i], 1e-14 * (1 + std::abs(once[i]))) << i;
  }
  model.backward(nullptr, -1.75);  // the gradient of -1.75 x the loss: back to 0.25 x once
  for (int64_t i = 0; i < model.flat_size(); ++i) {
    EXPECT_NEAR(model.flat_grads()[i], 0.25 * once[i], 1e-14 * (1 + std::abs(once[i]))) << i;
  }
  model.zero_grad();
  for (int64_t i = 0; i < model.flat_size(); ++i) ASSERT_EQ(model.flat_grads()[i], 0.0) << i;
}

// The count the CLI's memory check takes before any work is what a forward allocates, buffer for buffer.
TEST(Transformer, ActivationElementsCountWhatAForwardHolds) {
  for (const Head head : {Head::kClassify, Head::kCausalLM}) {
    Transformer<float> model(TestConfig(head), 5);
    Forward(model, MakeBatch(model.config(), 14));
    EXPECT_EQ(model.held_activation_elements(), Transformer<float>::activation_elements(model.config(), kB, kS))
        << to_string(head);
  }
}

TEST(Transformer, EmptyBatchAnnouncesEveryPieceAndAddsNothing) {
  Transformer<double> model(TestConfig(Head::kClassify), 5);
  model.set_grad_piece_elements(20);
  EXPECT_EQ(model.forward(nullptr, nullptr, nullptr, 0, 0), 0.0);
  EXPECT_EQ(model.loss_count(), 0);
  model.zero_grad();
  int calls = 0;
  model.backward([&](int k) { EXPECT_EQ(k, calls++); });
  EXPECT_EQ(calls, static_cast<int>(model.grad_pieces().size()));
  for (int64_t i = 0; i < model.flat_size(); ++i) ASSERT_EQ(model.flat_grads()[i], 0.0);
}

// discard_grad: a step's first backward overwrites whatever the buffer held, bit for bit the zero_grad + backward
// result, and every later backward of the step adds: 1, 2 and 3 micro-batches (different batches, unequal loss
// scales), whole and row-block pieces, both heads, float and double. The stale values are NaN, so an element that
// backward reads instead of overwriting, or never writes, shows. The alignment gaps are never written: they stay 0.
template <typename T>
void CheckDiscardGradEqualsZeroGrad(Head head) {
  const TransformerConfig c = TestConfig(head);
  for (int64_t piece_elements : {0, 20}) {
    for (int micro_batches : {1, 2, 3}) {
      Transformer<T> zeroed(c, 3), discarded(c, 3);
      for (Transformer<T>* m : {&zeroed, &discarded}) {
        Perturb(*m, 4);
        m->set_grad_piece_elements(piece_elements);
      }
      for (const Parameter<T>& p : discarded.parameters())
        std::fill(p.grad, p.grad + p.numel, std::numeric_limits<T>::quiet_NaN());
      zeroed.zero_grad();
      discarded.discard_grad();
      for (int k = 0; k < micro_batches; ++k) {
        const Batch batch = head == Head::kCausalLM && k == 1 ? MakePackedBatch(c, 30 + k) : MakeBatch(c, 30 + k);
        const T loss_scale = T(1 + 0.5 * k) / T(micro_batches);
        for (Transformer<T>* m : {&zeroed, &discarded}) {
          Forward(*m, batch);
          m->backward(nullptr, loss_scale);
        }
      }
      const std::vector<T> expect = Grads(zeroed), got = Grads(discarded);
      for (int64_t i = 0; i < zeroed.flat_size(); ++i) {
        // Bits, not values: a -0 where zero_grad's sum gives +0 would differ here.
        ASSERT_EQ(std::memcmp(&got[i], &expect[i], sizeof(T)), 0)
            << "element " << i << ": " << got[i] << " vs " << expect[i] << " (" << micro_batches
            << " micro-batches, pieces of " << piece_elements << ")";
      }
    }
  }
}
TEST(Transformer, DiscardGradEqualsZeroGradClassifierFloat) { CheckDiscardGradEqualsZeroGrad<float>(Head::kClassify); }
TEST(Transformer, DiscardGradEqualsZeroGradCausalLmFloat) { CheckDiscardGradEqualsZeroGrad<float>(Head::kCausalLM); }
TEST(Transformer, DiscardGradEqualsZeroGradClassifierDouble) {
  CheckDiscardGradEqualsZeroGrad<double>(Head::kClassify);
}
TEST(Transformer, DiscardGradEqualsZeroGradCausalLmDouble) { CheckDiscardGradEqualsZeroGrad<double>(Head::kCausalLM); }

// An empty micro-batch first (a rank whose share of the step starts empty): the discarded gradients become zeros,
// which the next micro-batch adds to.
TEST(Transformer, EmptyBatchAfterDiscardGradGivesZeros) {
  const TransformerConfig c = TestConfig(Head::kClassify);
  Transformer<float> model(c, 5);
  std::fill(model.flat_grads(), model.flat_grads() + model.flat_size(), 7.0f);
  model.discard_grad();
  model.forward(nullptr, nullptr, nullptr, 0, 0);
  model.backward();
  for (int64_t i = 0; i < model.flat_size(); ++i) ASSERT_EQ(model.flat_grads()[i], 0.0f) << i;
  Transformer<float> reference(c, 5);
  const Batch batch = MakeBatch(c, 40);
  for (Transformer<float>* m : {&model, &reference}) {
    Forward(*m, batch);
    m->backward();
  }
  EXPECT_EQ(Grads(model), Grads(reference));
}

TEST(Transformer, InitIsGpt2LikeAndDeterministicInSeed) {
  TransformerConfig c = TransformerConfig::preset("small");
  c.vocab = 512;  // keep the test light; the rest is the preset
  Transformer<float> a(c, 123), b(c, 123), other(c, 124);
  const int64_t n = a.flat_size();
  EXPECT_TRUE(std::equal(a.flat_params(), a.flat_params() + n, b.flat_params()));
  for (const auto& p : a.parameters()) {
    const bool ln_weight = p.name.find("ln") != std::string::npos && p.name.find("weight") != std::string::npos;
    const bool bias = p.name.find("bias") != std::string::npos;
    double sum = 0, sq = 0;
    int64_t differ = 0;
    for (int64_t k = 0; k < p.numel; ++k) {
      sum += p.data[k];
      sq += double(p.data[k]) * p.data[k];
      differ += p.data[k] != other.flat_params()[p.offset + k];
    }
    if (ln_weight || bias) {
      EXPECT_EQ(sum, ln_weight ? double(p.numel) : 0.0) << p.name;
      EXPECT_EQ(sq, ln_weight ? double(p.numel) : 0.0) << p.name;
      continue;
    }
    const bool residual = p.name.find("proj.weight") != std::string::npos;  // proj and fcproj
    const double want = residual ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02;
    const double std = std::sqrt(sq / p.numel - (sum / p.numel) * (sum / p.numel));
    EXPECT_NEAR(std, want, 0.05 * want) << p.name;
    EXPECT_NEAR(sum / p.numel, 0.0, 5 * want / std::sqrt(double(p.numel))) << p.name;
    EXPECT_EQ(differ, p.numel) << p.name;
  }
}

TEST(Transformer, PresetsAndFlops) {
  const TransformerConfig tiny = TransformerConfig::preset("tiny");
  EXPECT_EQ(tiny.vocab, 8192);
  EXPECT_EQ(tiny.d_model, 48);
  EXPECT_EQ(tiny.heads, 4);
  EXPECT_EQ(tiny.layers, 1);
  EXPECT_EQ(tiny.mlp_hidden, 96);
  EXPECT_EQ(tiny.num_classes, 16);
  EXPECT_EQ(tiny.max_len, 256);
  EXPECT_EQ(tiny.head, Head::kClassify);
  Transformer<float> model(tiny, 1);
  // wte + wpe + one block + lnf + head, counted by hand.
  EXPECT_EQ(model.flat_size(), 8192 * 48 + 256 * 48 +
                                        (96 + 48 * 144 + 144 + 48 * 48 + 48 + 96 + 48 * 96 + 96 + 96 * 48 + 48) + 96 +
                                        48 * 16 + 16);
  const double C = 48, H = 96;
  EXPECT_DOUBLE_EQ(model.flops_per_token(128), 2 * (4 * C * C + 2 * C * H) + 4 * 128 * C + 2 * C * 16 / 128);
  // The causal half only where the model is causal: the classifier's attention computes the whole square.
  EXPECT_DOUBLE_EQ(tiny.flops_per_token(128, TransformerConfig::AttentionCount::kCausalHalf),
                   model.flops_per_token(128));
  TransformerConfig lm = tiny;
  lm.head = TransformerConfig::Head::kCausalLM;
  EXPECT_DOUBLE_EQ(lm.flops_per_token(128), 2 * (4 * C * C + 2 * C * H) + 4 * 128 * C + 2 * C * 8192);
  EXPECT_DOUBLE_EQ(lm.flops_per_token(128, TransformerConfig::AttentionCount::kCausalHalf),
                   2 * (4 * C * C + 2 * C * H) + 2 * 128 * C + 2 * C * 8192);

  const TransformerConfig gpt2 = TransformerConfig::preset("gpt2-small");
  EXPECT_EQ(gpt2.vocab % 64, 0) << "padded for aligned logits rows";
  EXPECT_EQ(gpt2.layers, 12);
  EXPECT_EQ(gpt2.d_model, 768);
  EXPECT_EQ(gpt2.heads, 12);
  EXPECT_EQ(gpt2.mlp_hidden, 3072);
  EXPECT_EQ(gpt2.max_len, 1024);
  EXPECT_EQ(gpt2.head, Head::kCausalLM);
  EXPECT_TRUE(gpt2.causal());
  const TransformerConfig small = TransformerConfig::preset("small");
  EXPECT_EQ(small.d_model % small.heads, 0);
  try {
    TransformerConfig::preset("medium");
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown model preset 'medium' (expected tiny, small, gpt2-small)");
  }
}

TEST(Transformer, RejectsBadInputs) {
  Transformer<double> model(TestConfig(Head::kClassify), 1);
  EXPECT_THROW(model.backward(), std::logic_error);
  Batch batch = MakeBatch(model.config(), 15);
  EXPECT_THROW(Forward(model, batch, kB, 8), std::invalid_argument);  // S > max_len
  Batch bad = batch;
  bad.tokens[1] = 11;  // valid position, token == vocab
  EXPECT_THROW(Forward(model, bad), std::out_of_range);
  bad = batch;
  bad.lengths[1] = 0;
  EXPECT_THROW(Forward(model, bad), std::out_of_range);
  bad.lengths[1] = kS + 1;
  EXPECT_THROW(Forward(model, bad), std::out_of_range);
  bad = batch;
  bad.targets[2] = 3;
  EXPECT_THROW(Forward(model, bad), std::out_of_range);
  EXPECT_THROW(model.forward(batch.tokens.data(), batch.lengths.data(), nullptr, kB, kS), std::invalid_argument);
  EXPECT_THROW(model.backward(), std::logic_error);  // the failed forwards left no half state behind
  TransformerConfig broken = TestConfig(Head::kClassify);
  broken.heads = 3;  // 8 % 3 != 0
  EXPECT_THROW(Transformer<double>(broken, 1), std::invalid_argument);
  // Packed rows need the LM head, and positions that restart at 0 or count up by one.
  const Batch packed = MakePackedBatch(TestConfig(Head::kCausalLM), 16);
  EXPECT_THROW(model.forward(packed.tokens.data(), packed.lengths.data(), packed.targets.data(), 2, kS,
                             packed.positions.data()),
               std::invalid_argument);
  Transformer<double> packed_lm(TestConfig(Head::kCausalLM), 1);
  for (auto [at, value] : {std::pair{0, 1}, std::pair{2, 3}, std::pair{kS + 2, 1}}) {
    Batch bad_positions = packed;
    bad_positions.positions[at] = value;
    EXPECT_THROW(Forward(packed_lm, bad_positions), std::out_of_range) << at;
  }
  // Null lengths means full length, and the LM ignores targets.
  Transformer<double> lm(TestConfig(Head::kCausalLM), 1);
  std::vector<int32_t> full(kB * kS, 2);
  lm.forward(full.data(), nullptr, nullptr, kB, kS);
  EXPECT_EQ(lm.loss_count(), kB * (kS - 1));
}

TEST(Transformer, FloatGradientsAgreeWithDouble) {
  for (Head head : {Head::kClassify, Head::kCausalLM}) {
    const TransformerConfig c = TestConfig(head);
    Transformer<double> md(c, 77);
    Transformer<float> mf(c, 77);
    Perturb(md, 8, 0.2);
    for (int64_t i = 0; i < md.flat_size(); ++i) {
      mf.flat_params()[i] = static_cast<float>(md.flat_params()[i]);
      md.flat_params()[i] = mf.flat_params()[i];
    }
    const Batch batch = MakeBatch(c, 23);
    const double ld = Forward(md, batch);
    const float lf = Forward(mf, batch);
    EXPECT_NEAR(lf, ld, 1e-5 * (1 + std::abs(ld)));
    md.zero_grad();
    mf.zero_grad();
    md.backward();
    mf.backward();
    double scale = 0;
    for (int64_t i = 0; i < md.flat_size(); ++i) scale = std::max(scale, std::abs(md.flat_grads()[i]));
    // Measured ~5e-7 (LM head) and ~1e-7 (classify) of the largest gradient; the bound leaves room for other BLAS
    // kernel families and lane widths, and is still far below what a wrong term would add.
    for (int64_t i = 0; i < md.flat_size(); ++i) {
      EXPECT_NEAR(mf.flat_grads()[i], md.flat_grads()[i], 1e-5 * scale) << i;
    }
  }
}

float Overfit(Head head, int steps, float* initial) {
  TransformerConfig c;
  c.vocab = 32;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 1;
  c.mlp_hidden = 32;
  c.max_len = 12;
  c.num_classes = 4;
  c.head = head;
  constexpr int B = 8, S = 12;
  Transformer<float> model(c, 2024);
  std::vector<int32_t> lengths(B);
  for (int b = 0; b < B; ++b) lengths[b] = 4 + static_cast<int>(hash64(33, b) % (S - 3));  // 4..12
  const Batch batch = MakeBatch(c, 31, B, S, lengths);
  OptimizerConfig oc;
  oc.lr = 1e-2f;
  Optimizer<float> opt(oc, model.flat_size());
  *initial = Forward(model, batch, B, S);
  for (int step = 0; step < steps; ++step) {
    Forward(model, batch, B, S);
    model.zero_grad();
    model.backward();
    opt.step(model.flat_params(), model.flat_grads());
  }
  return Forward(model, batch, B, S);
}

TEST(Transformer, AdamWOverfitsTinyBatchClassifier) {
  float initial = 0;
  const float loss = Overfit(Head::kClassify, 200, &initial);
  EXPECT_NEAR(initial, std::log(4.0f), 0.2f);
  EXPECT_LT(loss, 0.02f) << "initial " << initial;
}

TEST(Transformer, AdamWOverfitsTinyBatchCausalLm) {
  float initial = 0;
  const float loss = Overfit(Head::kCausalLM, 300, &initial);
  EXPECT_NEAR(initial, std::log(32.0f), 0.2f);
  EXPECT_LT(loss, 0.1f * initial) << "initial " << initial;
}

}  // namespace
}  // namespace ddplab
