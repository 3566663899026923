// The rank-0 summary of a run, computed from every rank's step records (steady state: warm-up steps skipped).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/step_record.h"

namespace ddplab {

struct RankMeans {
  double step_ms = 0, data_ms = 0, forward_ms = 0, backward_ms = 0, allreduce_ms = 0, optimizer_ms = 0;
  double compute_ms() const { return forward_ms + backward_ms; }
};

struct RunSummary {
  int world_size = 1, steps = 0, first_steady_step = 0, global_batch = 0;
  int slowest_rank = 0;
  double slowest_step_ms = 0;   // the slowest rank's mean steady-state step: it sets the pace
  double samples_per_s = 0;     // global batch / slowest rank's mean step
  double mean_spread_ms = 0;    // mean over steady steps of (max - min) step time across ranks
  double final_loss = 0;        // mean over ranks of the last step's loss (= loss on the global batch)
  std::vector<RankMeans> ranks;
};

// records: world_size * steps, rank-major. warmup_steps is clamped so that at least one step counts.
RunSummary summarize(const std::vector<StepRecord>& records, int world_size, int steps, int warmup_steps,
                     int global_batch);
nlohmann::json to_json(const RunSummary& s);
void print_summary(std::FILE* out, const RunSummary& s, const std::vector<std::string>& hostnames);

}  // namespace ddplab
