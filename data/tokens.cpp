#include "data/tokens.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <stdexcept>

#include "kernels/cpu/rng.h"

namespace ddplab {
namespace {
enum Stream : uint64_t { kLength = 1, kOutlier = 2, kLabel = 3, kTokens = 4 };

// Splits `ids` into `parts` consecutive slices whose sizes differ by at most one.
std::vector<std::vector<int64_t>> split_even(const std::vector<int64_t>& ids, int parts) {
  std::vector<std::vector<int64_t>> out(parts);
  const size_t n = ids.size();
  for (int p = 0; p < parts; ++p) out[p].assign(ids.begin() + n * p / parts, ids.begin() + n * (p + 1) / parts);
  return out;
}

// Best-fit decreasing: the longest sequence first, each into the fullest row that still has room for it, or else a
// new row. The short sequences fill the long ones' gaps, so rows come out nearly full, and no sequence is cut.
std::vector<std::vector<int64_t>> pack_into_rows(std::vector<int64_t> ids, const TokenSource& data, int row_len) {
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return data.length(a) > data.length(b); });
  std::vector<std::vector<int64_t>> rows;
  std::multimap<int, size_t> open;  // room left -> row, for the rows that can still take the shortest sequence
  for (int64_t id : ids) {
    const int len = data.length(id);
    size_t row = rows.size();
    int room = row_len;
    if (auto it = open.lower_bound(len); it != open.end()) {  // the least room that fits
      room = it->first;
      row = it->second;
      open.erase(it);
    } else {
      rows.emplace_back();
    }
    rows[row].push_back(id);
    room -= len;
    if (room >= data.min_len()) open.emplace(room, row);
  }
  return rows;
}

using StepIds = std::vector<std::vector<int64_t>>;  // a step's ids, [rank], one sequence per row

// Steps of `global` sequences in `order`, each split evenly across the ranks.
std::vector<StepIds> even_steps(const std::vector<int64_t>& order, int64_t global, int world) {
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<StepIds> steps;
  for (int64_t k = 0; k < n; k += global) {
    const std::vector<int64_t> chunk(order.begin() + k, order.begin() + std::min(n, k + global));
    steps.push_back(split_even(chunk, world));
  }
  return steps;
}

// Similar lengths together: sorted by length within windows, so that the epoch stays shuffled overall.
void sort_within_windows(std::vector<int64_t>& order, const TokenSource& data, int64_t window) {
  const int64_t n = static_cast<int64_t>(order.size());
  for (int64_t k = 0; k < n; k += window) {
    const auto begin = order.begin() + k, end = order.begin() + std::min(n, k + window);
    std::stable_sort(begin, end, [&](int64_t a, int64_t b) { return data.length(a) < data.length(b); });
  }
}

// Greedy packing: a rank batch takes sequences while count x longest stays within max_tokens (at least one).
std::vector<StepIds> token_budget_steps(const std::vector<int64_t>& order, const TokenSource& data, int64_t max_tokens,
                                        int world) {
  std::vector<std::vector<int64_t>> rank_batches;
  std::vector<int64_t> current;
  int longest = 0;
  for (int64_t id : order) {
    const int len = data.length(id);
    const int64_t padded = static_cast<int64_t>(current.size() + 1) * std::max(longest, len);
    if (!current.empty() && padded > max_tokens) {
      rank_batches.push_back(std::move(current));
      current.clear();
      longest = 0;
    }
    current.push_back(id);
    longest = std::max(longest, len);
  }
  if (!current.empty()) rank_batches.push_back(std::move(current));
  std::vector<StepIds> steps;
  for (size_t k = 0; k < rank_batches.size(); k += world) {
    StepIds step(world);
    for (int r = 0; r < world && k + r < rank_batches.size(); ++r) step[r] = std::move(rank_batches[k + r]);
    steps.push_back(std::move(step));
  }
  return steps;
}

}  // namespace

SyntheticTokens::SyntheticTokens(const TokenDataConfig& c) : config_(c) {
  if (c.vocab < 2 || c.num_classes < 1 || c.min_len < 1 || c.max_len < c.min_len || c.epoch_size < 1)
    throw std::invalid_argument("token data: need vocab >= 2, classes >= 1, 1 <= min_len <= max_len, epoch_size >= 1");
}

int SyntheticTokens::length(int64_t i) const {
  const auto& c = config_;
  if (c.dist == LengthDist::kFixed || uniform01(substream(c.seed, kOutlier), i) < c.outlier_prob) return c.max_len;
  const double u = uniform01(substream(c.seed, kLength), i);
  double len = c.min_len + u * (c.max_len - c.min_len + 1);
  if (c.dist == LengthDist::kLogUniform)
    len = std::exp(std::log(c.min_len) + u * (std::log(c.max_len + 1.0) - std::log(c.min_len)));
  return std::clamp(static_cast<int>(len), c.min_len, c.max_len);
}

