// Transformer ops: every backward against central finite differences in double, forwards against naive loops,
// masks (causal, key padding, packed sequences, ignored targets) exact, padding never read, float against double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/rng.h"
#include "kernels/cpu/transformer_ops.h"
#include "kernels/cpu/vector_math.h"
#include "tests/unit/fd_check.h"

namespace ddplab::cpu {
namespace {

using fd::Dot;
using fd::ExpectGradNear;
using fd::NumericGrad;
using fd::RandomNormal;

// Odd sizes; sequence 1 is padded, sequence 2 is empty, sequence 0 is full.
constexpr int kB = 3, kS = 5, kC = 6, kNH = 2, kV = 7;
const std::vector<int32_t> kLengths = {5, 3, 0};
// Packed rows over the same lengths: row 0 holds sequences of 2 and 3 tokens, row 1 one of 1 and one of 2.
const std::vector<int32_t> kPositions = {0, 1, 0, 1, 2, /**/ 0, 0, 1, -7, -7, /**/ -7, -7, -7, -7, -7};

// Whether positions t and j of row b belong to the same sequence (no sequence starts in (min, max]).
bool SameSequence(const int32_t* positions, int b, int t, int j) {
  for (int k = std::min(t, j) + 1; positions && k <= std::max(t, j); ++k) {
    if (positions[b * kS + k] == 0) return false;
  }
  return true;
}

TEST(Embedding, BackwardMatchesFiniteDifferencesAndPaddingIsNeverRead) {
  // Repeated tokens make the scatter-add accumulate; padded tokens are out of range and must not be read.
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 6, /**/ 4, 4, 2, -5, 1000000, /**/ 99, -1, 3, 3, 3};
  auto wte = RandomNormal(kV * kC, 1), wpe = RandomNormal(kS * kC, 2);
  const auto w = RandomNormal(kB * kS * kC, 3);
  std::vector<double> out(kB * kS * kC, -99.0);
  const auto loss = [&] {
    embedding_forward(out.data(), tokens.data(), kLengths.data(), wte.data(), wpe.data(), kB, kS, kC);
    return Dot(out, w);
  };
  loss();
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < kS; ++t) {
      for (int c = 0; c < kC; ++c) {
        const double got = out[(b * kS + t) * kC + c];
        const double want = t < kLengths[b] ? wte[tokens[b * kS + t] * kC + c] + wpe[t * kC + c] : 0.0;
        EXPECT_EQ(got, want) << b << "," << t << "," << c;
      }
    }
  }
  std::vector<double> dwte(kV * kC, 0.0), dwpe(kS * kC, 0.0);
  embedding_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), kLengths.data(), kB, kS, kC);
  EXPECT_GT(ExpectGradNear(dwte, NumericGrad(wte, loss), "dwte"), 3 * kC);
  EXPECT_GT(ExpectGradNear(dwpe, NumericGrad(wpe, loss), "dwpe"), 4 * kC);

  // Packed rows: wpe at each token's position within its own sequence.
  const auto packed_loss = [&] {
    embedding_forward(out.data(), tokens.data(), kLengths.data(), wte.data(), wpe.data(), kB, kS, kC,
                      kPositions.data());
    return Dot(out, w);
  };
  packed_loss();
  EXPECT_EQ(out[3 * kC + 1], wte[0 * kC + 1] + wpe[1 * kC + 1]);  // row 0, t 3: the second sequence's position 1
  std::vector<double> dwpe_packed(kS * kC, 0.0), dwte_packed(kV * kC, 0.0);
  embedding_backward(dwte_packed.data(), dwpe_packed.data(), w.data(), tokens.data(), kLengths.data(), kB, kS, kC,
                     kPositions.data());
  EXPECT_EQ(dwte_packed, dwte);
  EXPECT_GT(ExpectGradNear(dwpe_packed, NumericGrad(wpe, packed_loss), "dwpe packed"), 2 * kC);

  // Without wpe: a plain gather, and dwpe may be null.
  std::vector<double> out2(kB * kS * kC);
  embedding_forward<double>(out2.data(), tokens.data(), kLengths.data(), wte.data(), nullptr, kB, kS, kC);
  EXPECT_EQ(out2[kC + 2], wte[4 * kC + 2]);
  std::vector<double> dwte2(kV * kC, 0.0);
  embedding_backward<double>(dwte2.data(), nullptr, w.data(), tokens.data(), kLengths.data(), kB, kS, kC);
  EXPECT_EQ(dwte2, dwte);
}

