// One rank's micro-batches of the transformer workloads, shared by the CPU (train/workload.cpp) and GPU
// (train/cuda_workload.cpp) paths so both train on the same data with the same weighting.
//
// Each step's batches come from a BatchPlan that every rank computes identically; a batch is padded to its longest
// row (a sequence, or a packed row of several). With gradient accumulation the plan cuts each step into
// world x micro-batches batches, and micro-batch m of rank r is batch m * world + r: a rank's micro-batches
// interleave with the others' rather than being neighbours, which bucketing would make all short or all long.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokens.h"
#include "config/train_config.h"
#include "train/batch_stats.h"
#include "model/transformer.h"

namespace ddplab {

class TokenBatches {
 public:
  // model: the transformer's config (its vocabulary, classes and head shape the data and the loss terms).
  TokenBatches(const TrainConfig& config, const TransformerConfig& model, int rank, int world);
  TokenBatches(const TokenBatches&) = delete;  // the plans refer to the data source it holds
  TokenBatches& operator=(const TokenBatches&) = delete;

  // The transformer a TrainConfig asks for: the preset, its head, max_len at least --max-len. Throws
  // std::invalid_argument for an unknown head.
  static TransformerConfig model_config(const TrainConfig& config);
  // "transformer tiny (classify head, ...), lengths ..., batching ...": the run header's line.
  std::string describe(int64_t num_parameters) const;

  // Lays out micro-batch `micro` of step `step` (steps in ascending order, a step's micro-batches from 0).
  BatchStats load(int64_t step, int micro);
  int rows() const { return rows_; }
  int seq() const { return seq_; }                                  // the padded length of every row
  const std::vector<int32_t>& tokens() const { return tokens_; }    // [rows, seq]
  const std::vector<int32_t>& lengths() const { return lengths_; }  // [rows]
  const std::vector<int32_t>& labels() const { return labels_; }    // one per sequence
  const int32_t* positions() const { return positions_.empty() ? nullptr : positions_.data(); }  // packing only
  // This rank's share of the step's global mean loss (Workload::weight), valid after load(step, 0).
  double weight() const { return weight_; }
  // The loaded micro-batch's share of the rank's loss terms, times the micro-batches: the factor on its mean loss
  // (and its gradient) that makes the mean over micro-batches the rank's mean over all its terms.
  double micro_scale() const { return micro_scale_; }

  // The largest micro-batch a step of `config` can load: rows x seq <= max_tokens(config), seq <= max_seq(config).
  static int64_t max_tokens(const TrainConfig& config);
  static int max_seq(const TrainConfig& config) { return config.max_len; }
  // The longest sequence an epoch holds, which a long enough run meets: --max-len for token shards (every window is
  // that long), else the longest synthetic one among the epoch's first 2^20 (past them, no longer by a measurable
  // share).
  static int longest_sequence(const TrainConfig& config);

 private:
  void begin_step(int64_t step);

  TrainConfig config_;
  TransformerConfig model_;
  int rank_, world_;
  Batching batching_;
  std::unique_ptr<TokenSource> data_;  // --data's shards, or synthetic sequences
  std::unique_ptr<BatchPlan> plan_;
  int64_t plan_first_step_ = 0, plan_step_ = 0, step_ = -1;
  int epoch_ = 0;
  int rows_ = 0, seq_ = 1;                                      // rows and their padded length
  std::vector<int32_t> tokens_, lengths_, labels_, positions_;  // positions_: packing only
  std::vector<double> micro_scales_;
  double weight_ = 1.0, micro_scale_ = 1.0;
};

}  // namespace ddplab
