#include "analysis/predict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "analysis/format.h"
#include "analysis/summary.h"
#include "config/train_config.h"
#include "record/files.h"

namespace ddplab {
namespace {

// DDPLAB_COMM_SPIN_US of the runs that did not record it: the default then (runtime/settings.h).
constexpr int kCommSpinUsOfOlderFiles = 50;

struct Interval {
  double begin = 0, end = 0;
};

double overlap(const Interval& a, const Interval& b) {
  return std::max(0.0, std::min(a.end, b.end) - std::max(a.begin, b.begin));
}

bool same_link(const LinkModel& a, const LinkModel& b) { return a.latency_us == b.latency_us && a.gbps == b.gbps; }
bool emulated(const LinkModel& link) { return link.latency_us > 0 || link.gbps > 0; }

// The link's own cost: its latency per message step, its bandwidth per byte.
AlphaBeta link_alpha_beta(const LinkModel& link) {
  return {link.latency_us / 1000.0, link.gbps > 0 ? 1.0 / (link.gbps * 1e9 / 8 / 1000) : 0.0};
}

// allreduce_perf's name of an implementation with its wire.
std::string impl_name(AllreduceImpl impl, WireDtype wire) {
  return wire == WireDtype::kFp32 ? to_string(impl) : std::string(to_string(impl)) + "-" + to_string(wire);
}

// The slower of two links for the bytes of a large all-reduce: bandwidth first, then latency.
bool slower(const LinkModel& a, const LinkModel& b) {
  const AlphaBeta x = link_alpha_beta(a), y = link_alpha_beta(b);
  return x.beta_ms_per_byte != y.beta_ms_per_byte ? x.beta_ms_per_byte > y.beta_ms_per_byte : x.alpha_ms > y.alpha_ms;
}

// One bucket's all-reduce under `setting`, with each class of hop's alpha and beta (chunk_bytes: allreduce_terms').
double allreduce_ms(double bytes, const PredictSetting& setting, double small_max_bytes, const HopCosts& costs,
                    double chunk_bytes, bool doubling) {
  switch (setting.impl) {
    case AllreduceImpl::kRing:
      return ring_ms(bytes, setting.ranks, setting.nodes(), setting.wire, small_max_bytes, costs, chunk_bytes,
                     doubling);
    case AllreduceImpl::kMpi:
      return mpi_ms(bytes, setting.ranks, setting.nodes(), costs);
    case AllreduceImpl::kHier:
      return hier_ms(bytes, setting.ranks, setting.nodes(), setting.wire, costs);
    case AllreduceImpl::kNccl:  // no model: `ddplab predict` refuses a GPU run's setting (launcher/predict_command.cpp)
      break;
  }
  return 0;
}

std::string mb_text(double bytes) {
  std::ostringstream s;
  s << std::setprecision(3) << bytes / kMiB << " MiB";
  return s.str();
}

// An fp32 buffer's bytes as they cross the wire: half of them in 16 bits.
double wire_bytes_of(double bytes, WireDtype wire) { return wire == WireDtype::kFp32 ? bytes : bytes / 2; }

}  // namespace

AllreduceTerms allreduce_terms(double bytes, int ranks, AllreduceImpl impl, WireDtype wire, double small_max_bytes,
                               int nodes, double chunk_bytes, bool doubling) {
  if (ranks <= 1 || bytes <= 0) return {};
  const double n = ranks, wire_bytes = wire_bytes_of(bytes, wire);
  if (impl == AllreduceImpl::kHier) {
    const double across = std::max(nodes, 1);
    return {2 * (across - 1), 2 * (across - 1) / across * wire_bytes};
  }
  if (impl == AllreduceImpl::kRing && bytes <= small_max_bytes) {
    const double steps = doubling_steps(ranks);
    return {steps, steps * wire_bytes};
  }
  const bool gpu_ring = impl == AllreduceImpl::kRing && chunk_bytes > 0;
  if (gpu_ring && doubling) {
    const double steps = doubling_steps(ranks);  // a round's
    return {steps * std::ceil(bytes / chunk_bytes), steps * wire_bytes};
  }
  const double rounds = gpu_ring ? std::ceil(bytes / (n * chunk_bytes)) : 1;
  return {2 * (n - 1) * rounds, 2 * (n - 1) / n * wire_bytes};
}

double ring_ms(double bytes, int ranks, int nodes, WireDtype wire, double small_max_bytes, const HopCosts& costs,
               double chunk_bytes, bool doubling) {
  const AllreduceTerms flat =
      allreduce_terms(bytes, ranks, AllreduceImpl::kRing, wire, small_max_bytes, 1, chunk_bytes, doubling);
  if (nodes <= 1) return costs.intra.ms(flat);
  if (bytes > small_max_bytes)
    return std::max(costs.intra.ms(flat), costs.inter.ms({flat.message_steps, flat.bytes * kRingStreamsPerNic}));
  // Recursive doubling: exchanges at distance 1, 2, 4, ... < p stay within a node while shorter than K, then every
  // rank of the node sends across at once; the ranks beyond p fold in and out across nodes (p > n/2 >= K).
  const int per_node = ranks / nodes;
  const double message = wire_bytes_of(bytes, wire);
  int p = 1;
  while (p <= ranks / 2) p *= 2;  // not p * 2 <= ranks: past 2^30 that overflows, and the loop never ends
  double ms = 0;
  for (int distance = 1; distance < p; distance *= 2)
    ms += distance < per_node ? costs.intra.ms({1, message}) : costs.inter.ms({1, per_node * message});
  if (p < ranks) ms += 2 * costs.inter.ms({1, std::min(per_node, ranks - p) * message});
  return ms;
}

double mpi_ms(double bytes, int ranks, int nodes, const HopCosts& costs) {
  const AllreduceTerms ring = allreduce_terms(bytes, ranks, AllreduceImpl::kMpi, WireDtype::kFp32, 0);
  return nodes > 1 ? std::max(costs.intra.ms(ring), costs.inter.ms(ring)) : costs.intra.ms(ring);
}

double hier_ms(double bytes, int ranks, int nodes, WireDtype wire, const HopCosts& costs) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double per_node = ranks / std::max(nodes, 1), wire_bytes = wire_bytes_of(bytes, wire);
  const AllreduceTerms within{2 * (per_node - 1), 2 * (per_node - 1) / per_node * wire_bytes};  // both halves
  const double node_ms = costs.intra.ms(within);
  const double across_ms = costs.inter.ms(allreduce_terms(bytes, ranks, AllreduceImpl::kHier, wire, 0, nodes));
  if (node_ms == 0 || across_ms == 0) return node_ms + across_ms;
  // Pipelined by the ring's rounds (comm/hier_allreduce.h): the longer of the two runs end to end, the shorter is
  // exposed for one round only (the first round's reduce-scatter, or the last one's all-gather).
  const RingOptions ring = ring_options(wire);
  const double round_elems = static_cast<double>(ring.slice_elems * ring.slices_per_chunk) * per_node;
  const double rounds = ring.slice_elems ? std::max(1.0, std::ceil(bytes / sizeof(float) / round_elems)) : 1;
  return std::max(node_ms, across_ms) + std::min(node_ms, across_ms) / rounds;
}

std::string shape_text(const PredictSetting& s) {
  return s.nodes() == 1 ? "1 node" : std::to_string(s.nodes()) + " nodes x " + std::to_string(s.ranks_on_a_node());
}

namespace {

// A preset's name, or where --link-latency-us or --link-gbps changed it, the link's own figures beside the name: two
// links of one name are two links.
std::string link_name(const LinkModel& link) {
  LinkModel preset;
  try {
    preset = parse_link(link.name);
  } catch (const std::invalid_argument&) {
    return describe(link);
  }
  return preset.latency_us == link.latency_us && preset.gbps == link.gbps ? link.name : describe(link);
}

}  // namespace

std::string link_spec(const LinkClasses& links) {
  return links.per_class() ? "intra=" + link_name(links.intra) + ",inter=" + link_name(links.inter)
                           : link_name(links.intra);
}

std::vector<double> nonnegative_least_squares(const std::vector<std::vector<double>>& rows,
                                              const std::vector<double>& y) {
  const size_t k = rows.empty() ? 0 : rows[0].size();
  std::vector<double> best(k, 0.0);
  double best_residual = 0;
  for (double v : y) best_residual += v * v;  // the empty subset: every coefficient 0
  for (unsigned subset = 1; subset < (1u << k); ++subset) {
    std::vector<size_t> cols;
    for (size_t c = 0; c < k; ++c)
      if (subset >> c & 1) cols.push_back(c);
    const size_t m = cols.size();
    // Normal equations of the subset, solved by Gauss-Jordan elimination with partial pivoting.
    std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0.0));
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t p = 0; p < m; ++p) {
        for (size_t q = 0; q < m; ++q) a[p][q] += rows[i][cols[p]] * rows[i][cols[q]];
        a[p][m] += rows[i][cols[p]] * y[i];
      }
    double scale = 0;
    for (size_t p = 0; p < m; ++p) scale = std::max(scale, a[p][p]);
    bool singular = false;
    for (size_t p = 0; p < m && !singular; ++p) {
      size_t pivot = p;
      for (size_t r = p + 1; r < m; ++r)
        if (std::fabs(a[r][p]) > std::fabs(a[pivot][p])) pivot = r;
      std::swap(a[p], a[pivot]);
      singular = !(std::fabs(a[p][p]) > 1e-12 * scale);
      for (size_t r = 0; r < m && !singular; ++r)
        if (r != p) {
          const double f = a[r][p] / a[p][p];
          for (size_t q = p; q <= m; ++q) a[r][q] -= f * a[p][q];
        }
    }
    if (singular) continue;
    std::vector<double> x(k, 0.0);
    bool feasible = true;
    for (size_t p = 0; p < m; ++p) feasible = feasible && (x[cols[p]] = a[p][m] / a[p][p]) >= 0;
    if (!feasible) continue;
    double residual = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      double e = y[i];
      for (size_t c = 0; c < k; ++c) e -= rows[i][c] * x[c];
      residual += e * e;
    }
    if (residual < best_residual * (1 - 1e-12)) best = x, best_residual = residual;
  }
  return best;
}

