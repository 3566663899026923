#include "analysis/report.h"

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <iterator>
#include <memory>
#include <stdexcept>

#include "record/errors.h"
#include "record/run_file.h"
#include "analysis/timeline.h"

namespace ddplab {
namespace {

// ---- blame thresholds -------------------------------------------------------------------------------------------
// A rank sets the pace when one of its own phases exceeds the median of the other ranks' by this share of the
// step: smaller gaps are ordinary jitter between ranks on a shared machine.
constexpr double kOutlierMinShare = 0.10;
// ... and by at least this much: below it the CPU timer and the scheduler dominate.
constexpr double kOutlierMinMs = 0.5;
// ... and by this ratio. Data loading is normally a sliver of the step, so a straggler's stands at a multiple of
// the others'; compute is the bulk of the step, so 20% more of it already sets the pace.
constexpr double kDataOutlierRatio = 2.0;
constexpr double kComputeOutlierRatio = 1.2;
constexpr double kOtherOutlierRatio = 2.0;  // optimizer, host work, untimed work
// Communication-bound: every rank waits for communication at least this share of the step ...
constexpr double kCommBoundShare = 0.20;
// ... alike: the least-waiting rank waits at least this fraction of what the most-waiting one does. A straggler
// hardly waits at all while the others wait for it, so a straggler never reads as a communication problem.
constexpr double kAlikeRatio = 0.5;
// Input-bound: every rank (alike) spends at least this share of the step producing its batch.
constexpr double kInputBoundShare = 0.25;
// A step is a barrier episode when its barrier wait + host work (on the rank with most) exceeds kOutlierMinMs:
// in other steps both are a couple of clock reads. (Relative to the largest episode it would be fragile: one
// long wait on a loaded machine would hide the ordinary episodes.)

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + mid));
}

template <typename Get>
double median_except(const std::vector<RankProfile>& ranks, int skip, Get get) {
  std::vector<double> v;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (r != skip) v.push_back(get(ranks[r]));
  return median(v);
}

