// The fused softmax cross-entropy's kernels (kernels/cuda/softmax_ce_kernels.cuh), their own source compiled by g++ and
// run by the emulation (cuda_emulation.h), against cpu::softmax_cross_entropy_forward + backward with the GPU test's
// tolerances: the packed (16-byte) and scalar paths, each of the row kernel's block sizes (32, 128 and 1024 threads),
// ignored rows, dlogits over the logits and apart, forward only, a gradient scale, and a grid smaller than the rows
// (blocks walking several), through the launch sequence softmax_ce.cu runs. What it cannot tell: speed, and whether the
// second pass finds its row in L2.
#include "tests/emu/cuda_emulation.h"

// The kernels' dynamic shared memory, in their namespace (see DDPLAB_EMU_SHARED_MEMORY), before the kernels.
namespace ddplab::cuda {
namespace {
namespace softmax_ce {
DDPLAB_EMU_SHARED_MEMORY(smem)
}  // namespace softmax_ce
}  // namespace
}  // namespace ddplab::cuda

#include "kernels/cuda/softmax_ce_kernels.cuh"

// Then the rest.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

namespace cuda = ddplab::cuda;
namespace cpu = ddplab::cpu;
using bf16 = __nv_bfloat16;
using ddplab::emu::emulated_launch;
using ddplab::gpu_test::AllClose;
using ddplab::gpu_test::device_values;
using ddplab::gpu_test::host_values;
using ddplab::gpu_test::random_vector;

// The grid's limit: a block for every row of these small batches, or 2 blocks that walk the rows.
constexpr int64_t kEveryRow = 65535, kTwoBlocks = 2;
// The shared memory a block may take on an H100/H200 (opt-in): every staged row of these cases fits.
constexpr size_t kBlockSmem = 227 * 1024;

struct Case {
  int N, V;
  double ignored;  // fraction of rows with target -1
  int64_t max_blocks;
};

// fp32: 2^((x - max) log2 e) (exp2_approx, exact here) against the CPU's exp and another summation order, 1e-5 relative (losses, mean) and 1e-6 absolute on
// dlogits, which are O(1/num_valid); bf16: logits pre-rounded, dlogits rounded to bf16 (8e-3 relative).
template <typename T>
void emulated_matches_cpu(const Case& c) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  const double grad_rtol = kBf16 ? 8e-3 : 1e-5;
  const int N = c.N, V = c.V;
  SCOPED_TRACE("N=" + std::to_string(N) + " V=" + std::to_string(V) + " grid of at most " +
               std::to_string(c.max_blocks) + (kBf16 ? " bf16" : " fp32"));
  std::vector<float> logits = random_vector(int64_t{N} * V, -10, 10, 21 + N);
  if constexpr (kBf16) logits = ddplab::gpu_test::round_bf16(logits);
  std::vector<int32_t> targets(N);
  const std::vector<float> u = random_vector(N, 0, 1, 22 + V);
  for (int n = 0; n < N; ++n) targets[n] = u[n] < c.ignored ? -1 : static_cast<int32_t>(u[n] * 7919) % V;
  std::vector<float> exps(int64_t{N} * V), sums(N), losses(N), dlogits(int64_t{N} * V);
  int64_t num_valid = 0;
  const float mean = cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(),
                                                        targets.data(), N, V, &num_valid);
  cpu::softmax_cross_entropy_backward(dlogits.data(), exps.data(), sums.data(), targets.data(), N, V);

  struct Variant {
    const char* what;
    bool alias, forward_only;
    float scale;
  };
  std::vector<Variant> variants = {{"dlogits over the logits", true, false, 1.0f},
                                   {"separate dlogits, scale 0.7", false, false, 0.7f}};
  if (V % 2 == 1) variants.push_back({"forward only", false, true, 1.0f});  // each path once is enough
  for (const Variant& v : variants)
    for (cuda::CrossEntropyRows rows : {cuda::CrossEntropyRows::kStreamed, cuda::CrossEntropyRows::kStaged}) {
      // The staged kernel shares the gradient's arithmetic with the streamed one: over the logits (a training step's
      // way) and forward only are enough for it.
      if (rows == cuda::CrossEntropyRows::kStaged && !v.alias && !v.forward_only) continue;
      SCOPED_TRACE(std::string(v.what) + (rows == cuda::CrossEntropyRows::kStreamed ? ", streamed" : ", staged"));
      std::vector<T> x = device_values<T>(logits), d(v.alias || v.forward_only ? 0 : int64_t{N} * V);
      T* dl = v.forward_only ? nullptr : v.alias ? x.data() : d.data();
      // NaN where the kernels must write: a value they leave shows.
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> got_losses(N, nan), got_mean(1, nan);
      std::vector<int> count(1, -1);
      cuda::softmax_cross_entropy_launches(emulated_launch, dl, got_losses.data(), got_mean.data(), count.data(),
                                           static_cast<const T*>(x.data()), targets.data(), N, V, v.scale, rows,
                                           c.max_blocks, kBlockSmem);
      EXPECT_EQ(count[0], num_valid);
      EXPECT_TRUE(AllClose(got_losses, losses, 1e-5, 1e-6)) << "losses";
      EXPECT_TRUE(AllClose(got_mean, {mean}, 1e-5, 1e-7)) << "mean";
      if (v.forward_only) {
        EXPECT_TRUE(AllClose(host_values<T>(x), logits, 0, 0)) << "logits must be left alone";
        continue;
      }
      std::vector<float> want = dlogits;
      for (float& g : want) g *= v.scale;
      EXPECT_TRUE(AllClose(host_values<T>(v.alias ? x : d), want, grad_rtol, 1e-6)) << "dlogits";
    }
}

