// What run_training drives, one training step at a time: the CPU Trainer (launcher/trainer.h) or, with
// --device cuda, the CudaTrainer (launcher/cuda_trainer.h).
#pragma once
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/reducer.h"
#include "record/checkpoint.h"
#include "record/step_record.h"
#include "train/clock.h"
#include "train/train_config.h"
#include "model/parameters.h"

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

// The step's agreement, one small non-blocking all-reduce on a communicator of its own: {a stop signal, 1 + the
// highest rank with a non-finite loss}, both by MAX. Started after the last forward and finished after the
// gradients' all-reduces, so its latency hides behind backward; every rank gets the same answer, so every rank
// stops or skips at the same step. Shared by the CPU and GPU step runners.
class StepAgreement {
 public:
  explicit StepAgreement(MPI_Comm comm);  // collective: duplicates comm
  ~StepAgreement();
  StepAgreement(const StepAgreement&) = delete;
  StepAgreement& operator=(const StepAgreement&) = delete;
  void start(bool loss_finite);  // this rank's stop signal (StopSignals) and loss
  // Waits for the agreement; returns what was not finite, "" if nothing: some rank's loss, else what
  // nonfinite_gradient() names ("gradient fc1.bias", or "" when the reduced gradients are finite).
  std::string finish(const std::function<std::string()>& nonfinite_gradient);
  int stop_signal() const { return result_[0]; }  // after finish(): the signal some rank received, or 0
  MPI_Comm comm() const { return comm_; }         // --check-sync's too

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int mine_[2] = {0, 0}, result_[2] = {0, 0};
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// Shared by the CPU and GPU step runners, so both follow the same rules (docs/RELIABILITY.md).
// --fault hang|kill|throw, when this rank and step are the ones named (nan and diverge act inside the step).
void inject_fault_before(const TrainConfig& config, int rank, int step);
// A non-finite loss or gradient (`what`, "" if none), agreed by every rank: throws TrainingStopped (the update is
// not made) unless --skip-nonfinite; returns whether the step skips its update.
bool skip_nonfinite_step(const TrainConfig& config, const std::string& what, int step);
// --check-sync: every replica must hold the same parameters, bit for bit. Collective over comm: compares one
// fingerprint per gradient piece's slice of `params` (host memory, the flat layout) and throws TrainingStopped on
// every rank naming the first parameter, in registration order, that differs.
void check_replicas_agree(const float* params, const std::vector<GradPiece>& pieces,
                          const std::function<std::string(const GradPiece&)>& piece_name, MPI_Comm comm, int step);
// The buckets' communication time into r.comm_ms, and the part of it that overlapped backward [from, to] (ms on
// the buckets' time origin) into r.hidden_comm_ms.
void add_comm_times(StepRecord& r, const std::vector<BucketTimes>& buckets, double backward_from_ms,
                    double backward_to_ms);

}  // namespace ddplab