bool per_step_cost_separable(const std::vector<AllreduceTerms>& terms) {
  // Ratios of bytes to message steps at least 2x apart, or a cost per step and one per byte cannot be told apart:
  // from two sizes 25% apart (the `small` transformer's 3.2 and 4 MB buckets) the noise in their times became an
  // alpha of 0.7 ms per step, and every 0.5 MB bucket was predicted 40% too slow.
  constexpr double kMinContrast = 2;
  double lowest = 0, highest = 0;
  for (const AllreduceTerms& x : terms) {
    if (x.message_steps <= 0) continue;
    const double per_step = x.bytes / x.message_steps;
    lowest = lowest > 0 ? std::min(lowest, per_step) : per_step;
    highest = std::max(highest, per_step);
  }
  return lowest > 0 && highest >= kMinContrast * lowest;
}

std::optional<CommFit> fit_comm(const std::vector<AllreduceTerms>& terms, const std::vector<double>& time_ms,
                                std::optional<double> link_latency_ms) {
  const bool separable = per_step_cost_separable(terms);
  if (!separable && !link_latency_ms) return std::nullopt;
  std::vector<std::vector<double>> rows;
  std::vector<double> y;
  for (size_t i = 0; i < terms.size(); ++i) {
    if (separable) {
      rows.push_back({terms[i].message_steps, terms[i].bytes});
      y.push_back(time_ms[i]);
    } else {
      rows.push_back({terms[i].bytes});
      y.push_back(time_ms[i] - *link_latency_ms * terms[i].message_steps);
    }
  }
  const std::vector<double> x = nonnegative_least_squares(rows, y);
  return CommFit{separable ? AlphaBeta{x[0], x[1]} : AlphaBeta{*link_latency_ms, x[0]}, !separable};
}

namespace {

// One step with rank r starting at offsets[r]: when each rank's backward ends (absolute), when the last
// all-reduce ends, each rank's backward time beside comm, the sum of the all-reduces' durations.
struct StepTimes {
  std::vector<double> backward_end, hidden;
  std::vector<double> bucket_end;  // when each all-reduce ended
  double comm_end = 0, comm_total = 0;
};

// The replay of one step on a clock of small time steps: each rank's backward, slowed while an all-reduce runs beside
// it, and the all-reduces one at a time in bucket order, each stalled while a backward runs beside it.
class StepReplay {
 public:
  StepReplay(const std::vector<RankProfile>& ranks, const std::vector<double>& offsets,
             const std::vector<Bucket>& buckets, const std::vector<BucketCost>& cost, bool overlap_on,
             const HostCores& host)
      : ranks_(ranks), offsets_(offsets), buckets_(buckets), cost_(cost), overlap_on_(overlap_on), host_(host) {
    out_.backward_end.assign(ranks.size(), -1.0);
    out_.hidden.assign(ranks.size(), 0.0);
    work_.assign(ranks.size(), 0.0);
  }

  StepTimes run() {
    const size_t n = ranks_.size(), nb = buckets_.size();
    double horizon = 0, comm_alone = 0;
    for (size_t r = 0; r < n; ++r)
      horizon = std::max(horizon, offsets_[r] + ranks_[r].before_ms + ranks_[r].backward_ms);
    for (const BucketCost& c : cost_) comm_alone += c.alone_ms;
    // Backward beside comm takes at most twice as long (HostCores::backward_slowdown), and comm stalls for it at most.
    const double dt = std::max((2 * horizon + comm_alone) / 20000, 1e-9);
    for (double t = 0;; t += dt) {
      start_ready_allreduces(t);
      bool backward_runs = false;
      for (size_t r = 0; r < n; ++r) backward_runs = backward_runs || in_backward(r, t);
      if (left_ < 0 && next_ == nb && t >= horizon && !backward_runs) break;
      const bool comm_runs = left_ >= 0;
      const double last_backward_end = advance_backward(t, dt, comm_runs);
      if (comm_runs) advance_allreduce(t, dt, last_backward_end);
    }
    return out_;
  }

 private:
  bool in_backward(size_t r, double t) const {
    return t >= offsets_[r] + ranks_[r].before_ms && out_.backward_end[r] < 0;
  }

  bool ready(size_t j) const {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const double needed = overlap_on_ ? ranks_[r].piece_ready_ms.at(buckets_[j].last_piece) : ranks_[r].backward_ms;
      if (out_.backward_end[r] < 0 && work_[r] < needed) return false;
    }
    return true;
  }

  // Starts the next all-reduces whose buckets every rank has ready, while none runs.
  void start_ready_allreduces(double t) {
    while (left_ < 0 && next_ < buckets_.size() && ready(next_)) {  // an all-reduce of nothing ends as it starts
      const BucketCost& c = cost_[next_++];
      double backward_left = 0;  // the most backward left on a rank, at its pace alone
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (in_backward(r, t)) backward_left = std::max(backward_left, ranks_[r].backward_ms - work_[r]);
      const double stall = backward_left > 0 ? host_.stall_beside_backward_ms(c.message_steps) : 0;
      pace_beside_ = stall <= 0 ? 1 : std::isinf(stall) ? 0 : c.alone_ms / (c.alone_ms + stall);
      // Its CPU spread over its time: its stalls and its time alone, or until backward ends and then alone.
      slowdown_ =
          backward_left > 0 ? host_.backward_slowdown(c.cpu_ms, std::min(backward_left, stall) + c.alone_ms) : 0;
      left_ = c.alone_ms > 0 ? c.alone_ms : -1;
      comm_start_ = out_.comm_end = t;
      if (left_ < 0) out_.bucket_end.push_back(t);
    }
  }

  // Every rank's backward over [t, t + dt); returns the latest backward end so far.
  double advance_backward(double t, double dt, bool comm_runs) {
    double last_backward_end = 0;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (in_backward(r, t)) {
        const double pace = comm_runs ? 1 / (1 + slowdown_) : 1;
        const double used = std::min(dt, (ranks_[r].backward_ms - work_[r]) / pace);
        work_[r] += used * pace;
        if (comm_runs) out_.hidden[r] += used;
        if (used < dt || work_[r] >= ranks_[r].backward_ms) out_.backward_end[r] = t + used;
      }
      last_backward_end = std::max(last_backward_end, out_.backward_end[r]);
    }
    return last_backward_end;
  }

  // The running all-reduce's progress over [t, t + dt): stalled while a backward runs, at its pace alone after.
  void advance_allreduce(double t, double dt, double last_backward_end) {
    double from = t, pace = 1;
    if (pace_beside_ < 1) {
      bool beside = false;
      for (size_t r = 0; r < ranks_.size(); ++r) beside = beside || in_backward(r, t + dt);
      if (beside)
        pace = pace_beside_;
      else
        from = last_backward_end, pace_beside_ = 1;
    }
    const double progress = (t + dt - from) * pace;
    if (left_ <= progress) {
      out_.comm_end = from + left_ / pace;
      out_.bucket_end.push_back(out_.comm_end);
      out_.comm_total += out_.comm_end - comm_start_;
      left_ = -1;
    } else {
      left_ -= progress;
    }
  }

  const std::vector<RankProfile>& ranks_;
  const std::vector<double>& offsets_;
  const std::vector<Bucket>& buckets_;
  const std::vector<BucketCost>& cost_;
  const bool overlap_on_;
  const HostCores& host_;
  StepTimes out_;
  std::vector<double> work_;  // each rank's backward done, at its pace alone
  size_t next_ = 0;           // the next bucket to start
  double left_ = -1;          // ms left of the running all-reduce, once it runs at its pace alone; < 0: none runs
  double pace_beside_ = 1;    // its pace while backward runs: its time alone over that plus its stalls
  double slowdown_ = 0;       // backward's, beside it
  double comm_start_ = 0;
};

StepTimes replay(const std::vector<RankProfile>& ranks, const std::vector<double>& offsets,
                 const std::vector<Bucket>& buckets, const std::vector<BucketCost>& cost, bool overlap_on,
                 const HostCores& host) {
  return StepReplay(ranks, offsets, buckets, cost, overlap_on, host).run();
}

}  // namespace

