#include "model/optimizer.h"

#include <stdexcept>
#include <utility>

#include "kernels/cpu/ops.h"

namespace ddplab {

template <typename T>
Optimizer<T>::Optimizer(const OptimizerConfig& config, int64_t flat_size) : config_(config), n_(flat_size) {
  if (config.kind != "adamw" && config.kind != "sgd") {
    throw std::invalid_argument("unknown optimizer '" + config.kind + "' (expected adamw or sgd)");
  }
  if (flat_size < 0) throw std::invalid_argument("Optimizer: negative parameter count");
  // Zero state: AdamW's first step and SGD's first momentum step (buf = g) then match PyTorch.
  if (config.kind == "adamw") {
    m_.assign(n_, T(0));
    v_.assign(n_, T(0));
  } else if (config.momentum != 0.0f) {
    m_.assign(n_, T(0));
  }
}

template <typename T>
void Optimizer<T>::step(T* params, const T* grads) {
  ++t_;
  if (config_.kind == "adamw") {
    cpu::adamw_update(params, grads, m_.data(), v_.data(), n_, config_.lr, config_.beta1, config_.beta2, config_.eps,
                      config_.weight_decay, t_);
  } else {
    cpu::sgd_update(params, grads, m_.data(), n_, config_.lr, config_.momentum, config_.weight_decay);
  }
}

template <typename T>
void Optimizer<T>::restore(int steps_taken, std::vector<T> m, std::vector<T> v) {
  if (steps_taken < 0 || m.size() != m_.size() || v.size() != v_.size())
    throw std::invalid_argument("Optimizer::restore: state does not match this optimizer");
  t_ = steps_taken;
  m_ = std::move(m);
  v_ = std::move(v);
}

template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace ddplab
