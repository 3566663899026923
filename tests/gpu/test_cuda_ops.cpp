// CUDA ops against their CPU references (kernels/cpu/ops.h), plus the host-side pieces of the CUDA layer
// (device query, checked-call macros, zero-size launches) that must work on a machine without a GPU.
//
// Kernel tests skip with the CUDA error as the reason when no device is usable; they never pass silently.
// Buffers, poisoning and tolerances: tests/gpu/gpu_test_util.h.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/float16.h"
#include "kernels/grad_clip.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using ddplab::cuda::CudaInfo;
using ddplab::gpu_test::AllClose;
using ddplab::gpu_test::cuda_info;
using ddplab::gpu_test::DeviceArray;
using ddplab::gpu_test::DeviceBuffer;
using ddplab::gpu_test::random_vector;
using ddplab::gpu_test::round_bf16;
using ddplab::gpu_test::shifted;
using ddplab::gpu_test::to_bf16;
using ddplab::gpu_test::to_f32;
using ddplab::gpu_test::unshifted;

// 1 and 1000 leave partial blocks; 2^20 + 3 leaves a ragged last block and is too big for any accidental
// single-block kernel.
const std::vector<int64_t> kSizes = {1, 1000, (int64_t{1} << 20) + 3};

// ---- host side: these run, and must pass, without a GPU ----------------------------------------------------------

TEST(CudaQuery, ReasonWhenUnavailableSaneValuesWhenAvailable) {
  const CudaInfo& info = cuda_info();
  std::cout << "query_cuda: " << ddplab::cuda::describe(info) << "\n";
  // The libraries answer without a device: proof that cudart, cuBLASLt and NCCL are really linked.
  EXPECT_GE(info.runtime_version, 12000);
  EXPECT_GE(info.cublas_version, 120000);
  EXPECT_GE(info.nccl_version, 21800);
  if (!info.available) {
    EXPECT_FALSE(info.reason.empty());
    EXPECT_TRUE(info.name.empty());
    EXPECT_EQ(info.memory_bytes, 0u);
    return;
  }
  EXPECT_TRUE(info.reason.empty()) << info.reason;
  EXPECT_GE(info.device_count, 1);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.cc_major, 7);
  EXPECT_GE(info.memory_bytes, size_t{1} << 30);
  EXPECT_GE(info.driver_version, info.runtime_version / 1000 * 1000) << "driver older than the runtime's major";
}