// A rank's update after backward: all of it after the last all-reduce, or (update_share) each bucket's share as soon
// as backward and that bucket's all-reduce are done, in bucket order. Returns when it ends.
double update_end(double backward_end, double after_ms, const StepTimes& t, const std::vector<double>& update_share) {
  if (update_share.empty()) return std::max(backward_end, t.comm_end) + after_ms;
  double end = backward_end;
  for (size_t b = 0; b < update_share.size(); ++b) end = std::max(end, t.bucket_end.at(b)) + after_ms * update_share[b];
  return end;
}

namespace {

// Each bucket's share of the parameters: the share of the update that follows its all-reduce (a setting's buckets,
// or a run file's).
template <class AnyBucket>
std::vector<double> update_shares(const std::vector<AnyBucket>& buckets) {
  double total = 0;
  for (const AnyBucket& b : buckets) total += static_cast<double>(b.count);
  std::vector<double> share;
  for (const AnyBucket& b : buckets) share.push_back(total > 0 ? b.count / total : 0.0);
  return share;
}

// The update that update_end ends at step_end: what a rank's step spent on it, read back from when the step ended. An
// update bucket by bucket left only the shares that waited for the last all-reduces after it; the others ran beside
// them. update_end grows at least as fast as the update (its shares add up to all of it), so one update fits: found
// by halving.
double update_ending_at(double step_end, double backward_end, const StepTimes& t,
                        const std::vector<double>& update_share) {
  double low = 0, high = std::max(0.0, step_end - backward_end);
  if (update_end(backward_end, low, t, update_share) >= step_end) return 0;
  while (high - low > 1e-9) {
    const double mid = (low + high) / 2;
    (update_end(backward_end, mid, t, update_share) < step_end ? low : high) = mid;
  }
  return (low + high) / 2;
}

}  // namespace

SimulatedStep simulate_steps(const std::vector<std::vector<RankProfile>>& steps, const std::vector<Bucket>& buckets,
                             const std::vector<BucketCost>& cost, bool overlap_on, const HostCores& host,
                             const std::vector<double>& update_share) {
  // A rank starts its next step when it finishes this one, so ranks that finish later (a longer optimizer) start
  // later. The steps are replayed in order, first to let the ranks' start offsets settle, then to measure. A long
  // run's are sampled in kBlocks evenly spaced blocks of kBlockSteps consecutive steps: each replay costs ~20000 time
  // steps (a 3000-step run took 13.7 s replayed whole), and consecutive steps keep a cost of every k-th step (a
  // barrier every 4) at its share, which a stride could alias to none or to every step.
  constexpr size_t kBlocks = 4, kBlockSteps = 50;
  const size_t n = steps.at(0).size(), all = steps.size(), count = std::min(all, kBlocks * kBlockSteps);
  const auto sampled = [&](size_t i) -> const std::vector<RankProfile>& {
    if (count == all) return steps[i];
    return steps[i / kBlockSteps * (all - kBlockSteps) / (kBlocks - 1) + i % kBlockSteps];
  };
  const size_t settle = std::max<size_t>(count, 20);
  std::vector<double> offsets(n, 0.0), end(n), period(n, 0.0), backward(n, 0.0), exposed(n, 0.0), hidden(n, 0.0);
  double comm = 0;
  for (size_t i = 0; i < settle + count; ++i) {
    const std::vector<RankProfile>& ranks = sampled(i % count);
    const StepTimes t = replay(ranks, offsets, buckets, cost, overlap_on, host);
    for (size_t r = 0; r < n; ++r) end[r] = update_end(t.backward_end[r], ranks[r].after_ms, t, update_share);
    if (i >= settle) {
      comm += t.comm_total / count;
      for (size_t r = 0; r < n; ++r) {
        period[r] += (end[r] - offsets[r]) / count;
        backward[r] += (t.backward_end[r] - offsets[r] - ranks[r].before_ms) / count;
        // What the all-reduces add to the step beyond backward and the update.
        exposed[r] += std::max(0.0, end[r] - t.backward_end[r] - ranks[r].after_ms) / count;
        hidden[r] += t.hidden[r] / count;
      }
    }
    const double first = *std::min_element(end.begin(), end.end());
    for (size_t r = 0; r < n; ++r) offsets[r] = end[r] - first;
  }
  const size_t k = std::max_element(period.begin(), period.end()) - period.begin();
  return {period[k], static_cast<int>(k), backward[k], comm, exposed[k], hidden[k]};
}

SimulatedStep simulate_step(const std::vector<RankProfile>& ranks, const std::vector<Bucket>& buckets,
                            const std::vector<BucketCost>& cost, bool overlap_on, const HostCores& host) {
  return simulate_steps({ranks}, buckets, cost, overlap_on, host, {});
}

namespace {

// The GPU ring's chunk an allreduce_perf command line asked for (--gpu-chunk-mb X; 0 or none: the trainer's), in MiB:
// what files written before allreduce_perf recorded `gpu_chunk_mb` say of it.
double chunk_mb_in_args(const std::string& args) {
  std::istringstream words(args);
  double mb = 0;
  for (std::string word; words >> word;)
    if (word == "--gpu-chunk-mb" && !(words >> mb)) mb = 0;
  return mb > 0 ? mb : kGpuRingChunkBytes / kMiB;
}

}  // namespace

Calibration read_calibration(const std::string& path) {
  const auto fail = [&](const std::string& why) {
    return std::runtime_error("cannot read calibration " + path + ": " + why);
  };
  off_t size = 0;
  if (const std::string problem = input_file_problem(path, &size); !problem.empty()) throw fail(problem);
  constexpr off_t kLargest = off_t{64} << 20;  // allreduce_perf's files are kilobytes
  if (size > kLargest) throw fail("larger than 64 MiB, which no allreduce_perf file is");
  std::ifstream in(path);
  if (!in) throw fail("cannot open it");
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  Calibration cal;
  cal.path = path;
  // allreduce_perf's -J file. Its CSV is a table for people: it does not say what a fit needs beyond the times
  // (each GPU row's algorithm, the link's figures past its preset, the nodes, the direct all-reduce, the chunk).
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw fail("empty file");
  if (s[first] != '{')
    throw fail(
        "not allreduce_perf's -J file (its --csv does not say each row's algorithm, the link's figures or the "
        "nodes): give the -J file");
  try {
    const nlohmann::json j = nlohmann::json::parse(s);
    const double ranks = j.at("nranks").get<double>();
    if (!(ranks >= 2 && ranks <= (1 << 24) && ranks == std::floor(ranks)))
      throw fail("nranks " + fmt("%g", ranks) + ": not a world size of 2 or more ranks (nothing to calibrate)");
    cal.ranks = static_cast<int>(ranks);
    for (const std::string& t : j.value("transports", std::vector<std::string>()))
      if (names_direct_collectives(t)) cal.direct_impls.push_back(t.substr(0, t.find(" over ")));
    if (j.contains("node_of_rank")) {
      const auto node_of_rank = j.at("node_of_rank").get<std::vector<int>>();
      const bool each_rank_a_node = static_cast<int>(node_of_rank.size()) == cal.ranks &&
                                    std::all_of(node_of_rank.begin(), node_of_rank.end(),
                                                [&](int node) { return node >= 0 && node < cal.ranks; });
      if (!each_rank_a_node)
        throw fail("node_of_rank does not give each of its " + std::to_string(cal.ranks) + " ranks a node");
      cal.nodes = static_cast<int>(std::set<int>(node_of_rank.begin(), node_of_rank.end()).size());
    }
    if (j.contains("gpus")) {
      const auto gpus = j.at("gpus").get<std::vector<std::string>>();
      if (static_cast<int>(gpus.size()) != cal.ranks)
        throw fail("gpus does not give each of its " + std::to_string(cal.ranks) + " ranks a GPU");
      cal.ranks_per_gpu = most_ranks_on_one_gpu(gpus, j.value("node_of_rank", std::vector<int>(gpus.size(), 0)));
    }
    cal.cold_calls = !j.value("hot_cache", true);
    cal.gpu_chunk_bytes = j.value("gpu_chunk_mb", chunk_mb_in_args(j.value("args", std::string()))) * kMiB;
    const nlohmann::json& link = j.at("link");
    cal.link = link.at("name").get<std::string>();
    cal.link_model = parse_link(cal.link, link.value("latency_us", -1.0), link.value("gbps", -1.0));
    for (const nlohmann::json& r : j.at("results"))
      cal.points.push_back({r.at("impl").get<std::string>(), r.at("size_bytes").get<double>(),
                            r.at("out_of_place").at("time_us").get<double>() / 1000,
                            r.value("algorithm", std::string()) == "recursive doubling"});
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("not allreduce_perf JSON (") + e.what() + ")");
  } catch (const std::invalid_argument& e) {
    throw fail(e.what());
  }
  if (cal.points.empty()) throw fail("no results");
  for (const Calibration::Point& p : cal.points)
    if (!(p.bytes > 0 && p.time_ms > 0 && std::isfinite(p.time_ms))) throw fail("a result with no size or time");
  return cal;
}

