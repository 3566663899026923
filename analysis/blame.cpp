#include "analysis/blame.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "analysis/format.h"
#include "analysis/stats.h"
#include "config/train_config.h"

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
// Communication-bound: every rank waits for communication at least kCommBoundShare of the step (blame.h) ...
// ... alike: the least-waiting rank waits at least this fraction of what the most-waiting one does. A straggler
// hardly waits at all while the others wait for it, so a straggler never reads as a communication problem.
constexpr double kAlikeRatio = 0.5;
// Input-bound: every rank (alike) spends at least this share of the step producing its batch.
constexpr double kInputBoundShare = 0.25;
// CPU taken: a rank's excess work is named as the host's doing when the time its CPUs were taken from it, beyond the
// other ranks', is at least this share of that excess.
constexpr double kTakenExplainsShare = 0.5;
// Noisy host: the hypervisor stole at least this share of the step from every rank's CPUs. Steal slows every rank
// alike, so no rank stands out; the step is longer than the job's own work by that much.
constexpr double kNoisyHostShare = 0.05;
constexpr double kStealTickMs = 10;  // /proc/stat's unit, USER_HZ 100
constexpr double kMinStealTicks = 5;
// CPU contention: every rank's compute thread waits at least this share of the step for a CPU of its own host.
constexpr double kContentionShare = 0.20;
// A step is a barrier episode when its barrier wait + host work (on the rank with most) exceeds kOutlierMinMs:
// in other steps both are a couple of clock reads. (Relative to the largest episode it would be fragile: one
// long wait on a loaded machine would hide the ordinary episodes.)

template <typename Get>
double median_except(const std::vector<StepRecord>& ranks, int skip, Get get) {
  std::vector<double> v;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    if (r != skip) v.push_back(get(ranks[r]));
  return median(v);
}

// A figure of every rank's over the ranks: where a cause is shared, every rank must show it (the least), alike (the
// least against the most), and the line quotes the median.
struct OverRanks {
  double least = 1e300, most = -1e300, median = 0;
};
OverRanks over_ranks(const std::vector<StepRecord>& ranks, double (*get)(const StepRecord&)) {
  OverRanks o;
  std::vector<double> values;
  for (const StepRecord& p : ranks) {
    const double v = get(p);
    o.least = std::min(o.least, v), o.most = std::max(o.most, v);
    values.push_back(v);
  }
  o.median = median(values);
  return o;
}

// A rank's own work, phase by phase (waiting is not work: exposed comm, barrier and the extra all-reduce are
// where ranks wait for each other).
struct Component {
  Cause cause;
  double ratio;
  double (*get)(const StepRecord&);
  const char* what;  // "its <what> takes ..."
  // Work the compute thread does, whose cpu wait the step records: only its excess can be the host's doing (data
  // can be a loader thread's or a sleep, host work is the lab's rank-0 sleep).
  bool compute_thread;
};
const Component kComponents[] = {
    {Cause::kStragglerInput, kDataOutlierRatio, [](const StepRecord& p) { return p.data_ms; }, "data loading", false},
    {Cause::kSkewedCompute, kComputeOutlierRatio, [](const StepRecord& p) { return p.forward_ms + p.backward_ms; },
     "forward+backward", true},
    {Cause::kSlowOptimizer, kOtherOutlierRatio, [](const StepRecord& p) { return p.optimizer_ms; }, "optimizer step",
     true},
    {Cause::kWorkBeforeBarrier, kOtherOutlierRatio, [](const StepRecord& p) { return p.host_work_ms; }, "host work",
     false},
    {Cause::kUntimedWork, kOtherOutlierRatio, [](const StepRecord& p) { return untimed_ms(p); },
     "time outside the recorded phases", true},
};

// Time the host took from a rank's CPUs in a step: steal and the wait for a CPU (-1, not counted, as 0).
double cpu_taken_ms(const StepRecord& p) { return std::max(0.0, p.steal_ms) + std::max(0.0, p.cpu_wait_ms); }

struct Candidate {
  int rank;
  const Component* component;
  double value, others, excess;
};

// Where the other ranks wait for rank r, and how much longer than r does there (ms/step).
struct WaitPlace {
  const char* text;
  double StepRecord::*field;
};
constexpr WaitPlace kWaitPlaces[] = {{"in the all-reduce (exposed comm", &StepRecord::exposed_comm_ms},
                                     {"at the barrier (barrier wait", &StepRecord::barrier_ms},
                                     {"in the extra all-reduce (extra comm", &StepRecord::extra_comm_ms}};
