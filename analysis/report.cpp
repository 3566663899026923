#include "analysis/report.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "analysis/blame.h"
#include "analysis/format.h"
#include "comm/communicator.h"  // describe: the links as they act
#include "config/train_config.h"

namespace ddplab {
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

const char* known(const std::string& s) { return s.empty() ? "?" : s.c_str(); }

// Mean over ranks and steady steps of each bucket's ready, comm start and comm end, from its step's start, and of
// its all-gather's duration (--zero-stage 1).
struct BucketMeans {
  double ready = 0, begin = 0, end = 0, gather_ms = 0;
};

BucketMeans bucket_means(const RunRecord& run, const RunSummary& summary, int k) {
  BucketMeans m;
  const double n = static_cast<double>(run.world_size()) * summary.steady_steps();
  for (int r = 0; r < run.world_size(); ++r) {
    for (int s = summary.first_steady_step; s < run.steps; ++s) {
      const double t0 = run.at(r, s).start_ms;
      const BucketTimes& b = run.bucket_at(r, s, k);
      m.ready += (b.ready_ms - t0) / n;
      m.begin += (b.comm_start_ms - t0) / n;
      m.end += (b.comm_end_ms - t0) / n;
      m.gather_ms += (b.gather_end_ms - b.gather_start_ms) / n;
    }
  }
  return m;
}

// What the figures average over: the steady steps, or the last step of a run stopped within its warm-up.
std::string steps_counted(const RunRecord& rec) {
  return rec.reached_steady_state() ? "the steady steps"
                                    : fmt("warm-up step %d", static_cast<int>(rec.meta.first_step) + rec.steps - 1);
}

// The bucket whose ranks had it ready furthest apart, and the rank that was last: Horovod's straggler signal.
std::string arrival_line(const RunRecord& rec, const RunSummary& s) {
  const BucketArrival* worst = nullptr;
  int bucket = 0;
  for (size_t k = 0; k < s.arrivals.size(); ++k)
    if (s.arrivals[k].last_rank >= 0 && (!worst || s.arrivals[k].spread_ms > worst->spread_ms))
      worst = &s.arrivals[k], bucket = static_cast<int>(k);
  if (!worst) return "";
  const std::string lead = s.world_size > 2 ? fmt("; %.2f ms after the next-latest", worst->lead_ms) : "";
  return fmt("last to have a bucket ready: rank %d, bucket %d in %d of %s, %.2f ms after the first rank (median%s)",
             worst->last_rank, bucket, worst->last_steps,
             counted(s.steady_steps(), rec.reached_steady_state() ? "steady step" : "step").c_str(), worst->spread_ms,
             lead.c_str());
}

}  // namespace

// "93%", or "-" where there was no comm to hide: a 100% there would praise an overlap that never ran. One rank has no
// peer to communicate with, whatever the GPU's engine recorded for its buckets (its epilogue's few microseconds).
bool has_hidden_share(double comm_ms, int world) { return world > 1 && comm_ms > 0; }

std::string hidden_text(double fraction, double comm_ms, int world) {
  return has_hidden_share(comm_ms, world) ? fmt("%.0f%%", 100 * fraction) : "-";
}

// Per rank: comm-compute overlap (HTA's definition) beside hidden%, and the idle time by what the rank waited for.
void print_time_use(std::FILE* out, const RunRecord& rec, const RunSummary& s) {
  if (s.time_use.empty()) return;
  std::fprintf(out,
               "  time use per rank (mean per step over %s, ms; overlap: computing while communicating / "
               "communicating):\n",
               steps_counted(rec).c_str());
  std::fprintf(out, "  %4s %9s %8s %8s %7s %7s %9s %9s %9s\n", "rank", "computing", "comm", "overlap", "hidden%", "idle",
               "for data", "for peers", "host work");
  const int world = static_cast<int>(s.ranks.size());
  for (size_t r = 0; r < s.time_use.size(); ++r) {
    const RankTimeUse& u = s.time_use[r];
    std::fprintf(out, "  %4zu %9.2f %8.2f %8s %7s %7.2f %9.2f %9.2f %9.2f\n", r, u.computing_ms, u.comm_ms,
                 hidden_text(u.overlap(), u.comm_ms, world).c_str(),
                 hidden_text(s.hidden_fractions[r], s.ranks[r].comm_ms, world).c_str(), u.idle_ms(), u.idle_data_ms,
                 u.idle_peers_ms, u.idle_host_ms);
  }
}