double backward_slowdown_beside_comm(int cores, int ranks, int threads, double comm_cpu_share) {
  const double compute = static_cast<double>(ranks) * threads;
  const double alone = std::min(1.0, cores / compute);
  const double beside = std::min(1.0, std::max(0.0, cores - ranks * comm_cpu_share) / compute);
  // Fair shares: a rank's comm thread is one more thread beside its `threads`, so it takes at most 1/threads.
  const double bound = 1.0 / threads;
  return beside <= 0 ? bound : std::clamp(alone / beside - 1, 0.0, bound);
}

double HostCores::stall_beside_backward_ms(double message_steps) const {
  // Ranks sharing a GPU take turns on it, and each exchange of their ring needs both. Two ranks on an H200:
  // gpt2-small's second bucket (154.5 MB, 2.2 ms alone) started 15 ms before backward's end and ended 0.4 ms after
  // it. Stalled until backward ends, the model replays the three runs of
  // bench/results/2026-11-29-h200-shared-gpu at +3.4% to +4.7%; advancing at their pace alone, at -25%.
  if (ranks_per_gpu > 1) return std::numeric_limits<double>::infinity();
  if (lost_yield_ms) return message_steps * *lost_yield_ms;
  return full() ? std::numeric_limits<double>::infinity() : 0;
}

double HostCores::backward_slowdown(double cpu_ms, double wall_ms) const {
  if (cores <= 0 || wall_ms <= 0) return 0;
  return backward_slowdown_beside_comm(cores, ranks, threads, std::min(1.0, cpu_ms / wall_ms));
}

namespace {

// The run's own setting, from its config (c: the run's, parsed).
PredictSetting measured_setting(const RunRecord& run, const TrainConfig& c) {
  PredictSetting s;
  s.bucket_mb = c.bucket_mb;
  s.first_bucket_mb = c.first_bucket_mb;
  s.last_bucket_mb = c.last_bucket_mb;
  s.bucket_rule = c.bucket_rule;
  s.overlap = c.overlap;
  s.link = parse_links(c.link, c.link_latency_us, c.link_gbps);
  s.ranks = run.world_size();
  s.ranks_per_node = run.nodes() > 1 ? run.world_size() / run.nodes() : 0;  // older files: one node
  s.impl = c.comm == AllreduceImpl::kNccl ? AllreduceImpl::kRing : c.comm;  // see build_model's note
  s.wire = c.comm_dtype;
  s.bucketed_update = c.device == Device::kCuda && c.update_in_backward();
  return s;  // ranks_per_gpu: the run's own (nullopt), as predict() resolves it
}

// Each run bucket's first and last piece in the layout the model cuts buckets from.
struct BucketSpan {
  int first_piece = 0, last_piece = 0;
};

// The layout buckets are cut from; without one in the file, the buckets stand in as pieces (they can merge, not
// split).
std::vector<BucketSpan> piece_layout(const RunRecord& run, StepModel& m) {
  const int nb = static_cast<int>(run.buckets.size());
  std::vector<BucketSpan> spans(nb);
  m.pieces = run.pieces;
  for (int b = 0; b < nb; ++b) spans[b] = {run.buckets[b].first_piece, run.buckets[b].last_piece};
  if (!m.pieces.empty()) return spans;
  int64_t offset = 0;
  for (int b = 0; b < nb; ++b) {
    m.pieces.push_back({offset, run.buckets[b].count});
    offset += run.buckets[b].count;
    spans[b] = {b, b};
  }
  m.notes.push_back("the file has no piece layout: its " + std::to_string(nb) +
                    " buckets stand in as pieces, so smaller caps cannot split them");
  return spans;
}

// The communicating backward of every steady step and rank, cut at the buckets' ready times into nb + 1 intervals
// (the last, after the last bucket, is the tail): each interval's length and how long each bucket's all-reduce ran
// in it. With gradient accumulation that backward is the last micro-batch's (last_backward()).
struct BackwardIntervals {
  using PerInterval = std::vector<double>;                  // nb + 1 intervals
  std::vector<std::vector<PerInterval>> length;             // [steady step][rank]
  std::vector<std::vector<std::vector<PerInterval>>> busy;  // [steady step][rank][bucket]
  std::vector<std::vector<Interval>> backward;              // [rank][step], absolute
};

BackwardIntervals cut_backward(const RunRecord& run, const TrainConfig& config, bool bucketed_update,
                               std::vector<std::vector<RankProfile>>& steps) {
  const int world = run.world_size(), nb = static_cast<int>(run.buckets.size());
  const std::vector<double> update_share = bucketed_update ? update_shares(run.buckets) : std::vector<double>{};
  const int first = run.first_steady_step(), steady = run.steps - first;
  const int micro = std::max(1, config.grad_accum);
  BackwardIntervals out;
  const BackwardIntervals::PerInterval intervals(nb + 1);
  out.length.assign(steady, std::vector<BackwardIntervals::PerInterval>(world, intervals));
  out.busy.assign(steady, std::vector<std::vector<BackwardIntervals::PerInterval>>(
                              world, std::vector<BackwardIntervals::PerInterval>(nb, intervals)));
  out.backward.assign(world, std::vector<Interval>(run.steps));
  steps.assign(steady, std::vector<RankProfile>(world));
  for (int s = first; s < run.steps; ++s) {
    StepTimes done;  // each all-reduce done on every rank: where the replay's comm ends
    done.bucket_end.assign(nb, 0.0);
    for (int r = 0; r < world; ++r)
      for (int b = 0; b < nb; ++b)
        done.bucket_end[b] = std::max(done.bucket_end[b], run.bucket_at(r, s, b).comm_end_ms);
    for (double end : done.bucket_end) done.comm_end = std::max(done.comm_end, end);
    for (int r = 0; r < world; ++r) {
      RankProfile& p = steps[s - first][r];
      const StepRecord& x = run.at(r, s);
      const double backward = last_backward(x, micro);
      const double start = x.start_ms + x.data_ms + x.forward_ms + x.backward_ms - backward;
      out.backward[r][s] = {start, start + backward};
      p.before_ms = start - x.start_ms;
      // After: what the replay's update (update_end) must take to end the rank's step where it ended, so measured
      // from where the replay resumes the rank (its backward's end or the last rank's last all-reduce done,
      // whichever is later), not from the end of its exposed wait: the training thread, woken when its all-reduces
      // are done, waits for a core on oversubscribed cores (MLP, 4 ranks on 2 cores: 1-2 ms a step for the rank that
      // sets the next step's pace). That wait is in exposed_comm_ms, which the replay computes itself, so measured
      // from there it was lost. An update bucket by bucket is taken whole, its shares that ran beside the last
      // all-reduces included.
      p.after_ms = update_ending_at(x.start_ms + x.step_ms, start + backward, done, update_share);
      double previous = start;
      for (int b = 0; b <= nb; ++b) {
        const double ready =
            b < nb ? std::clamp(run.bucket_at(r, s, b).ready_ms, previous, start + backward) : start + backward;
        for (int k = 0; k < nb; ++k) {
          const BucketTimes& t = run.bucket_at(r, s, k);
          out.busy[s - first][r][k][b] = overlap({previous, ready}, {t.comm_start_ms, t.comm_end_ms});
        }
        out.length[s - first][r][b] = ready - previous;
        previous = ready;
      }
    }
  }
  return out;
}

// Backward's slowdown beside comm, from the CPU time the comm threads spent on their all-reduces and the cores
// of rank 0's host (docs/PREDICT.md). Returned, per run bucket: the slowdown its own all-reduces caused, from their
// share of a core (CPU over wall time, pooled over steady steps and ranks), to be taken out of the run's backward.
// Kept for other settings: the CPU an all-reduce costs, fitted on its terms, and the host's cores, ranks, threads.
std::vector<double> measure_backward_slowdown(const RunRecord& run, const TrainConfig& config,
                                              const BackwardIntervals& t, StepModel& m) {
  const int world = run.world_size(), nb = static_cast<int>(run.buckets.size());
  std::vector<double> slowdown(nb, 0.0);
  if (world <= 1) {
    m.slowdown_source = "none (one rank: no comm thread)";
    return slowdown;
  }
  std::vector<double> cpu(nb, 0.0), wall(nb, 0.0);
  double pooled_cpu[2] = {0, 0}, pooled_wall[2] = {0, 0};  // [started beside backward]
  std::vector<AllreduceTerms> terms;
  std::vector<double> cpu_ms;
  const double small = static_cast<double>(small_allreduce_bytes(world, m.measured_direct));
  for (int s = run.first_steady_step(); s < run.steps; ++s)
    for (int r = 0; r < world; ++r)
      for (int b = 0; b < nb; ++b) {
        const BucketTimes& x = run.bucket_at(r, s, b);
        if (x.comm_cpu_ms < 0) {
          m.slowdown_source = "not measured (the run file has no comm thread CPU times: an older writer or a GPU run)";
          return std::vector<double>(nb, 0.0);
        }
        const double duration = std::max(0.0, x.comm_end_ms - x.comm_start_ms);
        const Interval& backward = t.backward[r][s];
        const bool beside = backward.begin <= x.comm_start_ms && x.comm_start_ms < backward.end;
        cpu[b] += x.comm_cpu_ms, wall[b] += duration;
        pooled_cpu[beside] += x.comm_cpu_ms, pooled_wall[beside] += duration;
        terms.push_back(allreduce_terms(static_cast<double>(run.buckets[b].bytes()), world, m.measured.impl,
                                        m.measured.wire, small, m.measured.nodes()));
        cpu_ms.push_back(x.comm_cpu_ms);
      }
  if (run.meta.host_cores <= 0) {
    m.slowdown_source = "not measured (the run file does not say how many cores its ranks had)";
    return slowdown;
  }
  const std::vector<std::string>& hosts = run.meta.hostnames;
  m.host.cores = run.meta.host_cores;
  m.host.ranks = hosts.empty() ? world : static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[0]));
  m.host.threads = std::max(1, config.blas_threads);
  if (run.meta.comm_lost_yield_us) m.host.lost_yield_ms = *run.meta.comm_lost_yield_us / 1000.0;
  // The CPU on the all-reduce's terms, like its time. From alike sizes the part per message step cannot be told
  // from the part per byte, and their noise went into the first: `small`'s 3.2 and 4 MB buckets at 4 ranks gave
  // 1.1 ms per all-reduce, ~4x what its 0.3-0.5 MB all-reduces took when measured (0.16-0.43 ms), so ten of them
  // beside backward made backward 2x as long and the step 10-20% slow. Then the part per step is the polling: a
  // comm thread whose peer is late (beside backward, the peer waits for a core) polls for the run's spin time
  // before it sleeps, once per message step; the rest is per byte.
  const int spin_us = run.meta.comm_spin_us.value_or(kCommSpinUsOfOlderFiles);
  // With the polls as the part per message step where the sizes cannot separate it: always a fit.
  const CommFit fit = fit_comm(terms, cpu_ms, std::max(0, spin_us) / 1000.0).value();
  m.comm_cpu = fit.alone;
  const bool separable = !fit.latency_from_link;
  for (int b = 0; b < nb; ++b) slowdown[b] = m.host.backward_slowdown(cpu[b], wall[b]);
  const bool beside = pooled_wall[1] > 0;
  m.backward_slowdown = m.host.backward_slowdown(pooled_cpu[beside], pooled_wall[beside]);
  char text[320];
  std::snprintf(text, sizeof text,
                "the run's all-reduces%s (their comm threads on a core %.2f of the time; CPU %.3f ms per all-reduce "
                "+ %.3f ms per MiB%s), %d rank%s x %d thread%s on %d core%s",
                beside ? " beside backward" : " (none beside backward)",
                pooled_wall[beside] > 0 ? pooled_cpu[beside] / pooled_wall[beside] : 0.0,
                m.comm_cpu->alpha_ms * terms[0].message_steps, m.comm_cpu->beta_ms_per_byte * kMiB,
                separable ? "" : ": sizes too alike to fit, the part per all-reduce is the polls", m.host.ranks,
                m.host.ranks == 1 ? "" : "s", m.host.threads, m.host.threads == 1 ? "" : "s", m.host.cores,
                m.host.cores == 1 ? "" : "s");
  m.slowdown_source = text;
  return slowdown;
}