TEST(LayerNorm, ForwardNormalisesAndBackwardMatchesFiniteDifferences) {
  constexpr int N = 4, C = 9;
  auto inp = RandomNormal(N * C, 4, 3.0), weight = RandomNormal(C, 5), bias = RandomNormal(C, 6);
  for (int c = 0; c < C; ++c) inp[c] += 100.0;  // a large common offset: the two-pass variance handles it
  const auto w = RandomNormal(N * C, 7);
  std::vector<double> out(N * C), mean(N), rstd(N);
  const auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return Dot(out, w);
  };
  loss();
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += inp[n * C + c] / C;
    for (int c = 0; c < C; ++c) v += (inp[n * C + c] - m) * (inp[n * C + c] - m) / C;
    EXPECT_NEAR(mean[n], m, 1e-12);
    EXPECT_NEAR(rstd[n], 1 / std::sqrt(v + 1e-5), 1e-12);
    for (int c = 0; c < C; ++c) {
      EXPECT_NEAR(out[n * C + c], (inp[n * C + c] - m) / std::sqrt(v + 1e-5) * weight[c] + bias[c], 1e-12);
    }
  }
  // dinp accumulates onto what is there (the residual stream's gradient); dweight, dbias accumulate as always.
  std::vector<double> dinp(N * C, 0.5), dweight(C, 0.0), dbias(C, 0.0);
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), mean.data(),
                     rstd.data(), N, C);
  for (double& d : dinp) d -= 0.5;
  ExpectGradNear(dinp, NumericGrad(inp, loss), "dinp");
  ExpectGradNear(dweight, NumericGrad(weight, loss), "dweight");
  ExpectGradNear(dbias, NumericGrad(bias, loss), "dbias");
}

// The softmax's 8-lane exp_fast is the scalar one lane for lane, bit for bit: over the clamps, around 0, and on
// inf and NaN (which must stay NaN: masks and the non-finite checks rely on it). Every other input gives a normal
// float whose reciprocal is normal too (GELU divides by 1 + exp), accurate up to the upper clamp.
TEST(ExpFast, EightLanesEqualTheScalarVersionBitForBit) {
  constexpr float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {0.0f,  -0.0f, 1e-30f,      -1e-30f, 87.2f, kExpFastMax, 87.4f, 88.3f, 88.38f,
                          88.7f, 88.8f, kExpFastMin, -87.4f,  1e30f, -1e30f,      kInf,  -kInf, kNaN};
  for (int i = 0; i < 4000; ++i) x.push_back(-100.0f + 0.05f * i + 1e-3f * static_cast<float>(normal(60, i)));
  while (x.size() % 8) x.push_back(0.5f);
  for (size_t i = 0; i < x.size(); i += 8) {
    Float8 v;
    std::memcpy(&v, &x[i], sizeof v);
    const Float8 e = exp_fast(v);
    for (int l = 0; l < 8; ++l) {
      const float scalar = exp_fast(x[i + l]);
      if (std::isnan(x[i + l])) {
        EXPECT_TRUE(std::isnan(e[l]) && std::isnan(scalar)) << x[i + l];
      } else {
        EXPECT_EQ(std::memcmp(&e[l], &scalar, sizeof scalar), 0) << x[i + l] << ": " << e[l] << " vs " << scalar;
        EXPECT_TRUE(std::isnormal(scalar) && scalar > 0) << "exp_fast(" << x[i + l] << ") = " << scalar;
        EXPECT_TRUE(std::isnormal(1.0f / (1.0f + scalar))) << "1 / (1 + exp_fast(" << x[i + l] << "))";
      }
      if (x[i + l] > -87.0f && x[i + l] <= kExpFastMax) {
        const double ref = std::exp(double(x[i + l]));
        EXPECT_NEAR(e[l], ref, 3e-7 * ref);
      }
    }
  }
}

