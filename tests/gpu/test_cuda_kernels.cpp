// The transformer's and the MLP's CUDA kernel families against their CPU references (kernels/cpu/ops.h,
// kernels/cpu/transformer_ops.h, kernels/float16.h): LayerNorm, fused softmax cross-entropy, embedding, attention (and
// the fused bf16 one), the cuBLASLt GEMMs and their epilogues (bias, GELU, dGELU, the bias gradient), bf16 conversion
// and the gradient scale + finite check, the residual add, the mean pool and the next-token targets.
//
// CudaKernelsHost.* runs without a GPU (argument checks, zero-size calls, workspace sizes) and must pass anywhere.
// CudaKernels.* needs a device and skips with the reason otherwise. Each runs on fresh random inputs, with
// outputs poisoned (NaN) first and guard tails checked (gpu_test_util.h), at odd sizes (1, non-multiples of 4 and
// 32, unaligned pointers that force the scalar paths), and tolerances chosen per precision (stated at each test).
#include <cuda_bf16.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/transformer_ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_algo_table.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/sequence.h"
#include "kernels/cuda/softmax_ce.h"
#include "kernels/cuda/wire_cast.h"
#include "kernels/float16.h"
#include "model/attention_kind.h"
#include "tests/gpu/flash_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

namespace cpu = ddplab::cpu;
namespace cuda = ddplab::cuda;
using bf16 = __nv_bfloat16;
using ddplab::flash_test::expect_flash_matches;
using ddplab::flash_test::FlashCase;
using ddplab::flash_test::FlashShape;
using ddplab::flash_test::make_flash_case;
using ddplab::gpu_test::AllClose;
using ddplab::gpu_test::bf16_from_bits;
using ddplab::gpu_test::bits_of;
using ddplab::gpu_test::BitwiseEqual;
using ddplab::gpu_test::cuda_info;
using ddplab::gpu_test::DeviceArray;
using ddplab::gpu_test::DeviceBuffer;
using ddplab::gpu_test::random_vector;
using ddplab::gpu_test::round_bf16;
using ddplab::gpu_test::shifted;
using ddplab::gpu_test::to_bf16;
using ddplab::gpu_test::to_f32;
using ddplab::gpu_test::unshifted;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string shape(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (auto [name, v] : dims) s += std::string(s.empty() ? "" : " ") + name + "=" + std::to_string(v);
  return s;
}

// ---- host side: no device needed ---------------------------------------------------------------------------------

TEST(CudaKernelsHost, ZeroSizeCallsLaunchNothing) {
  cudaStream_t s = nullptr;
  cuda::GemmContext ctx;  // handles are created on first use: none here
  EXPECT_NO_THROW(cuda::layernorm_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, s));
  EXPECT_NO_THROW(cuda::layernorm_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                 nullptr, 0, 8, s));
  EXPECT_NO_THROW(cuda::embedding_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 5, 8, s));
  EXPECT_NO_THROW(cuda::sort_rows_by_token(nullptr, 0, nullptr, nullptr, 3, 0, 10, 8, s));
  EXPECT_NO_THROW(
      cuda::embedding_backward<float>(nullptr, nullptr, nullptr, cuda::RowsByToken{}, nullptr, nullptr, 3, 0, 8, s));
  EXPECT_NO_THROW(cuda::attention_forward(ctx, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 8, 2, true, s));
  EXPECT_NO_THROW(
      cuda::attention_backward(ctx, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 2, 0, 8, 2, false, s));
  EXPECT_NO_THROW(cuda::matmul_forward<float>(ctx, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, s));
  EXPECT_NO_THROW(cuda::matmul_bias_gelu_forward<bf16>(ctx, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 4, 0, s));
  EXPECT_NO_THROW(cuda::matmul_backward_input<float>(ctx, nullptr, nullptr, nullptr, 4, 0, 4, s));
  EXPECT_NO_THROW(cuda::matmul_backward_weight<float>(ctx, nullptr, nullptr, nullptr, 0, 4, 4, 0, 4, s));
  EXPECT_NO_THROW(cuda::matmul_backward_weight<bf16>(ctx, nullptr, nullptr, nullptr, 4, 4, 4, 2, 2, s));
  EXPECT_NO_THROW(cuda::bias_backward<float>(ctx, nullptr, nullptr, 0, 4, s));
  EXPECT_NO_THROW(cuda::matmul_backward_input_dgelu<bf16>(ctx, nullptr, nullptr, nullptr, nullptr, 0, 4, 4, s));
  EXPECT_NO_THROW(cuda::matmul_residual_forward<bf16>(ctx, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 4, 0, s));
  EXPECT_NO_THROW(cuda::gemm_strided_batched(ctx, false, true, 0, 4, 4, 1.0f, nullptr, 4, 0, nullptr, 4, 0, 0.0f,
                                             nullptr, 4, 0, 3, s));
  EXPECT_NO_THROW(cuda::f32_to_bf16(nullptr, nullptr, 0, s));
  EXPECT_NO_THROW(cuda::bf16_to_f32(nullptr, nullptr, 0, s));
  EXPECT_NO_THROW(cuda::scale_and_check_finite(nullptr, 2.0f, 0, nullptr, s));
  EXPECT_NO_THROW(cuda::residual_forward(nullptr, nullptr, nullptr, 0, s));
  EXPECT_NO_THROW(cuda::mean_pool_forward<float>(nullptr, nullptr, nullptr, 0, 5, 8, s));
  EXPECT_NO_THROW(cuda::mean_pool_backward<bf16>(nullptr, nullptr, nullptr, 3, 0, 8, s));
  EXPECT_NO_THROW(cuda::next_token_targets(nullptr, nullptr, nullptr, nullptr, 0, 7, s));
  EXPECT_EQ(ctx.cached_plans(), 0);
}

TEST(CudaKernelsHost, BadArgumentsThrowBeforeLaunching) {
  cudaStream_t s = nullptr;
  cuda::GemmContext ctx;
  float f = 0;
  int i = 0;
  EXPECT_THROW(cuda::layernorm_forward<float>(&f, &f, &f, &f, &f, &f, 4, 0, s), std::invalid_argument);
  EXPECT_THROW(cuda::layernorm_forward<float>(&f, &f, &f, &f, &f, &f, -1, 4, s), std::invalid_argument);
  EXPECT_THROW(cuda::layernorm_backward<float>(&f, &f, &f, nullptr, &f, &f, &f, &f, &f, 4, 4, s),
               std::invalid_argument);  // no scratch
  EXPECT_THROW(cuda::softmax_cross_entropy_fused<float>(&f, &f, &f, &i, &f, &i, 4, 0, 1.0f, s), std::invalid_argument);
  EXPECT_THROW(cuda::softmax_cross_entropy_fused<float>(&f, &f, &f, nullptr, &f, &i, 4, 4, 1.0f, s), std::invalid_argument);
  EXPECT_THROW(cuda::embedding_forward<float>(&f, &i, &i, nullptr, &f, &f, 2, 2, 0, s), std::invalid_argument);
  EXPECT_THROW(cuda::sort_rows_by_token(&f, 4, &i, &i, 2, 2, 0, 4, s), std::invalid_argument);  // no vocabulary
  EXPECT_THROW(cuda::sort_rows_by_token(&f, 4, &i, &i, 2, 2, 5, 0, s), std::invalid_argument);  // no width
  cuda::RowsByToken three_rows;                                                                 // another batch's
  three_rows.count = 3;
  three_rows.width = 4;
  EXPECT_THROW(cuda::embedding_backward<float>(&f, &f, &f, three_rows, &i, nullptr, 2, 2, 4, s), std::invalid_argument);
  cuda::RowsByToken narrower;  // this batch's rows, sorted for a narrower table (too few run sums)
  narrower.count = 4;
  narrower.width = 2;
  EXPECT_THROW(cuda::embedding_backward<float>(&f, &f, &f, narrower, &i, nullptr, 2, 2, 4, s), std::invalid_argument);
  EXPECT_THROW(cuda::attention_forward(ctx, &f, &f, &f, &f, &i, 2, 4, 10, 3, true, s), std::invalid_argument);
  EXPECT_THROW(cuda::attention_forward(ctx, &f, &f, nullptr, &f, &i, 2, 4, 12, 3, true, s), std::invalid_argument);
  EXPECT_THROW(cuda::attention_backward(ctx, &f, nullptr, &f, &f, &f, &i, 2, 4, 12, 3, true, s), std::invalid_argument);
  EXPECT_THROW(cuda::matmul_forward<float>(ctx, &f, &f, &f, &f, 4, -1, 4, s), std::invalid_argument);
  EXPECT_THROW(cuda::matmul_bias_gelu_forward<float>(ctx, &f, nullptr, &f, &f, &f, 4, 4, 4, s),
               std::invalid_argument);  // GELU needs somewhere to keep its input
  EXPECT_THROW(cuda::matmul_residual_forward<float>(ctx, &f, &f, &f, &f, nullptr, 4, 4, 4, s), std::invalid_argument);
  bf16* out = reinterpret_cast<bf16*>(&f);
  EXPECT_THROW(cuda::matmul_residual_forward<bf16>(ctx, out, nullptr, nullptr, nullptr, out, 4, 4, 4, s),
               std::invalid_argument);  // in place
  EXPECT_THROW(cuda::matmul_backward_input_dgelu<float>(ctx, &f, &f, &f, nullptr, 4, 4, 4, s),
               std::invalid_argument);  // dGELU needs the GELU's input
  for (auto [begin, end] : {std::pair{-1, 2}, std::pair{3, 2}, std::pair{0, 5}})
    EXPECT_THROW(cuda::matmul_backward_weight<float>(ctx, &f, &f, &f, 4, 4, 4, begin, end, s), std::invalid_argument)
        << begin << ".." << end;
  EXPECT_THROW(cuda::f32_to_bf16(nullptr, &f, -1, s), std::invalid_argument);
  EXPECT_THROW(cuda::scale_and_check_finite(&f, 2.0f, 4, nullptr, s), std::invalid_argument);
  EXPECT_THROW(cuda::mean_pool_forward<float>(&f, &f, &i, 2, 3, 0, s), std::invalid_argument);
  EXPECT_THROW(cuda::mean_pool_backward<float>(&f, &f, &i, -1, 3, 4, s), std::invalid_argument);
  EXPECT_THROW(cuda::next_token_targets(&i, &i, &i, nullptr, 2, -1, s), std::invalid_argument);
  EXPECT_EQ(ctx.cached_plans(), 0);
}

TEST(CudaKernelsHost, WorkspaceSizes) {
  EXPECT_EQ(cuda::layernorm_backward_scratch_floats(0, 768), 0);
  // Three sums a column (dweight, dbias, dinp's columns) per block.
  EXPECT_EQ(cuda::layernorm_backward_scratch_floats(1, 768), 3 * 768);              // one block
  EXPECT_EQ(cuda::layernorm_backward_scratch_floats(17, 5), 3 * 3 * 5);             // 8 rows per block
  EXPECT_EQ(cuda::layernorm_backward_scratch_floats(1 << 20, 768), 256 * 3 * 768);  // capped: 2048 warps
  EXPECT_EQ(cuda::attention_forward_workspace_floats(2, 5, 12, 3), 4 * 2 * 5 * 12);
  EXPECT_EQ(cuda::attention_backward_workspace_floats(2, 5, 12, 3), 7 * 2 * 5 * 12 + 2 * 3 * 5 * 5);
}

