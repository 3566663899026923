#include "analysis/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "analysis/format.h"
#include "record/files.h"

namespace ddplab {
namespace {

// Perfetto keeps pid 0 and tid 0 for the kernel's idle task: rank r is process r + 1, its tracks threads 1 and 2.
constexpr int kComputeTrack = 1;
constexpr int kCommTrack = 2;
int process_of(int rank) { return rank + 1; }

// Every boundary is rounded once to whole nanoseconds, and an event's duration is the difference of its two
// boundaries: viewers read ts and dur as separate numbers and truncate each to ns, so a phase rounded on its own
// could end a nanosecond past its step (or past the next phase's start) and be dropped as a malformed slice.
int64_t ns(double ms) { return std::llround(ms * 1e6); }
// Microseconds half a nanosecond above: truncated to ns, it reads back as that very nanosecond (or duration).
double us(int64_t nanoseconds) { return (static_cast<double>(nanoseconds) + 0.5) / 1e3; }

nlohmann::json metadata(const char* name, int pid, int tid, nlohmann::json args) {
  return {{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

// An event from begin to end, ms on the run's axis.
nlohmann::json complete(const std::string& name, const char* cat, int rank, int tid, double begin_ms, double end_ms,
                        nlohmann::json args) {
  const int64_t begin = ns(begin_ms), end = std::max(ns(end_ms), begin);
  return {{"ph", "X"},
          {"name", name},
          {"cat", cat},
          {"pid", process_of(rank)},
          {"tid", tid},
          {"ts", us(begin)},
          {"dur", us(end - begin)},
          {"args", std::move(args)}};
}

// When a phase runs. The lab's phases are timed between two clock reads every step, so with their feature off they
// still measure a few hundred nanoseconds; they become events only in the steps where the feature acted.
enum class When {
  kAlways,          // the five phases every step has
  kExtraAllreduce,  // --extra-allreduce-mb
  kBarrierStep,     // --rank0-work-ms: every --barrier-every steps, every rank waits in a barrier ...
  kRank0Work,       // ... after rank 0's host work
};

bool phase_runs(When when, const nlohmann::json& config, int rank, int step) {
  const bool barrier_step =
      config.value("rank0_work_ms", 0.0) > 0 && (step + 1) % std::max(config.value("barrier_every", 1), 1) == 0;
  switch (when) {
    case When::kAlways:
      return true;
    case When::kExtraAllreduce:
      return config.value("extra_allreduce_mb", 0.0) > 0;
    case When::kBarrierStep:
      return barrier_step;
    case When::kRank0Work:
      return barrier_step && rank == 0;
  }
  return true;
}

// The step's phases (record/step_record.h), in the order the trainer runs them: they tile the step. With
// gradient accumulation data/forward/backward are sums over micro-batches, drawn as one block each.
struct Phase {
  double StepRecord::*field;
  const char* name;
  When when;
};
constexpr Phase kPhases[] = {
    {&StepRecord::data_ms, "data", When::kAlways},
    {&StepRecord::forward_ms, "forward", When::kAlways},
    {&StepRecord::backward_ms, "backward", When::kAlways},
    {&StepRecord::exposed_comm_ms, "exposed comm wait", When::kAlways},
    {&StepRecord::optimizer_ms, "optimizer", When::kAlways},
    {&StepRecord::extra_comm_ms, "extra all-reduce", When::kExtraAllreduce},
    {&StepRecord::host_work_ms, "host work", When::kRank0Work},
    {&StepRecord::barrier_ms, "barrier wait", When::kBarrierStep},
};

// Rank r as a process of two tracks, compute and communication; several nodes: a rank's node leads its name, and
// the ranks of a node sort together.
void add_rank_names(nlohmann::json& events, const RunRecord& run, int r) {
  const std::string node = run.nodes() > 1 ? "node " + std::to_string(run.node(r)) + " / " : "";
  const int pid = process_of(r);
  events.push_back(
      metadata("process_name", pid, 0, {{"name", node + "rank " + std::to_string(r) + " (" + run.host(r) + ")"}}));
  events.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", run.node(r) * run.world_size() + r}}));
  events.push_back(metadata("thread_name", pid, kComputeTrack, {{"name", "compute"}}));
  events.push_back(metadata("thread_sort_index", pid, kComputeTrack, {{"sort_index", kComputeTrack}}));
  events.push_back(metadata("thread_name", pid, kCommTrack, {{"name", "communication"}}));
  events.push_back(metadata("thread_sort_index", pid, kCommTrack, {{"sort_index", kCommTrack}}));
}

// Rank r's step s on the compute track: the step, then its phases inside it.
void add_step_events(nlohmann::json& events, const RunRecord& run, int r, int s) {
  const StepRecord& step = run.at(r, s);
  const int step_no = static_cast<int>(run.meta.first_step) + s;  // the training step (a resumed run's go on)
  const double start = step.start_ms;
  double t = start;
  nlohmann::json phases = nlohmann::json::array();
  for (const Phase& p : kPhases) {
    const double ms = step.*p.field;
    if (phase_runs(p.when, run.config, r, step_no))
      phases.push_back(complete(p.name, "phase", r, kComputeTrack, t, t + ms, {{"step", step_no}, {"ms", ms}}));
    t += ms;
  }
  // The enclosing step event must contain its phases, or viewers mis-nest them: cover rounding.
  const double end = std::max(start + step.step_ms, t);
  events.push_back(complete("step " + std::to_string(step_no), "step", r, kComputeTrack, start, end,
                            {{"step", step_no},
                             {"steady", s >= run.first_steady_step()},
                             {"step_ms", step.step_ms},
                             {"loss", step.loss},
                             {"steal_ms", step.steal_ms},
                             {"cpu_wait_ms", step.cpu_wait_ms}}));
  for (auto& e : phases) events.push_back(std::move(e));
}

// Rank r's buckets in step s on the communication track: each one's all-reduce (or reduce-scatter and all-gather)
// and the moment it was ready.
void add_bucket_events(nlohmann::json& events, const RunRecord& run, int r, int s) {
  const int step_no = static_cast<int>(run.meta.first_step) + s;
  const double start = run.at(r, s).start_ms;
  for (int k = 0; k < static_cast<int>(run.buckets.size()); ++k) {
    const BucketRecord& b = run.buckets[k];
    const BucketTimes& times = run.bucket_at(r, s, k);
    const double ready = times.ready_ms, begin = times.comm_start_ms, end = times.comm_end_ms;
    if (begin <= 0 && end <= 0) continue;  // never communicated (nothing recorded)
    const std::string name = "bucket " + std::to_string(k);
    // --zero-stage 1: the bar in backward is the gradients' reduce-scatter; the parameters' all-gather follows
    // the update.
    if (times.gather_end_ms > 0)
      events.push_back(complete(name + " all-gather (" + size_text(b.bytes()) + ")", "all-gather", r, kCommTrack,
                                times.gather_start_ms, times.gather_end_ms,
                                {{"step", step_no},
                                 {"bucket", k},
                                 {"bytes", b.bytes()},
                                 {"comm_ms", times.gather_end_ms - times.gather_start_ms}}));
    const bool sharded = times.gather_end_ms > 0;
    // One rank has no peer to reduce with: its buckets only become ready.
    if (run.world_size() > 1)
      events.push_back(complete(name + (sharded ? " reduce-scatter (" : " (") + size_text(b.bytes()) + ")", "bucket", r,
                                kCommTrack, begin, end,
                                {{"step", step_no},
                                 {"bucket", k},
                                 {"bytes", b.bytes()},
                                 {"pieces", b.pieces},
                                 {"ready_ms", ready - start},
                                 {"wait_after_ready_ms", begin - ready},
                                 {"comm_ms", end - begin}}));
    events.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"name", name + " ready"},
                      {"cat", "ready"},
                      {"pid", process_of(r)},
                      {"tid", kCommTrack},
                      {"ts", us(ns(ready))},
                      {"args", {{"step", step_no}, {"bucket", k}}}});
  }
}

// How the ranks' times share one axis, and how closely (RUN_FILE.md, "Clock alignment").
std::string clock_note(const RunMetadata& meta) {
  if (meta.world_size == 1) return "one rank: its own monotonic clock";
  if (!meta.clock_alignment_us) return "each rank reads its own monotonic clock from a common start (alignment not recorded)";
  return "each rank reads its own monotonic clock from a time zero found by round trips to rank 0 (each within " +
         std::to_string(*meta.clock_alignment_us) + " us of rank 0's)";
}

}  // namespace

StepSpan steps_held(const RunRecord& run, StepSpan span) {
  return {std::max(span.first, run.meta.first_step), std::min(span.last, run.meta.first_step + run.steps - 1)};
}

nlohmann::json chrome_trace(const RunRecord& run, StepSpan span) {
  nlohmann::json events = nlohmann::json::array();
  const StepSpan shown = steps_held(run, span);
  for (int r = 0; r < run.world_size(); ++r) {
    add_rank_names(events, run, r);
    for (int64_t step = shown.first; step <= shown.last; ++step) {
      const int s = static_cast<int>(step - run.meta.first_step);
      add_step_events(events, run, r, s);
      add_bucket_events(events, run, r, s);
    }
  }
  nlohmann::json other = {{"run_file", run.path},
                          {"world_size", run.world_size()},
                          {"num_steps", run.steps},
                          {"first_step", run.meta.first_step},  // a resumed run's first: events carry training steps
                          {"steps_shown", {shown.first, shown.last}},
                          // A training step's number, as every event's args.step and steps_shown
                          {"first_steady_step", run.meta.first_step + run.first_steady_step()},
                          {"config", run.config},
                          {"clock", clock_note(run.meta)},
                          {"git_commit", run.meta.git_commit},
                          {"start_time_utc", run.meta.start_time_utc},
                          {"command_line", run.meta.command_line}};
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

std::string default_timeline_path(const std::string& run_path) {
  const std::string ext = ".h5";
  const bool has_ext =
      run_path.size() > ext.size() && run_path.compare(run_path.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? run_path.substr(0, run_path.size() - ext.size()) : run_path) + ".trace.json";
}

void write_timeline(const RunRecord& run, const std::string& path, bool force, StepSpan span) {
  // Strings come from the run file as stored (hostnames, attributes): bytes that are not UTF-8 become U+FFFD
  // instead of a json::type_error that would end `ddplab timeline` as an internal error.
  write_text_file(path, chrome_trace(run, span).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                  force);
}

}  // namespace ddplab
