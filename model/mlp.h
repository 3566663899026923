// A multi-layer perceptron with forward and backward written by hand (no autograd).
//
//   x[B,in] → Linear(in→hidden) → GELU → [Linear(hidden→hidden) → GELU] × (num_hidden_layers-1)
//           → Linear(hidden→classes) → softmax cross-entropy (mean over the batch)
//
// The default is the seed lab's model: 1024 → 1024 → GELU → 1024 → GELU → 1000 (three Linear layers).
//
// Parameters and gradients: a ParameterStore (model/parameters.h), one flat buffer each in backward order.
#pragma once
#include <cstdint>
#include <vector>

#include "model/parameters.h"

namespace ddplab {

struct MlpConfig {
  int input_dim = 1024;
  int hidden_dim = 1024;
  int num_hidden_layers = 2;  // number of Linear+GELU blocks before the classifier Linear
  int num_classes = 1000;
};

// The model's weights and biases, counted from the config before it is built (in double: a config past any memory
// must still count right, for the check that refuses it).
double mlp_parameter_count(const MlpConfig& config);

template <typename T>
class Mlp : public ParameterStore<T> {
 public:
  // Init as PyTorch's nn.Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), deterministic in seed.
  Mlp(const MlpConfig& config, uint64_t seed);

  const MlpConfig& config() const { return config_; }

  // inputs [B, input_dim], targets [B] in [0, num_classes). Caches activations for backward.
  // Returns the mean cross-entropy loss over the B rows.
  T forward(const T* inputs, const int32_t* targets, int batch);
  // Backward of the mean loss of the last forward. ACCUMULATES (+=) into the parameter gradients, so call
  // zero_grad() or discard_grad() first unless accumulating. Calls on_ready(k) as soon as grad_pieces()[k] is
  // final; a layer's weight gradient is finished before its input gradient is computed, so it is announced as early
  // as possible.
  void backward(const GradReadyHook& on_ready = nullptr);
  // Forward FLOPs per sample of the GEMMs (2*in*out per Linear); backward is twice that.
  int64_t gemm_flops_per_sample() const;

 private:
  MlpConfig config_;
  std::vector<int> dims_;  // feature sizes at the layer boundaries: dims_[l] -> dims_[l+1] is Linear l
  // Activations of the last forward (sized for its batch).
  int batch_ = 0;
  const T* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
  std::vector<std::vector<T>> pre_;   // per Linear: pre-activation out = x W^T + b; the last: the softmax's exps
  std::vector<std::vector<T>> post_;  // per hidden Linear: GELU(pre)
  std::vector<T> row_sums_, losses_, dact_a_, dact_b_;  // row_sums_: the softmax's (cpu::softmax_cross_entropy_forward)
};

}  // namespace ddplab
