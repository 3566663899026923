// The update's and the gradient check's kernels (kernels/cuda/adamw_kernels.cuh, convert_kernels.cuh), their own
// source compiled by g++ and run by the emulation (cuda_emulation.h), against the CPU: cpu::adamw_update over several
// steps, bit for bit (one rule for both, kernels/adamw_rule.h; the bf16 copy against the CPU wire's bf16 rounding;
// the skip flag leaving everything as it was), the gradients' scale-and-check (every non-finite value found wherever it
// lies, the warp vote included), and the bf16 conversions. Each through its packed (4 per thread) and scalar
// instantiations, on a grid smaller than the data and a count that leaves a tail. What it cannot tell: speed.
// clang-format off
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with
// The norm kernels' dynamic shared memory, in their namespace (see DDPLAB_EMU_SHARED_MEMORY), before the kernels.
namespace ddplab::cuda::adamw {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace ddplab::cuda::adamw
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/convert_kernels.cuh"
// clang-format on
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/float16.h"
#include "tests/emu/emu_test_util.h"

namespace {

using ddplab::emu_test::bits;
using ddplab::emu_test::normal_values;

namespace cuda = ddplab::cuda;
using ddplab::emu::emulate_launch;

const dim3 kGrid(3), kBlock(64);  // 192 threads: every kernel's grid-stride loop goes round several times
constexpr int64_t kN = 1031;      // 257 packs of 4 and a tail of 3

// The packed kernel where `packed`, else the scalar one, as the launchers pick (both cover any n).
template <typename Packed, typename Scalar, typename... Args>
void launch(bool packed, Packed packed_kernel, Scalar scalar_kernel, Args... args) {
  if (packed)
    emulate_launch(kGrid, kBlock, 0, packed_kernel, args...);
  else
    emulate_launch(kGrid, kBlock, 0, scalar_kernel, args...);
}

TEST(AdamwEmulated, FollowsTheCpuUpdateOverSeveralSteps) {
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  for (bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packed" : "scalar");
    std::vector<float> p = normal_values(kN, 1, 1.0f), m(kN, 0.0f), v(kN, 0.0f);
    std::vector<float> p_cpu = p, m_cpu = m, v_cpu = v;
    std::vector<uint16_t> copy(kN, 0);
    for (int t = 1; t <= 5; ++t) {
      const std::vector<float> g = normal_values(kN, 10 + t, t == 3 ? 1e3f : 0.1f);  // one step of large gradients
      const ddplab::AdamwRule<float> step = ddplab::adamw_rule<float>(lr, beta1, beta2, eps, wd, t);
      launch(packed, cuda::adamw::adamw_kernel<4>, cuda::adamw::adamw_kernel<1>, p.data(), copy.data(), g.data(),
             m.data(), v.data(), kN, step, static_cast<const int*>(nullptr), static_cast<const float*>(nullptr));
      ddplab::cpu::adamw_update(p_cpu.data(), g.data(), m_cpu.data(), v_cpu.data(), kN, lr, beta1, beta2, eps, wd, t);
      for (int64_t i = 0; i < kN; ++i) {
        // One rule (kernels/adamw_rule.h) compiled by one compiler with the same flags: bit for bit. (On the GPU
        // nvcc's FMAs round differently: tests/gpu's tolerance.)
        ASSERT_EQ(bits(m[i]), bits(m_cpu[i])) << "m[" << i << "], step " << t;
        ASSERT_EQ(bits(v[i]), bits(v_cpu[i])) << "v[" << i << "], step " << t;
        ASSERT_EQ(bits(p[i]), bits(p_cpu[i])) << "p[" << i << "], step " << t;
        ASSERT_EQ(copy[i], ddplab::float16::from_f32(ddplab::float16::Format::kBf16, p[i]))
            << "the bf16 copy of p[" << i << "], step " << t;
      }
    }
  }
}

TEST(AdamwEmulated, ASetSkipFlagLeavesEverythingAsItWas) {
  for (bool packed : {true, false}) {
    std::vector<float> p = normal_values(kN, 2, 1.0f), m = normal_values(kN, 3, 0.1f), v(kN, 0.5f);
    const std::vector<float> g = normal_values(kN, 4, 1.0f), p0 = p, m0 = m, v0 = v;
    std::vector<uint16_t> copy(kN, 0x1234);
    const int skip = 1;
    launch(packed, cuda::adamw::adamw_kernel<4>, cuda::adamw::adamw_kernel<1>, p.data(), copy.data(), g.data(),
           m.data(), v.data(), kN, ddplab::adamw_rule<float>(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1), &skip,
           static_cast<const float*>(nullptr));
    EXPECT_EQ(p, p0);
    EXPECT_EQ(m, m0);
    EXPECT_EQ(v, v0);
    EXPECT_EQ(copy, std::vector<uint16_t>(kN, 0x1234));
  }
}

// Gradient clipping's factor, read from device memory: the update of gradients g with factor s is, bit for bit, the
// update of the gradients g * s (the factor applied once, to the gradient only), and the CPU's with the same factor.
TEST(AdamwEmulated, AGradScaleUpdatesAsTheScaledGradients) {
  const float scale = 0.3712f;
  for (bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packed" : "scalar");
    const std::vector<float> p0 = normal_values(kN, 7, 1.0f), g = normal_values(kN, 8, 2.0f);
    std::vector<float> g_scaled(kN);
    for (int64_t i = 0; i < kN; ++i) g_scaled[i] = g[i] * scale;
    std::vector<float> p = p0, m(kN, 0.0f), v(kN, 0.0f), p_want = p0, m_want = m, v_want = v;
    std::vector<uint16_t> copy(kN, 0), copy_want(kN, 0);
    std::vector<float> p_cpu = p0, m_cpu = m, v_cpu = v;
    for (int t = 1; t <= 3; ++t) {
      const ddplab::AdamwRule<float> step = ddplab::adamw_rule<float>(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, t);
      launch(packed, cuda::adamw::adamw_kernel<4>, cuda::adamw::adamw_kernel<1>, p.data(), copy.data(), g.data(),
             m.data(), v.data(), kN, step, static_cast<const int*>(nullptr), &scale);
      launch(packed, cuda::adamw::adamw_kernel<4>, cuda::adamw::adamw_kernel<1>, p_want.data(), copy_want.data(),
             g_scaled.data(), m_want.data(), v_want.data(), kN, step, static_cast<const int*>(nullptr),
             static_cast<const float*>(nullptr));
      ddplab::cpu::adamw_update(p_cpu.data(), g.data(), m_cpu.data(), v_cpu.data(), kN, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                0.01f, t, scale);
      for (int64_t i = 0; i < kN; ++i) {
        ASSERT_EQ(bits(p[i]), bits(p_want[i])) << "p[" << i << "], step " << t;
        ASSERT_EQ(bits(m[i]), bits(m_want[i])) << "m[" << i << "], step " << t;
        ASSERT_EQ(bits(v[i]), bits(v_want[i])) << "v[" << i << "], step " << t;
        ASSERT_EQ(copy[i], copy_want[i]) << "copy[" << i << "], step " << t;
        ASSERT_EQ(bits(p[i]), bits(p_cpu[i])) << "p[" << i << "] against the CPU, step " << t;
      }
    }
  }
}

// grad_norm's two passes, the kernels' own source: pass 1 on `blocks` blocks of kNormThreads (the launcher's
// norm_blocks(n), or another count: the kernels cover any grid), then pass 2 on one block.
cuda::ClippedNorm emulated_grad_norm(const float* x, int64_t n, float max_norm, bool packed, int blocks) {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> partials(blocks, kNan);  // a block that wrote no partial poisons the sum
  const dim3 grid(blocks), block(cuda::adamw::kNormThreads);
  if (packed)
    emulate_launch(grid, block, cuda::adamw::kNormSharedBytes, cuda::adamw::sum_of_squares_kernel<4>, x, n,
                   partials.data());
  else
    emulate_launch(grid, block, cuda::adamw::kNormSharedBytes, cuda::adamw::sum_of_squares_kernel<1>, x, n,
                   partials.data());
  cuda::ClippedNorm out{kNan, -1.0f};
  emulate_launch(dim3(1), block, cuda::adamw::kNormSharedBytes, cuda::adamw::finish_norm_kernel,
                 static_cast<const double*>(partials.data()), blocks, max_norm, &out);
  return out;
}

// n values, placed one float past a 16-byte boundary where not `packed`: the scalar kernel's case, which the launcher
// takes for such an address.
struct Placed {
  std::vector<float> memory;
  const float* x;
};
Placed placed(const std::vector<float>& values, bool packed) {
  Placed p{std::vector<float>(values.size() + 4), nullptr};
  const size_t at = packed ? 0 : 1;
  std::copy(values.begin(), values.end(), p.memory.begin() + at);
  p.x = p.memory.data() + at;
  return p;
}

// Squares that add up exactly in double (multiples of 1/64, far below 2^53 / 64 in all), so that any order gives the
// exact sum and the norm must be its square root to the bit: over counts that leave a pack's tail, fill a block or
// stride round the grid many times, on the launcher's grid and on 3 blocks, packed and scalar.
TEST(GradNormEmulated, IsTheExactNormOfExactlySummableGradients) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{1023}, kN, int64_t{20011}})
    for (bool packed : {true, false}) {
      std::mt19937 gen(static_cast<uint32_t>(n));
      std::vector<float> values(n);
      double sum = 0;
      for (float& x : values) {
        x = static_cast<float>(static_cast<int>(gen() % 129) - 64) / 8.0f;
        sum += static_cast<double>(x) * x;
      }
      const Placed p = placed(values, packed);
      for (int blocks : {cuda::adamw::norm_blocks(n), 3}) {
        SCOPED_TRACE("n " + std::to_string(n) + (packed ? ", packed" : ", scalar") + ", " + std::to_string(blocks) +
                     " blocks");
        const cuda::ClippedNorm got = emulated_grad_norm(p.x, n, 0.0f, packed, blocks);
        EXPECT_EQ(got.norm, std::sqrt(sum));
        EXPECT_EQ(got.scale, 1.0f) << "no clipping without a cap";
      }
    }
}

