// Stages training batches one step ahead on one persistent worker thread: the GPU trainer's input pipeline
// (train/cuda_backend.h), kept apart from CUDA so that its order is tested without a GPU
// (tests/unit/test_batch_prefetcher.cpp).
//
// take(s) hands step s + 1 to the worker before it returns step s's batch, so producing the next batch (generating
// its samples, the lab's --data-cost-ms, queuing its copy to the device) runs while the caller runs all of step s:
// forward, backward and the gradients' all-reduces, in which the ring's ipc and host links block the calling thread.
// One thread for the whole run, not one per step.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "train/workload.h"  // BatchStats

namespace ddplab {

class BatchPrefetcher {
 public:
  // Fills step `step`'s batch (the trainer: into slot step % 2) and returns what it holds. Runs on the worker, one
  // call at a time.
  using Stage = std::function<BatchStats(int64_t step)>;

  // Steps run from 0 to steps - 1: none beyond is staged.
  BatchPrefetcher(Stage stage, int64_t steps) : stage_(std::move(stage)), steps_(steps) {
    worker_ = std::thread([this] { run(); });
  }
  // Waits for a staging in flight (it writes memory its caller owns), then ends the worker.
  ~BatchPrefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Step `step`'s batch: staged now if it was not prefetched (the first step, a resumed run's first), waited for,
  // and before returning, step + 1 handed to the worker. Call it once step - 1 is complete: step + 1 reuses the slot
  // step - 1 read. Rethrows what the staging threw.
  BatchStats take(int64_t step) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto rethrow = [&] {
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    };
    rethrow();
    if (queued_ != step && staging_ != step && !(done_ && done_->first == step)) {
      changed_.wait(lock, [&] { return !queued_ && !staging_; });  // a prefetch of another step: let it finish
      rethrow();
      queue(step);
    }
    changed_.wait(lock, [&] { return error_ || (done_ && done_->first == step); });
    rethrow();
    const BatchStats stats = done_->second;
    if (step + 1 < steps_) queue(step + 1);
    return stats;
  }

 private:
  void queue(int64_t step) {
    queued_ = step;
    changed_.notify_all();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || queued_; });
      if (stop_) return;
      staging_ = std::exchange(queued_, std::nullopt);
      lock.unlock();
      std::optional<BatchStats> stats;
      std::exception_ptr error;
      try {
        stats = stage_(*staging_);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (stats) done_.emplace(*staging_, *stats);
      error_ = error;
      staging_.reset();
      changed_.notify_all();
    }
  }

  Stage stage_;
  int64_t steps_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<int64_t> queued_, staging_;           // handed to the worker; being staged
  std::optional<std::pair<int64_t, BatchStats>> done_;  // the last step staged, and its batch
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;  // last: it starts once everything above is initialized
};

}  // namespace ddplab