// Each piece's ready time in a backward without comm beside it: the intervals less what the run's own all-reduces
// beside them cost (a share s/(1+s) of the time each ran there, with its bucket's slowdown s), pieces inside a bucket
// placed in proportion to their elements.
void place_piece_ready_times(const BackwardIntervals& t, const std::vector<BucketSpan>& spans,
                             const std::vector<double>& slowdown, StepModel& m) {
  const size_t nb = spans.size();
  for (size_t s = 0; s < m.steps.size(); ++s)
    for (size_t r = 0; r < m.steps[s].size(); ++r) {
      RankProfile& p = m.steps[s][r];
      p.piece_ready_ms.assign(m.pieces.size(), 0);
      double done = 0;
      for (size_t b = 0; b <= nb; ++b) {
        double lost = 0;
        for (size_t k = 0; k < nb; ++k) lost += slowdown[k] / (1 + slowdown[k]) * t.busy[s][r][k][b];
        const double own = std::max(0.0, t.length[s][r][b] - lost);
        if (b == nb) {
          p.backward_ms = done + own;
          break;
        }
        const PieceRecord &lo = m.pieces[spans[b].first_piece], &hi = m.pieces[spans[b].last_piece];
        const double span = static_cast<double>(hi.offset + hi.numel - lo.offset);
        for (int k = spans[b].first_piece; k <= spans[b].last_piece; ++k)
          p.piece_ready_ms[k] =
              done + own * (span > 0 ? (m.pieces[k].offset + m.pieces[k].numel - lo.offset) / span : 1.0);
        done += own;
      }
    }
}

// Whether our GPU ring all-reduces `bytes` by recursive doubling at `ranks` ranks, `turns` of them on a GPU, over
// `link` (gpu_ring_doubles; chunk_bytes 0, not our GPU ring: never): as the trainer does now, where an emulated link
// times each exchange by its bytes even on a shared GPU, except at the run's own world and sharing where the run ran
// the ring throughout (its transport names no doubling), so that the model replays the run as it ran.
bool doubles(const StepModel& m, int ranks, int turns, const LinkClasses& link, double bytes, double chunk_bytes) {
  const bool as_run = ranks == m.measured.ranks && turns == m.run_turns();
  if (as_run && !m.measured_doubling) return false;
  return gpu_ring_doubles(ranks, turns > 1 && !link.emulated(), bytes, chunk_bytes);
}

// The all-reduce's cost from the run's buckets, per step: from the last rank joining to the last rank done (the
// next bucket waits for every rank's comm thread).
void fit_run_allreduce(const RunRecord& run, const BackwardIntervals& t, StepModel& m) {
  const int world = run.world_size(), nb = static_cast<int>(run.buckets.size());
  if (world <= 1) {
    m.notes.push_back("a single-rank run has no measured comm: all-reduce times come from the link model alone" +
                      std::string(m.calibration ? " and the calibration file" : ""));
    return;
  }
  // Fitted on the all-reduces that started with every rank out of backward (all of them if none did): on a full
  // host one beside backward waited for a core, and fitted together, the two or three the default run times (one
  // bucket beside backward, the closing one after it) put that wait into the time alone.
  std::vector<AllreduceTerms> terms, alone_terms;
  std::vector<double> times, alone_times;
  const double small = static_cast<double>(small_allreduce_bytes(world, m.measured_direct));
  for (int b = 0; b < nb; ++b) {
    const double bytes = static_cast<double>(run.buckets[b].bytes());
    m.measured_min_bucket = b ? std::min(m.measured_min_bucket, bytes) : bytes;
    m.measured_max_bucket = std::max(m.measured_max_bucket, bytes);
    for (int s = run.first_steady_step(); s < run.steps; ++s) {
      Interval comm{0, 0};
      for (int r = 0; r < world; ++r) {
        comm.begin = std::max(comm.begin, run.bucket_at(r, s, b).comm_start_ms);
        comm.end = std::max(comm.end, run.bucket_at(r, s, b).comm_end_ms);
      }
      bool beside = false;
      for (int r = 0; r < world; ++r)
        beside = beside || (t.backward[r][s].begin <= comm.begin && comm.begin < t.backward[r][s].end);
      terms.push_back(allreduce_terms(bytes, world, m.measured.impl, m.measured.wire, small, m.measured.nodes(),
                                      m.ring_chunk_bytes,
                                      doubles(m, world, m.run_turns(), m.measured.link, bytes, m.ring_chunk_bytes)));
      times.push_back(std::max(0.0, comm.end - comm.begin));
      if (!beside) alone_terms.push_back(terms.back()), alone_times.push_back(times.back());
    }
  }
  const double latency = link_alpha_beta(m.fitted_link).alpha_ms;
  const std::optional<CommFit> fit =
      alone_terms.empty() ? fit_comm(terms, times, latency) : fit_comm(alone_terms, alone_times, latency);
  if (fit->latency_from_link)
    m.notes.push_back(
        "the run's buckets timed alone are of too alike sizes (less than 2x apart) to fit latency: "
        "taken from the link, the rest as bandwidth");
  m.comm_fit = fit;
}

}  // namespace

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The GPU all-reduce an allreduce_perf file measured (nccl or gpu-ring-*), which stands for a GPU run's: NCCL's or
// our ring's on device buffers, modelled as the ring. Exactly one: two would be two different models.
std::string gpu_allreduce_in(const Calibration& calibration) {
  std::vector<std::string> gpu;
  for (const Calibration::Point& p : calibration.points)
    if ((p.impl == "nccl" || p.impl.rfind("gpu-", 0) == 0) && !ends_with(p.impl, "-graph") &&  // -G: the same again
        std::find(gpu.begin(), gpu.end(), p.impl) == gpu.end())
      gpu.push_back(p.impl);
  if (gpu.size() == 1) return gpu[0];
  std::string names;
  for (const std::string& g : gpu) names += (names.empty() ? "" : ", ") + g;
  throw std::invalid_argument(calibration.path + ": " +
                              (gpu.empty() ? "no GPU all-reduce (nccl, gpu-ring-*) to model a GPU run's from"
                                           : "several GPU all-reduces (" + names +
                                                 "); a GPU run's is one: give a file of one (allreduce_perf --impls)"));
}

}  // namespace

