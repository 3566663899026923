// The validation loss's data (--val-data): the first --val-windows windows of its token shards (all by default), in
// the training windows' length, window i on rank i % world, in batches of as many rows as a training micro-batch may
// hold (so that a device model sized for training holds them). The ranks' losses are summed term by term
// (Trainer::validation_loss), so the result is the mean over every window's terms, the same at any world size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "data/token_files.h"

namespace ddplab {

class ValidationSet {
 public:
  // Throws std::invalid_argument as TokenFiles does.
  ValidationSet(const TrainConfig& config, int rank, int world);

  int batches() const { return static_cast<int>((mine_ + rows_per_batch_ - 1) / rows_per_batch_); }
  // Lays out batch k of this rank: rows() full rows of seq() tokens.
  void load(int k);
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int rows() const { return rows_; }
  int seq() const { return files_.max_len(); }
  // "data val.bin (0.03M tokens in 1 shard, 238 windows of 128)[, the first 50]": the run header's words.
  std::string describe() const;

 private:
  TokenFiles files_;
  int rank_, world_;
  int64_t windows_;  // the first windows_ windows of the shards
  int64_t mine_;     // of them, this rank's: rank, rank + world, ...
  int64_t rows_per_batch_;
  int rows_ = 0;
  std::vector<int32_t> tokens_;
};

}  // namespace ddplab
