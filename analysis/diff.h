// `ddplab diff A.h5 B.h5`: what changed between two runs: the settings that differ, the step and each phase as a
// median with its spread, each bucket's communication, which differences are beyond the noise, one verdict line,
// and whether the two computed the same losses, bit for bit.
// Pure: records in, a RunDiff out (docs/REPORTS.md, "ddplab diff").
#pragma once
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "record/run_record.h"

namespace ddplab {

// A metric over one run's steady steps: the median and the robust spread (1.4826 x MAD) of its per-step samples,
// their least and greatest, and how many there are.
struct Sampled {
  double median = 0, spread = 0;
  double min = 0, max = 0;
  int count = 0;
};
Sampled sampled(const std::vector<double>& samples);

// The noise rule: B's median differs from A's beyond the noise when the difference is more than floor_ms (what is too
// small to matter: a share of the step) and either more than kNoiseSpreads x the combined spread
// sqrt(spread_A^2 + spread_B^2), or the runs are apart: every sample of one above every sample of the other, with
// kApartSamples each at least (steps that scatter widely, yet all of B's slower than all of A's, differ).
inline constexpr double kNoiseSpreads = 3.0;
inline constexpr double kNoiseFloorShare = 0.02;  // of the longer of the two median steps
inline constexpr double kNoiseFloorMs = 0.05;     // at least: the timer and the scheduler
inline constexpr int kApartSamples = 8;           // by chance alone, 8 of each are apart once in 6435 pairs of runs
double noise_bound_ms(const Sampled& a, const Sampled& b);  // kNoiseSpreads x sqrt(spread_A^2 + spread_B^2)
bool apart(const Sampled& a, const Sampled& b);
bool beyond_noise(const Sampled& a, const Sampled& b, double floor_ms);

struct MetricDiff {
  std::string name;                             // "step", "exposed comm", ...
  bool phase = false;                           // a part of the step (the verdict names phases)
  Sampled a, b;                                 // over steady steps
  double rank_spread_a = 0, rank_spread_b = 0;  // median over steady steps of (max - min) across ranks
  double mean_a = 0, mean_b = 0;                // over steady steps: a phase of every k-th step has a median of 0
  bool beyond = false;
  double delta() const { return b.median - a.median; }
  // A cost of some steps only (20 ms every 4th step: median 0, mean 5): in either run the mean is away from the median
  // beyond the noise rule's bound and floor.
  bool median_misses(double floor_ms) const;
};

struct ConfigChange {
  std::string key;
  nlohmann::json a, b;  // null where the run's config lacks the key
};

// One bucket's all-reduce time (comm end - comm start), over ranks and steady steps.
struct BucketDiff {
  int64_t bytes_a = 0, bytes_b = 0;  // 0: the run has no such bucket
  Sampled a, b;
  bool beyond = false;  // compared only where both runs cut the gradients into the same buckets
};

// Every rank's loss, step by step, over the steps both runs recorded (by step number: a resumed run's start at its
// checkpoint's step), compared bit for bit: whether the two runs computed alike (--deterministic on, a resume, a
// change of what only moves time: bucket size, overlap, a straggler), and if not, from which step on. Runs of
// different world sizes are compared on the global-batch loss (RunRecord::global_loss; in files without the ranks'
// loss terms, where every rank's shard held as many samples and tokens): one rank against N with the same global
// batch, DDP's equivalence.
struct LossDiff {
  bool compared() const { return not_compared.empty(); }
  bool rank_means = false;  // compared the global-batch loss (the world sizes differ); rank below is then -1
  // Why not ("": compared): no step is common to both, or the world sizes differ, some rank's shard was of another
  // size and a file does not hold the ranks' loss terms to weigh them by.
  std::string not_compared = "not yet";
  int64_t first = 0, count = 0;   // the common steps: [first, first + count)
  int64_t first_difference = -1;  // the first common step at which some rank's loss differs; -1: none
  int rank = 0;                   // that step's first rank that differs
  double a = 0, b = 0;            // its losses there
  double max_relative = 0;  // over the common steps and ranks: |b - a| / max(|a|, |b|) (NaN against a number: inf)
};

struct RunDiff {
  std::string path_a, path_b;
  std::vector<ConfigChange> config;
  double floor_ms = 0;
  int steady_a = 0, steady_b = 0;  // steady steps each run's medians and spreads come from
  bool noise_known() const { return std::min(steady_a, steady_b) >= 2; }  // one step has no spread: nothing is beyond
  std::vector<MetricDiff> metrics;  // the step first, then the phases, compute and the comm thread's time
  bool same_buckets = false;
  std::vector<BucketDiff> buckets;  // bucket by bucket, up to the larger count
  std::string verdict;
  LossDiff loss;
};

RunDiff diff_runs(const RunRecord& a, const RunRecord& b);
// The losses alone (RunDiff::loss): what the lab suite asks of its cases against their baseline.
LossDiff compare_losses(const RunRecord& a, const RunRecord& b);
void print_diff(std::FILE* out, const RunDiff& d);
nlohmann::json to_json(const RunDiff& d);

}  // namespace ddplab