StepModel build_model(const RunRecord& run, std::optional<Calibration> calibration) {
  const int world = run.world_size(), first = run.first_steady_step(), steady = run.steps - first;
  bool timed = false;
  for (const BucketTimes& t : run.bucket_times) timed = timed || t.ready_ms != 0 || t.comm_end_ms != 0;
  if (!timed || steady <= 0) throw std::invalid_argument(run.path + " has no bucket timings to predict from");
  const TrainConfig config = config_from_json(run.config);
  if (config.zero_stage == 1)
    throw std::invalid_argument(run.path +
                                " sharded its update (--zero-stage 1): its buckets' times are "
                                "reduce-scatters and all-gathers, and the model predicts all-reduces; predict from a "
                                "--zero-stage 0 run");

  StepModel m;
  m.measured = measured_setting(run, config);
  m.on_gpu = config.device == Device::kCuda;
  m.measured_direct = names_direct_collectives(run.meta.transport);
  if (m.on_gpu && config.comm == AllreduceImpl::kRing) m.ring_chunk_bytes = kGpuRingChunkBytes;
  m.measured_doubling = m.ring_chunk_bytes > 0 && run.meta.transport.find(kGpuRingDoublingName) != std::string::npos;
  const LinkClasses& links = m.measured.link;
  const bool across =
      m.measured.nodes() > 1 && (m.measured.impl == AllreduceImpl::kHier || !slower(links.intra, links.inter));
  m.fitted_link = across ? links.inter : links.intra;
  m.fitted_hops = !links.per_class() || m.measured.nodes() == 1 ? "every hop"
                  : across                                      ? "the inter-node hops"
                                                                : "the intra-node hops";
  std::vector<int> node_sizes(run.nodes(), 0);
  for (int r = 0; r < world; ++r) ++node_sizes[run.node(r)];
  if (std::count(node_sizes.begin(), node_sizes.end(), node_sizes[0]) != static_cast<long>(node_sizes.size()))
    m.notes.push_back("the run's " + std::to_string(run.nodes()) + " nodes are of unequal size: modelled as " +
                      shape_text(m.measured));
  if (config.comm == AllreduceImpl::kNccl)
    m.notes.push_back(
        "NCCL's all-reduce (--comm nccl) is modelled as the ring, its algorithm for buckets of MBs, on the link's "
        "figures; NCCL's kernels beside backward take SMs from it, which the model leaves out (backward keeps its "
        "pace)");
  // On the GPU an update in backward is bucket by bucket, which the replay runs itself (update_end).
  if (config.update_in_backward() && !m.measured.bucketed_update)
    m.notes.push_back(
        "the run updated its parameters in backward (--optimizer-in-backward on): what is left of the update after "
        "backward is taken as measured for every setting, though other buckets would leave a different tail");
  m.calibration = std::move(calibration);
  if (m.on_gpu && m.calibration) m.calibration_gpu_impl = gpu_allreduce_in(*m.calibration);
  if (m.calibration && m.calibration->cold_calls)
    m.notes.push_back(
        "the calibration's calls each found their data out of the cache (allreduce_perf without "
        "--hot-cache), where a bucket's gradients were just written by backward: at sizes that fit "
        "the cache it times them slower than training reduces them; --hot-cache calibrates as training");
  const RunSummary summary = summarize(run);
  m.measured_step_ms = summary.slowest_step_ms;
  if (steady > 1 && m.measured_step_ms > 0) {
    double squares = 0;
    for (int s = first; s < run.steps; ++s)
      squares += std::pow(run.at(summary.slowest_rank, s).step_ms - m.measured_step_ms, 2);
    m.step_noise = std::sqrt(squares / (steady - 1) / steady) / m.measured_step_ms;
  }
  const std::vector<BucketSpan> spans = piece_layout(run, m);
  const BackwardIntervals intervals = cut_backward(run, config, m.measured.bucketed_update, m.steps);
  m.host.ranks_per_gpu = run.ranks_sharing_a_gpu();
  const std::vector<double> run_slowdown = measure_backward_slowdown(run, config, intervals, m);
  place_piece_ready_times(intervals, spans, run_slowdown, m);
  fit_run_allreduce(run, intervals, m);

  double samples = 0, tokens = 0;
  for (int r = 0; r < world; ++r)
    for (int s = first; s < run.steps; ++s) samples += run.at(r, s).samples, tokens += run.at(r, s).useful_tokens;
  m.samples_per_rank = samples / (static_cast<double>(world) * steady);
  // Files from before the steps recorded their samples: each rank's batch, as the summary takes it.
  if (m.samples_per_rank <= 0) m.samples_per_rank = static_cast<double>(run.global_batch()) / world;
  m.tokens_per_rank = tokens / (static_cast<double>(world) * steady);
  return m;
}

