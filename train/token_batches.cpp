#include "train/token_batches.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "data/token_files.h"

namespace ddplab {
namespace {

TokenDataConfig data_config(const TrainConfig& c, const TransformerConfig& model) {
  TokenDataConfig d;
  d.vocab = model.vocab;
  d.num_classes = model.num_classes;
  d.min_len = c.lengths == LengthDist::kFixed ? c.max_len : c.min_len;
  d.max_len = c.max_len;
  d.dist = c.lengths;
  d.outlier_prob = c.outlier_prob;
  d.epoch_size = c.epoch_size;
  d.seed = c.seed;
  return d;
}

// --data's shards in windows of --max-len tokens, or synthetic sequences.
std::unique_ptr<TokenSource> token_source(const TrainConfig& c, const TransformerConfig& model) {
  if (!c.data.empty()) return std::make_unique<TokenFiles>(c.data, c.max_len);
  return std::make_unique<SyntheticTokens>(data_config(c, model));
}

}  // namespace

TokenBatches::TokenBatches(const TrainConfig& config, const TransformerConfig& model, int rank, int world)
    : config_(config),
      model_(model),
      rank_(rank),
      world_(world),
      batching_(config.batching),
      data_(token_source(config, model)) {}

int TokenBatches::longest_sequence(const TrainConfig& c) {
  if (!c.data.empty()) return c.max_len;
  const SyntheticTokens data(data_config(c, model_config(c)));
  const int64_t scanned = std::min<int64_t>(c.epoch_size, int64_t{1} << 20);
  int longest = 0;
  for (int64_t i = 0; i < scanned && longest < c.max_len; ++i) longest = std::max(longest, data.length(i));
  return longest;
}

TransformerConfig TokenBatches::model_config(const TrainConfig& c) {
  TransformerConfig m = TransformerConfig::preset(to_string(c.model));
  m.head = c.head;
  m.max_len = std::max(m.max_len, c.max_len);
  return m;
}

std::string TokenBatches::describe(int64_t num_parameters) const {
  char model[120];
  std::snprintf(model, sizeof model, "transformer %s (%s head, %d layer%s, d_model %d, %d head%s, %.2fM params)",
                to_string(config_.model), to_string(config_.head), model_.layers, model_.layers == 1 ? "" : "s",
                model_.d_model, model_.heads, model_.heads == 1 ? "" : "s", num_parameters / 1e6);
  return std::string(model) + ", " + data_->describe() + ", batching " + to_string(config_.batching);
}

int64_t TokenBatches::max_tokens(const TrainConfig& config) {
  const int64_t max_len = config.max_len;
  switch (config.batching) {
    case Batching::kSample:
    case Batching::kBucket:
      return config.batch * max_len;
    case Batching::kToken:  // the budget, or one sequence longer than it alone
      return std::max(config.max_tokens, max_len);
    case Batching::kPack:
      return std::max<int64_t>(1, config.max_tokens / max_len) * max_len;
  }
  throw std::logic_error("TokenBatches: unknown batching");
}

BatchStats TokenBatches::load(int64_t step, int micro) {
  if (step != step_) begin_step(step);
  const int slot = micro * world_ + rank_;
  const std::vector<int64_t>& ids = plan_->batch(plan_step_, slot);
  const std::vector<int>& rows = plan_->rows(plan_step_, slot);
  rows_ = static_cast<int>(rows.size());
  seq_ = 1;
  for (size_t b = 0, next = 0; b < rows.size(); ++b) {
    int row = 0;
    for (int k = 0; k < rows[b]; ++k) row += data_->length(ids[next++]);
    seq_ = std::max(seq_, row);
  }
  tokens_.assign(static_cast<size_t>(rows_) * seq_, 0);
  if (batching_ == Batching::kPack) positions_.assign(tokens_.size(), 0);
  lengths_.assign(rows_, 0);
  labels_.clear();  // one per sequence: the classifier has one sequence per row
  BatchStats stats;
  for (size_t b = 0, next = 0; b < rows.size(); ++b) {
    for (int k = 0; k < rows[b]; ++k) {  // the row's sequences back to back, each from position 0
      const int64_t id = ids[next++];
      const int len = data_->length(id), at = static_cast<int>(b) * seq_ + lengths_[b];
      data_->fill(tokens_.data() + at, id);
      for (int t = 0; t < len && !positions_.empty(); ++t) positions_[at + t] = t;
      labels_.push_back(data_->label(id));
      lengths_[b] += len;
      stats.max_len = std::max(stats.max_len, static_cast<double>(len));
      stats.loss_terms += static_cast<double>(model_.loss_terms(len));
    }
    stats.useful_tokens += lengths_[b];
  }
  stats.samples = static_cast<double>(ids.size());
  stats.padded_tokens = static_cast<double>(rows_) * seq_;
  micro_scale_ = micro_scales_.at(micro);
  return stats;
}

// Finds the step in the plans (epoch e is a fresh plan; steps run through the epochs back to back) and weighs every
// micro-batch of this rank. The model's loss is a mean over its loss terms, and the terms of a step are spread over
// ranks and micro-batches in unequal numbers. Every rank knows every batch (the plan is shared), so:
// rank weight() = its terms x world / all terms of the step, applied to the rank's accumulated gradient;
// micro-batch scale = its terms x micro-batches / the rank's terms, applied in backward. With the trainer's
// 1 / (world x micro-batches) the sum is the gradient of the mean over all the step's terms, as on one rank.
void TokenBatches::begin_step(int64_t step) {
  const int micro_batches = config_.grad_accum;
  while (!plan_ || step - plan_first_step_ >= plan_->num_steps()) {
    const int64_t first = plan_ ? plan_first_step_ + plan_->num_steps() : 0;
    const BatchingConfig batching{batching_, config_.batch, config_.max_tokens, 64};
    plan_ = std::make_unique<BatchPlan>(*data_, batching, world_ * micro_batches,
                                        config_.seed + 7919 * static_cast<uint64_t>(epoch_++));
    plan_first_step_ = first;
  }
  step_ = step;
  plan_step_ = step - plan_first_step_;
  auto terms = [&](int slot) {
    int64_t n = 0;
    for (int64_t id : plan_->batch(plan_step_, slot)) n += model_.loss_terms(data_->length(id));
    return n;
  };
  int64_t mine = 0, global = 0;
  micro_scales_.assign(micro_batches, 0.0);
  for (int m = 0; m < micro_batches; ++m) {
    for (int r = 0; r < world_; ++r) {
      const int64_t n = terms(m * world_ + r);
      global += n;
      if (r == rank_) {
        mine += n;
        micro_scales_[m] = static_cast<double>(n);
      }
    }
  }
  for (double& scale : micro_scales_) scale = mine > 0 ? scale * micro_batches / mine : 0.0;
  weight_ = global > 0 ? static_cast<double>(mine) * world_ / global : 0.0;
}

}  // namespace ddplab
