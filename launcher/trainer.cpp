#include "launcher/trainer.h"

#include <algorithm>
#include <chrono>

namespace ddplab {
namespace {

std::unique_ptr<Reducer> make_reducer(const TrainConfig& config, Communicator& comm, Mlp<float>& model) {
  model.set_grad_piece_elements(static_cast<int64_t>(config.grad_slice_mb * 1048576.0 / sizeof(float)));
  std::vector<int64_t> numel, offset;
  for (const GradPiece& g : model.grad_pieces()) {
    numel.push_back(g.numel);
    offset.push_back(g.offset);
  }
  const ReducerConfig rc{config.bucket_mb, config.first_bucket_mb, config.overlap};
  return std::make_unique<Reducer>(comm, rc, numel, offset, model.flat_grads());
}

// Length of the overlap of [a0, a1] and [b0, b1].
double overlap_ms(double a0, double a1, double b0, double b1) {
  return std::max(0.0, std::min(a1, b1) - std::max(a0, b0));
}

}  // namespace

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Trainer::Trainer(const TrainConfig& config, Communicator& comm)
    : config_(config),
      comm_(comm),
      model_(config.mlp, config.seed),
      optimizer_(config.optimizer, model_.num_parameters()),
      data_(SyntheticConfig{config.mlp.input_dim, config.mlp.num_classes, config.seed, config.data_noise}),
      shard_{comm.rank(), comm.size(), config.batch * config.grad_accum},
      reducer_(make_reducer(config, comm, model_)),
      inputs_(static_cast<size_t>(config.batch) * config.mlp.input_dim),
      targets_(config.batch) {}

StepRecord Trainer::step(int step, double t0_ms) {
  StepRecord r;
  const int micro_batches = config_.grad_accum;
  // Each micro-batch's loss is a mean over `batch` rows, and the gradients of the micro-batches add up: the
  // global-batch mean needs 1/(world * micro-batches).
  reducer_->begin_step(t0_ms, 1.0f / static_cast<float>(comm_.size() * micro_batches));
  const GradReadyHook on_ready = [this](int piece) { reducer_->mark_ready(piece); };
  const double t_start = now_ms();
  double backward_start = t_start, backward_end = t_start;
  for (int m = 0; m < micro_batches; ++m) {
    const double t0 = m == 0 ? t_start : backward_end;  // phases tile the step: no time falls between them
    data_.fill(inputs_.data(), targets_.data(), shard_.first_sample(step) + int64_t{m} * config_.batch,
               config_.batch);
    const double t1 = now_ms();
    if (m == 0) model_.zero_grad();  // counted in forward
    r.loss += model_.forward(inputs_.data(), targets_.data(), config_.batch) / micro_batches;
    const double t2 = now_ms();
    reducer_->set_sync(m == micro_batches - 1);  // no_sync for all but the last micro-batch
    model_.backward(on_ready);
    const double t3 = now_ms();
    r.data_ms += t1 - t0;
    r.forward_ms += t2 - t1;
    r.backward_ms += t3 - t2;
    backward_start = t2;
    backward_end = t3;
  }
  reducer_->wait_all();
  const double t_reduced = now_ms();
  optimizer_.step(model_.flat_params(), model_.flat_grads());
  const double t_end = now_ms();

  r.start_ms = t_start - t0_ms;
  r.exposed_comm_ms = t_reduced - backward_end;
  r.optimizer_ms = t_end - t_reduced;
  r.step_ms = t_end - t_start;
  for (const BucketTimes& b : reducer_->bucket_times()) {
    r.comm_ms += b.comm_end_ms - b.comm_start_ms;
    r.hidden_comm_ms += overlap_ms(b.comm_start_ms, b.comm_end_ms, backward_start - t0_ms, backward_end - t0_ms);
  }
  return r;
}

}  // namespace ddplab
