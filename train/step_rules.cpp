#include "train/step_rules.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"
#include "train/stop_signals.h"

namespace ddplab {

StepAgreement::StepAgreement(MPI_Comm comm) {
  mpiCheck(MPI_Comm_dup(comm, comm_.receive()));
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
}

void StepAgreement::start(bool loss_finite) {
  mine_[0] = StopSignals::received();
  mine_[1] = loss_finite ? 0 : rank_ + 1;
  mpiCheck(MPI_Iallreduce(mine_, result_, 2, MPI_INT, MPI_MAX, comm_, &request_));
}

std::string StepAgreement::finish(const std::function<std::string()>& nonfinite_gradient) {
  {
    const watchdog::Wait wait("the step's stop/finite agreement");
    mpiCheck(MPI_Wait(&request_, MPI_STATUS_IGNORE));
  }
  if (result_[1] > 0) return "loss on rank " + std::to_string(result_[1] - 1);
  return nonfinite_gradient();
}

void add_comm_times(StepRecord& r, const std::vector<BucketTimes>& buckets, double backward_from_ms,
                    double backward_to_ms) {
  const auto add = [&](double from_ms, double to_ms) {
    r.comm_ms += to_ms - from_ms;
    r.hidden_comm_ms += std::max(0.0, std::min(to_ms, backward_to_ms) - std::max(from_ms, backward_from_ms));
  };
  for (const BucketTimes& b : buckets) {
    add(b.comm_start_ms, b.comm_end_ms);
    add(b.gather_start_ms, b.gather_end_ms);  // --zero-stage 1's all-gather (after backward: never hidden by it)
  }
}

void inject_fault_before(const TrainConfig& config, int rank, int step) {
  if (config.fault == Fault::kNone || step != config.fault_step || rank != config.fault_rank) return;
  std::fprintf(stderr, "ddplab: rank %d injects fault '%s' at step %d\n", rank, to_string(config.fault), step);
  std::fflush(stderr);
  if (config.fault == Fault::kHang) for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  if (config.fault == Fault::kKill) std::raise(SIGKILL);
  if (config.fault == Fault::kThrow) throw std::runtime_error("injected fault (--fault throw) at step " + std::to_string(step));
}

bool skip_nonfinite_step(const TrainConfig& config, const std::string& what, int step) {
  if (what.empty()) return false;
  if (!config.skip_nonfinite)
    throw TrainingStopped("non-finite " + what + " at step " + std::to_string(step) + "; stopped " +
                          (config.update_in_backward()
                               ? "with the finite gradients already applied in backward (--optimizer-in-backward)"
                               : "before the update (--skip-nonfinite skips such steps instead)"));
  return true;
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
                          const std::function<std::string(const GradPiece&)>& piece_name, MPI_Comm comm, int step,
                          const std::string& start_cause) {
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
    if (step < 0)
      throw TrainingStopped("replicas differ before the first step: parameter " + piece_name(pieces[k]) +
                            " is not the same on every rank; " + start_cause);
    throw TrainingStopped("replicas diverged at step " + std::to_string(step) + ": parameter " +
                          piece_name(pieces[k]) + " differs across ranks (--check-sync); every rank must apply the " +
                          "same update");
  }
}

}  // namespace ddplab