// The table of timed GEMM algorithms (gemm_algo_table.h), host code: the first process to record a problem decides it
// for every process after, each table sees the others' problems, a rank the heuristic no longer gives is none, and
// without a place to write the choice stays in the process.
TEST(CudaKernelsHost, GemmAlgoTableKeepsTheFirstAnswer) {
  EXPECT_EQ(cuda::GemmAlgoTable::file_name("NVIDIA H200", 9, 0, 132, 130100),
            "cublaslt-algos-fp32-splitk_NVIDIA-H200_sm90_132sms_cublasLt-130100.json");
  const std::string dir = testing::TempDir() + "gemm_algo_table_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string file = "algos.json";
  std::string error;
  cuda::GemmAlgoTable first(dir, file), second(dir, file);
  EXPECT_FALSE(first.find("p", 8));
  EXPECT_EQ(first.record("p", 3, {50, 49, 48, 40, 47, 46, 45, 44}, 8, error), 3);
  EXPECT_EQ(error, "");
  EXPECT_EQ(second.find("p", 8), 3);
  EXPECT_EQ(second.record("p", 5, {50, 49, 48, 41, 47, 39, 45, 44}, 8, error), 3) << "timed first elsewhere";
  EXPECT_EQ(second.record("q", 1, {9, 8}, 2, error), 1);
  EXPECT_FALSE(first.find("q", 2)) << "read once, not on every find";
  EXPECT_EQ(first.record("r", 0, {1, 2}, 2, error), 0);
  EXPECT_EQ(first.find("q", 2), 1) << "what others recorded, learnt when recording";
  EXPECT_EQ(cuda::GemmAlgoTable(dir, file).find("q", 2), 1);
  EXPECT_FALSE(cuda::GemmAlgoTable(dir, file).find("p", 3)) << "the heuristic gives 3 answers now: rank 3 is none";
  EXPECT_EQ(cuda::GemmAlgoTable(dir, file).record("p", 0, {7, 8, 9}, 3, error), 0) << "an unusable rank is replaced";
  EXPECT_EQ(cuda::GemmAlgoTable(dir, file).find("p", 3), 0);

  std::ofstream(dir + "/damaged.json") << R"({"p": {"rank": "three"}, "q": {"rank": -1}, "r": 4})";
  cuda::GemmAlgoTable damaged(dir, "damaged.json");
  EXPECT_FALSE(damaged.find("p", 8));
  EXPECT_FALSE(damaged.find("q", 8));
  EXPECT_FALSE(damaged.find("r", 8));

  cuda::GemmAlgoTable nowhere("", file);
  EXPECT_EQ(nowhere.record("p", 6, {}, 8, error), 6);
  EXPECT_EQ(nowhere.find("p", 8), 6);
  std::ofstream(dir + "/a-file") << "";
  cuda::GemmAlgoTable unwritable(dir + "/a-file/under", file);
  EXPECT_EQ(unwritable.record("p", 2, {}, 8, error), 2);
  EXPECT_NE(error.find("cannot make"), std::string::npos) << error;
  EXPECT_EQ(unwritable.find("p", 8), 2);
  std::filesystem::remove_all(dir);
}

// Without a device the first real use of a context fails with CUDA's reason, not a crash.
TEST(CudaKernelsHost, GemmContextNeedsADeviceOnlyWhenUsed) {
  cuda::GemmContext ctx(cuda::GemmMath::kTf32, 1 << 20);
  EXPECT_EQ(ctx.math(), cuda::GemmMath::kTf32);
  EXPECT_EQ(ctx.workspace_bytes(), size_t{1} << 20);
  if (cuda_info().available) {
    EXPECT_NE(ctx.lt_handle(), nullptr);
  } else {
    EXPECT_THROW(ctx.lt_handle(), std::runtime_error);
  }
}