// Gradients as training makes them, against a long double sum; gradients whose squares overflow a float (the sum is
// kept in double); no gradients at all; and the clip factor, kernels/grad_clip.h's (the CPU's).
TEST(GradNormEmulated, SumsInDoubleAndGivesTheClipFactor) {
  for (bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packed" : "scalar");
    std::vector<float> values = normal_values(kN, 9, 0.01f);
    values[5] = 3e30f, values[kN - 2] = -2e30f;  // squared: 9e60 and 4e60, far past a float's 3.4e38
    long double sum = 0;
    for (float x : values) sum += static_cast<long double>(x) * x;
    const double want = static_cast<double>(std::sqrt(sum));
    const Placed p = placed(values, packed);
    const cuda::ClippedNorm got = emulated_grad_norm(p.x, kN, 1.0f, packed, cuda::adamw::norm_blocks(kN));
    EXPECT_NEAR(got.norm, want, 1e-15 * want);
    EXPECT_EQ(got.scale, ddplab::clip_scale(got.norm, 1.0f));
    EXPECT_LT(got.scale, 1e-30f) << "a cap of 1 on a norm of ~3.6e30";

    const Placed q = placed(normal_values(kN, 10, 1e-3f), packed);
    const cuda::ClippedNorm unclipped = emulated_grad_norm(q.x, kN, 10.0f, packed, cuda::adamw::norm_blocks(kN));
    EXPECT_GT(unclipped.norm, 0.0);
    EXPECT_EQ(unclipped.scale, 1.0f) << "a norm under the cap is left as it is";
  }
  const cuda::ClippedNorm nothing = emulated_grad_norm(nullptr, 0, 1.0f, true, cuda::adamw::norm_blocks(0));
  EXPECT_EQ(nothing.norm, 0.0);
  EXPECT_EQ(nothing.scale, 1.0f);
}

