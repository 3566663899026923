// The data-parallel step, written once for every device: each rank trains its own replica on its shard of every
// global batch; the gradients are averaged in buckets while backward runs; every rank takes the same optimizer step,
// so the replicas stay bitwise identical. The device's part (model, data, reducer, optimizer, clock) is a
// StepBackend (train/step_backend.h); here live the step's order, the lab's pathologies, fault injection, the
// finite/stop agreement, the replica check and the phase timing.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "train/step_backend.h"
#include "train/step_runner.h"
#include "train/train_config.h"

namespace ddplab {

class Trainer final : public StepRunner {
 public:
  // Collective over comm. The backend --device asks for (the CPU's; --device cuda needs a GPU build).
  Trainer(const TrainConfig& config, MPI_Comm comm);
  Trainer(const TrainConfig& config, MPI_Comm comm, std::unique_ptr<StepBackend> backend);
  ~Trainer() override;

  StepRecord step(int step, double t0_ms) override;
  int stop_signal() const override { return agreement_.stop_signal(); }
  const std::vector<Bucket>& buckets() const override { return backend_->buckets(); }
  const std::vector<BucketTimes>& bucket_times() const override { return backend_->bucket_times(); }
  const std::vector<GradPiece>& grad_pieces() const override { return backend_->grad_pieces(); }
  std::string piece_name(const GradPiece& piece) const override;
  std::string describe() const override { return backend_->describe(); }
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) override {
    backend_->write_checkpoint(path, force, info);
  }
  CheckpointInfo read_checkpoint(const std::string& path) override { return backend_->read_checkpoint(path); }

  // The flat parameters (the CPU model's layout), copied to the host.
  std::vector<float> parameters();
  StepBackend& backend() { return *backend_; }

 private:
  TrainConfig config_;
  int rank_ = 0, world_ = 1;
  StepAgreement agreement_;  // the per-step stop/finite agreement, and --check-sync's communicator
  std::unique_ptr<StepBackend> backend_;
};

}  // namespace ddplab