// The fused attention's refusals (flash_attention.h) come before anything touches the device. Without a GPU a device
// call throws std::runtime_error instead, so each EXPECT_THROW(std::invalid_argument) here fails if the order is wrong.
TEST(CudaKernelsHost, FlashAttentionChecksArgumentsBeforeTheDevice) {
  cudaStream_t s = nullptr;
  alignas(16) bf16 x[16];
  alignas(16) float f[16];
  const int32_t len[2] = {4, 4};
  const auto forward = [&](bf16* out, float* lse, const bf16* qkv, int B, int S, int C, int NH) {
    cuda::flash_attention_forward(out, lse, qkv, len, nullptr, B, S, C, NH, true, s);
  };
  const auto backward = [&](bf16* dqkv, float* ws, const bf16* out, const float* lse, int B, int S, int C, int NH) {
    cuda::flash_attention_backward(dqkv, ws, x, x, out, lse, len, nullptr, B, S, C, NH, false, s);
  };
  // Empty problems launch nothing, whatever the pointers, for every supported head size.
  for (int hs : {32, 64, 128}) {
    EXPECT_NO_THROW(forward(nullptr, nullptr, nullptr, 0, 4, 2 * hs, 2)) << hs;
    EXPECT_NO_THROW(backward(nullptr, nullptr, nullptr, nullptr, 2, 0, 2 * hs, 2)) << hs;
  }
  // The forward's query fragments per warp: 0 (the kernel's choice), 1, or 2 at head sizes <= 64 only.
  for (auto [hs, fragments] : {std::pair{64, 0}, {64, 1}, {64, 2}, {32, 2}, {128, 0}, {128, 1}})
    EXPECT_NO_THROW(
        cuda::flash_attention_forward(nullptr, nullptr, nullptr, len, nullptr, 0, 4, 2 * hs, 2, true, s, fragments))
        << hs << " " << fragments;
  for (auto [hs, fragments] : {std::pair{64, -1}, {64, 3}, {128, 2}})
    EXPECT_THROW(
        cuda::flash_attention_forward(nullptr, nullptr, nullptr, len, nullptr, 0, 4, 2 * hs, 2, true, s, fragments),
        std::invalid_argument)
        << hs << " " << fragments;
  // A head size without a kernel is refused even for an empty problem, and the message names it. The model's list
  // (model/attention_kind.h, which the command line checks without CUDA) is the kernels'.
  for (int hs = 1; hs <= 256; ++hs)
    EXPECT_EQ(cuda::flash_attention_supports_head_size(hs), ddplab::fused_attention_supports_head_size(hs)) << hs;
  for (int hs : {1, 12, 16, 48, 96, 256}) {
    EXPECT_FALSE(cuda::flash_attention_supports_head_size(hs));
    try {
      forward(x, f, x, 0, 4, 3 * hs, 3);
      ADD_FAILURE() << "head size " << hs << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("head size C/NH = " + std::to_string(hs) + " "), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(backward(x, f, x, f, 2, 4, 2 * hs, 2), std::invalid_argument) << hs;
    EXPECT_THROW(cuda::flash_attention_backward_workspace_floats(2, 4, 2 * hs, 2), std::invalid_argument) << hs;
  }
  // Bad sizes: negative, no heads, C not a multiple of NH, B x NH or S's 64-row blocks beyond a grid dimension.
  for (auto [B, S, C, NH] :
       {std::array{-1, 4, 128, 2}, std::array{2, -1, 128, 2}, std::array{2, 4, 128, 0}, std::array{2, 4, 130, 2},
        std::array{2, 4, 0, 2}, std::array{1 << 30, 4, 128, 2}, std::array{1, 64 * 65535 + 1, 128, 2}}) {
    EXPECT_THROW(forward(x, f, x, B, S, C, NH), std::invalid_argument) << B << " " << S << " " << C << " " << NH;
    EXPECT_THROW(backward(x, f, x, f, B, S, C, NH), std::invalid_argument) << B << " " << S << " " << C << " " << NH;
  }
  // A batch past gridDim.y's 65535 (short sequences of a classifier): the sequences share x with the heads.
  EXPECT_EQ(cuda::flash_attention_backward_workspace_floats(70000, 4, 128, 2), 70000 * 4 * 128 + 70000 * 2 * 4);
  // Null and misaligned (16-byte) pointers.
  EXPECT_THROW(forward(nullptr, f, x, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(forward(x, nullptr, x, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(forward(x, f, nullptr, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(forward(x, f, x + 1, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(forward(x + 4, f, x, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(backward(nullptr, f, x, f, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(backward(x, nullptr, x, f, 2, 4, 128, 2), std::invalid_argument);  // no workspace
  EXPECT_THROW(backward(x, f + 1, x, f, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(backward(x + 1, f, x, f, 2, 4, 128, 2), std::invalid_argument);
  EXPECT_THROW(backward(x, f, x + 2, f, 2, 4, 128, 2), std::invalid_argument);
  // Packed rows need the causal form, in either direction.
  const int32_t pos[8] = {0, 1, 2, 3, 0, 1, 2, 3};
  EXPECT_THROW(cuda::flash_attention_forward(x, f, x, len, pos, 2, 4, 128, 2, /*causal=*/false, s),
               std::invalid_argument);
  EXPECT_THROW(cuda::flash_attention_backward(x, f, x, x, x, f, len, pos, 2, 4, 128, 2, /*causal=*/false, s),
               std::invalid_argument);
  EXPECT_THROW(backward(x, f, x, nullptr, 2, 4, 128, 2), std::invalid_argument);  // no lse
  EXPECT_THROW(cuda::flash_attention_backward(x, f, x + 1, x, x, f, len, nullptr, 2, 4, 128, 2, true, s),
               std::invalid_argument);  // dout
  EXPECT_THROW(cuda::flash_attention_backward(x, f, x, nullptr, x, f, len, nullptr, 2, 4, 128, 2, true, s),
               std::invalid_argument);  // qkv
  // dQ in fp32 [B, S, C], then D [B, NH, S].
  EXPECT_EQ(cuda::flash_attention_backward_workspace_floats(2, 5, 128, 2), 2 * 5 * 128 + 2 * 2 * 5);
  EXPECT_EQ(cuda::flash_attention_backward_workspace_floats(0, 5, 768, 12), 0);
  // Deterministic: a dQ share per 64-key block (130 keys: 3).
  EXPECT_EQ(cuda::flash_attention_backward_workspace_floats(2, 130, 128, 2, true), 3 * 2 * 130 * 128 + 2 * 2 * 130);
  EXPECT_EQ(cuda::flash_attention_backward_workspace_floats(2, 64, 128, 2, true), 2 * 64 * 128 + 2 * 2 * 64);
}

// cuDNN's attention refuses bad sizes, head sizes it does not take, and bad pointers before anything touches the
// device (as flash_attention.h's does); where it cannot run, availability says why in one line.
TEST(CudaKernelsHost, CudnnAttentionChecksArgumentsBeforeTheDevice) {
  cudaStream_t s = nullptr;
  alignas(16) bf16 x[16];
  alignas(16) float f[16];
  cuda::CudnnAttention attention;
  for (int hs = 1; hs <= 256; ++hs)
    EXPECT_EQ(cuda::cudnn_attention_supports_head_size(hs), ddplab::cudnn_attention_supports_head_size(hs)) << hs;
  for (int hs : {4, 12, 100, 136, 256}) {
    EXPECT_FALSE(cuda::cudnn_attention_supports_head_size(hs));
    EXPECT_THROW(attention.forward(x, f, x, nullptr, 2, 4, 2 * hs, 2, true, s), std::invalid_argument) << hs;
    EXPECT_THROW(attention.backward(x, x, x, x, f, nullptr, 2, 4, 2 * hs, 2, true, s), std::invalid_argument) << hs;
  }
  EXPECT_THROW(attention.forward(x, f, x, nullptr, 2, 4, 130, 2, true, s), std::invalid_argument);  // C % NH
  EXPECT_THROW(attention.forward(x, f, x, nullptr, -1, 4, 128, 2, true, s), std::invalid_argument);
  EXPECT_THROW(attention.forward(x, f, x, nullptr, 2, 1, 128, 2, true, s), std::invalid_argument);  // S = 1
  EXPECT_THROW(attention.backward(x, x, x, x, f, nullptr, 2, 1, 128, 2, false, s), std::invalid_argument);
  std::string why;
  if (cuda::cudnn_attention_available(&why)) {
    EXPECT_TRUE(why.empty()) << why;
    EXPECT_THROW(attention.forward(x + 1, f, x, nullptr, 2, 4, 128, 2, true, s), std::invalid_argument);
    EXPECT_THROW(attention.forward(x, nullptr, x, nullptr, 2, 4, 128, 2, true, s), std::invalid_argument);
    EXPECT_THROW(attention.backward(x, x + 1, x, x, f, nullptr, 2, 4, 128, 2, true, s), std::invalid_argument);
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
    std::cout << "cuDNN attention unavailable here: " << why << "\n";
  }
  EXPECT_NO_THROW(attention.forward(nullptr, nullptr, nullptr, nullptr, 0, 4, 128, 2, true, s));  // empty: nothing
  EXPECT_EQ(attention.build_stats().graphs, 0);
  EXPECT_EQ(cuda::CudnnBuildStats{}.describe(), "0 graphs (static shapes) built in 0.00 s, workspace 0.0 MiB");
  EXPECT_EQ((cuda::CudnnBuildStats{cuda::CudnnShapes::kDynamic, 30, 4, 1234.5, 3 << 20}.describe()),
            "30 graphs (dynamic shapes, 4 of them static) built in 1.23 s, workspace 3.0 MiB");
}

// ---- on the device ----------------------------------------------------------------------------------------------

using CudaKernels = ddplab::gpu_test::DeviceTest;

// LayerNorm. fp32: the same two-pass formula; sums in another order and FMA contraction, so 1e-5 relative on
// outputs of order 1 with 1e-5 absolute. Backward's parameter gradients sum N terms: 1e-5 relative of the sum of
// magnitudes, approximated by atol 1e-5 * N. bf16: inputs pre-rounded on the host, the output rounding is 2^-9
// relative: 8e-3 relative plus 8e-3 absolute.
struct LnShape {
  int N, C;
  int offset;  // elements added to the parameter pointers: 1 misaligns them (the forward's scalar path; the
               // backward stages the weight in shared memory, whatever its alignment)
};
// 5000 rows of 64: more rows than the backward's 2048 warps, which walk several. 1600: 3 warps a backward block, the
// columns past the 1024 (bf16) or 512 (fp32) a lane holds read again. 8192: one warp a block and 64 KB of shared
// memory, asked for past the default 48. 770: the scalar paths (C not a multiple of a pack) on wide rows, the columns
// past the 128 a lane holds read again.
const std::vector<LnShape> kLnShapes = {{1, 1, 0},     {7, 5, 0},     {33, 768, 0}, {33, 768, 1}, {1031, 200, 0},
                                        {5000, 64, 0}, {40, 1600, 0}, {5, 8192, 0}, {33, 770, 0}};

template <typename T>
void layernorm_matches_cpu(cudaStream_t stream, double rtol, double atol) {
  for (const LnShape& sh : kLnShapes) {
    const int N = sh.N, C = sh.C;
    SCOPED_TRACE(shape({{"N", N}, {"C", C}, {"offset", sh.offset}}));
    // Mean 3 and spread 1: the two-pass variance matters.
    std::vector<float> inp = random_vector(int64_t{N} * C, 2.0f, 4.0f, 11 + N);
    std::vector<float> weight = random_vector(C + 1, 0.5f, 1.5f, 12 + C), bias = random_vector(C + 1, -1, 1, 13 + C);
    std::vector<float> dout = random_vector(int64_t{N} * C, -1, 1, 14 + N);
    if constexpr (std::is_same_v<T, bf16>) inp = round_bf16(inp), dout = round_bf16(dout);
    const float* w = weight.data() + sh.offset;
    const float* b = bias.data() + sh.offset;
    std::vector<float> out(int64_t{N} * C), mean(N), rstd(N);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w, b, N, C);

    auto upload = [&](const std::vector<float>& x) {
      if constexpr (std::is_same_v<T, bf16>)
        return std::make_unique<DeviceBuffer<T>>(to_bf16(x), stream);
      else
        return std::make_unique<DeviceBuffer<T>>(x, stream);
    };
    auto download = [](const DeviceBuffer<T>& d) {
      if constexpr (std::is_same_v<T, bf16>)
        return to_f32(d.download());
      else
        return d.download();
    };
    auto d_inp = upload(inp), d_dout = upload(dout);
    DeviceBuffer<T> d_out(int64_t{N} * C, stream);
    DeviceArray d_weight(weight, stream), d_bias(bias, stream), d_mean(N, stream), d_rstd(N, stream);
    cuda::layernorm_forward<T>(d_out.get(), d_mean.get(), d_rstd.get(), d_inp->get(), d_weight.get() + sh.offset,
                               d_bias.get() + sh.offset, N, C, stream);
    EXPECT_TRUE(AllClose(download(d_out), out, rtol, atol)) << "out";
    EXPECT_TRUE(AllClose(d_mean.download(), mean, 1e-5, 1e-6)) << "mean";
    EXPECT_TRUE(AllClose(d_rstd.download(), rstd, 1e-5, 0)) << "rstd";

    // Backward accumulates into all three: start from non-zero values.
    std::vector<float> dinp = random_vector(int64_t{N} * C, -1, 1, 15 + N);
    if constexpr (std::is_same_v<T, bf16>) dinp = round_bf16(dinp);
    std::vector<float> dweight = random_vector(C + 1, -1, 1, 16), dbias = random_vector(C + 1, -1, 1, 17);
    auto d_dinp = upload(dinp);
    DeviceArray d_dweight(dweight, stream), d_dbias(dbias, stream);
    DeviceArray d_scratch(cuda::layernorm_backward_scratch_floats(N, C), stream);
    cpu::layernorm_backward(dinp.data(), dweight.data() + sh.offset, dbias.data() + sh.offset, dout.data(), inp.data(),
                            w, mean.data(), rstd.data(), N, C);
    // The device's own mean and rstd, as a training step would pass them; and dinp's column sums in the same pass
    // (three sums a column: more than 48 KB of shared memory a block at C 768).
    std::vector<float> dcols = random_vector(C, -1, 1, 18);
    DeviceArray d_dcols(dcols, stream);
    cuda::layernorm_backward<T>(d_dinp->get(), d_dweight.get() + sh.offset, d_dbias.get() + sh.offset, d_scratch.get(),
                                d_dout->get(), d_inp->get(), d_weight.get() + sh.offset, d_mean.get(), d_rstd.get(), N,
                                C, stream, /*accumulate=*/true, d_dcols.get());
    const std::vector<float> got_dinp = download(*d_dinp);
    EXPECT_TRUE(AllClose(got_dinp, dinp, rtol, atol)) << "dinp";
    EXPECT_TRUE(AllClose(d_dweight.download(), dweight, rtol, atol * N)) << "dweight";
    EXPECT_TRUE(AllClose(d_dbias.download(), dbias, rtol, atol * N)) << "dbias";
    cpu::bias_backward(dcols.data(), got_dinp.data(), N, C);  // over the dinp the device wrote
    EXPECT_TRUE(AllClose(d_dcols.download(), dcols, rtol, atol * N)) << "dinp's column sums";
  }
}

TEST_F(CudaKernels, LayerNormFp32MatchesCpu) { layernorm_matches_cpu<float>(stream_, 1e-5, 1e-5); }
TEST_F(CudaKernels, LayerNormBf16MatchesCpu) { layernorm_matches_cpu<bf16>(stream_, 8e-3, 8e-3); }

// The parameter gradients are summed in a fixed order: the same inputs give the same bits, run after run.
TEST_F(CudaKernels, LayerNormBackwardIsDeterministic) {
  const int N = 4099, C = 384;
  const std::vector<float> inp = random_vector(int64_t{N} * C, -2, 2, 1),
                           dout = random_vector(int64_t{N} * C, -1, 1, 2);
  const std::vector<float> weight = random_vector(C, 0.5f, 1.5f, 3), bias = random_vector(C, -1, 1, 4);
  DeviceArray d_inp(inp, stream_), d_dout(dout, stream_), d_weight(weight, stream_), d_bias(bias, stream_);
  DeviceArray d_out(int64_t{N} * C, stream_), d_mean(N, stream_), d_rstd(N, stream_);
  DeviceArray d_scratch(cuda::layernorm_backward_scratch_floats(N, C), stream_);
  cuda::layernorm_forward<float>(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(), d_bias.get(), N,
                                 C, stream_);
  std::vector<float> first_dw, first_db;
  for (int run = 0; run < 3; ++run) {
    DeviceArray d_dinp(std::vector<float>(int64_t{N} * C, 0.0f), stream_);
    DeviceArray d_dw(std::vector<float>(C, 0.0f), stream_), d_db(std::vector<float>(C, 0.0f), stream_);
    cuda::layernorm_backward<float>(d_dinp.get(), d_dw.get(), d_db.get(), d_scratch.get(), d_dout.get(), d_inp.get(),
                                    d_weight.get(), d_mean.get(), d_rstd.get(), N, C, stream_);
    if (run == 0) {
      first_dw = d_dw.download(), first_db = d_db.download();
    } else {
      EXPECT_TRUE(BitwiseEqual(d_dw.download(), first_dw)) << "run " << run;
      EXPECT_TRUE(BitwiseEqual(d_db.download(), first_db)) << "run " << run;
    }
  }
}

// Rows wider than the backward is shaped for (its one warp a block holds 3 sums of C floats in shared memory, past
// any GPU's limit at C 20000): refused with the sizes, before the launch, not as CUDA's bare "invalid argument".
TEST_F(CudaKernels, LayerNormBackwardPastTheSharedMemoryIsRefusedWithTheSizes) {
  const int N = 2, C = 20000;
  DeviceArray inp(std::vector<float>(int64_t{N} * C, 1.0f), stream_), dout(int64_t{N} * C, stream_);
  DeviceArray dinp(int64_t{N} * C, stream_), weight(std::vector<float>(C, 1.0f), stream_), mean(N, stream_),
      rstd(N, stream_), dw(C, stream_), db(C, stream_), columns(C, stream_);
  DeviceArray scratch(cuda::layernorm_backward_scratch_floats(N, C), stream_);
  try {
    cuda::layernorm_backward<float>(dinp.get(), dw.get(), db.get(), scratch.get(), dout.get(), inp.get(), weight.get(),
                                    mean.get(), rstd.get(), N, C, stream_, false, columns.get());
    ADD_FAILURE() << "C " << C << " launched";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layernorm_backward_kernel<float"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("320000 bytes of shared memory"), std::string::npos) << e.what();
  }
  cudaCheck(cudaStreamSynchronize(stream_));  // nothing was launched: the stream is as it was
}

// Fused softmax cross-entropy against cpu::softmax_cross_entropy_forward + backward (dlogits times the gradient's
// scale, 1 and 0.7, which the kernel folds in). fp32: the special function unit's 2^x of (x - max) log2 e (~2e-7
// relative a term) vs the CPU's exp_fast, and another summation order: 1e-5 relative (losses, mean) and 1e-6 absolute
// on dlogits, which are O(1/num_valid). bf16: logits
// pre-rounded; dlogits rounded to bf16: 8e-3 relative.
template <typename T>
void cross_entropy_matches_cpu(cudaStream_t stream, double grad_rtol) {
  struct Shape {
    int N, V;
    double ignored;  // fraction of rows with target -1
  };
  // 600 rows of 50304: gpt2-small's vocabulary, a block per row (blocks walking rows, which the grid's limit brings
  // only beyond 65535 rows, run in the emulation: test_softmax_ce_emu).
  for (const Shape sh : {Shape{1, 1, 0}, Shape{5, 7, 0.3}, Shape{64, 1000, 0.25}, Shape{37, 50257, 0.1},
                         Shape{600, 50304, 0.1}, Shape{6, 33, 1.0}}) {
    const int N = sh.N, V = sh.V;
    SCOPED_TRACE(shape({{"N", N}, {"V", V}}));
    std::vector<float> logits = random_vector(int64_t{N} * V, -10, 10, 21 + N);
    if constexpr (std::is_same_v<T, bf16>) logits = round_bf16(logits);
    std::vector<int32_t> targets(N);
    const std::vector<float> u = random_vector(N, 0, 1, 22 + V);
    for (int n = 0; n < N; ++n) targets[n] = u[n] < sh.ignored ? -1 : static_cast<int32_t>(u[n] * 7919) % V;
    std::vector<float> exps(int64_t{N} * V), sums(N), losses(N), dlogits(int64_t{N} * V);
    int64_t num_valid = 0;
    const float mean = cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(),
                                                          targets.data(), N, V, &num_valid);
    cpu::softmax_cross_entropy_backward(dlogits.data(), exps.data(), sums.data(), targets.data(), N, V);

    for (const auto& [alias, scale] : {std::pair{false, 1.0f}, {true, 1.0f}, {false, 0.7f}})
      for (cuda::CrossEntropyRows rows : {cuda::CrossEntropyRows::kStreamed, cuda::CrossEntropyRows::kStaged}) {
        // dlogits written over the logits, as a training step does; a micro-batch's weight on the gradient; each row
        // kernel (staged where the row takes 16-byte packs and fits the block's shared memory: here the widths that
        // are multiples of 8, 50304 among them in both precisions; the others streamed)
        SCOPED_TRACE(std::string(alias ? "dlogits aliases logits" : "separate dlogits") + ", scale " +
                     std::to_string(scale) + (rows == cuda::CrossEntropyRows::kStreamed ? ", streamed" : ", staged"));
        std::unique_ptr<DeviceBuffer<T>> d_logits, d_dlogits;
        if constexpr (std::is_same_v<T, bf16>)
          d_logits = std::make_unique<DeviceBuffer<T>>(to_bf16(logits), stream);
        else
          d_logits = std::make_unique<DeviceBuffer<T>>(logits, stream);
        if (!alias) d_dlogits = std::make_unique<DeviceBuffer<T>>(int64_t{N} * V, stream);
        T* dl = alias ? d_logits->get() : d_dlogits->get();
        DeviceBuffer<int32_t> d_targets(targets, stream), d_count(1, stream);
        DeviceArray d_losses(N, stream), d_mean(1, stream);
        cuda::softmax_cross_entropy_fused<T>(dl, d_losses.get(), d_mean.get(), d_count.get(), d_logits->get(),
                                             d_targets.get(), N, V, scale, stream, rows);
        EXPECT_EQ(d_count.download()[0], num_valid);
        EXPECT_TRUE(AllClose(d_losses.download(), losses, 1e-5, 1e-6)) << "losses";
        EXPECT_TRUE(AllClose(d_mean.download(), {mean}, 1e-5, 1e-7)) << "mean";
        std::vector<float> got;
        if constexpr (std::is_same_v<T, bf16>)
          got = to_f32((alias ? *d_logits : *d_dlogits).download());
        else
          got = (alias ? *d_logits : *d_dlogits).download();
        std::vector<float> want = dlogits;
        for (float& g : want) g *= scale;
        EXPECT_TRUE(AllClose(got, want, grad_rtol, 1e-6)) << "dlogits";
      }
  }
}

TEST_F(CudaKernels, SoftmaxCrossEntropyFp32MatchesCpu) { cross_entropy_matches_cpu<float>(stream_, 1e-5); }
TEST_F(CudaKernels, SoftmaxCrossEntropyBf16MatchesCpu) { cross_entropy_matches_cpu<bf16>(stream_, 8e-3); }

// Forward only (null dlogits), and logits of a magnitude whose exp overflows without the max subtraction.
TEST_F(CudaKernels, SoftmaxCrossEntropyForwardOnlyLargeLogits) {
  const int N = 3, V = 129;
  std::vector<float> logits = random_vector(int64_t{N} * V, 500, 900, 5);
  std::vector<int32_t> targets = {0, 128, 64};
  std::vector<float> exps(int64_t{N} * V), sums(N), losses(N);
  const float mean =
      cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), N, V);
  DeviceArray d_logits(logits, stream_), d_losses(N, stream_), d_mean(1, stream_);
  DeviceBuffer<int32_t> d_targets(targets, stream_), d_count(1, stream_);
  cuda::softmax_cross_entropy_fused<float>(nullptr, d_losses.get(), d_mean.get(), d_count.get(), d_logits.get(),
                                           d_targets.get(), N, V, 1.0f, stream_);
  EXPECT_TRUE(AllClose(d_losses.download(), losses, 1e-5, 1e-4));
  EXPECT_TRUE(AllClose(d_mean.download(), {mean}, 1e-5, 1e-4));
  EXPECT_TRUE(AllClose(d_logits.download(), logits, 0, 0)) << "logits must be left alone";
}

// Embedding. Forward is one fp32 add per element on both sides (bitwise); dwpe sums in the CPU's order (bitwise), dwte
// through the rows sorted by token (CUB's radix sort) in the order of cpu::embedding_backward_wte_in_pieces (bitwise:
// the CPU's own where no token has more rows than a piece), from fp32 dout and from bf16 dout against the CPU on its
// values. Padded positions hold tokens far out of range, which must never be read. The last shapes: one token over the
// 1171 valid rows of 8 × 1024 (one run of 19 pieces), and gpt2-small's vocabulary with a workspace made for more rows
// than the batch has.
// Packed rows (--batching pack: sequences of 1 to 13 tokens back to back, so that each position recurs along a row)
// on the shapes with wpe.
TEST_F(CudaKernels, EmbeddingMatchesCpu) {
  struct Shape {
    int B, S, C, V;
    bool wpe, packed = false;
  };
  for (const Shape sh :
       {Shape{1, 1, 1, 1, true}, Shape{3, 5, 7, 11, true}, Shape{4, 33, 64, 5, true}, Shape{4, 33, 64, 50, false},
        Shape{2, 130, 768, 1000, true}, Shape{8, 1024, 768, 1, true}, Shape{3, 1000, 768, 50304, true},
        Shape{3, 5, 7, 11, true, true}, Shape{2, 130, 768, 1000, true, true}, Shape{8, 1024, 768, 50304, true, true}}) {
    const int B = sh.B, S = sh.S, C = sh.C, V = sh.V;
    SCOPED_TRACE(shape({{"B", B}, {"S", S}, {"C", C}, {"V", V}, {"wpe", sh.wpe}, {"packed", sh.packed}}));
    std::vector<int32_t> positions;  // row b's sequences of (b * 7) % 13 + 1 tokens
    for (int64_t r = 0; sh.packed && r < int64_t{B} * S; ++r)
      positions.push_back(static_cast<int32_t>(r % S % ((r / S * 7) % 13 + 1)));
    std::unique_ptr<DeviceBuffer<int32_t>> d_positions;
    if (sh.packed) d_positions = std::make_unique<DeviceBuffer<int32_t>>(positions, stream_);
    const int32_t* pos = sh.packed ? positions.data() : nullptr;
    const int32_t* d_pos = sh.packed ? d_positions->get() : nullptr;
    std::vector<int32_t> lengths(B);
    for (int b = 0; b < B; ++b)
      lengths[b] = b == 0 ? S : b == B - 1 && B > 2 ? 0 : (b * 7) % (S + 1);  // full, 0, partial
    std::vector<int32_t> tokens(int64_t{B} * S);
    const std::vector<float> u = random_vector(int64_t{B} * S, 0, 1, 31 + S);
    for (int64_t r = 0; r < int64_t{B} * S; ++r)
      tokens[r] = r % S < lengths[r / S] ? static_cast<int32_t>(u[r] * 7919) % V : (r % 2 ? -123456 : 1 << 30);
    const std::vector<float> wte = random_vector(int64_t{V} * C, -1, 1, 32),
                             wpe = random_vector(int64_t{S} * C, -1, 1, 33);
    std::vector<float> out(int64_t{B} * S * C);
    cpu::embedding_forward(out.data(), tokens.data(), lengths.data(), wte.data(), sh.wpe ? wpe.data() : nullptr, B, S,
                           C, pos);
    DeviceBuffer<int32_t> d_tokens(tokens, stream_), d_lengths(lengths, stream_);
    DeviceArray d_wte(wte, stream_), d_wpe(wpe, stream_), d_out(int64_t{B} * S * C, stream_);
    cuda::embedding_forward<float>(d_out.get(), d_tokens.get(), d_lengths.get(), d_pos, d_wte.get(),
                                   sh.wpe ? d_wpe.get() : nullptr, B, S, C, stream_);
    EXPECT_TRUE(BitwiseEqual(d_out.download(), out)) << "out";
    DeviceBuffer<bf16> d_out16(int64_t{B} * S * C, stream_);
    cuda::embedding_forward<bf16>(d_out16.get(), d_tokens.get(), d_lengths.get(), d_pos, d_wte.get(),
                                  sh.wpe ? d_wpe.get() : nullptr, B, S, C, stream_);
    EXPECT_TRUE(BitwiseEqual(to_f32(d_out16.download()), round_bf16(out))) << "bf16 out";

    const size_t sort_bytes = cuda::rows_by_token_workspace_bytes(int64_t{B} * S + 100, V, C);
    DeviceBuffer<char> sort_space(static_cast<int64_t>(sort_bytes), stream_);
    const cuda::RowsByToken sorted =
        cuda::sort_rows_by_token(sort_space.get(), sort_bytes, d_tokens.get(), d_lengths.get(), B, S, V, C, stream_);
    const std::vector<float> dout = random_vector(int64_t{B} * S * C, -1, 1, 34);
    const std::vector<float> dwte0 = random_vector(int64_t{V} * C, -1, 1, 35),
                             dwpe0 = random_vector(int64_t{S} * C, -1, 1, 36);
    for (const bool bf16_dout : {false, true}) {
      SCOPED_TRACE(bf16_dout ? "bf16 dout" : "fp32 dout");
      const std::vector<float> d = bf16_dout ? round_bf16(dout) : dout;
      std::vector<float> dwte = dwte0, dwpe = dwpe0;
      DeviceArray d_dwte(dwte, stream_), d_dwpe(dwpe, stream_);
      cpu::embedding_backward_wte_in_pieces(dwte.data(), d.data(), tokens.data(), lengths.data(), B, S, C,
                                            cuda::kEmbeddingPieceRows);
      std::vector<float> dwte_in_row_order = dwte0;  // the CPU's dwte, for dwpe beside it
      cpu::embedding_backward(dwte_in_row_order.data(), sh.wpe ? dwpe.data() : nullptr, d.data(), tokens.data(),
                              lengths.data(), B, S, C, pos);
      // The piece order's reference is the row order's sums, added in another order: the same within rounding.
      EXPECT_TRUE(AllClose(dwte, dwte_in_row_order, 1e-5, 1e-5)) << "dwte in pieces against dwte in row order";
      if (bf16_dout) {
        DeviceBuffer<bf16> d_dout(to_bf16(dout), stream_);
        cuda::embedding_backward<bf16>(d_dwte.get(), sh.wpe ? d_dwpe.get() : nullptr, d_dout.get(), sorted,
                                       d_lengths.get(), d_pos, B, S, C, stream_);
      } else {
        DeviceArray d_dout(dout, stream_);
        cuda::embedding_backward<float>(d_dwte.get(), sh.wpe ? d_dwpe.get() : nullptr, d_dout.get(), sorted,
                                        d_lengths.get(), d_pos, B, S, C, stream_);
      }
      EXPECT_TRUE(BitwiseEqual(d_dwte.download(), dwte)) << "dwte";
      EXPECT_TRUE(BitwiseEqual(d_dwpe.download(), dwpe)) << "dwpe";
    }
  }
}

// Attention against the CPU kernel, causal and bidirectional, with padded sequences (one of length 0) whose
// padded rows of qkv and dout are NaN: neither side may read them. fp32 GEMMs sum in another order and the scale
// is applied after the dot product instead of before: 1e-4 relative, 1e-5 absolute. TF32 rounds the GEMM inputs
// to 10 mantissa bits: 5e-3. Masked att entries must be exactly 0 on both sides.
struct AttnShape {
  int B, S, C, NH;
  std::vector<int32_t> lengths;
};
const std::vector<AttnShape> kAttnShapes = {
    {1, 1, 1, 1, {1}}, {3, 7, 12, 2, {7, 3, 0}}, {2, 33, 20, 4, {33, 17}}, {2, 64, 128, 2, {64, 37}}};

void attention_matches_cpu(cudaStream_t stream, cuda::GemmMath math, double rtol, double atol) {
  cuda::GemmContext ctx(math);
  for (const AttnShape& sh : kAttnShapes) {
    for (bool causal : {false, true}) {
      const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH;
      SCOPED_TRACE(shape({{"B", B}, {"S", S}, {"C", C}, {"NH", NH}, {"causal", causal}}));
      std::vector<float> qkv = random_vector(int64_t{B} * S * 3 * C, -1, 1, 41 + S);
      std::vector<float> dout = random_vector(int64_t{B} * S * C, -1, 1, 42 + S);
      for (int b = 0; b < B; ++b)
        for (int t = sh.lengths[b]; t < S; ++t) {
          std::fill_n(qkv.begin() + (int64_t{b} * S + t) * 3 * C, 3 * C, kNaN);
          std::fill_n(dout.begin() + (int64_t{b} * S + t) * C, C, kNaN);
        }
      std::vector<float> out(int64_t{B} * S * C), att(int64_t{B} * NH * S * S), dqkv(qkv.size());
      cpu::attention_forward(out.data(), att.data(), qkv.data(), sh.lengths.data(), B, S, C, NH, causal);
      cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), sh.lengths.data(), B, S,
                              C, NH, causal);

      DeviceArray d_qkv(qkv, stream), d_dout(dout, stream);
      DeviceArray d_out(out.size(), stream), d_att(att.size(), stream), d_dqkv(dqkv.size(), stream);
      DeviceBuffer<int32_t> d_lengths(sh.lengths, stream);
      DeviceArray d_ws(std::max(cuda::attention_forward_workspace_floats(B, S, C, NH),
                                cuda::attention_backward_workspace_floats(B, S, C, NH)),
                       stream);
      cuda::attention_forward(ctx, d_out.get(), d_att.get(), d_ws.get(), d_qkv.get(), d_lengths.get(), B, S, C, NH,
                              causal, stream);
      const std::vector<float> got_att = d_att.download();
      EXPECT_TRUE(AllClose(d_out.download(), out, rtol, atol)) << "out";
      EXPECT_TRUE(AllClose(got_att, att, rtol, atol)) << "att";
      int64_t nonzero_masked = 0;
      for (size_t i = 0; i < att.size(); ++i) nonzero_masked += att[i] == 0.0f && got_att[i] != 0.0f;
      EXPECT_EQ(nonzero_masked, 0) << "masked attention weights must be exactly 0";

      cuda::attention_backward(ctx, d_dqkv.get(), d_ws.get(), d_dout.get(), d_qkv.get(), d_att.get(), d_lengths.get(),
                               B, S, C, NH, causal, stream);
      EXPECT_TRUE(AllClose(d_dqkv.download(), dqkv, rtol, atol)) << "dqkv";
    }
  }
}

TEST_F(CudaKernels, AttentionFp32MatchesCpu) { attention_matches_cpu(stream_, cuda::GemmMath::kFp32, 1e-4, 1e-5); }
TEST_F(CudaKernels, AttentionTf32MatchesCpu) { attention_matches_cpu(stream_, cuda::GemmMath::kTf32, 5e-3, 5e-3); }

// The fused bf16 attention (flash_attention.h) against the CPU reference (flash_test_util.h: inputs, reference,
// tolerances), outputs poisoned first and guard tails checked. Causal and bidirectional; S of 1, 17, 64, 100, 130 and
// 200 (one block exactly, less than one, several with a partial last one); head sizes 32, 64 and 128; one to four
// heads and sequences; lengths padded, 0, 1 and full, and null (all S); and one case with amplitude 12, scores up to a
// few hundred, so that the online softmax's running max moves across key blocks and exp must not overflow.
// tests/emu runs the same kernels, emulated on the CPU, against the same checks.
const std::vector<FlashShape> kFlashShapes = {{1, 1, 64, 1, {1}},           {3, 17, 128, 2, {17, 5, 0}},
                                              {2, 64, 64, 1, {}},           {2, 100, 192, 3, {100, 63}},
                                              {2, 130, 128, 4, {130, 129}}, {4, 130, 256, 2, {65, 130, 1, 0}},
                                              {1, 200, 128, 2, {}, 12.0f},  {2, 200, 64, 2, {200, 127}}};

void flash_attention_matches_cpu(cudaStream_t stream, const FlashShape& sh, bool causal, bool deterministic) {
  const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH;
  SCOPED_TRACE(sh.describe(causal) + (deterministic ? ", deterministic dQ" : ""));
  const FlashCase fc = make_flash_case(sh, causal);

  DeviceBuffer<bf16> d_qkv(to_bf16(fc.qkv), stream), d_dout(to_bf16(fc.dout), stream);
  DeviceBuffer<bf16> d_out(int64_t{B} * S * C, stream), d_dqkv(int64_t{B} * S * 3 * C, stream);
  DeviceArray d_lse(int64_t{B} * NH * S, stream),
      d_ws(cuda::flash_attention_backward_workspace_floats(B, S, C, NH, deterministic), stream);
  std::unique_ptr<DeviceBuffer<int32_t>> d_lengths;
  if (!sh.lengths.empty()) d_lengths = std::make_unique<DeviceBuffer<int32_t>>(sh.lengths, stream);
  const int32_t* lengths = d_lengths ? d_lengths->get() : nullptr;
  std::unique_ptr<DeviceBuffer<int32_t>> d_positions;
  if (!sh.positions.empty()) d_positions = std::make_unique<DeviceBuffer<int32_t>>(sh.positions, stream);
  const int32_t* positions = d_positions ? d_positions->get() : nullptr;
  cuda::flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), lengths, positions, B, S, C, NH, causal, stream);
  cuda::flash_attention_backward(d_dqkv.get(), d_ws.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), lengths,
                                 positions, B, S, C, NH, causal, stream, deterministic);
  expect_flash_matches("flash", sh, causal, fc, to_f32(d_out.download()), d_lse.download(), to_f32(d_dqkv.download()));
}

TEST_F(CudaKernels, FlashAttentionMatchesCpu) {
  for (const FlashShape& sh : kFlashShapes)
    for (bool causal : {false, true}) flash_attention_matches_cpu(stream_, sh, causal, /*deterministic=*/false);
}

// The deterministic backward (--deterministic on: dQ from per-key-block shares summed in order) on the same cases.
TEST_F(CudaKernels, FlashAttentionDeterministicMatchesCpu) {
  for (const FlashShape& sh : kFlashShapes)
    for (bool causal : {false, true}) flash_attention_matches_cpu(stream_, sh, causal, /*deterministic=*/true);
}

// Packed rows (--batching pack), causal: sequences starting and ending inside blocks and on their edges, one token
// long, a row of many short ones, one longer than a block, padding after the last; gpt2-small's S 1024 and hs 64
// with sequences of a few hundred tokens; both dQ sums. tests/emu runs the small ones emulated.
TEST_F(CudaKernels, FlashAttentionPackedRowsMatchCpu) {
  using ddplab::flash_test::packed_rows;
  const std::vector<FlashShape> shapes = {
      packed_rows({2, 130, 128, 2, {}}, {{50, 14, 66}, {1, 63, 64, 1}}),
      packed_rows({3, 200, 64, 1, {}}, {{20, 150, 30}, {1, 1, 1, 1, 5, 9, 3, 100, 7}, {190}}),
      packed_rows({2, 300, 256, 2, {}}, {{128, 64, 108}, {299}}),
      packed_rows({1, 1024, 128, 2, {}}, {{300, 211, 64, 449}})};
  for (const FlashShape& sh : shapes)
    for (bool deterministic : {false, true}) flash_attention_matches_cpu(stream_, sh, /*causal=*/true, deterministic);
}

// The same inputs twice give the same out, lse, dK and dV bit for bit; dQ too with the deterministic backward, not
// with the default one, whose key blocks' shares are added with atomics in whatever order they land
// (flash_attention.h). gpt2-small's head size, many key blocks.
TEST_F(CudaKernels, FlashAttentionIsDeterministicButForTheDefaultDq) {
  const int B = 2, S = 640, C = 256, NH = 4;
  const std::vector<int32_t> lengths = {640, 411};
  DeviceBuffer<bf16> d_qkv(to_bf16(random_vector(int64_t{B} * S * 3 * C, -2, 2, 61)), stream_);
  DeviceBuffer<bf16> d_dout(to_bf16(random_vector(int64_t{B} * S * C, -1, 1, 62)), stream_);
  DeviceBuffer<int32_t> d_lengths(lengths, stream_);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic dQ" : "dQ by atomics");
    std::vector<float> first_out, first_lse, first_dkv, first_dq;
    for (int run = 0; run < 3; ++run) {
      DeviceBuffer<bf16> d_out(int64_t{B} * S * C, stream_), d_dqkv(int64_t{B} * S * 3 * C, stream_);
      DeviceArray d_lse(int64_t{B} * NH * S, stream_),
          d_ws(cuda::flash_attention_backward_workspace_floats(B, S, C, NH, deterministic), stream_);
      cuda::flash_attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), d_lengths.get(), nullptr, B, S, C, NH, true,
                                    stream_);
      cuda::flash_attention_backward(d_dqkv.get(), d_ws.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                     d_lengths.get(), nullptr, B, S, C, NH, true, stream_, deterministic);
      const std::vector<float> out = to_f32(d_out.download()), lse = d_lse.download(), dqkv = to_f32(d_dqkv.download());
      std::vector<float> dq, dkv;
      for (int64_t row = 0; row < int64_t{B} * S; ++row) {
        dq.insert(dq.end(), dqkv.begin() + row * 3 * C, dqkv.begin() + row * 3 * C + C);
        dkv.insert(dkv.end(), dqkv.begin() + row * 3 * C + C, dqkv.begin() + (row + 1) * 3 * C);
      }
      if (run == 0) {
        first_out = out, first_lse = lse, first_dkv = dkv, first_dq = dq;
        continue;
      }
      EXPECT_TRUE(BitwiseEqual(out, first_out)) << "out";
      EXPECT_TRUE(BitwiseEqual(lse, first_lse)) << "lse";
      EXPECT_TRUE(BitwiseEqual(dkv, first_dkv)) << "dk, dv";
      if (deterministic) {
        EXPECT_TRUE(BitwiseEqual(dq, first_dq)) << "dq";
      }
    }
  }
}

// cuDNN's fused attention (cudnn_attention.h) on the same shapes and checks as ours but S = 1 (which cuDNN refuses),
// and for two things its contract leaves open: padded rows of qkv and dout hold finite values (cuDNN may read them),
// and padded rows' lse is not checked. With its default backward and with its deterministic one (--deterministic on).
// Skipped, with the reason, where cuDNN's attention is not built or its library does not load. Dynamic shapes: the
// same checks, each structure's shapes from one kernel cache (what cuDNN refused so is built static, and counted).
void cudnn_attention_matches_cpu(cudaStream_t stream, bool deterministic,
                                 cuda::CudnnShapes shapes = cuda::CudnnShapes::kStatic) {
  cuda::CudnnAttention attention(deterministic, shapes);
  int64_t problems = 0;
  for (const FlashShape& sh : kFlashShapes)
    for (bool causal : {false, true}) {
      const int B = sh.B, S = sh.S, C = sh.C, NH = sh.NH;
      if (S == 1) continue;  // refused (CudaKernelsHost.CudnnAttentionChecksArgumentsBeforeTheDevice)
      problems += 2;         // a forward and a backward graph
      SCOPED_TRACE(sh.describe(causal));
      const FlashCase fc = make_flash_case(sh, causal, /*poison_padding=*/false);
      DeviceBuffer<bf16> d_qkv(to_bf16(fc.qkv), stream), d_dout(to_bf16(fc.dout), stream);
      DeviceBuffer<bf16> d_out(int64_t{B} * S * C, stream), d_dqkv(int64_t{B} * S * 3 * C, stream);
      DeviceArray d_lse(int64_t{B} * NH * S, stream);
      std::unique_ptr<DeviceBuffer<int32_t>> d_lengths;
      if (!sh.lengths.empty()) d_lengths = std::make_unique<DeviceBuffer<int32_t>>(sh.lengths, stream);
      const int32_t* lengths = d_lengths ? d_lengths->get() : nullptr;
      attention.forward(d_out.get(), d_lse.get(), d_qkv.get(), lengths, B, S, C, NH, causal, stream);
      attention.backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), lengths, B, S, C, NH,
                         causal, stream);
      expect_flash_matches(deterministic ? "cudnn deterministic" : "cudnn", sh, causal, fc, to_f32(d_out.download()),
                           d_lse.download(), to_f32(d_dqkv.download()), /*padded_lse_defined=*/false);
    }
  // One graph per direction and problem (shape, causal, padded or not), built once.
  const cuda::CudnnBuildStats stats = attention.build_stats();
  EXPECT_EQ(stats.graphs, problems);
  EXPECT_EQ(stats.shapes, shapes);
  if (shapes == cuda::CudnnShapes::kDynamic)  // static for what cuDNN refuses, but dynamic for some at least
    EXPECT_LT(stats.built_static, problems) << "cuDNN refused every graph a dynamic shape: " << stats.describe();
  else
    EXPECT_EQ(stats.built_static, 0);
  std::cout << "cuDNN attention: " << stats.describe() << "\n";
}

TEST_F(CudaKernels, CudnnAttentionMatchesCpu) {
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << why;
  cudnn_attention_matches_cpu(stream_, /*deterministic=*/false);
}

TEST_F(CudaKernels, CudnnDynamicShapeAttentionMatchesCpu) {
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << why;
  cudnn_attention_matches_cpu(stream_, /*deterministic=*/false, cuda::CudnnShapes::kDynamic);
}

TEST_F(CudaKernels, CudnnDeterministicAttentionMatchesCpu) {
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << why;
  cudnn_attention_matches_cpu(stream_, /*deterministic=*/true);
}

// --deterministic on's promise at the kernel: cuDNN's deterministic backward gives the same dQ, dK and dV bit for bit
// on every call, at gpt2-small's head size, with many key tiles per query (where a dQ added by atomics would vary),
// padded and causal. Five backwards from one forward.
TEST_F(CudaKernels, CudnnDeterministicAttentionRepeatsBitForBit) {
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << why;
  const int B = 2, S = 640, C = 256, NH = 4;
  const std::vector<int32_t> lengths = {640, 411};
  cuda::CudnnAttention attention(/*deterministic_backward=*/true);
  DeviceBuffer<bf16> d_qkv(to_bf16(random_vector(int64_t{B} * S * 3 * C, -2, 2, 71)), stream_);
  DeviceBuffer<bf16> d_dout(to_bf16(random_vector(int64_t{B} * S * C, -1, 1, 72)), stream_);
  DeviceBuffer<int32_t> d_lengths(lengths, stream_);
  DeviceBuffer<bf16> d_out(int64_t{B} * S * C, stream_), d_dqkv(int64_t{B} * S * 3 * C, stream_);
  DeviceArray d_lse(int64_t{B} * NH * S, stream_);
  attention.forward(d_out.get(), d_lse.get(), d_qkv.get(), d_lengths.get(), B, S, C, NH, true, stream_);
  std::vector<bf16> first;
  for (int run = 0; run < 5; ++run) {
    attention.backward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), d_lengths.get(), B, S, C, NH,
                       true, stream_);
    const std::vector<bf16> dqkv = d_dqkv.download();
    if (run == 0) {
      first = dqkv;
      continue;
    }
    SCOPED_TRACE("backward " + std::to_string(run));
    EXPECT_TRUE(BitwiseEqual(to_f32(dqkv), to_f32(first))) << "dq, dk, dv";
  }
}