// Row widths for each block size (row_block_size: up to 64 accesses 32 threads, up to 2048 128, up to 16384 256,
// beyond that 1024), packed (V a multiple of 4 and 8) and scalar (odd V); all rows ignored; the grid walking rows;
// and more rows than half the count's and the mean's 1024 threads, so that every warp of theirs has rows.
const std::vector<Case> kCases = {
    {1, 1, 0, kEveryRow},        {5, 7, 0.3, kEveryRow},    {9, 1000, 0.25, kEveryRow},
    {3, 20000, 0.2, kEveryRow},  {2, 20001, 0, kEveryRow},  {6, 33, 1.0, kEveryRow},
    {9, 1000, 0.25, kTwoBlocks}, {7, 257, 0.3, kTwoBlocks}, {600, 8, 0.1, kTwoBlocks},
};

TEST(SoftmaxCrossEntropyEmu, Fp32MatchesCpu) {
  for (const Case& c : kCases) emulated_matches_cpu<float>(c);
}

TEST(SoftmaxCrossEntropyEmu, Bf16MatchesCpu) {
  for (const Case& c : kCases) emulated_matches_cpu<bf16>(c);
}

// Logits of -inf (a vocabulary masked out): a thread whose every element so far is -inf adds nothing (exp(-inf - -inf)
// would be NaN), and the row's loss and gradient are those of the other columns.
TEST(SoftmaxCrossEntropyEmu, MaskedLogits) {
  const int N = 3, V = 256;  // fp32: 64 packs of 4 over 32 threads, each thread's first pack all -inf
  std::vector<float> logits = random_vector(int64_t{N} * V, -3, 3, 4);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V / 2; ++v) logits[int64_t{n} * V + v] = -std::numeric_limits<float>::infinity();
  const std::vector<int32_t> targets = {140, 255, 128};
  std::vector<float> exps(int64_t{N} * V), sums(N), losses(N), dlogits(int64_t{N} * V);
  const float mean =
      cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), N, V);
  cpu::softmax_cross_entropy_backward(dlogits.data(), exps.data(), sums.data(), targets.data(), N, V);
  std::vector<float> got(int64_t{N} * V), got_losses(N), got_mean(1);
  std::vector<int> count(1);
  cuda::softmax_cross_entropy_launches(emulated_launch, got.data(), got_losses.data(), got_mean.data(), count.data(),
                                       logits.data(), targets.data(), N, V, 1.0f, cuda::CrossEntropyRows::kStreamed,
                                       kEveryRow, kBlockSmem);
  EXPECT_TRUE(AllClose(got_losses, losses, 1e-5, 1e-6)) << "losses";
  EXPECT_TRUE(AllClose(got_mean, {mean}, 1e-5, 1e-7)) << "mean";
  EXPECT_TRUE(AllClose(got, dlogits, 1e-5, 1e-6)) << "dlogits";
}

// A NaN logit reaches its row's loss (and so the mean), as on the CPU, even where it is the first thing its thread
// sees among -inf (packed: the NaN's pack has no finite element; scalar: the NaN is a thread's first element, then
// finite ones): there the running max is still -inf and fmaxf drops the NaN. The other row is untouched.
TEST(SoftmaxCrossEntropyEmu, ANaNLogitReachesTheLoss) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int V : {256, 257}) {  // fp32: packs of 4, then scalar
    SCOPED_TRACE("V=" + std::to_string(V));
    const int N = 2;
    std::vector<float> logits = random_vector(int64_t{N} * V, -3, 3, 5);
    if (V % 4 == 0) {
      for (int k = 0; k < 4; ++k) logits[k] = -inf;  // the first thread's first pack: -inf and a NaN
      logits[1] = nan;
    } else {
      logits[0] = nan;  // the first thread's first element; its next ones are finite
    }
    const std::vector<int32_t> targets = {7, 9};
    std::vector<float> exps(int64_t{N} * V), sums(N), losses(N);
    cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), N, V);
    ASSERT_TRUE(std::isnan(losses[0])) << "the CPU reference propagates the NaN";
    std::vector<float> got_losses(N), got_mean(1);
    std::vector<int> count(1);
    cuda::softmax_cross_entropy_launches(emulated_launch, static_cast<float*>(nullptr), got_losses.data(),
                                         got_mean.data(), count.data(), logits.data(), targets.data(), N, V, 1.0f,
                                         cuda::CrossEntropyRows::kStreamed, kEveryRow, kBlockSmem);
    EXPECT_TRUE(std::isnan(got_losses[0])) << got_losses[0];
    EXPECT_TRUE(std::isnan(got_mean[0])) << got_mean[0];
    EXPECT_TRUE(AllClose({got_losses[1]}, {losses[1]}, 1e-5, 1e-6));
  }
}

// A target past the vocabulary is a caller's bug: its row's loss is NaN (visible), and nothing is read outside the row.
TEST(SoftmaxCrossEntropyEmu, ATargetPastTheVocabularyGivesNaN) {
  const int N = 2, V = 64;
  const std::vector<float> logits = random_vector(int64_t{N} * V, -1, 1, 3);
  const std::vector<int32_t> targets = {5, V};
  std::vector<float> losses(N), mean(1);
  std::vector<int> count(1);
  cuda::softmax_cross_entropy_launches(emulated_launch, static_cast<float*>(nullptr), losses.data(), mean.data(),
                                       count.data(), logits.data(), targets.data(), N, V, 1.0f,
                                       cuda::CrossEntropyRows::kStreamed, kEveryRow, kBlockSmem);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_TRUE(std::isnan(losses[1]));
}

}  // namespace
