// The sequence kernels (kernels/cuda/sequence_kernels.cuh), their own source compiled by g++ and run on host threads
// (cuda_emulation.h), against the CPU (kernels/cpu/transformer_ops.h): the classify head's mean pool and its
// backward, the LM head's next-token targets, and the padded rows zeroed after cuDNN's attention. Lengths of 0, 1, a
// few and S, and none (every sequence S long); grids smaller than the data, so that each grid-stride loop and the
// pool's loop over sequences (blockIdx.y) go round more than once. What it cannot tell: speed.
// clang-format off
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with
#include "kernels/cuda/sequence_kernels.cuh"
// clang-format on
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/transformer_ops.h"
#include "kernels/float16.h"
#include "tests/emu/emu_test_util.h"

namespace {

using ddplab::emu_test::bits;
using ddplab::emu_test::normal_values;

namespace seq = ddplab::cuda::sequence;
using ddplab::emu::emulate_launch;
using bf16 = __nv_bfloat16;

constexpr int kB = 6, kS = 9, kC = 70;  // C not a multiple of the block: the column loop's tail
const std::vector<int32_t> kLengths = {0, 1, 4, 9, 2, 9};
const dim3 kBlock(32);

// The lengths as the kernels take them: the list, or null (every sequence S long).
const int32_t* lengths_or_null(bool given) { return given ? kLengths.data() : nullptr; }

// Same order of additions as the CPU (each column walked down its valid rows): the fp32 pool is bit for bit the CPU's.
TEST(SequenceEmulated, MeanPoolIsTheCpusBitForBit) {
  const std::vector<float> x = normal_values(int64_t{kB} * kS * kC, 1), dout = normal_values(int64_t{kB} * kC, 2);
  for (bool given : {true, false}) {
    SCOPED_TRACE(given ? "with lengths" : "every sequence S long");
    const int32_t* lengths = lengths_or_null(given);
    std::vector<float> out(kB * kC, -1.0f), want(kB * kC, -2.0f);
    emulate_launch(dim3(2, 4), kBlock, 0, seq::mean_pool_forward_kernel<float>, out.data(), x.data(), lengths, kB, kS,
                   kC);
    ddplab::cpu::mean_pool_forward(want.data(), x.data(), lengths, kB, kS, kC);
    for (int i = 0; i < kB * kC; ++i) EXPECT_EQ(bits(out[i]), bits(want[i])) << "out[" << i << "]";

    std::vector<float> dwant(x.size(), -2.0f);
    ddplab::cpu::mean_pool_backward(dwant.data(), dout.data(), lengths, kB, kS, kC);
    // A warp per row: one warp per block, and the launcher's 8 per block.
    for (const dim3 block : {kBlock, dim3(256)}) {
      std::vector<float> dinp(x.size(), -1.0f);
      emulate_launch(dim3(5), block, 0, seq::mean_pool_backward_kernel<float>, dinp.data(), dout.data(), lengths, kB,
                     kS, kC);
      for (size_t i = 0; i < x.size(); ++i)
        EXPECT_EQ(bits(dinp[i]), bits(dwant[i])) << "dinp[" << i << "], block " << block.x;
    }
  }
}

// bf16 activations: the fp32 arithmetic of the CPU's float pool on the same (widened) values, rounded once to nearest
// even, as the CPU wire rounds.
TEST(SequenceEmulated, MeanPoolInBf16RoundsTheFp32Result) {
  using ddplab::float16::Format;
  std::vector<float> x = normal_values(int64_t{kB} * kS * kC, 3), dout = normal_values(int64_t{kB} * kC, 4);
  for (float& v : x) v = ddplab::float16::to_f32(Format::kBf16, ddplab::float16::from_f32(Format::kBf16, v));
  for (float& v : dout) v = ddplab::float16::to_f32(Format::kBf16, ddplab::float16::from_f32(Format::kBf16, v));
  std::vector<bf16> x16(x.size()), dout16(dout.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = __float2bfloat16_rn(x[i]);
  for (size_t i = 0; i < dout.size(); ++i) dout16[i] = __float2bfloat16_rn(dout[i]);

  std::vector<bf16> out(kB * kC);
  std::vector<float> want(kB * kC);
  emulate_launch(dim3(2, 4), kBlock, 0, seq::mean_pool_forward_kernel<bf16>, out.data(), x16.data(), kLengths.data(),
                 kB, kS, kC);
  ddplab::cpu::mean_pool_forward(want.data(), x.data(), kLengths.data(), kB, kS, kC);
  for (int i = 0; i < kB * kC; ++i)
    EXPECT_EQ(bits(out[i]), ddplab::float16::from_f32(Format::kBf16, want[i])) << "out[" << i << "]";

  std::vector<bf16> dinp(x.size());
  std::vector<float> dwant(x.size());
  emulate_launch(dim3(5), kBlock, 0, seq::mean_pool_backward_kernel<bf16>, dinp.data(), dout16.data(),
                 kLengths.data(), kB, kS, kC);
  ddplab::cpu::mean_pool_backward(dwant.data(), dout.data(), kLengths.data(), kB, kS, kC);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(bits(dinp[i]), ddplab::float16::from_f32(Format::kBf16, dwant[i])) << "dinp[" << i << "]";
}

TEST(SequenceEmulated, NextTokenTargetsAreTheCpus) {
  std::vector<int32_t> tokens(kB * kS);
  for (int i = 0; i < kB * kS; ++i) tokens[i] = 100 + i;
  for (bool given : {true, false}) {
    SCOPED_TRACE(given ? "with lengths" : "every sequence S long");
    std::vector<int32_t> targets(kB * kS, 7), want(kB * kS, 8);
    emulate_launch(dim3(1), kBlock, 0, seq::next_token_targets_kernel, targets.data(), tokens.data(),
                   lengths_or_null(given), kB, kS);
    ddplab::cpu::next_token_targets(want.data(), tokens.data(), lengths_or_null(given), kB, kS);
    EXPECT_EQ(targets, want);
  }
}

// Every row past its sequence's length zeroed, every valid row left as it was, bit for bit.
TEST(SequenceEmulated, ZeroPaddedRowsTouchesOnlyThePadding) {
  const std::vector<float> x = normal_values(int64_t{kB} * kS * kC, 5);
  std::vector<bf16> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = __float2bfloat16_rn(x[i] == 0.0f ? 1.0f : x[i]);  // none zero before
  const std::vector<bf16> before = x16;
  for (const dim3 block : {kBlock, dim3(256)}) {  // a warp per row: one warp per block, and the launcher's 8
    std::vector<bf16> y = before;
    emulate_launch(dim3(3), block, 0, seq::zero_padded_rows_kernel, y.data(), kLengths.data(), kB, kS, kC);
    for (int b = 0; b < kB; ++b)
      for (int t = 0; t < kS; ++t)
        for (int c = 0; c < kC; ++c) {
          const int64_t i = (int64_t{b} * kS + t) * kC + c;
          EXPECT_EQ(bits(y[i]), t < kLengths[b] ? bits(before[i]) : uint16_t{0})
              << "b " << b << " t " << t << ", block " << block.x;
        }
  }
}

}  // namespace