std::string fmt(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// A rank's own work, phase by phase (waiting is not work: exposed comm, barrier and the extra all-reduce are
// where ranks wait for each other).
struct Component {
  Cause cause;
  double ratio;
  double (*get)(const RankProfile&);
};
const Component kComponents[] = {
    {Cause::kStragglerInput, kDataOutlierRatio, [](const RankProfile& p) { return p.data; }},
    {Cause::kSkewedCompute, kComputeOutlierRatio, [](const RankProfile& p) { return p.compute(); }},
    {Cause::kSlowOptimizer, kOtherOutlierRatio, [](const RankProfile& p) { return p.optimizer; }},
    {Cause::kWorkBeforeBarrier, kOtherOutlierRatio, [](const RankProfile& p) { return p.host_work; }},
    {Cause::kUntimedWork, kOtherOutlierRatio, [](const RankProfile& p) { return p.unaccounted(); }},
};

struct Candidate {
  int rank;
  const Component* component;
  double value, others, excess;
};

// Where the other ranks wait for rank r, and how much longer than r does: "in the all-reduce (exposed comm +40.1
// ms/step)".
std::string others_wait(const RunStats& st, int r) {
  struct Place {
    const char* text;
    double RankProfile::*field;
  };
  const Place places[] = {{"in the all-reduce (exposed comm", &RankProfile::exposed_comm},
                          {"at the barrier (barrier wait", &RankProfile::barrier},
                          {"in the extra all-reduce (extra comm", &RankProfile::extra_comm}};
  const Place* best = &places[0];
  double best_extra = -1e300, total = 0;
  for (const Place& p : places) {
    const double extra =
        median_except(st.ranks, r, [&](const RankProfile& q) { return q.*p.field; }) - st.ranks[r].*p.field;
    total += extra;
    if (extra > best_extra) best_extra = extra, best = &p;
  }
  if (total < kOutlierMinMs) return fmt("the other ranks do not wait for it measurably (%+.2f ms/step)", total);
  return fmt("the other ranks wait for it %s %+.2f ms/step)", best->text, best_extra);
}

// Steady steps in which a barrier (wait + host work) happened, and the period between them.
struct BarrierEpisodes {
  std::vector<int> steps;
  int period = 0;  // median gap in steps; 0 when fewer than two episodes
};

BarrierEpisodes barrier_episodes(const RunData& run) {
  const int first = run.first_steady_step();
  BarrierEpisodes e;
  for (int s = first; s < run.num_steps; ++s) {
    double marker = 0;
    for (int r = 0; r < run.world_size; ++r)
      marker = std::max(marker, run.step("barrier_ms", r, s) + run.step("host_work_ms", r, s));
    if (marker > kOutlierMinMs) e.steps.push_back(s);
  }
  std::vector<double> gaps;
  for (size_t i = 1; i < e.steps.size(); ++i) gaps.push_back(e.steps[i] - e.steps[i - 1]);
  if (!gaps.empty()) e.period = static_cast<int>(std::lround(median(gaps)));
  return e;
}

double untimed_at(const RunData& run, int r, int s) {
  double phases = 0;
  for (const char* f : {"data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optimizer_ms", "extra_comm_ms",
                        "host_work_ms", "barrier_ms"})
    phases += run.step(f, r, s);
  return std::max(0.0, run.step("step_ms", r, s) - phases);
}

Finding pace_finding(const RunData& run, const RunStats& st, const Candidate& c, bool first) {
  const int r = c.rank;
  const std::string who = first ? fmt("rank %d sets the pace", r) : fmt("rank %d is also slow", r);
  const std::string vs = fmt("%.2f ms/step vs %.2f ms median on the other ranks", c.value, c.others);
  const std::string wait = others_wait(st, r);
  Cause cause = c.component->cause;
  switch (cause) {
    case Cause::kStragglerInput:
      return {cause, r, who + " (straggler input): its data loading takes " + vs + "; " + wait};
    case Cause::kSkewedCompute:
      return {cause, r,
              who + " (skewed compute): its forward+backward takes " + vs + " (more work or a slower device); " + wait};
    case Cause::kSlowOptimizer:
      return {cause, r, who + " (slow optimizer): its optimizer step takes " + vs + "; " + wait};
    default:
      break;
  }
  // Host work, or untimed work while the others wait at a barrier: the rank-0-work-before-a-barrier pattern.
  const RankProfile& p = st.ranks[r];
  const double others_barrier = median_except(st.ranks, r, [](const RankProfile& q) { return q.barrier; });
  if (cause == Cause::kWorkBeforeBarrier || others_barrier - p.barrier >= kOutlierMinMs) {
    const BarrierEpisodes e = barrier_episodes(run);
    double each = 0;
    for (int s : e.steps) each += (run.step("host_work_ms", r, s) + untimed_at(run, r, s)) / e.steps.size();
    const std::string when = e.period == 1     ? "every step"
                             : e.period > 1    ? fmt("every %d steps", e.period)
                             : e.steps.empty() ? "in some steps"
                                               : "once";
    return {Cause::kWorkBeforeBarrier, r,
            who +
                fmt(" (work before a barrier): it does extra work before a barrier %s (%.2f ms each time, %.2f "
                    "ms/step on average vs %.2f ms on the other ranks); ",
                    when.c_str(), each, c.value, c.others) +
                wait};
  }
  return {Cause::kUntimedWork, r, who + " (untimed work): it spends " + vs + " outside the recorded phases; " + wait};
}

// "data 1% + compute 80% + exposed comm 12% + optimizer 7%" of one rank's step.
std::string breakdown(const RankProfile& p) {
  if (p.step <= 0) return "empty";
  const std::pair<const char*, double> parts[] = {
      {"data", p.data},           {"compute", p.compute()},           {"exposed comm", p.exposed_comm},
      {"optimizer", p.optimizer}, {"extra all-reduce", p.extra_comm}, {"host work", p.host_work},
      {"barrier", p.barrier}};
  std::string text;
  for (size_t i = 0; i < std::size(parts); ++i) {
    if (i >= 4 && parts[i].second < 0.005 * p.step) continue;  // the lab's phases only when they matter
    text += fmt("%s%s %.0f%%", text.empty() ? "" : " + ", parts[i].first, 100 * parts[i].second / p.step);
  }
  return text;
}

std::string comm_hints(const RunData& run) {
  std::string hints = fmt("try larger buckets (--bucket-mb, now %g)", run.config.value("bucket_mb", 0.0));
  if (!run.config.value("overlap", true)) hints += ", --overlap on";
  hints += ", a faster link";
  if (run.config.value("comm_dtype", std::string("fp32")) == "fp32")
    hints += " or bf16 on the wire (--comm-dtype bf16)";
  return hints;
}

}  // namespace

