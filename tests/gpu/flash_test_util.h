// The fused bf16 attention's test logic, shared by its GPU test (tests/gpu/test_cuda_kernels.cpp) and its CPU
// emulation (tests/emu/test_flash_attention_emu.cpp), which run the same kernels: inputs, the CPU reference in double,
// and the comparison with its tolerances.
//
// The fused attention (flash_attention.h) is compared with the CPU reference in double on the same bf16-rounded
// inputs, padded rows of qkv and dout NaN on both sides (neither may read them); the callers poison the outputs first
// (every element must be written) and check guard tails.
//
// Tolerances from bf16 rounding, u = 2^-8 (the spacing of bf16 near 1: round to nearest is within u/2):
//   out = (P~ V) / l with P~ the probabilities rounded to bf16 (each within u/2), then rounded itself: the error is
//   within u/2 sum_j p_j |v_j| + u/2 |out| <= u max|v|; checked at 2u of max|v| elementwise (the inputs are exact on
//   both sides, the accumulations fp32 against double: negligible).
//   dV = P~^T dO, dK = dS~^T Q, dQ = dS~ K with P~, dS~ rounded to bf16 and the results rounded: each term within u/2
//   and the sum within u/2, but sums of terms of both signs (dS) cancel, and D = rowsum(dO O) uses the bf16 O; the
//   bound relative to the result is then a multiple of u: checked at 4u normwise (||got - want|| / ||want|| per part)
//   and at 8u of the part's largest |want| elementwise.
//   lse: fp32 scores of exact bf16 products and fp32 exp2/log2, against double: 1e-4 absolute + 1e-5 relative.
// A wrong mask, scale or block boundary, a lost dQ share or a missed rescale give errors of order 1. The check prints
// the largest errors it sees, for a GPU run to tighten these bounds from.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/transformer_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace ddplab::flash_test {

struct FlashShape {
  int B, S, C, NH;
  std::vector<int32_t> lengths;         // empty: null lengths (every sequence is S)
  float amplitude = 1.0f;               // inputs uniform in [-amplitude, amplitude]
  std::vector<int32_t> positions = {};  // [B, S], packed rows (packed_rows); empty: null positions (a sequence per row)

  // As the kernels read a length: clamped to [0, S] (a case may hold one outside, to check that they do).
  int length(int b) const { return lengths.empty() ? S : std::clamp(lengths[b], 0, S); }
  const int32_t* lengths_or_null() const { return lengths.empty() ? nullptr : lengths.data(); }
  const int32_t* positions_or_null() const { return positions.empty() ? nullptr : positions.data(); }
  // The first key valid for query t of row b: its sequence's first token when packed.
  int first_key(int b, int t) const { return positions.empty() ? 0 : t - positions[int64_t{b} * S + t]; }
  std::string describe(bool causal) const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH) + " hs=" + std::to_string(C / NH) + (causal ? " causal" : " bidir") +
           " amplitude " + std::to_string(amplitude) + (positions.empty() ? "" : " packed");
  }
};

// The shape with its rows packed (gpu_test::pack_sequences): row b holds sequences of sequence_lengths[b]'s lengths.
inline FlashShape packed_rows(FlashShape sh, const std::vector<std::vector<int>>& sequence_lengths) {
  EXPECT_EQ(sequence_lengths.size(), static_cast<size_t>(sh.B));
  gpu_test::PackedRows rows = gpu_test::pack_sequences(sh.S, sequence_lengths);
  sh.positions = std::move(rows.positions);
  sh.lengths = std::move(rows.lengths);
  return sh;
}

// The row log-sum-exp of the scaled scores over valid keys, in double; -inf on padded rows (an empty sum). The CPU
// reference keeps the probabilities instead.
inline std::vector<double> reference_lse(const std::vector<double>& qkv, const FlashShape& sh, bool causal) {
  const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH, hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> lse(int64_t{B} * NH * S, -std::numeric_limits<double>::infinity());
  for (int b = 0; b < B; ++b) {
    const int L = sh.length(b);
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < L; ++t) {
        const double* q = qkv.data() + (int64_t{b} * S + t) * 3 * C + h * hs;
        std::vector<double> z;
        for (int j = sh.first_key(b, t); j < (causal ? t + 1 : L); ++j) {
          const double* k = qkv.data() + (int64_t{b} * S + j) * 3 * C + C + h * hs;
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          z.push_back(dot * scale);
        }
        const double m = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (double v : z) sum += std::exp(v - m);
        lse[(int64_t{b} * NH + h) * S + t] = m + std::log(sum);
      }
  }
  return lse;
}

// The largest |got - want| over the largest |want|, and the normwise ||got - want|| / ||want||, over the elements
// where `want` is finite (the padded rows' -inf of lse are checked apart).
struct ErrorStats {
  double max_abs = 0, max_want = 0, norm_err = 0, norm_want = 0;
  void add(double got, double want) {
    const double err = std::fabs(got - want);
    max_abs = std::isnan(err) ? std::numeric_limits<double>::infinity() : std::max(max_abs, err);  // NaN: unwritten
    max_want = std::max(max_want, std::fabs(want));
    norm_err += (got - want) * (got - want);
    norm_want += want * want;
  }
  double rel_to_max() const { return max_want > 0 ? max_abs / max_want : max_abs; }
  double normwise() const { return norm_want > 0 ? std::sqrt(norm_err / norm_want) : std::sqrt(norm_err); }
};

// The inputs (bf16-rounded, NaN in padded rows) and the reference outputs, in double, of one shape and mask.
struct FlashCase {
  std::vector<float> qkv, dout;        // [B, S, 3C], [B, S, C]
  std::vector<double> out, dqkv, lse;  // the reference: [B, S, C], [B, S, 3C], [B, NH, S]
};

