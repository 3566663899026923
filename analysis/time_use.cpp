#include "analysis/time_use.h"

#include <algorithm>
#include <utility>

#include "analysis/stats.h"

namespace ddplab {
namespace {

using Interval = std::pair<double, double>;  // [begin, end), ms on the run's clock

// The communication thread's intervals in one step, merged: bucket all-reduces (or reduce-scatters) and all-gathers.
std::vector<Interval> comm_intervals(const RunRecord& run, int rank, int step) {
  std::vector<Interval> all;
  for (int k = 0; k < static_cast<int>(run.buckets.size()); ++k) {
    const BucketTimes& b = run.bucket_at(rank, step, k);
    if (b.comm_end_ms > b.comm_start_ms) all.emplace_back(b.comm_start_ms, b.comm_end_ms);
    if (b.gather_end_ms > b.gather_start_ms) all.emplace_back(b.gather_start_ms, b.gather_end_ms);
  }
  std::sort(all.begin(), all.end());
  std::vector<Interval> merged;
  for (const Interval& i : all) {
    if (!merged.empty() && i.first <= merged.back().second)
      merged.back().second = std::max(merged.back().second, i.second);
    else
      merged.push_back(i);
  }
  return merged;
}

// The compute thread's computing in one step: forward, backward and the optimizer, placed by the phases' order
// (they tile the step from its start; with gradient accumulation the micro-batches' phases as one block each, which
// still ends backward where the last micro-batch's did, and only that one communicates).
std::vector<Interval> compute_intervals(const StepRecord& x) {
  std::vector<Interval> out;
  double t = x.start_ms;
  for (const StepField& f : kStepFields) {
    if (f.kind != FieldKind::kPhase) continue;
    const double ms = x.*f.member;
    if (f.member == &StepRecord::forward_ms || f.member == &StepRecord::backward_ms ||
        f.member == &StepRecord::optimizer_ms)
      out.emplace_back(t, t + ms);
    t += ms;
  }
  return out;
}

double overlap_ms(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double sum = 0;
  for (const Interval& x : a)
    for (const Interval& y : b) sum += std::max(0.0, std::min(x.second, y.second) - std::max(x.first, y.first));
  return sum;
}

}  // namespace

std::vector<RankTimeUse> time_use(const RunRecord& run, int first_steady) {
  const int counted = run.steps - first_steady;
  if (counted <= 0) return {};
  std::vector<RankTimeUse> out(run.world_size());
  for (int r = 0; r < run.world_size(); ++r) {
    RankTimeUse& u = out[r];
    for (int s = first_steady; s < run.steps; ++s) {
      const StepRecord& x = run.at(r, s);
      const std::vector<Interval> comm = comm_intervals(run, r, s);
      for (const Interval& i : comm) u.comm_ms += i.second - i.first;
      u.overlapped_ms += overlap_ms(comm, compute_intervals(x));
      u.computing_ms += x.forward_ms + x.backward_ms + x.optimizer_ms;
      u.idle_data_ms += x.data_ms;
      u.idle_peers_ms += x.exposed_comm_ms + x.extra_comm_ms + x.barrier_ms;
      u.idle_host_ms += x.host_work_ms + untimed_ms(x);
    }
    for (double* v :
         {&u.comm_ms, &u.overlapped_ms, &u.computing_ms, &u.idle_data_ms, &u.idle_peers_ms, &u.idle_host_ms})
      *v /= counted;
  }
  return out;
}

std::vector<BucketArrival> bucket_arrivals(const RunRecord& run, int first_steady) {
  const int world = run.world_size();
  std::vector<BucketArrival> out(run.buckets.size());
  if (world < 2 || first_steady >= run.steps) return out;
  for (int k = 0; k < static_cast<int>(run.buckets.size()); ++k) {
    std::vector<int> last_count(world, 0);
    std::vector<double> spreads;
    std::vector<std::vector<double>> leads(world);  // per rank: its lead in the steps it was last
    for (int s = first_steady; s < run.steps; ++s) {
      std::vector<std::pair<double, int>> ready;  // (ready, rank), latest last
      for (int r = 0; r < world; ++r) ready.emplace_back(run.bucket_at(r, s, k).ready_ms, r);
      std::sort(ready.begin(), ready.end());
      const int last = ready.back().second;
      ++last_count[last];
      spreads.push_back(ready.back().first - ready.front().first);
      leads[last].push_back(ready.back().first - ready[world - 2].first);
    }
    BucketArrival& a = out[k];
    a.last_rank = static_cast<int>(std::max_element(last_count.begin(), last_count.end()) - last_count.begin());
    a.last_steps = last_count[a.last_rank];
    a.spread_ms = median(spreads);
    a.lead_ms = median(leads[a.last_rank]);
  }
  return out;
}

nlohmann::json to_json(const RankTimeUse& u) {
  return {{"comm_ms", u.comm_ms},
          {"overlapped_ms", u.overlapped_ms},
          {"overlap", u.overlap()},
          {"computing_ms", u.computing_ms},
          {"idle", {{"data_ms", u.idle_data_ms}, {"peers_ms", u.idle_peers_ms}, {"host_ms", u.idle_host_ms}}}};
}

nlohmann::json to_json(const BucketArrival& a) {
  return {{"last_rank", a.last_rank}, {"last_steps", a.last_steps}, {"spread_ms", a.spread_ms}, {"lead_ms", a.lead_ms}};
}

}  // namespace ddplab
