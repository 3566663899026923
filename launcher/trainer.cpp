#include "launcher/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <thread>

#include "comm/mpi_check.h"
#include "comm/watchdog.h"
#include "kernels/cpu/ops.h"
#include "launcher/stop_signals.h"

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

// Length of the overlap of [a0, a1] and [b0, b1].
double overlap_ms(double a0, double a1, double b0, double b1) {
  return std::max(0.0, std::min(a1, b1) - std::max(a0, b0));
}

}  // namespace

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Trainer::Trainer(const TrainConfig& config, Communicator& comm)
    : config_(config),
      comm_(comm),
      workload_(make_workload(config, comm.rank(), comm.size())),
      optimizer_(config.optimizer, workload_->num_parameters()),
      reducer_(make_reducer(config, comm, *workload_)) {
  if (config.extra_allreduce_mb > 0) {
    extra_comm_ = std::make_unique<Communicator>(comm.mpi_comm(), comm.options());
    extra_buffer_.assign(static_cast<size_t>(config.extra_allreduce_mb * 1048576.0 / sizeof(float)), 0.0f);
  }
  mpiCheck(MPI_Comm_dup(comm.mpi_comm(), &control_comm_));
}

Trainer::~Trainer() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && control_comm_ != MPI_COMM_NULL) MPI_Comm_free(&control_comm_);
}

namespace {
void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}
}  // namespace

void inject_fault_before(const TrainConfig& config, int rank, int step) {
  if (config.fault == "none" || step != config.fault_step || rank != config.fault_rank) return;
  std::fprintf(stderr, "ddplab: rank %d injects fault '%s' at step %d\n", rank, config.fault.c_str(), step);
  std::fflush(stderr);
  if (config.fault == "hang") for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  if (config.fault == "kill") std::raise(SIGKILL);
  if (config.fault == "throw") throw std::runtime_error("injected fault (--fault throw) at step " + std::to_string(step));
}

bool skip_nonfinite_step(const TrainConfig& config, const std::string& what, int step) {
  if (what.empty()) return false;
  if (!config.skip_nonfinite)
    throw TrainingStopped("non-finite " + what + " at step " + std::to_string(step) +
                          "; stopped before the update (--skip-nonfinite skips such steps instead)");
  return true;
}

// The name of the first gradient piece of `bucket` holding a NaN or Inf.
std::string Trainer::first_nonfinite_gradient(int bucket) const {
  const Bucket& b = reducer_->buckets()[bucket];
  for (int k = b.first_piece; k <= b.last_piece; ++k) {
    const GradPiece& piece = workload_->grad_pieces()[k];
    if (!cpu::all_finite(workload_->flat_grads() + piece.offset, piece.numel)) return workload_->piece_name(piece);
  }
  return "bucket " + std::to_string(bucket);
}

namespace {
// A cheap 64-bit fingerprint of a tensor's bits: equal tensors hash equal; any change flips it (w.h.p.).
uint64_t fingerprint(const float* x, int64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ULL;
  }
  return h;
}
}  // namespace

// One fingerprint per gradient piece's slice of the parameters (same layout as the gradients).
void check_replicas_agree(const float* params, const std::vector<GradPiece>& pieces,
                          const std::function<std::string(const GradPiece&)>& piece_name, MPI_Comm comm, int step) {
  std::vector<uint64_t> mine(2 * pieces.size()), most(mine.size());
  for (size_t k = 0; k < pieces.size(); ++k) {
    mine[2 * k] = fingerprint(params + pieces[k].offset, pieces[k].numel);
    mine[2 * k + 1] = ~mine[2 * k];  // MAX of h and of ~h: equal everywhere iff every rank has the same h
  }
  {
    const watchdog::Wait wait("parameter check (--check-sync)");
    mpiCheck(MPI_Allreduce(mine.data(), most.data(), static_cast<int>(mine.size()), MPI_UINT64_T, MPI_MAX, comm));
  }
  // Registration order (pieces are in reverse): the first parameter of the model that differs.
  for (size_t k = pieces.size(); k-- > 0;) {
    if (most[2 * k] == mine[2 * k] && most[2 * k + 1] == mine[2 * k + 1]) continue;
    throw TrainingStopped("replicas diverged at step " + std::to_string(step) + ": parameter " +
                          piece_name(pieces[k]) + " differs across ranks (--check-sync); every rank must apply the " +
                          "same update");
  }
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
  // The step's agreement, started after the last forward and completed after the all-reduces, so it hides
  // behind backward: {a stop signal, 1 + the highest rank with a non-finite loss}, both by MAX.
  int control_mine[2] = {0, 0}, control[2] = {0, 0};
  MPI_Request control_request = MPI_REQUEST_NULL;
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
    if (m == micro_batches - 1) {
      control_mine[0] = StopSignals::received();
      control_mine[1] = loss_finite ? 0 : comm_.rank() + 1;
      mpiCheck(MPI_Iallreduce(control_mine, control, 2, MPI_INT, MPI_MAX, control_comm_, &control_request));
    }
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
  {
    const watchdog::Wait wait("the step's stop/finite agreement");
    mpiCheck(MPI_Wait(&control_request, MPI_STATUS_IGNORE));
  }
  stop_signal_ = control[0];
  const double t_reduced = now_ms();
  std::string nonfinite;
  if (control[1] > 0) {
    nonfinite = "loss on rank " + std::to_string(control[1] - 1);
  } else if (const int bucket = reducer_->first_nonfinite_bucket(); bucket >= 0) {
    nonfinite = "gradient " + first_nonfinite_gradient(bucket);
  }
  const bool skip = skip_nonfinite_step(config_, nonfinite, step);
  r.skipped = skip ? 1 : 0;
  if (!skip) optimizer_.step(workload_->flat_params(), workload_->flat_grads());
  if (config_.fault == "diverge" && step == config_.fault_step && comm_.rank() == config_.fault_rank)
    workload_->flat_params()[workload_->grad_pieces().back().offset] += 1e-3f;  // the first registered parameter
  if (config_.check_sync > 0 && (step + 1) % config_.check_sync == 0)
    check_replicas_agree(workload_->flat_params(), workload_->grad_pieces(),
                         [this](const GradPiece& g) { return workload_->piece_name(g); }, control_comm_, step);
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
  for (const BucketTimes& b : reducer_->bucket_times()) {
    r.comm_ms += b.comm_end_ms - b.comm_start_ms;
    r.hidden_comm_ms += overlap_ms(b.comm_start_ms, b.comm_end_ms, backward_start - t0_ms, backward_end - t0_ms);
  }
  return r;
}

}  // namespace ddplab
