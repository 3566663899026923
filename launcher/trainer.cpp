#include "launcher/trainer.h"

#include <chrono>

namespace ddplab {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Trainer::Trainer(const TrainConfig& config, Communicator& comm)
    : config_(config),
      comm_(comm),
      model_(config.mlp, config.seed),
      optimizer_(config.optimizer, model_.num_parameters()),
      data_(SyntheticConfig{config.mlp.input_dim, config.mlp.num_classes, config.seed, config.data_noise}),
      shard_{comm.rank(), comm.size(), config.batch},
      inputs_(static_cast<size_t>(config.batch) * config.mlp.input_dim),
      targets_(config.batch) {}

StepRecord Trainer::step(int step, double t0_ms) {
  StepRecord r;
  const double t_start = now_ms();
  data_.fill(inputs_.data(), targets_.data(), shard_.first_sample(step), config_.batch);
  const double t_data = now_ms();
  model_.zero_grad();
  r.loss = model_.forward(inputs_.data(), targets_.data(), config_.batch);
  const double t_forward = now_ms();
  model_.backward();
  const double t_backward = now_ms();
  // The flat grad buffer holds every gradient: one all-reduce (bucketing and overlap come with the Reducer).
  comm_.allreduce_mean(model_.flat_grads(), static_cast<size_t>(model_.num_parameters()));
  const double t_allreduce = now_ms();
  optimizer_.step(model_.flat_params(), model_.flat_grads());
  const double t_end = now_ms();

  r.start_ms = t_start - t0_ms;
  r.data_ms = t_data - t_start;
  r.forward_ms = t_forward - t_data;
  r.backward_ms = t_backward - t_forward;
  r.allreduce_ms = t_allreduce - t_backward;
  r.optimizer_ms = t_end - t_allreduce;
  r.step_ms = t_end - t_start;
  return r;
}

}  // namespace ddplab
