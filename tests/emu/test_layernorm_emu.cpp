// LayerNorm's kernels (kernels/cuda/layernorm_kernels.cuh), their own source compiled by g++ and run by the emulation
// (cuda_emulation.h), against cpu::layernorm_forward / layernorm_backward with the GPU test's tolerances: the packed
// (16-byte) and scalar paths, rows held whole in registers and rows wider than that (their last columns read again),
// the backward's warps a block by row width, rows past the grid's warps (warps walk several), the accumulators' layout
// and the partials' fixed-order reduction, through the launch sequences layernorm.cu runs. What it cannot tell: speed,
// and coalescing.
#include "tests/emu/cuda_emulation.h"

// The kernels' dynamic shared memory, in their namespace (see DDPLAB_EMU_SHARED_MEMORY), before the kernels.
namespace ddplab::cuda {
namespace {
namespace layernorm {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace layernorm
}  // namespace
}  // namespace ddplab::cuda

#include "kernels/cuda/layernorm_kernels.cuh"

// Then the rest.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.h"  // bias_backward
#include "kernels/cpu/transformer_ops.h"
#include "tests/emu/emu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

namespace cuda = ddplab::cuda;
using bf16 = __nv_bfloat16;
using ddplab::gpu_test::AllClose;
using ddplab::gpu_test::BitwiseEqual;
using ddplab::gpu_test::device_values;
using ddplab::gpu_test::host_values;
using ddplab::gpu_test::random_vector;

using ddplab::emu::emulated_launch;
using ddplab::emu_test::DeviceLikeVector;

struct Shape {
  int N, C;
  int offset;  // elements added to the parameter pointers: 1 misaligns them (the forward's scalar path; the
               // backward stages the weight in shared memory, whatever its alignment)
};

// Rows of 768 (bf16: held whole, 8 warps a backward block; fp32: 512 columns held, 256 read again), of 1280 and 1600
// (bf16: 256 and 576 read again; 4 and 3 warps a block), of 8192 (one warp a block, 64 KB of shared memory), of 200
// and 96 (fewer packs than a lane holds), odd shapes (scalar: 128 columns held; 770 reads 642 again), misaligned
// parameters.
const std::vector<Shape> kShapes = {{1, 1, 0},     {7, 5, 0},    {33, 768, 0}, {33, 768, 1}, {9, 1280, 0},
                                    {10, 1600, 1}, {3, 8192, 0}, {70, 200, 0}, {19, 96, 0},  {33, 770, 0}};

// The emulated backward's (dinp, dweight, dbias[, dinp's column sums]), from the given starting values (it
// accumulates into all of them); the partials start as NaN, so a partial the kernel did not write shows in the result.
// dcol0 empty: no column sums asked for.
template <typename T, typename Weights>
std::vector<std::vector<float>> emulated_backward(const Shape& sh, const std::vector<float>& dinp0,
                                                  const std::vector<float>& dw0, const std::vector<float>& db0,
                                                  const std::vector<T>& dout, const std::vector<T>& inp,
                                                  const Weights& weight, const std::vector<float>& mean,
                                                  const std::vector<float>& rstd, bool accumulate = true,
                                                  const std::vector<float>& dcol0 = {}) {
  std::vector<T> dinp = device_values<T>(dinp0);
  std::vector<float> dw = dw0, db = db0, dcol = dcol0;
  std::vector<float> scratch(cuda::layernorm::backward_blocks(sh.N, sh.C) * cuda::layernorm::kMaxSums * sh.C,
                             std::numeric_limits<float>::quiet_NaN());
  const auto launch = [](auto kernel, dim3 grid, dim3 block, size_t smem, auto... args) {
    emulated_launch(kernel, grid, block, smem, args...);
  };
  cuda::layernorm_backward_launches(launch, dinp.data(), dw.data() + sh.offset, db.data() + sh.offset,
                                    dcol.empty() ? nullptr : dcol.data(), scratch.data(), dout.data(), inp.data(),
                                    weight.data() + sh.offset, mean.data(), rstd.data(), sh.N, sh.C, accumulate);
  return {host_values<T>(dinp), dw, db, dcol};
}

// The backward from the CPU forward's mean and rstd against the CPU backward.
template <typename T>
void emulated_backward_matches_cpu(const Shape& sh, const std::vector<float>& inp, const std::vector<float>& dout,
                                   const std::vector<float>& dinp0, const std::vector<float>& weight,
                                   const std::vector<float>& mean, const std::vector<float>& rstd, double rtol,
                                   double atol) {
  const std::vector<float> dw0 = random_vector(sh.C + 1, -1, 1, 16), db0 = random_vector(sh.C + 1, -1, 1, 17);
  std::vector<float> dinp = dinp0, dw = dw0, db = db0;
  ddplab::cpu::layernorm_backward(dinp.data(), dw.data() + sh.offset, db.data() + sh.offset, dout.data(), inp.data(),
                                  weight.data() + sh.offset, mean.data(), rstd.data(), sh.N, sh.C);
  const auto got =
      emulated_backward<T>(sh, dinp0, dw0, db0, device_values<T>(dout), device_values<T>(inp), weight, mean, rstd);
  EXPECT_TRUE(AllClose(got[0], dinp, rtol, atol)) << "dinp";
  EXPECT_TRUE(AllClose(got[1], dw, rtol, atol * sh.N)) << "dweight";
  EXPECT_TRUE(AllClose(got[2], db, rtol, atol * sh.N)) << "dbias";
  // With dinp's column sums: cpu::bias_backward over the dinp written.
  const std::vector<float> dcol0 = random_vector(sh.C, -1, 1, 18);
  const auto cols = emulated_backward<T>(sh, dinp0, dw0, db0, device_values<T>(dout), device_values<T>(inp), weight,
                                         mean, rstd, /*accumulate=*/true, dcol0);
  std::vector<float> want_cols = dcol0;
  ddplab::cpu::bias_backward(want_cols.data(), cols[0].data(), sh.N, sh.C);
  EXPECT_TRUE(AllClose(cols[3], want_cols, rtol, atol * sh.N)) << "dinp's column sums";
}

template <typename T>
void emulated_matches_cpu(const Shape& sh, double rtol, double atol) {
  const int N = sh.N, C = sh.C;
  SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " offset=" + std::to_string(sh.offset) +
               (std::is_same_v<T, bf16> ? " bf16" : " fp32"));
  // Mean 3 and spread 1: the two-pass variance matters.
  std::vector<float> inp = random_vector(int64_t{N} * C, 2.0f, 4.0f, 11 + N);
  std::vector<float> dout = random_vector(int64_t{N} * C, -1, 1, 14 + N);
  std::vector<float> dinp0 = random_vector(int64_t{N} * C, -1, 1, 15 + N);
  if constexpr (std::is_same_v<T, bf16>) {
    inp = ddplab::gpu_test::round_bf16(inp);
    dout = ddplab::gpu_test::round_bf16(dout);
    dinp0 = ddplab::gpu_test::round_bf16(dinp0);
  }
  // Aligned as cudaMalloc's (256 bytes): offset 0 takes the packed path, whose bf16 weights are read 32 bytes at a
  // time.
  const std::vector<float> w0 = random_vector(C + 1, 0.5f, 1.5f, 12 + C), b0 = random_vector(C + 1, -1, 1, 13 + C);
  const DeviceLikeVector<float> weight(w0.begin(), w0.end()), bias(b0.begin(), b0.end());
  const float* w = weight.data() + sh.offset;
  const float* b = bias.data() + sh.offset;