// Naive attention straight from the definition, with std::exp and explicit masks.
std::vector<double> NaiveAttention(const std::vector<double>& qkv, const int32_t* lengths, bool causal,
                                   const int32_t* positions) {
  const int hs = kC / kNH;
  std::vector<double> out(kB * kS * kC, 0.0);
  for (int b = 0; b < kB; ++b) {
    const int L = lengths ? lengths[b] : kS;
    for (int h = 0; h < kNH; ++h) {
      for (int t = 0; t < L; ++t) {
        const double* q = &qkv[(b * kS + t) * 3 * kC + h * hs];
        std::vector<int> keys;
        std::vector<double> s;
        double zmax = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < L && (!causal || j <= t); ++j) {
          if (!SameSequence(positions, b, t, j)) continue;
          const double* k = &qkv[(b * kS + j) * 3 * kC + kC + h * hs];
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          keys.push_back(j);
          s.push_back(dot / std::sqrt(double(hs)));
          zmax = std::max(zmax, s.back());
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - zmax));
        for (size_t n = 0; n < s.size(); ++n) {
          const double* v = &qkv[(b * kS + keys[n]) * 3 * kC + 2 * kC + h * hs];
          for (int i = 0; i < hs; ++i) out[(b * kS + t) * kC + h * hs + i] += s[n] / sum * v[i];
        }
      }
    }
  }
  return out;
}

void CheckAttention(const int32_t* lengths, bool causal, uint64_t seed, const int32_t* positions = nullptr) {
  auto qkv = RandomNormal(kB * kS * 3 * kC, seed, 1.5);  // wide scores: the softmax is far from uniform
  const auto w = RandomNormal(kB * kS * kC, seed + 1);
  std::vector<double> out(kB * kS * kC, -99.0), att(kB * kNH * kS * kS, -99.0);
  const auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), lengths, kB, kS, kC, kNH, causal, positions);
    return Dot(out, w);
  };
  loss();
  const auto ref = NaiveAttention(qkv, lengths, causal, positions);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-12) << i;
  for (int b = 0; b < kB; ++b) {
    const int L = lengths ? lengths[b] : kS;
    for (int h = 0; h < kNH; ++h) {
      for (int t = 0; t < kS; ++t) {
        double row = 0;
        for (int j = 0; j < kS; ++j) {
          const double a = att[((b * kNH + h) * kS + t) * kS + j];
          const bool valid = t < L && j < L && (!causal || j <= t) && SameSequence(positions, b, t, j);
          if (!valid) {
            EXPECT_EQ(a, 0.0) << b << "," << h << "," << t << "," << j;
          }
          row += a;
        }
        EXPECT_NEAR(row, t < L ? 1.0 : 0.0, 1e-14);
      }
    }
  }
  std::vector<double> dqkv(qkv.size(), -99.0);
  attention_backward(dqkv.data(), w.data(), qkv.data(), att.data(), lengths, kB, kS, kC, kNH, causal, positions);
  const int nonzero = ExpectGradNear(dqkv, NumericGrad(qkv, loss), "dqkv");
  EXPECT_GT(nonzero, static_cast<int>(qkv.size()) / 3);
  for (int b = 0; b < kB; ++b) {
    const int L = lengths ? lengths[b] : kS;
    for (int i = L * 3 * kC; i < kS * 3 * kC; ++i) EXPECT_EQ(dqkv[b * kS * 3 * kC + i], 0.0) << "padded " << b;
  }
}

TEST(Attention, CausalWithPaddingMatchesNaiveAndFiniteDifferences) { CheckAttention(kLengths.data(), true, 10); }
TEST(Attention, BidirectionalWithPaddingMatchesNaiveAndFiniteDifferences) {
  CheckAttention(kLengths.data(), false, 20);
}
TEST(Attention, CausalWithoutLengthsMatchesNaiveAndFiniteDifferences) { CheckAttention(nullptr, true, 30); }
// Packed rows: a block-diagonal mask, each sequence attending only within itself.
TEST(Attention, CausalPackedMatchesNaiveAndFiniteDifferences) {
  CheckAttention(kLengths.data(), true, 33, kPositions.data());
}
TEST(Attention, BidirectionalPackedMatchesNaiveAndFiniteDifferences) {
  CheckAttention(kLengths.data(), false, 32, kPositions.data());
}

// The gradient arriving at padded query rows is ignored: any dout there gives the same dqkv, bit for bit.
TEST(Attention, PaddedQueryRowsPassNoGradient) {
  const auto qkv = RandomNormal(kB * kS * 3 * kC, 40);
  auto dout = RandomNormal(kB * kS * kC, 41);
  std::vector<double> out(kB * kS * kC), att(kB * kNH * kS * kS);
  std::vector<double> d1(qkv.size()), d2(qkv.size());
  attention_forward(out.data(), att.data(), qkv.data(), kLengths.data(), kB, kS, kC, kNH, true);
  attention_backward(d1.data(), dout.data(), qkv.data(), att.data(), kLengths.data(), kB, kS, kC, kNH, true);
  for (int b = 0; b < kB; ++b) {
    for (int i = kLengths[b] * kC; i < kS * kC; ++i) dout[b * kS * kC + i] = std::numeric_limits<double>::quiet_NaN();
  }
  attention_backward(d2.data(), dout.data(), qkv.data(), att.data(), kLengths.data(), kB, kS, kC, kNH, true);
  EXPECT_EQ(d1, d2);
}

