// The rank-0 summary of a run, computed from every rank's step records (steady state: warm-up steps skipped).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "record/step_record.h"

namespace ddplab {

struct RunSummary {
  int world_size = 1, steps = 0, first_steady_step = 0, global_batch = 0;
  int slowest_rank = 0;
  double slowest_step_ms = 0;  // the slowest rank's mean steady-state step: it sets the pace
  double samples_per_s = 0;    // global batch / slowest rank's mean step
  double mean_spread_ms = 0;   // mean over steady steps of (max - min) step time across ranks
  double final_loss = 0;       // mean over ranks of the last step's loss (= loss on the global batch)
  // Token workloads (zero for the MLP): global tokens per step over the slowest rank's mean step.
  double useful_tokens_per_s = 0, padded_tokens_per_s = 0;
  double padding_ratio = 0;         // 1 - useful / padded, over the steady steps and all ranks
  double mean_token_spread = 0;     // mean over steady steps of (max - min) useful tokens across ranks
  // Per rank, the steady-state mean of every StepRecord field (start_ms excepted: it is meaningless as a mean).
  std::vector<StepRecord> ranks;
};

// Share of the communication that could have been hidden which was: hidden / min(backward, comm). 1 when there
// was nothing to hide.
double hidden_fraction(const StepRecord& means);

// records: world_size * steps, rank-major. warmup_steps is clamped so that at least one step counts.
RunSummary summarize(const std::vector<StepRecord>& records, int world_size, int steps, int warmup_steps,
                     int global_batch);
nlohmann::json to_json(const RunSummary& s);
void print_summary(std::FILE* out, const RunSummary& s, const std::vector<std::string>& hostnames);

}  // namespace ddplab