double others_wait_longer_ms(const RunSummary& st, int r, const WaitPlace& p) {
  return median_except(st.ranks, r, [&](const StepRecord& q) { return q.*p.field; }) - st.ranks[r].*p.field;
}
// All of it: negative where rank r waits longer than the others, for one of them.
double others_wait_longer_ms(const RunSummary& st, int r) {
  double total = 0;
  for (const WaitPlace& p : kWaitPlaces) total += others_wait_longer_ms(st, r, p);
  return total;
}

// "the other ranks wait for it in the all-reduce (exposed comm +40.1 ms/step)".
std::string others_wait(const RunSummary& st, int r) {
  const WaitPlace* best = nullptr;
  double best_ms = 0, total = 0;
  for (const WaitPlace& p : kWaitPlaces) {
    const double ms = others_wait_longer_ms(st, r, p);
    total += ms;
    if (!best || ms > best_ms) best = &p, best_ms = ms;
  }
  if (total < kOutlierMinMs) return fmt("the other ranks do not wait for it measurably (%+.2f ms/step)", total);
  return fmt("the other ranks wait for it %s %+.2f ms/step)", best->text, best_ms);
}

// Steady steps in which a barrier (wait + host work) happened, and the period between them.
struct BarrierEpisodes {
  std::vector<int> steps;
  int period = 0;  // median gap in steps; 0 when fewer than two episodes
};

BarrierEpisodes barrier_episodes(const RunRecord& run) {
  BarrierEpisodes e;
  for (int s = run.first_steady_step(); s < run.steps; ++s) {
    double marker = 0;
    for (int r = 0; r < run.world_size(); ++r)
      marker = std::max(marker, run.at(r, s).barrier_ms + run.at(r, s).host_work_ms);
    if (marker > kOutlierMinMs) e.steps.push_back(s);
  }
  std::vector<double> gaps;
  for (size_t i = 1; i < e.steps.size(); ++i) gaps.push_back(e.steps[i] - e.steps[i - 1]);
  if (!gaps.empty()) e.period = static_cast<int>(std::lround(median(gaps)));
  return e;
}

