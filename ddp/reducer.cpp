#include "ddp/reducer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include "kernels/cpu/ops.h"
#include "runtime/clock.h"
#include "runtime/errors.h"
#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"

namespace ddplab {
namespace {

// The CPU time the calling thread has used.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

}  // namespace

Reducer::Reducer(Communicator& comm, const ReducerConfig& config, const std::vector<int64_t>& numel,
                 const std::vector<int64_t>& offset, float* flat_grads)
    : comm_(comm),
      config_(config),
      buckets_(assign_buckets(numel, offset, config.caps)),
      countdown_(buckets_, "Reducer"),
      piece_numel_(numel),
      piece_offset_(offset),
      flat_grads_(flat_grads),
      times_(buckets_.size()),
      nonfinite_(buckets_.size()) {
  check_same_layout(buckets_, comm.mpi_comm());
  // A tag per bucket, and with the sharded update a second for its all-gather: checked here, not at the first step,
  // and alike on every rank (the layouts are), so every rank refuses it as bad input. One rank sends nothing.
  const size_t tags = (config_.sharded ? 2 : 1) * buckets_.size();
  if (comm.size() > 1 && tags > static_cast<size_t>(Communicator::kMaxTag) + 1)
    throw UsageError(std::to_string(buckets_.size()) + " gradient buckets need " + std::to_string(tags) + " tags" +
                     (config_.sharded ? " (two each for the sharded update)" : "") + ", more than the " +
                     std::to_string(Communicator::kMaxTag + 1) + " the all-reduce has: raise --bucket-mb");
  if (config_.sharded) {
    for (const Bucket& b : buckets_) {
      owned_.push_back(comm.owned_chunks(static_cast<size_t>(b.count)));
      for (RingChunk& c : owned_.back()) c.offset += static_cast<size_t>(b.offset);
    }
    if (comm.size() > 1) mpiCheck(MPI_Comm_dup(comm.mpi_comm(), verdicts_.receive()));
  }
  // One rank has no peer: nothing to all-reduce, so no thread to hand buckets to (launch() finishes them).
  if (comm.size() > 1) comm_thread_ = std::make_unique<WorkerThread>("comm thread");
}

// The comm thread stops before the state its jobs use goes: it is the last member, destroyed first.
Reducer::~Reducer() = default;

void Reducer::begin_step(double origin_ms, float grad_scale, float local_scale) {
  origin_ms_ = origin_ms;
  grad_scale_ = grad_scale;
  local_scale_ = local_scale;
  sync_ = true;
  countdown_.restart();
  std::fill(times_.begin(), times_.end(), BucketTimes{});
  std::fill(nonfinite_.begin(), nonfinite_.end(), 0);
  last_finish_ticket_ = 0;
}

void Reducer::mark_ready(int piece) {
  if (!sync_) return;
  const bool complete = countdown_.mark_ready(piece);
  if (!comm_thread_ && config_.overlap) finish_alone(piece);
  if (!complete) return;
  times_[countdown_.bucket_of(piece)].ready_ms = now_ms() - origin_ms_;
  if (!config_.overlap) return;
  for (int b; (b = countdown_.next_to_launch()) >= 0;) launch(b);
}

void Reducer::launch(int bucket) {
  if (comm_thread_) {
    comm_thread_->submit([this, bucket] { reduce(bucket); });
    return;
  }
  // The sum over one rank is its own gradients: no copy, no wait, zero comm time at the moment it would have started.
  times_[bucket].comm_start_ms = times_[bucket].comm_end_ms = now_ms() - origin_ms_;
  times_[bucket].comm_cpu_ms = 0;
  if (!config_.overlap)  // its pieces were not finished as they became final
    for (int piece = buckets_[bucket].first_piece; piece <= buckets_[bucket].last_piece; ++piece) finish_alone(piece);
}

void Reducer::finish_alone(int piece) {
  // Only the mean's factor is left, 1 unless micro-batches or batch weights make it otherwise, and the check: scaled
  // and checked in one pass while backward's last writes are in cache. A NaN still stops the step.
  auto finish = [this, piece, scale = local_scale_ * grad_scale_] {
    const bool finite = cpu::scale_and_check_finite(flat_grads_ + piece_offset_[piece], scale, piece_numel_[piece]);
    if (!finite) {
      const std::lock_guard<std::mutex> lock(nonfinite_mutex_);
      nonfinite_[countdown_.bucket_of(piece)] = 1;
    }
    if (on_reduced_) on_reduced_(piece, piece, finite);
  };
  // The last piece on the caller's thread: backward is over, and a hand-off would only add a wake-up to the step.
  if (alone_finisher_ && piece + 1 < static_cast<int>(piece_numel_.size()))
    last_finish_ticket_ = alone_finisher_->submit(std::move(finish));
  else
    finish();
}

void Reducer::wait_all() {
  const int nb = static_cast<int>(buckets_.size());
  countdown_.require_all_ready();
  for (int b; (b = countdown_.next_to_launch()) >= 0;) launch(b);  // overlap off: everything starts now
  if (!comm_thread_) {                               // world size 1: the pieces are finished, or on the finisher
    if (alone_finisher_) alone_finisher_->wait(last_finish_ticket_);
    return;
  }
  const watchdog::Wait wait(config_.sharded ? "the gradient buckets' reduce-scatters (--zero-stage 1)"
                                            : "the gradient buckets' all-reduces");
  comm_thread_->wait_all();        // rethrows the comm thread's error; the program's edge aborts the job
  if (verdicts_ != MPI_COMM_NULL)  // sharded: each rank checked the elements it owns; agree on every bucket's verdict
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, nonfinite_.data(), nb, MPI_INT, MPI_MAX, verdicts_));
}

