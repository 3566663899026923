#include "model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/ops.h"

namespace ddplab {

float learning_rate(const OptimizerConfig& c, int64_t step, int64_t steps) {
  if (step < c.lr_warmup) return static_cast<float>(static_cast<double>(c.lr) * (step + 1) / c.lr_warmup);
  if (c.lr_schedule == LrSchedule::kConstant) return c.lr;
  const double decay = static_cast<double>(step - c.lr_warmup) / std::max<int64_t>(steps - c.lr_warmup, 1);
  const double lr_min = static_cast<double>(c.lr) * c.lr_final;
  constexpr double kPi = 3.14159265358979323846;
  return static_cast<float>(lr_min + (c.lr - lr_min) * 0.5 * (1 + std::cos(kPi * std::min(decay, 1.0))));
}

template <typename T>
Optimizer<T>::Optimizer(const OptimizerConfig& config, int64_t flat_size)
    : config_(config), n_(flat_size), lr_(config.lr) {
  if (flat_size < 0) throw std::invalid_argument("Optimizer: negative parameter count");
  // Zero state: AdamW's first step and SGD's first momentum step (buf = g) then match PyTorch.
  if (config.kind == OptimizerKind::kAdamW) {
    m_.assign(n_, T(0));
    v_.assign(n_, T(0));
  } else if (config.momentum != 0.0f) {
    m_.assign(n_, T(0));
  }
}

template <typename T>
void Optimizer<T>::update(T* params, const T* grads, int64_t offset, int64_t count) {
  if (t_ == 0 || offset < 0 || count < 0 || offset + count > n_)
    throw std::logic_error("Optimizer::update: a slice outside the buffer, or no begin_step()");
  T* p = params + offset;
  const T* g = grads + offset;
  T* m = m_.empty() ? nullptr : m_.data() + offset;
  if (config_.kind == OptimizerKind::kAdamW) {
    cpu::adamw_update(p, g, m, v_.data() + offset, count, lr_, config_.beta1, config_.beta2, config_.eps,
                      config_.weight_decay, t_, grad_scale_);
  } else {
    cpu::sgd_update(p, g, m, count, lr_, config_.momentum, config_.weight_decay, grad_scale_);
  }
}

template <typename T>
void Optimizer<T>::update_and_zero_grads(T* params, T* grads, int64_t offset, int64_t count) {
  constexpr int64_t kBlock = 8192;  // elements: AdamW's four streams of a block fit in L2 with room to spare
  for (int64_t done = 0; done < count; done += kBlock) {
    const int64_t n = std::min(kBlock, count - done);
    update(params, grads, offset + done, n);
    std::fill_n(grads + offset + done, n, T(0));
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
