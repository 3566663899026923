// The step on the CPU: the model (a Workload) on the host, its gradient buckets all-reduced by the Reducer on a
// communication thread while backward runs (our ring over shared memory or MPI, or MPI_Allreduce), the optimizer
// over the flat buffers. Marks are host clock readings.
//
// --optimizer-in-backward on (PyTorch's "optimizer in backward"): each gradient piece's parameters are updated on an
// optimizer thread as soon as two things are true: its bucket is reduced (the Reducer's hook, on whichever thread
// finished it) and backward no longer reads them (GradReadyHook's promise, tracked on the main thread). Pieces, not
// buckets: at world size 1 a bucket is "reduced" when complete, and the default 25 MiB bucket completes only near
// backward's end. The updates run beside the rest of backward and the other buckets' all-reduces, on a core the
// BLAS threads leave idle; in optimizer_step() the main thread shares what is left. The parameters are bitwise those
// of the update after backward (the update is element-wise; the alignment gaps between pieces stay zero either way).
// Gradients that are not finite (a bucket's, or at world size 1 a piece's: each is checked on its own) are not
// applied, and the step stops (so --skip-nonfinite, which must be able to skip the whole update, is refused with it).
//
// --zero-stage 1 (the sharded update, as llm.c's ZeRO-1 and DeepSpeed's stage 1): the Reducer reduce-scatters each
// bucket instead of all-reducing it, each rank updates only the elements it owns, and the parameters are
// all-gathered bucket by bucket on the comm thread while the update of the next bucket runs. The same bytes travel
// as in the all-reduce, but each rank does 1/world of the update's work and memory traffic (AdamW reads and writes
// four buffers per element: the CPU step's largest pass after the GEMMs). The sums and the element-wise update are
// those of the all-reduce, so the parameters are bitwise the same.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "ddp/reducer.h"
#include "runtime/worker_thread.h"
#include "model/optimizer.h"
#include "train/step_backend.h"
#include "config/train_config.h"
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

  double begin_step(int64_t step, double t0_ms) override;
  BatchStats load(int64_t step, int micro) override { return workload_->load(step, micro); }
  void set_learning_rate(float lr) override { optimizer_.set_lr(lr); }
  void start_gradients(float grad_scale) override;
  void forward(int micro) override;
  void backward(int micro, bool sync, const GradReadyHook& before_ready) override;
  double loss(int micro) override { return losses_.at(micro); }
  double evaluate(const int32_t* tokens, int rows, int seq) override { return workload_->evaluate(tokens, rows, seq); }
  void finish_reduction() override { reducer_->wait_all(); }
  std::string first_nonfinite_gradient() override;
  void optimizer_step() override;
  double grad_norm() const override { return grad_norm_; }
  void synchronize() override {
    if (optimizer_thread_) optimizer_thread_->wait_all();
  }

  int mark() override;
  double mark_ms(int mark) const override { return marks_.at(mark) - origin_ms_; }

  void set_gradient_nan(int piece) override;
  void add_to_first_parameter(float delta) override;
  const float* host_parameters() override { return workload_->flat_params(); }
  void extra_allreduce() override;
  void gather_optimizer_state() override;
  void write_checkpoint(const std::string& path, bool force, const CheckpointInfo& info) override;
  CheckpointInfo read_checkpoint(const std::string& path) override;

  Workload& workload() { return *workload_; }

 private:
  // --optimizer-in-backward: backward has announced `piece`, so it is done with the parameters before that piece's
  // parameter (all of them when piece is the number of pieces), and with `piece` itself if its parameter is not
  // read after its gradient.
  void release_before(int piece);
  void open_update_gate(int piece);
  bool claim_update(int piece);
  void update_piece(int piece);
  void sharded_optimizer_step();
  float clip_scale_of_step();
  int last_piece() const { return static_cast<int>(workload_->grad_pieces().size()) - 1; }

  TrainConfig config_;
  std::unique_ptr<Communicator> comm_;  // the Reducer's
  RegisteredBuffer grads_memory_;        // the workload's flat gradients: host peers read them in place
  RegisteredBuffer params_memory_;       // --zero-stage 1: its flat parameters, all-gathered the same way
  std::unique_ptr<Workload> workload_;
  Optimizer<float> optimizer_;
  // --optimizer-in-backward: per gradient piece, the conditions still missing before its update (reduced,
  // released), counted down from both threads to 0, then -1 once a thread claims the update; the pieces backward has
  // released so far; the updates' thread.
  std::unique_ptr<std::atomic<int>[]> update_gates_;
  // The update leaves the gradients zero (Optimizer::update_and_zero_grads), so the next backward adds to them
  // instead of overwriting: a weight-gradient GEMM told to overwrite has OpenBLAS zero its output first, in a pass of
  // its own on backward's critical path (~0.4 ms per 4 MB weight in the step on this host, docs/BENCHMARKS.md); the
  // update writes those zeros where it has just read the gradients. A peer never reads them by then: an all-reduce
  // returns once its peers have acknowledged every send (comm/shm_transport.h). True at the start (zero-filled) and
  // after an update; false after a skipped step, whose gradients stay.
  bool grads_are_zero_ = true;
  int released_pieces_ = 0;
  double grad_norm_ = 0;                            // the last update's (--grad-clip)
  std::unique_ptr<WorkerThread> optimizer_thread_;  // before reducer_: its comm thread, which submits, stops first
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Communicator> extra_comm_;  // its own communicator: never interleaves with the Reducer's
  std::vector<float> extra_buffer_;
  double t0_ms_ = 0, origin_ms_ = 0;
  std::vector<double> marks_;   // this step's host clock readings
  std::vector<double> losses_;  // this step's, per micro-batch
};

}  // namespace ddplab
