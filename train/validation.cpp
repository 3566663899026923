#include "train/validation.h"

#include <algorithm>

#include "train/token_batches.h"

namespace ddplab {

ValidationSet::ValidationSet(const TrainConfig& c, int rank, int world)
    : files_(c.val_data, c.max_len),
      rank_(rank),
      world_(world),
      windows_(c.val_windows > 0 ? std::min(c.val_windows, files_.sequences()) : files_.sequences()),
      mine_(windows_ > rank ? (windows_ - rank + world - 1) / world : 0),
      rows_per_batch_(std::max<int64_t>(1, TokenBatches::max_tokens(c) / c.max_len)) {}

void ValidationSet::load(int k) {
  const int64_t first = int64_t{k} * rows_per_batch_;
  rows_ = static_cast<int>(std::min(rows_per_batch_, mine_ - first));
  tokens_.resize(static_cast<size_t>(rows_) * seq());
  for (int r = 0; r < rows_; ++r)
    files_.fill(tokens_.data() + static_cast<size_t>(r) * seq(), (first + r) * world_ + rank_);
}

std::string ValidationSet::describe() const {
  if (windows_ == files_.sequences()) return files_.describe();
  return files_.describe() + ", the first " + std::to_string(windows_);
}

}  // namespace ddplab