namespace {

// What a prediction's all-reduce times are taken from.
struct CommSource {
  AlphaBeta ab;
  double chunk_bytes = 0;               // the GPU ring's rounds (allreduce_terms), of the all-reduce measured
  LinkModel link;                       // the link it was measured on
  int ranks = 0;                        // 0: nothing measured, the link model alone
  std::string name;                     // its implementation and wire
  double min_bytes = 0, max_bytes = 0;  // the sizes it timed
  // A calibration's rows for this implementation, by size, each with what its time is beyond the fit's. Read between
  // its sizes (calibration_residual_ms), they correct the fit where the cost is not a cost per exchange plus one per
  // byte: 4 ranks sharing a GPU over an emulated 10 GbE paid ~6.6 ms from 256 KiB to 4 MiB, then the link's rate,
  // and the fit's line through both priced their 7.9 + 4 MiB buckets 28% over what they took.
  struct Residual {
    double bytes = 0, ms = 0;
    bool doubling = false;  // the GPU ring's recursive doubling
    bool small = false;     // the host ring's recursive doubling (its size up to the small-buffer size)
  };
  std::vector<Residual> residuals;  // a calibration on one node, in rounds of the trainer's chunk; else none
  bool residuals_direct = false;    // its ranks took the direct all-reduce above the small-buffer size
  int residuals_turns = 0;          // the ranks that took turns on one of its GPUs (0: not said)
};

// The calibration file for this implementation, else the run's buckets, else the link model alone. Says which in
// out.comm_source.
CommSource choose_comm_source(const StepModel& m, const PredictSetting& setting, Prediction& out) {
  const PredictSetting& measured = m.measured;
  // A GPU run's calibration is of the GPU's all-reduce, on fp32 buffers whatever the wire.
  const std::string name = m.on_gpu ? m.calibration_gpu_impl : impl_name(setting.impl, setting.wire);
  const WireDtype calibrated_wire = m.on_gpu ? WireDtype::kFp32 : setting.wire;
  std::optional<AlphaBeta> ab;
  CommSource src;
  src.link = m.fitted_link;
  src.ranks = measured.ranks;
  src.name = impl_name(measured.impl, measured.wire);
  src.min_bytes = m.measured_min_bucket, src.max_bytes = m.measured_max_bucket;
  src.chunk_bytes = m.ring_chunk_bytes;
  if (m.calibration) {
    std::vector<AllreduceTerms> terms;
    std::vector<double> times;
    const std::vector<std::string>& direct = m.calibration->direct_impls;
    const bool calibration_direct = std::find(direct.begin(), direct.end(), name) != direct.end();
    const double small = static_cast<double>(small_allreduce_bytes(m.calibration->ranks, calibration_direct));
    const double chunk = name.rfind("gpu-ring-", 0) == 0 ? m.calibration->gpu_chunk_bytes : 0;
    // hier's rows time its inter-node hop, which a calibration on one node never took: nothing of it to fit.
    const auto& points = m.calibration->points;
    const bool hop_unmeasured =
        setting.impl == AllreduceImpl::kHier && m.calibration->nodes < 2 &&
        std::any_of(points.begin(), points.end(), [&](const Calibration::Point& p) { return p.impl == name; });
    if (hop_unmeasured)
      out.extrapolated.push_back("the calibration ran on one node: its hier rows time no inter-node hop");
    std::vector<CommSource::Residual> residuals;
    for (const Calibration::Point& p : points)
      if (p.impl == name && !hop_unmeasured) {
        terms.push_back(allreduce_terms(p.bytes, m.calibration->ranks, setting.impl, calibrated_wire, small,
                                        m.calibration->nodes, chunk, p.doubling));
        times.push_back(p.time_ms);
        residuals.push_back({p.bytes, p.time_ms, p.doubling, p.bytes <= small});
        src.min_bytes = terms.size() == 1 ? p.bytes : std::min(src.min_bytes, p.bytes);
        src.max_bytes = terms.size() == 1 ? p.bytes : std::max(src.max_bytes, p.bytes);
      }
    // One size, or sizes too alike to tell latency from bandwidth: the latency is the calibration's link's, as the
    // run's own fit takes it.
    const std::optional<CommFit> fit =
        terms.empty() ? std::nullopt : fit_comm(terms, times, link_alpha_beta(m.calibration->link_model).alpha_ms);
    if (fit) {
      ab = fit->alone;
      if (fit->latency_from_link)
        out.extrapolated.push_back("latency from the calibration's link (its sizes too alike to fit)");
      src.link = m.calibration->link_model;
      src.ranks = m.calibration->ranks;
      src.name = m.on_gpu ? impl_name(AllreduceImpl::kRing, WireDtype::kFp32) : name;  // the GPU's stands for the ring
      // Fitted per exchange, the calibration's rounds at its own chunk tell what the trainer's ring pays at its own.
      src.chunk_bytes = chunk > 0 ? kGpuRingChunkBytes : 0;
      // Rows in rounds of another chunk than the trainer's correct nothing of the trainer's all-reduces; across
      // nodes a bucket's time is not the fit's sum that the rows' residuals are measured from.
      if (chunk == src.chunk_bytes && m.calibration->nodes == 1) {
        for (size_t i = 0; i < residuals.size(); ++i) residuals[i].ms -= fit->alone.ms(terms[i]);
        // By size (a size timed twice, which allreduce_perf does not do: its last row in the file).
        std::stable_sort(
            residuals.begin(), residuals.end(),
            [](const CommSource::Residual& a, const CommSource::Residual& b) { return a.bytes < b.bytes; });
        src.residuals = std::move(residuals);
        src.residuals_direct = calibration_direct;
        src.residuals_turns = m.calibration->ranks_per_gpu;
      }
      out.comm_source = "calibration";
    }
  }
  if (!ab && m.comm_fit) {
    ab = m.comm_fit->alone;
    out.comm_source = "run";
  }
  if (!ab) {
    ab = AlphaBeta{};
    src.link = LinkModel{};
    src.ranks = 0;
    out.comm_source = "link model";
    if (setting.ranks > 1) out.extrapolated.push_back("no measured all-reduce: link model alone");
  }
  src.ab = *ab;
  return src;
}

struct HopChoice {
  HopCosts costs;
  bool link_model_only[2] = {false, false};  // intra, inter
};

// Per class of hop: the source's alpha and beta where the class runs on the link they were measured on, else
// the link's own, bounded below by the source's when it ran on no emulated link.
HopChoice choose_hop_costs(const StepModel& m, const PredictSetting& setting, const CommSource& src,
                           const std::string& comm_source) {
  const PredictSetting& measured = m.measured;
  HopChoice out;
  // A hier run's fit took in its phases within the node: at the run's shape and intra link they add nothing.
  const bool within_fitted = comm_source == "run" && measured.impl == AllreduceImpl::kHier &&
                             setting.impl == AllreduceImpl::kHier && setting.nodes() == measured.nodes() &&
                             setting.ranks_on_a_node() == measured.ranks_on_a_node() &&
                             same_link(setting.link.intra, measured.link.intra);
  for (int across = 0; across < 2; ++across) {
    const LinkModel& link = across ? setting.link.inter : setting.link.intra;
    AlphaBeta& hop = across ? out.costs.inter : out.costs.intra;
    if (!across && within_fitted) continue;
    if (same_link(link, src.link)) {
      hop = src.ab;
      continue;
    }
    // The source's own costs bound another link's from below where they are the transport's, not where they are an
    // emulated link's or, from ranks sharing a GPU, the GPU's switches between them (another link is other GPUs).
    const bool own_transport = !emulated(src.link) && m.host.ranks_per_gpu <= 1;
    const AlphaBeta own = own_transport ? src.ab : AlphaBeta{}, model = link_alpha_beta(link);
    hop = AlphaBeta{std::max(own.alpha_ms, model.alpha_ms), std::max(own.beta_ms_per_byte, model.beta_ms_per_byte)};
    out.link_model_only[across] = true;
  }
  return out;
}

// Whether the setting's ranks take the direct all-reduce above the small-buffer size (CPU ranks on one host, where
// direct_allreduce_allowed), whose size is then smaller at 2 ranks: as the run's ranks did where they could have;
// else as the trainer does by default (a 1-rank run, or one whose ranks could not).
bool takes_direct(const StepModel& m, const PredictSetting& s) {
  const auto could = [](const PredictSetting& x) {
    return x.nodes() == 1 && direct_allreduce_allowed(x.impl, x.wire, x.link);
  };
  if (m.on_gpu || !could(s)) return false;
  return m.measured.ranks > 1 && could(m.measured) ? m.measured_direct : true;
}

struct BucketCosts {
  std::vector<BucketCost> cost;
  bool outside = false;                 // a bucket beyond the sizes the source timed
  bool depends_on[2] = {false, false};  // whether the time depends on the intra, inter class of hop
};

// What the calibration's rows on either side of a bucket's size took beyond the fit, linearly between them, among the
// rows that ran as the bucket would: the same ranks on one node, the same link, implementation and wire, the direct
// all-reduce or not, and the same algorithm; and on GPUs, as many ranks taking turns on one (a file that does not say:
// every rank on one, as the calibrations on the one GPU lent so far ran).
// Past the rows of its algorithm, the nearest one's (the cost stays continuous in the bucket's size). 0 where none ran
// as the bucket would.
double calibration_residual_ms(const StepModel& m, const CommSource& src, const PredictSetting& setting, int turns,
                               bool direct, double bytes, bool small, bool doubling) {
  const bool as_calibrated = !src.residuals.empty() && setting.ranks == src.ranks && setting.nodes() == 1 &&
                             same_link(setting.link.intra, src.link) &&
                             impl_name(setting.impl, setting.wire) == src.name && direct == src.residuals_direct &&
                             (!m.on_gpu || turns == (src.residuals_turns ? src.residuals_turns : setting.ranks));
  if (!as_calibrated) return 0;
  const CommSource::Residual *lo = nullptr, *hi = nullptr;  // its algorithm's nearest rows at or below, and above
  for (const CommSource::Residual& r : src.residuals) {     // by size
    if (r.doubling != doubling || r.small != small) continue;
    if (r.bytes <= bytes)
      lo = &r;
    else if (!hi)
      hi = &r;
  }
  if (!lo || !hi || lo->bytes == bytes) return lo ? lo->ms : hi ? hi->ms : 0;
  return lo->ms + (hi->ms - lo->ms) * (bytes - lo->bytes) / (hi->bytes - lo->bytes);
}

BucketCosts cost_buckets(const StepModel& m, const PredictSetting& setting, int turns,
                         const std::vector<Bucket>& buckets, const HopCosts& costs, const CommSource& src) {
  const int n = setting.ranks, nodes = setting.nodes(), per_node = setting.ranks_on_a_node();
  const bool direct = takes_direct(m, setting);
  const double small = static_cast<double>(small_allreduce_bytes(n, direct));
  BucketCosts out;
  out.depends_on[0] = nodes == 1 || setting.impl != AllreduceImpl::kHier || per_node > 1;
  out.depends_on[1] = nodes > 1;
  for (const Bucket& b : buckets) {
    const double bytes = static_cast<double>(b.count) * sizeof(float);
    const bool doubling = doubles(m, n, turns, setting.link, bytes, src.chunk_bytes);
    const double alone = allreduce_ms(bytes, setting, small, costs, src.chunk_bytes, doubling) +
                         calibration_residual_ms(m, src, setting, turns, direct, bytes, bytes <= small, doubling);
    const AllreduceTerms terms =
        allreduce_terms(bytes, n, setting.impl, setting.wire, small, nodes, src.chunk_bytes, doubling);
    out.cost.push_back({alone, m.comm_cpu ? m.comm_cpu->ms(terms) : 0, terms.message_steps});
    // Beyond the timed sizes by more than 10% (a 4000-byte bias is not beyond a 4096-byte measurement).
    out.outside =
        out.outside || (n > 1 && src.ranks > 0 && (bytes < src.min_bytes * 0.9 || bytes > src.max_bytes * 1.1));
    if (nodes > 1 && setting.impl != AllreduceImpl::kHier) {  // the slower class sets each step's pace
      const AllreduceTerms flat = allreduce_terms(bytes, n, AllreduceImpl::kMpi, setting.wire, 0);
      const double within = costs.intra.ms(flat), between = costs.inter.ms(flat);
      out.depends_on[0] = out.depends_on[0] && within >= between;
      out.depends_on[1] = out.depends_on[1] && between >= within;
    }
  }
  return out;
}

// Says in out.extrapolated where the prediction goes beyond what its source measured. A class of hop whose numbers
// come from the link model alone is an extrapolation where the implementation's time depends on it.
void note_extrapolations(const StepModel& m, const PredictSetting& setting, const CommSource& src,
                         const HopChoice& hops, const BucketCosts& buckets, Prediction& out) {
  const PredictSetting& measured = m.measured;
  const int n = setting.ranks, nodes = setting.nodes(), per_node = setting.ranks_on_a_node();
  for (int across = 0; across < 2; ++across) {
    if (!hops.link_model_only[across] || !buckets.depends_on[across] || n <= 1 || out.comm_source == "link model")
      continue;
    const LinkModel& link = across ? setting.link.inter : setting.link.intra;
    const std::string which = nodes == 1 ? "link " : across ? "inter-node link " : "intra-node link ";
    out.extrapolated.push_back(which + link_name(link) + (nodes == 1 ? "" : ": link model only") + " (measured " +
                               link_name(src.link) + ")" +
                               (emulated(src.link) ? ": the transport under the emulated link is unmeasured" : ""));
    if (out.comm_source.find(" + link") == std::string::npos) out.comm_source += " + link";
  }
  const std::string name = impl_name(setting.impl, setting.wire);
  if (src.ranks > 0 && n != src.ranks)
    out.extrapolated.push_back(std::to_string(n) + " ranks (measured " + std::to_string(src.ranks) + ")");
  // Each rank past the run's keeps the measured compute, as on cores of its own: on the run's host, past its cores,
  // they would take turns instead.
  if (!m.on_gpu && m.host.cores > 0 && n > m.measured.ranks && per_node * m.host.threads > m.host.cores)
    out.extrapolated.push_back(
        "compute of " + std::to_string(n) + " ranks as measured at " + std::to_string(m.measured.ranks) +
        ", each on cores of its own (" + std::to_string(per_node) + " x " + std::to_string(m.host.threads) +
        " threads on the run's host of " + std::to_string(m.host.cores) + " cores would take turns)");
  if (src.ranks > 0 && n > 1 && (nodes != measured.nodes() || (nodes > 1 && per_node != measured.ranks_on_a_node())))
    out.extrapolated.push_back(shape_text(setting) + " (measured " + shape_text(measured) + ")");
  if (src.ranks > 0 && n > 1 && name != src.name)
    out.extrapolated.push_back("comm " + name + " (measured " + src.name + ")");
  if (setting.overlap && !measured.overlap)
    out.extrapolated.push_back("overlap on (the run had it off: no all-reduce timed beside backward)");
  if (buckets.outside)
    out.extrapolated.push_back("bucket sizes outside the measured " + mb_text(src.min_bytes) + " .. " +
                               mb_text(src.max_bytes));
}

// n ranks: the measured ranks repeated (rank r behaves as measured rank r mod the measured world, so a slow
// rank stays). Copies wait for the same buckets as their originals, so only the distinct ones are replayed.
std::vector<std::vector<RankProfile>> distinct_ranks(const StepModel& m, int n) {
  std::vector<std::vector<RankProfile>> steps;
  for (const std::vector<RankProfile>& measured_ranks : m.steps)
    steps.emplace_back(measured_ranks.begin(), measured_ranks.begin() + std::min<size_t>(n, measured_ranks.size()));
  return steps;
}

// r with every phase `factor` times as long: its kernels on a GPU shared by more (or fewer) ranks.
RankProfile with_compute_scaled(RankProfile r, double factor) {
  r.before_ms *= factor;
  r.backward_ms *= factor;
  for (double& t : r.piece_ready_ms) t *= factor;
  r.after_ms *= factor;
  return r;
}

// Ranks taking turns on one GPU at `setting`: as asked, else the run's own on its own link, one on another link (it
// joins GPUs, one per rank); at most a node's ranks.
int ranks_taking_turns(const StepModel& m, const PredictSetting& setting) {
  const bool own_link =
      same_link(setting.link.intra, m.measured.link.intra) && same_link(setting.link.inter, m.measured.link.inter);
  const int run_default = own_link ? m.run_turns() : 1;
  return std::clamp(m.on_gpu ? setting.ranks_per_gpu.value_or(run_default) : run_default, 1, setting.ranks_on_a_node());
}

}  // namespace

