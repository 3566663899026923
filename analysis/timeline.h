// A run as a Chrome trace (https://ui.perfetto.dev, chrome://tracing): one process per rank, a "compute" track
// with the phases of every step and a "communication" track with every bucket's all-reduce, on the run's
// common time axis (ranks leave a barrier together at start). Format notes in docs/REPORTS.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "record/run_record.h"

namespace ddplab {

// Training steps first..last (inclusive; a resumed run's numbers go on from its checkpoint's).
struct StepSpan {
  int64_t first = 0, last = INT64_MAX;
};

// The training steps of `span` that the run holds, first and last; first > last where there are none.
StepSpan steps_held(const RunRecord& run, StepSpan span);

// The trace of the steps in `span` as a JSON object {"traceEvents": [...], ...}; ts and dur in microseconds.
nlohmann::json chrome_trace(const RunRecord& run, StepSpan span = {});

// "runs/x.h5" -> "runs/x.trace.json".
std::string default_timeline_path(const std::string& run_path);

// Writes chrome_trace(run, span) to `path` through a temporary that is moved into place only when complete; an
// existing file is replaced only with `force` (the run file's rules). Throws std::runtime_error.
void write_timeline(const RunRecord& run, const std::string& path, bool force, StepSpan span = {});

}  // namespace ddplab
