// The sequence kernels (kernels/cuda/sequence_kernels.cuh), their own source compiled by g++ and run by the emulation
// (cuda_emulation.h), against the CPU (kernels/cpu/transformer_ops.h): the classify head's mean pool and its backward,
// the LM head's next-token targets, and the padded rows zeroed after cuDNN's attention. Lengths of 0, 1, a few and S,
// and none (every sequence S long); grids smaller than the data, so that each grid-stride loop and the pool's loop over
// sequences (blockIdx.y) go round more than once. What it cannot tell: speed.
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with

// The pool's dynamic shared memory, in the kernels' namespace (see DDPLAB_EMU_SHARED_MEMORY), before the kernels.
namespace ddplab::cuda::sequence {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace ddplab::cuda::sequence

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/transformer_ops.h"
#include "kernels/cuda/sequence_kernels.cuh"
#include "kernels/float16.h"
#include "kernels/mean_pool.h"
#include "tests/emu/emu_test_util.h"

namespace {

using ddplab::emu_test::bits;
using ddplab::emu_test::DeviceLikeVector;
using ddplab::emu_test::normal_values;

namespace seq = ddplab::cuda::sequence;
using ddplab::emu::emulate_launch;
using bf16 = __nv_bfloat16;

// C not a multiple of the block: the column loop's tail. Lengths of 0, 1, under, at and over the pool's 16 parts
// (kernels/mean_pool.h), so that parts are empty, one row and several rows long.
constexpr int kB = 6, kS = 37, kC = 70;
const std::vector<int32_t> kLengths = {0, 1, 13, 37, 16, 37};
const dim3 kBlock(32);

template <typename T>
T as(float x) {
  if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}
float as_float(float x) { return x; }
float as_float(bf16 x) { return __bfloat162float(x); }

// The lengths as the kernels take them: the list, or null (every sequence S long).
const int32_t* lengths_or_null(bool given) { return given ? kLengths.data() : nullptr; }

// The same order of additions as the CPU (kernels/mean_pool.h: parts of the valid rows, each walked down in order,
// then added in part order): the fp32 pool is bit for bit the CPU's, with one warp taking every part, 3 and 4 warps
// taking several each, and the launcher's warp per part.
TEST(SequenceEmulated, MeanPoolIsTheCpusBitForBit) {
  const std::vector<float> x = normal_values(int64_t{kB} * kS * kC, 1);
  for (bool given : {true, false}) {
    SCOPED_TRACE(given ? "with lengths" : "every sequence S long");
    const int32_t* lengths = lengths_or_null(given);
    std::vector<float> want(kB * kC, -2.0f);
    ddplab::cpu::mean_pool_forward(want.data(), x.data(), lengths, kB, kS, kC);
    for (const unsigned threads : {32u, 96u, 128u, 32u * ddplab::mean_pool::kParts}) {
      std::vector<float> out(kB * kC, -1.0f);
      emulate_launch(dim3(2, 4), dim3(threads), seq::mean_pool_smem_bytes, seq::mean_pool_forward_kernel<float>,
                     out.data(), x.data(), lengths, kB, kS, kC);
      for (int i = 0; i < kB * kC; ++i) EXPECT_EQ(bits(out[i]), bits(want[i])) << "out[" << i << "], " << threads;
    }
  }
}

// bf16 activations: the pool is the fp32 arithmetic of the CPU's float pool on the same (widened) values, rounded once
// to nearest even, as the CPU wire rounds.
TEST(SequenceEmulated, MeanPoolInBf16RoundsTheFp32Result) {
  using ddplab::float16::Format;
  std::vector<float> x = normal_values(int64_t{kB} * kS * kC, 3);
  for (float& v : x) v = ddplab::float16::to_f32(Format::kBf16, ddplab::float16::from_f32(Format::kBf16, v));
  std::vector<bf16> x16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x16[i] = __float2bfloat16_rn(x[i]);

  std::vector<bf16> out(kB * kC);
  std::vector<float> want(kB * kC);
  emulate_launch(dim3(2, 4), dim3(128), seq::mean_pool_smem_bytes, seq::mean_pool_forward_kernel<bf16>, out.data(),
                 x16.data(), kLengths.data(), kB, kS, kC);
  ddplab::cpu::mean_pool_forward(want.data(), x.data(), kLengths.data(), kB, kS, kC);
  for (int i = 0; i < kB * kC; ++i)
    EXPECT_EQ(bits(out[i]), ddplab::float16::from_f32(Format::kBf16, want[i])) << "out[" << i << "]";
}

// The backward: dout / len on a sequence's rows and exactly 0 past them, bit for bit the CPU's (in bf16 its fp32
// result on the same values, rounded once). V elements a lane: 1, and a 16-byte pack where C is a multiple of it.
template <typename T, int V>
void expect_backward_is_the_cpus(int C, const int32_t* lengths) {
  SCOPED_TRACE(std::string(std::is_same_v<T, bf16> ? "bf16" : "fp32") + ", " + std::to_string(V) + " a lane, C " +
               std::to_string(C));
  std::vector<float> dout = normal_values(int64_t{kB} * C, 4);
  DeviceLikeVector<T> device_dout(dout.size());
  for (size_t i = 0; i < dout.size(); ++i) {
    device_dout[i] = as<T>(dout[i]);
    dout[i] = as_float(device_dout[i]);
  }
  std::vector<float> want(int64_t{kB} * kS * C);
  ddplab::cpu::mean_pool_backward(want.data(), dout.data(), lengths, kB, kS, C);
  for (const dim3 block : {kBlock, dim3(256)}) {  // a warp per row: one warp a block, and the launcher's 8
    DeviceLikeVector<T> dinp(want.size(), as<T>(-1.0f));
    emulate_launch(dim3(5), block, 0, seq::mean_pool_backward_kernel<T, V>, dinp.data(), device_dout.data(), lengths,
                   kB, kS, C);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(bits(dinp[i]), bits(as<T>(want[i]))) << "dinp[" << i << "], block " << block.x;
  }
}

TEST(SequenceEmulated, MeanPoolBackwardIsTheCpusPackedOrNot) {
  static_assert((kC + 2) % 8 == 0, "a C that every 16-byte pack divides");
  for (bool given : {true, false}) {
    SCOPED_TRACE(given ? "with lengths" : "every sequence S long");
    expect_backward_is_the_cpus<float, 1>(kC, lengths_or_null(given));
    expect_backward_is_the_cpus<float, 4>(kC + 2, lengths_or_null(given));
    expect_backward_is_the_cpus<bf16, 1>(kC, lengths_or_null(given));
    expect_backward_is_the_cpus<bf16, 8>(kC + 2, lengths_or_null(given));
  }
}

TEST(SequenceEmulated, NextTokenTargetsAreTheCpus) {
  std::vector<int32_t> tokens(kB * kS);
  for (int i = 0; i < kB * kS; ++i) tokens[i] = 100 + i;
  // Packed rows: row b cut into sequences of b % 3 + 2 tokens (the last one shorter), the padding's positions never
  // read.
  std::vector<int32_t> packed(kB * kS);
  for (int i = 0; i < kB * kS; ++i) packed[i] = i % kS % (i / kS % 3 + 2);
  for (bool given : {true, false})
    for (const int32_t* positions :
         {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(packed.data())}) {
      SCOPED_TRACE(std::string(given ? "with lengths" : "every sequence S long") + (positions ? ", packed" : ""));
      std::vector<int32_t> targets(kB * kS, 7), want(kB * kS, 8);
      emulate_launch(dim3(1), kBlock, 0, seq::next_token_targets_kernel, targets.data(), tokens.data(),
                     lengths_or_null(given), positions, kB, kS);
      ddplab::cpu::next_token_targets(want.data(), tokens.data(), lengths_or_null(given), kB, kS, positions);
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
