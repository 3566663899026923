// What run_training drives, one training step at a time: the CPU Trainer (launcher/trainer.h) or, with
// --device cuda, the CudaTrainer (launcher/cuda_trainer.h).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/reducer.h"
#include "launcher/checkpoint.h"
#include "launcher/step_record.h"
#include "model/mlp.h"

namespace ddplab {

// A stop every rank reaches at the same step with the same message (a non-finite loss or gradient, diverged
// replicas, a stop signal): the run file keeps what was measured, and the job ends without an abort, with
// exit code 4 (or 128 + the signal).
class TrainingStopped : public std::runtime_error {
 public:
  explicit TrainingStopped(const std::string& what, int exit_code = 4) : std::runtime_error(what), exit_code(exit_code) {}
  int exit_code;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Runs step `step` (0-based) and returns its timings; times are measured from `t0_ms` (a steady-clock reading
  // every rank took right after a barrier). Throws TrainingStopped on every rank when the step's loss or gradients
  // are not finite (unless --skip-nonfinite: the step then skips its update and says so in StepRecord::skipped)
  // and when --check-sync finds the replicas diverged.
  virtual StepRecord step(int step, double t0_ms) = 0;
  // The signal (SIGINT, SIGTERM) some rank received by the last step, agreed by all ranks at that step; 0: none.
  virtual int stop_signal() const = 0;
  virtual const std::vector<Bucket>& buckets() const = 0;
  // The last step's timings, one entry per bucket, on step()'s time origin.
  virtual const std::vector<BucketTimes>& bucket_times() const = 0;
  virtual const std::vector<GradPiece>& grad_pieces() const = 0;
  // "fc1.weight[0:256]": a piece's parameter name, with its rows when it is a block of them.
  virtual std::string piece_name(const GradPiece& piece) const = 0;
  virtual std::string describe() const = 0;  // one line for the run header
  // Checkpoints (launcher/checkpoint.h): this rank's parameters and optimizer state, in the CPU model's names,
  // shapes and layout whatever the device. Reading validates everything first and leaves the state untouched on
  // refusal (UsageError).
  virtual void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) = 0;
  virtual CheckpointInfo read_checkpoint(const std::string& path) = 0;
};

}  // namespace ddplab