// Padded rows of qkv and dout are NaN when `poison_padding` (a kernel that reads one turns its outputs NaN), else
// random like the rest (for cuDNN, which does not promise to leave them unread).
inline FlashCase make_flash_case(const FlashShape& sh, bool causal, bool poison_padding = true) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH;
  FlashCase fc;
  fc.qkv = gpu_test::round_bf16(gpu_test::random_vector(int64_t{B} * S * 3 * C, -sh.amplitude, sh.amplitude, 51 + S));
  fc.dout = gpu_test::round_bf16(gpu_test::random_vector(int64_t{B} * S * C, -1, 1, 52 + S));
  for (int b = 0; b < B && poison_padding; ++b)
    for (int t = sh.length(b); t < S; ++t) {
      std::fill_n(fc.qkv.begin() + (int64_t{b} * S + t) * 3 * C, 3 * C, kNaN);
      std::fill_n(fc.dout.begin() + (int64_t{b} * S + t) * C, C, kNaN);
    }
  const std::vector<double> qkv_d(fc.qkv.begin(), fc.qkv.end()), dout_d(fc.dout.begin(), fc.dout.end());
  std::vector<double> att(int64_t{B} * NH * S * S);
  fc.out.resize(int64_t{B} * S * C);
  fc.dqkv.resize(fc.qkv.size());
  cpu::attention_forward(fc.out.data(), att.data(), qkv_d.data(), sh.lengths_or_null(), B, S, C, NH, causal,
                         sh.positions_or_null());
  cpu::attention_backward(fc.dqkv.data(), dout_d.data(), qkv_d.data(), att.data(), sh.lengths_or_null(), B, S, C, NH,
                          causal, sh.positions_or_null());
  fc.lse = reference_lse(qkv_d, sh, causal);
  return fc;
}

// The fused attention's out, lse and dqkv (as floats) against the case's reference: padded rows exactly 0 (and lse
// -inf where `padded_lse_defined`), valid rows within the tolerances above. Prints the largest errors, prefixed by
// `tag`.
inline void expect_flash_matches(const char* tag, const FlashShape& sh, bool causal, const FlashCase& fc,
                                 const std::vector<float>& got_out, const std::vector<float>& got_lse,
                                 const std::vector<float>& got_dqkv, bool padded_lse_defined = true) {
  constexpr double u = 1.0 / 256;  // bf16's spacing near 1
  const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH;
  double max_v = 0;  // the largest |v|: out's scale
  ErrorStats e_out, e_lse, e_dq, e_dk, e_dv;
  int64_t nonzero_padded = 0, bad_padded_lse = 0;
  double lse_excess = 0;  // the largest |error| - (1e-4 + 1e-5 |want|) on lse
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < S; ++t) {
      const int64_t row = int64_t{b} * S + t;
      const bool valid = t < sh.length(b);
      for (int c = 0; c < C; ++c) {
        const int64_t o = row * C + c, q = row * 3 * C + c;
        if (valid) {
          max_v = std::max(max_v, std::fabs(static_cast<double>(fc.qkv[q + 2 * C])));
          e_out.add(got_out[o], fc.out[o]);
          e_dq.add(got_dqkv[q], fc.dqkv[q]);
          e_dk.add(got_dqkv[q + C], fc.dqkv[q + C]);
          e_dv.add(got_dqkv[q + 2 * C], fc.dqkv[q + 2 * C]);
        } else {
          nonzero_padded += got_out[o] != 0.0f;
          for (int p = 0; p < 3; ++p) nonzero_padded += got_dqkv[q + p * C] != 0.0f;
        }
      }
      for (int h = 0; h < NH; ++h) {
        const int64_t i = (int64_t{b} * NH + h) * S + t;
        if (valid) {
          e_lse.add(got_lse[i], fc.lse[i]);
          lse_excess = std::max(lse_excess, std::fabs(got_lse[i] - fc.lse[i]) - (1e-4 + 1e-5 * std::fabs(fc.lse[i])));
          if (std::isnan(got_lse[i])) lse_excess = std::numeric_limits<double>::infinity();
        } else if (padded_lse_defined) {
          bad_padded_lse += !(std::isinf(got_lse[i]) && got_lse[i] < 0);
        }
      }
    }
  EXPECT_EQ(nonzero_padded, 0) << "padded rows of out and dqkv must be exactly 0";
  EXPECT_EQ(bad_padded_lse, 0) << "padded rows' lse must be -inf";
  EXPECT_LE(lse_excess, 0.0) << "lse: largest error " << e_lse.max_abs;
  EXPECT_LE(e_out.max_abs, 2 * u * max_v) << "out";
  for (auto [name, e] : {std::pair<const char*, const ErrorStats*>{"dq", &e_dq}, {"dk", &e_dk}, {"dv", &e_dv}}) {
    EXPECT_LE(e->normwise(), 4 * u) << name;
    EXPECT_LE(e->rel_to_max(), 8 * u) << name;
  }
  std::cout << tag << " B=" << B << " S=" << S << " hs=" << C / NH << " NH=" << NH << (causal ? " causal" : " bidir")
            << " amp=" << sh.amplitude << ": out " << e_out.max_abs / std::max(max_v, 1e-30) << " of max|v|, lse "
            << e_lse.max_abs << "; normwise/of-max dq " << e_dq.normwise() << "/" << e_dq.rel_to_max() << " dk "
            << e_dk.normwise() << "/" << e_dk.rel_to_max() << " dv " << e_dv.normwise() << "/" << e_dv.rel_to_max()
            << "\n";
}

}  // namespace ddplab::flash_test