void Reducer::all_gather(int bucket, float* flat) {
  const Bucket& b = buckets_.at(bucket);
  if (!comm_.sharded(static_cast<size_t>(b.count))) return;  // every rank owns all of it: nothing to gather
  comm_thread_->submit([this, bucket, flat, &b] {
    times_[bucket].gather_start_ms = now_ms() - origin_ms_;
    // Tags after the buckets' own: a rank that gathers while another reduces fails with a mismatch, not wrong data.
    comm_.all_gather(flat + b.offset, static_cast<size_t>(b.count), static_cast<int>(buckets_.size()) + bucket);
    times_[bucket].gather_end_ms = now_ms() - origin_ms_;
  });
}

void Reducer::wait_all_gathers() {
  if (!comm_thread_) return;
  const watchdog::Wait wait("the parameters' all-gathers");
  comm_thread_->wait_all();
}

int Reducer::first_nonfinite_piece() {
  const int b = first_nonfinite_bucket();  // the same on every rank
  if (b < 0) return -1;
  int found = INT_MAX;
  for (int k = buckets_[b].first_piece; k <= buckets_[b].last_piece && found == INT_MAX; ++k) {
    const int64_t begin = piece_offset_[k], end = begin + piece_numel_[k];
    if (!config_.sharded) {
      if (!cpu::all_finite(flat_grads_ + begin, end - begin)) found = k;
      continue;
    }
    for (const RingChunk& c : owned_[b]) {  // only where this rank owns the elements: the rest are zeroed
      const int64_t from = std::max(begin, static_cast<int64_t>(c.offset));
      const int64_t to = std::min(end, static_cast<int64_t>(c.offset + c.count));
      if (from < to && !cpu::all_finite(flat_grads_ + from, to - from)) found = k;
    }
  }
  if (verdicts_ != MPI_COMM_NULL) {
    const watchdog::Wait wait("the ranks' first non-finite gradient (sharded update)");
    mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &found, 1, MPI_INT, MPI_MIN, verdicts_));
  }
  return found == INT_MAX ? -1 : found;
}

double Reducer::sum_of_squares() const {
  double mine = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    if (!config_.sharded) {
      mine += cpu::sum_of_squares(flat_grads_ + bucket.offset, bucket.count);
    } else if (comm_.sharded(static_cast<size_t>(bucket.count)) || comm_.rank() == 0) {
      for (const RingChunk& c : owned_[b]) mine += cpu::sum_of_squares(flat_grads_ + c.offset, c.count);
    }
  }
  if (verdicts_ == MPI_COMM_NULL) return mine;
  std::vector<double> each(comm_.size());
  {
    const watchdog::Wait wait("the ranks' sums of squares of their gradient shares (sharded update)");
    mpiCheck(MPI_Allgather(&mine, 1, MPI_DOUBLE, each.data(), 1, MPI_DOUBLE, verdicts_));
  }
  double sum = 0;
  for (double rank_sum : each) sum += rank_sum;
  return sum;
}

int Reducer::first_nonfinite_bucket() const {
  const auto it = std::find(nonfinite_.begin(), nonfinite_.end(), 1);
  return it == nonfinite_.end() ? -1 : static_cast<int>(it - nonfinite_.begin());
}

void Reducer::reduce(int b) {
  const Bucket& bucket = buckets_[b];
  float* grads = flat_grads_ + bucket.offset;
  const double cpu_start = thread_cpu_ms();
  times_[b].comm_start_ms = now_ms() - origin_ms_;
  if (local_scale_ != 1.0f) cpu::scale(grads, local_scale_, bucket.count);
  if (config_.sharded) {
    nonfinite_[b] = !comm_.reduce_scatter_gradients(grads, static_cast<size_t>(bucket.count), grad_scale_, b);
    // What is left where others own the elements (the ring's partial sums, or this rank's own gradients after the
    // direct reduce-scatter) is of no use: zeroed, as the update zeroes its own, so that the next backward adds to
    // zeros (no peer reads them now: every send is retired, every peer departed).
    size_t at = static_cast<size_t>(bucket.offset);
    for (const RingChunk& c : owned_[b]) {
      std::fill(flat_grads_ + at, flat_grads_ + c.offset, 0.0f);
      at = c.offset + c.count;
    }
    std::fill(flat_grads_ + at, flat_grads_ + bucket.offset + bucket.count, 0.0f);
  } else {
    nonfinite_[b] = !comm_.allreduce_gradients(grads, static_cast<size_t>(bucket.count), grad_scale_, b);
  }
  times_[b].comm_end_ms = now_ms() - origin_ms_;
  times_[b].comm_cpu_ms = thread_cpu_ms() - cpu_start;
  if (on_reduced_) on_reduced_(bucket.first_piece, bucket.last_piece, !nonfinite_[b]);
}

}  // namespace ddplab
