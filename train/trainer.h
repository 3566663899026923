// The data-parallel step, written once for every device: each rank trains its own replica on its shard of every
// global batch; the gradients are averaged in buckets while backward runs; every rank takes the same optimizer step,
// so the replicas stay bitwise identical. The device's part (model, data, reducer, optimizer, clock) is a
// StepBackend (train/step_backend.h); here live the step's order, the lab's pathologies, fault injection, the
// finite/stop agreement, the replica check and the phase timing.
#pragma once
#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/train_config.h"
#include "record/checkpoint.h"
#include "runtime/cpu_taken.h"
#include "train/step_backend.h"
#include "train/step_rules.h"
#include "train/validation.h"

namespace ddplab {

class Trainer {
 public:
  // Collective over comm, on the backend --device asks for (CpuBackend, or CudaBackend in a CUDA build). The config
  // must have passed validate().
  Trainer(const TrainConfig& config, MPI_Comm comm);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Collective: throws TrainingStopped on every rank unless the replicas start from the same parameters, bit for
  // bit. Each rank initialises its own replica from the seed, or reads the checkpoint (PyTorch DDP broadcasts rank
  // 0's instead); a host whose math library rounds otherwise would train a different model from the first step.
  void check_replicas_start_alike();
  // Runs step `step` (0-based) and returns its timings; times are measured from `t0_ms` (the run's time zero on
  // this rank's clock: common_clock_origin, train/clock.h). Throws TrainingStopped on every rank when the step's loss or gradients
  // are not finite (unless --skip-nonfinite: the step then skips its update and says so in StepRecord::skipped)
  // and when --check-sync finds the replicas diverged.
  StepRecord step(int step, double t0_ms);
  // The signal (SIGINT, SIGTERM) some rank received by the last step, agreed by all ranks at that step; 0: none.
  int stop_signal() const { return agreement_.stop_signal(); }
  // What made the latest skipped step skip its update under --skip-nonfinite ("non-finite gradient fc2.bias"),
  // for the caller to say after a step whose StepRecord::skipped is set. The same on every rank.
  const std::string& skipped_because() const { return skipped_because_; }
  const std::vector<Bucket>& buckets() const { return backend_->buckets(); }
  // The last step's timings, one entry per bucket, on step()'s time origin.
  const std::vector<BucketTimes>& bucket_times() const { return backend_->bucket_times(); }
  const std::vector<GradPiece>& grad_pieces() const { return backend_->grad_pieces(); }
  // "fc1.weight[0:256]": a piece's parameter name, with its rows when it is a block of them.
  std::string piece_name(const GradPiece& piece) const;
  std::string describe() const { return backend_->describe(); }  // one line for the run header
  std::string transport() const { return backend_->transport(); }  // StepBackend::transport
  std::string gemm_algorithms() const { return backend_->gemm_algorithms(); }  // StepBackend::gemm_algorithms
  std::string attention_graphs() const { return backend_->attention_graphs(); }  // StepBackend::attention_graphs
  // Checkpoints (record/checkpoint.h): this rank's parameters and optimizer state, in the CPU model's names, shapes
  // and layout whatever the device. Reading validates everything first and leaves the state untouched on refusal
  // (UsageError).
  void gather_optimizer_state() { backend_->gather_optimizer_state(); }  // collective: see StepBackend
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) {
    backend_->write_checkpoint(path, force, info);
  }
  CheckpointInfo read_checkpoint(const std::string& path) { return backend_->read_checkpoint(path); }

  // Collective (--val-data): the mean loss of the model as it stands over every validation window's terms, each rank
  // evaluating its share; the same on every rank; +inf where it is not finite.
  double validation_loss();
  const ValidationSet* validation() const { return validation_.get(); }  // null without --val-data
  // --val-data: whether the run validates after step `step` (every --val-every steps, and after the last).
  bool validates_after(int step) const {
    return validation_ && ((config_.val_every > 0 && (step + 1) % config_.val_every == 0) || step + 1 == config_.steps);
  }

  // The flat parameters (the CPU model's layout), copied to the host.
  std::vector<float> parameters();
  StepBackend& backend() { return *backend_; }
  const StepBackend& backend() const { return *backend_; }

 private:
  TrainConfig config_;
  std::string skipped_because_;
  int rank_ = 0, world_ = 1;
  StepAgreement agreement_;  // the per-step stop/finite agreement, and --check-sync's communicator
  std::unique_ptr<StepBackend> backend_;
  MPI_Comm comm_;
  std::unique_ptr<ValidationSet> validation_;  // --val-data
  CpuTakenMeter cpu_meter_;  // made on the thread that runs the steps: what the host takes from it, per step
  // --busy-threads on the slow rank: threads that spin on its compute thread's core until the trainer ends.
  void start_busy_threads();
  std::atomic<bool> stop_busy_{false};
  std::vector<std::thread> busy_;
};

}  // namespace ddplab
