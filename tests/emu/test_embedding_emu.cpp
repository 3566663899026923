// The embedding kernels (kernels/cuda/embedding_kernels.cuh), their own source compiled by g++ and run by the
// emulation (cuda_emulation.h), against the CPU (kernels/cpu/transformer_ops.h): the forward's token and position rows
// (padded rows zero, fp32 and bf16), and the backward's dwte from the rows sorted by token and its per-position sum
// into dwpe, both accumulating, bit for bit the CPU's on values whose sums round (so the order of the adds shows):
// the sort's keys (padding last), runs of a token longer than the rows a warp loads at once, ending inside a group of
// them and at its end; and runs longer than a piece (cut smaller here than the launcher's, so that these few rows make
// them) bit for bit cpu::embedding_backward_wte_in_pieces, ending inside a piece and at its end. CUB's sort, which
// sort_rows_by_token runs between the two kernels, is a stable sort on the host here. Packed (16-byte) and scalar
// paths, grids smaller than the rows; rows of one sequence, and packed rows (several sequences each, positions
// counted from each one's start). What it cannot tell: speed.
// clang-format off
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with
#include "kernels/cuda/embedding_kernels.cuh"
// clang-format on
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/transformer_ops.h"
#include "kernels/cuda/embedding.h"  // kEmbeddingPieceRows
#include "kernels/float16.h"
#include "tests/emu/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"  // pack_sequences

namespace {

using ddplab::emu_test::bits;
using ddplab::emu_test::DeviceLikeVector;

namespace emb = ddplab::cuda::embedding;
using ddplab::emu::emulate_launch;
using ddplab::float16::Format;
using bf16 = __nv_bfloat16;

constexpr int kB = 5, kS = 9, kVocab = 4;  // few tokens: each one's rows are a run of several
const std::vector<int32_t> kLengths = {9, 0, 1, 6, 9};
const dim3 kGrid(2), kBlock(emb::kBlock);  // 16 warps for 45 rows: each warp takes several

// The batch's rows packed (--batching pack): row 0 holds sequences of 3, 1 and 5 tokens, row 3 of 2 and 4, the others
// one, each row as long as kLengths says (checked below); the padding's positions far out of range (never read).
const ddplab::gpu_test::PackedRows kPacked =
    ddplab::gpu_test::pack_sequences(kS, {{3, 1, 5}, {}, {1}, {2, 4}, {9}}, 1 << 30);
const std::vector<int32_t>& kPackedPositions = kPacked.positions;

std::vector<float> multiples(int64_t n, uint32_t seed) {  // k / 64 for k in [-64, 64]: sums of these are exact
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> k(-64, 64);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(k(gen)) / 64;
  return v;
}

std::vector<int32_t> tokens() {
  std::vector<int32_t> t(kB * kS);
  for (int i = 0; i < kB * kS; ++i) t[i] = (i * 7 + 3) % kVocab;
  return t;
}

// The 25 valid rows as runs of 8 (one group of kRowsInFlight), 16 (two), and 1 of tokens 2, 0, 3; token 1 unused; the
// padding's tokens out of range (never read).
std::vector<int32_t> runs() {
  static_assert(emb::kRowsInFlight == 8);
  std::vector<int32_t> t(kB * kS, 1 << 30);
  int valid = 0;
  for (int b = 0; b < kB; ++b)
    for (int s = 0; s < kLengths[b]; ++s, ++valid) t[b * kS + s] = valid < 8 ? 2 : valid < 24 ? 0 : 3;
  return t;
}

// Every valid row one token's: one run of 25 rows (three pieces of 8 and one row, or a piece of 16 and one of 9).
std::vector<int32_t> one_run() {
  std::vector<int32_t> t(kB * kS, 1 << 30);
  for (int b = 0; b < kB; ++b)
    for (int s = 0; s < kLengths[b]; ++s) t[b * kS + s] = 1;
  return t;
}

// The rows sorted by token as sort_rows_by_token leaves them: the keys made by its kernel, then a stable sort.
struct Sorted {
  std::vector<uint32_t> keys;
  std::vector<int32_t> rows;
};
Sorted sort_rows(const std::vector<int32_t>& tok) {
  const int64_t n = int64_t{kB} * kS;
  std::vector<uint32_t> keys(n);
  std::vector<int32_t> rows(n);
  emulate_launch(dim3(1), kBlock, 0, emb::token_keys_kernel, keys.data(), rows.data(), tok.data(), kLengths.data(), kB,
                 kS, uint32_t{kVocab});
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  Sorted sorted;
  for (int64_t i : order) {
    sorted.keys.push_back(keys[i]);
    sorted.rows.push_back(rows[i]);
  }
  return sorted;
}

std::vector<float> uniform(int64_t n, uint32_t seed) {  // sums of these round: a change of order shows
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

// C = 72 takes the 16-byte path (V = 4 for fp32, 8 for bf16), C = 70 the scalar one.
class EmbeddingEmulated : public ::testing::TestWithParam<int> {};

TEST_P(EmbeddingEmulated, ForwardIsTheCpus) {
  for (const int32_t* pos : {static_cast<const int32_t*>(nullptr), kPackedPositions.data()}) {
    SCOPED_TRACE(pos ? "packed rows" : "a sequence per row");
    const int C = GetParam();
    const std::vector<int32_t> tok = tokens();
    const std::vector<float> wte = multiples(int64_t{kVocab} * C, 1), wpe = multiples(int64_t{kS} * C, 2);
    std::vector<float> want(int64_t{kB} * kS * C);
    ddplab::cpu::embedding_forward(want.data(), tok.data(), kLengths.data(), wte.data(), wpe.data(), kB, kS, C, pos);

    std::vector<float> out(want.size(), -1.0f);
    constexpr int V = emb::kVec<float>;
    if (C % V == 0)
      emulate_launch(kGrid, kBlock, 0, emb::embedding_forward_kernel<float, V>, out.data(), tok.data(), kLengths.data(),
                     pos, wte.data(), wpe.data(), kB, kS, C);
    else
      emulate_launch(kGrid, kBlock, 0, emb::embedding_forward_kernel<float, 1>, out.data(), tok.data(), kLengths.data(),
                     pos, wte.data(), wpe.data(), kB, kS, C);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bits(out[i]), bits(want[i])) << i;

    std::vector<bf16> out16(want.size());
    constexpr int V16 = emb::kVec<bf16>;
    if (C % V16 == 0)
      emulate_launch(kGrid, kBlock, 0, emb::embedding_forward_kernel<bf16, V16>, out16.data(), tok.data(),
                     kLengths.data(), pos, wte.data(), wpe.data(), kB, kS, C);
    else
      emulate_launch(kGrid, kBlock, 0, emb::embedding_forward_kernel<bf16, 1>, out16.data(), tok.data(),
                     kLengths.data(), pos, wte.data(), wpe.data(), kB, kS, C);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(bits(out16[i]), ddplab::float16::from_f32(Format::kBf16, want[i])) << i;
  }
}

TEST(EmbeddingEmulatedBatch, PackedRowsRestartTheirPositionsAtEachSequence) {
  EXPECT_EQ(kPacked.lengths, kLengths);  // the packed and unpacked runs cover the same tokens
  const std::vector<int32_t> row0(kPackedPositions.begin(), kPackedPositions.begin() + kS);
  EXPECT_EQ(row0, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 2, 3, 4}));  // sequences of 3, 1 and 5
}