void print_summary(std::FILE* out, const RunRecord& run, const RunSummary& s) {
  // Ranks in step end each step together, so the slowest mean step is the run's and which rank has it is noise:
  // who sets the pace is blame's question.
  std::fprintf(out,
               "  step                %.2f ms mean (the slowest rank's, rank %d; which rank sets the pace: blame, "
               "below)\n",
               s.slowest_step_ms, s.slowest_rank);
  std::fprintf(out, "  median step         %.2f ms (over %s, each as long as its slowest rank)\n", s.median_step_ms,
               steps_counted(run).c_str());
  std::fprintf(out, "  global throughput   %.0f samples/s\n", s.samples_per_s);
  if (run.world_size() > 1)
    std::fprintf(out, "  rank spread         %.2f ms mean per step (max - min step time across ranks)\n",
                 s.mean_spread_ms);
  if (std::isfinite(s.final_loss))
    std::fprintf(out, "  final loss          %.4f\n", s.final_loss);
  else
    std::fprintf(out, "  final loss          not finite (%s)\n", std::isnan(s.final_loss) ? "nan" : "inf");
  if (s.final_val_step >= 0 && std::isfinite(s.final_val_loss))
    std::fprintf(out, "  validation loss     %.4f after step %d (--val-data)\n", s.final_val_loss, s.final_val_step);
  else if (s.final_val_step >= 0)
    std::fprintf(out, "  validation loss     not finite after step %d (--val-data)\n", s.final_val_step);
  if (const double cap = run.config.value("grad_clip", 0.0); cap > 0)
    std::fprintf(out, "  gradient norm       %.4g at the last update; clipped to %g in %d of %d steps (--grad-clip)\n",
                 s.final_grad_norm, cap, s.clipped_steps, s.steps);
  if (s.skipped_steps > 0)
    std::fprintf(out,
                 "  skipped steps       %d, the first at step %d (--skip-nonfinite: a non-finite loss or "
                 "gradient, no update)\n",
                 s.skipped_steps, s.first_skipped_step);
  if (run.meta.file_writes > 0)
    std::fprintf(out,
                 "  file writes         %d (checkpoints, snapshots), %.0f ms in all: between steps, in no step time\n",
                 run.meta.file_writes, run.meta.file_writes_us / 1e3);
  if (s.padded_tokens_per_s > 0) {
    std::fprintf(out,
                 "  tokens              %.0f useful/s, %.0f padded/s (padding %.1f%%), token spread %.0f per step\n",
                 s.useful_tokens_per_s, s.padded_tokens_per_s, 100 * s.padding_ratio, s.mean_token_spread);
  }
  // The lab's columns only when they would not print as zeros.
  bool lab_cols = false;
  for (const StepRecord& m : s.ranks) lab_cols |= std::max({m.extra_comm_ms, m.host_work_ms, m.barrier_ms}) >= 0.005;
  // What the host took (runtime/cpu_taken.h), likewise: absent from older files, not counted by some kernels.
  bool taken_cols = false;
  for (const StepRecord& m : s.ranks) taken_cols |= std::max(m.steal_ms, m.cpu_wait_ms) >= 0.005;
  std::fprintf(out,
               "  per rank (mean per step over %s, ms; hidden%%: hidden over what backward could hide, the "
               "lesser of its time and comm's):\n",
               steps_counted(run).c_str());
  // Hostnames whole: clusters name nodes alike up to a suffix (gpu-node-017, gpu-node-018), so a cut column merges them.
  int host_width = 4;
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r)
    host_width = std::max(host_width, static_cast<int>(run.host(r).size()));
  std::fprintf(out, "  %4s  %-*s %8s %7s %8s %8s %8s %7s %7s %8s", "rank", host_width, "host", "step", "data",
               "forward", "backward", "comm", "hidden", "exposed", "optim");
  if (lab_cols) std::fprintf(out, " %7s %7s %7s", "extra", "host_wk", "barrier");
  std::fprintf(out, " %7s", "hidden%");
  if (taken_cols) std::fprintf(out, " %7s %8s", "steal", "cpu_wait");
  std::fprintf(out, "\n");
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r) {
    const StepRecord& m = s.ranks[r];
    std::fprintf(out, "  %4d  %-*s %8.2f %7.2f %8.2f %8.2f %8.2f %7.2f %7.2f %8.2f", r, host_width, run.host(r).c_str(),
                 m.step_ms, m.data_ms, m.forward_ms, m.backward_ms, m.comm_ms, m.hidden_comm_ms, m.exposed_comm_ms,
                 m.optimizer_ms);
    if (lab_cols) std::fprintf(out, " %7.2f %7.2f %7.2f", m.extra_comm_ms, m.host_work_ms, m.barrier_ms);
    std::fprintf(out, " %7s", hidden_text(s.hidden_fractions[r], m.comm_ms, run.world_size()).c_str());
    if (taken_cols)
      std::fprintf(out, " %7s %8s", counted_ms(m.steal_ms, "-").c_str(), counted_ms(m.cpu_wait_ms, "-").c_str());
    std::fprintf(out, "\n");
  }
}

