// The elementwise kernels (kernels/cuda/elementwise_kernels.cuh), their own source compiled by g++ and run by the
// emulation (cuda_emulation.h), against the CPU: GELU's gradient against the double reference (fp32 and bf16
// activations), the residual sum and the scale bit for bit, and the GEMMs' fallback epilogue (bias, then GELU). Packed
// (4 per thread) and scalar instantiations, grids smaller than the data, counts that leave a tail. What it cannot tell:
// speed.
// clang-format off
#include "tests/emu/cuda_emulation.h"  // first: the device vocabulary the kernels are compiled with
#include "kernels/cuda/elementwise_kernels.cuh"
// clang-format on
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/transformer_ops.h"
#include "kernels/float16.h"
#include "tests/emu/emu_test_util.h"

namespace {

using ddplab::emu_test::bits;
using ddplab::emu_test::normal_values;

namespace ew = ddplab::cuda::elementwise;
using ddplab::emu::emulate_launch;
using ddplab::float16::Format;
using bf16 = __nv_bfloat16;

const dim3 kGrid(3), kBlock(64);
constexpr int64_t kN = 1031;  // 257 packs of 4 and a tail of 3

float round_bf16(float x) {
  return ddplab::float16::to_f32(Format::kBf16, ddplab::float16::from_f32(Format::kBf16, x));
}

// tanhf against the double reference's tanh: a few fp32 ulps of the result, plus the cancellation near GELU's zero
// crossing (x about -0.75 for the gradient), bounded by an absolute term.
void expect_near_reference(const std::vector<float>& got, const std::vector<double>& want, double rel, double abs,
                           const char* what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + abs) << what << "[" << i << "]";
}

TEST(ElementwiseEmulated, GeluGradientFollowsTheDoubleReference) {
  const std::vector<float> x = normal_values(kN, 1, 3.0f), dout = normal_values(kN, 2, 1.0f);
  const std::vector<double> xd(x.begin(), x.end()), doutd(dout.begin(), dout.end());
  std::vector<double> dwant(kN);
  ddplab::cpu::gelu_backward(dwant.data(), xd.data(), doutd.data(), kN);
  for (bool packed : {true, false}) {
    std::vector<float> dinp(kN, -1.0f);
    emulate_launch(kGrid, kBlock, 0, packed ? ew::gelu_backward_kernel<float, 4> : ew::gelu_backward_kernel<float, 1>,
                   dinp.data(), x.data(), dout.data(), kN);
    expect_near_reference(dinp, dwant, 1e-6, 1e-6, packed ? "packed dgelu" : "dgelu");
  }
}

// bf16 activations: read widened, computed in fp32, rounded once: within a bf16 rounding of the reference on the
// same (bf16) values.
TEST(ElementwiseEmulated, GeluGradientInBf16RoundsOnce) {
  std::vector<float> x = normal_values(kN, 3, 3.0f), dout = normal_values(kN, 4, 1.0f);
  for (float& v : x) v = round_bf16(v);
  for (float& v : dout) v = round_bf16(v);
  std::vector<bf16> x16(kN), dout16(kN), dinp16(kN);
  for (int64_t i = 0; i < kN; ++i) x16[i] = __float2bfloat16_rn(x[i]), dout16[i] = __float2bfloat16_rn(dout[i]);
  const std::vector<double> xd(x.begin(), x.end()), doutd(dout.begin(), dout.end());
  std::vector<double> dwant(kN);
  ddplab::cpu::gelu_backward(dwant.data(), xd.data(), doutd.data(), kN);
  for (bool packed : {true, false}) {
    emulate_launch(kGrid, kBlock, 0, packed ? ew::gelu_backward_kernel<bf16, 4> : ew::gelu_backward_kernel<bf16, 1>,
                   dinp16.data(), x16.data(), dout16.data(), kN);
    for (int64_t i = 0; i < kN; ++i)
      ASSERT_NEAR(__bfloat162float(dinp16[i]), dwant[i], std::ldexp(std::fabs(dwant[i]), -8) + 1e-6)
          << (packed ? "packed " : "") << i;
  }
}