// The grid is fixed by the count alone, up to the cap: never by the GPU it runs on.
TEST(GradNormEmulated, TheGridDependsOnTheCountAlone) {
  EXPECT_EQ(cuda::adamw::norm_blocks(0), 1);
  EXPECT_EQ(cuda::adamw::norm_blocks(1024), 1);
  EXPECT_EQ(cuda::adamw::norm_blocks(1025), 2);
  EXPECT_EQ(cuda::adamw::norm_blocks(int64_t{1} << 40), cuda::adamw::kMaxNormBlocks);
}

// Scaled exactly (by a power of two) and bit for bit as x * s, and with s == 1 left unwritten; the flag set exactly
// when a scaled value is not finite: a NaN or an inf at the first element, inside a pack, at the last pack and in the
// tail, and a finite value the scale overflows.
TEST(ScaleAndCheckFiniteEmulated, ScalesAndFindsEveryNonFiniteValue) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  // x * 1 would quiet it: with a scale of 1 its bits unchanged say that nothing was written back.
  const float kSignalingNan = std::numeric_limits<float>::signaling_NaN();
  const std::vector<float> x0 = normal_values(kN, 5, 10.0f);
  struct Case {
    int64_t at;
    float value, scale;
    bool flagged;
  };
  const std::vector<Case> cases = {{-1, 0, 0.5f, false},           {0, kNan, 0.5f, true},
                                   {6, kInf, 0.5f, true},          {1026, -kInf, 0.5f, true},
                                   {kN - 1, kNan, 0.5f, true},     {kN - 3, 3e38f, 4.0f, true},
                                   {-1, 0, 4.0f, false},           {-1, 0, 1.0f, false},
                                   {6, kSignalingNan, 1.0f, true}, {kN - 1, kSignalingNan, 1.0f, true}};
  for (bool packed : {true, false}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(packed ? "packed" : "scalar") + ", value at " + std::to_string(c.at));
      std::vector<float> x = x0;
      if (c.at >= 0) x[c.at] = c.value;
      const std::vector<float> before = x;
      int flag = 0;
      launch(packed, cuda::convert::scale_and_check_finite_kernel<4>, cuda::convert::scale_and_check_finite_kernel<1>,
             x.data(), c.scale, kN, &flag);
      EXPECT_EQ(flag, c.flagged ? 1 : 0);
      for (int64_t i = 0; i < kN; ++i) {
        const float want = before[i] * c.scale;
        if (c.scale == 1.0f)
          EXPECT_EQ(bits(x[i]), bits(before[i])) << i;
        else if (std::isnan(want))
          EXPECT_TRUE(std::isnan(x[i])) << i;
        else
          EXPECT_EQ(bits(x[i]), bits(want)) << i;
      }
    }
  }
}