// GEMMs. Errors are bounded relative to sum_k |a_ik b_kj| (absdot, from the CPU GEMM on absolute values), not to
// the result, which can cancel: fp32 1e-5 of absdot; TF32 (inputs rounded to 10 mantissa bits) 2e-3; bf16 inputs
// are pre-rounded on the host, so products are exact and the sum is fp32: 1e-5 of absdot, plus the bf16 rounding
// of the output, 4e-3 relative — relative to |result| + |GEMM before bias|, since the fallback epilogue rounds
// the product to bf16 before adding the bias. GELU outputs get 5e-4 relative more: a tanh evaluated another way (CUDA's
// tanhf, or cuBLASLt's epilogue) within that of the CPU's.
struct GemmShape {
  int B, C, OC;
};
const std::vector<GemmShape> kGemmShapes = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {64, 96, 40}, {129, 256, 72}};

::testing::AssertionResult GemmClose(const std::vector<float>& got, const std::vector<float>& want,
                                     const std::vector<float>& absdot, double tol, double out_rtol,
                                     const std::vector<float>& before_bias = {}) {
  std::vector<float> scaled_err(got.size()), zeros(got.size(), 0.0f);
  for (size_t i = 0; i < got.size(); ++i) {
    const double mag = std::fabs(want[i]) + (before_bias.empty() ? 0.0 : std::fabs(before_bias[i]));
    const double bound = tol * absdot[i] + out_rtol * mag + 1e-7;
    scaled_err[i] = static_cast<float>((static_cast<double>(got[i]) - want[i]) / bound);  // NaN stays NaN
  }
  return AllClose(scaled_err, zeros, 0, 1.0);  // |error| <= bound everywhere; "got" in a failure is error / bound
}

