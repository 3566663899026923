// The data-parallel training loop: each rank trains its own replica on its shard of every global batch; the
// Reducer averages the gradients in buckets while backward runs; every rank takes the same optimizer step, so
// the replicas stay bitwise identical.
#pragma once
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/reducer.h"
#include "launcher/step_record.h"
#include "launcher/train_config.h"
#include "launcher/workload.h"
#include "model/optimizer.h"

namespace ddplab {

class Trainer {
 public:
  // Collective over comm (the Reducer checks the bucket layout). `comm` must outlive the trainer.
  Trainer(const TrainConfig& config, Communicator& comm);
  // Runs step `step` (0-based) and returns its timings; times are measured from `t0_ms` (a steady-clock
  // reading every rank took right after a barrier). Bucket timings of the step: reducer().bucket_times().
  StepRecord step(int step, double t0_ms);

  Workload& workload() { return *workload_; }
  const Reducer& reducer() const { return *reducer_; }
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  Communicator& comm_;
  std::unique_ptr<Workload> workload_;
  Optimizer<float> optimizer_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Communicator> extra_comm_;  // its own communicator: never interleaves with the Reducer's
  std::vector<float> extra_buffer_;
};

// Milliseconds on the monotonic clock.
double now_ms();

}  // namespace ddplab
