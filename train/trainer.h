// The data-parallel training loop: each rank trains its own replica on its shard of every global batch; the
// Reducer averages the gradients in buckets while backward runs; every rank takes the same optimizer step, so
// the replicas stay bitwise identical.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/reducer.h"
#include "train/step_runner.h"
#include "train/train_config.h"
#include "train/workload.h"
#include "model/optimizer.h"

namespace ddplab {

class Trainer final : public StepRunner {
 public:
  // Collective over comm (the Reducer checks the bucket layout). `comm` must outlive the trainer.
  Trainer(const TrainConfig& config, Communicator& comm);
  ~Trainer() override;
  StepRecord step(int step, double t0_ms) override;
  int stop_signal() const override { return agreement_.stop_signal(); }
  const std::vector<Bucket>& buckets() const override { return reducer_->buckets(); }
  const std::vector<BucketTimes>& bucket_times() const override { return reducer_->bucket_times(); }
  const std::vector<GradPiece>& grad_pieces() const override { return workload_->grad_pieces(); }
  std::string piece_name(const GradPiece& piece) const override { return workload_->piece_name(piece); }
  std::string describe() const override { return workload_->describe(); }
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) override {
    save_checkpoint(path, force, workload_->parameters(), workload_->flat_params(), optimizer_, info);
  }
  CheckpointInfo read_checkpoint(const std::string& path) override {
    return load_checkpoint(path, workload_->parameters(), workload_->flat_params(), optimizer_);
  }

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
  StepAgreement agreement_;

  std::string first_nonfinite_gradient(int bucket) const;
};

}  // namespace ddplab