std::vector<float> abs_of(std::vector<float> x) {
  for (float& v : x) v = std::fabs(v);
  return x;
}

// What a context did in gemms_match_cpu: its plans timed and read from the table, those of the accumulating weight
// gradient among the timed, and every output it produced, in order.
struct GemmRun {
  int64_t timed = 0, read = 0, weight_timed = 0;
  std::vector<float> outputs;
};

// timed_table: the context times its algorithms (GemmContext::set_timed_algos) with its table there; "" the
// heuristic's first.
template <typename T>
GemmRun gemms_match_cpu(cudaStream_t stream, cuda::GemmMath math, double tol, double out_rtol,
                        const std::string& timed_table = "") {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  cuda::GemmContext ctx(math);
  if (!timed_table.empty()) ctx.set_timed_algos(true, timed_table);
  GemmRun run;
  const auto keep = [&run](std::vector<float> x) {
    run.outputs.insert(run.outputs.end(), x.begin(), x.end());
    return x;
  };
  auto upload = [&](const std::vector<float>& x) {
    if constexpr (kBf16)
      return std::make_unique<DeviceBuffer<T>>(to_bf16(x), stream);
    else
      return std::make_unique<DeviceBuffer<T>>(x, stream);
  };
  auto download = [](const DeviceBuffer<T>& d) {
    if constexpr (kBf16)
      return to_f32(d.download());
    else
      return d.download();
  };
  auto maybe_round = [](std::vector<float> x) { return kBf16 ? round_bf16(x) : x; };
  for (const GemmShape& sh : kGemmShapes) {
    const int B = sh.B, C = sh.C, OC = sh.OC;
    SCOPED_TRACE(shape({{"B", B}, {"C", C}, {"OC", OC}}));
    const std::vector<float> inp = maybe_round(random_vector(int64_t{B} * C, -1, 1, 51 + B));
    const std::vector<float> weight = maybe_round(random_vector(int64_t{OC} * C, -1, 1, 52 + C));
    const std::vector<float> bias = maybe_round(random_vector(OC, -1, 1, 53 + OC));  // a T, as D
    const std::vector<float> dout = maybe_round(random_vector(int64_t{B} * OC, -1, 1, 54 + OC));
    auto d_inp = upload(inp), d_weight = upload(weight), d_dout = upload(dout), d_bias = upload(bias);

    // forward: plain, + bias, + bias + GELU (pre-activation kept)
    std::vector<float> plain(int64_t{B} * OC), absdot(int64_t{B} * OC);
    cpu::matmul_forward(plain.data(), inp.data(), weight.data(), B, C, OC);
    cpu::matmul_forward(absdot.data(), abs_of(inp).data(), abs_of(weight).data(), B, C, OC);
    std::vector<float> biased = plain, gelu(plain.size());
    cpu::bias_forward(biased.data(), bias.data(), B, OC);
    cpu::gelu_forward(gelu.data(), biased.data(), static_cast<int64_t>(gelu.size()));
    DeviceBuffer<T> d_out(int64_t{B} * OC, stream), d_pre(int64_t{B} * OC, stream);
    cuda::matmul_forward<T>(ctx, d_out.get(), d_inp->get(), d_weight->get(), nullptr, B, C, OC, stream);
    EXPECT_TRUE(GemmClose(keep(download(d_out)), plain, absdot, tol, out_rtol)) << "forward";
    cuda::matmul_forward<T>(ctx, d_out.get(), d_inp->get(), d_weight->get(), d_bias->get(), B, C, OC, stream);
    EXPECT_TRUE(GemmClose(keep(download(d_out)), biased, absdot, tol, out_rtol, plain)) << "forward + bias";
    // + bias + residual (the residual as cuBLASLt's C), into a buffer of its own (in place is refused: gemm.h)
    const std::vector<float> residual = maybe_round(random_vector(int64_t{B} * OC, -2, 2, 57 + OC));
    std::vector<float> with_residual = biased, before_bias = plain;
    for (size_t i = 0; i < residual.size(); ++i) with_residual[i] += residual[i], before_bias[i] += residual[i];
    auto d_residual = upload(residual);
    cuda::matmul_residual_forward<T>(ctx, d_out.get(), d_inp->get(), d_weight->get(), d_bias->get(), d_residual->get(),
                                     B, C, OC, stream);
    EXPECT_TRUE(GemmClose(keep(download(d_out)), with_residual, absdot, tol, out_rtol, before_bias))
        << "forward + residual";
    cuda::matmul_bias_gelu_forward<T>(ctx, d_out.get(), d_pre.get(), d_inp->get(), d_weight->get(), d_bias->get(), B, C,
                                      OC, stream);
    EXPECT_TRUE(GemmClose(keep(download(d_pre)), biased, absdot, tol, out_rtol, plain)) << "forward + bias + gelu: pre";
    EXPECT_TRUE(GemmClose(keep(download(d_out)), gelu, absdot, tol, out_rtol + 5e-4, plain))
        << "forward + bias + gelu: out";

    // backward input (overwrites)
    std::vector<float> dinp(int64_t{B} * C), dinp_abs(int64_t{B} * C);
    cpu::matmul_backward_input(dinp.data(), dout.data(), weight.data(), B, C, OC);
    cpu::matmul_backward_input(dinp_abs.data(), abs_of(dout).data(), abs_of(weight).data(), B, C, OC);
    DeviceBuffer<T> d_dinp(int64_t{B} * C, stream);
    cuda::matmul_backward_input<T>(ctx, d_dinp.get(), d_dout->get(), d_weight->get(), B, C, OC, stream);
    EXPECT_TRUE(GemmClose(keep(download(d_dinp)), dinp, dinp_abs, tol, out_rtol)) << "backward input";

    // backward weight (accumulates in fp32), whole and as two row blocks; bias gradient (accumulates)
    const std::vector<float> dweight0 = random_vector(int64_t{OC} * C, -1, 1, 55);
    std::vector<float> dweight = dweight0, dw_abs(int64_t{OC} * C, 0.0f);
    cpu::matmul_backward_weight(dweight.data(), dout.data(), inp.data(), B, C, OC, 0, OC);
    cpu::matmul_backward_weight(dw_abs.data(), abs_of(dout).data(), abs_of(inp).data(), B, C, OC, 0, OC);
    for (float& v : dw_abs) v += 1.0f;  // the initial values, |dweight0| <= 1, are part of the sum
    const int64_t timed_before_weights = ctx.timed_plans();
    for (int split : {OC, OC / 2}) {
      SCOPED_TRACE("row blocks [0, " + std::to_string(split) + "), [" + std::to_string(split) + ", OC)");
      DeviceArray d_dweight(dweight0, stream);
      cuda::matmul_backward_weight<T>(ctx, d_dweight.get(), d_dout->get(), d_inp->get(), B, C, OC, 0, split, stream);
      cuda::matmul_backward_weight<T>(ctx, d_dweight.get(), d_dout->get(), d_inp->get(), B, C, OC, split, OC, stream);
      EXPECT_TRUE(GemmClose(keep(d_dweight.download()), dweight, dw_abs, tol, 0)) << "backward weight";
    }
    run.weight_timed += ctx.timed_plans() - timed_before_weights;
    std::vector<float> dbias = random_vector(OC, -1, 1, 56);
    DeviceArray d_dbias(dbias, stream);
    cpu::bias_backward(dbias.data(), dout.data(), B, OC);
    cuda::bias_backward<T>(ctx, d_dbias.get(), d_dout->get(), B, OC, stream);
    EXPECT_TRUE(AllClose(d_dbias.download(), dbias, 1e-5, 1e-6 * B)) << "bias backward";

    // Backward input through the GELU (cuBLASLt's DGELU epilogue, or the GEMM and gelu_backward): pre_gelu within
    // [-3, 3], where gelu' spans [-0.13, 1.13]. Bounded as forward + GELU: the GEMM's error times |gelu'| <= 1.2, the
    // fallback's two roundings relative to |result| + |product|, and 5e-4 of |product| for gelu' computed another way
    // (its zero near -0.75 makes a relative bound on the result alone too tight there).
    {
      const std::vector<float> pre = maybe_round(random_vector(int64_t{B} * C, -3, 3, 58 + C));
      auto d_pre = upload(pre);
      std::vector<float> want(int64_t{B} * C), scaled_abs = dinp_abs;
      cpu::gelu_backward(want.data(), pre.data(), dinp.data(), static_cast<int64_t>(want.size()));
      for (float& v : scaled_abs) v *= 1.2f;
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        const int64_t fused = ctx.fused_epilogues();
        cuda::matmul_backward_input_dgelu<T>(ctx, d_dinp.get(), d_dout->get(), d_weight->get(), d_pre->get(), B, C, OC,
                                             stream);
        const char* how = ctx.fused_epilogues() > fused ? "DGELU epilogue" : "gelu_backward";
        const std::vector<float> got = keep(download(d_dinp));
        EXPECT_TRUE(GemmClose(got, want, scaled_abs, tol, out_rtol + 5e-4, dinp))
            << "backward input + dGELU (" << how << ")";
        if (run == 0)
          first = got;
        else
          EXPECT_TRUE(BitwiseEqual(got, first)) << "backward input + dGELU, second run";
      }
    }
  }
  EXPECT_GT(ctx.cached_plans(), 0);
  // Which path each epilogue took (the checks above hold for both): the printed counts are how a GPU run tells a
  // fused epilogue from the fallback.
  std::cout << (kBf16 ? "bf16" : "fp32/tf32") << " GEMMs: " << ctx.fused_epilogues() << " epilogues fused by cuBLASLt, "
            << ctx.fallback_epilogues() << " ran our kernel\n";
  run.timed = ctx.timed_plans(), run.read = ctx.table_plans();
  return run;
}