// The distinct hosts in rank order: "a", "a, b", or "4 hosts: a, b, c, ..." when there are more than three.
static std::string hosts_text(const RunRecord& rec) {
  std::vector<std::string> hosts;
  for (int r = 0; r < rec.world_size(); ++r)
    if (std::find(hosts.begin(), hosts.end(), rec.host(r)) == hosts.end()) hosts.push_back(rec.host(r));
  std::string text = hosts.size() > 3 ? fmt("%zu hosts: ", hosts.size()) : "";
  for (size_t i = 0; i < std::min<size_t>(hosts.size(), 3); ++i) text += (i ? ", " : "") + hosts[i];
  return text + (hosts.size() > 3 ? ", ..." : "");
}

std::string oversubscription_note(const RunRecord& run) {
  if (const int sharing = run.ranks_sharing_a_gpu())
    return fmt(
        "oversubscribed: %d ranks on one GPU; they take turns on it (their kernels, and the ring's copies between "
        "them), so the times measure this sharing, not data parallelism across GPUs",
        sharing);
  const int ranks = run.oversubscribed_ranks();
  if (ranks == 0) return "";
  const int threads = std::max(1, config_from_json(run.config).blas_threads);
  return fmt(
      "oversubscribed: %d ranks x %s on %s; the ranks take turns on the cores, so the times measure "
      "this machine's sharing, not data parallelism",
      ranks, counted(threads, "BLAS thread").c_str(), counted(run.meta.host_cores, "core").c_str());
}