// Each macro throws std::runtime_error naming this file:line, the call, and the library's own error string.
template <typename F>
std::string CaughtMessage(F&& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(CudaCheck, MacrosThrowWithFileLineAndLibraryString) {
  EXPECT_NO_THROW(cudaCheck(cudaSuccess));
  EXPECT_NO_THROW(cublasCheck(CUBLAS_STATUS_SUCCESS));
  EXPECT_NO_THROW(ncclCheck(ncclSuccess));

  const int line = __LINE__ + 1;
  std::string msg = CaughtMessage([] { cudaCheck(cudaErrorInvalidValue); });
  EXPECT_NE(msg.find("test_cuda_ops.cpp:" + std::to_string(line)), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;
  EXPECT_NE(msg.find(cudaGetErrorString(cudaErrorInvalidValue)), std::string::npos) << msg;

  msg = CaughtMessage([] { cublasCheck(CUBLAS_STATUS_INVALID_VALUE); });
  EXPECT_NE(msg.find("cuBLAS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << msg;

  msg = CaughtMessage([] { ncclCheck(ncclInvalidArgument); });
  EXPECT_NE(msg.find("NCCL"), std::string::npos) << msg;
  EXPECT_NE(msg.find(ncclGetErrorString(ncclInvalidArgument)), std::string::npos) << msg;
}

// Zero-size ops must not launch (a grid of 0 blocks is an error); without a GPU any launch would throw here.
TEST(CudaLaunch, ZeroSizeLaunchesNothing) {
  EXPECT_NO_THROW(ddplab::cuda::gelu_backward(static_cast<float*>(nullptr), nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(ddplab::cuda::gelu_backward(static_cast<__nv_bfloat16*>(nullptr), nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(ddplab::cuda::scale(static_cast<float*>(nullptr), 2.0f, 0, nullptr));
  EXPECT_NO_THROW(
      ddplab::cuda::adamw_update(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1,
                                 nullptr));
}

// ---- kernels against the CPU reference: need a device ------------------------------------------------------------

using CudaOps = ddplab::gpu_test::DeviceTest;

// Tolerances. Scale: one fp32 multiply per element, the same on both sides, so 1e-6 relative is generous. AdamW: the
// GPU contracts multiply-adds into FMAs (one rounding instead of two), so 1e-6 relative plus 1e-7 absolute for m
// near 0, where b1*m + (1-b1)*g cancels. GELU's gradient: CUDA's tanhf is within 2 ulp, not glibc's; 1e-5 relative
// plus an absolute floor where 1 - tanh(u)^2 cancels for large |x|, amplified by 0.5 x du/dx (1e-5). Emulating that
// difference on the host over 2e7 inputs in [-6, 6] gives at most 3.3e-6 beyond the relative part. (The forward's
// GELU is the GEMM's epilogue: tests/gpu/test_cuda_kernels.cpp.)
constexpr double kExactRtol = 1e-6;
constexpr double kAdamwRtol = 1e-6, kAdamwAtol = 1e-7;
constexpr double kGeluRtol = 1e-5, kGeluBwdAtol = 1e-5;

TEST_F(CudaOps, GeluBackwardMatchesCpu) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> inp = random_vector(n, -6.0f, 6.0f, 201 + n);
    const std::vector<float> dout = random_vector(n, -1.0f, 1.0f, 301 + n);
    std::vector<float> want(n);
    ddplab::cpu::gelu_backward(want.data(), inp.data(), dout.data(), n);

    DeviceArray d_inp(inp, stream_), d_dout(dout, stream_), d_dinp(n, stream_);
    ddplab::cuda::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream_);
    EXPECT_TRUE(AllClose(d_dinp.download(), want, kGeluRtol, kGeluBwdAtol));
    DeviceArray u_inp(shifted(inp), stream_), u_dout(shifted(dout), stream_), u_dinp(n + 1, stream_);
    ddplab::cuda::gelu_backward(u_dinp.get() + 1, u_inp.get() + 1, u_dout.get() + 1, n, stream_);
    EXPECT_TRUE(AllClose(unshifted(u_dinp.download()), want, kGeluRtol, kGeluBwdAtol)) << "one element along";
  }
}

// bf16 in and out: the CPU reference runs on the bf16-rounded inputs, and the GPU rounds its fp32 result to bf16
// once, which adds at most half a bf16 ulp to the fp32 tolerance: 2^-8 relative just above a power of two (on an
// H200, 1.01915 rounded to 1.015625, correctly, and failed the 2^-9 this test first allowed).
TEST_F(CudaOps, GeluBackwardBf16MatchesCpu) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> inp = round_bf16(random_vector(n, -6.0f, 6.0f, 251 + n));
    const std::vector<float> dout = round_bf16(random_vector(n, -1.0f, 1.0f, 351 + n));
    std::vector<float> want(n);
    ddplab::cpu::gelu_backward(want.data(), inp.data(), dout.data(), n);

    DeviceBuffer<__nv_bfloat16> d_inp(to_bf16(inp), stream_), d_dout(to_bf16(dout), stream_), d_dinp(n, stream_);
    ddplab::cuda::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream_);
    EXPECT_TRUE(AllClose(to_f32(d_dinp.download()), want, kGeluRtol + 0x1p-8, kGeluBwdAtol));
    DeviceBuffer<__nv_bfloat16> u_inp(to_bf16(shifted(inp)), stream_), u_dout(to_bf16(shifted(dout)), stream_),
        u_dinp(n + 1, stream_);
    ddplab::cuda::gelu_backward(u_dinp.get() + 1, u_inp.get() + 1, u_dout.get() + 1, n, stream_);
    EXPECT_TRUE(AllClose(unshifted(to_f32(u_dinp.download())), want, kGeluRtol + 0x1p-8, kGeluBwdAtol))
        << "one element along";
  }
}

TEST_F(CudaOps, ScaleMatchesCpu) {
  // The last size needs more blocks than the grid cap (65535 x 256), so the grid-stride loop wraps.
  std::vector<int64_t> sizes = kSizes;
  sizes.push_back((int64_t{1} << 24) + (int64_t{1} << 20) + 5);
  for (int64_t n : sizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> y = random_vector(n, -1.0f, 1.0f, 601 + n);
    DeviceArray d_y(y, stream_), u_y(shifted(y), stream_);
    const float alpha = -0.3f;
    ddplab::cpu::scale(y.data(), alpha, n);

    ddplab::cuda::scale(d_y.get(), alpha, n, stream_);
    EXPECT_TRUE(AllClose(d_y.download(), y, kExactRtol, 0.0));
    ddplab::cuda::scale(u_y.get() + 1, alpha, n, stream_);
    EXPECT_TRUE(AllClose(unshifted(u_y.download()), y, kExactRtol, 0.0)) << "one element along";
  }
}

TEST_F(CudaOps, AdamwMatchesCpuOverSteps) {
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    // Non-zero moments as after some training; v bounded away from 0 so m's rounding is not amplified by 1/sqrt(v).
    std::vector<float> params = random_vector(n, -1.0f, 1.0f, 701 + n);
    std::vector<float> m = random_vector(n, -0.1f, 0.1f, 801 + n);
    std::vector<float> v = random_vector(n, 1e-4f, 1e-2f, 901 + n);
    DeviceArray d_params(params, stream_), d_m(m, stream_), d_v(v, stream_);
    // The same update writing the bf16 copy: the fp32 state must be bitwise the one without, the copy bitwise the
    // wire's conversion of the params (convert.h), at an aligned (packed) and an unaligned (scalar) copy.
    for (int copy_offset : {0, 1}) {
      SCOPED_TRACE("copy at offset " + std::to_string(copy_offset));
      DeviceArray c_params(params, stream_), c_m(m, stream_), c_v(v, stream_);
      DeviceBuffer<__nv_bfloat16> copy(n + copy_offset, stream_);
      const std::vector<float> grads = random_vector(n, -1.0f, 1.0f, 1001 + n);
      DeviceArray d_grads(grads, stream_), d_p(params, stream_), d_mm(m, stream_), d_vv(v, stream_);
      ddplab::cuda::adamw_update(d_p.get(), nullptr, d_grads.get(), d_mm.get(), d_vv.get(), n, lr, beta1, beta2, eps,
                                 weight_decay, 2, stream_);
      ddplab::cuda::adamw_update(c_params.get(), copy.get() + copy_offset, d_grads.get(), c_m.get(), c_v.get(), n, lr,
                                 beta1, beta2, eps, weight_decay, 2, stream_);
      const std::vector<float> updated = c_params.download();
      EXPECT_TRUE(ddplab::gpu_test::BitwiseEqual(updated, d_p.download())) << "params";
      EXPECT_TRUE(ddplab::gpu_test::BitwiseEqual(c_m.download(), d_mm.download())) << "m";
      EXPECT_TRUE(ddplab::gpu_test::BitwiseEqual(c_v.download(), d_vv.download())) << "v";
      const std::vector<__nv_bfloat16> words = copy.download();
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i)
        bad += ddplab::gpu_test::bits_of(words[copy_offset + i]) != ddplab::float16::f32_to_bf16(updated[i]);
      EXPECT_EQ(bad, 0) << "bf16 copy elements that are not the wire's conversion of the params";
    }
    // Early steps, where bias correction matters most, then a late one; each side carries its own state.
    for (int t : {1, 2, 3, 1000}) {
      SCOPED_TRACE("t=" + std::to_string(t));
      const std::vector<float> grads = random_vector(n, -1.0f, 1.0f, 1001 + n + t);
      DeviceArray d_grads(grads, stream_);
      ddplab::cpu::adamw_update(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, weight_decay,
                                t);

      ddplab::cuda::adamw_update(d_params.get(), nullptr, d_grads.get(), d_m.get(), d_v.get(), n, lr, beta1, beta2,
                                 eps, weight_decay, t, stream_);
      EXPECT_TRUE(AllClose(d_m.download(), m, kAdamwRtol, kAdamwAtol)) << "m";
      EXPECT_TRUE(AllClose(d_v.download(), v, kAdamwRtol, kAdamwAtol)) << "v";
      EXPECT_TRUE(AllClose(d_params.download(), params, kAdamwRtol, kAdamwAtol)) << "params";
    }
  }
}

