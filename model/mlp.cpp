#include "model/mlp.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/rng.h"

namespace ddplab {
namespace {

// Feature sizes at the layer boundaries: dims[l] → dims[l+1] is Linear l.
std::vector<int> LayerDims(const MlpConfig& c) {
  std::vector<int> dims{c.input_dim};
  for (int i = 0; i < c.num_hidden_layers; ++i) dims.push_back(c.hidden_dim);
  dims.push_back(c.num_classes);
  return dims;
}

}  // namespace

double mlp_parameter_count(const MlpConfig& config) {
  const std::vector<int> dims = LayerDims(config);
  double count = 0;
  for (size_t l = 0; l + 1 < dims.size(); ++l) count += (dims[l] + 1.0) * dims[l + 1];  // Linear l: weight and bias
  return count;
}

namespace {

// Grow-only: a steady-state step with a batch no larger than before allocates nothing.
template <typename T>
void EnsureSize(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

template <typename T>
Mlp<T>::Mlp(const MlpConfig& config, uint64_t seed)
    : config_(config), dims_(LayerDims(config)), batch_(-1) {  // -1: no forward yet
  if (config.input_dim <= 0 || config.num_classes <= 0 || config.num_hidden_layers < 0 ||
      (config.num_hidden_layers > 0 && config.hidden_dim <= 0)) {
    throw std::invalid_argument(
        "Mlp: input_dim, num_classes (and hidden_dim when num_hidden_layers > 0) must be "
        "positive and num_hidden_layers non-negative");
  }
  const std::vector<int>& dims = dims_;
  const int num_linear = static_cast<int>(dims.size()) - 1;
  for (int l = 0; l < num_linear; ++l) {
    const std::string prefix = "fc" + std::to_string(l);
    const int weight = this->add_parameter(prefix + ".weight", {dims[l + 1], dims[l]});
    const int bias = this->add_parameter(prefix + ".bias", {dims[l + 1]});
    // Backward reads a weight for its input's gradient, after the weight's gradient; the network's input needs none,
    // and no bias is read.
    this->parameters()[weight].read_after_its_gradient = l > 0;
    this->parameters()[bias].read_after_its_gradient = false;
  }
  this->lay_out();
  std::vector<Parameter<T>>& params = this->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter<T>& p = params[i];
    // One sub-stream per parameter: a tensor's init does not depend on the layout or the other tensors.
    const uint64_t stream = substream(seed, i);
    const double bound = 1.0 / std::sqrt(static_cast<double>(dims[i / 2]));  // fan_in of Linear i/2
    for (int64_t k = 0; k < p.numel; ++k) p.data[k] = static_cast<T>((2.0 * uniform01(stream, k) - 1.0) * bound);
  }
  pre_.resize(num_linear);
  post_.resize(config.num_hidden_layers);
}

template <typename T>
T Mlp<T>::forward(const T* inputs, const int32_t* targets, int batch) {
  if (batch < 0) throw std::invalid_argument("Mlp::forward: negative batch size " + std::to_string(batch));
  for (int b = 0; b < batch; ++b) {
    if (targets[b] < 0 || targets[b] >= config_.num_classes) {
      throw std::out_of_range("Mlp::forward: target " + std::to_string(targets[b]) + " at row " + std::to_string(b) +
                              " outside [0, " + std::to_string(config_.num_classes) + ")");
    }
  }
  const std::vector<int>& dims = dims_;
  const int num_linear = static_cast<int>(dims.size()) - 1;
  const int64_t B = batch;
  int max_dim = 0;
  for (int l = 0; l < num_linear; ++l) {
    EnsureSize(pre_[l], B * dims[l + 1]);
    if (l < config_.num_hidden_layers) EnsureSize(post_[l], B * dims[l + 1]);
    max_dim = std::max(max_dim, dims[l + 1]);
  }
  EnsureSize(row_sums_, B);
  EnsureSize(losses_, B);
  EnsureSize(dact_a_, B * max_dim);
  EnsureSize(dact_b_, B * max_dim);

  const T* x = inputs;
  const std::vector<Parameter<T>>& params = this->parameters();
  for (int l = 0; l < num_linear; ++l) {
    const Parameter<T>& w = params[2 * l];
    const Parameter<T>& b = params[2 * l + 1];
    cpu::matmul_forward(pre_[l].data(), x, w.data, batch, dims[l], dims[l + 1]);
    cpu::bias_forward(pre_[l].data(), b.data, batch, dims[l + 1]);
    if (l < config_.num_hidden_layers) {
      cpu::gelu_forward(post_[l].data(), pre_[l].data(), B * dims[l + 1]);
      x = post_[l].data();
    }
  }
  // Backward reads these, so the caller keeps inputs and targets alive until then.
  batch_ = batch;
  inputs_ = inputs;
  targets_ = targets;
  // The softmax's exps in place of the logits (the last Linear's output, which nothing else reads), as the
  // transformer's head does.
  T* logits = pre_[num_linear - 1].data();
  return cpu::softmax_cross_entropy_forward(logits, row_sums_.data(), losses_.data(), logits, targets, batch,
                                            config_.num_classes);
}

template <typename T>
void Mlp<T>::backward(const GradReadyHook& on_ready) {
  if (batch_ < 0) throw std::logic_error("Mlp::backward called before forward");
  const std::vector<int>& dims = dims_;
  const int num_linear = static_cast<int>(dims.size()) - 1;
  const int B = batch_;

  T* dout = dact_a_.data();  // gradient w.r.t. the pre-activation of the current layer
  T* dnext = dact_b_.data();
  cpu::softmax_cross_entropy_backward(dout, pre_[num_linear - 1].data(), row_sums_.data(), targets_, B,
                                      config_.num_classes);
  const bool accumulate = !this->take_discard();  // each gradient element is written once below
  std::vector<Parameter<T>>& params = this->parameters();
  PieceAnnouncer announce(this->grad_pieces(), on_ready);
  for (int l = num_linear - 1; l >= 0; --l) {
    Parameter<T>& w = params[2 * l];
    Parameter<T>& b = params[2 * l + 1];
    cpu::bias_backward(b.grad, dout, B, dims[l + 1], accumulate);
    announce.ready(2 * l + 1);
    // The weight gradient first, block by block, so each block can be communicated while the rest of backward
    // (including this layer's input gradient) runs.
    const T* x = l == 0 ? inputs_ : post_[l - 1].data();
    while (const GradPiece* g = announce.next_of(2 * l)) {
      const int64_t rows = g->numel / dims[l];
      cpu::matmul_backward_weight(w.grad, dout, x, B, dims[l], dims[l + 1], static_cast<int>(g->first_row),
                                  static_cast<int>(g->first_row + rows), accumulate);
      announce.ready(2 * l);
    }
    if (l > 0) {  // the network input needs no gradient
      cpu::matmul_backward_input(dnext, dout, w.data, B, dims[l], dims[l + 1]);
      // Elementwise, so it may run in place: dpre = dpost * gelu'(pre).
      cpu::gelu_backward(dnext, pre_[l - 1].data(), dnext, static_cast<int64_t>(B) * dims[l]);
      std::swap(dout, dnext);
    }
  }
}

template <typename T>
int64_t Mlp<T>::gemm_flops_per_sample() const {
  const std::vector<int>& dims = dims_;
  int64_t flops = 0;
  for (size_t l = 0; l + 1 < dims.size(); ++l) flops += 2 * static_cast<int64_t>(dims[l]) * dims[l + 1];
  return flops;
}

template class Mlp<float>;
template class Mlp<double>;

}  // namespace ddplab
