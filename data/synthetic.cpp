#include "data/synthetic.h"

#include <stdexcept>

#include "kernels/cpu/rng.h"

namespace ddplab {
namespace {
// Independent random streams carved out of one seed.
enum Stream : uint64_t { kPrototypeStream = 1, kLabelStream = 2, kNoiseStream = 3 };
}  // namespace

SyntheticClassification::SyntheticClassification(const SyntheticConfig& config) : config_(config) {
  if (config.input_dim <= 0 || config.num_classes <= 0) throw std::invalid_argument("synthetic data: empty shape");
  const int64_t n = static_cast<int64_t>(config.num_classes) * config.input_dim;
  prototypes_.resize(n);
  const uint64_t seed = substream(config.seed, kPrototypeStream);
  for (int64_t i = 0; i < n; ++i) prototypes_[i] = static_cast<float>(normal(seed, i));
}

void SyntheticClassification::fill(float* x, int32_t* y, int64_t first, int count) const {
  const int dim = config_.input_dim;
  const uint64_t label_seed = substream(config_.seed, kLabelStream);
  const uint64_t noise_seed = substream(config_.seed, kNoiseStream);
  // uint64 → [-1, 1): top 24 bits are exactly representable in float.
  const float to_unit = 2.0f / 16777216.0f;
  for (int i = 0; i < count; ++i) {
    const uint64_t g = static_cast<uint64_t>(first + i);
    const int32_t label = static_cast<int32_t>(hash64(label_seed, g) % config_.num_classes);
    y[i] = label;
    const float* proto = prototypes_.data() + static_cast<int64_t>(label) * dim;
    float* row = x + static_cast<int64_t>(i) * dim;
    const uint64_t row_seed = substream(noise_seed, g);
    for (int j = 0; j < dim; ++j) {
      const float u = static_cast<float>(hash64(row_seed, j) >> 40) * to_unit - 1.0f;
      row[j] = proto[j] + config_.noise * u;
    }
  }
}

}  // namespace ddplab
