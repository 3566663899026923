// One rank's timings of one training step; the unit of everything the run file stores per step.
#pragma once
#include <limits>

namespace ddplab {

// The phases data, forward, backward, exposed_comm, optimizer, extra_comm, host_work, barrier add up to step_ms
// (the last three are zero unless a pathology of the lab is switched on). With grad accumulation,
// data/forward/backward sum over the micro-batches. comm_ms and hidden_comm_ms describe the communication
// thread: its busy time, and the part of it that ran while the (last) backward was running.
struct StepRecord {
  double start_ms = 0;  // step start, ms since the run's common start (ranks leave a barrier together)
  double data_ms = 0;   // producing the batch
  double forward_ms = 0;
  double backward_ms = 0;
  double exposed_comm_ms = 0;  // after backward, waiting for the gradient all-reduces to finish
  double optimizer_ms = 0;
  double extra_comm_ms = 0;   // an extra all-reduce after the optimizer (--extra-allreduce-mb)
  double host_work_ms = 0;    // rank-0-only work before a barrier (--rank0-work-ms)
  double barrier_ms = 0;      // waiting in that barrier
  double step_ms = 0;         // the whole step
  double comm_ms = 0;         // sum over buckets of all-reduce time (start to end on the comm thread)
  double hidden_comm_ms = 0;  // comm time that overlapped backward
  // The last micro-batch's backward: the one the buckets' all-reduces run beside (backward_ms itself without
  // --grad-accum). 0 in older files: last_backward() estimates it there.
  double last_backward_ms = 0;
  // What the host took from the rank during the step (runtime/cpu_taken.h; -1: this kernel does not count it): the
  // hypervisor's steal on the CPUs the rank may use, and the compute thread's wait for a CPU of its own host.
  double steal_ms = 0;
  double cpu_wait_ms = 0;
  double loss = 0;  // this rank's mean loss on its own shard: the mean over its loss_terms
  // What the rank's batch held (summed over micro-batches; max_len: the longest).
  double samples = 0;
  double useful_tokens = 0;  // real tokens (transformer workloads; 0 for the MLP)
  double padded_tokens = 0;  // rows x longest row (a sequence, or several packed): what was computed on
  double max_len = 0;        // the longest sequence
  // What the rank's loss is a mean over: samples (MLP, classify head), predicted next tokens (lm head). Ranks may
  // hold different counts (variable lengths, a token budget): the global loss weighs each rank's by its count.
  double loss_terms = 0;
  double skipped = 0;        // 1: a non-finite loss or gradient, update skipped (--skip-nonfinite)
  // With --grad-clip: the all-reduced gradients' global L2 norm before clipping (the same on every rank); else 0.
  double grad_norm = 0;
  double lr = 0;  // the step's learning rate (--lr, or where --lr-schedule and --lr-warmup have taken it)
  // With --val-data, on the steps after which the run validated: the validation loss of the parameters this step's
  // update left (the same on every rank; +inf where it was not finite); NaN on the other steps.
  double val_loss = std::numeric_limits<double>::quiet_NaN();
};

// What a field is, for the code that treats fields alike: the run file (dataset type and units), the summary
// (which fields have a meaningful mean) and the analysis (which fields tile the step).
enum class FieldKind {
  kInstant,  // a point on the run's clock (start_ms): no mean
  kPhase,    // a part of the step; the phases, in the order the step runs them, add up to step_ms
  kTime,     // another duration, ms
  kValue,    // a real number (the loss, the gradients' norm)
  kSetting,  // what the run set for the step (the learning rate): no mean
  kSampled,  // measured after some steps only, NaN after the others (the validation loss): no mean
  kCount,    // a whole number of samples, tokens or steps
};

struct StepField {
  const char* name;  // the run file's dataset steps/<name>, the summary's key
  double StepRecord::*member;
  FieldKind kind;
  const char* units;  // the dataset's `units` attribute
};

// The field table: a field added here is written, read back (as zero from files that lack it), averaged in the
// summary, and shown by `ddplab report --json`; the tables and charts show the fields they name.
inline constexpr StepField kStepFields[] = {
    {"start_ms", &StepRecord::start_ms, FieldKind::kInstant, "ms"},
    {"data_ms", &StepRecord::data_ms, FieldKind::kPhase, "ms"},
    {"forward_ms", &StepRecord::forward_ms, FieldKind::kPhase, "ms"},
    {"backward_ms", &StepRecord::backward_ms, FieldKind::kPhase, "ms"},
    {"exposed_comm_ms", &StepRecord::exposed_comm_ms, FieldKind::kPhase, "ms"},
    {"optimizer_ms", &StepRecord::optimizer_ms, FieldKind::kPhase, "ms"},
    {"extra_comm_ms", &StepRecord::extra_comm_ms, FieldKind::kPhase, "ms"},
    {"host_work_ms", &StepRecord::host_work_ms, FieldKind::kPhase, "ms"},
    {"barrier_ms", &StepRecord::barrier_ms, FieldKind::kPhase, "ms"},
    {"step_ms", &StepRecord::step_ms, FieldKind::kTime, "ms"},
    {"comm_ms", &StepRecord::comm_ms, FieldKind::kTime, "ms"},
    {"hidden_comm_ms", &StepRecord::hidden_comm_ms, FieldKind::kTime, "ms"},
    {"last_backward_ms", &StepRecord::last_backward_ms, FieldKind::kTime, "ms"},
    {"steal_ms", &StepRecord::steal_ms, FieldKind::kTime, "ms"},
    {"cpu_wait_ms", &StepRecord::cpu_wait_ms, FieldKind::kTime, "ms"},
    {"loss", &StepRecord::loss, FieldKind::kValue, "nats"},
    {"samples", &StepRecord::samples, FieldKind::kCount, "samples"},
    {"useful_tokens", &StepRecord::useful_tokens, FieldKind::kCount, "tokens"},
    {"padded_tokens", &StepRecord::padded_tokens, FieldKind::kCount, "tokens"},
    {"max_len", &StepRecord::max_len, FieldKind::kCount, "tokens"},
    {"loss_terms", &StepRecord::loss_terms, FieldKind::kCount, "terms"},
    {"skipped", &StepRecord::skipped, FieldKind::kCount, "steps"},
    {"grad_norm", &StepRecord::grad_norm, FieldKind::kValue, "L2 norm"},
    {"lr", &StepRecord::lr, FieldKind::kSetting, "learning rate"},
    {"val_loss", &StepRecord::val_loss, FieldKind::kSampled, "nats per token"},
};

// Whether the summary averages the field over the steady steps: not a point in time, a setting, or a sample.
inline bool averaged(FieldKind kind) {
  return kind != FieldKind::kInstant && kind != FieldKind::kSetting && kind != FieldKind::kSampled;
}

// The phases add up to step_ms: each trainer reads one clock at every boundary between two of them (up to rounding).
inline double sum_of_phases(const StepRecord& r) {
  double phases = 0;
  for (const StepField& f : kStepFields)
    if (f.kind == FieldKind::kPhase) phases += r.*f.member;
  return phases;
}

// Step time outside every recorded phase: work the records do not name.
inline double untimed_ms(const StepRecord& r) {
  const double phases = sum_of_phases(r);
  return r.step_ms > phases ? r.step_ms - phases : 0.0;
}

// The backward the buckets' all-reduces can hide behind: the last micro-batch's, as measured, or in a file that did
// not record it, the step's backward split evenly over its micro-batches (exact only where they are alike).
inline double last_backward(const StepRecord& r, int micro_batches) {
  return r.last_backward_ms > 0 ? r.last_backward_ms : r.backward_ms / micro_batches;
}

}  // namespace ddplab
