// The step on the GPU (--device cuda): the model (the MLP or the transformer, behind train/cuda_workload.h) on a
// compute stream, its gradient buckets all-reduced on a comm stream while backward runs (ddp/reducer_cuda.h) by NCCL
// (one GPU per rank) or by our ring (--comm ring: NCCL p2p, CUDA IPC — ranks may share a GPU — or host-staged links,
// comm/ring_cuda.h), AdamW on the device over the fp32 master weights, each step's batches staged while the step
// before runs. Marks are events on the compute stream. Data, bucket layout, averaging and the step itself are the
// Trainer's (train/trainer.h), so N ranks train the model one rank trains with the global batch. Streams, events and
// where the host waits: docs/GPU.md, "The step on the GPU".
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/stream_allreduce.h"
#include "config/train_config.h"
#include "ddp/reducer_cuda.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/nvtx.h"
#include "kernels/cuda/owned.h"
#include "train/batch_prefetcher.h"
#include "train/cuda_workload.h"
#include "train/step_backend.h"

namespace ddplab {

class CudaBackend final : public StepBackend {
 public:
  // Collective over comm: NCCL's bootstrap picks this rank's GPU (throws on every rank if two ranks of a node would
  // share one), and the bucket layout is checked across ranks. The config must have passed validate().
  CudaBackend(const TrainConfig& config, MPI_Comm comm);
  ~CudaBackend() override;

  const std::vector<Parameter<float>>& parameters() const override { return workload_->parameters(); }
  const std::vector<GradPiece>& grad_pieces() const override { return workload_->grad_pieces(); }
  int64_t flat_size() const override { return workload_->flat_size(); }
  const std::vector<Bucket>& buckets() const override { return reducer_->buckets(); }
  const std::vector<BucketTimes>& bucket_times() const override { return reducer_->bucket_times(); }
  std::string describe() const override;
  std::string transport() const override { return engine_->name(); }
  std::string gemm_algorithms() const override { return workload_->gemm_algorithms(); }
  std::string attention_graphs() const override { return workload_->attention_graphs(); }

  double begin_step(int64_t step, double t0_ms) override;
  BatchStats load(int64_t step, int micro) override;
  void set_learning_rate(float lr) override { lr_ = lr; }
  void start_gradients(float grad_scale) override;
  void forward(int micro) override { workload_->forward(slot_, micro); }
  void backward(int micro, bool sync, const GradReadyHook& before_ready) override;
  double loss(int) override { return workload_->loss(); }
  double evaluate(const int32_t* tokens, int rows, int seq) override { return workload_->evaluate(tokens, rows, seq); }
  void finish_reduction() override;
  std::string first_nonfinite_gradient() override;
  void optimizer_step() override;
  double grad_norm() const override { return clipped_norm_host_ ? clipped_norm_host_->norm : 0.0; }
  void synchronize() override;
  void end_step(int64_t step) override;

  int mark() override;
  double mark_ms(int mark) const override;

  void set_gradient_nan(int piece) override;
  void add_to_first_parameter(float delta) override;
  const float* host_parameters() override;
  void extra_allreduce() override;
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) override;
  CheckpointInfo read_checkpoint(const std::string& path) override;

 private:
  BatchStats stage(int64_t step);
  // AdamW on bucket b's span of the flat buffers at the step's t, skipped on the device while skip_if_set is set.
  void update_bucket(int b, const int* skip_if_set);
  std::vector<float> download(const float* device, int64_t n) const;
  void upload(float* device, const std::vector<float>& host);

  TrainConfig config_;
  int world_ = 1;
  std::pair<int, int> profile_steps_;  // --profile-steps A:B, or {-1, -1}
  // The step in progress: its staging slot, its start on the run's clock, its timing events (pooled by the engine,
  // valid until the next step; the first is the origin), the host copy of the parameters (--check-sync).
  int slot_ = 0;
  double start_ms_ = 0;
  // The buckets' timings wait to be resolved (event queries): after the update is queued, while the GPU runs it.
  bool bucket_times_pending_ = false;
  void resolve_bucket_times();
  std::vector<cudaEvent_t> marks_;
  std::optional<cuda::NvtxRange> step_range_;
  std::vector<float> host_params_;
  cuda::Stream compute_, copy_;
  std::unique_ptr<CudaWorkload> workload_;
  std::unique_ptr<cuda::CudaReducer> reducer_;
  // AdamW's m and v, and with --grad-clip the norm's workspace and the norm with its clip factor, in one allocation;
  // the norm's pinned host copy is queued behind the update and read after synchronize().
  cuda::DeviceMemory update_memory_;
  float *m_ = nullptr, *v_ = nullptr;
  void* norm_workspace_ = nullptr;
  cuda::ClippedNorm* clipped_norm_ = nullptr;
  std::unique_ptr<cuda::ClippedNorm, cuda::CudaFreeHost> clipped_norm_host_;
  cuda::DeviceMemory extra_buffer_;  // --extra-allreduce-mb: all-reduced after every update
  size_t extra_count_ = 0;
  int adam_steps_ = 0;  // updates made (a skipped step makes none), AdamW's t
  float lr_ = 0;        // this step's (set_learning_rate)
  // --optimizer-in-backward on: the update bucket by bucket after backward, each behind its own all-reduce, so that
  // the closing bucket's all-reduce (the tied embedding's, final only after the embedding backward) runs beside the
  // update of all the others instead of before it.
  bool bucketed_update_ = false;
  // Per staging slot of the workload (step s uses slot s % 2): the end of its copy to the device, on the copy stream.
  cuda::Event copied_[CudaWorkload::kSlots];
  // NCCL's all-reduce or our ring (--comm), created first (its constructor selects this rank's device) and declared
  // late, so that it is destroyed early: its comm thread and stream stop before the gradients, the reducer's flags
  // and the events they write go.
  std::unique_ptr<cuda::StreamAllreduce> engine_;
  // Stages step s + 1 while step s runs; destroyed first: its worker uses the workload, the copy stream, the engine.
  std::unique_ptr<BatchPrefetcher> prefetcher_;
};

}  // namespace ddplab
