// The PTX primitives of kernels/cuda/mma.cuh as the CPU emulation runs them (tests/emu/cuda_emulation.h): mma.sync
// m16n8k16 against a plain loop with fragments built from the PTX ISA's element tables (written out here from the ISA's
// a_i / b_i / c_i formulas, independently of the emulation), ldmatrix with and without .trans against the registers
// those tables give, the chain a kernel uses (D fragments rounded into the A fragments of the next product),
// cp.async's groups, and ex2.approx's edges. A transposed or shifted layout anywhere fails these; the kernels' own
// test (test_flash_attention_emu) only sees layouts through whole attention results.
#include "tests/emu/cuda_emulation.h"

namespace ddplab::cuda {
namespace {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace
}  // namespace ddplab::cuda

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/mma.cuh"

namespace ddplab::cuda {
namespace {

// The PTX ISA's tables for mma.m16n8k16 with .bf16 operands, element i of the lane's fragment (two per register,
// a_{2r} in the lower half of register r). g = lane / 4, q = lane % 4.
struct RowCol {
  int row, col;
};
RowCol isa_a(int lane, int i) {  // a0..a7: rows g (a0, a1, a4, a5) or g + 8; cols 2q + (i & 1), + 8 for i >= 4
  const int g = lane >> 2, q = lane % 4;
  return {(i == 2 || i == 3 || i == 6 || i == 7) ? g + 8 : g, q * 2 + (i & 1) + (i >= 4 ? 8 : 0)};
}
RowCol isa_b(int lane, int i) {  // b0..b3: rows 2q + (i & 1), + 8 for i >= 2; col g
  const int g = lane >> 2, q = lane % 4;
  return {q * 2 + (i & 1) + (i >= 2 ? 8 : 0), g};
}
RowCol isa_c(int lane, int i) {  // c0..c3: row g, + 8 for i >= 2; cols 2q + (i & 1)
  const int g = lane >> 2, q = lane % 4;
  return {i >= 2 ? g + 8 : g, q * 2 + (i & 1)};
}

uint16_t bf16_bits(float x) {  // x must be exact in bf16 (the tests' values are small integers and halves)
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<uint16_t>(u >> 16);
}
uint32_t pack_bits(float lo, float hi) { return uint32_t{bf16_bits(lo)} | uint32_t{bf16_bits(hi)} << 16; }

using ddplab::emu::emulated_launch;

// d = a b + c for one warp with every fragment built from the ISA tables: a [16][16], b [16][8] (k x n), c and d
// [16][8], row-major.
__global__ void mma_from_tables_kernel(float* d, const float* a, const float* b, const float* c) {
  const int lane = threadIdx.x;
  uint32_t a_reg[4], b_reg[2];
  float acc[4];
  for (int r = 0; r < 4; ++r) {
    const RowCol lo = isa_a(lane, 2 * r), hi = isa_a(lane, 2 * r + 1);
    a_reg[r] = pack_bits(a[lo.row * 16 + lo.col], a[hi.row * 16 + hi.col]);
  }
  for (int r = 0; r < 2; ++r) {
    const RowCol lo = isa_b(lane, 2 * r), hi = isa_b(lane, 2 * r + 1);
    b_reg[r] = pack_bits(b[lo.row * 8 + lo.col], b[hi.row * 8 + hi.col]);
  }
  for (int i = 0; i < 4; ++i) acc[i] = c[isa_c(lane, i).row * 8 + isa_c(lane, i).col];
  ptx::mma_bf16_16816(acc, a_reg, b_reg);
  for (int i = 0; i < 4; ++i) d[isa_c(lane, i).row * 8 + isa_c(lane, i).col] = acc[i];
}

// Small integers and halves: every product and sum below is exact in fp32, so the check is equality. No symmetry, so
// a transposed operand or result changes the product.
std::vector<float> test_values(int rows, int cols, int salt) {
  std::vector<float> v(rows * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) v[r * cols + c] = static_cast<float>((r * 7 + c * 3 + salt) % 11 - 5) * 0.5f;
  return v;
}

TEST(MmaEmulated, ProductFromIsaTablesMatchesLoop) {
  const std::vector<float> a = test_values(16, 16, 1), b = test_values(16, 8, 4), c = test_values(16, 8, 9);
  std::vector<float> d(16 * 8, -1.0f);
  emulated_launch(mma_from_tables_kernel, dim3(1), dim3(32), size_t{0}, d.data(), a.data(), b.data(), c.data());
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float want = c[m * 8 + n];
      for (int k = 0; k < 16; ++k) want += a[m * 16 + k] * b[k * 8 + n];
      EXPECT_EQ(d[m * 8 + n], want) << "row " << m << " col " << n;
    }
}

// ldmatrix: a 16x16 bf16 tile (row stride 24 elements: padded, as the kernels' tiles are) loaded with the address
// recipe for an A fragment (matrices: rows 0-7 / 8-15 x cols 0-7, then cols 8-15), and transposed with the recipe
// for two B fragments of a [k][n] tile (matrices: k 0-7 / 8-15 x n 0-7, then n 8-15). regs [32][4] per variant.
constexpr int kLd = 24;
__global__ void ldmatrix_kernel(uint32_t* regs, uint32_t* regs_trans, const uint16_t* tile) {
  uint16_t* const s = reinterpret_cast<uint16_t*>(smem);
  const int lane = threadIdx.x;
  for (int e = lane; e < 16 * 16; e += 32) s[(e / 16) * kLd + e % 16] = tile[e];
  __syncwarp();
  const int matrix = lane / 8, row = lane % 8;
  uint32_t r[4];
  ptx::ldmatrix_x4(r, s + (row + 8 * (matrix % 2)) * kLd + 8 * (matrix / 2));
  for (int i = 0; i < 4; ++i) regs[lane * 4 + i] = r[i];
  ptx::ldmatrix_x4_trans(r, s + (row + 8 * (matrix % 2)) * kLd + 8 * (matrix / 2));
  for (int i = 0; i < 4; ++i) regs_trans[lane * 4 + i] = r[i];
}

TEST(MmaEmulated, LdmatrixGivesIsaFragments) {
  std::vector<uint16_t> tile(256);
  for (int e = 0; e < 256; ++e) tile[e] = static_cast<uint16_t>(e);  // the bits name the element: (row, col)
  std::vector<uint32_t> regs(32 * 4), regs_trans(32 * 4);
  emulated_launch(ldmatrix_kernel, dim3(1), dim3(32), size_t{16 * kLd * 2}, regs.data(), regs_trans.data(),
                  tile.data());
  const auto element = [&](int row, int col) { return uint32_t{tile[row * 16 + col]}; };
  for (int lane = 0; lane < 32; ++lane) {
    // Without .trans: the tile as the A fragment of a row-major 16x16 operand.
    for (int r = 0; r < 4; ++r) {
      const RowCol lo = isa_a(lane, 2 * r), hi = isa_a(lane, 2 * r + 1);
      EXPECT_EQ(regs[lane * 4 + r], element(lo.row, lo.col) | element(hi.row, hi.col) << 16)
          << "lane " << lane << " register " << r;
    }
    // With .trans: the tile as [k][n] storage of B, registers 0-1 the fragment of n 0-7, 2-3 of n 8-15.
    for (int r = 0; r < 4; ++r) {
      const int n_tile = r / 2, b_reg = r % 2;
      const RowCol lo = isa_b(lane, 2 * b_reg), hi = isa_b(lane, 2 * b_reg + 1);
      EXPECT_EQ(regs_trans[lane * 4 + r],
                element(lo.row, lo.col + 8 * n_tile) | element(hi.row, hi.col + 8 * n_tile) << 16)
          << "lane " << lane << " register " << r << " (.trans)";
    }
  }
}

// The attention chain on one warp: S = Q K^T (Q [16][32], K [16][32] as n x k storage: B fragments by ldmatrix
// without .trans), then O = S V with S's D fragments rounded into A fragments and V [16][32] as k x n storage (B
// fragments by ldmatrix .trans). o [16][32] row-major.
constexpr int kChainD = 32, kChainLd = kChainD + 8;
__global__ void attention_chain_kernel(float* o, const uint16_t* q, const uint16_t* k, const uint16_t* v) {
  uint16_t* const q_s = reinterpret_cast<uint16_t*>(smem);
  uint16_t* const k_s = q_s + 16 * kChainLd;
  uint16_t* const v_s = k_s + 16 * kChainLd;
  const int lane = threadIdx.x;
  for (int e = lane; e < 16 * kChainD; e += 32) {
    const int at = (e / kChainD) * kChainLd + e % kChainD;
    q_s[at] = q[e];
    k_s[at] = k[e];
    v_s[at] = v[e];
  }
  __syncwarp();
  const int matrix = lane / 8, row = lane % 8;
  float s[2][4] = {};  // two n tiles of 8 keys
  for (int kk = 0; kk < kChainD / 16; ++kk) {
    uint32_t a[4], b[4];
    ptx::ldmatrix_x4(a, q_s + (row + 8 * (matrix % 2)) * kChainLd + kk * 16 + 8 * (matrix / 2));
    // K rows are keys (n), cols dims (k): matrices keys 0-7 x dims lo, keys 0-7 x dims hi, keys 8-15 x lo, x hi.
    ptx::ldmatrix_x4(b, k_s + (row + 8 * (matrix / 2)) * kChainLd + kk * 16 + 8 * (matrix % 2));
    const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    ptx::mma_bf16_16816(s[0], a, b0);
    ptx::mma_bf16_16816(s[1], a, b1);
  }
  const uint32_t p[4] = {ptx::pack_bf16x2(s[0][0], s[0][1]), ptx::pack_bf16x2(s[0][2], s[0][3]),
                         ptx::pack_bf16x2(s[1][0], s[1][1]), ptx::pack_bf16x2(s[1][2], s[1][3])};
  for (int n0 = 0; n0 < kChainD; n0 += 16) {
    // V rows are keys (k), cols dims (n): matrices keys 0-7 x dims n0.., keys 8-15 x n0.., then dims n0 + 8.
    uint32_t b[4];
    ptx::ldmatrix_x4_trans(b, v_s + (row + 8 * (matrix % 2)) * kChainLd + n0 + 8 * (matrix / 2));
    const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    float acc0[4] = {}, acc1[4] = {};
    ptx::mma_bf16_16816(acc0, p, b0);
    ptx::mma_bf16_16816(acc1, p, b1);
    for (int i = 0; i < 4; ++i) {
      const RowCol at = isa_c(lane, i);
      o[at.row * kChainD + n0 + at.col] = acc0[i];
      o[at.row * kChainD + n0 + 8 + at.col] = acc1[i];
    }
  }
}

TEST(MmaEmulated, ScoresStayInRegistersForTheNextProduct) {
  // Values in {-1, -0.5, 0, 0.5, 1} over 32 dims: every score is a multiple of 0.25 below 32, exact in bf16.
  const auto small = [](int n, int salt) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + i / 3 + salt) % 5 - 2) * 0.5f;
    return v;
  };
  const std::vector<float> q = small(16 * kChainD, 1), k = small(16 * kChainD, 3), v = small(16 * kChainD, 4);
  std::vector<uint16_t> qb(q.size()), kb(k.size()), vb(v.size());
  for (size_t i = 0; i < q.size(); ++i) qb[i] = bf16_bits(q[i]), kb[i] = bf16_bits(k[i]), vb[i] = bf16_bits(v[i]);
  std::vector<float> o(16 * kChainD, -1.0f);
  emulated_launch(attention_chain_kernel, dim3(1), dim3(32), size_t{3 * 16 * kChainLd * 2}, o.data(), qb.data(),
                  kb.data(), vb.data());
  for (int i = 0; i < 16; ++i)
    for (int d = 0; d < kChainD; ++d) {
      double want = 0;
      for (int j = 0; j < 16; ++j) {
        double s = 0;
        for (int e = 0; e < kChainD; ++e) s += double{q[i * kChainD + e]} * k[j * kChainD + e];
        want += s * v[j * kChainD + d];
      }
      EXPECT_EQ(o[i * kChainD + d], want) << "row " << i << " col " << d;
    }
}

