#include "train/workload.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "data/loader.h"
#include "data/synthetic.h"
#include "model/transformer.h"
#include "train/token_batches.h"

namespace ddplab {
namespace {

// What every workload answers from its model alone (Mlp<float> and Transformer<float> share these calls).
template <typename Model>
class ModelWorkload : public Workload {
 public:
  int64_t flat_size() const override { return model_.flat_size(); }
  float* flat_params() override { return model_.flat_params(); }
  float* flat_grads() override { return model_.flat_grads(); }
  void place_grads(float* storage) override { model_.place_grads(storage); }
  void place_params(float* storage) override { model_.place_params(storage); }
  const std::vector<GradPiece>& grad_pieces() const override { return model_.grad_pieces(); }
  const std::vector<Parameter<float>>& parameters() const override { return model_.parameters(); }
  void set_grad_piece_elements(int64_t n) override { model_.set_grad_piece_elements(n); }
  void discard_grad() override { model_.discard_grad(); }

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
    std::snprintf(text, sizeof text, "MLP %d-%dx%d-%d (%.2fM params)", m.input_dim, m.hidden_dim, m.num_hidden_layers,
                  m.num_classes, model_.num_parameters() / 1e6);
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
            return shard_.first_sample(m / k, static_cast<int>(m % k), config_.batch);
          });
      next_micro_batch_ = j;
    }
    if (j != next_micro_batch_++) throw std::logic_error("MlpWorkload: micro-batches must be loaded in sequence");
    loader_->next(&inputs_, &targets_);
    return BatchStats{static_cast<double>(config_.batch), 0, 0, 0, static_cast<double>(config_.batch)};
  }
  double forward() override { return model_.forward(inputs_, targets_, config_.batch); }
  void backward(const GradReadyHook& on_ready) override { model_.backward(on_ready); }
  double evaluate(const int32_t*, int, int) override {
    throw std::logic_error("the MLP has no validation pass (--val-data is the transformer's)");
  }

 private:
  TrainConfig config_;
  SyntheticClassification data_;
  ShardedBatches shard_;
  std::unique_ptr<BatchLoader> loader_;
  int64_t next_micro_batch_ = 0;
  const float* inputs_ = nullptr;
  const int32_t* targets_ = nullptr;
};

// The transformer on variable-length token sequences (train/token_batches.h).
class TransformerWorkload final : public ModelWorkload<Transformer<float>> {
 public:
  TransformerWorkload(const TrainConfig& c, int rank, int world)
      : ModelWorkload(TokenBatches::model_config(c), c.seed), batches_(c, model_.config(), rank, world) {}

  std::string describe() const override { return batches_.describe(model_.num_parameters()); }
  BatchStats load(int64_t step, int micro) override {
    const BatchStats stats = batches_.load(step, micro);
    loaded_terms_ = static_cast<int64_t>(stats.loss_terms);
    return stats;
  }
  double weight() const override { return batches_.weight(); }
  // The loss backward differentiates: the micro-batch's mean scaled by its share of the rank's loss terms (times
  // micro-batches), so that the trainer's mean over micro-batches is the rank's mean over all its terms.
  double forward() override {
    const TokenBatches& b = batches_;
    const double mean =
        model_.forward(b.tokens().data(), b.lengths().data(), b.labels().data(), b.rows(), b.seq(), b.positions());
    // The weights count each sequence's terms by loss_terms(length), the loss by the targets the model made: were
    // they to differ, every rank's share of the global mean would be silently off.
    if (model_.loss_count() != loaded_terms_)
      throw std::logic_error("the model's loss is a mean over " + std::to_string(model_.loss_count()) +
                             " targets, the batch's weights count " + std::to_string(loaded_terms_));
    return b.micro_scale() * mean;
  }
  void backward(const GradReadyHook& on_ready) override {
    model_.backward(on_ready, static_cast<float>(batches_.micro_scale()));
  }
  double evaluate(const int32_t* tokens, int rows, int seq) override {
    return model_.forward(tokens, nullptr, nullptr, rows, seq);
  }

 private:
  TokenBatches batches_;
  int64_t loaded_terms_ = 0;  // the loaded micro-batch's loss terms, as the weights count them
};

}  // namespace

std::string grad_piece_name(const std::vector<Parameter<float>>& params, const GradPiece& piece) {
  const Parameter<float>& p = params[piece.param];
  if (piece.numel == p.numel) return p.name;
  const int64_t rows = piece.numel / p.shape[1];
  return p.name + "[" + std::to_string(piece.first_row) + ":" + std::to_string(piece.first_row + rows) + "]";
}

std::unique_ptr<Workload> make_workload(const TrainConfig& config, int rank, int world_size) {
  if (!config.transformer()) return std::make_unique<MlpWorkload>(config, rank, world_size);
  return std::make_unique<TransformerWorkload>(config, rank, world_size);
}

}  // namespace ddplab