// cuBLASLt's fallback epilogue: out = gelu(out + bias) with pre = out + bias kept (kGelu), or out = out + bias; the
// sum bit for bit as the CPU's bias_forward, GELU within the fp32 tolerance of the double reference (bf16: rounded
// once). No bias (nullptr) adds nothing. Columns and rows both over a grid smaller than the data; one column a thread
// and 16 bytes of columns a thread (V 4 fp32, 8 bf16), the bias one element along as where cuBLASLt refused it.
template <bool kPacked>
void expect_gemm_epilogue_adds_the_bias_then_gelu() {
  SCOPED_TRACE(kPacked ? "16 bytes a thread" : "one column a thread");
  constexpr int B = 7, OC = 576;  // 72 packs of 8 bf16: more than the grid's 64 threads
  const std::vector<float> start = normal_values(int64_t{B} * OC, 9, 2.0f), biases = normal_values(OC + 1, 10, 1.0f);
  const float* bias = biases.data() + 1;
  std::vector<float> sum = start;
  ddplab::cpu::bias_forward(sum.data(), bias, B, OC);
  const std::vector<double> sumd(sum.begin(), sum.end());
  std::vector<double> want(sumd.size());
  ddplab::cpu::gelu_forward(want.data(), sumd.data(), static_cast<int64_t>(want.size()));

  constexpr int V32 = kPacked ? 4 : 1;
  std::vector<float> out = start, pre(start.size(), -1.0f);
  emulate_launch(dim3(2, 3), dim3(32), 0, ew::bias_gelu_epilogue_kernel<float, true, V32>, out.data(), pre.data(), bias,
                 B, OC);
  for (int i = 0; i < B * OC; ++i) ASSERT_EQ(bits(pre[i]), bits(sum[i])) << "pre_gelu " << i;
  expect_near_reference(out, want, 4e-7, 1e-7, "gelu(out + bias)");

  std::vector<float> plain = start;
  emulate_launch(dim3(2, 3), dim3(32), 0, ew::bias_gelu_epilogue_kernel<float, false, V32>, plain.data(),
                 static_cast<float*>(nullptr), bias, B, OC);
  for (int i = 0; i < B * OC; ++i) ASSERT_EQ(bits(plain[i]), bits(sum[i])) << "out + bias " << i;
  std::vector<float> unbiased = start;
  emulate_launch(dim3(2, 3), dim3(32), 0, ew::bias_gelu_epilogue_kernel<float, false, V32>, unbiased.data(),
                 static_cast<float*>(nullptr), static_cast<const float*>(nullptr), B, OC);
  for (int i = 0; i < B * OC; ++i) ASSERT_EQ(bits(unbiased[i]), bits(start[i])) << "no bias " << i;

  constexpr int V16 = kPacked ? 8 : 1;
  std::vector<bf16> out16(start.size()), pre16(start.size()), bias16(OC + 1);
  for (size_t i = 0; i < start.size(); ++i) out16[i] = __float2bfloat16_rn(start[i]);
  for (int o = 0; o <= OC; ++o) bias16[o] = __float2bfloat16_rn(biases[o]);
  emulate_launch(dim3(2, 3), dim3(32), 0, ew::bias_gelu_epilogue_kernel<bf16, true, V16>, out16.data(), pre16.data(),
                 bias16.data() + 1, B, OC);
  for (int i = 0; i < B * OC; ++i) {
    const float v = __bfloat162float(__float2bfloat16_rn(start[i])) + __bfloat162float(bias16[1 + i % OC]);
    ASSERT_EQ(bits(pre16[i]), ddplab::float16::from_f32(Format::kBf16, v)) << "bf16 pre_gelu " << i;
    double g;
    const double vd = v;
    ddplab::cpu::gelu_forward(&g, &vd, 1);
    ASSERT_NEAR(__bfloat162float(out16[i]), g, std::ldexp(std::fabs(g), -8) + 1e-6) << "bf16 gelu " << i;
  }
}

TEST(ElementwiseEmulated, GemmEpilogueAddsTheBiasThenGelu) {
  expect_gemm_epilogue_adds_the_bias_then_gelu<false>();
  expect_gemm_epilogue_adds_the_bias_then_gelu<true>();
}

TEST(ElementwiseEmulated, ResidualAndScaleAreExact) {
  const std::vector<float> a = normal_values(kN, 7, 1.0f), b = normal_values(kN, 8, 1.0f);
  std::vector<float> want(kN);
  ddplab::cpu::residual_forward(want.data(), a.data(), b.data(), kN);
  for (bool packed : {true, false}) {
    std::vector<float> sum(kN);
    emulate_launch(kGrid, kBlock, 0, packed ? ew::residual_forward_kernel<4> : ew::residual_forward_kernel<1>,
                   sum.data(), a.data(), b.data(), kN);
    for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(bits(sum[i]), bits(want[i])) << (packed ? "packed " : "") << i;
  }

  for (bool packed : {true, false}) {
    std::vector<float> y = a;
    if (packed)
      emulate_launch(kGrid, kBlock, 0, ew::scale_kernel<4>, y.data(), 0.37f, kN);
    else
      emulate_launch(kGrid, kBlock, 0, ew::scale_kernel<1>, y.data(), 0.37f, kN);
    for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(bits(y[i]), bits(a[i] * 0.37f)) << (packed ? "packed " : "scalar ") << i;
  }
}

}  // namespace
