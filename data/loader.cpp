#include "data/loader.h"

#include <chrono>

namespace ddplab {

BatchLoader::BatchLoader(const SyntheticClassification& data, const LoaderConfig& config,
                         std::function<int64_t(int64_t)> first_sample)
    : data_(data), config_(config), first_sample_(std::move(first_sample)) {
  // Workers may fill `prefetch` batches ahead while the consumer still uses the batch it was handed last.
  slots_.resize(slots(config));
  for (Slot& s : slots_) {
    s.x.resize(static_cast<size_t>(config.batch) * data.config().input_dim);
    s.y.resize(config.batch);
  }
  for (int t = 0; t < config.threads; ++t) workers_.emplace_back([this] { worker_loop(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void BatchLoader::produce(Slot& slot, int64_t index) {
  if (config_.cost_ms_per_sample > 0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.cost_ms_per_sample * config_.batch));
  data_.fill(slot.x.data(), slot.y.data(), first_sample_(index), config_.batch);
}

void BatchLoader::worker_loop() {
  const int64_t num_slots = static_cast<int64_t>(slots_.size());
  for (;;) {
    int64_t index;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Batch i may be produced once the consumer released batch i - num_slots, whose slot it reuses.
      space_cv_.wait(lock, [&] { return stop_ || next_to_claim_ < released_ + num_slots; });
      if (stop_) return;
      index = next_to_claim_++;
    }
    Slot& slot = slots_[index % slots_.size()];
    try {
      produce(slot, index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      produced_cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot.batch_index = index;
    }
    produced_cv_.notify_all();
  }
}

void BatchLoader::next(const float** x, const int32_t** y) {
  const int64_t index = consumed_;
  Slot& slot = slots_[index % slots_.size()];
  if (workers_.empty()) {
    produce(slot, index);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    released_ = index;  // the caller is done with every batch handed out before: their slots are free
    space_cv_.notify_all();
    produced_cv_.wait(lock, [&] { return slot.batch_index == index || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  ++consumed_;
  *x = slot.x.data();
  *y = slot.y.data();
}

}  // namespace ddplab
