// The fused bf16 attention's kernels (kernels/cuda/flash_attention_kernels.cuh), their own source compiled by g++ and
// run by the emulation (cuda_emulation.h), against the CPU reference with the GPU test's checks (flash_test_util.h):
// the index arithmetic, shared-memory layouts, masking, barriers and block skipping are tested on every machine, and
// the launch sequence (grids, blocks, shared-memory sizes, the workspace's split) is the launchers' own, and the
// mma.sync / ldmatrix fragments are the PTX ISA's (their emulation is checked alone by test_mma_emu.cpp), as are
// cp.async's groups, and dQ's sm_90 float4 atomics take their addresses' checks. What it cannot tell: timing, the
// tensor cores' rounding order, memory-model subtleties.
#include "tests/emu/cuda_emulation.h"

// The kernels' dynamic shared memory, in their namespace (see DDPLAB_EMU_SHARED_MEMORY), before the kernels.
namespace ddplab::cuda {
namespace {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace
}  // namespace ddplab::cuda

#include "kernels/cuda/flash_attention_kernels.cuh"

// Then the rest.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "tests/gpu/flash_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

namespace cuda = ddplab::cuda;
using bf16 = __nv_bfloat16;
using ddplab::flash_test::FlashCase;
using ddplab::flash_test::FlashShape;
using ddplab::gpu_test::kGuard;

using ddplab::emu::emulated_launch;

// A host array of n elements plus a guard tail, all 0xFF bytes (NaN for fp32 and bf16) unless given values: every
// output element must be written, and nothing past the end.
template <typename T>
class Poisoned {
 public:
  explicit Poisoned(int64_t n) : n_(n), v_(n + kGuard) { std::memset(static_cast<void*>(v_.data()), 0xFF, bytes()); }
  explicit Poisoned(const std::vector<T>& values) : Poisoned(static_cast<int64_t>(values.size())) {
    std::copy(values.begin(), values.end(), v_.begin());
  }
  T* get() { return v_.data(); }
  std::vector<T> values() const {
    const auto* raw = reinterpret_cast<const unsigned char*>(v_.data() + n_);
    for (size_t i = 0; i < kGuard * sizeof(T); ++i)
      if (raw[i] != 0xFF) {
        ADD_FAILURE() << "a kernel wrote past the end of an array of " << n_;
        break;
      }
    return std::vector<T>(v_.begin(), v_.begin() + n_);
  }

 private:
  size_t bytes() const { return v_.size() * sizeof(T); }
  int64_t n_;
  std::vector<T> v_;
};

// fragments: the forward's query fragments per warp (0: the kernel's default). deterministic: the backward's dQ as
// key-block shares summed in order; its workspace, as every array here, starts as NaN, so a share the sum reads but
// the backward did not write fails the check.
void emulated_flash_matches_cpu(const FlashShape& sh, bool causal, int fragments = 0, bool deterministic = false) {
  const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH;
  SCOPED_TRACE(sh.describe(causal) +
               (fragments ? ", " + std::to_string(fragments) + " query fragment(s) per warp" : "") +
               (deterministic ? ", deterministic dQ" : ""));
  const FlashCase fc = ddplab::flash_test::make_flash_case(sh, causal);

  Poisoned<bf16> qkv(ddplab::gpu_test::to_bf16(fc.qkv)), dout(ddplab::gpu_test::to_bf16(fc.dout));
  Poisoned<bf16> out(int64_t{B} * S * C), dqkv(int64_t{B} * S * 3 * C);
  const int64_t dq_shares = deterministic ? cuda::key_blocks(S) : 1;
  Poisoned<float> lse(int64_t{B} * NH * S), workspace(dq_shares * B * S * C + int64_t{B} * NH * S);
  Poisoned<int32_t> lengths(sh.lengths), positions(sh.positions);
  const int32_t* len = sh.lengths.empty() ? nullptr : lengths.get();
  const int32_t* pos = sh.positions.empty() ? nullptr : positions.get();
  cuda::flash_forward_launches(emulated_launch, out.get(), lse.get(), qkv.get(), len, pos, B, S, C, NH, causal,
                               fragments);
  cuda::flash_backward_launches(emulated_launch, dqkv.get(), workspace.get(), dout.get(), qkv.get(), out.get(),
                                lse.get(), len, pos, B, S, C, NH, causal, deterministic);
  ddplab::flash_test::expect_flash_matches("flash (emulated)", sh, causal, fc, ddplab::gpu_test::to_f32(out.values()),
                                           lse.values(), ddplab::gpu_test::to_f32(dqkv.values()));
}

// S of 1, 17, 64, 100 and 130 (less than a block, one exactly, several with a partial last one); head sizes 32, 64
// and 128; one to three heads and sequences; lengths padded, 0, 1 and full, and null (all S); scores of a few hundred
// (amplitude 12) in one case. Small, because every warp-collective step (an mma.sync, an ldmatrix, a shuffle) is 32
// context switches: about 5 s of CPU.
const std::vector<FlashShape> kEmulatedShapes = {
    {1, 1, 64, 1, {1}},          {3, 17, 96, 3, {17, 5, 0}},     {2, 64, 64, 1, {}},
    {2, 100, 128, 1, {100, 63}}, {3, 130, 128, 2, {130, 1, 65}}, {2, 130, 64, 2, {0, 129}},
    {1, 130, 128, 1, {}, 12.0f}};

TEST(FlashAttentionEmulated, MatchesCpu) {
  for (const FlashShape& sh : kEmulatedShapes)
    for (bool causal : {false, true}) {
      const auto start = std::chrono::steady_clock::now();
      emulated_flash_matches_cpu(sh, causal);
      std::cout << "  (" << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s)\n";
    }
}

