#include "train/trainer.h"

#include <sched.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"
#include "train/cpu_backend.h"
#include "train/step_phases.h"
#include "train/token_batches.h"
#ifdef DDPLAB_HAVE_CUDA
#include "train/cuda_backend.h"
#endif

namespace ddplab {
namespace {

std::unique_ptr<StepBackend> make_step_backend(const TrainConfig& config, MPI_Comm comm) {
  // The CLI refuses these (launcher/cli.cpp); a Trainer built from such a config directly would train unclipped,
  // apply parts of a skipped step, or count AdamW's steps twice with the sharded update.
  if (const std::string conflict = update_in_backward_conflict(config); !conflict.empty())
    throw std::invalid_argument(conflict);
#ifdef DDPLAB_HAVE_CUDA
  if (config.device == Device::kCuda) return std::make_unique<CudaBackend>(config, comm);
#endif
  if (config.device != Device::kCpu)
    throw std::invalid_argument(std::string("--device ") + to_string(config.device) +
                                ": this ddplab was built without CUDA");
  return std::make_unique<CpuBackend>(config, comm);
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, MPI_Comm comm)
    : config_(config), agreement_(comm), backend_(make_step_backend(config, comm)), comm_(comm) {
  mpiCheck(MPI_Comm_rank(comm, &rank_));
  mpiCheck(MPI_Comm_size(comm, &world_));
  if (!config.val_data.empty()) validation_ = std::make_unique<ValidationSet>(config, rank_, world_);
}

double Trainer::validation_loss() {
  if (!validation_) throw std::logic_error("Trainer::validation_loss: the run has no --val-data");
  const int64_t terms_per_row = TokenBatches::model_config(config_).loss_terms(validation_->seq());
  double sums[2] = {0, 0};  // this rank's loss summed over its terms, and their count
  for (int k = 0; k < validation_->batches(); ++k) {
    validation_->load(k);
    const double terms = static_cast<double>(validation_->rows()) * terms_per_row;
    sums[0] += backend_->evaluate(validation_->tokens().data(), validation_->rows(), validation_->seq()) * terms;
    sums[1] += terms;
  }
  {
    const watchdog::Wait wait("MPI_Allreduce of the validation loss");
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, comm_));
  }
  // NaN marks the steps that took no validation (StepRecord::val_loss), so a loss that is not finite reads as +inf.
  const double loss = sums[0] / sums[1];
  return std::isfinite(loss) ? loss : std::numeric_limits<double>::infinity();
}

// The lab's noisy neighbour (--busy-threads): work that is not the job's on the slow rank's core. Pinned, the compute
// thread and the busy threads (which inherit its affinity) share one core whatever binding the rank had; started at
// the first step, so that the run's setup (the lost-yield measurement among it) runs without them.
void Trainer::start_busy_threads() {
  cpu_set_t here;
  CPU_ZERO(&here);
  CPU_SET(sched_getcpu(), &here);
  if (sched_setaffinity(0, sizeof here, &here) != 0)
    throw std::runtime_error("--busy-threads: cannot pin the compute thread to its core");
  for (int i = 0; i < config_.busy_threads; ++i)
    busy_.emplace_back([this] {
      while (!stop_busy_.load(std::memory_order_relaxed)) {
      }
    });
}

Trainer::~Trainer() {
  stop_busy_ = true;
  for (std::thread& t : busy_) t.join();
}

std::string Trainer::piece_name(const GradPiece& piece) const {
  return grad_piece_name(backend_->parameters(), piece);
}

std::vector<float> Trainer::parameters() {
  const float* p = backend_->host_parameters();
  return std::vector<float>(p, p + backend_->flat_size());
}

void Trainer::check_replicas_start_alike() {
  if (world_ == 1) return;
  const std::string cause = config_.resume.empty()
                                ? "each rank builds its replica from --seed, so the ranks' math libraries must give "
                                  "the same bits"
                                : "the ranks read different checkpoints (--resume " + config_.resume +
                                      ": a node-local path holding another run's file on some node?)";
  check_replicas_agree(backend_->host_parameters(), backend_->grad_pieces(),
                       [this](const GradPiece& g) { return piece_name(g); }, agreement_.comm(), -1, cause);
}

