// One rank's timings of one training step; the unit of everything the run file stores per step.
#pragma once
#include <array>
#include <string>
#include <utility>

namespace ddplab {

// The phases data, forward, backward, exposed_comm, optimizer, extra_comm, host_work, barrier add up to step_ms
// (the last three are zero unless a pathology of the lab is switched on). With grad accumulation,
// data/forward/backward sum over the micro-batches. comm_ms and hidden_comm_ms describe the communication
// thread: its busy time, and the part of it that ran while the (last) backward was running.
struct StepRecord {
  double start_ms = 0;         // step start, ms since the run's common start (ranks leave a barrier together)
  double data_ms = 0;          // producing the batch
  double forward_ms = 0;
  double backward_ms = 0;
  double exposed_comm_ms = 0;  // after backward, waiting for the gradient all-reduces to finish
  double optimizer_ms = 0;
  double extra_comm_ms = 0;    // an extra all-reduce after the optimizer (--extra-allreduce-mb)
  double host_work_ms = 0;     // rank-0-only work before a barrier (--rank0-work-ms)
  double barrier_ms = 0;       // waiting in that barrier
  double step_ms = 0;          // the whole step
  double comm_ms = 0;          // sum over buckets of all-reduce time (start to end on the comm thread)
  double hidden_comm_ms = 0;   // comm time that overlapped backward
  double loss = 0;             // this rank's mean loss on its own shard (mean over micro-batches)
  // What the rank's batch held (summed over micro-batches; max_len: the longest).
  double samples = 0;
  double useful_tokens = 0;    // real tokens (transformer workloads; 0 for the MLP)
  double padded_tokens = 0;    // rows x longest row (a sequence, or several packed): what was computed on
  double max_len = 0;          // the longest sequence
  double skipped = 0;          // 1: a non-finite loss or gradient, update skipped (--skip-nonfinite)
};

// Field table: the run file writes one dataset per entry, the summary reads them by name.
inline constexpr std::array<std::pair<const char*, double StepRecord::*>, 18> kStepFields = {{
    {"start_ms", &StepRecord::start_ms},
    {"data_ms", &StepRecord::data_ms},
    {"forward_ms", &StepRecord::forward_ms},
    {"backward_ms", &StepRecord::backward_ms},
    {"exposed_comm_ms", &StepRecord::exposed_comm_ms},
    {"optimizer_ms", &StepRecord::optimizer_ms},
    {"extra_comm_ms", &StepRecord::extra_comm_ms},
    {"host_work_ms", &StepRecord::host_work_ms},
    {"barrier_ms", &StepRecord::barrier_ms},
    {"step_ms", &StepRecord::step_ms},
    {"comm_ms", &StepRecord::comm_ms},
    {"hidden_comm_ms", &StepRecord::hidden_comm_ms},
    {"loss", &StepRecord::loss},
    {"samples", &StepRecord::samples},
    {"useful_tokens", &StepRecord::useful_tokens},
    {"padded_tokens", &StepRecord::padded_tokens},
    {"max_len", &StepRecord::max_len},
    {"skipped", &StepRecord::skipped},
}};

// The phases that tile step_ms, in step order: each runner reads one clock at every boundary between two of them, so
// they add up to step_ms up to rounding.
inline constexpr std::array<double StepRecord::*, 8> kStepPhases = {
    &StepRecord::data_ms,      &StepRecord::forward_ms,    &StepRecord::backward_ms,  &StepRecord::exposed_comm_ms,
    &StepRecord::optimizer_ms, &StepRecord::extra_comm_ms, &StepRecord::host_work_ms, &StepRecord::barrier_ms};
inline double sum_of_phases(const StepRecord& r) {
  double sum = 0;
  for (double StepRecord::*phase : kStepPhases) sum += r.*phase;
  return sum;
}

// The unit of a field of kStepFields, as the run file records it.
inline const char* step_field_units(const std::string& name) {
  if (name == "loss") return "nats";
  if (name == "samples") return "samples";
  if (name == "skipped") return "steps";
  if (name.size() > 3 && name.compare(name.size() - 3, 3, "_ms") == 0) return "ms";
  return "tokens";
}

}  // namespace ddplab