namespace {

// "== <file>" and what ran: the command, ranks and hosts, steps, the steady state and the batch.
void print_run_line(std::FILE* out, const RunRecord& rec, const RunSummary& s) {
  const int world = rec.world_size();
  std::fprintf(out, "== %s\n", rec.path.c_str());
  // Steps as training counts them: a resumed run's file holds steps first_step.. of the run.
  const int first = static_cast<int>(rec.meta.first_step);
  std::fprintf(out, "  %s on %d rank%s (%s), ", known(rec.meta.command), world, world == 1 ? "" : "s",
               hosts_text(rec).c_str());
  if (rec.steps == 0) {
    std::fprintf(out, "no step completed%s\n", first > 0 ? fmt(" (resumed at %d)", first).c_str() : "");
    return;
  }
  const std::string steady =
      rec.reached_steady_state()
          ? fmt("steady state %d..%d", first + s.first_steady_step, first + rec.steps - 1)
          : fmt("no steady state (stopped within the warm-up: figures from step %d)", first + rec.steps - 1);
  std::fprintf(out, "%s, %s, %s\n",
               first > 0 ? fmt("steps %d..%d (resumed at %d)", first, first + rec.steps - 1, first).c_str()
                         : counted(rec.steps, "step").c_str(),
               steady.c_str(), s.batch_text().c_str());
}

// The settings that tell runs apart: communication, buckets, batch, model, device, update (where it runs, the
// learning rate's schedule and the clipping, where set).
void print_config_line(std::FILE* out, const RunRecord& rec) {
  const RunMetadata& meta = rec.meta;
  const nlohmann::json& c = rec.config;
  const TrainConfig stored = config_from_json(c);  // a key an older file lacks: its default then
  std::fprintf(out,
               "  config: comm %s%s%s, comm_dtype %s, link %s, buckets (%s), overlap %s, grad_slice_mb %s, batch %s",
               config_text(c, "comm").c_str(), meta.transport.empty() ? "" : " over ", meta.transport.c_str(),
               config_text(c, "comm_dtype").c_str(),
               meta.links.emulated() ? describe(meta.links).c_str() : config_text(c, "link").c_str(),
               bucket_layout_text(stored).c_str(), config_text(c, "overlap").c_str(),
               config_text(c, "grad_slice_mb").c_str(), config_text(c, "batch").c_str());
  if (stored.grad_accum > 1) std::fprintf(out, " x %d micro-batches", stored.grad_accum);
  if (!stored.transformer() && c.contains("hidden"))
    std::fprintf(out, ", MLP %s-%sx%s-%s", config_text(c, "input_dim").c_str(), config_text(c, "hidden").c_str(),
                 config_text(c, "layers").c_str(), config_text(c, "classes").c_str());
  else if (stored.transformer())  // what tells sequence runs apart: the head and how batches are cut
    std::fprintf(
        out, ", model %s (head %s, %sbatching %s%s)", to_string(stored.model), config_text(c, "head").c_str(),
        stored.data.empty() ? "" : ("data " + stored.data + ", max_len " + config_text(c, "max_len") + ", ").c_str(),
        config_text(c, "batching").c_str(),
        stored.batching == Batching::kToken || stored.batching == Batching::kPack
            ? (", max_tokens " + config_text(c, "max_tokens")).c_str()
            : "");
  if (meta.device == "cuda") std::fprintf(out, ", device cuda, precision %s", config_text(c, "precision").c_str());
  if (meta.device == "cuda" && stored.transformer() && c.contains("attention"))
    std::fprintf(out, ", attention %s", config_text(c, "attention").c_str());
  if (stored.zero_stage > 0) std::fprintf(out, ", zero_stage %d", stored.zero_stage);
  if (stored.update_in_backward()) std::fprintf(out, ", update in backward");
  const OptimizerConfig& o = stored.optimizer;
  if (o.lr_warmup > 0) std::fprintf(out, ", lr_warmup %d", o.lr_warmup);
  if (o.lr_schedule != LrSchedule::kConstant)
    std::fprintf(out, ", lr_schedule %s (lr_final %g)", to_string(o.lr_schedule), o.lr_final);
  if (o.clips()) std::fprintf(out, ", grad_clip %g", o.grad_clip);
  std::fprintf(out, "\n");
}

// The lab's knobs, only those switched on: " straggler_ms 5 slow_rank 1", or "" for none.
std::string lab_text(const nlohmann::json& c) {
  std::string lab;
  bool slow_rank = false, barrier = false;  // knobs on that name a rank, or a period
  for (const std::string key :
       {"straggler_ms", "busy_threads", "extra_allreduce_mb", "rank0_work_ms", "data_cost_ms", "loader_threads"}) {
    const auto it = c.find(key);
    if (it == c.end() || !it->is_number() || it->get<double>() <= 0) continue;
    lab += fmt(" %s %s", key.c_str(), config_text(c, key.c_str()).c_str());
    slow_rank |= key == "straggler_ms" || key == "busy_threads";
    barrier |= key == "rank0_work_ms";
  }
  if (slow_rank) lab += " slow_rank " + config_text(c, "slow_rank");
  if (barrier) lab += " barrier_every " + config_text(c, "barrier_every");
  return lab;
}

// What the exposed wait after backward was spent on, mean over ranks and steady steps: finishing the buckets before
// the closing one (a backlog, which fewer or cheaper all-reduces shorten), the closing bucket alone (final only when
// backward ends: its size, or the update beside it), and the rest (the host's wait and the update's launch).
std::string exposed_split_line(const RunRecord& rec, const RunSummary& s) {
  const int nb = static_cast<int>(rec.buckets.size());
  if (rec.world_size() < 2 || nb == 0 || s.steady_steps() <= 0) return "";
  double exposed = 0, backlog = 0, closing = 0, unfinished = 0;
  const double n = static_cast<double>(rec.world_size()) * s.steady_steps();
  for (int r = 0; r < rec.world_size(); ++r)
    for (int step = s.first_steady_step; step < rec.steps; ++step) {
      const StepRecord& x = rec.at(r, step);
      const double backward_end = x.start_ms + x.data_ms + x.forward_ms + x.backward_ms;
      double before_closing = backward_end;  // when the buckets before the closing one were all done
      for (int b = 0; b + 1 < nb; ++b) {
        const double end = rec.bucket_at(r, step, b).comm_end_ms;
        before_closing = std::max(before_closing, end);
        unfinished += (end > backward_end) / n;
      }
      exposed += x.exposed_comm_ms / n;
      backlog += (before_closing - backward_end) / n;
      closing += std::max(0.0, rec.bucket_at(r, step, nb - 1).comm_end_ms - before_closing) / n;
    }
  if (exposed <= 0) return "";
  const std::string before = nb > 1 ? fmt("%.2f finishing buckets 0..%d (%.1f of the %d still running when backward "
                                          "ended), ",
                                          backlog, nb - 2, unfinished, nb - 1)
                                    : "";
  return fmt("exposed %.2f ms a step: %s%.2f the closing bucket (%d) alone, %.2f the rest", exposed, before.c_str(),
             closing, nb - 1, std::max(0.0, exposed - backlog - closing));
}

void print_bucket_table(std::FILE* out, const RunRecord& rec, const RunSummary& s) {
  // --zero-stage 1: start..end is each bucket's reduce-scatter in backward, gather_ms its all-gather after the update.
  const bool sharded = std::any_of(rec.bucket_times.begin(), rec.bucket_times.end(),
                                   [](const BucketTimes& t) { return t.gather_end_ms > 0; });
  std::fprintf(out, "  per bucket (mean over ranks and %s, ms from step start; bucket 0 is ready first%s):\n",
               steps_counted(rec).c_str(),
               sharded ? "; comm: the reduce-scatter, gather: the parameters' all-gather" : "");
  std::fprintf(out, "  %6s %10s %9s %8s %8s %8s %8s%s %5s %8s  %s\n", "bucket", "size", "pieces", "ready", "start",
               "end", "comm_ms", sharded ? fmt(" %9s", "gather_ms").c_str() : "", "last", "arrival", "params");
  for (int k = 0; k < static_cast<int>(rec.buckets.size()); ++k) {
    const BucketRecord& b = rec.buckets[k];
    const BucketMeans m = bucket_means(rec, s, k);
    const BucketArrival& a = s.arrivals[k];
    const std::string pieces = fmt("%d..%d", b.first_piece, b.last_piece);
    std::fprintf(out, "  %6d %10s %9s %8.2f %8.2f %8.2f %8.2f%s %5s %8s  %s\n", k, size_text(b.bytes()).c_str(),
                 pieces.c_str(), m.ready, m.begin, m.end, m.end - m.begin,
                 sharded ? fmt(" %9.2f", m.gather_ms).c_str() : "",
                 a.last_rank >= 0 ? fmt("%d", a.last_rank).c_str() : "-",
                 a.last_rank >= 0 ? fmt("%.2f", a.spread_ms).c_str() : "-", shorten(b.pieces, 60).c_str());
  }
  if (const std::string line = exposed_split_line(rec, s); !line.empty()) std::fprintf(out, "  %s\n", line.c_str());
  if (const std::string line = arrival_line(rec, s); !line.empty()) std::fprintf(out, "  %s\n", line.c_str());
}

}  // namespace