// The keys: a valid row's token, the padding's and a token out of range (a broken contract) keyed past the
// vocabulary, so that each token's rows stay one run.
TEST(EmbeddingSortKeys, PutThePaddingLastAndKeepEachTokensRowsInOrder) {
  std::vector<int32_t> tok = runs();
  tok[2] = -1;  // a valid row's, out of range
  const Sorted sorted = sort_rows(tok);
  for (int64_t i = 0; i < int64_t{kB} * kS; ++i) {
    const int32_t row = sorted.rows[i];
    const bool keyed = row % kS < kLengths[row / kS] && tok[row] >= 0;
    EXPECT_EQ(sorted.keys[i], keyed ? static_cast<uint32_t>(tok[row]) : uint32_t{kVocab}) << i;
    if (i > 0) {
      EXPECT_LE(sorted.keys[i - 1], sorted.keys[i]) << i;
      if (sorted.keys[i] == sorted.keys[i - 1]) {
        EXPECT_LT(sorted.rows[i - 1], row) << i;
      }
    }
  }
}

// Which piece of its run each sorted position begins: runs of 1 to 25 rows, pieces of 1 to 8 rows.
TEST(EmbeddingRunPieces, AreCutFromEachRunsFirstRow) {
  std::vector<uint32_t> keys;  // token i's run is the i-th length's
  std::vector<int64_t> run_start;
  uint32_t token = 0;
  for (const int length : {1, 7, 8, 9, 16, 17, 25, 3}) {
    for (int k = 0; k < length; ++k) {
      run_start.push_back(static_cast<int64_t>(keys.size()) - k);
      keys.push_back(token);
    }
    ++token;
  }
  for (const int piece_rows : {1, 2, 3, 8})
    for (int64_t p = 0; p < static_cast<int64_t>(keys.size()); ++p) {
      const int64_t into = p - run_start[p];
      EXPECT_EQ(emb::run_piece(keys.data(), p, keys[p], piece_rows), into % piece_rows == 0 ? into / piece_rows : -1)
          << "position " << p << ", pieces of " << piece_rows;
    }
}