// Huge scores in float and an empty sequence: everything stays finite.
TEST(Attention, FloatStaysFiniteWithHugeScoresAndEmptySequences) {
  std::vector<float> qkv(kB * kS * 3 * kC);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(300.0 * normal(50, i));
  std::vector<float> out(kB * kS * kC), att(kB * kNH * kS * kS), dqkv(qkv.size());
  std::vector<float> dout(out.size(), 1.0f);
  attention_forward(out.data(), att.data(), qkv.data(), kLengths.data(), kB, kS, kC, kNH, true);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), kLengths.data(), kB, kS, kC, kNH, true);
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
  for (float x : att) ASSERT_TRUE(std::isfinite(x));
  for (float x : dqkv) ASSERT_TRUE(std::isfinite(x));
}

void ExpectFloatAgrees(const std::vector<float>& f, const std::vector<double>& d, double rtol, const char* what) {
  ASSERT_EQ(f.size(), d.size());
  for (size_t i = 0; i < d.size(); ++i)
    EXPECT_NEAR(f[i], d[i], rtol * (1.0 + std::abs(d[i]))) << what << "[" << i << "]";
}

// Float attention (the tiled kernels) against a naive double reference, forward and backward, on shapes that hit
// the tile edges: lengths not multiples of the 6-query blocks or the 16-key vectors, empty and full sequences,
// S not a multiple of 16 (att's last columns), head sizes 3, 10, 12 and 64.
struct NaiveAttentionResult {
  std::vector<double> out, att, dqkv;
};
NaiveAttentionResult NaiveAttentionWithBackward(const std::vector<double>& qkv, const std::vector<double>& dout,
                                                const std::vector<int32_t>& lengths, int B, int S, int C, int NH,
                                                bool causal) {
  const int hs = C / NH;
  NaiveAttentionResult r{std::vector<double>(size_t(B) * S * C, 0.0), std::vector<double>(size_t(B) * NH * S * S, 0.0),
                         std::vector<double>(qkv.size(), 0.0)};
  auto Q = [&](int b, int t, int h, int part) { return &qkv[(size_t(b) * S + t) * 3 * C + part * C + h * hs]; };
  for (int b = 0; b < B; ++b) {
    const int L = lengths[b];
    for (int h = 0; h < NH; ++h) {
      double* P = &r.att[(size_t(b) * NH + h) * S * S];
      for (int t = 0; t < L; ++t) {
        const int n = causal ? t + 1 : L;
        double zmax = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += Q(b, t, h, 0)[i] * Q(b, j, h, 1)[i];
          P[t * S + j] = dot / std::sqrt(double(hs));
          zmax = std::max(zmax, P[t * S + j]);
        }
        for (int j = 0; j < n; ++j) sum += (P[t * S + j] = std::exp(P[t * S + j] - zmax));
        for (int j = 0; j < n; ++j) P[t * S + j] /= sum;
        for (int j = 0; j < n; ++j) {
          for (int i = 0; i < hs; ++i) r.out[(size_t(b) * S + t) * C + h * hs + i] += P[t * S + j] * Q(b, j, h, 2)[i];
        }
      }
      // Backward from the definition: dP = dO Vᵀ, dZ = P (dP - rowsum(P dP)) / sqrt(hs), dQ = dZ K, dK = dZᵀ Q,
      // dV = Pᵀ dO.
      for (int t = 0; t < L; ++t) {
        const int n = causal ? t + 1 : L;
        const double* dO = &dout[(size_t(b) * S + t) * C + h * hs];
        std::vector<double> dP(n);
        double rowdot = 0;
        for (int j = 0; j < n; ++j) {
          for (int i = 0; i < hs; ++i) dP[j] += dO[i] * Q(b, j, h, 2)[i];
          rowdot += P[t * S + j] * dP[j];
        }
        for (int j = 0; j < n; ++j) {
          const double dz = P[t * S + j] * (dP[j] - rowdot) / std::sqrt(double(hs));
          double* dq = &r.dqkv[(size_t(b) * S + t) * 3 * C + h * hs];
          double* dk = &r.dqkv[(size_t(b) * S + j) * 3 * C + C + h * hs];
          double* dv = &r.dqkv[(size_t(b) * S + j) * 3 * C + 2 * C + h * hs];
          for (int i = 0; i < hs; ++i) {
            dq[i] += dz * Q(b, j, h, 1)[i];
            dk[i] += dz * Q(b, t, h, 0)[i];
            dv[i] += P[t * S + j] * dO[i];
          }
        }
      }
    }
  }
  return r;
}

