#include "launcher/suite.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "analysis/blame.h"
#include "analysis/diff.h"
#include "analysis/format.h"
#include "analysis/predict.h"
#include "analysis/timeline.h"
#include "config/knob_flags.h"
#include "launcher/cli.h"
#include "launcher/lab_runs.h"
#include "launcher/page.h"
#include "launcher/rank_agreement.h"
#include "launcher/report_commands.h"
#include "launcher/run.h"
#include "record/files.h"
#include "record/run_record.h"
#include "runtime/errors.h"
#include "runtime/owned_comm.h"
#include "runtime/watchdog.h"
#include "train/step_rules.h"
#include "train/stop_signals.h"

namespace ddplab {
namespace {

struct Case {
  std::string name;
  std::string group;  // weak | strong | pathology | input | update
  int world_size;
  TrainConfig config;
};

// What the suite keeps of a case once it has run (the step records are dropped case by case).
struct CaseResult {
  Case c;
  RunSummary summary;
  std::string path;
  std::vector<Finding> blame;  // multi-rank cases: who sets the pace, from the records in memory
  // More ranks x BLAS threads than cores on rank 0's host (RunRecord::oversubscribed_ranks): the ranks took turns on
  // the cores, and the case's efficiency measures how this machine shares them, not how DDP scales. Said in the
  // table, the JSON and the charts.
  int oversubscribed_ranks = 0;
  int host_cores = 0;
  // A GPU case's ranks of one host on one GPU (RunRecord::ranks_sharing_a_gpu): they took turns on it, which the
  // table's `*` says too.
  int ranks_on_one_gpu = 0;
  // The pathology, input and update cases: their losses against the baseline case's, step by step and bit for bit
  // (compare_losses, as `ddplab diff` does): they change timing, not math.
  std::optional<LossDiff> loss_vs_baseline;
};

// The case the lab's others are measured against: its weak case at the full world size (the token suite's uniform
// one).
std::string baseline_case(const SuiteOptions& o, int size) {
  return o.name == "lab" ? "weak_ws" + std::to_string(size) : "uniform";
}

// The ranks a case does not use wait for it without spinning: Open MPI's blocking barrier polls a core, which
// on a small machine would steal the cycles of the ranks being measured.
void wait_quietly(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Powers of two up to the world size, and the world size itself.
std::vector<int> scaling_sizes(int world) {
  std::vector<int> sizes;
  for (int n = 1; n < world; n *= 2) sizes.push_back(n);
  sizes.push_back(world);
  return sizes;
}

std::vector<Case> lab_cases(const SuiteOptions& o, int world) {
  // Every case starts from the base with the pathologies switched off; each pathology case switches its own on.
  TrainConfig clean = o.base;
  clean.straggler_ms = 0;
  clean.extra_allreduce_mb = 0;
  clean.rank0_work_ms = 0;
  clean.data_cost_ms = 0;
  clean.loader_threads = 0;
  clean.slow_rank = 0;   // the straggler case's own: it may not be a rank of the smaller scaling cases
  clean.zero_stage = 0;  // the sharded update's case below is the one that turns it on
  clean.quiet = true;
  const int batch = o.base.batch;

  std::vector<Case> cases;
  for (int ws : scaling_sizes(world)) {
    cases.push_back({"weak_ws" + std::to_string(ws), "weak", ws, clean});
  }
  const int global = batch * world;
  for (int ws : scaling_sizes(world)) {
    Case c{"strong_ws" + std::to_string(ws), "strong", ws, clean};
    c.config.batch = global / ws;
    cases.push_back(c);
  }
  Case straggler{"straggler", "pathology", world, clean};
  straggler.config.straggler_ms = o.base.straggler_ms;
  straggler.config.slow_rank = o.base.slow_rank;
  cases.push_back(straggler);
  Case extra{"extra_allreduce", "pathology", world, clean};
  extra.config.extra_allreduce_mb = o.base.extra_allreduce_mb;
  cases.push_back(extra);
  Case barrier{"rank0_barrier", "pathology", world, clean};
  barrier.config.rank0_work_ms = o.base.rank0_work_ms;
  barrier.config.barrier_every = o.base.barrier_every;
  cases.push_back(barrier);
  if (clean.has_input_pipeline()) {
    for (int threads : {0, 2, 4}) {
      Case input{"input_threads" + std::to_string(threads), "input", world, clean};
      input.config.data_cost_ms = o.base.data_cost_ms;
      input.config.loader_threads = threads;
      input.config.prefetch = o.base.prefetch;
      cases.push_back(input);
    }
  }
  // The remedy for what the two cores lack at ws>1: each rank updates its share of the parameters (--zero-stage 1),
  // the same math as the baseline, bit for bit. Where it applies: the CPU ring on the fp32 wire, 2+ ranks.
  if (world > 1 && clean.device == Device::kCpu && clean.comm == AllreduceImpl::kRing &&
      clean.comm_dtype == WireDtype::kFp32) {
    Case sharded{"zero_stage1", "update", world, clean};
    sharded.config.zero_stage = 1;
    sharded.config.optimizer_in_backward = OnOff::kOff;
    cases.push_back(sharded);
  }
  // PyTorch DDP's bucket layout beside ddplab's (the baseline at the same --bucket-mb): PyTorch closes a bucket on
  // the piece that reaches its cap, caps the first to become ready at 1 MiB, to start communicating early, and cuts
  // the last as the others, where ddplab keeps each bucket within its cap and caps the last, the tail no backward
  // hides. Where ranks talk.
  if (world > 1) {
    Case layout{"pytorch_layout", "layout", world, clean};
    layout.config.first_bucket_mb = 1;
    layout.config.last_bucket_mb = kAutoEndBucketMb;
    layout.config.bucket_rule = BucketRule::kReach;
    cases.push_back(layout);
  }
  return cases;
}

// What suite tokens trains where its flags leave it open, set in the base (then checked as what runs): the tiny
// transformer, 16 sequences a rank, a token budget of ~ batch x mean length with room for one longest sequence.
void set_token_defaults(SuiteOptions& o) {
  TrainConfig& c = o.base;
  if (!c.transformer()) c.model = ModelKind::kTiny;
  if (!o.batch_given) c.batch = 16;
  if (!o.max_tokens_given) c.max_tokens = std::max<int64_t>(static_cast<int64_t>(c.batch) * 160, c.max_len);
}

// The token-skew lab: the same transformer and length distribution, batched four ways (uniform lengths are the
// reference: what the same sample count would cost without skew). The base has set_token_defaults'.
std::vector<Case> token_cases(const SuiteOptions& o, int world) {
  TrainConfig clean = o.base;
  clean.straggler_ms = 0;
  clean.extra_allreduce_mb = 0;
  clean.rank0_work_ms = 0;
  clean.data_cost_ms = 0;
  clean.quiet = true;
  std::vector<Case> cases;
  Case uniform{"uniform", "tokens", world, clean};
  uniform.config.lengths = LengthDist::kFixed;
  uniform.config.max_len = 128;
  uniform.config.min_len = 128;  // every sequence 128 tokens, as the data makes fixed lengths, whatever the others take
  uniform.config.batching = Batching::kSample;
  cases.push_back(uniform);
  for (Batching batching : {Batching::kSample, Batching::kBucket, Batching::kToken}) {
    Case c{batching == Batching::kSample ? "variable" : to_string(batching), "tokens", world, clean};
    c.config.batching = batching;
    cases.push_back(c);
  }
  return cases;
}

// The flags whose value a suite's cases set themselves: given, they would change nothing, so they are refused.
struct CaseOwnedFlag {
  const char* suite;
  const char* flag;
  const char* why;
};
constexpr CaseOwnedFlag kCaseOwnedFlags[] = {
    {"lab", "--loader-threads", "its input cases run 0, 2 and 4 loader threads"},
    {"lab", "--zero-stage", "its zero_stage1 case shards the update, every other case keeps stage 0"},
    {"lab", "--first-bucket-mb", "its pytorch_layout case cuts PyTorch DDP's buckets, every other case ddplab's"},
    {"lab", "--last-bucket-mb", "its pytorch_layout case cuts PyTorch DDP's buckets, every other case ddplab's"},
    {"lab", "--bucket-rule", "its pytorch_layout case cuts PyTorch DDP's buckets, every other case ddplab's"},
    {"tokens", "--batching", "its cases run sample, bucket and token batching"},
    {"tokens", "--straggler-ms", "it runs no lab pathology: suite lab does"},
    {"tokens", "--slow-rank", "it runs no lab pathology: suite lab does"},
    {"tokens", "--extra-allreduce-mb", "it runs no lab pathology: suite lab does"},
    {"tokens", "--rank0-work-ms", "it runs no lab pathology: suite lab does"},
    {"tokens", "--barrier-every", "it runs no lab pathology: suite lab does"},
    {"tokens", "--data-cost-ms", "it runs no lab pathology: suite lab does"},
    {"tokens", "--prefetch", "it runs no input cases: suite lab does"},
};

}  // namespace

CLI::App* add_suite_command(CLI::App& app, SuiteOptions& o) {
  CLI::App* suite = app.add_subcommand("suite", "the DDP lab: scaling and pathology cases in one launch");
  // Suite defaults of the pathology knobs (train's are "off"), set before the flags capture their defaults.
  o.base.steps = 20;
  o.base.straggler_ms = 40;
  o.base.extra_allreduce_mb = 128;
  o.base.rank0_work_ms = 20;
  // A sleep per sample: 64 ms a batch of 128, past a quarter of the step (blame's input-bound) even where 4 ranks
  // take turns on 2 cores and stretch the step to 100-150 ms; 0.2 fell under it there.
  o.base.data_cost_ms = 0.5;
  suite->add_option("name", o.name, "which suite: lab | tokens")->capture_default_str();
  add_train_flags(suite, o.base, FlagSet::kSuite);
  // What the suite does with train's flags where it differs from train, after train's own help: its autos (run_suite)
  // and the flags a suite's cases set themselves.
  const auto note = [suite](const char* flag, const std::string& text) {
    CLI::Option* option = suite->get_option(flag);
    option->description(option->get_description() + "; " + text);
  };
  note("--threads",
       "in a suite auto is 1 (with more, the ws=1 cases would take every core, and the scaling cases would compare "
       "thread counts, not ranks)");
  note("--optimizer-in-backward",
       "in a suite auto is off (in backward the update would take the ws=1 case's idle core, which no larger case "
       "has)");
  for (const CaseOwnedFlag& owned : kCaseOwnedFlags)
    note(owned.flag, std::string("suite ") + owned.suite + " refuses it (" + owned.why + ")");
  suite
      ->add_option("--out-dir", o.out_dir,
                   "folder for the case run files and the summary (default "
                   "runs/suite_<name>_<time>)")
      ->check(non_empty_path());
  // Set here, before the train flags' checks at the end of parsing (--warmup-steps against --steps), which then see
  // the steps that will run.
  suite->add_flag_callback(
      "--full",
      [&o] {
        o.full = true;
        o.base.steps = 100;
      },
      "100 steps per case instead of 20 (--steps 100)");
  suite->callback([&o, suite] {
    require(!o.full || suite->count("--steps") == 0, "--full is --steps 100: give one of them");
    o.batch_given = suite->count("--batch") > 0;
    o.max_tokens_given = suite->count("--max-tokens") > 0;
    for (const CLI::Option* option : suite->get_options())
      if (option->count() > 0) o.given_flags.push_back(option->get_name());
  });
  return suite;
}

namespace {

// The files a case writes in the results folder: its run file, and the straggler case's timeline beside it.
std::string case_run_file(const Case& c) { return c.name + ".h5"; }
bool writes_timeline(const Case& c) { return c.name == "straggler"; }

// Every case in turn, each on the first world_size ranks (the others wait without spinning). Results on rank 0.
std::vector<CaseResult> run_cases(const SuiteOptions& o, const std::vector<Case>& cases,
                                  const std::string& command_line, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::vector<CaseResult> results;
  std::optional<RunRecord> baseline;  // rank 0: the baseline case's records, once it has run
  const StopSignals signals;          // over every case: a signal between two of them stops the suite before the next
  for (const Case& c : cases) {
    stop_if_signalled("case " + c.name, o.base, world);
    const double start = MPI_Wtime();
    OwnedComm sub;  // none on the ranks outside this case
    {
      // Every rank comes here from the barrier after the case before: a rank stopped since keeps the others here.
      const watchdog::StartupWait splitting("the ranks' split for the next case of the suite",
                                            between_runs_bound_s(o.base));
      MPI_Comm_split(world, rank < c.world_size ? 0 : MPI_UNDEFINED, rank, sub.receive());
    }
    TrainConfig config = c.config;
    config.out = o.out_dir + "/" + case_run_file(c);
    SummarizedRun r;
    if (sub != MPI_COMM_NULL) {
      try {
        r = run_training(config, sub, RunOptions{"suite " + o.name, command_line, c.name});
      } catch (const UsageError& e) {
        // The ranks outside this case wait for it below: a refusal inside it must end the whole job.
        if (c.world_size < size) {
          if (rank == 0) std::fprintf(stderr, "ddplab: error in case %s: %s\n", c.name.c_str(), e.what());
          std::fflush(stderr);
          MPI_Abort(world, 2);
        }
        throw;
      } catch (const TrainingStopped& e) {
        // Its ranks stopped together, its run file written; the ranks outside it wait below: the job ends for them.
        if (c.world_size < size) {
          if (rank == 0) std::fprintf(stderr, "ddplab: stopped in case %s: %s\n", c.name.c_str(), e.what());
          std::fflush(stderr);
          MPI_Abort(world, e.exit_code);
        }
        throw;
      }
      sub.reset();
    }
    {
      // The case's ranks find the others at the barrier already (they waited through the case, unbounded: a case
      // runs as long as it runs, and its own ranks' watchdog ends the job if one of them stops in it).
      std::optional<watchdog::StartupWait> after_case;
      if (rank < c.world_size)
        after_case.emplace("the ranks outside the case, at the barrier after it", between_runs_bound_s(o.base));
      wait_quietly(world);
    }
    if (rank == 0) {
      const bool same_math = c.group == "pathology" || c.group == "input" || c.group == "update";
      results.push_back({c, r.summary, r.record.path, diagnose(r.record, r.summary), r.record.oversubscribed_ranks(),
                         r.record.meta.host_cores, r.record.ranks_sharing_a_gpu(),
                         baseline && same_math ? std::optional(compare_losses(*baseline, r.record)) : std::nullopt});
      if (writes_timeline(c)) write_timeline(r.record, default_timeline_path(r.record.path), /*force=*/true);
      std::printf("  %-16s ws=%d  %8.2f ms/step  %8.0f samples/s  (%.1f s)\n", c.name.c_str(), c.world_size,
                  r.summary.slowest_step_ms, r.summary.samples_per_s, MPI_Wtime() - start);
      std::fflush(stdout);
      if (c.name == baseline_case(o, size)) baseline = std::move(r.record);  // the one case's records kept
    }
  }
  return results;
}

const CaseResult* find_case(const std::vector<CaseResult>& results, const std::string& name) {
  for (const CaseResult& r : results)
    if (r.c.name == name) return &r;
  return nullptr;
}

// The references of one launch a case is measured against: weak_ws1, strong_ws1 and the baseline case (the lab's
// weak case at the full world size, the token suite's uniform one). Null where the launch has none.
struct CaseReferences {
  const CaseResult* weak1;
  const CaseResult* strong1;
  const CaseResult* baseline;
};

CaseReferences case_references(const SuiteOptions& o, int size, const std::vector<CaseResult>& results) {
  return {find_case(results, "weak_ws1"), find_case(results, "strong_ws1"), find_case(results, baseline_case(o, size))};
}

// One case's figures as the table, the CSV and the JSON show them.
struct CaseFigures {
  StepRecord mean;  // over the ranks
  double compute;   // forward + backward
  double extra;     // lab work: extra all-reduces, host work and the barrier waits after it
  bool has_efficiency;
  double efficiency;
  bool has_vs_base;
  double vs_base;
  bool oversubscribed;
};

CaseFigures case_figures(const CaseResult& r, const CaseReferences& refs) {
  const RunSummary& s = r.summary;
  const CaseResult* ref = r.c.group == "weak" ? refs.weak1 : r.c.group == "strong" ? refs.strong1 : nullptr;
  CaseFigures f;
  f.mean = mean_over_ranks(s);
  f.compute = f.mean.forward_ms + f.mean.backward_ms;
  f.extra = f.mean.extra_comm_ms + f.mean.host_work_ms + f.mean.barrier_ms;
  f.has_efficiency = ref && ref->summary.samples_per_s > 0;
  f.efficiency = f.has_efficiency ? s.samples_per_s / (r.c.world_size * ref->summary.samples_per_s) : 0;
  f.has_vs_base = refs.baseline && refs.baseline->summary.samples_per_s > 0;
  f.vs_base = f.has_vs_base ? s.samples_per_s / refs.baseline->summary.samples_per_s - 1 : 0;
  f.oversubscribed = r.oversubscribed_ranks > 0 || r.ranks_on_one_gpu > 0;
  return f;
}

// "" where the pathology, input and update cases left every loss of every step identical to the baseline's, else the
// cases that did not, each with the step it first differs at.
std::string losses_off_baseline(const std::vector<CaseResult>& results) {
  std::string off;
  for (const CaseResult& r : results) {
    if (!r.loss_vs_baseline || (r.loss_vs_baseline->compared() && r.loss_vs_baseline->first_difference < 0)) continue;
    off += (off.empty() ? "" : ", ") + r.c.name +
           (r.loss_vs_baseline->compared() ? " from step " + std::to_string(r.loss_vs_baseline->first_difference)
                                           : " (not compared: " + r.loss_vs_baseline->not_compared + ")");
  }
  return off;
}

// The lab's columns; the token suite has no scaling reference (eff) and no lab work (extra): left out there.
void print_case_header(bool lab) {
  std::printf("\n%-16s %4s %6s %9s %10s%s %9s %8s %8s %8s %10s%s %8s\n", "case", "ws", "gbatch", "step_ms", "samples/s",
              lab ? "    eff" : "", "spread_ms", "data_ms", "comp_ms", "optim_ms", "exposed_ms", lab ? " extra_ms" : "",
              "vs_base");
}

void print_case_row(const CaseResult& r, const CaseFigures& f, bool lab) {
  const RunSummary& s = r.summary;
  char eff[16] = "", extra_cell[16] = "";
  if (lab && f.has_efficiency)
    std::snprintf(eff, sizeof eff, " %6.2f", f.efficiency);
  else if (lab)
    std::snprintf(eff, sizeof eff, " %6s", "-");
  if (lab) std::snprintf(extra_cell, sizeof extra_cell, " %8.2f", f.extra);
  // One rank has no peers: no spread across ranks, no all-reduce to expose.
  const bool peers = r.c.world_size > 1;
  std::printf("%-16s %3d%c %6lld %9.2f %10.0f%s %9s %8.2f %8.2f %8.2f %10s%s %8s\n", r.c.name.c_str(), r.c.world_size,
              f.oversubscribed ? '*' : ' ', static_cast<long long>(s.global_batch), s.slowest_step_ms, s.samples_per_s,
              eff, peers ? fmt("%.2f", s.mean_spread_ms).c_str() : "-", f.mean.data_ms, f.compute, f.mean.optimizer_ms,
              peers ? fmt("%.2f", f.mean.exposed_comm_ms).c_str() : "-", extra_cell,
              f.has_vs_base ? fmt("%+.0f%%", std::round(100 * f.vs_base) + 0.0).c_str() : "-");  // +0.0: no "-0%"
}

const char* const kCaseCsvHeader =
    "case,group,world_size,global_batch,oversubscribed,slowest_rank,slowest_step_ms,samples_per_s,efficiency,"
    "mean_spread_ms,data_ms,compute_ms,optimizer_ms,comm_ms,hidden_comm_ms,exposed_comm_ms,extra_ms,barrier_ms,"
    "vs_baseline,final_loss,useful_tokens_per_s,padded_tokens_per_s,padding_ratio,mean_token_spread,run_file\n";

// A cell that does not apply (no reference case, a workload without tokens; at one rank, spread and communication) is
// left empty in the CSV, and the case's own figures are null in the JSON: a 0 there would read as a measurement. (The
// JSON's summary is the run file's, as stored.)
std::string case_csv_row(const CaseResult& r, const CaseFigures& f, bool lab) {
  const auto cell = [](bool applies, double value) {
    std::ostringstream text;
    if (applies) text << value;
    return text.str();
  };
  const RunSummary& s = r.summary;
  const StepRecord& mean = f.mean;
  const bool peers = r.c.world_size > 1;  // one rank: no spread across ranks, no all-reduce
  std::ostringstream row;
  row << r.c.name << ',' << r.c.group << ',' << r.c.world_size << ',' << s.global_batch << ','
      << (f.oversubscribed ? 1 : 0) << ',' << s.slowest_rank << ',' << s.slowest_step_ms << ',' << s.samples_per_s
      << ',' << cell(f.has_efficiency, f.efficiency) << ',' << cell(peers, s.mean_spread_ms) << ',' << mean.data_ms
      << ',' << f.compute << ',' << mean.optimizer_ms << ',' << cell(peers, mean.comm_ms) << ','
      << cell(peers, mean.hidden_comm_ms) << ',' << cell(peers, mean.exposed_comm_ms) << ',' << f.extra << ','
      << mean.barrier_ms << ',' << cell(f.has_vs_base, f.vs_base) << ',' << s.final_loss << ','
      << cell(!lab, s.useful_tokens_per_s) << ',' << cell(!lab, s.padded_tokens_per_s) << ','
      << cell(!lab, s.padding_ratio) << ',' << cell(!lab, s.mean_token_spread) << ',' << r.path << '\n';
  return row.str();
}

nlohmann::json case_json(const CaseResult& r, const CaseFigures& f) {
  return {{"case", r.c.name},
          {"group", r.c.group},
          {"world_size", r.c.world_size},
          {"efficiency", f.has_efficiency ? nlohmann::json(f.efficiency) : nlohmann::json()},
          {"oversubscribed", f.oversubscribed},
          {"vs_baseline", f.has_vs_base ? nlohmann::json(f.vs_base) : nlohmann::json()},
          {"run_file", r.path},
          {"summary", to_json(r.summary)}};
}

// The `*` of the table: ranks that took turns on the host's cores or on one GPU.
void print_oversubscription_notes(int blas_threads, const std::vector<CaseResult>& results) {
  const auto most = std::max_element(results.begin(), results.end(), [](const CaseResult& a, const CaseResult& b) {
    return a.oversubscribed_ranks < b.oversubscribed_ranks;
  });
  if (most != results.end() && most->oversubscribed_ranks > 0) {
    // What the turns cost, as measured: the compute threads' wait for a CPU (the cases' CPU contention findings,
    // which the blame below leaves to this line).
    double least_wait = 1e300, most_wait = -1;
    for (const CaseResult& r : results) {
      if (r.oversubscribed_ranks == 0) continue;
      const double wait = mean_over_ranks(r.summary).cpu_wait_ms;
      if (wait >= 0) least_wait = std::min(least_wait, wait), most_wait = std::max(most_wait, wait);
    }
    std::printf(
        "\n* oversubscribed: up to %d ranks x %s on this host's %s; the ranks take turns on the cores, so "
        "the case's times measure this machine, not DDP%s\n",
        most->oversubscribed_ranks, counted(blas_threads, "BLAS thread").c_str(),
        counted(most->host_cores, "core").c_str(),
        most_wait >= 0 ? fmt(" (the ranks' compute threads waited %.1f-%.1f ms/step for a CPU in these cases, "
                             "each case's mean over its ranks)",
                             least_wait, most_wait)
                             .c_str()
                       : "");
  }
  // Not oversubscribed by count, and still sharing: the compute threads waited for a CPU (blame's CPU contention,
  // behind the communication threads or other processes). Their efficiency measures that sharing too.
  std::vector<std::string> contended;
  for (const CaseResult& r : results)
    if (r.oversubscribed_ranks == 0 &&
        std::any_of(r.blame.begin(), r.blame.end(), [](const Finding& f) { return f.cause == Cause::kCpuContention; }))
      contended.push_back(r.c.name);
  if (!contended.empty()) {
    std::string names;
    for (const std::string& n : contended) names += (names.empty() ? "" : ", ") + n;
    std::printf(
        "\ncontended: in %s the ranks' compute threads waited for a CPU (their blame below says how long): "
        "those times measure how this host shares its cores as well as DDP\n",
        names.c_str());
  }
  int most_on_one_gpu = 0;
  for (const CaseResult& r : results) most_on_one_gpu = std::max(most_on_one_gpu, r.ranks_on_one_gpu);
  if (most_on_one_gpu > 0)
    std::printf(
        "\n* oversubscribed: up to %d ranks on one GPU; they take turns on it (their kernels, and the ring's copies "
        "between them), so the case's times measure this machine, not DDP across GPUs\n",
        most_on_one_gpu);
}

// The legend under the lab's table; returns its notes on particular cases, which the page shows too.
std::vector<std::string> print_lab_legend(int size, const std::string& losses_off,
                                          const std::vector<CaseResult>& results) {
  std::printf(
      "efficiency: weak = samples/s / (ws x weak_ws1), strong = samples/s / (ws x strong_ws1); vs_base: "
      "throughput change against weak_ws%d\n",
      size);
  std::printf("loss across the pathology, input and update cases: %s\n",
              losses_off.empty() ? "identical to the baseline at every step (they change timing, not math)"
                                 : ("DIFFERS from the baseline: " + losses_off).c_str());
  std::vector<std::string> notes;
  const CaseResult* again = size > 1 ? find_case(results, "strong_ws" + std::to_string(size)) : nullptr;
  const CaseResult* base = find_case(results, "weak_ws" + std::to_string(size));
  if (again && base) {
    const double a = base->summary.slowest_step_ms, b = again->summary.slowest_step_ms;
    notes.push_back(
        fmt("strong_ws%d runs weak_ws%d's setting again (the same batch a rank): %.2f against %.2f ms, "
            "%.1f%% apart, this host's noise from run to run, which every vs_base carries",
            size, size, b, a, 100 * std::fabs(b - a) / std::min(a, b)));
  }
  if (find_case(results, "zero_stage1"))
    notes.push_back(
        "zero_stage1: each rank updates its shard of the parameters; its optim includes waiting for the all-gather "
        "of the updated parameters");
  const CaseResult* layout = find_case(results, "pytorch_layout");
  if (layout && base)
    notes.push_back(
        fmt("pytorch_layout: weak_ws%d with PyTorch DDP's buckets (%s; weak_ws%d's: %s); other buckets "
            "sum in another order, so its loss is not compared",
            size, bucket_layout_text(layout->c.config).c_str(), size, bucket_layout_text(base->c.config).c_str()));
  for (const std::string& note : notes) std::printf("%s\n", note.c_str());
  return notes;
}

// The token suite's own table: useful tokens/s against the uniform case.
void print_token_table(const std::vector<CaseResult>& results, const CaseResult* baseline) {
  std::printf("vs_base: samples/s against uniform (the token table below compares useful tokens/s)\n");
  std::printf("\n%-16s %14s %14s %8s %11s %12s %9s\n", "case", "useful tok/s", "padded tok/s", "padding", "spread_ms",
              "token_spread", "vs_unif");
  for (const CaseResult& r : results) {
    const RunSummary& s = r.summary;
    const double vs = baseline && baseline->summary.useful_tokens_per_s > 0
                          ? s.useful_tokens_per_s / baseline->summary.useful_tokens_per_s - 1
                          : 0;
    std::printf("%-16s %14.0f %14.0f %7.1f%% %11.2f %12.0f %+8.0f%%\n", r.c.name.c_str(), s.useful_tokens_per_s,
                s.padded_tokens_per_s, 100 * s.padding_ratio, s.mean_spread_ms, s.mean_token_spread, 100 * vs);
  }
  std::printf("vs_unif: useful tokens/s against uniform 128-token sequences (the same sample count without skew)\n");
}

// What the suite's table gives summary.json.
struct CaseTable {
  nlohmann::json cases = nlohmann::json::array();  // a case's figures each
  std::vector<std::string> notes;                  // the legend's notes on particular cases
  bool loss_identical = true;  // the pathology, input and update cases left the loss identical to the baseline
};

// The suite's table against the references of the same launch, its legend, and its CSV.
CaseTable print_case_table(const SuiteOptions& o, int size, const std::vector<CaseResult>& results) {
  const CaseReferences refs = case_references(o, size, results);
  const bool lab = o.name == "lab";  // else the token suite
  CaseTable table;
  std::string csv = kCaseCsvHeader;
  print_case_header(lab);
  for (const CaseResult& r : results) {
    const CaseFigures f = case_figures(r, refs);
    print_case_row(r, f, lab);
    csv += case_csv_row(r, f, lab);
    table.cases.push_back(case_json(r, f));
  }
  write_text_file(o.out_dir + "/summary.csv", csv, /*force=*/true);
  const std::string losses_off = losses_off_baseline(results);
  print_oversubscription_notes(o.base.blas_threads, results);
  std::printf(
      "\ngbatch: the global batch; step_ms: the slowest rank's; spread_ms: each step's slowest rank less its fastest, "
      "averaged over the steps; data, "
      "comp (forward + backward), optim, exposed (comm waited for)%s: means over the ranks, ms per step\n",
      lab ? " and extra (lab work and barriers)" : "");
  if (lab)
    table.notes = print_lab_legend(size, losses_off, results);
  else
    print_token_table(results, refs.baseline);
  table.loss_identical = losses_off.empty();
  return table;
}

void refuse_case_owned_flags(const SuiteOptions& o) {
  for (const CaseOwnedFlag& owned : kCaseOwnedFlags)
    require(o.name != owned.suite ||
                std::find(o.given_flags.begin(), o.given_flags.end(), owned.flag) == o.given_flags.end(),
            std::string(owned.flag) + " is not a flag of suite " + o.name + ": " + owned.why);
  // The input cases, the only ones that read them, are not run without an input pipeline (lab_cases).
  if (o.name == "lab" && !o.base.has_input_pipeline())
    for (const char* flag : {"--data-cost-ms", "--prefetch"})
      require(std::find(o.given_flags.begin(), o.given_flags.end(), flag) == o.given_flags.end(),
              std::string(flag) + " is not read by suite lab with a transformer on the CPU: it runs no input cases " +
                  "(the transformer makes its batches within the step)");
  require(o.name != "tokens" || o.base.transformer() ||
              std::find(o.given_flags.begin(), o.given_flags.end(), "--model") == o.given_flags.end(),
          "suite tokens trains a transformer: --model tiny, small or gpt2-small");
}

// A flag of the other model than every case trains (train refuses it as it parses; a suite knows its model only
// after its own defaults, suite tokens' transformer): --input-dim to suite tokens shaped nothing.
void refuse_other_models_flags(const SuiteOptions& o) {
  const bool transformer = o.base.transformer();
  visit_knobs(o.base, [&](const Knob& knob, const auto&) {
    const bool other = transformer ? (knob.traits & kMlp) != 0 : (knob.traits & kTransformer) != 0;
    if (!other || std::find(o.given_flags.begin(), o.given_flags.end(), knob.flag) == o.given_flags.end()) return;
    throw UsageError(transformer ? std::string(knob.flag) + " shapes the MLP (--model mlp), and suite " + o.name +
                                       " trains --model " + to_string(o.base.model) + ", a transformer: leave it out"
                                 : std::string(knob.flag) + " needs a transformer --model (suite " + o.name +
                                       " trains --model mlp): leave it out or name one");
  });
}

// The suite's own rules, then each case's config checked as its run will check it (validate, and what its world
// size adds: the ranks it names, the global batch, this host's memory), before any case runs and before the results
// folder is made: a case cannot refuse for the ranks outside it, and a refusal after some cases ran would leave
// their files. Sets the suite's autos in o.base. Throws UsageError naming the case where a case's own setting fails.
std::vector<Case> checked_cases(SuiteOptions& o, int size) {
  require(o.name == "lab" || o.name == "tokens", "unknown suite '" + o.name + "' (expected lab or tokens)");
  refuse_case_owned_flags(o);
  if (o.name == "tokens") set_token_defaults(o);
  refuse_other_models_flags(o);
  validate(o.base);
  require(o.name != "tokens" || !o.max_tokens_given || o.base.max_tokens >= o.base.max_len,
          "--max-tokens " + std::to_string(o.base.max_tokens) + " is below --max-len " +
              std::to_string(o.base.max_len) + ": the token case's batch of one longest sequence would exceed it");
  require(o.base.slow_rank < size, "--slow-rank " + std::to_string(o.base.slow_rank) + " is not a rank of this " +
                                       std::to_string(size) + "-rank launch");
  require(o.base.comm != AllreduceImpl::kHier,
          "--comm hier needs more than one node, which the suite's one-rank cases never have");
  // The base first, its refusals naming no case (and its global batch fits an int before lab_cases counts it).
  validate_for_ranks(o.base, size);

  // One BLAS thread per rank unless --threads says otherwise: with auto, a ws=1 case would take every core and the
  // ws=4 case a quarter each, and the scaling cases would compare thread counts, not data parallelism.
  if (o.base.blas_threads == 0) o.base.blas_threads = 1;
  // Likewise the update stays after backward: in backward it would take ws=1's idle core, which no larger case has.
  if (!o.base.optimizer_in_backward) o.base.optimizer_in_backward = OnOff::kOff;
  std::vector<Case> cases = o.name == "lab" ? lab_cases(o, size) : token_cases(o, size);
  for (const Case& c : cases) {
    try {
      validate(c.config);
      validate_for_ranks(c.config, c.world_size);
    } catch (const UsageError& e) {
      throw UsageError("case " + c.name + " of suite " + o.name + ": " + e.what());
    }
  }
  return cases;
}

// The model's answer to "which bucket cap and overlap here?", from the lab's baseline case (the weak case at the full
// world size), as `ddplab predict` answers it from that run file (analysis/predict.h): the caps it weighs
// (kBucketCapsToTry and the case's own), overlap on and off. Printed, and returned for the summary and the page; a
// case the model cannot take returns why instead.
nlohmann::json predict_from_baseline(const CaseResult& base) {
  const std::string file = base.path.substr(base.path.find_last_of('/') + 1);
  std::vector<double> caps = {base.c.config.bucket_mb};
  for (double mb : kBucketCapsToTry)
    if (mb != caps[0]) caps.push_back(mb);
  std::string cap_list;
  for (double mb : caps) cap_list += (cap_list.empty() ? "" : ",") + fmt("%g", mb);
  // The path as the suite wrote it, so that the command runs from where the suite was launched.
  const std::string command = "ddplab predict " + base.path + " --bucket-mb " + cap_list + " --overlap on,off";
  try {
    const StepModel model = build_model(read_input(base.path), std::nullopt);
    std::vector<Prediction> rows;
    for (bool overlap : {model.measured.overlap, !model.measured.overlap})
      for (double mb : caps) {
        PredictSetting s = model.measured;
        s.bucket_mb = mb;
        s.overlap = overlap;
        rows.push_back(predict(model, s));
      }
    const Recommendation chosen = recommend(rows, model.measured, ranking_tolerance(model));
    const Prediction& own = rows.front();  // the case's own cap and overlap
    const Prediction& best = rows[chosen.row];
    const double error = 100 * (own.step.step_ms / model.measured_step_ms - 1);
    const double gain = 100 * (1 - best.step.step_ms / own.step.step_ms);
    const std::string flags =
        fmt("--bucket-mb %g --overlap %s", best.setting.bucket_mb, best.setting.overlap ? "on" : "off");
    std::printf("\nprediction (%s): its own setting replays at %.2f ms/step (measured %.2f, %+.1f%%)\n",
                command.c_str(), own.step.step_ms, model.measured_step_ms, error);
    const double noise = 100 * ranking_tolerance(model);
    double fastest = own.step.step_ms, slowest = fastest;
    for (const Prediction& p : rows)
      fastest = std::min(fastest, p.step.step_ms), slowest = std::max(slowest, p.step.step_ms);
    // Every setting within the run's noise: the answer is that the choice does not matter here, not one of them.
    const std::string verdict =
        chosen.within_noise + 1 == static_cast<int>(rows.size())
            ? fmt("its own setting: the %zu settings are predicted within %.1f%% of each other (%.2f-%.2f ms/step), "
                  "inside the run's noise (%.1f%%): here the cap and overlap barely move the step",
                  rows.size(), 100 * (slowest / fastest - 1), fastest, slowest, noise)
        : chosen.own ? fmt("its own setting; %s predicted within %.1f%% of the fastest (the run's noise)",
                           counted(chosen.within_noise, "other setting").c_str(), noise)
                     : fmt("%s, %.2f ms/step predicted (%.1f%% faster than its own setting predicted)", flags.c_str(),
                           best.step.step_ms, gain) +
                           (chosen.within_noise > 0 ? fmt("; %s predicted within %.1f%% of it (the run's noise)",
                                                          counted(chosen.within_noise, "other setting").c_str(), noise)
                                                    : "");
    std::printf("  recommended by the model: %s\n", verdict.c_str());
    nlohmann::json predicted = nlohmann::json::array();
    for (const Prediction& p : rows)
      predicted.push_back({{"bucket_mb", p.setting.bucket_mb},
                           {"overlap", p.setting.overlap ? "on" : "off"},
                           {"buckets", p.buckets},
                           {"predicted_step_ms", p.step.step_ms},
                           {"exposed_comm_ms", p.step.exposed_ms},
                           {"extrapolated", p.extrapolated}});
    return {{"run_file", file},
            {"command", command},
            {"measured_step_ms", model.measured_step_ms},
            {"rows", predicted},
            {"own",
             {{"bucket_mb", own.setting.bucket_mb},
              {"overlap", own.setting.overlap ? "on" : "off"},
              {"predicted_step_ms", own.step.step_ms},
              {"error_pct", error}}},
            {"recommended",
             {{"bucket_mb", best.setting.bucket_mb},
              {"overlap", best.setting.overlap ? "on" : "off"},
              {"predicted_step_ms", best.step.step_ms},
              {"gain_pct", gain},
              {"own", chosen.own},
              {"within_noise", chosen.within_noise},
              {"tolerance_pct", noise},
              {"text", verdict}}}};
  } catch (const std::exception& e) {
    std::printf("\nprediction: n/a (%s: %s)\n", command.c_str(), e.what());
    return {{"run_file", file}, {"command", command}, {"why_not", e.what()}};
  }
}

}  // namespace

int run_suite(SuiteOptions o, const std::string& command_line) {
  std::vector<std::string> given;  // --out-dir and --force may differ: rank 0's folder is every rank's
  for (const std::string& flag : o.given_flags)
    if (flag != "--out-dir" && flag != "--force") given.push_back(flag);
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::vector<Case> cases;
  {
    // Before the first case arms the watchdog with --timeout-s: a rank stopped in these checks ends the job too.
    const watchdog::StartupWait agreeing("the ranks' agreement on the suite's cases and its folder");
    // The ranks agree on the suite's options and the training flags first: then every check below decides alike on
    // every rank (but for this host's memory, which the lowest refusing rank's reason settles for all).
    require_same_options("suite",
                         {{"suite", o.name}, {"--full", o.full ? "on" : "off"}, {"flags given", joined(given)}});
    require_same_config(o.base, world);
    std::string refused;
    try {
      cases = checked_cases(o, size);
    } catch (const UsageError& e) {
      refused = e.what();
    }
    if (const std::string reason = first_failing_reason(refused, world); !reason.empty()) throw UsageError(reason);
    // The base as the largest case: the device, the nodes and cuDNN's attention, on every rank.
    validate_launch(o.base, world);
    std::vector<std::string> outputs;
    for (const Case& c : cases) {
      outputs.push_back(case_run_file(c));
      if (writes_timeline(c)) outputs.push_back(default_timeline_path(case_run_file(c)));
    }
    o.out_dir = prepare_out_dir(o.out_dir, "suite_" + o.name, o.base.force, outputs, world);
  }

  if (rank == 0) {
    std::printf("ddplab suite %s: %zu cases on %s, %s, %s per rank, results in %s/\n", o.name.c_str(), cases.size(),
                counted(size, "rank").c_str(), steps_each(o.base).c_str(),
                counted(o.base.blas_threads, "BLAS thread").c_str(), o.out_dir.c_str());
    print_few_steps_note(o.base);
    if (size == 1)
      std::printf(
          "  one rank: every case runs alone, with no peer to wait for%s; mpirun -np 2 or more shows what the "
          "suite is for\n",
          o.name == "lab" ? " or to scale to" : " or to be skewed against");
    std::fflush(stdout);
  }
  const std::vector<CaseResult> results = run_cases(o, cases, command_line, world);
  if (rank != 0) return 0;

  CaseTable table = print_case_table(o, size, results);
  // Who sets the pace in each multi-rank case, and why (analysis/blame.h); of a one-rank case only what the host
  // took from it, which every efficiency measured against it carries.
  std::vector<std::string> files, lines;
  for (size_t i = 0; i < results.size(); ++i) {
    files.push_back(results[i].path);
    const bool alone = results[i].c.world_size < 2;
    std::vector<std::string> texts;
    for (const Finding& f : results[i].blame) {
      if (alone && f.cause != Cause::kCpuContention && f.cause != Cause::kNoisyHost) continue;
      texts.push_back(f.text);
      // An oversubscribed case's contention is the table's `*`, with its measured wait under the table.
      if (f.cause == Cause::kCpuContention && results[i].oversubscribed_ranks > 0) continue;
      lines.push_back(fmt("  %-16s %s\n", results[i].c.name.c_str(), f.text.c_str()));
    }
    if (!alone || !texts.empty()) table.cases[i]["blame"] = texts;
  }
  if (!lines.empty()) std::printf("\nblame:\n");
  for (const std::string& line : lines) std::fputs(line.c_str(), stdout);
  int host_cores = 0;  // rank 0's host as the widest case saw it (a one-rank case may be bound to one core)
  for (const CaseResult& r : results) host_cores = std::max(host_cores, r.host_cores);
  nlohmann::json summary = {{"suite", o.name},
                            {"world_size", size},
                            {"steps", o.base.steps},
                            {"host_cores", host_cores},
                            {"cases", table.cases}};
  // The lab's claim about its pathology, input and update cases; the token suite has none of them.
  if (o.name == "lab") summary["loss_identical"] = table.loss_identical, summary["notes"] = table.notes;
  if (const CaseResult* base = find_case(results, baseline_case(o, size)); o.name == "lab" && size > 1 && base)
    summary["prediction"] = predict_from_baseline(*base);
  write_text_file(o.out_dir + "/summary.json", summary.dump(2) + "\n", /*force=*/true);
  std::printf("\nrun files: %s/<case>.h5, one a case (ddplab report, diff, timeline and predict read them)\n",
              o.out_dir.c_str());
  std::printf("summary: %s/summary.csv, %s/summary.json\n", o.out_dir.c_str(), o.out_dir.c_str());
  if (const CaseResult* straggler = find_case(results, "straggler")) {
    std::printf("timeline of the straggler case: %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                default_timeline_path(straggler->path).c_str());
  }
  after_mpi([dir = o.out_dir, files] { draw_charts(dir, files, {"--suite", dir + "/summary.json"}); });
  return table.loss_identical ? 0 : 1;
}

}  // namespace ddplab