// The forward's other shape at head sizes <= 64, one query fragment per warp (64-query CTAs), which the benchmark sets
// beside the default two; its kernel is the one hs 128 runs (tested above), so one shape: hs 64, three query blocks
// (the last partial), padded lengths.
TEST(FlashAttentionEmulated, OneQueryFragmentPerWarpMatchesCpu) {
  for (bool causal : {false, true}) emulated_flash_matches_cpu({2, 130, 128, 2, {130, 65}}, causal, 1);
}

// The deterministic backward (--deterministic on): dQ from its key blocks' shares, summed in key-block order, where
// there are several key blocks (S 130: three, the last partial), padded lengths (a sequence of 0, one ending inside
// the second block, one full, ones ending on a block's edge) and none, at head sizes 64, 32 and 128.
TEST(FlashAttentionEmulated, DeterministicDqMatchesCpu) {
  for (const FlashShape& sh : {FlashShape{3, 130, 128, 2, {130, 1, 65}}, FlashShape{2, 130, 64, 2, {0, 129}},
                               FlashShape{2, 130, 64, 2, {128, 64}}, FlashShape{1, 130, 128, 1, {}}})
    for (bool causal : {false, true}) emulated_flash_matches_cpu(sh, causal, 0, /*deterministic=*/true);
}

// Packed rows (--batching pack): several sequences back to back in a row, each query attending only to its own
// sequence's keys up to itself. Sequences that start and end inside a block, on a block's edge, a sequence of one
// token, many short ones, one spanning three blocks, a row holding one sequence and padding after the last; both
// forward shapes, both dQ sums (the deterministic one reads only the shares of the key blocks that visited a query's
// block: the rest of its workspace is NaN).
const std::vector<FlashShape> kPackedShapes = {
    ddplab::flash_test::packed_rows({2, 130, 128, 2, {}}, {{50, 14, 66}, {1, 63, 64, 1}}),
    ddplab::flash_test::packed_rows({3, 200, 64, 1, {}}, {{20, 150, 30}, {1, 1, 1, 1, 5, 9, 3, 100, 7}, {190}}),
    ddplab::flash_test::packed_rows({2, 100, 64, 2, {}}, {{40, 60}, {10, 10, 33}})};  // heads of 32

TEST(FlashAttentionEmulated, PackedRowsMatchCpu) {
  for (const FlashShape& sh : kPackedShapes)
    for (bool deterministic : {false, true}) emulated_flash_matches_cpu(sh, /*causal=*/true, 0, deterministic);
  emulated_flash_matches_cpu(kPackedShapes[0], /*causal=*/true, 1);
}

// gpt2-small's sequence and head size (S 1024, hs 64), causal, one head of one sequence: up to sixteen key blocks a
// query block, the causal skipping and the workspace's split as the model's step has them, both ways of summing dQ.
TEST(FlashAttentionEmulated, Gpt2SequenceMatchesCpu) {
  for (bool deterministic : {false, true})
    emulated_flash_matches_cpu({1, 1024, 64, 1, {}}, /*causal=*/true, 0, deterministic);
}

}  // namespace