TEST(Attention, FloatTiledKernelsMatchNaiveDoubleOnRandomShapesWithPadding) {
  struct Case {
    int B, S, C, NH;
  };
  const Case cases[] = {{5, 37, 48, 4}, {4, 64, 24, 2}, {3, 19, 20, 2}, {2, 40, 64, 1}, {3, 23, 9, 3}, {2, 129, 48, 4}};
  uint64_t seed = 100;
  for (const Case& k : cases) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B " << k.B << " S " << k.S << " C " << k.C << " NH " << k.NH
                                        << (causal ? " causal" : " bidirectional"));
      ++seed;
      std::vector<int32_t> lengths(k.B);
      for (int b = 0; b < k.B; ++b) lengths[b] = static_cast<int32_t>(hash64(seed, b) % (k.S + 1));
      lengths[0] = k.S;  // one full sequence (att's last columns), one empty
      if (k.B > 2) lengths[1] = 0;
      std::vector<double> qkv = RandomNormal(size_t(k.B) * k.S * 3 * k.C, seed, 1.5),
                          dout = RandomNormal(size_t(k.B) * k.S * k.C, seed + 1000);
      for (double& x : qkv) x = static_cast<float>(x);  // the float inputs exactly
      for (double& x : dout) x = static_cast<float>(x);
      const auto ref = NaiveAttentionWithBackward(qkv, dout, lengths, k.B, k.S, k.C, k.NH, causal);
      std::vector<float> qkv_f(qkv.begin(), qkv.end()), dout_f(dout.begin(), dout.end());
      std::vector<float> out(ref.out.size(), -99.f), att(ref.att.size(), -99.f), dqkv(qkv.size(), -99.f);
      attention_forward(out.data(), att.data(), qkv_f.data(), lengths.data(), k.B, k.S, k.C, k.NH, causal);
      attention_backward(dqkv.data(), dout_f.data(), qkv_f.data(), att.data(), lengths.data(), k.B, k.S, k.C, k.NH,
                         causal);
      for (size_t i = 0; i < att.size(); ++i) {
        if (ref.att[i] == 0.0) {
          ASSERT_EQ(att[i], 0.0f) << "att[" << i << "] is masked or padding";
        } else {
          ASSERT_NEAR(att[i], ref.att[i], 2e-6 + 1e-5 * ref.att[i]) << "att[" << i << "]";
        }
      }
      ExpectFloatAgrees(out, ref.out, 2e-5, "attention out");
      ExpectFloatAgrees(dqkv, ref.dqkv, 2e-5, "attention dqkv");
    }
  }
}

// The attention's softmax takes 16 lanes where available (ops.h, float_lanes): the same bits as 8, for rows of
// lengths around both widths.
TEST(Attention, FloatSixteenLanesGiveTheBitsOfEight) {
  if (!sixteen_lanes_available()) {
    GTEST_SKIP() << "no 16-lane kernels here (this CPU has no AVX-512, or the build is not optimised): 8 lanes only";
  }
  const int B = 3, S = 41, C = 16, NH = 2;
  const std::vector<int32_t> lengths = {41, 17, 33};
  const std::vector<double> qkv_d = RandomNormal(size_t(B) * S * 3 * C, 900, 1.5);
  const std::vector<float> qkv(qkv_d.begin(), qkv_d.end());
  std::vector<float> out[2], att[2];
  const int before = float_lanes();
  for (int k = 0; k < 2; ++k) {
    set_float_lanes(k == 0 ? 8 : 16);
    out[k].assign(size_t(B) * S * C, -99.f);
    att[k].assign(size_t(B) * NH * S * S, -99.f);
    attention_forward(out[k].data(), att[k].data(), qkv.data(), lengths.data(), B, S, C, NH, /*causal=*/true);
  }
  set_float_lanes(before);
  EXPECT_EQ(std::memcmp(att[0].data(), att[1].data(), att[0].size() * sizeof(float)), 0) << "att";
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0) << "out";
}

