// MlpCuda: see mlp_cuda.h. Host code only: every kernel it runs is a kernels/cuda launcher, so the host compiler
// builds this file.
#include "model/mlp_cuda.h"

#include <stdexcept>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/softmax_ce.h"

namespace ddplab {
namespace {

using bf16 = __nv_bfloat16;
using cuda_model::as;
using cuda_model::NvtxRange;

}  // namespace

MlpCuda::MlpCuda(const MlpConfig& config, uint64_t seed, Precision precision, int max_batch, cudaStream_t stream)
    : DeviceParameters(stream),
      precision_(precision),
      max_batch_(max_batch),
      gemm_(precision == Precision::kTf32 ? cuda::GemmMath::kTf32 : cuda::GemmMath::kFp32) {
  if (max_batch < 1)
    throw std::invalid_argument("MlpCuda: max_batch must be positive, got " + std::to_string(max_batch));
  // The CPU model defines the registration, the layout and the initial values; taking them from it (rather than
  // repeating its code) keeps the two identical by construction. It also validates the config, on the host.
  const Mlp<float> reference(config, seed);
  config_ = reference.config();
  take_layout(reference);
  dims_.push_back(static_cast<int>(params_[0].shape[1]));
  for (size_t p = 0; p < params_.size(); p += 2) {
    dims_.push_back(static_cast<int>(params_[p].shape[0]));
    const std::string layer = params_[p].name.substr(0, params_[p].name.find('.'));  // "fc0"
    nvtx_forward_.push_back(layer + " forward");
    nvtx_backward_.push_back(layer + " backward");
  }
  const int L = num_linear();
  const bool is_bf16 = precision == Precision::kBf16;
  const size_t act = is_bf16 ? sizeof(bf16) : sizeof(float), rows = static_cast<size_t>(max_batch);

  cuda_model::BufferLayout layout;
  const size_t at_params = layout.reserve(flat_size_ * sizeof(float)),
               at_grads = layout.reserve(flat_size_ * sizeof(float));
  const size_t at_weights_bf16 = is_bf16 ? layout.reserve(flat_size_ * sizeof(bf16)) : 0;
  const size_t at_activations = layout.reserve(0);  // from here on: poisoned below
  const size_t at_inputs_bf16 = is_bf16 ? layout.reserve(rows * dims_[0] * act) : 0;
  std::vector<size_t> at_out, at_pre_gelu;
  for (int l = 0; l < L; ++l) {
    at_out.push_back(layout.reserve(rows * dims_[l + 1] * act));
    if (l + 1 < L) at_pre_gelu.push_back(layout.reserve(rows * dims_[l + 1] * act));
  }
  const size_t at_losses = layout.reserve(rows * sizeof(float)), at_mean_loss = layout.reserve(sizeof(float));
  const size_t at_num_valid = layout.reserve(sizeof(int));

  const size_t end = layout.bytes();
  memory_ = cuda_model::allocate_model_memory("MlpCuda", end, at_activations, 0, max_batch, "samples");
  char* const bytes = static_cast<char*>(memory_.get());
  if (is_bf16) {
    weights_bf16_ = reinterpret_cast<bf16*>(bytes + at_weights_bf16);
    inputs_bf16_ = bytes + at_inputs_bf16;
  }
  for (size_t at : at_out) out_.push_back(bytes + at);
  for (size_t at : at_pre_gelu) pre_gelu_.push_back(bytes + at);
  losses_ = reinterpret_cast<float*>(bytes + at_losses);
  mean_loss_ = reinterpret_cast<float*>(bytes + at_mean_loss);
  num_valid_ = reinterpret_cast<int*>(bytes + at_num_valid);
  place_on_device(reinterpret_cast<float*>(bytes + at_params), reinterpret_cast<float*>(bytes + at_grads),
                  reference.flat_params());
  // Activations start as NaN (0xFF bytes): a kernel that reads an element no earlier kernel wrote turns the loss or
  // a gradient into NaN, which the tests see.
  cudaCheck(cudaMemsetAsync(bytes + at_activations, 0xFF, end - at_activations, stream_));
  cudaCheck(cudaStreamSynchronize(stream_));  // `reference` is freed on return

  loss_host_.emplace();
  set_grad_piece_elements(0);
}

MlpCuda::~MlpCuda() = default;

void MlpCuda::forward(const float* inputs, const int32_t* targets, int batch) {
  if (batch < 0 || batch > max_batch_)
    throw std::invalid_argument("MlpCuda::forward: batch " + std::to_string(batch) + " outside [0, " +
                                std::to_string(max_batch_) + "]");
  NvtxRange range("MlpCuda forward");
  if (precision_ == Precision::kBf16)
    forward_layers<bf16>(inputs, targets, batch);
  else
    forward_layers<float>(inputs, targets, batch);
  loss_host_->enqueue(mean_loss_, stream_);
  batch_ = batch;
  layer0_input_ = precision_ == Precision::kBf16 ? inputs_bf16_ : static_cast<const void*>(inputs);
}

template <typename T>
void MlpCuda::forward_layers(const float* inputs, const int32_t* targets, int B) {
  const T* x = nullptr;
  if constexpr (std::is_same_v<T, bf16>) {
    // The whole flat buffer (weights and biases), after a change of the master weights that did not rewrite the copy
    // too (the initial upload, a checkpoint; AdamW writes it, params_for_update).
    if (master_weights_changed()) cuda::f32_to_bf16(weights_bf16_, flat_params_, flat_size_, stream_);
    cuda::f32_to_bf16(as<T>(inputs_bf16_), inputs, int64_t{B} * dims_[0], stream_);
    x = as<T>(inputs_bf16_);
  } else {
    x = inputs;
  }
  const int L = num_linear();
  for (int l = 0; l < L; ++l) {
    NvtxRange range(nvtx_forward_[l].c_str());
    T* out = as<T>(out_[l]);
    const T *weight = operand<T>(2 * l), *bias = operand<T>(2 * l + 1);
    if (l + 1 < L)
      cuda::matmul_bias_gelu_forward<T>(gemm_, out, as<T>(pre_gelu_[l]), x, weight, bias, B, dims_[l], dims_[l + 1],
                                        stream_);
    else
      cuda::matmul_forward<T>(gemm_, out, x, weight, bias, B, dims_[l], dims_[l + 1], stream_);
    x = out;
  }
  // The loss and the gradient of the mean loss in one pass, dlogits over the logits: backward needs only those.
  T* logits = as<T>(out_[L - 1]);
  cuda::softmax_cross_entropy_fused<T>(logits, losses_, mean_loss_, num_valid_, logits, targets, B, dims_[L], 1.0f,
                                       stream_);
}

float MlpCuda::loss() const { return loss_host_->wait(); }

void MlpCuda::backward(const GradReadyHook& on_ready) {
  if (batch_ < 0) throw std::logic_error("MlpCuda::backward: no forward since the last backward");
  NvtxRange range("MlpCuda backward");
  if (precision_ == Precision::kBf16)
    backward_layers<bf16>(on_ready);
  else
    backward_layers<float>(on_ready);
  batch_ = -1;
}

template <typename T>
void MlpCuda::backward_layers(const GradReadyHook& on_ready) {
  const int B = batch_;
  PieceAnnouncer announce = cuda_model::device_piece_announcer(pieces_, piece_events_, stream_, on_ready);
  const T* dout = as<T>(out_.back());  // dlogits, written by forward
  const bool accumulate = !take_discard();  // each gradient element is written once below
  for (int l = num_linear() - 1; l >= 0; --l) {
    NvtxRange range(nvtx_backward_[l].c_str());
    const Parameter<float>& w = params_[2 * l];
    const Parameter<float>& b = params_[2 * l + 1];
    const T* x = l == 0 ? static_cast<const T*>(layer0_input_) : as<T>(out_[l - 1]);
    // The weight gradient before the input gradient, block by block, so each block's communication can start while
    // the rest of backward runs; the bias first, as its piece comes first.
    cuda::bias_backward<T>(gemm_, b.grad, dout, B, dims_[l + 1], stream_, accumulate);
    announce.ready(2 * l + 1);
    while (const GradPiece* g = announce.next_of(2 * l)) {
      const int first = static_cast<int>(g->first_row), rows = static_cast<int>(g->numel / dims_[l]);
      cuda::matmul_backward_weight<T>(gemm_, w.grad, dout, x, B, dims_[l], dims_[l + 1], first, first + rows, stream_,
                                      accumulate);
      announce.ready(2 * l);
    }
    if (l > 0) {  // the network input needs no gradient
      // x, the GELU output, is dead once the weight-gradient GEMMs that read it are enqueued (same stream): its
      // buffer takes the gradient w.r.t. the GELU input, through the GELU by the GEMM's epilogue.
      T* dx = as<T>(out_[l - 1]);
      cuda::matmul_backward_input_dgelu<T>(gemm_, dx, dout, operand<T>(2 * l), as<T>(pre_gelu_[l - 1]), B, dims_[l],
                                           dims_[l + 1], stream_);
      dout = dx;
    }
  }
}

}  // namespace ddplab