double RankProfile::unaccounted() const {
  return std::max(0.0,
                  step - (data + forward + backward + exposed_comm + optimizer + extra_comm + host_work + barrier));
}

double RankProfile::hidden_fraction() const {
  const double hideable = std::min(backward, comm);
  return hideable > 0 ? hidden_comm / hideable : 1.0;
}

RunStats run_stats(const RunData& run) {
  RunStats st;
  st.first_steady_step = run.first_steady_step();
  st.steady_steps = run.num_steps - st.first_steady_step;
  st.global_batch = run.global_batch();
  st.ranks.resize(run.world_size);
  const std::pair<const char*, double RankProfile::*> fields[] = {
      {"step_ms", &RankProfile::step},
      {"data_ms", &RankProfile::data},
      {"forward_ms", &RankProfile::forward},
      {"backward_ms", &RankProfile::backward},
      {"exposed_comm_ms", &RankProfile::exposed_comm},
      {"optimizer_ms", &RankProfile::optimizer},
      {"extra_comm_ms", &RankProfile::extra_comm},
      {"host_work_ms", &RankProfile::host_work},
      {"barrier_ms", &RankProfile::barrier},
      {"comm_ms", &RankProfile::comm},
      {"hidden_comm_ms", &RankProfile::hidden_comm},
      {"loss", &RankProfile::loss},
  };
  if (st.steady_steps <= 0) return st;
  for (int r = 0; r < run.world_size; ++r) {
    RankProfile& p = st.ranks[r];
    for (const auto& [name, member] : fields) {
      if (!run.has(name)) continue;
      for (int s = st.first_steady_step; s < run.num_steps; ++s) p.*member += run.step(name, r, s) / st.steady_steps;
    }
    if (p.step > st.slowest_step_ms) {
      st.slowest_step_ms = p.step;
      st.slowest_rank = r;
    }
  }
  st.samples_per_s = st.slowest_step_ms > 0 ? st.global_batch / (st.slowest_step_ms / 1e3) : 0;
  for (int s = st.first_steady_step; s < run.num_steps; ++s) {
    double lo = run.step("step_ms", 0, s), hi = lo;
    for (int r = 1; r < run.world_size; ++r) {
      lo = std::min(lo, run.step("step_ms", r, s));
      hi = std::max(hi, run.step("step_ms", r, s));
    }
    st.mean_spread_ms += (hi - lo) / st.steady_steps;
  }
  for (int r = 0; r < run.world_size; ++r) st.final_loss += run.step("loss", r, run.num_steps - 1) / run.world_size;
  return st;
}

const char* cause_name(Cause cause) {
  switch (cause) {
    case Cause::kStragglerInput:
      return "straggler input";
    case Cause::kSkewedCompute:
      return "skewed compute";
    case Cause::kSlowOptimizer:
      return "slow optimizer";
    case Cause::kWorkBeforeBarrier:
      return "work before a barrier";
    case Cause::kUntimedWork:
      return "untimed work";
    case Cause::kCommBound:
      return "communication-bound";
    case Cause::kInputBound:
      return "input-bound";
    case Cause::kBalanced:
      return "balanced";
    case Cause::kSingleRank:
      return "single rank";
  }
  return "?";
}

