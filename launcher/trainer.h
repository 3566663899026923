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
#include "launcher/step_runner.h"
#include "launcher/train_config.h"
#include "launcher/workload.h"
#include "model/optimizer.h"

namespace ddplab {

class Trainer final : public StepRunner {
 public:
  // Collective over comm (the Reducer checks the bucket layout). `comm` must outlive the trainer.
  Trainer(const TrainConfig& config, Communicator& comm);
  ~Trainer() override;
  StepRecord step(int step, double t0_ms) override;
  int stop_signal() const override { return stop_signal_; }
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
  MPI_Comm control_comm_ = MPI_COMM_NULL;  // the per-step agreement on stopping; its own, never mixed with others
  int stop_signal_ = 0;

  std::string first_nonfinite_gradient(int bucket) const;
};

// Milliseconds on the monotonic clock.
double now_ms();

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

}  // namespace ddplab
