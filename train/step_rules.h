// The rules every data-parallel step follows, whatever the device (the Trainer, train/trainer.h, applies them): how a
// step stops on every rank at once, the finite/stop agreement, fault injection, the replica check, and how the
// buckets' times count as communication. docs/RELIABILITY.md.
#pragma once
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "ddp/reducer.h"
#include "model/parameters.h"
#include "record/step_record.h"
#include "runtime/errors.h"  // kExitWriteFailed
#include "runtime/owned_comm.h"
#include "train/clock.h"

namespace ddplab {

// A stop every rank reaches at the same step with the same message (a non-finite loss or gradient, diverged
// replicas, a stop signal, a result that could not be written): the run file (or, when that is what failed, the
// last snapshot) keeps what was measured, and the job ends without an abort, with exit code 4 (or 128 + the
// signal, or kExitWriteFailed).
class TrainingStopped : public std::runtime_error {
 public:
  explicit TrainingStopped(const std::string& what, int exit_code = 4) : std::runtime_error(what), exit_code(exit_code) {}
  int exit_code;
};

// The step's agreement, one small non-blocking all-reduce on a communicator of its own: {a stop signal, 1 + the
// highest rank with a non-finite loss}, both by MAX. Started after the last backward (it needs the step's losses) and
// finished after the gradients' all-reduces, so its latency hides behind theirs; every rank gets the same answer, so
// every rank stops or skips at the same step.
class StepAgreement {
 public:
  explicit StepAgreement(MPI_Comm comm);  // collective: duplicates comm
  StepAgreement(const StepAgreement&) = delete;
  StepAgreement& operator=(const StepAgreement&) = delete;
  void start(bool loss_finite);  // this rank's stop signal (StopSignals) and loss
  // Waits for the agreement; returns what was not finite, "" if nothing: some rank's loss, else what
  // nonfinite_gradient() names ("gradient fc1.bias", or "" when the reduced gradients are finite).
  std::string finish(const std::function<std::string()>& nonfinite_gradient);
  int stop_signal() const { return result_[0]; }  // after finish(): the signal some rank received, or 0
  MPI_Comm comm() const { return comm_; }         // --check-sync's too

 private:
  OwnedComm comm_;
  int rank_ = 0;
  int mine_[2] = {0, 0}, result_[2] = {0, 0};
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// --fault hang|kill|throw, when this rank and step are the ones named (nan and diverge act inside the step).
void inject_fault_before(const TrainConfig& config, int rank, int step);
// A non-finite loss or gradient (`what`, "" if none), agreed by every rank: throws TrainingStopped (the update is
// not made, or with --optimizer-in-backward only where the gradients were not finite) unless --skip-nonfinite;
// returns whether the step skips its update.
bool skip_nonfinite_step(const TrainConfig& config, const std::string& what, int step);
// --check-sync: every replica must hold the same parameters, bit for bit. Collective over comm: compares one
// fingerprint per gradient piece's slice of `params` (host memory, the flat layout) and throws TrainingStopped on
// every rank naming the first parameter, in registration order, that differs. step < 0: before the first step, the
// message then ending with start_cause (where the replicas came from).
void check_replicas_agree(const float* params, const std::vector<GradPiece>& pieces,
                          const std::function<std::string(const GradPiece&)>& piece_name, MPI_Comm comm, int step,
                          const std::string& start_cause = "");
// The buckets' communication time (with --zero-stage 1 their all-gathers too) into r.comm_ms, and the part of it
// that overlapped backward [from, to] (ms on the buckets' time origin) into r.hidden_comm_ms.
void add_comm_times(StepRecord& r, const std::vector<BucketTimes>& buckets, double backward_from_ms,
                    double backward_to_ms);

}  // namespace ddplab