void print_report(std::FILE* out, const SummarizedRun& run) {
  const RunRecord& rec = run.record;
  const RunSummary& s = run.summary;
  print_run_line(out, rec, s);
  print_config_line(out, rec);
  if (const std::string note = oversubscription_note(rec); !note.empty()) std::fprintf(out, "  %s\n", note.c_str());
  if (rec.nodes() > 1) {
    std::string nodes;
    for (int r = 0; r < rec.world_size(); ++r) nodes += fmt("%s%d", r ? "," : "", rec.node(r));
    std::fprintf(out, "  topology: %d nodes (node of each rank %s), links %s\n", rec.nodes(), nodes.c_str(),
                 describe(rec.meta.links).c_str());
  }
  if (const std::string lab = lab_text(rec.config); !lab.empty()) std::fprintf(out, "  lab:%s\n", lab.c_str());
  std::fprintf(out, "  build: git %s, started %s\n", known(rec.meta.git_commit), known(rec.meta.start_time_utc));
  if (!rec.meta.stop_reason.empty()) std::fprintf(out, "  status: %s\n", rec.meta.stop_reason.c_str());
  if (rec.steps == 0) return;  // the lines above are all there is: what ran, and why it stopped
  print_summary(out, rec, s);
  print_bucket_table(out, rec, s);
  print_time_use(out, rec, s);
  std::fprintf(out, "  blame:\n");
  for (const std::string& line : blame(rec, s)) std::fprintf(out, "    %s\n", line.c_str());
}