// fp32 -> bf16 words rounded to nearest, ties to even, as CUDA's own __float2bfloat16_rn (its host implementation: a
// reference independent of kernels/float16.h, which the kernels call); NaN stays NaN; and back exactly.
TEST(Bf16ConversionEmulated, RoundsAsTheCpuWireAndWidensExactly) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> x = normal_values(kN, 6, 100.0f);
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), 1e-40f, 3.4e38f,
                            1.00390625f /* a tie: 1 + 2^-8 */, 1.01171875f /* the next tie up */};
  for (size_t k = 0; k < std::size(specials); ++k) x[kN - 1 - k] = specials[k];  // in the tail and the last packs
  using ddplab::float16::Format;
  for (bool packed : {true, false}) {
    SCOPED_TRACE(packed ? "packed" : "scalar");
    std::vector<uint16_t> words(kN, 0);
    launch(packed, cuda::convert::f32_to_bf16_kernel<4>, cuda::convert::f32_to_bf16_kernel<1>, words.data(), x.data(),
           kN);
    std::vector<float> back(kN, -1.0f);
    launch(packed, cuda::convert::bf16_to_f32_kernel<4>, cuda::convert::bf16_to_f32_kernel<1>, back.data(),
           words.data(), kN);
    for (int64_t i = 0; i < kN; ++i) {
      const uint16_t want = bits(__float2bfloat16_rn(x[i]));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(back[i])) << i;
        continue;
      }
      EXPECT_EQ(words[i], want) << i << ": " << x[i];
      EXPECT_EQ(bits(back[i]), bits(ddplab::float16::to_f32(Format::kBf16, want))) << i;
    }
  }
}

}  // namespace
