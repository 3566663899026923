// What the CudaBackend (train/cuda_backend.h) trains: a model on the device and its data, the GPU twin of
// train/workload.h. The trainer owns the streams, the step, the reducer and AdamW; a CudaWorkload owns the model
// and two staging slots (pinned host memory and its device copy) for the steps' batches, and fills them.
//   mlp                    MlpCuda on synthetic classification data, sharded as the CPU MLP's
//   tiny|small|gpt2-small  TransformerCuda on the CPU transformer's token batches and loss weighting
//                          (train/token_batches.h)
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda_common.h"  // DeviceParameters::UpdateTarget
#include "model/parameters.h"   // Parameter, GradPiece, GradReadyHook
#include "config/train_config.h"
#include "train/batch_stats.h"

namespace ddplab {

class CudaWorkload {
 public:
  static constexpr int kSlots = 2;  // step s uses slot s % 2 while step s + 1's is filled and copied

  virtual ~CudaWorkload() = default;
  // The model, as MlpCuda and TransformerCuda have it: the CPU model's names, shapes and flat layout, device memory.
  virtual const std::vector<Parameter<float>>& parameters() const = 0;
  virtual int64_t flat_size() const = 0;  // of flat_params() and flat_grads(): parameters and alignment gaps
  virtual float* flat_params() = 0;  // write access: a bf16 model remakes its bf16 weights before the next forward
  virtual const float* flat_params() const = 0;
  // For an optimizer that also rewrites a bf16 model's copy of the weights (model/cuda_common.h, params_for_update).
  virtual cuda_model::DeviceParameters::UpdateTarget params_for_update() = 0;
  virtual float* flat_grads() = 0;
  virtual void set_grad_piece_elements(int64_t max_elements) = 0;
  virtual const std::vector<GradPiece>& grad_pieces() const = 0;
  virtual cudaEvent_t piece_ready_event(int piece) const = 0;
  virtual void discard_grad() = 0;           // the next backward writes the gradients over (model/cuda_common.h)
  virtual std::string describe() const = 0;  // the model and its data, one line
  virtual std::string gemm_algorithms() const = 0;  // StepBackend::gemm_algorithms
  virtual std::string attention_graphs() const { return ""; }  // StepBackend::attention_graphs

  // Fills `slot` with step `step`'s micro-batches in pinned host memory and queues their copy to the device on
  // `copy`; returns what they hold. Meant for a helper thread: it touches that slot and the data source only, and
  // is called for the steps in ascending order, one call at a time.
  virtual BatchStats stage(int slot, int64_t step, cudaStream_t copy) = 0;
  // Enqueue micro-batch `micro` of the step staged in `slot` on the model's stream, which the caller has ordered
  // after the slot's copy. backward weighs the micro-batch's gradient as the CPU workload does (its share of this
  // rank's loss terms, and this rank's share of the step's), so the reducer's 1 / (world x micro-batches) gives the
  // gradient of the global mean loss.
  virtual void forward(int slot, int micro) = 0;
  virtual void backward(int slot, int micro, const GradReadyHook& on_ready) = 0;
  // StepBackend::evaluate: the tokens copied to the device on the compute stream, the forward, its loss (waits).
  virtual double evaluate(const int32_t* tokens, int rows, int seq) = 0;
  // The last forward's loss as the CPU workload's forward() returns it; waits for that loss only.
  virtual double loss() const = 0;
};

// The model on the device of the current thread, enqueuing on `compute`. The config must have passed validate().
std::unique_ptr<CudaWorkload> make_cuda_workload(const TrainConfig& config, int rank, int world_size,
                                                 cudaStream_t compute);

}  // namespace ddplab