// dout as the kernel reads it (T) and as the CPU reference does (the same values in fp32), uniform in [-1, 1].
template <typename T>
std::pair<std::vector<float>, std::vector<T>> dout_of(int64_t n, uint32_t seed) {
  std::vector<float> dout = uniform(n, seed);
  std::vector<T> dout_t(dout.size());
  for (size_t i = 0; i < dout.size(); ++i) {
    dout_t[i] = T(dout[i]);
    dout[i] = static_cast<float>(dout_t[i]);
  }
  return {dout, dout_t};
}

// embedding_backward_wpe_kernel as embedding.cu launches it: 16-byte packs where C allows, else a column a thread.
template <typename T>
void emulate_wpe_backward(unsigned position_blocks, float* dwpe, const T* dout, const int32_t* lengths,
                          const int32_t* positions, int B, int S, int C) {
  constexpr int V = emb::kVec<T>;
  const int v = C % V == 0 ? V : 1;
  const dim3 grid(static_cast<unsigned>((C / v + emb::kBlock - 1) / emb::kBlock), position_blocks);
  if (v == V)
    emulate_launch(grid, kBlock, 0, emb::embedding_backward_wpe_kernel<T, V>, dwpe, dout, lengths, positions, B, S, C);
  else
    emulate_launch(grid, kBlock, 0, emb::embedding_backward_wpe_kernel<T, 1>, dwpe, dout, lengths, positions, B, S, C);
}

// fp32 dout, then bf16 dout against the CPU on its values (the 16-byte path: 8 bf16 a lane and 32 bytes of dwte): dwpe
// the CPU's, dwte its order in pieces, which for pieces longer than every run is the CPU's own.
template <typename T>
void expect_backward_is_the_cpus(int C) {
  const int64_t n = int64_t{kB} * kS;
  for (const int32_t* pos : {static_cast<const int32_t*>(nullptr), kPackedPositions.data()})
    for (const std::vector<int32_t>& tok : {tokens(), runs(), one_run()}) {
      SCOPED_TRACE(pos ? "packed rows" : "a sequence per row");
      const Sorted sorted = sort_rows(tok);
      const auto [dout, dout_t] = dout_of<T>(n * C, 3);
      const std::vector<float> dwte0 = uniform(int64_t{kVocab} * C, 4), dwpe0 = uniform(int64_t{kS} * C, 5);
      std::vector<float> dwte_cpu = dwte0, dwpe_want = dwpe0;
      ddplab::cpu::embedding_backward(dwte_cpu.data(), dwpe_want.data(), dout.data(), tok.data(), kLengths.data(), kB,
                                      kS, C, pos);
      for (const int piece_rows : {8, 16, ddplab::cuda::kEmbeddingPieceRows}) {
        SCOPED_TRACE("pieces of " + std::to_string(piece_rows) + " rows");
        std::vector<float> dwte_want = dwte0;
        ddplab::cpu::embedding_backward_wte_in_pieces(dwte_want.data(), dout.data(), tok.data(), kLengths.data(), kB,
                                                      kS, C, piece_rows);
        // Pieces longer than every run add in the CPU's own order: its bits. Shorter ones add a run's pieces, then
        // the pieces' sums: the same addends in another order, so within the rounding of that order (the reference
        // itself checked, not only the kernels against it).
        for (size_t i = 0; i < dwte_want.size(); ++i) {
          if (piece_rows >= 25)  // every run fits a piece
            ASSERT_EQ(bits(dwte_want[i]), bits(dwte_cpu[i])) << i;
          else
            ASSERT_NEAR(dwte_want[i], dwte_cpu[i], 1e-5f * (1.0f + std::fabs(dwte_cpu[i]))) << i;
        }
        DeviceLikeVector<float> dwte(dwte0.begin(), dwte0.end()), dwpe(dwpe0.begin(), dwpe0.end());
        DeviceLikeVector<float> run_sums((n + piece_rows - 1) / piece_rows * C, NAN);  // unwritten sums must go unread
        constexpr int V = emb::kVec<T>;
        const uint32_t padded = kVocab;
        if (C % V == 0) {
          emulate_launch(kGrid, kBlock, 0, emb::embedding_backward_wte_kernel<T, V>, dwte.data(), run_sums.data(),
                         dout_t.data(), sorted.keys.data(), sorted.rows.data(), n, C, padded, piece_rows);
          emulate_launch(kGrid, kBlock, 0, emb::embedding_backward_long_runs_kernel<V>, dwte.data(),
                         static_cast<const float*>(run_sums.data()), sorted.keys.data(), n, C, padded, piece_rows);
        } else {
          emulate_launch(kGrid, kBlock, 0, emb::embedding_backward_wte_kernel<T, 1>, dwte.data(), run_sums.data(),
                         dout_t.data(), sorted.keys.data(), sorted.rows.data(), n, C, padded, piece_rows);
          emulate_launch(kGrid, kBlock, 0, emb::embedding_backward_long_runs_kernel<1>, dwte.data(),
                         static_cast<const float*>(run_sums.data()), sorted.keys.data(), n, C, padded, piece_rows);
        }
        emulate_wpe_backward(4, dwpe.data(), dout_t.data(), kLengths.data(), pos, kB, kS, C);  // 4 of 9 positions
        for (size_t i = 0; i < dwte.size(); ++i) ASSERT_EQ(bits(dwte[i]), bits(dwte_want[i])) << "dwte[" << i << "]";
        for (size_t i = 0; i < dwpe.size(); ++i) ASSERT_EQ(bits(dwpe[i]), bits(dwpe_want[i])) << "dwpe[" << i << "]";
      }
    }
}

