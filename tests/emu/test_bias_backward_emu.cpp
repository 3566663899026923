// The bias gradient's kernels (kernels/cuda/bias_backward_kernels.cuh), their own source compiled by g++ and run by
// the emulation (cuda_emulation.h), against cpu::bias_backward: the two-pass split of the rows, the packed (16-byte)
// and scalar column paths, the tail rows the unrolled loop leaves, and the single-row-block path that adds to dbias
// itself, through the launch sequence gemm.cu runs. What it cannot tell: speed, and coalescing.
#include "tests/emu/cuda_emulation.h"

// The kernels' dynamic shared memory, in their namespace (see DDPLAB_EMU_SHARED_MEMORY), before the kernels.
namespace ddplab::cuda {
namespace {
namespace bias_grad {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace bias_grad
}  // namespace
}  // namespace ddplab::cuda

#include "kernels/cuda/bias_backward_kernels.cuh"

// Then the rest.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/float16.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

namespace cuda = ddplab::cuda;
using bf16 = __nv_bfloat16;
using ddplab::gpu_test::AllClose;
using ddplab::gpu_test::BitwiseEqual;
using ddplab::gpu_test::random_vector;

using ddplab::emu::emulated_launch;

struct Case {
  int B, OC;
  int64_t capacity;  // partial floats available (the GEMM context's workspace)
  int offset;        // elements dout starts past a 16-byte boundary: 0 packed (when OC allows), else scalar
};

// dbias (from dbias0: it accumulates, or is written over) after the emulated launches; the partials start as NaN,
// so a partial that pass 1 did not write shows in the result.
template <typename T>
std::vector<float> emulated_bias_backward(const Case& c, const std::vector<float>& dbias0,
                                          const std::vector<float>& dout, bool accumulate = true) {
  std::vector<T> d(dout.size() + c.offset + 8);
  for (size_t i = 0; i < dout.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>)
      d[c.offset + i] = ddplab::gpu_test::bf16_from_bits(ddplab::float16::f32_to_bf16(dout[i]));
    else
      d[c.offset + i] = dout[i];
  }
  std::vector<float> dbias = dbias0;
  std::vector<float> partial(static_cast<size_t>(c.capacity) + 1, std::numeric_limits<float>::quiet_NaN());
  // The vector's storage is at least 16-byte aligned (operator new), so offset 0 is a 16-byte boundary.
  cuda::bias_backward_launches(emulated_launch, dbias.data(), partial.data(), c.capacity, d.data() + c.offset, c.B,
                               c.OC, accumulate);
  return dbias;
}

template <typename T>
void emulated_matches_cpu(const Case& c) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " OC=" + std::to_string(c.OC) + " capacity=" + std::to_string(c.capacity) +
               " offset=" + std::to_string(c.offset) + (std::is_same_v<T, bf16> ? " bf16" : " fp32"));
  std::vector<float> dout = random_vector(int64_t{c.B} * c.OC, -1, 1, 7 + c.B);
  if constexpr (std::is_same_v<T, bf16>) dout = ddplab::gpu_test::round_bf16(dout);
  const std::vector<float> dbias0 = random_vector(c.OC, -1, 1, 11 + c.OC);
  std::vector<float> want = dbias0;
  ddplab::cpu::bias_backward(want.data(), dout.data(), c.B, c.OC);
  const std::vector<float> got = emulated_bias_backward<T>(c, dbias0, dout);
  EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-6 * c.B));
  EXPECT_TRUE(BitwiseEqual(emulated_bias_backward<T>(c, dbias0, dout), got)) << "a second run";
  // Written over (a discarded gradient): NaN before, the sums alone after.
  std::vector<float> fresh(c.OC, 0.0f);
  ddplab::cpu::bias_backward(fresh.data(), dout.data(), c.B, c.OC, /*accumulate=*/false);
  const std::vector<float> nan(c.OC, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(AllClose(emulated_bias_backward<T>(c, nan, dout, /*accumulate=*/false), fresh, 1e-5, 1e-6 * c.B))
      << "written over";
}

// Row blocks of the full kTargetBlocks split (capacity ample) and of a capacity-bound one; one row block (adds to
// dbias in pass 1); rows not a multiple of the unrolled step; packed and scalar columns, a partial column tile.
const std::vector<Case> kCases = {
    {200, 128, 1 << 20, 0},  // packed: fp32 one full column tile, bf16 one half-used tile; 7 row blocks
    {100, 264, 1 << 20, 0},  // bf16 packed: 2 column tiles, the second partial
    {70, 37, 1 << 20, 0},    // scalar (OC not a multiple of a pack)
    {333, 64, 1 << 20, 1},   // unaligned dout: scalar
    {20, 48, 1 << 20, 0},    // one row block
    {300, 40, 80, 0},        // capacity for two row blocks only
    {1, 1, 0, 0},            // the smallest
};

TEST(BiasBackwardEmulated, Fp32MatchesCpu) {
  for (const Case& c : kCases) emulated_matches_cpu<float>(c);
}

TEST(BiasBackwardEmulated, Bf16MatchesCpu) {
  for (const Case& c : kCases) emulated_matches_cpu<bf16>(c);
}

// The grid is the launch's only choice, and it depends on the shape and the capacity, not the device: what makes the
// result the same bits on every run.
TEST(BiasBackwardEmulated, GridDependsOnShapeOnly) {
  using cuda::bias_grad::plan_grid;
  const auto g = plan_grid(8192, 768, 8, true, 1 << 20);
  EXPECT_EQ(g.col_blocks, 3);
  EXPECT_EQ(g.row_blocks, 64);  // sqrt(B / 2): pass 2 walks 64 partials, pass 1 rows of 128 (4 rounds each)
  EXPECT_EQ(g.rows_per_block, 128);
  EXPECT_EQ(plan_grid(8192, 50304, 8, true, 1 << 30).row_blocks, 5);  // the wide head: its column tiles fill the GPU
  EXPECT_LE(int64_t{g.row_blocks} * 768, 1 << 20);
  EXPECT_GE(int64_t{g.row_blocks} * g.rows_per_block, 8192);
  EXPECT_LT(int64_t{g.row_blocks - 1} * g.rows_per_block, 8192);  // no empty row block
  const auto direct = plan_grid(8192, 768, 8, true, 768);  // room for one partial row only: pass 1 adds itself
  EXPECT_EQ(direct.row_blocks, 1);
}

}  // namespace
