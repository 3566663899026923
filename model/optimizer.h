// Optimizers over one flat parameter buffer (model/parameters.h says why the buffer is flat).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/choices.h"

namespace ddplab {

enum class OptimizerKind { kAdamW, kSgd };
constexpr std::array<Named<OptimizerKind>, 2> choice_names(OptimizerKind) {
  return {{{OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kSgd, "sgd"}}};
}

// How the learning rate moves over the run after its warm-up (learning_rate below).
enum class LrSchedule { kConstant, kCosine };
constexpr std::array<Named<LrSchedule>, 2> choice_names(LrSchedule) {
  return {{{LrSchedule::kConstant, "constant"}, {LrSchedule::kCosine, "cosine"}}};
}

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.01f;  // PyTorch's AdamW default; decoupled for AdamW, L2 for SGD
  float momentum = 0.0f;       // SGD only
  // The cap of the reduced gradients' global L2 norm (kernels/grad_clip.h); 0: no clipping, PyTorch's default.
  float grad_clip = 0.0f;
  bool clips() const { return grad_clip > 0; }
  // The learning rate's schedule: lr_warmup steps of linear warm-up, then lr_schedule; cosine decays towards
  // lr x lr_final.
  LrSchedule lr_schedule = LrSchedule::kConstant;
  int lr_warmup = 0;
  float lr_final = 0.0f;
  bool lr_varies() const { return lr_schedule != LrSchedule::kConstant || lr_warmup > 0; }
};

// The learning rate of step `step` (0-based) in a run of `steps`, as llm.c schedules it: lr x (step + 1) / lr_warmup
// over the first lr_warmup steps; then lr, or with cosine lr_min + (lr - lr_min) (1 + cos(pi d)) / 2, where
// lr_min = lr x lr_final and d = (step - lr_warmup) / (steps - lr_warmup) goes from 0 towards 1 over the rest of the
// run. A function of the step and the run's length alone: a resumed run that repeats --steps (launcher/run.cpp
// requires it of a cosine) continues the schedule where it stopped.
float learning_rate(const OptimizerConfig& config, int64_t step, int64_t steps);

template <typename T>
class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, int64_t flat_size);
  // One update of params from grads (both flat, flat_size long). Counts steps from 1.
  void step(T* params, const T* grads) {
    begin_step();
    update(params, grads, 0, n_);
  }
  // The same update in parts (--optimizer-in-backward: piece by piece as backward releases them): begin_step()
  // once, then update() over disjoint slices [offset, offset + count) that together cover the buffer, in any order,
  // one call at a time. The element-wise rule makes the parts bitwise equal to step().
  // grad_scale: the step's updates read every gradient times it (gradient clipping's factor, kernels/grad_clip.h).
  void begin_step(T grad_scale = 1) {
    ++t_;
    grad_scale_ = grad_scale;
  }
  void update(T* params, const T* grads, int64_t offset, int64_t count);
  // update(), leaving the slice's gradients zero for the next backward to add to: a weight-gradient GEMM told to
  // overwrite its output (beta 0) has OpenBLAS zero that output first, a pass of its own on backward's critical path
  // (train/cpu_backend.h). Zeroed block by block right after the update reads them, while they are in cache.
  void update_and_zero_grads(T* params, T* grads, int64_t offset, int64_t count);
  int steps_taken() const { return t_; }
  // The learning rate of the updates from now on (PyTorch's param_group["lr"], which its schedulers set); starts at
  // the config's lr.
  void set_lr(float lr) { lr_ = lr; }
  const OptimizerConfig& config() const { return config_; }

  // The state a checkpoint saves (record/checkpoint.h), flat like the parameters: AdamW's first and second
  // moments, or SGD's momentum buffer as the first moment. A state the kind does not keep is empty.
  const std::vector<T>& first_moment() const { return m_; }
  const std::vector<T>& second_moment() const { return v_; }
  // The same, writable (--zero-stage 1 gathers each rank's owned elements into them before a checkpoint).
  std::vector<T>& first_moment() { return m_; }
  std::vector<T>& second_moment() { return v_; }
  // Continues from a saved state; m and v must have the sizes of first_moment() and second_moment().
  void restore(int steps_taken, std::vector<T> m, std::vector<T> v);

 private:
  OptimizerConfig config_;
  int64_t n_;
  int t_ = 0;
  float lr_;
  T grad_scale_ = 1;      // this step's
  std::vector<T> m_, v_;  // AdamW moments, or SGD momentum buffer in m_
};

}  // namespace ddplab
