// MlpCuda (model/mlp_cuda.h) against the CPU MLP (model/mlp.h): the same parameters bit for bit at construction,
// the loss and every gradient piece in fp32, TF32 and bf16, accumulation over a second (smaller) batch, the
// gradient-ready hook and events, and a 5-step AdamW loss curve.
//
// MlpCudaHost.* runs without a GPU (argument checks before the device is touched, precision names) and must pass
// anywhere; the rest needs a device and skips with the reason otherwise. The model poisons its own activations
// (NaN) at construction, and the gradients are poisoned before zero_grad() or discard_grad(), so an unwritten element
// shows as NaN.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "model/mlp.h"
#include "model/mlp_cuda.h"
#include "model/optimizer.h"
#include "model/precision.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/model_test_util.h"

namespace {

using ddplab::Mlp;
using ddplab::MlpConfig;
using ddplab::MlpCuda;
using ddplab::Precision;
using ddplab::gpu_test::BitwiseEqual;
using ddplab::gpu_test::DeviceBuffer;
using ddplab::gpu_test::random_vector;
using ddplab::gpu_test::to_host;
using Tolerance = ddplab::gpu_test::ModelTolerance;
namespace gpu_test = ddplab::gpu_test;

constexpr uint64_t kSeed = 1234;
const MlpConfig kDefault{};  // 1024 -> 1024 -> 1024 -> 1000

// ---- host side: no device needed ---------------------------------------------------------------------------------

// Each of these would throw std::runtime_error instead if the constructor reached the device first.
TEST(MlpCudaHost, RejectsBadArgumentsBeforeTouchingTheDevice) {
  for (const MlpConfig& bad :
       {MlpConfig{0, 8, 1, 4}, MlpConfig{8, 8, 1, 0}, MlpConfig{8, 0, 1, 4}, MlpConfig{8, 8, -1, 4}})
    EXPECT_THROW(MlpCuda(bad, kSeed, Precision::kFp32, 8, nullptr), std::invalid_argument);
  for (int max_batch : {0, -1})
    EXPECT_THROW(MlpCuda(kDefault, kSeed, Precision::kBf16, max_batch, nullptr), std::invalid_argument);
}

TEST(MlpCudaHost, PrecisionNamesRoundTrip) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16})
    EXPECT_EQ(ddplab::parse_choice<ddplab::Precision>(ddplab::to_string(p), "precision"), p);
  EXPECT_THROW(ddplab::parse_choice<ddplab::Precision>("fp16", "precision"), std::invalid_argument);
}

// ---- against the CPU model: need a device ------------------------------------------------------------------------

// How far the GPU may be from the fp32 CPU model, which the mixed-precision modes approximate. Measured normwise per
// gradient piece (a wrong block of rows cannot hide in a large weight) and elementwise against the parameter's
// largest gradient (no outlier hides in the norm). Tightened from the errors the test printed on an H200 (worst over
// the shapes, piece sizes and batches), to about 3x those:
//   fp32: loss 1.0e-7, gradients 2.9e-6 normwise (summation order, GELU's tanh), the AdamW curve within 3e-6;
//   tf32: loss 5.3e-5, gradients 7.6e-4 normwise (11-bit GEMM inputs), curve 3e-5;
//   bf16: loss 5.1e-4, gradients 7.0e-3 normwise (8-bit activations), curve 2.4e-3.
// The elementwise bound is not printed and keeps the first estimate.
Tolerance tolerance(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return {1e-6, 1e-5, 5e-3, 1e-5};
    case Precision::kTf32:
      return {2e-4, 3e-3, 2e-2, 1e-4};
    case Precision::kBf16:
      break;
  }
  return {2e-3, 2e-2, 6e-2, 8e-3};
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};
Batch random_batch(const MlpConfig& c, int batch, uint32_t seed) {
  Batch b{random_vector(int64_t{batch} * c.input_dim, -2.0f, 2.0f, seed), std::vector<int32_t>(batch)};
  std::mt19937 rng(seed + 1);
  for (int32_t& t : b.y) t = static_cast<int32_t>(rng() % c.num_classes);
  return b;
}

