#include "train/trainer.h"

#include <algorithm>
#include <cmath>

#include "comm/watchdog.h"
#include "kernels/cpu/ops.h"

namespace ddplab {
namespace {

std::unique_ptr<Reducer> make_reducer(const TrainConfig& config, Communicator& comm, Workload& model) {
  model.set_grad_piece_elements(static_cast<int64_t>(config.grad_slice_mb * 1048576.0 / sizeof(float)));
  std::vector<int64_t> numel, offset;
  for (const GradPiece& g : model.grad_pieces()) {
    numel.push_back(g.numel);
    offset.push_back(g.offset);
  }
  const ReducerConfig rc{config.bucket_mb, config.first_bucket_mb, config.overlap};
  return std::make_unique<Reducer>(comm, rc, numel, offset, model.flat_grads());
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, Communicator& comm)
    : config_(config),
      comm_(comm),
      workload_(make_workload(config, comm.rank(), comm.size())),
      optimizer_(config.optimizer, workload_->flat_size()),
      reducer_(make_reducer(config, comm, *workload_)),
      agreement_(comm.mpi_comm()) {
  if (config.extra_allreduce_mb > 0) {
    extra_comm_ = std::make_unique<Communicator>(comm.mpi_comm(), comm.options());
    extra_buffer_.assign(static_cast<size_t>(config.extra_allreduce_mb * 1048576.0 / sizeof(float)), 0.0f);
  }
}

Trainer::~Trainer() = default;

// The name of the first gradient piece of `bucket` holding a NaN or Inf.
std::string Trainer::first_nonfinite_gradient(int bucket) const {
  const Bucket& b = reducer_->buckets()[bucket];
  for (int k = b.first_piece; k <= b.last_piece; ++k) {
    const GradPiece& piece = workload_->grad_pieces()[k];
    if (!cpu::all_finite(workload_->flat_grads() + piece.offset, piece.numel)) return workload_->piece_name(piece);
  }
  return "bucket " + std::to_string(bucket);
}

StepRecord Trainer::step(int step, double t0_ms) {
  StepRecord r;
  watchdog::set_step(step);
  inject_fault_before(config_, comm_.rank(), step);
  const int micro_batches = config_.grad_accum;
  const bool poison_gradient = config_.fault == "nan" && step == config_.fault_step && comm_.rank() == config_.fault_rank;
  const GradReadyHook on_ready = [this, poison_gradient](int piece) {
    // --fault nan: the first gradient to become final gets a NaN before its bucket is reduced.
    if (poison_gradient && piece == 0) workload_->flat_grads()[workload_->grad_pieces()[0].offset] = NAN;
    reducer_->mark_ready(piece);
  };
  bool loss_finite = true;
  const double t_start = now_ms();
  double backward_start = t_start, backward_end = t_start;
  for (int m = 0; m < micro_batches; ++m) {
    const double t0 = m == 0 ? t_start : backward_end;  // phases tile the step: no time falls between them
    if (comm_.rank() == config_.slow_rank) sleep_ms(config_.straggler_ms);
    const BatchStats batch = workload_->load(step, m);
    r.samples += batch.samples;
    r.useful_tokens += batch.useful_tokens;
    r.padded_tokens += batch.padded_tokens;
    r.max_len = std::max(r.max_len, batch.max_len);
    const double t1 = now_ms();
    if (m == 0) {
      // Each micro-batch's loss is a mean over its rows, and the micro-batches' gradients add up: the global mean
      // needs 1/(world * micro-batches), and this rank's share of the loss terms (workload.h).
      reducer_->begin_step(t0_ms, 1.0f / static_cast<float>(comm_.size() * micro_batches),
                           static_cast<float>(workload_->weight()));
      workload_->zero_grad();  // counted in forward
    }
    const double loss = workload_->forward();
    loss_finite = loss_finite && std::isfinite(loss);
    r.loss += loss / micro_batches;
    if (m == micro_batches - 1) agreement_.start(loss_finite);
    const double t2 = now_ms();
    reducer_->set_sync(m == micro_batches - 1);  // no_sync for all but the last micro-batch
    workload_->backward(on_ready);
    const double t3 = now_ms();
    r.data_ms += t1 - t0;
    r.forward_ms += t2 - t1;
    r.backward_ms += t3 - t2;
    backward_start = t2;
    backward_end = t3;
  }
  reducer_->wait_all();
  const std::string nonfinite = agreement_.finish([this] {
    const int bucket = reducer_->first_nonfinite_bucket();
    return bucket < 0 ? std::string() : "gradient " + first_nonfinite_gradient(bucket);
  });
  const double t_reduced = now_ms();
  const bool skip = skip_nonfinite_step(config_, nonfinite, step);
  r.skipped = skip ? 1 : 0;
  if (!skip) optimizer_.step(workload_->flat_params(), workload_->flat_grads());
  if (config_.fault == "diverge" && step == config_.fault_step && comm_.rank() == config_.fault_rank)
    workload_->flat_params()[workload_->grad_pieces().back().offset] += 1e-3f;  // the first registered parameter
  if (config_.check_sync > 0 && (step + 1) % config_.check_sync == 0)
    check_replicas_agree(workload_->flat_params(), workload_->grad_pieces(),
                         [this](const GradPiece& g) { return workload_->piece_name(g); }, agreement_.comm(), step);
  const double t_optimized = now_ms();
  if (extra_comm_) extra_comm_->allreduce_sum(extra_buffer_.data(), extra_buffer_.size());
  const double t_extra = now_ms();
  const bool barrier_step = config_.rank0_work_ms > 0 && (step + 1) % config_.barrier_every == 0;
  if (barrier_step && comm_.rank() == 0) sleep_ms(config_.rank0_work_ms);
  const double t_work = now_ms();
  if (barrier_step) {
    const watchdog::Wait wait("MPI_Barrier after rank 0's work (--rank0-work-ms)");
    MPI_Barrier(comm_.mpi_comm());
  }
  const double t_end = now_ms();

  r.start_ms = t_start - t0_ms;
  r.exposed_comm_ms = t_reduced - backward_end;
  r.optimizer_ms = t_optimized - t_reduced;
  r.extra_comm_ms = t_extra - t_optimized;
  r.host_work_ms = t_work - t_extra;
  r.barrier_ms = t_end - t_work;
  r.step_ms = t_end - t_start;
  add_comm_times(r, reducer_->bucket_times(), backward_start - t0_ms, backward_end - t0_ms);
  return r;
}

}  // namespace ddplab