  std::vector<float> out(int64_t{N} * C), mean(N), rstd(N);
  ddplab::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w, b, N, C);
  const std::vector<T> d_inp = device_values<T>(inp), d_dout = device_values<T>(dout);
  std::vector<T> d_out(int64_t{N} * C);
  std::vector<float> d_mean(N, std::numeric_limits<float>::quiet_NaN()), d_rstd(N, d_mean[0]);
  cuda::layernorm_forward_launches(emulated_launch, d_out.data(), d_mean.data(), d_rstd.data(), d_inp.data(), w, b, N,
                                   C);
  EXPECT_TRUE(AllClose(host_values<T>(d_out), out, rtol, atol)) << "out";
  EXPECT_TRUE(AllClose(d_mean, mean, 1e-5, 1e-6)) << "mean";
  EXPECT_TRUE(AllClose(d_rstd, rstd, 1e-5, 0)) << "rstd";

  const std::vector<float> dw0 = random_vector(C + 1, -1, 1, 16), db0 = random_vector(C + 1, -1, 1, 17);
  std::vector<float> dinp = dinp0, dw = dw0, db = db0;
  ddplab::cpu::layernorm_backward(dinp.data(), dw.data() + sh.offset, db.data() + sh.offset, dout.data(), inp.data(), w,
                                  mean.data(), rstd.data(), N, C);
  // The emulated forward's own mean and rstd, as a training step would pass them.
  const auto got = emulated_backward<T>(sh, dinp0, dw0, db0, d_dout, d_inp, weight, d_mean, d_rstd);
  EXPECT_TRUE(AllClose(got[0], dinp, rtol, atol)) << "dinp";
  EXPECT_TRUE(AllClose(got[1], dw, rtol, atol * N)) << "dweight";
  EXPECT_TRUE(AllClose(got[2], db, rtol, atol * N)) << "dbias";
  const auto again = emulated_backward<T>(sh, dinp0, dw0, db0, d_dout, d_inp, weight, d_mean, d_rstd);
  EXPECT_TRUE(BitwiseEqual(again[1], got[1]) && BitwiseEqual(again[2], got[2])) << "a second run";

  // Written over (a discarded gradient): NaN before, this batch's sums alone after; dinp still accumulates.
  std::vector<float> dinp_over = dinp0, dw_over(C + 1), db_over(C + 1);
  ddplab::cpu::layernorm_backward(dinp_over.data(), dw_over.data() + sh.offset, db_over.data() + sh.offset, dout.data(),
                                  inp.data(), w, mean.data(), rstd.data(), N, C, /*accumulate=*/false);
  const std::vector<float> nan(C + 1, std::numeric_limits<float>::quiet_NaN());
  const auto over = emulated_backward<T>(sh, dinp0, nan, nan, d_dout, d_inp, weight, d_mean, d_rstd, false);
  EXPECT_TRUE(AllClose(over[0], dinp_over, rtol, atol)) << "dinp, written over";
  const auto params = [&](const std::vector<float>& v) {
    return std::vector<float>(v.begin() + sh.offset, v.begin() + sh.offset + C);
  };
  EXPECT_TRUE(AllClose(params(over[1]), params(dw_over), rtol, atol * N)) << "dweight, written over";
  EXPECT_TRUE(AllClose(params(over[2]), params(db_over), rtol, atol * N)) << "dbias, written over";

  // dinp's column sums in the same pass: cpu::bias_backward over the dinp it wrote (rounded to T), added and written
  // over; the other outputs as without them.
  const std::vector<float> dcol0 = random_vector(C, -1, 1, 18);
  for (const bool accumulate : {true, false}) {
    SCOPED_TRACE(accumulate ? "column sums added" : "column sums written over");
    const std::vector<float> start = accumulate ? dcol0 : nan;
    const auto cols = emulated_backward<T>(sh, dinp0, dw0, db0, d_dout, d_inp, weight, d_mean, d_rstd, accumulate,
                                           std::vector<float>(start.begin(), start.begin() + C));
    std::vector<float> want_cols = accumulate ? dcol0 : std::vector<float>(C, 0.0f);
    ddplab::cpu::bias_backward(want_cols.data(), cols[0].data(), N, C);
    EXPECT_TRUE(AllClose(cols[3], want_cols, rtol, atol * N)) << "dinp's column sums";
    EXPECT_TRUE(BitwiseEqual(cols[0], got[0])) << "dinp, with the column sums";
    EXPECT_TRUE(BitwiseEqual(params(cols[1]), params(accumulate ? got[1] : over[1])) &&
                BitwiseEqual(params(cols[2]), params(accumulate ? got[2] : over[2])))
        << "dweight, dbias";
  }
}