int32_t SyntheticTokens::label(int64_t i) const {
  return static_cast<int32_t>(hash64(substream(config_.seed, kLabel), i) % config_.num_classes);
}

void SyntheticTokens::fill(int32_t* tokens, int64_t i) const {
  const auto& c = config_;
  const int32_t y = label(i);
  const int64_t band = std::max(1, c.vocab / c.num_classes);
  const uint64_t seed = substream(substream(c.seed, kTokens), i);
  const int n = length(i);
  for (int t = 0; t < n; ++t) {
    const uint64_t h = hash64(seed, t);
    const double u = static_cast<double>(h >> 11) * 0x1.0p-53;
    int64_t token;
    if (t > 0 && u < 0.5) {
      token = (tokens[t - 1] * 31LL + 7LL * y + 1) % c.vocab;  // a predictable next token
    } else if (u < 0.8) {
      token = (band * y + static_cast<int64_t>(h % band)) % c.vocab;  // the class's band
    } else {
      token = static_cast<int64_t>(h % c.vocab);
    }
    tokens[t] = static_cast<int32_t>(token);
  }
}

std::string SyntheticTokens::describe() const {
  if (config_.dist == LengthDist::kFixed) return "lengths fixed " + std::to_string(config_.max_len);
  return std::string("lengths ") + to_string(config_.dist) + " [" + std::to_string(config_.min_len) + ", " +
         std::to_string(config_.max_len) + "]";
}

BatchPlan::BatchPlan(const TokenSource& data, const BatchingConfig& config, int world, uint64_t epoch_seed)
    : data_(data) {
  if (world < 1 || config.batch < 1 || config.max_tokens < 1 || config.window < 1)
    throw std::invalid_argument("batch plan: world, batch, max_tokens and window must be positive");
  const int64_t n = data.sequences();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(epoch_seed);  // the same sequence on every rank: the plan is never communicated
  std::shuffle(order.begin(), order.end(), rng);

  if (config.strategy == Batching::kPack) {
    std::vector<std::vector<int64_t>> rows = pack_into_rows(order, data, data.max_len());
    std::shuffle(rows.begin(), rows.end(), rng);  // the same row order on every rank
    add_packed_steps(rows, std::max<int64_t>(1, config.max_tokens / data.max_len()) * world, world);
    return;
  }
  // The other strategies cut [step][rank] lists of ids, one sequence per row.
  const int64_t global = static_cast<int64_t>(world) * config.batch;
  if (config.strategy == Batching::kSample) {
    add_steps(even_steps(order, global, world));
    return;
  }
  sort_within_windows(order, data, global * config.window);
  std::vector<StepIds> steps = config.strategy == Batching::kBucket
                                   ? even_steps(order, global, world)
                                   : token_budget_steps(order, data, config.max_tokens, world);
  std::shuffle(steps.begin(), steps.end(), rng);  // the same batch order on every rank
  add_steps(std::move(steps));
}

// Steps of `per_step` packed rows, split evenly across the ranks.
void BatchPlan::add_packed_steps(const std::vector<std::vector<int64_t>>& rows, int64_t per_step, int world) {
  for (int64_t k = 0; k < static_cast<int64_t>(rows.size()); k += per_step) {
    const int64_t m = std::min<int64_t>(per_step, rows.size() - k);  // rows of this step, split evenly
    std::vector<RankBatch> step(world);
    for (int r = 0; r < world; ++r) {
      for (int64_t i = k + m * r / world; i < k + m * (r + 1) / world; ++i) {
        step[r].ids.insert(step[r].ids.end(), rows[i].begin(), rows[i].end());
        step[r].rows.push_back(static_cast<int>(rows[i].size()));
      }
    }
    steps_.push_back(std::move(step));
  }
}

void BatchPlan::add_steps(std::vector<std::vector<std::vector<int64_t>>>&& steps) {
  for (auto& step : steps) {
    std::vector<RankBatch> batches(step.size());
    for (size_t r = 0; r < step.size(); ++r) {
      batches[r].rows.assign(step[r].size(), 1);
      batches[r].ids = std::move(step[r]);
    }
    steps_.push_back(std::move(batches));
  }
}

int64_t BatchPlan::useful_tokens(int64_t step, int rank) const {
  int64_t sum = 0;
  for (int64_t id : batch(step, rank)) sum += data_.length(id);
  return sum;
}

int64_t BatchPlan::padded_tokens(int64_t step, int rank) const {
  const std::vector<int64_t>& ids = batch(step, rank);
  int64_t longest = 0;
  size_t next = 0;
  for (int count : rows(step, rank)) {
    int64_t row = 0;
    for (int k = 0; k < count; ++k) row += data_.length(ids[next++]);
    longest = std::max(longest, row);
  }
  return static_cast<int64_t>(rows(step, rank).size()) * longest;
}

}  // namespace ddplab
