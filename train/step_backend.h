// What a device contributes to the data-parallel step. The step itself — its order, the lab's pathologies, fault
// injection, the finite/stop agreement, the replica check and the phase timing — is written once, in the Trainer
// (train/trainer.h); a backend supplies the model, its data, the gradients' reducer and the optimizer on one device:
//   CpuBackend  (train/cpu_backend.h)   the model on the host, the Reducer on its comm thread, OpenBLAS
//   CudaBackend (train/cuda_backend.h)  the model on a compute stream, the CudaReducer on a comm stream, AdamW on the
//                                       device, batches staged one step ahead
// The Trainer calls, per step: set_learning_rate, begin_step, then per micro-batch load, [start_gradients], forward,
// backward, loss; then finish_reduction, first_nonfinite_gradient, optimizer_step, synchronize. Marks between the calls
// time the phases: on the CPU a host clock reading, on the GPU an event on the compute stream, resolved after
// synchronize().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/reducer.h"
#include "model/optimizer.h"
#include "model/parameters.h"
#include "record/checkpoint.h"
#include "train/workload.h"

namespace ddplab {

class StepBackend {
 public:
  virtual ~StepBackend() = default;

  // ---- the model's layout: the same on every device (the CPU model's) -------------------------------------------
  virtual const std::vector<Parameter<float>>& parameters() const = 0;  // names, shapes, offsets
  virtual const std::vector<GradPiece>& grad_pieces() const = 0;
  virtual int64_t flat_size() const = 0;  // of the flat buffers: the parameters and their alignment gaps
  virtual const std::vector<Bucket>& buckets() const = 0;
  // The last step's timings, one entry per bucket, ms on the run's clock (the trainer's t0_ms).
  virtual const std::vector<BucketTimes>& bucket_times() const = 0;
  virtual std::string describe() const = 0;  // one line for the run header
  // What the gradients' all-reduces travel over on this rank ("shm", "mpi", "NCCL", "ring over CUDA IPC", ...).
  virtual std::string transport() const = 0;
  // How the GEMMs picked their cuBLASLt algorithms (GemmContext::describe_algos); "" on the CPU.
  virtual std::string gemm_algorithms() const { return ""; }
  // What building cuDNN's attention graphs cost (CudnnBuildStats::describe); "" where no step ran cuDNN's attention.
  virtual std::string attention_graphs() const { return ""; }

  // ---- one step ---------------------------------------------------------------------------------------------------
  // The step's timing origin; t0_ms is the run's clock zero (bucket times are reported on it). Returns the host
  // clock reading the marks count from: the step's start, so that host readings and marks share one origin.
  virtual double begin_step(int64_t step, double t0_ms) = 0;
  // The data phase of micro-batch `micro`: what the rank's batch holds (a backend that stages a step's batches at
  // once reports them with micro 0).
  virtual BatchStats load(int64_t step, int micro) = 0;
  // The learning rate of this step's update, before it starts (learning_rate, model/optimizer.h).
  virtual void set_learning_rate(float lr) = 0;
  // Before the first forward of a step: reset the gradients (on the CPU the last update left them zero, and a
  // skipped step's are discarded; on the GPU they are discarded every step) and arm the reducer, which multiplies the
  // summed gradients by grad_scale and weighs this rank by its share of the loss terms (workload.h).
  virtual void start_gradients(float grad_scale) = 0;
  virtual void forward(int micro) = 0;
  // sync: the last micro-batch (the reducer all-reduces its buckets; before it, PyTorch's no_sync). before_ready(k)
  // runs just before piece k is handed to the reducer (the --fault nan hook); device work it has the backend enqueue
  // must be ordered before that piece's all-reduce (CudaBackend::set_gradient_nan records the piece's event again).
  virtual void backward(int micro, bool sync, const GradReadyHook& before_ready) = 0;
  virtual double loss(int micro) = 0;  // the micro-batch's mean loss (on the GPU: waits for its forward)
  // The validation pass, between steps: the mean loss of the model as it stands over `rows` full rows of `seq`
  // tokens (host memory; rows x seq within what a training micro-batch may hold), with no gradient and no update.
  virtual double evaluate(const int32_t* tokens, int rows, int seq) = 0;
  // Waits for the gradients' all-reduces (on the GPU: for the buckets' finite flags; the stream goes on).
  virtual void finish_reduction() = 0;
  // The first gradient piece of the reduced gradients holding a NaN or Inf, as "gradient fc1.bias"; "" if none.
  virtual std::string first_nonfinite_gradient() = 0;
  // The update; with --grad-clip it first takes the reduced gradients' global L2 norm (collective with ZeRO-1) and
  // clips them by it (kernels/grad_clip.h).
  virtual void optimizer_step() = 0;
  // That norm, after synchronize() (0 without --grad-clip).
  virtual double grad_norm() const = 0;
  virtual void synchronize() = 0;  // the device's work of the step is complete: marks can be resolved
  virtual void end_step(int64_t /*step*/) {}  // the step's host work is done too (profiling ranges close)

  // ---- timing: a point on the device's timeline, resolved to ms after begin_step's origin after synchronize() ---
  virtual int mark() = 0;
  virtual double mark_ms(int mark) const = 0;

  // ---- the lab and the checks -------------------------------------------------------------------------------------
  virtual void set_gradient_nan(int piece) = 0;                  // --fault nan: piece's first element
  virtual void add_to_first_parameter(float delta) = 0;          // --fault diverge
  virtual const float* host_parameters() = 0;                    // the flat parameters on the host (--check-sync)
  virtual void extra_allreduce() = 0;                            // --extra-allreduce-mb, on the step's engine
  // Collective, before rank 0 writes a checkpoint: with a sharded update (--zero-stage 1) each rank's optimizer
  // state is current only where it owns the elements; this gives every rank all of it.
  virtual void gather_optimizer_state() {}
  virtual void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) = 0;
  virtual CheckpointInfo read_checkpoint(const std::string& path) = 0;
};

}  // namespace ddplab
