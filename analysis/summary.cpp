#include "analysis/summary.h"

#include <algorithm>
#include <cstring>

namespace ddplab {

double hidden_fraction(const StepRecord& m) {
  const double hideable = std::min(m.backward_ms, m.comm_ms);
  return hideable > 0 ? m.hidden_comm_ms / hideable : 1.0;
}

RunSummary summarize(const std::vector<StepRecord>& records, int world_size, int steps, int warmup_steps,
                     int global_batch) {
  RunSummary s;
  s.world_size = world_size;
  s.steps = steps;
  s.global_batch = global_batch;
  s.first_steady_step = std::clamp(warmup_steps, 0, std::max(steps - 1, 0));
  const int counted = steps - s.first_steady_step;
  if (counted <= 0) return s;
  auto at = [&](int rank, int step) -> const StepRecord& { return records[static_cast<size_t>(rank) * steps + step]; };

  s.ranks.resize(world_size);
  for (int r = 0; r < world_size; ++r) {
    StepRecord& m = s.ranks[r];
    for (int t = s.first_steady_step; t < steps; ++t)
      for (const auto& [name, field] : kStepFields) m.*field += at(r, t).*field / counted;
    m.start_ms = 0;
    if (m.step_ms > s.slowest_step_ms) {
      s.slowest_step_ms = m.step_ms;
      s.slowest_rank = r;
    }
  }
  s.samples_per_s = s.slowest_step_ms > 0 ? global_batch / (s.slowest_step_ms / 1e3) : 0;

  for (int t = s.first_steady_step; t < steps; ++t) {
    double lo = at(0, t).step_ms, hi = lo;
    for (int r = 1; r < world_size; ++r) {
      lo = std::min(lo, at(r, t).step_ms);
      hi = std::max(hi, at(r, t).step_ms);
    }
    s.mean_spread_ms += (hi - lo) / counted;
  }
  for (int r = 0; r < world_size; ++r) s.final_loss += at(r, steps - 1).loss / world_size;

  double useful = 0, padded = 0;
  for (int t = s.first_steady_step; t < steps; ++t) {
    double lo = at(0, t).useful_tokens, hi = lo;
    for (int r = 0; r < world_size; ++r) {
      useful += at(r, t).useful_tokens;
      padded += at(r, t).padded_tokens;
      lo = std::min(lo, at(r, t).useful_tokens);
      hi = std::max(hi, at(r, t).useful_tokens);
    }
    s.mean_token_spread += (hi - lo) / counted;
  }
  if (s.slowest_step_ms > 0) {
    s.useful_tokens_per_s = useful / counted / (s.slowest_step_ms / 1e3);
    s.padded_tokens_per_s = padded / counted / (s.slowest_step_ms / 1e3);
  }
  s.padding_ratio = padded > 0 ? 1 - useful / padded : 0;
  return s;
}

nlohmann::json to_json(const RunSummary& s) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const StepRecord& m : s.ranks) {
    nlohmann::json rank;
    for (const auto& [name, field] : kStepFields)
      if (std::strcmp(name, "start_ms") != 0) rank[name] = m.*field;
    rank["hidden_fraction"] = hidden_fraction(m);
    ranks.push_back(rank);
  }
  return {{"world_size", s.world_size},       {"steps", s.steps},
          {"first_steady_step", s.first_steady_step}, {"global_batch", s.global_batch},
          {"slowest_rank", s.slowest_rank},   {"slowest_step_ms", s.slowest_step_ms},
          {"samples_per_s", s.samples_per_s}, {"mean_spread_ms", s.mean_spread_ms},
          {"final_loss", s.final_loss},       {"useful_tokens_per_s", s.useful_tokens_per_s},
          {"padded_tokens_per_s", s.padded_tokens_per_s}, {"padding_ratio", s.padding_ratio},
          {"mean_token_spread", s.mean_token_spread}, {"ranks", ranks}};
}

void print_summary(std::FILE* out, const RunSummary& s, const std::vector<std::string>& hostnames) {
  std::fprintf(out, "steady state: steps %d..%d of %d (warm-up skipped), global batch %d\n", s.first_steady_step,
               s.steps - 1, s.steps, s.global_batch);
  std::fprintf(out, "  slowest rank        %d (mean step %.2f ms)\n", s.slowest_rank, s.slowest_step_ms);
  std::fprintf(out, "  global throughput   %.0f samples/s\n", s.samples_per_s);
  std::fprintf(out, "  rank spread         %.2f ms mean per step (max - min step time across ranks)\n",
               s.mean_spread_ms);
  std::fprintf(out, "  final loss          %.4f\n", s.final_loss);
  if (s.padded_tokens_per_s > 0) {
    std::fprintf(out, "  tokens              %.0f useful/s, %.0f padded/s (padding %.1f%%), token spread %.0f per step\n",
                 s.useful_tokens_per_s, s.padded_tokens_per_s, 100 * s.padding_ratio, s.mean_token_spread);
  }
  std::fprintf(out, "  %4s  %-10s %8s %7s %10s %8s %7s %7s %8s %7s %7s %7s\n", "rank", "host", "step_ms", "data_ms",
               "compute_ms", "comm_ms", "hidden", "exposed", "optim_ms", "extra", "barrier", "hidden%");
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const StepRecord& m = s.ranks[r];
    std::fprintf(out, "  %4zu  %-10.10s %8.2f %7.2f %10.2f %8.2f %7.2f %7.2f %8.2f %7.2f %7.2f %6.0f%%\n", r,
                 r < hostnames.size() ? hostnames[r].c_str() : "?", m.step_ms, m.data_ms,
                 m.forward_ms + m.backward_ms, m.comm_ms, m.hidden_comm_ms, m.exposed_comm_ms, m.optimizer_ms,
                 m.extra_comm_ms + m.host_work_ms, m.barrier_ms, 100 * hidden_fraction(m));
  }
}

}  // namespace ddplab
