// A multi-layer perceptron with forward and backward written by hand (no autograd).
//
//   x[B,in] → Linear(in→hidden) → GELU → [Linear(hidden→hidden) → GELU] × (num_hidden_layers-1)
//           → Linear(hidden→classes) → softmax cross-entropy (mean over the batch)
//
// The default is the seed lab's model: 1024 → 1024 → GELU → 1024 → GELU → 1000 (three Linear layers).
//
// Parameter storage: all parameters live in ONE flat buffer and all gradients in ONE flat grad buffer, both
// laid out in REVERSE registration order — the order in which backward finalises gradients. A gradient
// bucket (a run of consecutive ready gradients) is therefore one contiguous slice of the grad buffer: the
// communication engine reduces views into it with no copy in or out, and the optimizer runs once over the
// whole flat buffer.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddplab {

struct MlpConfig {
  int input_dim = 1024;
  int hidden_dim = 1024;
  int num_hidden_layers = 2;  // number of Linear+GELU blocks before the classifier Linear
  int num_classes = 1000;
};

// A view of one registered parameter inside the flat buffers.
template <typename T>
struct Parameter {
  std::string name;          // "fc0.weight", "fc0.bias", ..., registration order = forward order
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;        // element offset into the flat param and grad buffers
  T* data = nullptr;
  T* grad = nullptr;
};

// Called by backward with the parameter's registration index as soon as its gradient is final.
using GradReadyHook = std::function<void(int param_index)>;

template <typename T>
class Mlp {
 public:
  // Init as PyTorch's nn.Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), deterministic in seed.
  Mlp(const MlpConfig& config, uint64_t seed);
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const MlpConfig& config() const { return config_; }
  // Parameters in registration (forward) order.
  std::vector<Parameter<T>>& parameters() { return params_; }
  const std::vector<Parameter<T>>& parameters() const { return params_; }
  int64_t num_parameters() const { return static_cast<int64_t>(flat_params_.size()); }
  T* flat_params() { return flat_params_.data(); }
  T* flat_grads() { return flat_grads_.data(); }
  const T* flat_params() const { return flat_params_.data(); }
  const T* flat_grads() const { return flat_grads_.data(); }

  // inputs [B, input_dim], targets [B] in [0, num_classes). Caches activations for backward.
  // Returns the mean cross-entropy loss over the B rows.
  T forward(const T* inputs, const int32_t* targets, int batch);
  // Backward of the mean loss of the last forward. ACCUMULATES (+=) into the parameter gradients, so call
  // zero_grad() first unless accumulating. Calls on_ready(i) when parameter i's gradient is final.
  void backward(const GradReadyHook& on_ready = nullptr);
  void zero_grad();
  // Forward FLOPs per sample of the GEMMs (2*in*out per Linear); backward is twice that.
  int64_t gemm_flops_per_sample() const;

 private:
  MlpConfig config_;
  std::vector<T> flat_params_, flat_grads_;
  std::vector<Parameter<T>> params_;
  // Activations of the last forward (sized for its batch).
  int batch_ = 0;
  const T* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
  std::vector<std::vector<T>> pre_;   // per Linear: pre-activation out = x W^T + b
  std::vector<std::vector<T>> post_;  // per hidden Linear: GELU(pre)
  std::vector<T> probs_, losses_, dact_a_, dact_b_;
};

}  // namespace ddplab