// A device copy of a batch, uploaded on `stream`.
struct DeviceBatch {
  DeviceBatch(const Batch& b, cudaStream_t stream) : x(b.x, stream), y(b.y, stream) {}
  DeviceBuffer<float> x;
  DeviceBuffer<int32_t> y;
};

using MlpCudaDevice = gpu_test::DeviceTest;
class MlpCudaVsCpu : public gpu_test::DeviceTest, public ::testing::WithParamInterface<Precision> {};

TEST_F(MlpCudaDevice, InitIsTheCpuModelsBitForBit) {
  for (const MlpConfig& c : {kDefault, MlpConfig{45, 67, 3, 13}, MlpConfig{33, 1, 0, 10}}) {
    const Mlp<float> cpu(c, kSeed);
    const MlpCuda gpu(c, kSeed, Precision::kBf16, 4, stream_);  // the precision does not touch the master weights
    ASSERT_NO_FATAL_FAILURE(gpu_test::expect_same_init(gpu, cpu, stream_));
  }
}

// A batch the GPU has no room for (2^28 samples of the default MLP: terabytes) is one error that names the model,
// what it needed against what was free, and what shrinks it.
TEST_F(MlpCudaDevice, ABatchTooLargeForTheGpuSaysWhatTookTheMemory) {
  std::string what;
  try {
    MlpCuda gpu(kDefault, kSeed, Precision::kFp32, 1 << 28, stream_);
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  for (const char* part : {"MlpCuda: needs ", " GB of GPU memory; GPU ", "activations for 268435456 samples ",
                           "a step of fewer samples needs less"})
    EXPECT_NE(what.find(part), std::string::npos) << part << " in: " << what;
}

TEST_F(MlpCudaDevice, MisuseThrows) {
  MlpCuda gpu(MlpConfig{8, 8, 1, 4}, kSeed, Precision::kFp32, 4, stream_);
  EXPECT_THROW(gpu.backward(), std::logic_error);
  DeviceBatch d(random_batch(gpu.config(), 4, 1), stream_);
  EXPECT_THROW(gpu.forward(d.x.get(), d.y.get(), 5), std::invalid_argument);
  gpu.forward(d.x.get(), d.y.get(), 4);
  gpu.backward();
  EXPECT_THROW(gpu.backward(), std::logic_error) << "a second backward would read overwritten activations";
}

// Loss and gradients on a batch, then accumulation of a second, smaller batch (no zero_grad), which also catches
// reads of the first batch's stale rows. Every config runs with one piece per parameter and with its weights in row
// blocks whose last one is shorter, the latter also with the first backward writing over poisoned, discarded
// gradients (discard_grad, as the trainer runs it).
TEST_P(MlpCudaVsCpu, LossAndGradientsMatchCpu) {
  const Tolerance tol = tolerance(GetParam());
  struct Case {
    const char* name;
    MlpConfig config;
    int batch;
    int64_t piece_elements;
  };
  // Odd sizes: no dimension a multiple of 8 (cuBLASLt's fused GELU epilogue is skipped).
  for (const Case& k : {Case{"default", kDefault, 128, 300000}, Case{"odd", MlpConfig{45, 67, 3, 13}, 37, 1000},
                        Case{"no hidden layer", MlpConfig{33, 1, 0, 10}, 5, 100}}) {
    for (const auto& [piece_elements, discard] :
         {std::pair{int64_t{0}, false}, std::pair{k.piece_elements, false}, std::pair{k.piece_elements, true}}) {
      SCOPED_TRACE(std::string(k.name) + ", piece elements " + std::to_string(piece_elements) +
                   (discard ? ", discarded" : ""));
      Mlp<float> cpu(k.config, kSeed);
      MlpCuda gpu(k.config, kSeed, GetParam(), k.batch + 3, stream_);
      gpu_test::split_and_zero_grads(gpu, cpu, piece_elements, discard);
      for (int batch : {k.batch, k.batch / 2 + 1}) {
        SCOPED_TRACE("batch " + std::to_string(batch));
        const Batch b = random_batch(k.config, batch, 17 + batch);
        DeviceBatch d(b, stream_);
        gpu.forward(d.x.get(), d.y.get(), batch);
        gpu.backward();
        const float want = cpu.forward(b.x.data(), b.y.data(), batch);
        cpu.backward();
        const double loss_error = std::fabs(gpu.loss() - want) / want;
        EXPECT_LE(loss_error, tol.loss);
        const double grad_error = gpu_test::expect_grads_close(gpu, cpu, tol);
        gpu_test::expect_gaps_zero(gpu);
        std::cout << ddplab::to_string(GetParam()) << " " << k.name << ", piece elements " << piece_elements
                  << ", batch " << batch << ": loss error " << loss_error << ", worst piece " << grad_error << "\n";
      }
    }
  }
}

// The hook runs once per piece, in the CPU model's order, with that piece's event recorded: a second stream that
// waits on the event and copies the piece sees its final gradient even though the compute stream clears the
// gradients right after (ordered after the copies by one more event, as a trainer's optimizer is).
TEST_P(MlpCudaVsCpu, HookOrderAndPieceEvents) {
  const MlpConfig c{45, 67, 3, 13};
  const int batch = 37;
  Mlp<float> cpu(c, kSeed);
  MlpCuda gpu(c, kSeed, GetParam(), batch, stream_);
  cpu.set_grad_piece_elements(1000);
  gpu.set_grad_piece_elements(1000);
  ASSERT_NO_FATAL_FAILURE(gpu_test::expect_same_pieces(gpu, cpu));
  DeviceBatch d(random_batch(c, batch, 5), stream_);
  const auto forward = [&] { gpu.forward(d.x.get(), d.y.get(), batch); };
  gpu.zero_grad();
  forward();
  gpu.backward();
  const std::vector<float> want = to_host(gpu.flat_grads(), gpu.flat_size(), stream_);

  const gpu_test::HookCopies seen = gpu_test::copy_pieces_from_hook(gpu, forward);
  EXPECT_EQ(seen.calls, gpu_test::piece_order(gpu.grad_pieces().size()));
  // Bitwise: the same step twice on one device gives the same bits (cuBLAS guarantees it for one stream and a
  // user-owned workspace; our kernels sum in fixed orders). A copy that ran early would see zeros or a partial sum.
  EXPECT_TRUE(BitwiseEqual(seen.grads, want));
}

// Five AdamW steps on one batch (the CUDA adamw kernel against the CPU Optimizer, PyTorch's defaults): the GPU's loss
// curve follows the CPU's, and the loss falls.
TEST_P(MlpCudaVsCpu, AdamwLossCurveTracksCpu) {
  const Tolerance tol = tolerance(GetParam());
  const int batch = 64;
  Mlp<float> cpu(kDefault, kSeed);
  MlpCuda gpu(kDefault, kSeed, GetParam(), batch, stream_);
  const Batch b = random_batch(kDefault, batch, 99);
  DeviceBatch d(b, stream_);
  const gpu_test::LossCurves curves = gpu_test::adamw_loss_curves(
      gpu, cpu, ddplab::OptimizerConfig{}, 5, [&] { return cpu.forward(b.x.data(), b.y.data(), batch); },
      [&] { gpu.forward(d.x.get(), d.y.get(), batch); });
  gpu_test::expect_curves_close(curves, tol.train, ddplab::to_string(GetParam()));
  EXPECT_LT(curves.cpu.back(), curves.cpu.front() - 0.1f);
}

INSTANTIATE_TEST_SUITE_P(Precisions, MlpCudaVsCpu,
                         ::testing::Values(Precision::kFp32, Precision::kTf32, Precision::kBf16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                           return std::string(ddplab::to_string(info.param));
                         });

}  // namespace
