// The unfused attention's own kernels (kernels/cuda/attention_kernels.cuh), their source compiled by g++ and run by
// the emulation (cuda_emulation.h), in attention.cu's order with its cuBLAS GEMMs written here as loops, against the
// CPU reference in double (cpu::attention_forward / attention_backward): the head split and merge, the masked
// softmax and its backward, causal and not, over sequences full, shorter, of one token and empty. What the kernels
// must never read (padded rows of the input, masked scores) holds NaN here, so a read shows in the result. Grids
// smaller than the work test the grid-stride loops. What it cannot tell: speed, or cuBLAS's own results.
// clang-format off
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with
#include "kernels/cuda/attention_kernels.cuh"
// clang-format on
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/transformer_ops.h"
#include "tests/emu/emu_test_util.h"

namespace {

using ddplab::emu_test::normal_values;
namespace at = ddplab::cuda::attention;
using ddplab::emu::emulate_launch;

constexpr int B = 4, S = 37, C = 24, NH = 3, hs = C / NH;  // S > 32: lanes stride over keys; 37 leaves a tail
constexpr int64_t X = int64_t{B} * S * C;                  // floats per part of [P][B][NH][S][hs]
constexpr int64_t kHead = int64_t{S} * hs, kScores = int64_t{S} * S, kRows = int64_t{B} * NH * S;
const std::vector<int32_t> kLengths = {S, 21, 1, 0};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kScale = 1.0f / std::sqrt(static_cast<float>(hs));
const dim3 kBlock(at::kBlock), kFewBlocks(5);  // 5 blocks: fewer than B*S rows and than kRows / kWarps

int keys_of(int b, int t, bool causal) {
  const int L = kLengths[b];
  return t >= L ? 0 : (causal ? t + 1 : L);
}

// Sets every element the kernels must not read: the padded rows of a [B, S, width] input.
void poison_padded_rows(std::vector<float>& x, int width) {
  for (int b = 0; b < B; ++b)
    for (int t = kLengths[b]; t < S; ++t)
      for (int c = 0; c < width; ++c) x[(int64_t{b} * S + t) * width + c] = kNaN;
}

// cuBLAS's strided batched GEMM in row-major terms, as attention.cu calls it: per head i, D = alpha op(A) op(B),
// op(A) [m, k], op(B) [k, n], accumulated in double and rounded once (cuBLAS's fp32 sums differ by rounding only).
// Only the (row, col) pairs with keep(i, row, col) are computed; the rest of D is set to `other`.
template <typename Keep>
void batched_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, int64_t sa,
                  const float* Bm, int ldb, int64_t sb, float* D, int ldd, int64_t sd, Keep keep, float other) {
  for (int i = 0; i < B * NH; ++i)
    for (int r = 0; r < m; ++r)
      for (int c = 0; c < n; ++c) {
        float& d = D[i * sd + int64_t{r} * ldd + c];
        if (!keep(i, r, c)) {
          d = other;
          continue;
        }
        double sum = 0;
        for (int p = 0; p < k; ++p) {
          const float a = ta ? A[i * sa + int64_t{p} * lda + r] : A[i * sa + int64_t{r} * lda + p];
          const float bv = tb ? Bm[i * sb + int64_t{c} * ldb + p] : Bm[i * sb + int64_t{p} * ldb + c];
          sum += double{a} * bv;
        }
        d = static_cast<float>(alpha * sum);
      }
}
const auto kEverything = [](int, int, int) { return true; };

void split_heads(float* out, const float* in, int P) {
  emulate_launch(kFewBlocks, kBlock, 0, at::split_heads_kernel, out, in, kLengths.data(), B, S, C, NH, P);
}
void merge_heads(float* out, const float* in, int P) {
  emulate_launch(kFewBlocks, kBlock, 0, at::merge_heads_kernel, out, in, kLengths.data(), B, S, C, NH, P);
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << "[" << i << "]";
}

struct Forward {
  std::vector<float> out, att;
};

// attention.cu's attention_forward: split, att = scale Q K^T, masked softmax, Y = att V, merge. The score GEMM
// writes NaN where a key is masked: the softmax must not read it.
Forward emulated_forward(const std::vector<float>& qkv, bool causal) {
  std::vector<float> work(4 * X, -7.0f), att(B * NH * kScores, -7.0f), out(X, -7.0f);
  float *q = work.data(), *k = q + X, *v = k + X, *y = v + X;
  split_heads(q, qkv.data(), 3);
  const auto valid_score = [&](int i, int t, int j) { return j < keys_of(i / NH, t, causal); };
  batched_gemm(false, true, S, S, hs, kScale, q, hs, kHead, k, hs, kHead, att.data(), S, kScores, valid_score, kNaN);
  emulate_launch(dim3(3), kBlock, 0, at::softmax_forward_kernel, att.data(), kLengths.data(), NH, S, kRows, causal);
  batched_gemm(false, false, S, hs, S, 1.0f, att.data(), S, kScores, v, hs, kHead, y, hs, kHead, kEverything, 0.0f);
  merge_heads(out.data(), y, 1);
  return {out, att};
}

class AttentionEmulated : public ::testing::TestWithParam<bool> {};