void print_comparison(std::FILE* out, const std::vector<SummarizedRun>& runs) {
  std::fprintf(out, "== comparison (steady state; exposed comm and hidden%% are means over ranks)\n");
  std::fprintf(out, "  %-28s %5s %11s %9s %11s %7s  %s\n", "run", "world", "samples/s", "step_ms", "exposed_ms",
               "hidden%", "blame");
  for (const SummarizedRun& run : runs) {
    const RunSummary& s = run.summary;
    if (run.record.steps == 0) {
      std::fprintf(out, "  %-28s %5d  no step completed\n", shorten(stem(run.record.path), 28).c_str(),
                   run.record.world_size());
      continue;
    }
    const std::vector<Finding> findings = diagnose(run.record, s);
    const Finding& f = headline(findings);
    const std::string verdict =
        f.rank >= 0 ? fmt("%s (rank %d)", to_string(f.cause), f.rank) : std::string(to_string(f.cause));
    const StepRecord mean = mean_over_ranks(s);
    const int world = run.record.world_size();
    std::fprintf(out, "  %-28s %5d %11.0f %9.2f %11s %7s  %s\n", shorten(stem(run.record.path), 28).c_str(), world,
                 s.samples_per_s, s.slowest_step_ms, world > 1 ? fmt("%.2f", mean.exposed_comm_ms).c_str() : "-",
                 hidden_text(mean_hidden_fraction(s), mean.comm_ms, world).c_str(), verdict.c_str());
  }
}

nlohmann::json report_json(const SummarizedRun& run) {
  const RunRecord& rec = run.record;
  nlohmann::json blame = nlohmann::json::array();
  if (rec.steps > 0)
    for (const Finding& f : diagnose(rec, run.summary))
      blame.push_back({{"cause", to_string(f.cause)}, {"rank", f.rank}, {"text", f.text}});
  return {{"run_file", rec.path},
          {"command", rec.meta.command},
          {"world_size", rec.world_size()},
          {"num_steps", rec.steps},
          {"first_step", rec.meta.first_step},
          {"stop_reason", rec.meta.stop_reason},
          {"hostnames", rec.meta.hostnames},
          {"gpus", rec.meta.gpus},
          {"config", rec.config},
          {"summary", rec.steps > 0 ? to_json(run.summary) : nlohmann::json()},  // null: no step to summarize
          {"blame", blame}};
}

}  // namespace ddplab
