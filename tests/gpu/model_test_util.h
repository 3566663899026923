// Shared by the GPU model tests (test_mlp_cuda, test_transformer_cuda): a GPU model checked against its fp32 CPU
// twin. The templates take any pair with the models' common interface (flat_params, flat_grads, num_parameters,
// parameters, grad_pieces, zero_grad, backward; on the GPU side also discard_grad, stream, loss and
// piece_ready_event); what
// differs between the models (their batches, their forward calls) comes in as a callable.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "model/mlp.h"  // GradPiece
#include "model/optimizer.h"
#include "tests/gpu/gpu_test_util.h"

namespace ddplab::gpu_test {

// How far a GPU model may be from the fp32 CPU model; each test sets its own bounds, with the reasons.
struct ModelTolerance {
  double loss;       // relative
  double grad_norm;  // ||got - want|| / ||want|| per piece
  double grad_elem;  // |got - want| / max |want| per parameter
  double train;      // relative, each loss of the AdamW curve
};

inline std::vector<float> to_host(const float* device, int64_t n, cudaStream_t stream) {
  std::vector<float> host(n);
  cudaCheck(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  cudaCheck(cudaStreamSynchronize(stream));
  return host;
}

// ||got - want|| / ||want||; where want is all 0 (a piece the batch does not reach: the transformer's wpe rows past S,
// wte rows of absent tokens) got must be exactly 0 too. NaN (unwritten, or a NaN gradient) fails every comparison.
inline double rel_l2_error(const float* got, const float* want, int64_t n) {
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    ref += static_cast<double>(want[i]) * want[i];
  }
  if (ref == 0) return err == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(err / ref);
}

// The same parameter names, shapes and offsets as the CPU model, its initial values bit for bit, and zero gradients.
template <class GpuModel, class CpuModel>
void expect_same_init(const GpuModel& gpu, const CpuModel& cpu, cudaStream_t stream) {
  ASSERT_EQ(gpu.flat_size(), cpu.flat_size());
  ASSERT_EQ(gpu.parameters().size(), cpu.parameters().size());
  for (size_t i = 0; i < cpu.parameters().size(); ++i) {
    EXPECT_EQ(gpu.parameters()[i].name, cpu.parameters()[i].name);
    EXPECT_EQ(gpu.parameters()[i].shape, cpu.parameters()[i].shape);
    EXPECT_EQ(gpu.parameters()[i].offset, cpu.parameters()[i].offset);
  }
  const int64_t n = cpu.flat_size();
  EXPECT_TRUE(BitwiseEqual(to_host(gpu.flat_params(), n, stream), {cpu.flat_params(), cpu.flat_params() + n}));
  EXPECT_TRUE(BitwiseEqual(to_host(gpu.flat_grads(), n, stream), std::vector<float>(n, 0.0f)));
}

// Both models' gradients split into pieces of `piece_elements` (0: one per parameter) and zeroed, the GPU's after
// poisoning them, so that an element the GPU's backward leaves unwritten shows as NaN. discard: the GPU's pieces
// poisoned again and discarded (discard_grad), so its next backward must write every gradient over; the alignment
// gaps between them stay zero, as a model keeps them (expect_gaps_zero).
template <class GpuModel, class CpuModel>
void split_and_zero_grads(GpuModel& gpu, CpuModel& cpu, int64_t piece_elements, bool discard = false) {
  cpu.set_grad_piece_elements(piece_elements);
  gpu.set_grad_piece_elements(piece_elements);
  cudaCheck(cudaMemsetAsync(gpu.flat_grads(), 0xFF, gpu.flat_size() * sizeof(float), gpu.stream()));
  gpu.zero_grad();
  cpu.zero_grad();
  if (discard) {
    for (const GradPiece& g : gpu.grad_pieces())
      cudaCheck(cudaMemsetAsync(gpu.flat_grads() + g.offset, 0xFF, g.numel * sizeof(float), gpu.stream()));
    gpu.discard_grad();
  }
}

// The gradient buffer outside every piece (the alignment gaps) is all zeros: nothing writes there.
template <class GpuModel>
void expect_gaps_zero(const GpuModel& gpu) {
  std::vector<float> grads = to_host(gpu.flat_grads(), gpu.flat_size(), gpu.stream());
  for (const GradPiece& g : gpu.grad_pieces())
    std::fill(grads.begin() + g.offset, grads.begin() + g.offset + g.numel, 0.0f);
  const auto nonzero = std::find_if(grads.begin(), grads.end(), [](float v) { return v != 0.0f; });
  EXPECT_TRUE(nonzero == grads.end()) << "gap element " << (nonzero - grads.begin()) << " is " << *nonzero;
}

// Checks every piece normwise (a wrong block of rows cannot hide in a large weight) and every parameter elementwise
// against its largest gradient (no outlier hides in the norm); returns the worst piece's normwise error, for the log.
template <class GpuModel, class CpuModel>
double expect_grads_close(const GpuModel& gpu, const CpuModel& cpu, const ModelTolerance& tol) {
  const std::vector<float> got = to_host(gpu.flat_grads(), gpu.flat_size(), gpu.stream());
  const float* want = cpu.flat_grads();
  double worst = 0;
  for (const GradPiece& piece : gpu.grad_pieces()) {
    const double err = rel_l2_error(got.data() + piece.offset, want + piece.offset, piece.numel);
    EXPECT_LE(err, tol.grad_norm) << gpu.parameters()[piece.param].name << " from row " << piece.first_row;
    worst = std::max(worst, err);
  }
  for (const auto& p : cpu.parameters()) {
    const std::vector<float> g(got.begin() + p.offset, got.begin() + p.offset + p.numel), w(p.grad, p.grad + p.numel);
    float max_abs = 0;
    for (float v : w) max_abs = std::max(max_abs, std::fabs(v));
    EXPECT_TRUE(AllClose(g, w, 0.0, tol.grad_elem * max_abs)) << p.name;
  }
  return worst;
}

// The GPU model's gradient pieces are the CPU model's: parameter, offset, size and first row, in the same order.
template <class GpuModel, class CpuModel>
void expect_same_pieces(const GpuModel& gpu, const CpuModel& cpu) {
  const std::vector<GradPiece>& pieces = gpu.grad_pieces();
  ASSERT_EQ(pieces.size(), cpu.grad_pieces().size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    EXPECT_EQ(pieces[k].param, cpu.grad_pieces()[k].param);
    EXPECT_EQ(pieces[k].offset, cpu.grad_pieces()[k].offset);
    EXPECT_EQ(pieces[k].numel, cpu.grad_pieces()[k].numel);
    EXPECT_EQ(pieces[k].first_row, cpu.grad_pieces()[k].first_row);
  }
}

// 0, 1, ..., n - 1: the order the gradient-ready hook must announce n pieces in.
inline std::vector<int> piece_order(size_t n) {
  std::vector<int> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = static_cast<int>(k);
  return order;
}

// What the hook announced, and what a second stream copied of each piece once that piece's event had fired.
struct HookCopies {
  std::vector<int> calls;
  std::vector<float> grads;
};

// zero_grad, `forward()`, then a backward whose hook has a second stream wait on the piece's event and copy it. The
// compute stream clears the gradients right after (ordered after the copies by one more event, as a trainer's
// optimizer is), so a copy that ran early would see zeros or a partial sum.
template <class GpuModel, class Forward>
HookCopies copy_pieces_from_hook(GpuModel& gpu, Forward forward) {
  const cudaStream_t stream = gpu.stream();
  const std::vector<GradPiece>& pieces = gpu.grad_pieces();
  cudaStream_t comm = nullptr;
  cudaEvent_t comm_done = nullptr;
  cudaCheck(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
  cudaCheck(cudaEventCreateWithFlags(&comm_done, cudaEventDisableTiming));
  DeviceBuffer<float> seen(gpu.flat_size(), stream);
  cudaCheck(cudaStreamSynchronize(stream));  // `seen` poisoned before the comm stream writes it
  HookCopies out;
  gpu.zero_grad();
  forward();
  gpu.backward([&](int k) {
    out.calls.push_back(k);
    cudaCheck(cudaStreamWaitEvent(comm, gpu.piece_ready_event(k), 0));
    cudaCheck(cudaMemcpyAsync(seen.get() + pieces[k].offset, gpu.flat_grads() + pieces[k].offset,
                              pieces[k].numel * sizeof(float), cudaMemcpyDeviceToDevice, comm));
  });
  cudaCheck(cudaEventRecord(comm_done, comm));
  cudaCheck(cudaStreamWaitEvent(stream, comm_done, 0));
  gpu.zero_grad();
  cudaCheck(cudaStreamSynchronize(stream));
  out.grads = seen.download();
  // The alignment gaps between parameters (parameters.h) are in no piece, so the hook never copied them; the model
  // keeps them 0, and so does this copy (the comparison then checks that the model's gaps stayed 0).
  std::vector<bool> in_a_piece(out.grads.size(), false);
  for (const GradPiece& p : pieces) std::fill_n(in_a_piece.begin() + p.offset, p.numel, true);
  for (size_t i = 0; i < out.grads.size(); ++i)
    if (!in_a_piece[i]) out.grads[i] = 0.0f;
  cudaCheck(cudaEventDestroy(comm_done));
  cudaCheck(cudaStreamDestroy(comm));
  return out;
}

struct LossCurves {
  std::vector<float> cpu, gpu;
};

// `steps` AdamW steps on one batch, each model from zero gradients: the CPU Optimizer on the CPU model, the CUDA
// adamw kernel on the GPU model, writing a bf16 model's weight copy as the trainer's does. `cpu_forward()` returns the CPU model's loss; `gpu_forward()` runs the GPU model's.
template <class GpuModel, class CpuModel, class CpuForward, class GpuForward>
LossCurves adamw_loss_curves(GpuModel& gpu, CpuModel& cpu, const OptimizerConfig& opt, int steps,
                             CpuForward cpu_forward, GpuForward gpu_forward) {
  Optimizer<float> cpu_opt(opt, cpu.flat_size());
  const int64_t n = gpu.flat_size();
  DeviceBuffer<float> m(std::vector<float>(n, 0.0f), gpu.stream()), v(std::vector<float>(n, 0.0f), gpu.stream());
  LossCurves curves;
  for (int t = 1; t <= steps; ++t) {
    cpu.zero_grad();
    curves.cpu.push_back(cpu_forward());
    cpu.backward();
    cpu_opt.step(cpu.flat_params(), cpu.flat_grads());

    gpu.zero_grad();
    gpu_forward();
    gpu.backward();
    const auto target = gpu.params_for_update();  // the bf16 model's copy too: its next forward reads that
    cuda::adamw_update(target.params, target.params_bf16, gpu.flat_grads(), m.get(), v.get(), n, opt.lr, opt.beta1,
                       opt.beta2, opt.eps, opt.weight_decay, t, gpu.stream());
    curves.gpu.push_back(gpu.loss());
  }
  return curves;
}

// Each GPU loss within `rel_tol` of the CPU's; prints both curves, prefixed with `label`.
inline void expect_curves_close(const LossCurves& curves, double rel_tol, const std::string& label) {
  for (size_t t = 0; t < curves.cpu.size(); ++t) {
    EXPECT_NEAR(curves.gpu[t], curves.cpu[t], rel_tol * curves.cpu[t]) << "step " << t + 1;
    std::cout << label << " step " << t + 1 << ": loss " << curves.gpu[t] << " (CPU " << curves.cpu[t] << ")\n";
  }
}

}  // namespace ddplab::gpu_test