TEST_F(CudaKernels, GemmFp32MatchesCpu) { gemms_match_cpu<float>(stream_, cuda::GemmMath::kFp32, 1e-5, 0); }
TEST_F(CudaKernels, GemmTf32MatchesCpu) { gemms_match_cpu<float>(stream_, cuda::GemmMath::kTf32, 2e-3, 0); }
TEST_F(CudaKernels, GemmBf16MatchesCpu) { gemms_match_cpu<bf16>(stream_, cuda::GemmMath::kFp32, 1e-5, 4e-3); }

// Timed algorithms (GemmContext::set_timed_algos): every GEMM as right as the heuristic's first, the accumulating
// weight gradient included (timed on a scratch D: timed in place, its ~30 calls would have added to dweight0 as many
// times); the table written by the first context, and a second context reading every answer from it instead of
// timing again, and computing bit for bit what the first did (cuBLASLt's split-K reductions are ordered).
TEST_F(CudaKernels, GemmTimedAlgorithmsMatchCpuAndAreKept) {
  const std::string table = testing::TempDir() + "gemm_algos_" + std::to_string(getpid());
  std::filesystem::remove_all(table);
  const GemmRun first = gemms_match_cpu<bf16>(stream_, cuda::GemmMath::kFp32, 1e-5, 4e-3, table);
  EXPECT_GT(first.timed, 0);
  EXPECT_GT(first.weight_timed, 0) << "no accumulating weight gradient was timed: the scratch D went unchecked";
  EXPECT_EQ(first.read, 0);
  const GemmRun second = gemms_match_cpu<bf16>(stream_, cuda::GemmMath::kFp32, 1e-5, 4e-3, table);
  EXPECT_EQ(second.timed, 0);
  EXPECT_EQ(second.read, first.timed);
  EXPECT_TRUE(BitwiseEqual(second.outputs, first.outputs));
  gemms_match_cpu<float>(stream_, cuda::GemmMath::kFp32, 1e-5, 0, table);
  gemms_match_cpu<float>(stream_, cuda::GemmMath::kTf32, 2e-3, 0, table);
  std::cout << first.timed << " bf16 GEMM problems timed (" << first.weight_timed
            << " of the weight gradient), then read from the table\n";
  std::filesystem::remove_all(table);
}