// cp.async: two groups per thread (a copy, then a zero fill), retired by wait_group in order. seen [32][3]: a float of
// the destination after wait<1> (group 2 not yet waited for: the emulation has not landed it, the poison shows),
// then both after wait<0>.
__global__ void cp_async_kernel(float* seen, const float* src) {
  float* const s = reinterpret_cast<float*>(smem);
  const int lane = threadIdx.x;
  ptx::cp_async_16(s + 4 * lane, src + 4 * lane, true);
  ptx::cp_async_commit();
  ptx::cp_async_16(s + 128 + 4 * lane, src, false);
  ptx::cp_async_commit();
  ptx::cp_async_wait<1>();
  const float pending = s[128 + 4 * lane];
  ptx::cp_async_wait<0>();
  seen[lane * 3 + 0] = s[4 * lane + 3];
  seen[lane * 3 + 1] = pending;
  seen[lane * 3 + 2] = s[128 + 4 * lane];
}

TEST(MmaEmulated, CpAsyncLandsAtItsWait) {
  std::vector<float> src(128), seen(32 * 3);
  for (int i = 0; i < 128; ++i) src[i] = static_cast<float>(i);
  emulated_launch(cp_async_kernel, dim3(1), dim3(32), size_t{256 * 4}, seen.data(), src.data());
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(seen[lane * 3 + 0], 4 * lane + 3);
    EXPECT_TRUE(std::isnan(seen[lane * 3 + 1])) << "a copy landed before its group was waited for";
    EXPECT_EQ(seen[lane * 3 + 2], 0.0f);
  }
}

// ex2.approx.ftz.f32 as the PTX ISA defines it at the edges the kernels rely on: 2^-inf is +0 (a masked score's
// weight), a subnormal result or input is flushed to 0, and exact powers of two come out exact.
TEST(MmaEmulated, Exp2ApproxFlushesSubnormals) {
  EXPECT_EQ(ptx::exp2_approx(0.0f), 1.0f);
  EXPECT_EQ(ptx::exp2_approx(3.0f), 8.0f);
  EXPECT_EQ(ptx::exp2_approx(-126.0f), std::ldexp(1.0f, -126));  // the smallest normal float
  EXPECT_EQ(ptx::exp2_approx(-127.0f), 0.0f);                    // subnormal: flushed
  EXPECT_EQ(ptx::exp2_approx(std::ldexp(1.0f, -140)), 1.0f);     // a subnormal input counts as 0
  const float masked = ptx::exp2_approx(-INFINITY);
  EXPECT_EQ(masked, 0.0f);
  EXPECT_FALSE(std::signbit(masked));
  EXPECT_TRUE(std::isnan(ptx::exp2_approx(NAN)));
}

}  // namespace
}  // namespace ddplab::cuda
