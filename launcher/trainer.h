// The data-parallel training loop: each rank trains its own replica on its shard of every global batch,
// all-reduces (averages) the gradients after backward, and takes the same optimizer step, so the replicas
// stay bitwise identical.
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "data/synthetic.h"
#include "launcher/step_record.h"
#include "launcher/train_config.h"
#include "model/mlp.h"
#include "model/optimizer.h"

namespace ddplab {

class Trainer {
 public:
  // `comm` must outlive the trainer. Every rank of comm constructs its trainer with the same config.
  Trainer(const TrainConfig& config, Communicator& comm);
  // Runs step `step` (0-based) and returns its timings; start_ms is measured from `t0_ms` (a steady-clock
  // reading taken by every rank right after a barrier).
  StepRecord step(int step, double t0_ms);

  Mlp<float>& model() { return model_; }
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  Communicator& comm_;
  Mlp<float> model_;
  Optimizer<float> optimizer_;
  SyntheticClassification data_;
  ShardedBatches shard_;
  std::vector<float> inputs_;
  std::vector<int32_t> targets_;
};

// Milliseconds on the monotonic clock.
double now_ms();

}  // namespace ddplab