std::vector<Finding> diagnose(const RunData& run) {
  const RunStats st = run_stats(run);
  const int world = static_cast<int>(st.ranks.size());
  const double pace = st.slowest_step_ms;
  if (st.steady_steps <= 0 || pace <= 0) return {{Cause::kBalanced, -1, "no steady-state steps to judge"}};
  std::vector<Finding> out;

  // 1. One rank doing more of its own work than the others: it sets the pace, the others wait for it.
  if (world >= 2) {
    std::vector<Candidate> candidates;
    for (const Component& c : kComponents) {
      for (int r = 0; r < world; ++r) {
        const double value = c.get(st.ranks[r]);
        const double others = median_except(st.ranks, r, c.get);
        const double excess = value - others;
        if (excess > std::max(kOutlierMinMs, kOutlierMinShare * pace) && value >= c.ratio * others)
          candidates.push_back({r, &c, value, others, excess});
      }
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.excess > b.excess; });
    std::vector<int> named;
    for (const Candidate& c : candidates) {
      if (std::find(named.begin(), named.end(), c.rank) != named.end()) continue;
      out.push_back(pace_finding(run, st, c, named.empty()));
      named.push_back(c.rank);
    }
    // A barrier that every rank but one waits at, without the late rank's work showing in any phase.
    if (named.empty()) {
      int late = 0;
      for (int r = 1; r < world; ++r)
        if (st.ranks[r].barrier < st.ranks[late].barrier) late = r;
      const double others = median_except(st.ranks, late, [](const RankProfile& p) { return p.barrier; });
      if (others - st.ranks[late].barrier > std::max(kOutlierMinMs, kOutlierMinShare * pace))
        out.push_back({Cause::kWorkBeforeBarrier, late,
                       fmt("rank %d sets the pace (work before a barrier): it arrives last at the barrier; the other "
                           "ranks wait there %.2f ms/step (%.0f%% of the step)",
                           late, others, 100 * others / pace)});
    }
  }

  // 2. Every rank, alike, waiting for communication.
  double lo = 1e300, hi = 0;
  std::vector<double> waits, exposed, extra;
  for (const RankProfile& p : st.ranks) {
    const double w = p.exposed_comm + p.extra_comm;
    lo = std::min(lo, w), hi = std::max(hi, w);
    waits.push_back(w), exposed.push_back(p.exposed_comm), extra.push_back(p.extra_comm);
  }
  if (lo >= kCommBoundShare * pace && lo >= kAlikeRatio * hi) {
    const double w = median(waits);
    if (median(extra) > median(exposed)) {
      out.push_back({Cause::kCommBound, -1,
                     fmt("communication-bound: every rank spends %.2f ms/step (%.0f%% of the step) in an extra "
                         "all-reduce outside the gradient buckets; drop it, shrink it or run it less often",
                         median(extra), 100 * median(extra) / pace)});
    } else {
      out.push_back({Cause::kCommBound, -1,
                     fmt("communication-bound: every rank waits %.2f ms/step for the all-reduce (%.0f%% of the step); ",
                         w, 100 * w / pace) +
                         comm_hints(run)});
    }
  }

  // 3. Every rank, alike, waiting for its input.
  lo = 1e300, hi = 0;
  std::vector<double> data;
  for (const RankProfile& p : st.ranks) lo = std::min(lo, p.data), hi = std::max(hi, p.data), data.push_back(p.data);
  if (lo >= kInputBoundShare * pace && lo >= kAlikeRatio * hi) {
    out.push_back({Cause::kInputBound, -1,
                   fmt("input-bound: every rank spends %.2f ms/step producing its batch (%.0f%% of the step); more "
                       "--loader-threads and a deeper --prefetch get batches ready before they are needed",
                       median(data), 100 * median(data) / pace)});
  }

  if (out.empty()) {
    const RankProfile& p = st.ranks[st.slowest_rank];
    if (world == 1) {
      out.push_back({Cause::kSingleRank, -1,
                     fmt("one rank, nobody to wait for: the step of %.2f ms is ", p.step) + breakdown(p)});
    } else {
      out.push_back(
          {Cause::kBalanced, -1,
           fmt("no rank stands out (spread %.2f ms/step): the step of %.2f ms is ", st.mean_spread_ms, p.step) +
               breakdown(p)});
    }
  }
  return out;
}

std::vector<std::string> blame(const RunData& run) {
  std::vector<std::string> lines;
  for (const Finding& f : diagnose(run)) lines.push_back(f.text);
  return lines;
}

namespace {

std::string stem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  const size_t dot = name.rfind(".h5");
  return dot != std::string::npos && dot + 3 == name.size() ? name.substr(0, dot) : name;
}

std::string config_text(const nlohmann::json& c, const char* key) {
  const auto it = c.find(key);
  if (it == c.end()) return "?";
  if (it->is_boolean()) return it->get<bool>() ? "on" : "off";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_float()) return fmt("%g", it->get<double>());
  return it->dump();
}

std::string shorten(const std::string& s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

}  // namespace

