// The summary of a run: what its steady state (warm-up steps skipped) says, computed in one place from a
// RunRecord — the trainer's in memory, or one read back from a run file — for the run file's `summary`
// attribute, `ddplab report`, the suite's tables and blame, and (through the attribute) the charts.
#pragma once
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/time_use.h"
#include "record/run_record.h"

namespace ddplab {

struct RunSummary {
  int world_size = 1, steps = 0, first_steady_step = 0;
  int64_t global_batch = 0;
  int slowest_rank = 0;
  double slowest_step_ms = 0;  // the slowest rank's mean steady-state step: the run's
  // The median over the steady steps of each step's slowest rank: a step lasts as long as its slowest rank, and
  // a benchmark's median (bench_transformer_cuda's, nccl-tests') compares with this, not with a mean one hiccup moves.
  double median_step_ms = 0;
  // Samples per step over all ranks, the steady-state mean of what the ranks recorded: the global batch, except
  // where the batching fills a token budget (--batching token, pack), which varies it; files that did not record
  // samples count the global batch.
  double samples_per_step = 0;
  double samples_per_s = 0;    // samples_per_step / slowest rank's mean step
  double mean_spread_ms = 0;   // mean over steady steps of (max - min) step time across ranks
  double final_loss = 0;       // the last step's loss on the global batch (RunRecord::global_loss)
  // Token workloads (zero for the MLP): global tokens per step over the slowest rank's mean step.
  double useful_tokens_per_s = 0, padded_tokens_per_s = 0;
  double padding_ratio = 0;      // 1 - useful / padded, over the steady steps and all ranks
  double mean_token_spread = 0;  // mean over steady steps of (max - min) useful tokens across ranks
  // Steps whose update --skip-nonfinite skipped, over the whole run (warm-up included; every rank agrees), and the
  // first of them (-1: none).
  int skipped_steps = 0, first_skipped_step = -1;
  // --grad-clip (the config's grad_clip > 0): the steps whose gradient norm exceeded the cap (whole run; every rank
  // takes the same norm), and the norm of the last step that was not skipped.
  int clipped_steps = 0;
  double final_grad_norm = 0;
  // --val-data: the last validation loss and its step; NaN and -1 where the run never validated.
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  int final_val_step = -1;
  // Per rank, the steady-state mean of every StepRecord field (start_ms, a point in time, stays zero); empty
  // when there are no steps.
  std::vector<StepRecord> ranks;
  // Per rank: the share of the communication that backward could have hidden which it did (hidden_fraction).
  std::vector<double> hidden_fractions;
  // Per rank: comm-compute overlap and idle time (analysis/time_use.h); per bucket: its arrival spread across ranks.
  std::vector<RankTimeUse> time_use;
  std::vector<BucketArrival> arrivals;

  int steady_steps() const { return steps - first_steady_step; }
  // "global batch 256", or "111.3 samples per step" where steps differ: a token budget, or an epoch that ends short.
  std::string batch_text() const;
};

RunSummary summarize(const RunRecord& run);

// A run with its summary: what run_training() returns on rank 0, and what `ddplab report` reads.
struct SummarizedRun {
  RunRecord record;
  RunSummary summary;
};
SummarizedRun summarized(RunRecord run);

// Share of the communication that could have been hidden which was: hidden / min(the backward that can hide it,
// the communication it can hide) — the last micro-batch's backward, which runs beside the buckets (last_backward():
// the summary takes the measured one, the predictor its modelled one), and the
// buckets' all-reduces or reduce-scatters (--zero-stage 1's all-gathers follow the update). 1 when there was nothing
// to hide. `ddplab report` and `ddplab predict` both print it as hidden%.
double hidden_fraction(double hidden_ms, double hiding_backward_ms, double hideable_comm_ms);
// Over ranks: the mean of the per-rank means, and of their hidden fractions.
StepRecord mean_over_ranks(const RunSummary& s);
double mean_hidden_fraction(const RunSummary& s);

// What the run file stores as `summary` (docs/RUN_FILE.md): every field above, and per rank every StepRecord
// field but start_ms, plus hidden_fraction and time_use; and bucket_arrival.
nlohmann::json to_json(const RunSummary& s);

}  // namespace ddplab