// Packed rows compute what their sequences compute alone, bit for bit (the same tiles on the same numbers), on
// shapes that put sequence starts off the 6-query and 16-key grids and end row 0 exactly at an S that is not a
// multiple of 16 (att's last columns); outside the diagonal blocks att is 0.
TEST(Attention, FloatPackedRowsEqualTheirSequencesAlone) {
  struct Case {
    int B, S, C, NH;
  };
  const Case cases[] = {{3, 37, 48, 4}, {2, 64, 24, 2}, {2, 129, 48, 4}, {3, 23, 9, 3}};
  uint64_t seed = 300;
  for (const Case& k : cases) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B " << k.B << " S " << k.S << " C " << k.C << " NH " << k.NH
                                        << (causal ? " causal" : " bidirectional"));
      ++seed;
      const int S = k.S, C3 = 3 * k.C;
      std::vector<int32_t> lengths(k.B, 0), positions(size_t(k.B) * S, -1);
      std::vector<std::vector<std::pair<int, int>>> seqs(k.B);  // (start, length) of each row's sequences
      for (int b = 0; b < k.B; ++b) {
        for (int i = 0;; ++i) {
          int len = 1 + static_cast<int>(hash64(seed, b * 1000 + i) % (S / 2));
          if (lengths[b] + len > S) {
            if (b > 0) break;
            len = S - lengths[b];  // row 0 ends exactly at S; the others have padding
            if (len == 0) break;
          }
          seqs[b].push_back({lengths[b], len});
          for (int t = 0; t < len; ++t) positions[size_t(b) * S + lengths[b] + t] = t;
          lengths[b] += len;
        }
      }
      std::vector<float> qkv(size_t(k.B) * S * C3), dout(size_t(k.B) * S * k.C);
      for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(1.5 * normal(seed, i));
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(normal(seed + 1000, i));
      std::vector<float> out(dout.size(), -99.f), att(size_t(k.B) * k.NH * S * S, -99.f), dqkv(qkv.size(), -99.f);
      attention_forward(out.data(), att.data(), qkv.data(), lengths.data(), k.B, S, k.C, k.NH, causal,
                        positions.data());
      attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), lengths.data(), k.B, S, k.C, k.NH, causal,
                         positions.data());
      int64_t in_blocks = 0, nonzero = 0;
      for (int b = 0; b < k.B; ++b) {
        for (const auto& [s0, len] : seqs[b]) {
          const size_t row0 = size_t(b) * S + s0;
          std::vector<float> q1(qkv.begin() + row0 * C3, qkv.begin() + (row0 + len) * C3),
              d1(dout.begin() + row0 * k.C, dout.begin() + (row0 + len) * k.C);
          std::vector<float> out1(d1.size()), att1(size_t(k.NH) * len * len), dqkv1(q1.size());
          attention_forward(out1.data(), att1.data(), q1.data(), nullptr, 1, len, k.C, k.NH, causal);
          attention_backward(dqkv1.data(), d1.data(), q1.data(), att1.data(), nullptr, 1, len, k.C, k.NH, causal);
          ASSERT_TRUE(std::equal(out1.begin(), out1.end(), out.begin() + row0 * k.C))
              << "out of (" << b << ", " << s0 << ")";
          ASSERT_TRUE(std::equal(dqkv1.begin(), dqkv1.end(), dqkv.begin() + row0 * C3))
              << "dqkv of (" << b << ", " << s0 << ")";
          for (int h = 0; h < k.NH; ++h) {
            for (int t = 0; t < len; ++t) {
              for (int j = 0; j < len; ++j) {
                const float alone = att1[(size_t(h) * len + t) * len + j];
                ASSERT_EQ(att[((size_t(b) * k.NH + h) * S + s0 + t) * S + s0 + j], alone);
              }
            }
          }
          in_blocks += int64_t(k.NH) * len * len;
        }
      }
      for (float a : att) nonzero += a != 0.0f;
      EXPECT_LE(nonzero, in_blocks) << "att is 0 outside the diagonal blocks";  // (the blocks' entries were compared)
      for (int b = 0; b < k.B; ++b) {
        for (size_t i = size_t(lengths[b]) * C3; i < size_t(S) * C3; ++i) ASSERT_EQ(dqkv[b * S * C3 + i], 0.0f);
      }
    }
  }
}