void print_report(std::FILE* out, const RunData& run) {
  const RunStats st = run_stats(run);
  const nlohmann::json& c = run.config;
  auto attr = [&](const char* key) {
    const auto it = run.attrs.find(key);
    return it == run.attrs.end() ? std::string("?") : it->second;
  };
  std::fprintf(out, "== %s\n", run.path.c_str());
  std::fprintf(out, "  %s on %d rank%s (%s%s), %d steps, steady state %d..%d, global batch %d\n",
               attr("command").c_str(), run.world_size, run.world_size == 1 ? "" : "s", run.host(0).c_str(),
               run.world_size > 1 && run.hostnames.back() != run.hostnames.front() ? ", ..." : "", run.num_steps,
               st.first_steady_step, run.num_steps - 1, st.global_batch);
  std::fprintf(out, "  config: comm %s, comm_dtype %s, link %s, bucket_mb %s, overlap %s, grad_slice_mb %s, batch %s",
               config_text(c, "comm").c_str(), config_text(c, "comm_dtype").c_str(), config_text(c, "link").c_str(),
               config_text(c, "bucket_mb").c_str(), config_text(c, "overlap").c_str(),
               config_text(c, "grad_slice_mb").c_str(), config_text(c, "batch").c_str());
  if (c.value("grad_accum", 1) > 1) std::fprintf(out, " x %d micro-batches", c.value("grad_accum", 1));
  if (c.contains("hidden_dim"))
    std::fprintf(out, ", MLP %s-%sx%s-%s", config_text(c, "input_dim").c_str(), config_text(c, "hidden_dim").c_str(),
                 config_text(c, "hidden_layers").c_str(), config_text(c, "num_classes").c_str());
  std::fprintf(out, "\n");
  // The lab's knobs, only those switched on.
  std::string lab;
  for (const char* key : {"straggler_ms", "extra_allreduce_mb", "rank0_work_ms", "data_cost_ms", "loader_threads"}) {
    const auto it = c.find(key);
    if (it != c.end() && it->is_number() && it->get<double>() > 0)
      lab += fmt(" %s %s", key, config_text(c, key).c_str());
  }
  if (c.value("straggler_ms", 0.0) > 0) lab += " slow_rank " + config_text(c, "slow_rank");
  if (c.value("rank0_work_ms", 0.0) > 0) lab += " barrier_every " + config_text(c, "barrier_every");
  if (!lab.empty()) std::fprintf(out, "  lab:%s\n", lab.c_str());
  std::fprintf(out, "  build: git %s, started %s\n", attr("git_commit").c_str(), attr("start_time_utc").c_str());
  if (!attr("stop_reason").empty()) std::fprintf(out, "  status: %s\n", attr("stop_reason").c_str());
  std::fprintf(out, "  slowest rank        %d (mean step %.2f ms)\n", st.slowest_rank, st.slowest_step_ms);
  std::fprintf(out, "  global throughput   %.0f samples/s\n", st.samples_per_s);
  std::fprintf(out, "  rank spread         %.2f ms mean per step (max - min step time across ranks)\n",
               st.mean_spread_ms);
  std::fprintf(out, "  final loss          %.4f\n", st.final_loss);

  // The lab's columns only when they would not print as zeros.
  bool lab_cols = false;
  for (const RankProfile& p : st.ranks) lab_cols |= std::max({p.extra_comm, p.host_work, p.barrier}) >= 0.005;
  std::fprintf(out, "  per rank (steady-state mean per step, ms):\n");
  std::fprintf(out, "  %4s  %-10s %8s %7s %8s %8s %8s %7s %7s %8s", "rank", "host", "step", "data", "forward",
               "backward", "comm", "hidden", "exposed", "optim");
  if (lab_cols) std::fprintf(out, " %7s %7s %7s", "extra", "host_wk", "barrier");
  std::fprintf(out, " %7s\n", "hidden%");
  for (int r = 0; r < run.world_size; ++r) {
    const RankProfile& p = st.ranks[r];
    std::fprintf(out, "  %4d  %-10.10s %8.2f %7.2f %8.2f %8.2f %8.2f %7.2f %7.2f %8.2f", r, run.host(r).c_str(), p.step,
                 p.data, p.forward, p.backward, p.comm, p.hidden_comm, p.exposed_comm, p.optimizer);
    if (lab_cols) std::fprintf(out, " %7.2f %7.2f %7.2f", p.extra_comm, p.host_work, p.barrier);
    std::fprintf(out, " %6.0f%%\n", 100 * p.hidden_fraction());
  }

  const BucketData& b = run.buckets;
  std::fprintf(out, "  per bucket (mean over ranks and steady steps, ms from step start; bucket 0 is ready first):\n");
  std::fprintf(out, "  %6s %12s %9s %8s %8s %8s %8s  %s\n", "bucket", "bytes", "pieces", "ready", "start", "end",
               "comm_ms", "params");
  for (int k = 0; k < b.size(); ++k) {
    double ready = 0, begin = 0, end = 0;
    const double n = static_cast<double>(run.world_size) * st.steady_steps;
    for (int r = 0; r < run.world_size; ++r) {
      for (int s = st.first_steady_step; s < run.num_steps; ++s) {
        const double t0 = run.step("start_ms", r, s);
        ready += (run.bucket_time(b.ready_ms, r, s, k) - t0) / n;
        begin += (run.bucket_time(b.comm_start_ms, r, s, k) - t0) / n;
        end += (run.bucket_time(b.comm_end_ms, r, s, k) - t0) / n;
      }
    }
    const std::string pieces =
        fmt("%lld..%lld", static_cast<long long>(b.first_piece[k]), static_cast<long long>(b.last_piece[k]));
    std::fprintf(out, "  %6d %12lld %9s %8.2f %8.2f %8.2f %8.2f  %s\n", k, static_cast<long long>(b.bytes[k]),
                 pieces.c_str(), ready, begin, end, end - begin, shorten(b.param_names[k], 60).c_str());
  }
  std::fprintf(out, "  blame:\n");
  for (const std::string& line : blame(run)) std::fprintf(out, "    %s\n", line.c_str());
}