StepRecord Trainer::step(int step, double t0_ms) {
  StepRecord r;
  watchdog::set_step(step);
  inject_fault_before(config_, rank_, step);
  const bool on_fault_rank = step == config_.fault_step && rank_ == config_.fault_rank;
  const int micro_batches = config_.grad_accum;
  StepClock clock;
  if (rank_ == config_.slow_rank && config_.busy_threads > 0 && busy_.empty()) start_busy_threads();
  const CpuTaken taken_at_start = cpu_meter_.read();  // outside the step's time, as the one at its end
  r.lr = learning_rate(config_.optimizer, step, config_.steps);
  backend_->set_learning_rate(static_cast<float>(r.lr));
  // One reading for the step's start and its marks' origin: two (a start, then the origin a moment later) put the
  // phases' sums a moment before the bucket times, and a preemption between them made that milliseconds.
  clock.start = backend_->begin_step(step, t0_ms);
  std::vector<int> data_end, forward_end, backward_end;
  bool loss_finite = true;
  for (int m = 0; m < micro_batches; ++m) {
    const bool last = m == micro_batches - 1;
    // --straggler-ms: this rank is late with each of its batches; the others wait for it in the all-reduces.
    if (rank_ == config_.slow_rank) sleep_ms(config_.straggler_ms);
    const BatchStats batch = backend_->load(step, m);
    r.samples += batch.samples;
    r.useful_tokens += batch.useful_tokens;
    r.padded_tokens += batch.padded_tokens;
    r.max_len = std::max(r.max_len, batch.max_len);
    r.loss_terms += batch.loss_terms;
    data_end.push_back(backend_->mark());
    // Each micro-batch's loss is a mean over its rows, and the micro-batches' gradients add up: the global mean needs
    // 1/(world x micro-batches). Counted in forward.
    if (m == 0) backend_->start_gradients(1.0f / static_cast<float>(world_ * micro_batches));
    backend_->forward(m);
    forward_end.push_back(backend_->mark());
    backend_->backward(m, last, [&](int piece) {
      // --fault nan: the first gradient to become final gets a NaN before its bucket is reduced.
      if (last && piece == 0 && config_.fault == Fault::kNan && on_fault_rank) backend_->set_gradient_nan(piece);
    });
    backward_end.push_back(backend_->mark());
    // On the GPU this waits for this forward's loss only: backward is queued behind it, so the device keeps busy.
    const double loss = backend_->loss(m);
    loss_finite = loss_finite && std::isfinite(loss);
    r.loss += loss / micro_batches;
  }
  agreement_.start(loss_finite);  // its latency hides behind the gradients' all-reduces
  backend_->finish_reduction();
  const std::string nonfinite = agreement_.finish([this] { return backend_->first_nonfinite_gradient(); });
  const int optimizer_start = backend_->mark();
  if (!nonfinite.empty()) backend_->synchronize();  // nothing of this step runs on past a stop (updates in backward)
  const bool skip = skip_nonfinite_step(config_, nonfinite, step);
  r.skipped = skip ? 1 : 0;
  if (skip) skipped_because_ = "non-finite " + nonfinite;
  if (!skip) backend_->optimizer_step();
  if (config_.fault == Fault::kDiverge && on_fault_rank) backend_->add_to_first_parameter(1e-3f);
  if (config_.check_sync > 0 && (step + 1) % config_.check_sync == 0)
    check_replicas_agree(backend_->host_parameters(), backend_->grad_pieces(),
                         [this](const GradPiece& g) { return piece_name(g); }, agreement_.comm(), step);
  backend_->synchronize();  // the update's end: the step's marks can be resolved
  if (!skip) r.grad_norm = backend_->grad_norm();
  clock.optimized = now_ms();
  // The lab's other pathologies: an all-reduce nobody needs (--extra-allreduce-mb), and rank 0's host work before a
  // barrier the others wait in (--rank0-work-ms). A phase that does not run takes no reading of the clock, so it is
  // exactly 0, not the few microseconds between two readings.
  const bool extra_step = config_.extra_allreduce_mb > 0;
  if (extra_step) backend_->extra_allreduce();
  clock.extra = extra_step ? now_ms() : clock.optimized;
  const bool barrier_step = config_.rank0_work_ms > 0 && (step + 1) % config_.barrier_every == 0;
  if (barrier_step && rank_ == 0) sleep_ms(config_.rank0_work_ms);
  clock.work = barrier_step ? now_ms() : clock.extra;
  if (barrier_step) {
    const watchdog::Wait wait("MPI_Barrier after rank 0's work (--rank0-work-ms)");
    MPI_Barrier(agreement_.comm());
  }
  clock.end = barrier_step ? now_ms() : clock.work;
  const CpuTaken taken = taken_between(taken_at_start, cpu_meter_.read());
  r.steal_ms = taken.steal_ms;
  r.cpu_wait_ms = taken.cpu_wait_ms;
  backend_->end_step(step);

  for (int m = 0; m < micro_batches; ++m) {
    clock.data_end.push_back(backend_->mark_ms(data_end[m]));
    clock.forward_end.push_back(backend_->mark_ms(forward_end[m]));
    clock.backward_end.push_back(backend_->mark_ms(backward_end[m]));
  }
  clock.optimizer_start = backend_->mark_ms(optimizer_start);
  set_step_phases(r, clock, t0_ms);
  // The last backward on the run's clock: the window in which communication counts as hidden.
  add_comm_times(r, backend_->bucket_times(), r.start_ms + clock.forward_end.back(),
                 r.start_ms + clock.backward_end.back());
  return r;
}

}  // namespace ddplab
