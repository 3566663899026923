// The data-parallel step on the GPU (--device cuda): the MLP (model/mlp_cuda.h) on a compute stream, its gradient
// buckets all-reduced on a comm stream while backward runs (comm/reducer_cuda.h) by NCCL (one GPU per rank) or by
// our ring (--comm ring: NCCL p2p, CUDA IPC — ranks may share a GPU — or host-staged links, comm/ring_cuda.h),
// AdamW on the device over the fp32 master weights. Data, bucket layout, averaging and the stop rules are the CPU
// Trainer's, so N ranks train the model one rank trains with the global batch. Streams, events and where the host
// waits: docs/GPU.md, "The step on the GPU".
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm/stream_allreduce.h"
#include "comm/reducer_cuda.h"
#include "data/synthetic.h"
#include "launcher/step_runner.h"
#include "launcher/train_config.h"
#include "model/mlp_cuda.h"

namespace ddplab {

class CudaTrainer final : public StepRunner {
 public:
  // Collective over comm: NCCL's bootstrap picks this rank's GPU (throws on every rank if two ranks of a node would
  // share one), and the bucket layout is checked across ranks. The config must have passed validate().
  CudaTrainer(const TrainConfig& config, MPI_Comm comm);
  ~CudaTrainer() override;

  StepRecord step(int step, double t0_ms) override;
  int stop_signal() const override { return agreement_.stop_signal(); }
  const std::vector<Bucket>& buckets() const override { return reducer_->buckets(); }
  const std::vector<BucketTimes>& bucket_times() const override { return reducer_->bucket_times(); }
  const std::vector<GradPiece>& grad_pieces() const override { return model_->grad_pieces(); }
  std::string piece_name(const GradPiece& piece) const override;
  std::string describe() const override;
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) override;
  CheckpointInfo read_checkpoint(const std::string& path) override;

  // The flat fp32 parameters (the CPU model's layout), copied to the host; waits for the compute stream.
  std::vector<float> parameters() const;

 private:
  StepRecord run_step(int step, double t0_ms);
  struct StreamDestroy {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  struct EventDestroy {
    void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
  };
  struct CudaFree {
    void operator()(void* p) const { cudaFree(p); }
  };
  struct CudaFreeHost {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  // A step's inputs, in pinned host memory and on the device, and the copy between them.
  struct Batch {
    float *host_x = nullptr, *x = nullptr;
    int32_t *host_y = nullptr, *y = nullptr;
    std::unique_ptr<CUevent_st, EventDestroy> copied;  // on the copy stream
    int64_t step = -1;                                 // the step whose samples it holds
    std::future<void> staged;                          // the helper thread that fills it and queues the copy
  };

  void stage(int64_t step);
  std::string first_nonfinite_gradient(int bucket) const;
  std::vector<float> download(const float* device, int64_t n) const;

  TrainConfig config_;
  int rank_ = 0, world_ = 1;
  StepAgreement agreement_;  // the per-step stop/finite agreement, and --check-sync's communicator
  std::pair<int, int> profile_steps_;  // --profile-steps A:B, or {-1, -1}
  // NCCL's all-reduce or our ring (--comm), created before the streams: its constructor selects this rank's device.
  std::unique_ptr<cuda::StreamAllreduce> engine_;
  std::unique_ptr<CUstream_st, StreamDestroy> compute_, copy_;
  std::unique_ptr<MlpCuda> model_;
  std::unique_ptr<cuda::CudaReducer> reducer_;
  std::unique_ptr<void, CudaFree> device_memory_;     // AdamW's moments, the two batches
  std::unique_ptr<void, CudaFreeHost> host_memory_;  // the two batches, pinned
  float *m_ = nullptr, *v_ = nullptr;
  int adam_steps_ = 0;  // updates made (a skipped step makes none), AdamW's t
  Batch batches_[2];    // step s uses batches_[s % 2] while step s + 1's is filled and copied (after the memory)
  SyntheticClassification data_;
  ShardedBatches shard_;
};

}  // namespace ddplab