void print_comparison(std::FILE* out, const std::vector<RunData>& runs) {
  std::fprintf(out, "== comparison (steady state; exposed comm and hidden%% are means over ranks)\n");
  std::fprintf(out, "  %-28s %5s %11s %9s %11s %7s  %s\n", "run", "world", "samples/s", "step_ms", "exposed_ms",
               "hidden%", "blame");
  for (const RunData& run : runs) {
    const RunStats st = run_stats(run);
    double exposed = 0, hidden = 0;
    for (const RankProfile& p : st.ranks) {
      exposed += p.exposed_comm / st.ranks.size();
      hidden += p.hidden_fraction() / st.ranks.size();
    }
    const std::vector<Finding> findings = diagnose(run);
    const Finding& f = findings.front();
    const std::string verdict =
        f.rank >= 0 ? fmt("%s (rank %d)", cause_name(f.cause), f.rank) : std::string(cause_name(f.cause));
    std::fprintf(out, "  %-28s %5d %11.0f %9.2f %11.2f %6.0f%%  %s\n", shorten(stem(run.path), 28).c_str(),
                 run.world_size, st.samples_per_s, st.slowest_step_ms, exposed, 100 * hidden, verdict.c_str());
  }
}

namespace {

bool is_rank0() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return true;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

// A file that is not a readable run file is bad input: a usage error (one line, exit code 2).
RunData read_input(const std::string& path) {
  try {
    return read_run_file(path);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

void add_report_commands(CLI::App& app) {
  auto files = std::make_shared<std::vector<std::string>>();
  CLI::App* report = app.add_subcommand("report", "tables and slow-rank blame from run files (docs/REPORTS.md)");
  report->add_option("files", *files, "run files (HDF5)")->required()->type_name("FILE.h5");
  report->callback([files] {
    if (!is_rank0()) return;
    std::vector<RunData> runs;
    for (const std::string& path : *files) runs.push_back(read_input(path));  // all readable before printing
    for (size_t i = 0; i < runs.size(); ++i) {
      if (i) std::printf("\n");
      print_report(stdout, runs[i]);
    }
    if (runs.size() > 1) {
      std::printf("\n");
      print_comparison(stdout, runs);
    }
    std::fflush(stdout);
  });

  struct TimelineArgs {
    std::string file, out;
    bool force = false;
  };
  auto args = std::make_shared<TimelineArgs>();
  CLI::App* timeline = app.add_subcommand("timeline", "export a run to Chrome-trace JSON (Perfetto, chrome://tracing)");
  timeline->add_option("file", args->file, "run file (HDF5)")->required()->type_name("FILE.h5");
  timeline->add_option("-o,--out", args->out, "trace file; default FILE with .trace.json");
  timeline->add_flag("--force", args->force, "overwrite an existing trace file");
  timeline->callback([args] {
    if (!is_rank0()) return;
    const RunData run = read_input(args->file);
    const std::string out = args->out.empty() ? default_timeline_path(args->file) : args->out;
    const std::string problem = check_output_path(out, args->force);
    if (!problem.empty()) throw UsageError(problem);
    write_timeline(run, out, args->force);
    std::printf("timeline: %s (%d ranks, %d steps; open in https://ui.perfetto.dev or chrome://tracing)\n", out.c_str(),
                run.world_size, run.num_steps);
    std::fflush(stdout);
  });
}

}  // namespace ddplab