// The LM head's use of softmax_cross_entropy_* (kernels/cpu/ops.h): rows without a target, a scale, in place.
TEST(SoftmaxCrossEntropy, BackwardIsGradientOfMeanOverValidRows) {
  constexpr int N = 5, V = 6;
  auto logits = RandomNormal(N * V, 60, 2.0);
  const std::vector<int32_t> targets = {0, -1, 5, 2, -100};
  std::vector<double> exps(N * V, -99.0), sums(N, -99.0), losses(N, -99.0), dlogits(N * V, -99.0);
  int64_t valid = -1;
  const auto loss = [&] {
    return softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), N, V,
                                         &valid);
  };
  const double mean = loss();
  EXPECT_EQ(valid, 3);
  EXPECT_EQ(losses[1], 0.0);
  EXPECT_EQ(losses[4], 0.0);
  for (int n : {1, 4}) {  // ignored rows: their exps and sums are not written
    EXPECT_EQ(sums[n], -99.0) << n;
    for (int v = 0; v < V; ++v) EXPECT_EQ(exps[n * V + v], -99.0) << n;
  }
  EXPECT_NEAR(mean, (losses[0] + losses[2] + losses[3]) / 3, 1e-15);
  for (int n : {0, 2, 3}) {
    double zmax = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) zmax = std::max(zmax, logits[n * V + v]);
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - zmax);
    EXPECT_NEAR(losses[n], std::log(sum) + zmax - logits[n * V + targets[n]], 1e-13) << n;
  }
  softmax_cross_entropy_backward(dlogits.data(), exps.data(), sums.data(), targets.data(), N, V);
  EXPECT_GT(ExpectGradNear(dlogits, NumericGrad(logits, loss), "dlogits"), 3 * V - 1);
  for (int v = 0; v < V; ++v) EXPECT_EQ(dlogits[V + v], 0.0);
  std::vector<double> scaled(N * V);  // the gradient of 0.5 x the mean
  softmax_cross_entropy_backward(scaled.data(), exps.data(), sums.data(), targets.data(), N, V, 0.5);
  for (int i = 0; i < N * V; ++i) EXPECT_NEAR(scaled[i], 0.5 * dlogits[i], 1e-17) << i;

  // In place (exps over logits, then dlogits over exps) gives the same numbers.
  std::vector<double> buf = logits, sums2(N), losses2(N);
  EXPECT_EQ(softmax_cross_entropy_forward(buf.data(), sums2.data(), losses2.data(), buf.data(), targets.data(), N, V),
            loss());
  softmax_cross_entropy_backward(buf.data(), buf.data(), sums2.data(), targets.data(), N, V);
  EXPECT_EQ(buf, dlogits);

  // No valid row: loss 0 and zero gradient, no NaN.
  const std::vector<int32_t> none(N, -1);
  EXPECT_EQ(softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), none.data(), N, V),
            0.0);
  softmax_cross_entropy_backward(dlogits.data(), exps.data(), sums.data(), none.data(), N, V);
  for (double d : dlogits) EXPECT_EQ(d, 0.0);
}

TEST(MeanPool, MatchesDefinitionAndBackwardMatchesFiniteDifferences) {
  auto inp = RandomNormal(kB * kS * kC, 70);
  const auto w = RandomNormal(kB * kC, 71);
  std::vector<double> out(kB * kC, -99.0);
  const auto loss = [&] {
    mean_pool_forward(out.data(), inp.data(), kLengths.data(), kB, kS, kC);
    return Dot(out, w);
  };
  loss();
  for (int b = 0; b < kB; ++b) {
    for (int c = 0; c < kC; ++c) {
      double m = 0;
      for (int t = 0; t < kLengths[b]; ++t) m += inp[(b * kS + t) * kC + c];
      EXPECT_NEAR(out[b * kC + c], kLengths[b] ? m / kLengths[b] : 0.0, 1e-14);
    }
  }
  std::vector<double> dinp(inp.size(), -99.0);
  mean_pool_backward(dinp.data(), w.data(), kLengths.data(), kB, kS, kC);
  ExpectGradNear(dinp, NumericGrad(inp, loss), "dinp");
  for (int t = kLengths[1]; t < kS; ++t) EXPECT_EQ(dinp[(kS + t) * kC], 0.0);
}