TEST_P(AttentionEmulated, ForwardMatchesTheCpuReference) {
  const bool causal = GetParam();
  std::vector<float> qkv = normal_values(3 * X, 1, 1.5f);
  const std::vector<double> qkvd(qkv.begin(), qkv.end());
  poison_padded_rows(qkv, 3 * C);
  std::vector<double> out_ref(X), att_ref(B * NH * kScores);
  ddplab::cpu::attention_forward(out_ref.data(), att_ref.data(), qkvd.data(), kLengths.data(), B, S, C, NH, causal);

  const Forward f = emulated_forward(qkv, causal);
  expect_close(f.att, att_ref, 1e-5, "att");  // masked entries and padded rows: exactly 0 in both
  expect_close(f.out, out_ref, 1e-5, "out");
  for (size_t i = 0; i < att_ref.size(); ++i) {
    if (att_ref[i] == 0.0) {
      ASSERT_EQ(f.att[i], 0.0f) << "att[" << i << "] masked, must be exactly 0";
    }
  }
}

// attention.cu's attention_backward: split Q, K, V and dO; dV = att^T dO; dP = dO V^T (NaN where masked: the
// softmax's backward must not read it); dZ; dQ = dZ K; dK = dZ^T Q; merge dQ | dK | dV.
TEST_P(AttentionEmulated, BackwardMatchesTheCpuReference) {
  const bool causal = GetParam();
  std::vector<float> qkv = normal_values(3 * X, 2, 1.5f), dout = normal_values(X, 3, 1.0f);
  const std::vector<double> qkvd(qkv.begin(), qkv.end()), doutd(dout.begin(), dout.end());
  poison_padded_rows(qkv, 3 * C);
  poison_padded_rows(dout, C);
  std::vector<double> out_ref(X), att_ref(B * NH * kScores), dqkv_ref(3 * X);
  ddplab::cpu::attention_forward(out_ref.data(), att_ref.data(), qkvd.data(), kLengths.data(), B, S, C, NH, causal);
  ddplab::cpu::attention_backward(dqkv_ref.data(), doutd.data(), qkvd.data(), att_ref.data(), kLengths.data(), B, S, C,
                                  NH, causal);

  const std::vector<float> att = emulated_forward(qkv, causal).att;
  std::vector<float> work(7 * X, -7.0f), dz(B * NH * kScores, -7.0f), dqkv(3 * X, -7.0f);
  float *q = work.data(), *k = q + X, *v = k + X, *dy = v + X, *dq = dy + X, *dk = dq + X, *dv = dk + X;
  split_heads(q, qkv.data(), 3);
  split_heads(dy, dout.data(), 1);
  batched_gemm(true, false, S, hs, S, 1.0f, att.data(), S, kScores, dy, hs, kHead, dv, hs, kHead, kEverything, 0.0f);
  const auto valid_score = [&](int i, int t, int j) { return j < keys_of(i / NH, t, causal); };
  batched_gemm(false, true, S, S, hs, 1.0f, dy, hs, kHead, v, hs, kHead, dz.data(), S, kScores, valid_score, kNaN);
  emulate_launch(dim3(3), kBlock, 0, at::softmax_backward_kernel, dz.data(), att.data(), kLengths.data(), NH, S, kRows,
                 causal, kScale);
  batched_gemm(false, false, S, hs, S, 1.0f, dz.data(), S, kScores, k, hs, kHead, dq, hs, kHead, kEverything, 0.0f);
  batched_gemm(true, false, S, hs, S, 1.0f, dz.data(), S, kScores, q, hs, kHead, dk, hs, kHead, kEverything, 0.0f);
  merge_heads(dqkv.data(), dq, 3);
  expect_close(dqkv, dqkv_ref, 2e-5, "dqkv");  // padded rows: exactly 0 in both
}

INSTANTIATE_TEST_SUITE_P(CausalAndNot, AttentionEmulated, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Causal" : "Bidirectional"; });

// The split's layout, element by element: part p, head h, column d of row (b, t) lands at
// [p][b][h][t][d], and padded rows are 0 without being read; the merge puts every element back.
TEST(AttentionHeadsEmulated, SplitPlacesEachElementAndMergeInvertsIt) {
  std::vector<float> in = normal_values(3 * X, 4, 1.0f);
  poison_padded_rows(in, 3 * C);
  std::vector<float> parts(3 * X, -7.0f), back(3 * X, -7.0f);
  split_heads(parts.data(), in.data(), 3);
  for (int p = 0; p < 3; ++p)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < S; ++t)
          for (int d = 0; d < hs; ++d) {
            const float got = parts[p * X + ((int64_t{b} * NH + h) * S + t) * hs + d];
            const float want = t < kLengths[b] ? in[(int64_t{b} * S + t) * 3 * C + p * C + h * hs + d] : 0.0f;
            ASSERT_EQ(got, want) << "p=" << p << " b=" << b << " h=" << h << " t=" << t << " d=" << d;
          }
  merge_heads(back.data(), parts.data(), 3);
  for (int64_t i = 0; i < 3 * X; ++i) {
    const int64_t row = i / (3 * C);
    ASSERT_EQ(back[i], row % S < kLengths[row / S] ? in[i] : 0.0f) << i;
  }
}

}  // namespace