// The bias gradient at the model's shapes, where it splits the rows into blocks (bias_backward_kernels.cuh): tall
// (8192 x 768, the transformer's), wide (the LM head's, shrunk), a row count off the unrolled step, an unaligned dout
// (scalar columns), and a context whose workspace holds one partial row (pass 1 adds to dbias itself). Each against
// the CPU and bitwise against a second run: the replicas stay identical only if it is deterministic.
template <typename T>
void bias_backward_blocks_match_cpu(cudaStream_t stream) {
  struct Case {
    int B, OC, offset;
    size_t workspace_bytes;
  };
  for (const Case& c : {Case{8192, 768, 0, cuda::GemmContext::kDefaultWorkspaceBytes},
                        Case{4099, 3080, 0, cuda::GemmContext::kDefaultWorkspaceBytes},
                        Case{97, 6288, 0, cuda::GemmContext::kDefaultWorkspaceBytes},
                        Case{1000, 768, 1, cuda::GemmContext::kDefaultWorkspaceBytes},
                        Case{1000, 768, 0, 768 * sizeof(float)}}) {
    SCOPED_TRACE(shape({{"B", c.B}, {"OC", c.OC}, {"offset", c.offset}, {"workspace", int64_t(c.workspace_bytes)}}));
    cuda::GemmContext ctx(cuda::GemmMath::kFp32, c.workspace_bytes);
    std::vector<float> dout = random_vector(int64_t{c.B} * c.OC + c.offset, -1, 1, 91 + c.B);
    if constexpr (std::is_same_v<T, bf16>) dout = round_bf16(dout);
    std::unique_ptr<DeviceBuffer<T>> d_dout;
    if constexpr (std::is_same_v<T, bf16>)
      d_dout = std::make_unique<DeviceBuffer<T>>(to_bf16(dout), stream);
    else
      d_dout = std::make_unique<DeviceBuffer<T>>(dout, stream);
    const std::vector<float> dbias0 = random_vector(c.OC, -1, 1, 92);
    std::vector<float> want = dbias0;
    cpu::bias_backward(want.data(), dout.data() + c.offset, c.B, c.OC);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      DeviceArray d_dbias(dbias0, stream);
      cuda::bias_backward<T>(ctx, d_dbias.get(), d_dout->get() + c.offset, c.B, c.OC, stream);
      const std::vector<float> got = d_dbias.download();
      EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-6 * c.B));
      if (run == 0)
        first = got;
      else
        EXPECT_TRUE(BitwiseEqual(got, first)) << "second run";
    }
  }
}

TEST_F(CudaKernels, BiasBackwardFp32RowBlocksMatchCpuAndRepeat) { bias_backward_blocks_match_cpu<float>(stream_); }
TEST_F(CudaKernels, BiasBackwardBf16RowBlocksMatchCpuAndRepeat) { bias_backward_blocks_match_cpu<bf16>(stream_); }

// A parameter slice of a flat buffer is only 4-byte aligned: the fused epilogues must then fall back (or cope)
// and still be right, and the same problem at another alignment is a separate plan.
TEST_F(CudaKernels, GemmUnalignedOperandsAndPlanReuse) {
  const int B = 40, C = 64, OC = 48;
  cuda::GemmContext ctx;
  const std::vector<float> inp = random_vector(int64_t{B} * C + 1, -1, 1, 61);
  const std::vector<float> weight = random_vector(int64_t{OC} * C + 1, -1, 1, 62),
                           bias = random_vector(OC + 1, -1, 1, 63);
  std::vector<float> biased(int64_t{B} * OC), absdot(int64_t{B} * OC), gelu(int64_t{B} * OC);
  // Every operand one element along (our epilogue one column a thread), or the bias alone (our epilogue with 16
  // bytes of out and pre a thread).
  for (const auto& [off, bias_off] : {std::pair{0, 0}, std::pair{1, 1}, std::pair{0, 1}}) {
    SCOPED_TRACE("offset " + std::to_string(off) + ", the bias's " + std::to_string(bias_off));
    cpu::matmul_forward(biased.data(), inp.data() + off, weight.data() + off, B, C, OC);
    cpu::matmul_forward(absdot.data(), abs_of(inp).data() + off, abs_of(weight).data() + off, B, C, OC);
    cpu::bias_forward(biased.data(), bias.data() + bias_off, B, OC);
    cpu::gelu_forward(gelu.data(), biased.data(), static_cast<int64_t>(gelu.size()));
    DeviceArray d_inp(inp, stream_), d_weight(weight, stream_), d_bias(bias, stream_);
    DeviceArray d_out(int64_t{B} * OC + 1, stream_), d_pre(int64_t{B} * OC + 1, stream_);
    for (int rep = 0; rep < 2; ++rep) {
      cuda::matmul_bias_gelu_forward<float>(ctx, d_out.get() + off, d_pre.get() + off, d_inp.get() + off,
                                            d_weight.get() + off, d_bias.get() + bias_off, B, C, OC, stream_);
      std::vector<float> out = d_out.download(), pre = d_pre.download();
      out.erase(out.begin(), out.begin() + off), out.resize(gelu.size());
      pre.erase(pre.begin(), pre.begin() + off), pre.resize(gelu.size());
      EXPECT_TRUE(GemmClose(pre, biased, absdot, 1e-5, 0)) << "pre";
      EXPECT_TRUE(GemmClose(out, gelu, absdot, 1e-5, 5e-4)) << "out";
    }
  }
  // Per case: the fused plan (usable or not) and possibly the plain one; never one per call.
  EXPECT_LE(ctx.cached_plans(), 6);
}

// The heuristic's other candidates (the benchmark's "best of N"): each a plan of its own, each computing the same
// product; past the last one the heuristic gives, the plain GEMM has no algorithm and says so.
TEST_F(CudaKernels, GemmHeuristicCandidates) {
  const int B = 64, C = 96, OC = 40;
  cuda::GemmContext ctx;
  const std::vector<float> inp = random_vector(int64_t{B} * C, -1, 1, 64),
                           weight = random_vector(int64_t{OC} * C, -1, 1, 65);
  std::vector<float> want(int64_t{B} * OC), absdot(int64_t{B} * OC);
  cpu::matmul_forward(want.data(), inp.data(), weight.data(), B, C, OC);
  cpu::matmul_forward(absdot.data(), abs_of(inp).data(), abs_of(weight).data(), B, C, OC);
  DeviceArray d_inp(inp, stream_), d_weight(weight, stream_), d_out(int64_t{B} * OC, stream_);
  int candidates = 0;
  for (int k = 0; k < 64; ++k, ++candidates) {
    ctx.set_heuristic_rank(k);
    try {
      cuda::matmul_forward<float>(ctx, d_out.get(), d_inp.get(), d_weight.get(), nullptr, B, C, OC, stream_);
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("no algorithm"), std::string::npos) << e.what();
      break;
    }
    EXPECT_TRUE(GemmClose(d_out.download(), want, absdot, 1e-5, 0)) << "candidate " << k;
  }
  EXPECT_GE(candidates, 1);
  EXPECT_EQ(ctx.cached_plans(), std::min(candidates + 1, 64));  // one per candidate, and the one that had none
  std::cout << candidates << " candidates for an fp32 GEMM of " << B << " x " << C << " -> " << OC << "\n";
}

// A timed plan first made inside a graph capture cannot time: the graph runs the heuristic's first answer (the same
// bits as a heuristic context's), and the first call outside a capture times it and runs the answer from then on.
TEST_F(CudaKernels, GemmTimedPlanMadeInACaptureIsTimedAfter) {
  const int B = 512, C = 256, OC = 384;
  const std::string table = testing::TempDir() + "gemm_algos_capture_" + std::to_string(getpid());
  std::filesystem::remove_all(table);
  const std::vector<float> inp = random_vector(int64_t{B} * C, -1, 1, 66),
                           weight = random_vector(int64_t{OC} * C, -1, 1, 67);
  std::vector<float> want(int64_t{B} * OC), absdot(int64_t{B} * OC);
  cpu::matmul_forward(want.data(), round_bf16(inp).data(), round_bf16(weight).data(), B, C, OC);
  cpu::matmul_forward(absdot.data(), abs_of(inp).data(), abs_of(weight).data(), B, C, OC);
  DeviceBuffer<bf16> d_inp(to_bf16(inp), stream_), d_weight(to_bf16(weight), stream_), d_out(int64_t{B} * OC, stream_);
  cuda::GemmContext heuristic;
  cuda::matmul_forward<bf16>(heuristic, d_out.get(), d_inp.get(), d_weight.get(), nullptr, B, C, OC, stream_);
  const std::vector<float> first_answer = to_f32(d_out.download());

  cuda::GemmContext timed;
  timed.set_timed_algos(true, table);
  cudaGraph_t graph = nullptr;
  cudaCheck(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  cuda::matmul_forward<bf16>(timed, d_out.get(), d_inp.get(), d_weight.get(), nullptr, B, C, OC, stream_);
  cudaCheck(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
  cudaCheck(cudaMemsetAsync(d_out.get(), 0, sizeof(bf16) * B * OC, stream_));
  cudaCheck(cudaGraphLaunch(exec, stream_));
  EXPECT_TRUE(BitwiseEqual(to_f32(d_out.download()), first_answer)) << "the graph runs the heuristic's first";
  EXPECT_EQ(timed.timed_plans(), 0);
  cuda::matmul_forward<bf16>(timed, d_out.get(), d_inp.get(), d_weight.get(), nullptr, B, C, OC, stream_);
  EXPECT_EQ(timed.timed_plans(), 1) << "timed at the first call outside the capture";
  EXPECT_TRUE(GemmClose(to_f32(d_out.download()), want, absdot, 1e-5, 4e-3));
  cudaCheck(cudaGraphExecDestroy(exec));
  cudaCheck(cudaGraphDestroy(graph));
  std::filesystem::remove_all(table);
}

// fp32 -> bf16 against kernels/float16.h's conversion, bit for bit: every special class, ties in both directions,
// subnormals, and random values over the whole exponent range; then every one of the 2^16 bf16 words back to
// fp32 (exact). Each at an aligned (vector path) and an unaligned (scalar path) address, and at sizes with tails.
TEST_F(CudaKernels, Bf16ConversionIsTheWiresBitForBit) {
  std::vector<float> x = {0.0f,  -0.0f,  1.0f,    -1.0f,           kInf,          -kInf,          kNaN,
                          -kNaN, 1e-45f, -1e-45f, 1.17549435e-38f, 3.4028235e38f, -3.4028235e38f, 65504.0f};
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f800001u, 0xffc00001u, 0x7fbfffffu,
                        0x00008000u, 0x00018000u, 0x807fffffu})  // ties to even (down, up), NaN payloads, subnormals
    x.push_back(ddplab::float16::bits_f32(bits));
  const std::vector<float> u = random_vector(100003, 0, 1, 71);
  for (size_t i = 0; i < u.size(); ++i)  // random sign, exponent and mantissa bits
    x.push_back(
        ddplab::float16::bits_f32(static_cast<uint32_t>(u[i] * 4294967295.0) ^ static_cast<uint32_t>(i * 2654435761u)));
  for (int64_t n : {int64_t{1}, int64_t{5}, static_cast<int64_t>(x.size())}) {
    for (int off : {0, 1}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset " + std::to_string(off));
      std::vector<float> src(x.begin(), x.begin() + n);
      src.insert(src.begin(), off, 0.0f);
      DeviceArray d_src(src, stream_);
      DeviceBuffer<bf16> d_dst(n + off, stream_);
      cuda::f32_to_bf16(d_dst.get() + off, d_src.get() + off, n, stream_);
      const std::vector<bf16> got = d_dst.download();
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = bits_of(got[off + i]);
        const uint16_t want = ddplab::float16::f32_to_bf16(x[i]);
        if (h != want && bad++ < 5)
          ADD_FAILURE() << "element " << i << " bits 0x" << std::hex << ddplab::float16::f32_bits(x[i]) << ": got 0x"
                        << h << " want 0x" << want;
      }
      EXPECT_EQ(bad, 0);
    }
  }
  std::vector<bf16> all(1 << 16);
  for (uint32_t h = 0; h < (1u << 16); ++h) all[h] = bf16_from_bits(static_cast<uint16_t>(h));
  for (int off : {0, 1}) {
    std::vector<bf16> src(all);
    src.insert(src.begin(), off, all[0]);
    DeviceBuffer<bf16> d_src(src, stream_);
    DeviceArray d_dst(static_cast<int64_t>(src.size()), stream_);
    cuda::bf16_to_f32(d_dst.get() + off, d_src.get() + off, 1 << 16, stream_);
    std::vector<float> got = d_dst.download(), want(1 << 16);
    got.erase(got.begin(), got.begin() + off);
    for (uint32_t h = 0; h < (1u << 16); ++h) want[h] = ddplab::float16::bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_TRUE(BitwiseEqual(got, want)) << "offset " << off;
  }
}