// The causal LM's targets, worked by hand from the definition: each token's target is the next token of its own
// sequence, -1 at a sequence's last token, on padding, and (packed) where the next token starts a new sequence.
TEST(NextTokenTargets, NextTokenOfTheSameSequenceElseNone) {
  constexpr int B = 2, S = 5;
  const std::vector<int32_t> tokens = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};
  const std::vector<int32_t> lengths = {5, 3};
  std::vector<int32_t> targets(B * S, 99);
  next_token_targets(targets.data(), tokens.data(), lengths.data(), B, S);
  EXPECT_EQ(targets, (std::vector<int32_t>{11, 12, 13, 14, -1, 21, 22, -1, -1, -1}));
  next_token_targets(targets.data(), tokens.data(), nullptr, B, S);  // no lengths: every row full
  EXPECT_EQ(targets, (std::vector<int32_t>{11, 12, 13, 14, -1, 21, 22, 23, 24, -1}));
  // Row 0 packs [10 11] and [12 13 14]; row 1 holds one sequence of 3, then padding.
  const std::vector<int32_t> positions = {0, 1, 0, 1, 2, 0, 1, 2, 0, 0};
  next_token_targets(targets.data(), tokens.data(), lengths.data(), B, S, positions.data());
  EXPECT_EQ(targets, (std::vector<int32_t>{11, -1, 13, 14, -1, 21, 22, -1, -1, -1}));
}

TEST(Residual, AddsElementwise) {
  const std::vector<double> a = {1, 2, 3}, b = {10, 20, 30};
  std::vector<double> out(3);
  residual_forward(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<double>{11, 22, 33}));
}

TEST(FloatVsDouble, TransformerOpsAgree) {
  auto round = [](std::vector<double> v) {
    for (double& x : v) x = static_cast<float>(x);
    return v;
  };
  auto to_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const auto qkv = round(RandomNormal(kB * kS * 3 * kC, 80)), dout = round(RandomNormal(kB * kS * kC, 81));
  const auto qkv_f = to_float(qkv), dout_f = to_float(dout);
  std::vector<double> out(kB * kS * kC), att(kB * kNH * kS * kS), dqkv(qkv.size());
  std::vector<float> out_f(out.size()), att_f(att.size()), dqkv_f(qkv.size());
  attention_forward(out.data(), att.data(), qkv.data(), kLengths.data(), kB, kS, kC, kNH, true);
  attention_forward(out_f.data(), att_f.data(), qkv_f.data(), kLengths.data(), kB, kS, kC, kNH, true);
  ExpectFloatAgrees(out_f, out, 1e-5, "attention out");
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), kLengths.data(), kB, kS, kC, kNH, true);
  attention_backward(dqkv_f.data(), dout_f.data(), qkv_f.data(), att_f.data(), kLengths.data(), kB, kS, kC, kNH, true);
  ExpectFloatAgrees(dqkv_f, dqkv, 1e-5, "attention dqkv");

  constexpr int N = kB * kS;
  const auto weight = round(RandomNormal(kC, 82)), bias = round(RandomNormal(kC, 83));
  const auto weight_f = to_float(weight), bias_f = to_float(bias);
  std::vector<double> ln(N * kC), mean(N), rstd(N), dln(N * kC, 0.0), dw(kC, 0.0), db(kC, 0.0);
  std::vector<float> ln_f(N * kC), mean_f(N), rstd_f(N), dln_f(N * kC, 0.0f), dw_f(kC, 0.0f), db_f(kC, 0.0f);
  layernorm_forward(ln.data(), mean.data(), rstd.data(), qkv.data(), weight.data(), bias.data(), N, kC);
  layernorm_forward(ln_f.data(), mean_f.data(), rstd_f.data(), qkv_f.data(), weight_f.data(), bias_f.data(), N, kC);
  ExpectFloatAgrees(ln_f, ln, 1e-5, "layernorm");
  layernorm_backward(dln.data(), dw.data(), db.data(), dout.data(), qkv.data(), weight.data(), mean.data(), rstd.data(),
                     N, kC);
  layernorm_backward(dln_f.data(), dw_f.data(), db_f.data(), dout_f.data(), qkv_f.data(), weight_f.data(),
                     mean_f.data(), rstd_f.data(), N, kC);
  ExpectFloatAgrees(dln_f, dln, 1e-5, "layernorm dinp");
  ExpectFloatAgrees(dw_f, dw, 1e-5, "layernorm dweight");
}

}  // namespace
}  // namespace ddplab::cpu