TEST(LayerNormEmulated, Fp32MatchesCpu) {
  for (const Shape& sh : kShapes) emulated_matches_cpu<float>(sh, 1e-5, 1e-5);
}

TEST(LayerNormEmulated, Bf16MatchesCpu) {
  for (const Shape& sh : kShapes) emulated_matches_cpu<bf16>(sh, 8e-3, 8e-3);
}

// 4105 rows: more than the grid has warps (2048), so warps carry their accumulators, dinp's column sums among them,
// over several rows: rows of 8 (8 warps a block) and of 776 (7: a grid whose stride is 7 warps a block, not 8).
TEST(LayerNormEmulated, BackwardWarpsWalkSeveralRows) {
  for (const Shape sh : {Shape{4105, 8, 0}, Shape{4105, 776, 0}}) {
    SCOPED_TRACE("C=" + std::to_string(sh.C));
    const std::vector<float> inp = random_vector(int64_t{sh.N} * sh.C, 2.0f, 4.0f, 1);
    const std::vector<float> dout = random_vector(int64_t{sh.N} * sh.C, -1, 1, 2);
    const std::vector<float> dinp0 = random_vector(int64_t{sh.N} * sh.C, -1, 1, 3);
    const std::vector<float> weight = random_vector(sh.C, 0.5f, 1.5f, 4), bias = random_vector(sh.C, -1, 1, 5);
    std::vector<float> out(inp.size()), mean(sh.N), rstd(sh.N);
    ddplab::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), sh.N,
                                   sh.C);
    const int64_t grid_warps =
        int64_t{cuda::layernorm::backward_blocks(sh.N, sh.C)} * cuda::layernorm::backward_warps(sh.C);
    ASSERT_GT(sh.N, 2 * grid_warps);
    emulated_backward_matches_cpu<float>(sh, inp, dout, dinp0, weight, mean, rstd, 1e-5, 1e-5);
  }
}

