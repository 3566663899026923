#include "launcher/workload.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "data/loader.h"
#include "data/synthetic.h"
#include "data/tokens.h"
#include "model/transformer.h"

namespace ddplab {
namespace {

// What every workload answers from its model alone (Mlp<float> and Transformer<float> share these calls).
template <typename Model>
class ModelWorkload : public Workload {
 public:
  int64_t num_parameters() const override { return model_.num_parameters(); }
  float* flat_params() override { return model_.flat_params(); }
  float* flat_grads() override { return model_.flat_grads(); }
  const std::vector<GradPiece>& grad_pieces() const override { return model_.grad_pieces(); }
  const std::vector<Parameter<float>>& parameters() const override { return model_.parameters(); }
  void set_grad_piece_elements(int64_t n) override { model_.set_grad_piece_elements(n); }
  std::string piece_name(const GradPiece& g) const override { return grad_piece_name(model_.parameters(), g); }
  void zero_grad() override { model_.zero_grad(); }

 protected:
  template <typename... Args>
  explicit ModelWorkload(Args&&... model_args) : model_(std::forward<Args>(model_args)...) {}
  Model model_;
};

// The MLP on synthetic classification data, through the input pipeline (loader threads, prefetch, cost).
class MlpWorkload final : public ModelWorkload<Mlp<float>> {
 public:
  MlpWorkload(const TrainConfig& c, int rank, int world)
      : ModelWorkload(c.mlp, c.seed),
        config_(c),
        data_(SyntheticConfig{c.mlp.input_dim, c.mlp.num_classes, c.seed, c.data_noise}),
        shard_{rank, world, c.batch * c.grad_accum} {}
  std::string describe() const override {
    const auto& m = config_.mlp;
    char text[160];
    std::snprintf(text, sizeof text, "MLP %d-%dx%d-%d (%.2fM params)", m.input_dim, m.hidden_dim,
                  m.num_hidden_layers, m.num_classes, model_.num_parameters() / 1e6);
    return text;
  }
  BatchStats load(int64_t step, int micro) override {
    // Micro-batch j of the run is micro-batch j % K of step j / K. The loader produces them in sequence (and
    // ahead, with threads) from the first one asked for: step 0, or the step a resumed run starts at.
    const int k = config_.grad_accum;
    const int64_t j = step * k + micro;
    if (!loader_) {
      loader_ = std::make_unique<BatchLoader>(
          data_, LoaderConfig{config_.batch, config_.data_cost_ms, config_.loader_threads, config_.prefetch},
          [this, k, j0 = j](int64_t i) {
            const int64_t m = j0 + i;
            return shard_.first_sample(m / k) + (m % k) * int64_t{config_.batch};
          });
      next_micro_batch_ = j;
    }
    if (j != next_micro_batch_++) throw std::logic_error("MlpWorkload: micro-batches must be loaded in sequence");
    loader_->next(&inputs_, &targets_);
    return BatchStats{static_cast<double>(config_.batch), 0, 0, 0};
  }
  double forward() override { return model_.forward(inputs_, targets_, config_.batch); }
  void backward(const GradReadyHook& on_ready) override { model_.backward(on_ready); }

 private:
  TrainConfig config_;
  SyntheticClassification data_;
  ShardedBatches shard_;
  std::unique_ptr<BatchLoader> loader_;
  int64_t next_micro_batch_ = 0;
  const float* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
};

// The transformer on variable-length token sequences: each step's batches come from a BatchPlan that every
// rank computes identically; a batch is padded to its longest row (a sequence, or a packed row of several).
// With gradient accumulation the plan cuts each step into world x micro-batches batches, and micro-batch m of rank
// r is batch m * world + r: a rank's micro-batches interleave with the others' rather than being neighbours, which
// bucketing would make all short or all long.
class TransformerWorkload final : public ModelWorkload<Transformer<float>> {
 public:
  TransformerWorkload(const TrainConfig& c, int rank, int world)
      : ModelWorkload(model_config(c), c.seed),
        config_(c),
        rank_(rank),
        world_(world),
        batching_(parse_batching(c.batching)),
        data_(data_config(c, model_)) {}

  std::string describe() const override {
    const auto& m = model_.config();
    char text[200];
    std::snprintf(text, sizeof text, "transformer %s (%s head, %d layers, d_model %d, %d heads, %.2fM params), "
                  "lengths %s [%d, %d], batching %s", config_.model.c_str(), config_.head.c_str(), m.layers,
                  m.d_model, m.heads, model_.num_parameters() / 1e6, config_.lengths.c_str(), config_.min_len,
                  config_.max_len, config_.batching.c_str());
    return text;
  }

