#include "analysis/diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "analysis/format.h"
#include "analysis/stats.h"
#include "config/train_config.h"

namespace ddplab {
namespace {

using Get = std::function<double(const StepRecord&)>;

struct Metric {
  const char* name;
  bool phase;
  Get get;
  // The step itself is each step's slowest rank, as report and train measure it; its parts are taken on the rank
  // the others waited for (pace_rank).
  bool slowest_rank = false;
};

double member(const StepRecord& x, double StepRecord::*field) { return x.*field; }

const std::vector<Metric>& metrics() {
  using std::placeholders::_1;
  static const std::vector<Metric> kMetrics = {
      {"step", false, std::bind(member, _1, &StepRecord::step_ms), /*slowest_rank=*/true},
      {"data", true, std::bind(member, _1, &StepRecord::data_ms)},
      {"forward", true, std::bind(member, _1, &StepRecord::forward_ms)},
      {"backward", true, std::bind(member, _1, &StepRecord::backward_ms)},
      {"exposed comm", true, std::bind(member, _1, &StepRecord::exposed_comm_ms)},
      {"optimizer", true, std::bind(member, _1, &StepRecord::optimizer_ms)},
      {"extra all-reduce", true, std::bind(member, _1, &StepRecord::extra_comm_ms)},
      {"host work", true, std::bind(member, _1, &StepRecord::host_work_ms)},
      {"barrier wait", true, std::bind(member, _1, &StepRecord::barrier_ms)},
      {"untimed", true, untimed_ms},
      {"compute", false, [](const StepRecord& x) { return x.forward_ms + x.backward_ms; }},
      {"comm thread busy", false, std::bind(member, _1, &StepRecord::comm_ms)},
      {"hidden comm", false, std::bind(member, _1, &StepRecord::hidden_comm_ms)},
  };
  return kMetrics;
}

// The rank the others waited for in step s: the one that waited least (exposed comm, extra all-reduce, barrier).
// Its phases are the step's critical path; another rank's exposed comm is partly that rank's lateness.
int pace_rank(const RunRecord& run, int s) {
  int best = 0;
  double least = 1e300;
  for (int r = 0; r < run.world_size(); ++r) {
    const StepRecord& x = run.at(r, s);
    const double wait = x.exposed_comm_ms + x.extra_comm_ms + x.barrier_ms;
    if (wait < least) least = wait, best = r;
  }
  return best;
}

struct RunSamples {
  Sampled on_pace;
  double rank_spread = 0, mean = 0;
};

RunSamples samples_of(const RunRecord& run, const Metric& m) {
  std::vector<double> on_pace, rank_spreads;
  for (int s = run.first_steady_step(); s < run.steps; ++s) {
    double lo = 1e300, hi = -1e300;
    for (int r = 0; r < run.world_size(); ++r)
      lo = std::min(lo, m.get(run.at(r, s))), hi = std::max(hi, m.get(run.at(r, s)));
    on_pace.push_back(m.slowest_rank ? hi : m.get(run.at(pace_rank(run, s), s)));
    rank_spreads.push_back(hi - lo);
  }
  double sum = 0;
  for (double x : on_pace) sum += x;
  return {sampled(on_pace), median(rank_spreads), on_pace.empty() ? 0 : sum / on_pace.size()};
}

Sampled bucket_comm(const RunRecord& run, int k) {
  std::vector<double> ms;
  for (int r = 0; r < run.world_size(); ++r)
    for (int s = run.first_steady_step(); s < run.steps; ++s)
      ms.push_back(run.bucket_at(r, s, k).comm_end_ms - run.bucket_at(r, s, k).comm_start_ms);
  Sampled s = sampled(ms);
  // The ranks' times of one all-reduce end together: the independent samples, for apart(), are the steps.
  s.count = std::max(0, run.steps - run.first_steady_step());
  return s;
}

// Settings that say where files go, what is printed, or when to give up, not how a step runs; a fault's rank and
// step where neither run injects one; and --ring-link where both runs travelled over the same link (auto resolves
// at run time to the first link that works, and the run file names the one it took). A change in them is no cause
// of a difference in time.
bool changes_no_step(const std::string& key, const RunRecord& a, const RunRecord& b) {
  static const char* const kOutputs[] = {"out", "force", "checkpoint", "resume", "log_every", "timeout_s"};
  for (const char* k : kOutputs)
    if (key == k) return true;
  if (key == "ring_link") return !a.meta.transport.empty() && a.meta.transport == b.meta.transport;
  const auto no_fault = [](const RunRecord& r) {
    return !r.config.is_object() || r.config.value("fault", "none") == "none";
  };
  return (key == "fault_rank" || key == "fault_step") && no_fault(a) && no_fault(b);
}

// With --data on either side, the synthetic sequences' knobs (lengths, min_len, outlier_prob, epoch_size) differ as a
// consequence: a run on token shards stores its windows' shape (every one --max-len, no epoch), which nobody set, and
// the data line already says what changed.
bool implied_by_data(const std::string& key, const RunRecord& a, const RunRecord& b) {
  const auto on_data = [](const RunRecord& r) {
    return r.config.is_object() && r.config.contains("data") && r.config["data"].is_string() &&
           !r.config["data"].get<std::string>().empty();
  };
  if (!on_data(a) && !on_data(b)) return false;
  bool synthetic = false;
  TrainConfig c;
  visit_knobs(c, [&](const Knob& knob, auto&) {
    synthetic = synthetic || (knob.key && key == knob.key && (knob.traits & kSynthetic));
  });
  return synthetic;
}

std::vector<ConfigChange> config_changes(const RunRecord& a, const RunRecord& b) {
  std::vector<ConfigChange> out;
  if (a.world_size() != b.world_size()) out.push_back({"world_size", a.world_size(), b.world_size()});
  nlohmann::json keys = nlohmann::json::object();  // the union, sorted
  for (const nlohmann::json* c : {&a.config, &b.config})
    if (c->is_object())
      for (auto it = c->begin(); it != c->end(); ++it) keys[it.key()] = true;
  for (auto it = keys.begin(); it != keys.end(); ++it) {
    const std::string& key = it.key();
    if (changes_no_step(key, a, b) || implied_by_data(key, a, b)) continue;
    const nlohmann::json va = a.config.is_object() ? a.config.value(key, nlohmann::json()) : nlohmann::json();
    const nlohmann::json vb = b.config.is_object() ? b.config.value(key, nlohmann::json()) : nlohmann::json();
    if (va != vb) out.push_back({key, va, vb});
  }
  return out;
}

// "unset" where a file lacks the key, "none" for an empty text (a --data not given), else the value.
std::string value_text(const nlohmann::json& v) {
  if (v.is_null()) return "unset";
  if (!v.is_string()) return v.dump();
  const std::string text = v.get<std::string>();
  return text.empty() ? "none" : text;
}

std::string ms_text(double ms) { return std::fabs(ms) >= 1 ? fmt("%+.1f ms", ms) : fmt("%+.2f ms", ms); }

std::string changes_text(const std::vector<ConfigChange>& changes) {
  std::string text;
  for (size_t i = 0; i < changes.size() && i < 3; ++i)
    text += (i ? ", " : "") + changes[i].key + " " + value_text(changes[i].a) + " -> " + value_text(changes[i].b);
  return changes.size() > 3 ? text + fmt(", and %zu more", changes.size() - 3) : text;
}

std::string verdict_of_medians(const RunDiff& d);

// The medians' verdict, and where the step's median misses a cost of some steps only, the means that show it.
std::string verdict(const RunDiff& d) {
  const MetricDiff& step = d.metrics.front();
  const bool means_apart = std::fabs(step.mean_b - step.mean_a) > d.floor_ms;  // the same cost in both: nothing moved
  return verdict_of_medians(d) + (step.median_misses(d.floor_ms) && means_apart
                                      ? fmt("; but the mean step went %.2f -> %.2f ms (+: a cost of some steps only, "
                                            "which the medians miss)",
                                            step.mean_a, step.mean_b)
                                      : "");
}

std::string verdict_of_medians(const RunDiff& d) {
  const MetricDiff& step = d.metrics.front();
  std::vector<const MetricDiff*> moved;
  for (const MetricDiff& m : d.metrics)
    if (m.phase && m.beyond) moved.push_back(&m);
  std::sort(moved.begin(), moved.end(),
            [](const MetricDiff* x, const MetricDiff* y) { return std::fabs(x->delta()) > std::fabs(y->delta()); });
  std::string phases;
  for (size_t i = 0; i < moved.size() && i < 2; ++i)
    phases += (i ? ", " : "") + moved[i]->name + " " + ms_text(moved[i]->delta());
  const std::string config = changes_text(d.config);
  if (!d.noise_known())
    return fmt("too few steady steps to tell a difference from noise (A %d, B %d; 2 each at least): median step A "
               "%.2f ms, B %.2f ms",
               d.steady_a, d.steady_b, step.a.median, step.b.median) +
           (config.empty() ? "" : " with " + config);
  if (!step.beyond) {
    // A difference of a tenth of the step or more that the steps' scatter still hides is no verdict of "the same":
    // it says what would tell.
    const std::string hidden =
        std::abs(step.delta()) >= 0.1 * step.a.median
            ? fmt("; the steps scatter too much to call %s (a difference must pass %.2f ms, or every step of "
                  "one run be slower than every step of the other): %s would tell",
                  ms_text(step.delta()).c_str(), noise_bound_ms(step.a, step.b),
                  std::min(step.a.count, step.b.count) < kApartSamples ? "more steps or a quieter host"
                                                                       : "a quieter host")
            : "";
    return fmt("no difference beyond noise in the step (median A %.2f ms, B %.2f ms)", step.a.median, step.b.median) +
           (config.empty() ? "" : " with " + config) + hidden +
           (phases.empty() ? "" : "; phases moved within it: " + phases);
  }
  const MetricDiff& compute =
      *std::find_if(d.metrics.begin(), d.metrics.end(), [](const MetricDiff& m) { return m.name == "compute"; });
  // Forward or backward may pass its own noise bound where their sum does not: then "unchanged" would contradict it.
  const bool compute_phase_moved = std::any_of(d.metrics.begin(), d.metrics.end(), [](const MetricDiff& m) {
    return m.beyond && (m.name == "forward" || m.name == "backward");
  });
  // A share of A's step, or where one step is twice the other or more the ratio, alike both ways: "12% faster",
  // "2.7x slower", "3.1x faster" (not "68% faster", which reads as 1.68x), "250x slower" (a tenth of a ratio that
  // large is no figure anyone reads).
  const double ratio = step.a.median > 0 ? step.b.median / step.a.median : 0;
  const double times = ratio >= 1 ? ratio : ratio > 0 ? 1 / ratio : 0;
  const char* way = ratio < 1 ? "faster" : "slower";
  // Chosen as printed: 1.998x is "2.0x", not "100%".
  const std::string change = times >= 9.95    ? fmt("%.0fx %s", times, way)
                             : times >= 1.995 ? fmt("%.1fx %s", times, way)
                                              : fmt("%.0f%% %s", 100 * std::fabs(1 - ratio), way);
  return "B is " + change + ": " + (phases.empty() ? "no single phase beyond noise" : phases) +
         (config.empty() ? "" : " (" + config + ")") + "; compute " +
         (compute.beyond        ? ms_text(compute.delta())
          : compute_phase_moved ? ms_text(compute.delta()) + " (within noise)"
                                : "unchanged");
}

// Whether every rank's shard held as many samples and tokens as every other's in steps [first, end): then the mean of
// the ranks' losses is the global loss, whatever the world size (for files that do not hold the ranks' loss terms).
bool equal_shards(const RunRecord& run, int64_t first, int64_t end) {
  for (int64_t step = first; step < end; ++step) {
    const StepRecord& zero = run.at(0, static_cast<int>(step - run.meta.first_step));
    for (int r = 1; r < run.world_size(); ++r) {
      const StepRecord& x = run.at(r, static_cast<int>(step - run.meta.first_step));
      if (x.samples != zero.samples || x.useful_tokens != zero.useful_tokens) return false;
    }
  }
  return true;
}

std::string loss_text(const LossDiff& d) {
  if (!d.compared()) return "not compared: " + d.not_compared;
  const std::string steps =
      fmt("steps %lld..%lld", static_cast<long long>(d.first), static_cast<long long>(d.first + d.count - 1));
  const std::string which = d.rank_means ? "the global-batch loss (the runs' world sizes differ)" : "every rank";
  if (d.first_difference < 0) return "bit for bit the same on " + which + ", " + steps;
  const std::string where = d.rank_means ? std::string("global") : fmt("rank %d", d.rank);
  return fmt("differ from step %lld (%s: A %.9g, B %.9g); largest relative difference %.2g over ",
             static_cast<long long>(d.first_difference), where.c_str(), d.a, d.b, d.max_relative) +
         steps + (d.rank_means ? ", on the global-batch loss (the runs' world sizes differ)" : "");
}

}  // namespace

LossDiff compare_losses(const RunRecord& a, const RunRecord& b) {
  LossDiff d;
  d.first = std::max(a.meta.first_step, b.meta.first_step);
  const int64_t end = std::min(a.meta.first_step + a.steps, b.meta.first_step + b.steps);
  if (end <= d.first) {
    d.not_compared =
        fmt("no step in common (A steps %lld..%lld, B %lld..%lld)", static_cast<long long>(a.meta.first_step),
            static_cast<long long>(a.meta.first_step + a.steps - 1), static_cast<long long>(b.meta.first_step),
            static_cast<long long>(b.meta.first_step + b.steps - 1));
    return d;
  }
  d.rank_means = a.world_size() != b.world_size();
  const auto global_loss_known = [&](const RunRecord& run) {
    return run.weighs_losses() || equal_shards(run, d.first, end);
  };
  if (d.rank_means && !(global_loss_known(a) && global_loss_known(b))) {
    d.not_compared =
        fmt("A ran %d rank%s, B %d, and some rank's shard held another number of samples or tokens: "
            "each rank's loss is over its own shard, and a file without the ranks' loss terms cannot weigh them",
            a.world_size(), a.world_size() == 1 ? "" : "s", b.world_size());
    return d;
  }
  d.not_compared.clear();
  d.count = end - d.first;
  // The loss of rank r at step s, or with rank -1 the loss on the global batch.
  const auto loss = [](const RunRecord& run, int r, int64_t step) {
    const int s = static_cast<int>(step - run.meta.first_step);
    return r >= 0 ? run.at(r, s).loss : run.global_loss(s);
  };
  for (int64_t step = d.first; step < end; ++step)
    for (int r = d.rank_means ? -1 : 0; r < (d.rank_means ? 0 : a.world_size()); ++r) {
      const double x = loss(a, r, step), y = loss(b, r, step);
      if (std::memcmp(&x, &y, sizeof x) == 0) continue;  // the same bits (a NaN too)
      if (d.first_difference < 0) d.first_difference = step, d.rank = r, d.a = x, d.b = y;
      const double relative = std::isnan(x) != std::isnan(y) ? INFINITY
                              : x == y                       ? 0.0  // +0 and -0, or two NaNs of other payloads
                                                             : std::fabs(y - x) / std::max(std::fabs(x), std::fabs(y));
      d.max_relative = std::max(d.max_relative, relative);
    }
  return d;
}

Sampled sampled(const std::vector<double>& samples) {
  if (samples.empty()) return {};
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  return {median(samples), robust_spread(samples), *lo, *hi, static_cast<int>(samples.size())};
}

bool MetricDiff::median_misses(double floor_ms) const {
  const auto misses = [floor_ms](const Sampled& s, double mean) {
    const double away = std::fabs(mean - s.median);
    return away > floor_ms && away > kNoiseSpreads * s.spread;
  };
  return misses(a, mean_a) || misses(b, mean_b);
}

double noise_bound_ms(const Sampled& a, const Sampled& b) { return kNoiseSpreads * std::hypot(a.spread, b.spread); }

bool apart(const Sampled& a, const Sampled& b) {
  return std::min(a.count, b.count) >= kApartSamples && (b.min > a.max || b.max < a.min);
}

bool beyond_noise(const Sampled& a, const Sampled& b, double floor_ms) {
  const double difference = std::fabs(b.median - a.median);
  return difference > floor_ms && (difference > noise_bound_ms(a, b) || apart(a, b));
}

RunDiff diff_runs(const RunRecord& a, const RunRecord& b) {
  RunDiff d;
  d.path_a = a.path, d.path_b = b.path;
  d.config = config_changes(a, b);
  for (const Metric& m : metrics()) {
    const RunSamples sa = samples_of(a, m), sb = samples_of(b, m);
    d.metrics.push_back(
        {m.name, m.phase, sa.on_pace, sb.on_pace, sa.rank_spread, sb.rank_spread, sa.mean, sb.mean, false});
  }
  d.floor_ms = std::max(kNoiseFloorMs, kNoiseFloorShare * std::max(d.metrics[0].a.median, d.metrics[0].b.median));
  d.steady_a = a.steps - a.first_steady_step(), d.steady_b = b.steps - b.first_steady_step();
  for (MetricDiff& m : d.metrics) m.beyond = d.noise_known() && beyond_noise(m.a, m.b, d.floor_ms);

  d.same_buckets = a.buckets.size() == b.buckets.size();
  for (size_t k = 0; k < a.buckets.size() && d.same_buckets; ++k)
    d.same_buckets = a.buckets[k].count == b.buckets[k].count;
  for (size_t k = 0; k < std::max(a.buckets.size(), b.buckets.size()); ++k) {
    BucketDiff bd;
    if (k < a.buckets.size()) bd.bytes_a = a.buckets[k].bytes(), bd.a = bucket_comm(a, static_cast<int>(k));
    if (k < b.buckets.size()) bd.bytes_b = b.buckets[k].bytes(), bd.b = bucket_comm(b, static_cast<int>(k));
    bd.beyond = d.same_buckets && d.noise_known() && beyond_noise(bd.a, bd.b, d.floor_ms);
    d.buckets.push_back(bd);
  }
  d.verdict = verdict(d);
  d.loss = compare_losses(a, b);
  return d;
}

void print_diff(std::FILE* out, const RunDiff& d) {
  std::fprintf(out, "== diff\n  A: %s\n  B: %s\n", d.path_a.c_str(), d.path_b.c_str());
  std::fprintf(out, "  config: %s\n", d.config.empty() ? "the same" : "what differs, A -> B");
  for (const ConfigChange& c : d.config)
    std::fprintf(out, "    %-22s %s -> %s\n", c.key.c_str(), value_text(c.a).c_str(), value_text(c.b).c_str());
  std::fprintf(out,
               "  per step (steady state; the step: each step's slowest rank; the rest: each step's values on the rank "
               "the others waited for; median and robust spread over steps, ms; ranks: median of max - min across "
               "ranks):\n");
  std::fprintf(out, "  %-17s %9s %8s %9s %8s %9s %8s %8s\n", "", "A", "spread", "B", "spread", "B - A", "ranks A",
               "ranks B");
  constexpr double kShown = 0.005;  // ms: what prints as 0.00
  std::string misses;               // the phases of some steps only, which the medians miss
  for (const MetricDiff& m : d.metrics) {
    const bool quiet = std::max({std::fabs(m.a.median), std::fabs(m.b.median), std::fabs(m.mean_a), std::fabs(m.mean_b),
                                 m.rank_spread_a, m.rank_spread_b}) < kShown;
    if (quiet && m.phase) continue;  // the lab's phases, switched off in both runs
    const bool missed = m.median_misses(d.floor_ms);
    std::fprintf(out, "  %-17s %9.2f %8.2f %9.2f %8.2f %+9.2f%s %7.2f %8.2f%s\n", m.name.c_str(), m.a.median,
                 m.a.spread, m.b.median, m.b.spread, m.delta(), m.beyond ? "*" : " ", m.rank_spread_a, m.rank_spread_b,
                 missed ? " +" : "");
    if (missed) misses += fmt("%s%s: A %.2f, B %.2f", misses.empty() ? "" : "; ", m.name.c_str(), m.mean_a, m.mean_b);
  }
  std::fprintf(out,
               "  (*: beyond noise: |B - A| > %.2f ms and either > %g x sqrt(spread_A^2 + spread_B^2) or every step of "
               "one above every step of the other, %d each at least)\n",
               d.floor_ms, kNoiseSpreads, kApartSamples);
  if (!misses.empty())
    std::fprintf(out, "  (+: in some steps only, so the median is far from the mean over steps, ms per step: %s)\n",
                 misses.c_str());
  std::fprintf(out, "  per bucket (all-reduce ms, median and spread over ranks and steady steps%s):\n",
               d.same_buckets ? "" : "; the runs cut their gradients differently, so buckets are not compared");
  std::fprintf(out, "  %6s %10s %9s %8s %10s %9s %8s %9s\n", "bucket", "A size", "A", "spread", "B size", "B", "spread",
               "B - A");
  for (size_t k = 0; k < d.buckets.size(); ++k) {
    const BucketDiff& b = d.buckets[k];
    const auto side = [](int64_t bytes, const Sampled& s) {
      return bytes ? fmt("%10s %9.2f %8.2f", size_text(bytes).c_str(), s.median, s.spread)
                   : fmt("%10s %9s %8s", "-", "-", "-");
    };
    std::fprintf(out, "  %6zu %s %s %s\n", k, side(b.bytes_a, b.a).c_str(), side(b.bytes_b, b.b).c_str(),
                 d.same_buckets ? fmt("%+9.2f%s", b.b.median - b.a.median, b.beyond ? "*" : "").c_str() : "");
  }
  std::fprintf(out, "  loss: %s\n", loss_text(d.loss).c_str());
  std::fprintf(out, "  verdict: %s\n", d.verdict.c_str());
}

nlohmann::json to_json(const RunDiff& d) {
  nlohmann::json config = nlohmann::json::array(), metrics = nlohmann::json::array(), buckets = nlohmann::json::array();
  for (const ConfigChange& c : d.config) config.push_back({{"key", c.key}, {"a", c.a}, {"b", c.b}});
  for (const MetricDiff& m : d.metrics)
    metrics.push_back({{"name", m.name},
                       {"phase", m.phase},
                       {"a",
                        {{"median_ms", m.a.median},
                         {"spread_ms", m.a.spread},
                         {"min_ms", m.a.min},
                         {"max_ms", m.a.max},
                         {"steps", m.a.count},
                         {"rank_spread_ms", m.rank_spread_a},
                         {"mean_ms", m.mean_a}}},
                       {"b",
                        {{"median_ms", m.b.median},
                         {"spread_ms", m.b.spread},
                         {"min_ms", m.b.min},
                         {"max_ms", m.b.max},
                         {"steps", m.b.count},
                         {"rank_spread_ms", m.rank_spread_b},
                         {"mean_ms", m.mean_b}}},
                       {"delta_ms", m.delta()},
                       {"beyond_noise", m.beyond}});
  const auto side = [](int64_t bytes, const Sampled& s) {
    return bytes ? nlohmann::json{{"bytes", bytes},  {"median_ms", s.median}, {"spread_ms", s.spread},
                                  {"min_ms", s.min}, {"max_ms", s.max},       {"steps", s.count}}
                 : nlohmann::json();
  };
  for (size_t k = 0; k < d.buckets.size(); ++k)
    buckets.push_back({{"bucket", k},
                       {"a", side(d.buckets[k].bytes_a, d.buckets[k].a)},
                       {"b", side(d.buckets[k].bytes_b, d.buckets[k].b)},
                       {"beyond_noise", d.buckets[k].beyond}});
  return {{"a", d.path_a},
          {"b", d.path_b},
          {"config_changes", config},
          {"noise_rule", {{"spreads", kNoiseSpreads}, {"floor_ms", d.floor_ms}, {"apart_samples", kApartSamples}}},
          {"steady_steps", {{"a", d.steady_a}, {"b", d.steady_b}}},
          {"metrics", metrics},
          {"same_buckets", d.same_buckets},
          {"buckets", buckets},
          {"verdict", d.verdict},
          {"loss",
           {{"compared", d.loss.compared()},
            {"not_compared", d.loss.compared() ? nlohmann::json() : nlohmann::json(d.loss.not_compared)},
            {"rank_means", d.loss.rank_means},
            {"first_step", d.loss.first},
            {"steps", d.loss.count},
            {"bit_for_bit", d.loss.compared() && d.loss.first_difference < 0},
            {"first_difference", d.loss.first_difference < 0 ? nlohmann::json()
                                                             : nlohmann::json{{"step", d.loss.first_difference},
                                                                              {"rank", d.loss.rank},
                                                                              {"a", d.loss.a},
                                                                              {"b", d.loss.b}}},
            {"max_relative", d.loss.max_relative}}}};
}

}  // namespace ddplab
