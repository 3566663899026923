// The data-parallel training loop: each rank trains its own replica on its shard of every global batch; the
// Reducer averages the gradients in buckets while backward runs; every rank takes the same optimizer step, so
// the replicas stay bitwise identical.
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/reducer.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "launcher/step_record.h"
#include "launcher/train_config.h"
#include "model/mlp.h"
#include "model/optimizer.h"

namespace ddplab {

class Trainer {
 public:
  // Collective over comm (the Reducer checks the bucket layout). `comm` must outlive the trainer.
  Trainer(const TrainConfig& config, Communicator& comm);
  // Runs step `step` (0-based) and returns its timings; times are measured from `t0_ms` (a steady-clock
  // reading every rank took right after a barrier). Bucket timings of the step: reducer().bucket_times().
  StepRecord step(int step, double t0_ms);

  Mlp<float>& model() { return model_; }
  const Reducer& reducer() const { return *reducer_; }
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  Communicator& comm_;
  Mlp<float> model_;
  Optimizer<float> optimizer_;
  SyntheticClassification data_;
  ShardedBatches shard_;  // over the rank's whole step: grad_accum micro-batches of `batch` samples
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<Communicator> extra_comm_;  // its own communicator: never interleaves with the Reducer's
  std::vector<float> extra_buffer_;
};

// Milliseconds on the monotonic clock.
double now_ms();

}  // namespace ddplab