  BatchStats load(int64_t step, int micro) override {
    if (step != step_) begin_step(step);
    const int slot = micro * world_ + rank_;
    const std::vector<int64_t>& ids = plan_->batch(plan_step_, slot);
    const std::vector<int>& rows = plan_->rows(plan_step_, slot);
    batch_ = static_cast<int>(rows.size());
    seq_ = 1;
    for (size_t b = 0, next = 0; b < rows.size(); ++b) {
      int row = 0;
      for (int k = 0; k < rows[b]; ++k) row += data_.length(ids[next++]);
      seq_ = std::max(seq_, row);
    }
    tokens_.assign(static_cast<size_t>(batch_) * seq_, 0);
    if (batching_ == Batching::kPack) positions_.assign(tokens_.size(), 0);
    lengths_.assign(batch_, 0);
    labels_.clear();  // one per sequence: the classifier has one sequence per row
    BatchStats stats;
    for (size_t b = 0, next = 0; b < rows.size(); ++b) {
      for (int k = 0; k < rows[b]; ++k) {  // the row's sequences back to back, each from position 0
        const int64_t id = ids[next++];
        const int len = data_.length(id), at = static_cast<int>(b) * seq_ + lengths_[b];
        data_.fill(tokens_.data() + at, id);
        for (int t = 0; t < len && !positions_.empty(); ++t) positions_[at + t] = t;
        labels_.push_back(data_.label(id));
        lengths_[b] += len;
        stats.max_len = std::max(stats.max_len, static_cast<double>(len));
      }
      stats.useful_tokens += lengths_[b];
    }
    stats.samples = static_cast<double>(ids.size());
    stats.padded_tokens = static_cast<double>(batch_) * seq_;
    micro_scale_ = micro_scales_.at(micro);
    return stats;
  }
  double weight() const override { return weight_; }
  // The loss backward differentiates: the micro-batch's mean scaled by its share of the rank's loss terms (times
  // micro-batches), so that the trainer's mean over micro-batches is the rank's mean over all its terms.
  double forward() override {
    const int32_t* positions = positions_.empty() ? nullptr : positions_.data();
    return micro_scale_ * model_.forward(tokens_.data(), lengths_.data(), labels_.data(), batch_, seq_, positions);
  }
  void backward(const GradReadyHook& on_ready) override {
    model_.backward(on_ready, static_cast<float>(micro_scale_));
  }

 private:
  // Finds the step in the plans (epoch e is a fresh plan; steps run through the epochs back to back) and weighs
  // every micro-batch of this rank. The model's loss is a mean over its loss terms, and the terms of a step are
  // spread over ranks and micro-batches in unequal numbers. Every rank knows every batch (the plan is shared), so:
  // rank weight() = its terms x world / all terms of the step, applied by the Reducer to the accumulated gradient;
  // micro-batch scale = its terms x micro-batches / the rank's terms, applied in backward. With the trainer's
  // 1 / (world x micro-batches) the sum is the gradient of the mean over all the step's terms, as on one rank.
  void begin_step(int64_t step) {
    const int micro_batches = config_.grad_accum;
    while (!plan_ || step - plan_first_step_ >= plan_->num_steps()) {
      const int64_t first = plan_ ? plan_first_step_ + plan_->num_steps() : 0;
      const BatchingConfig batching{batching_, config_.batch, config_.max_tokens, 64};
      plan_ = std::make_unique<BatchPlan>(data_, batching, world_ * micro_batches,
                                          config_.seed + 7919 * static_cast<uint64_t>(epoch_++));
      plan_first_step_ = first;
    }
    step_ = step;
    plan_step_ = step - plan_first_step_;
    auto terms = [&](int slot) {
      int64_t n = 0;
      for (int64_t id : plan_->batch(plan_step_, slot)) n += model_.config().causal() ? data_.length(id) - 1 : 1;
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
  static TransformerConfig model_config(const TrainConfig& c) {
    TransformerConfig m = TransformerConfig::preset(c.model);
    if (c.head != "classify" && c.head != "lm")
      throw std::invalid_argument("unknown --head '" + c.head + "' (expected classify or lm)");
    m.head = c.head == "lm" ? TransformerConfig::Head::kCausalLM : TransformerConfig::Head::kClassify;
    m.max_len = std::max(m.max_len, c.max_len);
    return m;
  }
  static TokenDataConfig data_config(const TrainConfig& c, const Transformer<float>& model) {
    TokenDataConfig d;
    d.vocab = model.config().vocab;
    d.num_classes = model.config().num_classes;
    d.min_len = c.lengths == "fixed" ? c.max_len : c.min_len;
    d.max_len = c.max_len;
    d.dist = parse_length_dist(c.lengths);
    d.outlier_prob = c.outlier_prob;
    d.epoch_size = c.epoch_size;
    d.seed = c.seed;
    return d;
  }

  TrainConfig config_;
  int rank_, world_;
  Batching batching_;
  SyntheticTokens data_;
  std::unique_ptr<BatchPlan> plan_;
  int64_t plan_first_step_ = 0, plan_step_ = 0, step_ = -1;
  int epoch_ = 0;
  int batch_ = 0, seq_ = 1;  // rows and their padded length
  std::vector<int32_t> tokens_, lengths_, labels_, positions_;  // positions_: packing only
  std::vector<double> micro_scales_;
  double weight_ = 1.0, micro_scale_ = 1.0;
};

}  // namespace

std::string grad_piece_name(const std::vector<Parameter<float>>& params, const GradPiece& piece) {
  const Parameter<float>& p = params[piece.param];
  if (piece.numel == p.numel) return p.name;
  const int64_t rows = piece.numel / p.shape[1];
  return p.name + "[" + std::to_string(piece.first_row) + ":" + std::to_string(piece.first_row + rows) + "]";
}

std::unique_ptr<Workload> make_workload(const TrainConfig& config, int rank, int world_size) {
  if (config.model == "mlp") return std::make_unique<MlpWorkload>(config, rank, world_size);
  return std::make_unique<TransformerWorkload>(config, rank, world_size);
}

}  // namespace ddplab
