// Stages training batches one step ahead on one persistent worker thread: the GPU trainer's input pipeline
// (train/cuda_backend.h), kept apart from CUDA so that its order is tested without a GPU
// (tests/unit/test_batch_prefetcher.cpp).
//
// take(s) hands step s + 1 to the worker before it returns step s's batch, so producing the next batch (generating
// its samples, the lab's --data-cost-ms, queuing its copy to the device) runs while the caller runs all of step s:
// forward, backward and the gradients' all-reduces, in which the ring's ipc and host links block the calling thread.
// One thread for the whole run, not one per step.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "runtime/worker_thread.h"
#include "train/batch_stats.h"

namespace ddplab {

class BatchPrefetcher {
 public:
  // Fills step `step`'s batch (the trainer: into slot step % 2) and returns what it holds. Runs on the worker, one
  // call at a time.
  using Stage = std::function<BatchStats(int64_t step)>;

  // Steps run from 0 to steps - 1: none beyond is staged.
  BatchPrefetcher(Stage stage, int64_t steps) : stage_(std::move(stage)), steps_(steps) {}
  // The worker's destruction waits for a staging in flight (it writes memory its caller owns).

  // Step `step`'s batch: staged now if it was not prefetched (the first step, a resumed run's first), waited for,
  // and before returning, step + 1 handed to the worker. Call it once step - 1 is complete: step + 1 reuses the slot
  // step - 1 read. Rethrows what the staging threw.
  BatchStats take(int64_t step) {
    if (!next_ || next_->step != step) next_ = stage_on_worker(step);  // after any staging in flight
    worker_.wait(next_->ticket);
    const BatchStats stats = staged_[step % 2];
    next_ = step + 1 < steps_ ? std::optional<Ticket>(stage_on_worker(step + 1)) : std::nullopt;
    return stats;
  }

 private:
  struct Ticket {
    int64_t step;
    uint64_t ticket;
  };
  Ticket stage_on_worker(int64_t step) {
    return {step, worker_.submit([this, step] { staged_[step % 2] = stage_(step); })};
  }

  Stage stage_;
  int64_t steps_;
  BatchStats staged_[2];                     // what steps of each parity hold, written by the worker
  std::optional<Ticket> next_;               // the step handed to the worker last
  WorkerThread worker_{"batch prefetcher"};  // last: stopped (its staging finished) before the rest goes
};

}  // namespace ddplab
