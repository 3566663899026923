// The step on the CPU: the model (a Workload) on the host, its gradient buckets all-reduced by the Reducer on a
// communication thread while backward runs (our ring over shared memory or MPI, or MPI_Allreduce), the optimizer
// over the flat buffers. Marks are host clock readings.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/reducer.h"
#include "model/optimizer.h"
#include "train/step_backend.h"
#include "train/train_config.h"
#include "train/workload.h"

namespace ddplab {

class CpuBackend final : public StepBackend {
 public:
  // Collective over comm (the Reducer checks the bucket layout across ranks).
  CpuBackend(const TrainConfig& config, MPI_Comm comm);
  ~CpuBackend() override;

  const std::vector<Parameter<float>>& parameters() const override { return workload_->parameters(); }
  const std::vector<GradPiece>& grad_pieces() const override { return workload_->grad_pieces(); }
  int64_t flat_size() const override { return workload_->flat_size(); }
  const std::vector<Bucket>& buckets() const override { return reducer_->buckets(); }
  const std::vector<BucketTimes>& bucket_times() const override { return reducer_->bucket_times(); }
  std::string describe() const override { return workload_->describe(); }
  std::string transport() const override { return comm_->transport_name(); }

  void begin_step(int64_t step, double t0_ms) override;
  BatchStats load(int64_t step, int micro) override { return workload_->load(step, micro); }
  void start_gradients(int micro_batches) override;
  void forward(int micro) override;
  void backward(int micro, bool sync, const GradReadyHook& before_ready) override;
  double loss(int micro) override { return losses_.at(micro); }
  void finish_reduction() override { reducer_->wait_all(); }
  std::string first_nonfinite_gradient() override;
  void optimizer_step() override { optimizer_.step(workload_->flat_params(), workload_->flat_grads()); }
  void synchronize() override {}

  int mark() override;
  double mark_ms(int mark) const override { return marks_.at(mark) - origin_ms_; }

  void set_gradient_nan(int piece) override;
  void add_to_first_parameter(float delta) override;
  const float* host_parameters() override { return workload_->flat_params(); }
  void extra_allreduce() override;
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) override;
  CheckpointInfo read_checkpoint(const std::string& path) override;

  Workload& workload() { return *workload_; }

 private:
  TrainConfig config_;
  int world_ = 1;
  std::unique_ptr<Communicator> comm_;  // the Reducer's
  RegisteredBuffer grads_memory_;        // the workload's flat gradients: host peers read them in place
  std::unique_ptr<Workload> workload_;
  Optimizer<float> optimizer_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Communicator> extra_comm_;  // its own communicator: never interleaves with the Reducer's
  std::vector<float> extra_buffer_;
  double t0_ms_ = 0, origin_ms_ = 0;
  std::vector<double> marks_;   // this step's host clock readings
  std::vector<double> losses_;  // this step's, per micro-batch
};

}  // namespace ddplab
