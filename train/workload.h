// What the CPU backend trains: a model with its data. The Trainer (train/trainer.h) owns the step, the CpuBackend
// (train/cpu_backend.h) the Reducer and the optimizer; a Workload produces micro-batches and runs forward and
// backward on them.
//   mlp                 the MLP on synthetic classification data (fixed-size samples)
//   tiny|small|gpt2-small  the transformer on synthetic token sequences of variable length, batched by a BatchPlan
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "train/batch_stats.h"
#include "config/train_config.h"
#include "model/mlp.h"

namespace ddplab {

class Workload {
 public:
  virtual ~Workload() = default;
  virtual int64_t flat_size() const = 0;  // of flat_params() and flat_grads(): parameters and alignment gaps
  virtual float* flat_params() = 0;
  virtual float* flat_grads() = 0;
  // Keeps the gradients in `storage` (flat_size() floats, alive as long as the workload) from now on.
  virtual void place_grads(float* storage) = 0;
  virtual void place_params(float* storage) = 0;  // the same for the parameters (values kept)
  virtual const std::vector<GradPiece>& grad_pieces() const = 0;
  virtual const std::vector<Parameter<float>>& parameters() const = 0;  // names and shapes (checkpoints)
  virtual void set_grad_piece_elements(int64_t max_elements) = 0;
  virtual std::string describe() const = 0;  // one line for the run header
  // Before a step's first backward: that backward overwrites the gradients instead of adding to them (no pass
  // zeroes them first; micro-batches after it add).
  virtual void discard_grad() = 0;
  // The data phase of micro-batch `micro` of step `step`.
  virtual BatchStats load(int64_t step, int micro) = 0;
  // This rank's share of the step's global mean loss, relative to an equal share (1): the Reducer multiplies
  // the rank's gradients by it before summing. Ranks whose batches count different numbers of loss terms
  // (variable-length batching) are weighted by them, so the result is the gradient of the global mean. Valid
  // after load(step, 0), for all the micro-batches of the step.
  virtual double weight() const { return 1.0; }
  // Mean loss of the loaded micro-batch; a workload whose micro-batches count unequal numbers of loss terms scales
  // it (and its gradient in backward) by the micro-batch's share of the rank's terms, so that the mean over the
  // micro-batches is the rank's mean over its terms.
  virtual double forward() = 0;
  virtual void backward(const GradReadyHook& on_ready) = 0;
  // StepBackend::evaluate (--val-data: the transformer's LM head only).
  virtual double evaluate(const int32_t* tokens, int rows, int seq) = 0;
};

// "fc1.weight[0:256]": a piece's parameter name, with its rows when it is a block of them.
std::string grad_piece_name(const std::vector<Parameter<float>>& params, const GradPiece& piece);

std::unique_ptr<Workload> make_workload(const TrainConfig& config, int rank, int world_size);

}  // namespace ddplab