Prediction predict(const StepModel& m, const PredictSetting& setting) {
  Prediction out;
  out.setting = setting;
  std::vector<int64_t> numel, offset;
  for (const PieceRecord& p : m.pieces) numel.push_back(p.numel), offset.push_back(p.offset);
  const std::vector<Bucket> buckets = assign_buckets(numel, offset, setting.caps());
  out.buckets = static_cast<int>(buckets.size());

  const CommSource src = choose_comm_source(m, setting, out);
  const HopChoice hops = choose_hop_costs(m, setting, src, out.comm_source);
  const int turns = ranks_taking_turns(m, setting);
  const BucketCosts costs = cost_buckets(m, setting, turns, buckets, hops.costs, src);
  note_extrapolations(m, setting, src, hops, costs, out);

  std::vector<double> update_share;
  if (setting.bucketed_update) {
    update_share = update_shares(buckets);
    if (!m.measured.bucketed_update)
      out.extrapolated.push_back("update per bucket (the run updated after its last all-reduce)");
  }
  // Ranks taking turns on one GPU: each one's kernels wait for the others', so its compute takes `turns` times as long
  // as alone, the run's own sharing divided out first (two ranks on an H200: forward 1.88x and backward 2.28x of one
  // rank's, backward with the all-reduces' kernels beside it). Left to the run, they still share on the run's own
  // link; another link joins GPUs, one per rank.
  const int run_turns = m.run_turns();
  out.setting.ranks_per_gpu = turns;
  HostCores host = m.host;
  host.ranks_per_gpu = turns > 1 ? turns : 0;
  std::vector<std::vector<RankProfile>> profiles = distinct_ranks(m, setting.ranks);
  if (turns != run_turns) {
    for (std::vector<RankProfile>& ranks : profiles)
      for (RankProfile& r : ranks) r = with_compute_scaled(r, static_cast<double>(turns) / run_turns);
    out.extrapolated.push_back(
        turns == 1
            ? fmt("a GPU per rank (the run's %d ranks took turns on one: their compute / %d)", run_turns, run_turns)
            : fmt("%d ranks taking turns on a GPU (the run's: %d): compute x %d", turns, run_turns, turns) +
                  (run_turns > 1 ? fmt("/%d", run_turns) : ""));
  }
  if (m.on_gpu && m.calibration && out.comm_source.rfind("calibration", 0) == 0 && m.calibration->ranks_per_gpu > 0 &&
      m.calibration->ranks_per_gpu != turns)
    out.extrapolated.push_back(
        fmt("the calibration's ranks took turns on a GPU %d to one (here %d)", m.calibration->ranks_per_gpu, turns));
  out.step = simulate_steps(profiles, buckets, costs.cost, setting.overlap, host, update_share);
  const int n = setting.ranks;
  out.samples_per_s = m.samples_per_rank * n / out.step.step_ms * 1000;
  out.tokens_per_s = m.tokens_per_rank * n / out.step.step_ms * 1000;
  return out;
}

double weak_scaling_efficiency(const StepModel& m, const Prediction& p) {
  PredictSetting one = p.setting;
  one.ranks = 1;
  one.ranks_per_node = 0;
  return predict(m, one).step.step_ms / p.step.step_ms;
}

Recommendation recommend(const std::vector<Prediction>& rows, const PredictSetting& own, double tolerance) {
  Recommendation out;
  if (rows.empty()) return out;
  double fastest = rows[0].step.step_ms;
  for (const Prediction& p : rows) fastest = std::min(fastest, p.step.step_ms);
  // The run's own knobs (what a user would change in its command line), and its own setting: those knobs on its own
  // link, ranks and nodes, the one row that replays a measurement.
  const auto own_knobs = [&](const PredictSetting& x) {
    return x.bucket_mb == own.bucket_mb && x.first_bucket_mb == own.first_bucket_mb &&
           x.last_bucket_mb == own.last_bucket_mb && x.bucket_rule == own.bucket_rule && x.overlap == own.overlap &&
           x.impl == own.impl && x.wire == own.wire && x.bucketed_update == own.bucketed_update;
  };
  const auto is_own = [&](const PredictSetting& x) {
    return own_knobs(x) && x.ranks == own.ranks && x.nodes() == own.nodes() && link_spec(x.link) == link_spec(own.link);
  };
  // Rank by: the own setting first, then fewer buckets (where there are all-reduces: one rank has none, and its
  // buckets change nothing), then the own knobs (elsewhere: no change to recommend where the prediction cannot
  // tell), then faster; only rows within the tolerance take part.
  const auto better = [&](const Prediction& a, const Prediction& b) {
    if (is_own(a.setting) != is_own(b.setting)) return is_own(a.setting);
    if (a.buckets != b.buckets && a.setting.ranks > 1) return a.buckets < b.buckets;
    if (own_knobs(a.setting) != own_knobs(b.setting)) return own_knobs(a.setting);
    return a.step.step_ms < b.step.step_ms;
  };
  bool found = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].step.step_ms > fastest * (1 + tolerance) + 1e-12) continue;
    out.within_noise += found;
    if (!found || better(rows[i], rows[out.row])) out.row = i;
    found = true;
  }
  out.own = is_own(rows[out.row].setting);
  return out;
}

std::vector<std::string> extrapolation_footnotes(const std::vector<Prediction>& rows) {
  std::map<std::string, int> count;
  for (const Prediction& p : rows)
    for (const std::string& reason : p.extrapolated) ++count[reason];
  std::vector<std::string> lines;
  for (const auto& [reason, n] : count)
    lines.push_back(reason + " (" + std::to_string(n) + (n == 1 ? " row)" : " rows)"));
  return lines;
}

}  // namespace ddplab