Finding pace_finding(const RunRecord& run, const RunSummary& st, const Candidate& c, bool first) {
  const int r = c.rank;
  const std::string who = first ? fmt("rank %d sets the pace", r) : fmt("rank %d is also slow", r);
  const std::string vs = fmt("%.2f ms/step vs %.2f ms median on the other ranks", c.value, c.others);
  const std::string wait = others_wait(st, r);
  Cause cause = c.component->cause;
  // The excess is mostly time the rank's CPUs were not its own: the host's doing, not the rank's work.
  const StepRecord& p = st.ranks[r];
  const double taken_others = median_except(st.ranks, r, cpu_taken_ms);
  if (c.component->compute_thread && cpu_taken_ms(p) - taken_others >= kTakenExplainsShare * c.excess) {
    return {Cause::kCpuTaken, r,
            who +
                fmt(" (CPU taken): its %s takes %s, and its CPUs were taken from it for %.2f ms/step vs %.2f on the "
                    "other ranks (steal %s, the time the hypervisor gave its CPUs to other guests; cpu wait %s, the "
                    "time other threads or processes of its host ran on its cores); ",
                    c.component->what, vs.c_str(), cpu_taken_ms(p), taken_others,
                    counted_ms(p.steal_ms, "not counted").c_str(), counted_ms(p.cpu_wait_ms, "not counted").c_str()) +
                wait};
  }
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
  const double others_barrier = median_except(st.ranks, r, [](const StepRecord& q) { return q.barrier_ms; });
  if (cause == Cause::kWorkBeforeBarrier || others_barrier - p.barrier_ms >= kOutlierMinMs) {
    const BarrierEpisodes e = barrier_episodes(run);
    double each = 0;
    for (int s : e.steps) each += (run.at(r, s).host_work_ms + untimed_ms(run.at(r, s))) / e.steps.size();
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
std::string breakdown(const StepRecord& p) {
  if (p.step_ms <= 0) return "empty";
  const std::pair<const char*, double> parts[] = {
      {"data", p.data_ms},
      {"compute", p.forward_ms + p.backward_ms},
      {"exposed comm", p.exposed_comm_ms},
      {"optimizer", p.optimizer_ms},
      {"extra all-reduce", p.extra_comm_ms},
      {"host work", p.host_work_ms},
      {"barrier", p.barrier_ms}};
  std::string text;
  for (size_t i = 0; i < std::size(parts); ++i) {
    if (i >= 4 && parts[i].second < 0.005 * p.step_ms) continue;  // the lab's phases only when they matter
    text += fmt("%s%s %.0f%%", text.empty() ? "" : " + ", parts[i].first, 100 * parts[i].second / p.step_ms);
  }
  return text;
}

std::string comm_hints(const RunRecord& run) {
  // The bucket size cuts both ways: a larger cap pays fewer per-bucket latencies, a smaller one starts the all-reduce
  // earlier in backward (at the default 25 MB the whole MLP is one bucket and starts when backward is nearly done).
  // Which wins depends on the model and the link: `ddplab predict` answers it from this very run.
  int64_t gradient_bytes = 0;
  for (const BucketRecord& b : run.buckets) gradient_bytes += b.bytes();
  const TrainConfig config = config_from_json(run.config);
  const std::string buckets =
      fmt("--bucket-mb, now %g: %s for %s", config.bucket_mb,
          counted(static_cast<int>(run.buckets.size()), "bucket").c_str(), size_text(gradient_bytes).c_str());
  const std::string predict =
      fmt("compare sizes with ddplab predict %s", run.path.empty() ? "RUN.h5" : run.path.c_str());
  // Ranks sharing one GPU take turns on it: on an H200 each ring step cost ~0.4 ms at 2 ranks whatever it moved, and
  // an all-reduce beside backward waited for backward's end. There fewer buckets help, a 16-bit wire does not (2
  // ranks of gpt2-small: 58.96 ms per step against 57.19 with fp32, the casts costing more than the bytes saved).
  if (const int sharing = run.ranks_sharing_a_gpu()) {
    std::string hints =
        fmt("give each rank a GPU of its own (%d ranks share one here, and every ring step waits for the GPU to switch "
            "between them)",
            sharing);
    if (run.buckets.size() > 1)
      hints += fmt("; else fewer, larger buckets, each paying those switches whatever it moves (%s; %s)",
                   buckets.c_str(), predict.c_str());
    return hints;
  }
  std::string hints = fmt("try another bucket size (%s; %s)", buckets.c_str(), predict.c_str());
  if (!config.overlap) hints += ", --overlap on";
  const bool across = !slow_inter_node_link(run).empty();
  hints += across ? ", a faster inter-node link" : ", a faster link";
  if (across && config.comm != AllreduceImpl::kHier)
    hints += ", --comm hier (less traffic per NIC)";
  if (config.comm_dtype == WireDtype::kFp32)
    hints += " or bf16 on the wire (--comm-dtype bf16)";
  return hints;
}

}  // namespace

std::string slow_inter_node_link(const RunRecord& run) {
  const LinkModel &intra = run.meta.links.intra, &inter = run.meta.links.inter;
  if (run.nodes() < 2 || !link_emulated(inter)) return "";
  // By bandwidth, else (both unlimited, or alike) by latency.
  const bool slower = inter.gbps != intra.gbps ? inter.gbps > 0 && (intra.gbps == 0 || inter.gbps < intra.gbps)
                                               : inter.latency_us > intra.latency_us;
  if (!slower) return "";
  int per_nic = 0;  // the most ranks on one node
  for (int node = 0; node < run.nodes(); ++node) {
    int k = 0;
    for (int r = 0; r < run.world_size(); ++r) k += run.node(r) == node;
    per_nic = std::max(per_nic, k);
  }
  return fmt("the inter-node link (%s, shared by %d rank%s per NIC)", inter.name.c_str(), per_nic,
             per_nic == 1 ? "" : "s");
}


namespace {

// A barrier that every rank but one waits at, without the late rank's work showing in any phase.
void find_work_before_barrier(const RunSummary& st, std::vector<Finding>& out) {
  const int world = static_cast<int>(st.ranks.size());
  const double pace = st.slowest_step_ms;
  int late = 0;
  for (int r = 1; r < world; ++r)
    if (st.ranks[r].barrier_ms < st.ranks[late].barrier_ms) late = r;
  const double others = median_except(st.ranks, late, [](const StepRecord& p) { return p.barrier_ms; });
  if (others - st.ranks[late].barrier_ms > std::max(kOutlierMinMs, kOutlierMinShare * pace))
    out.push_back({Cause::kWorkBeforeBarrier, late,
                   fmt("rank %d sets the pace (work before a barrier): it arrives last at the barrier; the other "
                       "ranks wait there %.2f ms/step (%.0f%% of the step)",
                       late, others, 100 * others / pace)});
}

// One rank doing more of its own work than the others: it sets the pace, the others wait for it.
void find_pace_setters(const RunRecord& run, const RunSummary& st, std::vector<Finding>& out) {
  const int world = static_cast<int>(st.ranks.size());
  const double pace = st.slowest_step_ms;
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
    // Beside the rank that sets the pace, one that waits longer than the others is waiting for it, and its longer
    // work is that wait's doing (a comm thread polling beside backward on a shared core), not a second cause.
    if (!named.empty() && others_wait_longer_ms(st, c.rank) <= -kOutlierMinMs) continue;
    out.push_back(pace_finding(run, st, c, named.empty()));
    named.push_back(c.rank);
  }
  if (named.empty()) find_work_before_barrier(st, out);
}

// Every rank, alike, waiting for communication.
void find_comm_bound(const RunRecord& run, const RunSummary& st, std::vector<Finding>& out) {
  const double pace = st.slowest_step_ms;
  const OverRanks waits = over_ranks(st.ranks, [](const StepRecord& p) { return p.exposed_comm_ms + p.extra_comm_ms; });
  if (waits.least < kCommBoundShare * pace || waits.least < kAlikeRatio * waits.most) return;
  const double w = waits.median;
  const double extra = over_ranks(st.ranks, [](const StepRecord& p) { return p.extra_comm_ms; }).median;
  if (extra > over_ranks(st.ranks, [](const StepRecord& p) { return p.exposed_comm_ms; }).median) {
    out.push_back({Cause::kCommBound, -1,
                   fmt("communication-bound: every rank spends %.2f ms/step (median over ranks; %.0f%% of the step) "
                       "in an extra all-reduce outside the gradient buckets; drop it, shrink it or run it less often",
                       extra, 100 * extra / pace)});
  } else {
    const std::string link = slow_inter_node_link(run);
    // Ranks that also wait for a CPU (more threads than cores) wait for their comm threads' turn too: the link and
    // bucket hints below would not be the first remedy there.
    const double cpu_wait = over_ranks(st.ranks, [](const StepRecord& p) { return p.cpu_wait_ms; }).least;
    const std::string starved =
        cpu_wait >= std::max(kOutlierMinMs, kContentionShare * pace)
            ? fmt("; every rank's compute thread also waits %.2f ms/step or more for a CPU, and so may its "
                  "all-reduce: fewer ranks or threads per host come first",
                  cpu_wait)
            : "";
    out.push_back({Cause::kCommBound, -1,
                   fmt("communication-bound: every rank waits %.2f ms/step for the all-reduce (median over ranks; "
                       "%.0f%% of the step)",
                       w, 100 * w / pace) +
                       (link.empty() ? "" : ", exposed comm on " + link) + starved + "; " + comm_hints(run)});
  }
}

// Every rank, alike, waiting for its input. The remedy named is one the run reads (launcher/cli.cpp refuses the
// others): the CPU MLP's loader threads and their prefetch depth, the GPU prefetcher's threads.
void find_input_bound(const RunRecord& run, const RunSummary& st, std::vector<Finding>& out) {
  const double pace = st.slowest_step_ms;
  const OverRanks data = over_ranks(st.ranks, [](const StepRecord& p) { return p.data_ms; });
  if (data.least < kInputBoundShare * pace || data.least < kAlikeRatio * data.most) return;
  const TrainConfig c = config_from_json(run.config);
  std::string remedy;
  if (c.device == Device::kCuda)
    remedy =
        fmt("more --loader-threads (now %d) share the cost of the batch the GPU's prefetcher stages a step "
            "ahead",
            c.loader_threads);
  else if (c.has_input_pipeline())
    remedy =
        fmt("more --loader-threads (now %d) and a deeper --prefetch (now %d) get batches ready before they are "
            "needed",
            c.loader_threads, c.prefetch);
  else
    remedy = "the transformer on the CPU makes its batches within the step, with no loader threads to take them off it";
  out.push_back({Cause::kInputBound, -1,
                 fmt("input-bound: every rank spends %.2f ms/step producing its batch (median over ranks; %.0f%% of "
                     "the step); ",
                     data.median, 100 * data.median / pace) +
                     remedy});
}

// Nothing to blame: the slowest rank's step, phase by phase.
Finding step_breakdown(const RunSummary& st) {
  const StepRecord& p = st.ranks[st.slowest_rank];
  if (st.ranks.size() == 1)
    return {Cause::kSingleRank, -1,
            fmt("one rank, nobody to wait for: the step of %.2f ms is ", p.step_ms) + breakdown(p)};
  // Not the ranks' step spread: ranks in step end each step together, whoever held them up.
  return {Cause::kBalanced, -1,
          fmt("no rank stands out (none spends %.0f%% of the step more than the others on its own work): rank %d's "
              "step, the slowest, %.2f ms, is ",
              100 * kOutlierMinShare, st.slowest_rank, p.step_ms) +
              breakdown(p)};
}

// Every rank computing on padding (the rows of a batch are as long as its longest sequence).
void find_padding_bound(const RunRecord& run, const RunSummary& st, std::vector<Finding>& out) {
  if (st.padding_ratio < kPaddingBoundShare) return;
  const Batching batching = config_from_json(run.config).batching;
  out.push_back({Cause::kPaddingBound, -1,
                 fmt("padding-bound: %.0f%% of the tokens the ranks compute on are padding (%.0f useful of %.0f "
                     "tokens/s)",
                     100 * st.padding_ratio, st.useful_tokens_per_s, st.padded_tokens_per_s) +
                     (batching == Batching::kSample ? "; --batching bucket (lengths sorted within windows) or token (a "
                                                      "--max-tokens budget per batch) compute on less of it"
                                                    : "")});
}

// The host taking every rank's CPUs: no rank stands out for it, every step is longer by it. Likewise more threads
// than cores on the host: every rank's compute thread waiting for a CPU.
// (A counter the kernel does not keep is -1 on every rank: never a finding. Below kOutlierMinMs a share means
// nothing: a 0.05 ms step of a tiny model waits 0.02 ms for a CPU beside its own comm thread.)
void find_busy_host(const RunSummary& st, std::vector<Finding>& out) {
  const double pace = st.slowest_step_ms;
  const OverRanks wait = over_ranks(st.ranks, [](const StepRecord& p) { return p.cpu_wait_ms; });
  // One rank has no other ranks to blame and none to take away: other processes or its own BLAS threads.
  if (wait.least >= std::max(kOutlierMinMs, kContentionShare * pace) && st.ranks.size() == 1)
    out.push_back({Cause::kCpuContention, -1,
                   fmt("CPU contention: the rank's compute thread waits %.2f ms/step (%.0f%% of the step) for a CPU "
                       "of its host, behind other processes or its own threads; a quieter host, or fewer --threads, "
                       "gives it its own",
                       wait.median, 100 * wait.median / pace)});
  else if (wait.least >= std::max(kOutlierMinMs, kContentionShare * pace))
    out.push_back({Cause::kCpuContention, -1,
                   fmt("CPU contention: every rank's compute thread waits %.2f ms/step (median over ranks; %.0f%% of "
                       "the step) for a CPU of its host, behind the other ranks' threads, the communication threads "
                       "or other processes; fewer ranks or --threads per host (or more cores) give each its own",
                       wait.median, 100 * wait.median / pace)});
  // The kernel counts steal in ticks of 10 ms (USER_HZ 100), a rank's the mean over its CPUs: a single tick over a
  // few steps reads as ms per step. Under kMinStealTicks over the steady steps it says nothing.
  const OverRanks steal = over_ranks(st.ranks, [](const StepRecord& p) { return p.steal_ms; });
  if (steal.least >= std::max(kOutlierMinMs, kNoisyHostShare * pace) &&
      steal.least * st.steady_steps() >= kMinStealTicks * kStealTickMs)
    out.push_back({Cause::kNoisyHost, -1,
                   fmt("noisy host: the hypervisor ran other guests on every rank's CPUs for %.2f ms/step (%.0f%% of "
                       "the step; steal time): the step times include them; compare runs taken side by side on "
                       "this host, or run on dedicated cores",
                       steal.median, 100 * steal.median / pace)});
}

}  // namespace

std::vector<Finding> diagnose(const RunRecord& run, const RunSummary& st) {
  if (st.steady_steps() <= 0 || st.slowest_step_ms <= 0)
    return {{Cause::kBalanced, -1, "no steady-state steps to judge"}};
  std::vector<Finding> out;
  if (st.ranks.size() >= 2) find_pace_setters(run, st, out);
  find_comm_bound(run, st, out);
  find_input_bound(run, st, out);
  if (out.empty()) out.push_back(step_breakdown(st));
  // After the rest, so that a run with nothing else to blame still gets its breakdown first.
  find_padding_bound(run, st, out);
  // After the rest too: it says why the figures above are larger than the job's own work, not what the job does.
  find_busy_host(st, out);
  return out;
}

const Finding& headline(const std::vector<Finding>& findings) {
  const Cause first = findings.front().cause;
  return findings.size() > 1 && (first == Cause::kBalanced || first == Cause::kSingleRank) ? findings[1]
                                                                                           : findings.front();
}

std::vector<std::string> blame(const RunRecord& run, const RunSummary& summary) {
  std::vector<std::string> lines;
  for (const Finding& f : diagnose(run, summary)) lines.push_back(f.text);
  return lines;
}

}  // namespace ddplab
