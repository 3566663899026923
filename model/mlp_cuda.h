// The MLP of model/mlp.h on one GPU, forward and backward through the kernels/cuda launchers, for a trainer that
// drives it on a compute stream and reduces gradient pieces on a communication stream while backward runs.
//
// Shared with Mlp<float>: the config, the parameter registration (names, shapes), the flat parameter and gradient
// layout in REVERSE registration order, the gradient pieces, and the initial values, bit for bit: the constructor
// builds the CPU model with the same seed and uploads its parameters. Checkpoints and bucket layouts therefore
// carry over unchanged. Parameter::data and Parameter::grad point to DEVICE memory here.
//
// Asynchronous: every call enqueues on the stream given at construction and returns; only loss() waits (for the
// last forward's loss and nothing else). backward() records an event per gradient piece right after that piece's
// last kernel and then calls the hook, so the hook can make a communication stream wait on piece_ready_event(k)
// and reduce the piece while the rest of backward runs: the host never blocks inside backward.
//
// Precision (model/precision.h; the full table in docs/GPU.md): parameters, gradients and the loss are fp32 in every
// mode. fp32 and tf32 keep fp32 activations and differ in the GEMMs' math; bf16 runs the GEMMs on bf16 activations
// and on bf16 copies of the weights and biases, converted from the fp32 masters by the first forward after they changed
// (flat_params(): the optimizer between two steps updates the fp32 ones).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "model/cuda_common.h"
#include "model/mlp.h"
#include "model/precision.h"

namespace ddplab {

class MlpCuda : public cuda_model::DeviceParameters {
 public:
  // Device buffers for batches of up to max_batch rows, allocated once (a step allocates nothing). A bad config or
  // max_batch < 1 throws std::invalid_argument before the device is touched; a CUDA failure, std::runtime_error.
  MlpCuda(const MlpConfig& config, uint64_t seed, Precision precision, int max_batch, cudaStream_t stream);
  ~MlpCuda();
  MlpCuda(const MlpCuda&) = delete;
  MlpCuda& operator=(const MlpCuda&) = delete;

  const MlpConfig& config() const { return config_; }
  Precision precision() const { return precision_; }
  int max_batch() const { return max_batch_; }
  // parameters(), the flat buffers, grad_pieces() and their events, zero_grad(), discard_grad(), stream():
  // DeviceParameters.

  // inputs [batch, input_dim] fp32 and targets [batch] in [0, num_classes), device memory, 0 <= batch <= max_batch.
  // Enqueues the layers, the fused softmax cross-entropy (which also writes the gradient of the mean loss for
  // backward) and an asynchronous copy of the mean loss to pinned host memory. The targets are read by this
  // forward's kernels, the inputs also by backward's in fp32 and tf32: work that overwrites them must be ordered
  // after those (later on the stream, or behind an event recorded after backward). Targets are not checked (that
  // would need a sync): one >= num_classes makes its row's loss, hence the mean, NaN; a negative one marks a padding
  // row, left out of the mean and the gradient (the fused kernel's rule).
  void forward(const float* inputs, const int32_t* targets, int batch);
  // The mean loss of the last forward, fp32, on the host: WAITS for that forward's loss copy (not for later work on the
  // stream). NaN before the first forward.
  float loss() const;

  // Backward of the last forward's mean loss. ACCUMULATES (+=) into the fp32 gradients, or writes them over after
  // discard_grad() (zero_grad() or discard_grad() first unless accumulating). For each piece in grad_pieces() order:
  // enqueue its kernels, record piece_ready_event(k), call on_ready(k). Once per forward: the hidden activations'
  // buffers take their gradients (std::logic_error on a second call).
  void backward(const GradReadyHook& on_ready = nullptr);
  // The GEMMs' context: how they pick cuBLASLt's algorithms (set_timed_algos), what they planned.
  cuda::GemmContext& gemm() { return gemm_; }
  const cuda::GemmContext& gemm() const { return gemm_; }

 private:
  int num_linear() const { return static_cast<int>(dims_.size()) - 1; }
  template <typename T>
  void forward_layers(const float* inputs, const int32_t* targets, int batch);
  template <typename T>
  void backward_layers(const GradReadyHook& on_ready);

  MlpConfig config_;
  Precision precision_;
  int max_batch_;
  std::vector<int> dims_;  // feature sizes at the layer boundaries: Linear l maps dims_[l] -> dims_[l + 1]
  std::vector<std::string> nvtx_forward_, nvtx_backward_;  // "fc<l> forward" / "fc<l> backward"
  cuda::GemmContext gemm_;

  // One device allocation holds everything below; activations are float or __nv_bfloat16 by precision.
  cuda::DeviceMemory memory_;
  void* inputs_bf16_ = nullptr;            // bf16 only: the forward's inputs converted
  std::vector<void*> out_;                 // per Linear: GELU output (hidden) or logits, then dlogits (last)
  std::vector<void*> pre_gelu_;            // per hidden Linear: the GELU input, for its backward
  float* losses_ = nullptr;                // per row
  float* mean_loss_ = nullptr;
  int* num_valid_ = nullptr;

  std::optional<cuda_model::LossReadback> loss_host_;  // made once the arguments are checked (it touches the device)

  // Set by forward for backward: the batch (-1: no backward pending) and the first Linear's input as its GEMM read
  // it (the caller's fp32 inputs, or their bf16 copy).
  int batch_ = -1;
  const void* layer0_input_ = nullptr;
};

}  // namespace ddplab