// x *= s exactly as on the host; the flag is raised by inf, NaN, or an overflow of the scaling itself, wherever
// the value sits (vector body, tail, unaligned start), and never lowered.
TEST_F(CudaKernels, ScaleAndCheckFinite) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}}) {
    for (int off : {0, 1}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset " + std::to_string(off));
      const float s = 0.37f;
      std::vector<float> x = random_vector(n + off, -1e3f, 1e3f, 81);
      DeviceArray d_x(x, stream_);
      DeviceBuffer<int> d_flag(std::vector<int>{0}, stream_);
      cuda::scale_and_check_finite(d_x.get() + off, s, n, d_flag.get(), stream_);
      for (int64_t i = off; i < n + off; ++i) x[i] *= s;
      EXPECT_TRUE(BitwiseEqual(d_x.download(), x));
      EXPECT_EQ(d_flag.download()[0], 0) << "finite values raised the flag";
      for (auto [where, value] : {std::pair{n - 1, kInf}, std::pair{n / 2, kNaN}, std::pair{int64_t{0}, 3e38f}}) {
        std::vector<float> y = random_vector(n + off, -1, 1, 82);
        y[off + where] = value;  // 3e38 * 10 overflows
        DeviceArray d_y(y, stream_);
        DeviceBuffer<int> d_flag2(std::vector<int>{0}, stream_);
        cuda::scale_and_check_finite(d_y.get() + off, 10.0f, n, d_flag2.get(), stream_);
        EXPECT_EQ(d_flag2.download()[0], 1) << "value " << value << " at " << where;
        cuda::scale_and_check_finite(d_x.get() + off, 1.0f, n, d_flag2.get(), stream_);  // finite: stays raised
        EXPECT_EQ(d_flag2.download()[0], 1);
      }
    }
  }
}

// The GPU ring's reduction: one fp32 add per element, so bitwise the CPU's residual add. Out of place and in place
// (out over b, as the ring runs it). Odd sizes, and starts one element along (the one-element-a-thread kernel).
TEST_F(CudaKernels, ResidualMatchesCpu) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> a = random_vector(n, -4, 4, 91), b = random_vector(n, -4, 4, 92);
    std::vector<float> sum(n);
    cpu::residual_forward(sum.data(), a.data(), b.data(), n);
    DeviceArray d_a(a, stream_), d_b(b, stream_), d_out(n, stream_);
    cuda::residual_forward(d_out.get(), d_a.get(), d_b.get(), n, stream_);
    EXPECT_TRUE(BitwiseEqual(d_out.download(), sum)) << "fp32";
    cuda::residual_forward(d_b.get(), d_a.get(), d_b.get(), n, stream_);
    EXPECT_TRUE(BitwiseEqual(d_b.download(), sum)) << "fp32, out over b";

    DeviceArray d_a1(shifted(a), stream_), d_b1(shifted(b), stream_);
    cuda::residual_forward(d_b1.get() + 1, d_a1.get() + 1, d_b1.get() + 1, n, stream_);
    const std::vector<float> got = d_b1.download();
    EXPECT_TRUE(BitwiseEqual(unshifted(got), sum)) << "fp32, starts unaligned";
    EXPECT_EQ(got[0], 0.0f) << "the element before the start is untouched";
  }
}

// Mean pool: the same additions in the same order (kernels/mean_pool.h) and one multiply, so fp32 is bitwise the CPU's;
// bf16 inputs are pre-rounded and the fp32 result is rounded once (bitwise too). Lengths full, partial, 1 and 0; padded
// rows of the input are NaN (never read) and padded rows of dinp must come out exactly 0.
template <typename T>
void mean_pool_matches_cpu(cudaStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  struct Shape {
    int B, S, C;
    std::vector<int32_t> lengths;
  };
  for (const Shape& sh : {Shape{1, 1, 1, {1}}, Shape{4, 9, 5, {9, 4, 1, 0}}, Shape{3, 130, 768, {130, 77, 2}},
                          Shape{2, 5, 300, {3, 5}}}) {
    const int B = sh.B, S = sh.S, C = sh.C;
    SCOPED_TRACE(shape({{"B", B}, {"S", S}, {"C", C}}));
    std::vector<float> inp = random_vector(int64_t{B} * S * C, -2, 2, 101 + S);
    std::vector<float> dout = random_vector(int64_t{B} * C, -2, 2, 102 + C);
    if constexpr (kBf16) inp = round_bf16(inp), dout = round_bf16(dout);
    for (int b = 0; b < B; ++b)
      std::fill(inp.begin() + (int64_t{b} * S + sh.lengths[b]) * C, inp.begin() + int64_t{b + 1} * S * C, kNaN);
    std::vector<float> out(int64_t{B} * C), dinp(inp.size());
    cpu::mean_pool_forward(out.data(), inp.data(), sh.lengths.data(), B, S, C);
    cpu::mean_pool_backward(dinp.data(), dout.data(), sh.lengths.data(), B, S, C);
    const auto upload = [&](const std::vector<float>& x) {
      if constexpr (kBf16)
        return std::make_unique<DeviceBuffer<T>>(to_bf16(x), stream);
      else
        return std::make_unique<DeviceBuffer<T>>(x, stream);
    };
    const auto download = [](const DeviceBuffer<T>& d) {
      if constexpr (kBf16)
        return to_f32(d.download());
      else
        return d.download();
    };
    auto d_inp = upload(inp), d_dout = upload(dout);
    DeviceBuffer<int32_t> d_lengths(sh.lengths, stream);
    DeviceBuffer<T> d_out(out.size(), stream), d_dinp(dinp.size(), stream);
    cuda::mean_pool_forward<T>(d_out.get(), d_inp->get(), d_lengths.get(), B, S, C, stream);
    cuda::mean_pool_backward<T>(d_dinp.get(), d_dout->get(), d_lengths.get(), B, S, C, stream);
    EXPECT_TRUE(BitwiseEqual(download(d_out), kBf16 ? round_bf16(out) : out)) << "out";
    EXPECT_TRUE(BitwiseEqual(download(d_dinp), kBf16 ? round_bf16(dinp) : dinp)) << "dinp";
  }
}

TEST_F(CudaKernels, MeanPoolFp32MatchesCpu) { mean_pool_matches_cpu<float>(stream_); }
TEST_F(CudaKernels, MeanPoolBf16MatchesCpu) { mean_pool_matches_cpu<bf16>(stream_); }

// The 16-bit wire's casts against kernels/float16.h's scalar conversion, which the CPU wire rounds by: every special
// class and random values over the whole exponent range encoded, all 2^16 words decoded, and the reduce-scatter hop
// (io = to16(own + to32(io))); at an aligned address (4 elements a thread) and one element along (one a thread), at
// sizes with tails. NaN stays NaN (its payload is the hardware's); every other word bit for bit.
TEST_F(CudaKernels, WireCastsAreTheHostWiresBitForBit) {
  using ddplab::float16::Format;
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, kInf, -kInf, kNaN, 1e-45f, 6e-8f, 65504.0f, 65520.0f, 3.4e38f};
  const std::vector<float> u = random_vector(70001, 0, 1, 73);
  for (size_t i = 0; i < u.size(); ++i)
    x.push_back(
        ddplab::float16::bits_f32(static_cast<uint32_t>(u[i] * 4294967295.0) ^ static_cast<uint32_t>(i * 2654435761u)));
  const std::vector<float> own = random_vector(static_cast<int64_t>(x.size()), -8, 8, 74);
  const auto same = [](Format f, uint16_t got, uint16_t want) {
    const bool nan_got = std::isnan(ddplab::float16::to_f32(f, got)),
               nan_want = std::isnan(ddplab::float16::to_f32(f, want));
    return nan_got || nan_want ? nan_got == nan_want : got == want;
  };
  for (const Format f : {Format::kBf16, Format::kFp16})
    for (const int64_t n : {int64_t{1}, int64_t{7}, static_cast<int64_t>(x.size())})
      for (const int off : {0, 1}) {
        SCOPED_TRACE(std::string(f == Format::kBf16 ? "bf16" : "fp16") + " n=" + std::to_string(n) + " offset " +
                     std::to_string(off));
        std::vector<float> src(x.begin(), x.begin() + n), mine(own.begin(), own.begin() + n);
        src.insert(src.begin(), off, 0.0f);
        mine.insert(mine.begin(), off, 0.0f);
        DeviceArray d_src(src, stream_), d_own(mine, stream_);
        DeviceBuffer<uint16_t> d_words(n + off, stream_);
        cuda::wire_encode(f, d_words.get() + off, d_src.get() + off, n, stream_);
        std::vector<uint16_t> words = d_words.download();
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) bad += !same(f, words[off + i], ddplab::float16::from_f32(f, x[i]));
        EXPECT_EQ(bad, 0) << "encode";
        // The hop over the words just made: the sum in fp32, rounded once.
        cuda::wire_add_encode(f, d_words.get() + off, d_own.get() + off, n, stream_);
        const std::vector<uint16_t> sums = d_words.download();
        bad = 0;
        for (int64_t i = 0; i < n; ++i)
          bad += !same(f, sums[off + i],
                       ddplab::float16::from_f32(f, own[i] + ddplab::float16::to_f32(f, words[off + i])));
        EXPECT_EQ(bad, 0) << "add_encode";
      }
  for (const Format f : {Format::kBf16, Format::kFp16})
    for (const int off : {0, 1}) {
      std::vector<uint16_t> all(65536 + off, 0);
      for (int w = 0; w < 65536; ++w) all[off + w] = static_cast<uint16_t>(w);
      DeviceBuffer<uint16_t> d_all(all, stream_);
      DeviceArray d_back(65536 + off, stream_);
      cuda::wire_decode(f, d_back.get() + off, d_all.get() + off, 65536, stream_);
      const std::vector<float> back = d_back.download();
      int64_t bad = 0;
      for (int w = 0; w < 65536; ++w) {
        const float want = ddplab::float16::to_f32(f, static_cast<uint16_t>(w)), got = back[off + w];
        bad += std::isnan(want) ? !std::isnan(got) : ddplab::float16::f32_bits(got) != ddplab::float16::f32_bits(want);
      }
      EXPECT_EQ(bad, 0) << (f == Format::kBf16 ? "bf16" : "fp16") << " decode, offset " << off;
    }
}

// Padded rows zeroed, valid rows untouched (every bit), for lengths full, partial and 0: what cuDNN's attention
// leaves unspecified, tested here without cuDNN.
TEST_F(CudaKernels, ZeroPaddedRowsTouchesOnlyThePadding) {
  const int B = 3, S = 5, width = 7;
  const std::vector<int32_t> lengths = {5, 2, 0};
  const std::vector<bf16> x = to_bf16(random_vector(int64_t{B} * S * width, -2, 2, 75));
  DeviceBuffer<bf16> d_x(x, stream_);
  DeviceBuffer<int32_t> d_lengths(lengths, stream_);
  cuda::zero_padded_rows(d_x.get(), d_lengths.get(), B, S, width, stream_);
  const std::vector<bf16> got = d_x.download();
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < S; ++t)
      for (int c = 0; c < width; ++c) {
        const int64_t i = (int64_t{b} * S + t) * width + c;
        EXPECT_EQ(bits_of(got[i]), t < lengths[b] ? bits_of(x[i]) : uint16_t{0})
            << "b " << b << " t " << t << " c " << c;
      }
}

// Next-token targets: integers, so bitwise; padded tokens are out of range (never read), lengths full, partial, 1.
TEST_F(CudaKernels, NextTokenTargetsMatchCpu) {
  const int B = 4, S = 37;
  const std::vector<int32_t> lengths = {37, 20, 1, 2};
  std::vector<int32_t> tokens(int64_t{B} * S);
  for (int64_t r = 0; r < int64_t{B} * S; ++r)
    tokens[r] = r % S < lengths[r / S] ? static_cast<int32_t>(r * 7 % 101) : -99;
  std::vector<int32_t> targets(tokens.size());
  cpu::next_token_targets(targets.data(), tokens.data(), lengths.data(), B, S);
  DeviceBuffer<int32_t> d_tokens(tokens, stream_), d_lengths(lengths, stream_), d_targets(tokens.size(), stream_);
  cuda::next_token_targets(d_targets.get(), d_tokens.get(), d_lengths.get(), nullptr, B, S, stream_);
  EXPECT_EQ(d_targets.download(), targets);
  cuda::next_token_targets(d_targets.get(), d_tokens.get(), nullptr, nullptr, 1, S, stream_);  // null lengths: all S
  std::vector<int32_t> full(S);
  cpu::next_token_targets(full.data(), tokens.data(), nullptr, 1, S);
  const std::vector<int32_t> got = d_targets.download();
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + S), full);
}

}  // namespace
