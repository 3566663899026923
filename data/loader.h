// The input pipeline: produces batches of a SyntheticClassification in a fixed order, optionally on worker
// threads that run ahead of the training loop (PyTorch's DataLoader with num_workers and prefetching).
//
// A per-sample host cost (cost_ms_per_sample, a sleep: I/O-like latency that does not compete with compute for
// the cores) lets the lab make the input pipeline the bottleneck, and loader threads + prefetch depth show the
// fix. With threads == 0 the batch is produced in the caller's thread when asked for.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "data/synthetic.h"

namespace ddplab {

struct LoaderConfig {
  int batch = 1;
  double cost_ms_per_sample = 0;
  int threads = 0;   // 0: synchronous
  int prefetch = 2;  // batches ready ahead of the consumer (with threads > 0)
};

class BatchLoader {
 public:
  // Batch i holds the samples first_sample(i) .. first_sample(i) + batch - 1.
  BatchLoader(const SyntheticClassification& data, const LoaderConfig& config,
              std::function<int64_t(int64_t)> first_sample);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Blocks until the next batch is ready. The pointers stay valid until the following call.
  void next(const float** x, const int32_t** y);

  // The batches it holds, all allocated when it is made: `prefetch` ready ahead and the one the consumer uses (without
  // threads, that one only).
  static int64_t slots(const LoaderConfig& config) { return config.threads > 0 ? int64_t{config.prefetch} + 1 : 1; }
  // The least memory one slot takes, for batches of `input_dim` features.
  static double slot_bytes(const LoaderConfig& config, int input_dim) {
    return sizeof(Slot) + static_cast<double>(config.batch) * (input_dim * sizeof(float) + sizeof(int32_t));
  }

 private:
  struct Slot {
    std::vector<float> x;
    std::vector<int32_t> y;
    int64_t batch_index = -1;  // which batch the slot holds once ready
  };
  void produce(Slot& slot, int64_t index);
  void worker_loop();

  const SyntheticClassification& data_;
  LoaderConfig config_;
  std::function<int64_t(int64_t)> first_sample_;
  std::vector<Slot> slots_;  // batch i lives in slot i % slots_.size()
  int64_t consumed_ = 0;     // batches handed out so far

  std::mutex mutex_;
  std::condition_variable produced_cv_, space_cv_;
  int64_t next_to_claim_ = 0;  // next batch a worker will produce
  int64_t released_ = 0;       // batches the consumer is done with
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

}  // namespace ddplab
