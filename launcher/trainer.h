// The data-parallel training loop: each rank trains its own replica on its shard of every global batch; the
// Reducer averages the gradients in buckets while backward runs; every rank takes the same optimizer step, so
// the replicas stay bitwise identical.
#pragma once
#include <mpi.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/reducer.h"
#include "launcher/step_record.h"
#include "launcher/train_config.h"
#include "launcher/workload.h"
#include "model/optimizer.h"

namespace ddplab {

// A stop every rank reaches at the same step with the same message (a non-finite loss or gradient, diverged
// replicas, a stop signal): the run file keeps what was measured, and the job ends without an abort, with
// exit code 4 (or 128 + the signal).
class TrainingStopped : public std::runtime_error {
 public:
  explicit TrainingStopped(const std::string& what, int exit_code = 4) : std::runtime_error(what), exit_code(exit_code) {}
  int exit_code;
};

class Trainer {
 public:
  // Collective over comm (the Reducer checks the bucket layout). `comm` must outlive the trainer.
  Trainer(const TrainConfig& config, Communicator& comm);
  // Runs step `step` (0-based) and returns its timings; times are measured from `t0_ms` (a steady-clock
  // reading every rank took right after a barrier). Bucket timings of the step: reducer().bucket_times().
  // Throws TrainingStopped on every rank when the step's loss or gradients are not finite (unless
  // --skip-nonfinite: the step then skips its update and says so in StepRecord::skipped) and when --check-sync
  // finds the replicas diverged.
  StepRecord step(int step, double t0_ms);
  // The signal (SIGINT, SIGTERM) some rank received by the last step, agreed by all ranks at that step; 0: none.
  int stop_signal() const { return stop_signal_; }
  ~Trainer();

  Workload& workload() { return *workload_; }
  Optimizer<float>& optimizer() { return optimizer_; }
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
  MPI_Comm control_comm_ = MPI_COMM_NULL;  // the per-step agreement on stopping; its own, never mixed with others
  int stop_signal_ = 0;

  void inject_fault_before(int step);
  std::string first_nonfinite_gradient(int bucket) const;
  void check_replicas_agree(int step);
};

// Milliseconds on the monotonic clock.
double now_ms();

}  // namespace ddplab
