#include "analysis/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "analysis/stats.h"

namespace ddplab {

RunSummary summarize(const RunRecord& run) {
  RunSummary s;
  const int world = run.world_size(), steps = run.steps;
  s.world_size = world;
  s.steps = steps;
  s.global_batch = run.global_batch();
  s.first_steady_step = run.first_steady_step();
  const int counted = s.steady_steps();
  s.arrivals = bucket_arrivals(run, s.first_steady_step);  // one per bucket, steady steps or not
  if (counted <= 0) return s;
  s.time_use = time_use(run, s.first_steady_step);

  s.ranks.resize(world);
  for (int r = 0; r < world; ++r) {
    StepRecord& m = s.ranks[r];
    for (int t = s.first_steady_step; t < steps; ++t)
      for (const StepField& f : kStepFields)
        if (averaged(f.kind)) m.*f.member += run.at(r, t).*f.member;
    // Sum, then divide: equal whole counts average to themselves exactly (128, not 127.99999999999999).
    for (const StepField& f : kStepFields) m.*f.member /= counted;
    if (m.step_ms > s.slowest_step_ms) {
      s.slowest_step_ms = m.step_ms;
      s.slowest_rank = r;
    }
  }
  const int micro_batches = std::max(1, run.config.value("grad_accum", 1));
  for (int r = 0; r < world; ++r) {
    double gather_ms = 0;  // --zero-stage 1's all-gathers, in comm_ms but after backward
    for (int t = s.first_steady_step; t < steps; ++t)
      for (int b = 0; b < static_cast<int>(run.buckets.size()); ++b) {
        const BucketTimes& times = run.bucket_at(r, t, b);
        if (times.gather_end_ms > 0) gather_ms += (times.gather_end_ms - times.gather_start_ms) / counted;
      }
    const StepRecord& m = s.ranks[r];
    s.hidden_fractions.push_back(
        hidden_fraction(m.hidden_comm_ms, last_backward(m, micro_batches), m.comm_ms - gather_ms));
  }
  for (const StepRecord& m : s.ranks) s.samples_per_step += m.samples;
  if (s.samples_per_step <= 0) s.samples_per_step = s.global_batch;
  s.samples_per_s = s.slowest_step_ms > 0 ? s.samples_per_step / (s.slowest_step_ms / 1e3) : 0;

  double useful = 0, padded = 0;
  std::vector<double> step_of_slowest;
  for (int t = s.first_steady_step; t < steps; ++t) {
    double lo = run.at(0, t).step_ms, hi = lo;
    double lo_tokens = run.at(0, t).useful_tokens, hi_tokens = lo_tokens;
    for (int r = 0; r < world; ++r) {
      const StepRecord& x = run.at(r, t);
      lo = std::min(lo, x.step_ms), hi = std::max(hi, x.step_ms);
      lo_tokens = std::min(lo_tokens, x.useful_tokens), hi_tokens = std::max(hi_tokens, x.useful_tokens);
      useful += x.useful_tokens;
      padded += x.padded_tokens;
    }
    s.mean_spread_ms += (hi - lo) / counted;
    step_of_slowest.push_back(hi);
    s.mean_token_spread += (hi_tokens - lo_tokens) / counted;
  }
  s.median_step_ms = median(std::move(step_of_slowest));
  s.final_loss = run.global_loss(steps - 1);
  for (int t = 0; t < steps; ++t)
    if (run.at(0, t).skipped > 0) {
      if (s.skipped_steps++ == 0) s.first_skipped_step = static_cast<int>(run.meta.first_step) + t;
    }
  if (const double cap = run.config.value("grad_clip", 0.0); cap > 0) {
    for (int t = 0; t < steps; ++t) {
      const StepRecord& step = run.at(0, t);
      s.clipped_steps += step.grad_norm > cap;
      if (step.skipped == 0) s.final_grad_norm = step.grad_norm;  // a skipped step took no norm
    }
  }
  for (int t = 0; t < steps; ++t)
    if (!std::isnan(run.at(0, t).val_loss)) {
      s.final_val_loss = run.at(0, t).val_loss;
      s.final_val_step = static_cast<int>(run.meta.first_step) + t;
    }
  if (s.slowest_step_ms > 0) {
    s.useful_tokens_per_s = useful / counted / (s.slowest_step_ms / 1e3);
    s.padded_tokens_per_s = padded / counted / (s.slowest_step_ms / 1e3);
  }
  s.padding_ratio = padded > 0 ? 1 - useful / padded : 0;
  return s;
}

std::string RunSummary::batch_text() const {
  if (samples_per_step == global_batch) return "global batch " + std::to_string(global_batch);
  char text[96];
  std::snprintf(text, sizeof text, "%.1f samples per step (a mean: a token budget, or an epoch's short step)",
                samples_per_step);
  return text;
}

SummarizedRun summarized(RunRecord run) {
  RunSummary summary = summarize(run);
  return {std::move(run), std::move(summary)};
}

double hidden_fraction(double hidden_ms, double hiding_backward_ms, double hideable_comm_ms) {
  const double hideable = std::min(hiding_backward_ms, hideable_comm_ms);
  return hideable > 0 ? hidden_ms / hideable : 1.0;
}

StepRecord mean_over_ranks(const RunSummary& s) {
  StepRecord mean;
  if (s.ranks.empty()) return mean;
  for (const StepRecord& r : s.ranks)
    for (const StepField& f : kStepFields) mean.*f.member += r.*f.member;
  for (const StepField& f : kStepFields) mean.*f.member /= static_cast<double>(s.ranks.size());
  return mean;
}

double mean_hidden_fraction(const RunSummary& s) {
  double sum = 0;
  for (double fraction : s.hidden_fractions) sum += fraction;
  return s.hidden_fractions.empty() ? 0 : sum / s.hidden_fractions.size();
}

nlohmann::json to_json(const RunSummary& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const StepRecord& m = s.ranks[r];
    nlohmann::json rank;
    for (const StepField& f : kStepFields)
      if (averaged(f.kind)) rank[f.name] = m.*f.member;
    rank["hidden_fraction"] = s.hidden_fractions[r];
    if (r < s.time_use.size()) rank["time_use"] = to_json(s.time_use[r]);
    ranks.push_back(rank);
  }
  nlohmann::json arrivals = nlohmann::json::array();
  for (const BucketArrival& a : s.arrivals) arrivals.push_back(to_json(a));
  return {{"world_size", s.world_size},
          {"steps", s.steps},
          {"first_steady_step", s.first_steady_step},
          {"global_batch", s.global_batch},
          {"slowest_rank", s.slowest_rank},
          {"slowest_step_ms", s.slowest_step_ms},
          {"median_step_ms", s.median_step_ms},
          {"samples_per_step", s.samples_per_step},
          {"samples_per_s", s.samples_per_s},
          {"mean_spread_ms", s.mean_spread_ms},
          {"final_loss", s.final_loss},
          {"useful_tokens_per_s", s.useful_tokens_per_s},
          {"padded_tokens_per_s", s.padded_tokens_per_s},
          {"padding_ratio", s.padding_ratio},
          {"mean_token_spread", s.mean_token_spread},
          {"skipped_steps", s.skipped_steps},
          {"first_skipped_step", s.skipped_steps > 0 ? nlohmann::json(s.first_skipped_step) : nlohmann::json()},
          {"clipped_steps", s.clipped_steps},
          {"final_grad_norm", s.final_grad_norm},
          {"final_val_loss", s.final_val_step >= 0 ? nlohmann::json(s.final_val_loss) : nlohmann::json()},
          {"final_val_step", s.final_val_step >= 0 ? nlohmann::json(s.final_val_step) : nlohmann::json()},
          {"ranks", ranks},
          {"bucket_arrival", arrivals}};
}

}  // namespace ddplab