// The backward's warps a block: 8 while their accumulators (C floats per sum, 2 or 3 sums) fit 48 KB (72 with the
// third sum), fewer for wider rows, at least one; the staged weight's C floats on top; and the grid within its 2048
// warps.
TEST(LayerNormEmulated, BackwardWarpsFitTheSharedMemory) {
  using cuda::layernorm::backward_blocks;
  using cuda::layernorm::backward_smem_bytes;
  using cuda::layernorm::backward_warps;
  EXPECT_EQ(backward_warps(768), 8);  // gpt2-small: 48 KB
  EXPECT_EQ(backward_warps(1024), 6);
  EXPECT_EQ(backward_warps(1600), 3);
  EXPECT_EQ(backward_warps(6144), 1);
  EXPECT_EQ(backward_warps(8192), 1);  // 64 KB (96 with three sums), +32 staged: asked for at launch
  EXPECT_EQ(backward_warps(1), 8);
  for (const int C : {1, 96, 768, 1024, 1600, 6144}) {
    const size_t weight = sizeof(float) * C;
    EXPECT_LE(backward_smem_bytes(C, 2), 48 * 1024 + weight) << C;
    EXPECT_LE(backward_smem_bytes(C, 3), 72 * 1024 + weight) << C;  // with dinp's column sums
  }
  EXPECT_EQ(backward_blocks(8192, 768), 256);  // 4 rows a warp
  EXPECT_EQ(backward_blocks(33, 768), 5);      // a warp a row
  EXPECT_EQ(backward_blocks(8192, 1600), 682);
}

// A launch past the GPU's shared memory is refused naming the kernel (launch_on): its name read from the symbols nvcc
// gives these kernels, in an unnamed namespace as they are, templated or not; a symbol that does not demangle as
// it is.
TEST(LayerNormEmulated, RefusedKernelsAreNamedAsPeopleReadThem) {
  using cuda::detail::readable_kernel_name;
  EXPECT_EQ(readable_kernel_name("_ZN6ddplab4cuda45_GLOBAL__N__ef469ab7_12_layernorm_cu_63cdbeeb9layernorm25layernorm_"
                                 "backward_kernelIfLi4ELb1EEEvPT_PfPKS4_S8_PKfSA_SA_iii"),
            "layernorm_backward_kernel<float, 4, true>");
  EXPECT_EQ(readable_kernel_name("_ZN6ddplab4cuda51_GLOBAL__N__a401abcc_18_flash_attention_cu_cb1410ad25flash_"
                                 "attention_dq_kernelEP13__nv_bfloat16PKfPKiS7_iibll"),
            "flash_attention_dq_kernel");
  EXPECT_EQ(readable_kernel_name("copy_kernel"), "copy_kernel");
  EXPECT_EQ(readable_kernel_name("i"), "i");  // a C name that would demangle as a type
}

// The accumulators' layout is a permutation of the row's columns that puts the same float4 of consecutive packs next
// to each other (conflict-free across a warp), and acc_column, which the block's final sum walks by, its inverse.
TEST(LayerNormEmulated, AccumulatorLayoutIsAPermutation) {
  using cuda::layernorm::acc_column;
  using cuda::layernorm::acc_index;
  const auto check = [](int C, auto index, auto column) {
    std::vector<int> seen(C, 0);
    for (int c = 0; c < C; ++c) {
      const int at = index(C, c);
      ASSERT_TRUE(at >= 0 && at < C) << "C=" << C << " c=" << c;
      ++seen[at];
      EXPECT_EQ(column(C, at), c) << "C=" << C << ": acc_column inverts acc_index at column " << c;
    }
    for (int at = 0; at < C; ++at) EXPECT_EQ(seen[at], 1) << "C=" << C << " slot " << at;
  };
  for (const int C : {8, 96, 200, 768, 1280}) {
    check(
        C, [](int n, int c) { return acc_index<8>(n, c); }, [](int n, int p) { return acc_column<8>(n, p); });
    check(
        C, [](int n, int c) { return acc_index<4>(n, c); }, [](int n, int p) { return acc_column<4>(n, p); });
    check(
        C, [](int n, int c) { return acc_index<1>(n, c); }, [](int n, int p) { return acc_column<1>(n, p); });
  }
  EXPECT_EQ(acc_index<8>(768, 8), 4);    // pack 1's first float4 right after pack 0's
  EXPECT_EQ(acc_index<8>(768, 4), 384);  // pack 0's second float4: the second run
  EXPECT_EQ(acc_index<4>(768, 5), 5);    // fp32: a pack is one float4, laid out plainly
}

}  // namespace