// The gradients' norm (--grad-clip) against the CPU's double sum: random gradients to 1e-13, exactly summable ones
// (multiples of 1/8: every order gives the exact sum) to the bit, at a 16-byte-aligned and an unaligned address (the
// packed and the scalar kernel), and every call the same bits (the grid is fixed by n, not by timing). The clip factor
// is kernels/grad_clip.h's of that norm. Then AdamW reading the factor from the device updates as on the gradients
// scaled by it, bit for bit.
TEST_F(CudaOps, GradNormMatchesCpuAndRepeatsBitForBit) {
  DeviceBuffer<unsigned char> workspace(ddplab::cuda::grad_norm_workspace_bytes(), stream_);
  DeviceBuffer<ddplab::cuda::ClippedNorm> out(1, stream_);
  const auto norm_of = [&](const float* x, int64_t n, float cap) {
    ddplab::cuda::grad_norm(x, n, cap, out.get(), workspace.get(), stream_);
    return out.download()[0];
  };
  for (int64_t n : kSizes) {
    for (int offset : {0, 1}) {
      SCOPED_TRACE("n=" + std::to_string(n) + ", offset " + std::to_string(offset));
      std::vector<float> grads = random_vector(n + offset, -1.0f, 1.0f, 1101 + n);
      DeviceArray d_grads(grads, stream_);
      const std::vector<float> mine(grads.begin() + offset, grads.end());
      const double want = std::sqrt(ddplab::cpu::sum_of_squares(mine.data(), n));
      const ddplab::cuda::ClippedNorm got = norm_of(d_grads.get() + offset, n, 0.5f);
      EXPECT_NEAR(got.norm, want, 1e-13 * want);
      EXPECT_EQ(got.scale, ddplab::clip_scale(got.norm, 0.5f));
      for (int repeat = 0; repeat < 3; ++repeat) {
        const ddplab::cuda::ClippedNorm again = norm_of(d_grads.get() + offset, n, 0.5f);
        EXPECT_EQ(again.norm, got.norm) << "call " << repeat;
      }
      std::vector<float> exact(n + offset);
      double exact_sum = 0;
      for (int64_t i = 0; i < n + offset; ++i) {
        exact[i] = static_cast<float>(static_cast<int>(i % 129) - 64) / 8.0f;
        if (i >= offset) exact_sum += static_cast<double>(exact[i]) * exact[i];
      }
      DeviceArray d_exact(exact, stream_);
      EXPECT_EQ(norm_of(d_exact.get() + offset, n, 0.0f).norm, std::sqrt(exact_sum));
    }
    // AdamW with the factor on the device against AdamW on the scaled gradients.
    const std::vector<float> params = random_vector(n, -1.0f, 1.0f, 1201 + n),
                             grads = random_vector(n, -3, 3, 1301 + n);
    DeviceArray d_grads(grads, stream_);
    const ddplab::cuda::ClippedNorm norm = norm_of(d_grads.get(), n, 0.25f);
    ASSERT_LT(norm.scale, 1.0f);
    std::vector<float> scaled = grads;
    for (float& g : scaled) g *= norm.scale;
    DeviceArray d_scaled(scaled, stream_), p1(params, stream_), p2(params, stream_);
    DeviceArray m1(std::vector<float>(n, 0.0f), stream_), v1(std::vector<float>(n, 0.0f), stream_);
    DeviceArray m2(std::vector<float>(n, 0.0f), stream_), v2(std::vector<float>(n, 0.0f), stream_);
    ddplab::cuda::adamw_update(p1.get(), nullptr, d_grads.get(), m1.get(), v1.get(), n, 1e-3f, 0.9f, 0.999f, 1e-8f,
                               0.01f, 1, stream_, nullptr, &out.get()->scale);
    ddplab::cuda::adamw_update(p2.get(), nullptr, d_scaled.get(), m2.get(), v2.get(), n, 1e-3f, 0.9f, 0.999f, 1e-8f,
                               0.01f, 1, stream_);
    EXPECT_TRUE(ddplab::gpu_test::BitwiseEqual(p1.download(), p2.download())) << "params";
    EXPECT_TRUE(ddplab::gpu_test::BitwiseEqual(v1.download(), v2.download())) << "v";
  }
}

}  // namespace