// dwpe over rows long enough that a position's rows fall in several of a warp's 32-position windows, with sequences
// across the windows' edges, some starting 32 and 65 tokens into the row (a window's first position past the one
// before, for p = 0 and 1), and fewer blocks than positions (each walks several): bitwise the CPU's.
template <typename T>
void expect_wpe_backward_on_long_packed_rows_is_the_cpus(int C) {
  constexpr int B = 3, S = 100;
  const ddplab::gpu_test::PackedRows packed =
      ddplab::gpu_test::pack_sequences(S, {{40, 1, 30, 29}, {100}, {7, 7, 7, 7, 4, 33, 8}}, 1 << 30);
  const auto [dout, dout_t] = dout_of<T>(int64_t{B} * S * C, 6);
  const std::vector<float> dwpe0 = uniform(int64_t{S} * C, 7);
  std::vector<float> dwpe_want = dwpe0, dwte_unused(C, 0.0f);
  const std::vector<int32_t> token_0(int64_t{B} * S, 0);
  ddplab::cpu::embedding_backward(dwte_unused.data(), dwpe_want.data(), dout.data(), token_0.data(),
                                  packed.lengths.data(), B, S, C, packed.positions.data());
  DeviceLikeVector<float> dwpe(dwpe0.begin(), dwpe0.end());
  const unsigned position_blocks = 7;  // each walks several of the 100 positions
  emulate_wpe_backward(position_blocks, dwpe.data(), dout_t.data(), packed.lengths.data(), packed.positions.data(), B,
                       S, C);
  for (size_t i = 0; i < dwpe.size(); ++i) ASSERT_EQ(bits(dwpe[i]), bits(dwpe_want[i])) << "dwpe[" << i << "]";
}

TEST_P(EmbeddingEmulated, WpeBackwardOnLongPackedRowsIsTheCpus) {
  {
    SCOPED_TRACE("fp32 dout");
    expect_wpe_backward_on_long_packed_rows_is_the_cpus<float>(GetParam());
  }
  SCOPED_TRACE("bf16 dout");  // at C = 72, 9 lanes of the warp hold columns: the other 23 take part in the ballots
  expect_wpe_backward_on_long_packed_rows_is_the_cpus<bf16>(GetParam());
}

TEST_P(EmbeddingEmulated, BackwardAccumulatesTheCpusGradients) {
  SCOPED_TRACE("fp32 dout");
  expect_backward_is_the_cpus<float>(GetParam());
}

TEST_P(EmbeddingEmulated, BackwardFromBf16AccumulatesTheCpusGradients) {
  SCOPED_TRACE("bf16 dout");
  expect_backward_is_the_cpus<bf16>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(PackedAndScalar, EmbeddingEmulated, ::testing::Values(72, 70));

}  // namespace
