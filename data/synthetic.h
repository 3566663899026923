// Synthetic classification data, deterministic in (seed, sample index), sharded across ranks.
//
// Sample g belongs to class c = hash(seed, g) mod num_classes and is x = prototype[c] + noise * u, with
// u uniform in [-1, 1) per element, and each prototype a fixed N(0,1) vector. Any rank can produce any
// sample without communication, so sharding is just index arithmetic (ShardedBatches below), and a
// one-rank run with the global batch sees exactly the samples that N ranks see together.
#pragma once
#include <cstdint>
#include <vector>

namespace ddplab {

struct SyntheticConfig {
  int input_dim = 1024;
  int num_classes = 1000;
  uint64_t seed = 1234;
  float noise = 1.0f;
};

class SyntheticClassification {
 public:
  explicit SyntheticClassification(const SyntheticConfig& config);
  // Writes samples first .. first+count-1 into x [count, input_dim] and y [count].
  void fill(float* x, int32_t* y, int64_t first, int count) const;
  const SyntheticConfig& config() const { return config_; }

 private:
  SyntheticConfig config_;
  std::vector<float> prototypes_;  // [num_classes, input_dim]
};

// DistributedSampler-like sharding of a sample stream: at step s the global batch is the samples
// [s*G, (s+1)*G) with G = world_size * batch, and rank r takes the r-th slice of `batch` of them.
// With gradient accumulation `batch` is the rank's whole step (micro-batches x their size), and micro-batch u of it
// is the u-th run of micro_batch samples within that slice (on the GPU: rows u * micro_batch.. of the staged step).
struct ShardedBatches {
  int rank = 0, world_size = 1, batch = 1;
  int64_t first_sample(int64_t step) const {
    return (step * world_size + rank) * static_cast<int64_t>(batch);
  }
  int64_t first_sample(int64_t step, int micro, int micro_batch) const {
    return first_sample(step) + static_cast<int64_t>(micro) * micro_batch;
  }
};

}  // namespace ddplab
