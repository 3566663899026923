// Synthetic token sequences of variable length, and the batching strategies of the token-skew lab.
//
// Sequence i has a length drawn from a chosen distribution, a class label, and tokens that depend on the label
// (a class prefers its own band of the vocabulary, and the next token often follows from the previous one), so
// both heads of the transformer have something to learn. Everything is a pure function of (seed, i).
//
// A BatchPlan cuts one epoch of sequences into steps, identically on every rank (it is computed from the seed,
// not communicated): step s gives every rank its list of sequence ids, laid out in rows (one sequence per row, or
// several back to back when packing). Every sequence of the epoch appears exactly once; a rank may get an empty
// batch in the epoch's short step: its last with sample and pack batching, anywhere with bucket and token batching,
// which shuffle the epoch's steps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/choices.h"

namespace ddplab {

enum class LengthDist { kFixed, kUniform, kLogUniform };
constexpr std::array<Named<LengthDist>, 3> choice_names(LengthDist) {
  return {{{LengthDist::kFixed, "fixed"}, {LengthDist::kUniform, "uniform"}, {LengthDist::kLogUniform, "loguniform"}}};
}

struct TokenDataConfig {
  int vocab = 8192;
  int num_classes = 16;
  int min_len = 64, max_len = 256;
  LengthDist dist = LengthDist::kLogUniform;
  double outlier_prob = 0.08;  // this share of sequences has length max_len
  int64_t epoch_size = 1 << 16;
  uint64_t seed = 1234;
};

// Where the transformer's sequences come from: one epoch of them, each a pure function of its index, so that every
// rank reads any sequence of the plan alike without communicating. Synthetic sequences (below) or token shards
// (data/token_files.h).
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t sequences() const = 0;  // per epoch
  virtual int min_len() const = 0;        // the shortest and longest sequence
  virtual int max_len() const = 0;
  virtual int length(int64_t i) const = 0;
  virtual int32_t label(int64_t i) const = 0;  // the classify head's target
  // tokens[0 .. length(i)) of sequence i.
  virtual void fill(int32_t* tokens, int64_t i) const = 0;
  virtual std::string describe() const = 0;  // for the run header: "lengths loguniform [64, 256]"
};

class SyntheticTokens : public TokenSource {
 public:
  explicit SyntheticTokens(const TokenDataConfig& config);
  const TokenDataConfig& config() const { return config_; }
  int64_t sequences() const override { return config_.epoch_size; }
  int min_len() const override { return config_.min_len; }
  int max_len() const override { return config_.max_len; }
  int length(int64_t i) const override;
  int32_t label(int64_t i) const override;
  void fill(int32_t* tokens, int64_t i) const override;
  std::string describe() const override;

 private:
  TokenDataConfig config_;
};

enum class Batching {
  kSample,  // a fixed number of sequences per rank per step, in shuffled order
  kBucket,  // sort by length (within windows), cut into global batches, shuffle the batch order
  kToken,   // like bucket, but each rank's batch is packed up to a padded-token budget
  kPack,    // sequences concatenated into rows of max_len tokens (best-fit decreasing), a token budget of rows
};
constexpr std::array<Named<Batching>, 4> choice_names(Batching) {
  return {{{Batching::kSample, "sample"}, {Batching::kBucket, "bucket"}, {Batching::kToken, "token"},
           {Batching::kPack, "pack"}}};
}

struct BatchingConfig {
  Batching strategy = Batching::kSample;
  int batch = 32;            // sequences per rank per step (sample, bucket)
  int64_t max_tokens = 8192;  // padded tokens per rank per step (token): count x longest <= max_tokens;
                              // pack: max(1, max_tokens / max_len) rows per rank per step
  int window = 64;           // bucket/token: sort by length within windows of window x (global batch) sequences
};

// One epoch cut into steps for `world_size` ranks.
class BatchPlan {
 public:
  BatchPlan(const TokenSource& data, const BatchingConfig& config, int world_size, uint64_t epoch_seed);
  // The least memory a plan takes per sequence of its epoch while it is made: the shuffled order and the steps' ids,
  // an int64 each (the rows come on top, and at an epoch's end the previous plan).
  static constexpr int64_t kLeastBytesPerSequence = 2 * sizeof(int64_t);
  int64_t num_steps() const { return static_cast<int64_t>(steps_.size()); }
  // Sequence ids of rank r at step s, row by row.
  const std::vector<int64_t>& batch(int64_t step, int rank) const { return steps_.at(step).at(rank).ids; }
  // How many of those sequences each row holds, in order: all 1 except when packing.
  const std::vector<int>& rows(int64_t step, int rank) const { return steps_.at(step).at(rank).rows; }
  // Useful (real) tokens of every rank at a step (the next-token loss averages over one fewer per sequence).
  int64_t useful_tokens(int64_t step, int rank) const;
  int64_t padded_tokens(int64_t step, int rank) const;  // rows x longest row: what the model computes on

 private:
  struct RankBatch {
    std::vector<int64_t> ids;
    std::vector<int> rows;
  };
  void add_packed_steps(const std::vector<std::vector<int64_t>>& rows, int64_t per_step, int world);
  void add_steps(std::vector<std::vector<std::vector<int64_t>>>&& steps);  // [step][rank] ids, a sequence per row
  const TokenSource& data_;
  std::vector<std::vector<RankBatch>> steps_;  // [step][rank]
};

}  // namespace ddplab
