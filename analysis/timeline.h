// A run as a Chrome trace (https://ui.perfetto.dev, chrome://tracing): one process per rank, a "compute" track
// with the phases of every step and a "communication" track with every bucket's all-reduce, on the run's
// common time axis (ranks leave a barrier together at start). Format notes in docs/REPORTS.md.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "record/run_record.h"

namespace ddplab {

// The trace as a JSON object {"traceEvents": [...], ...}; ts and dur in microseconds.
nlohmann::json chrome_trace(const RunRecord& run);

// "runs/x.h5" -> "runs/x.trace.json".
std::string default_timeline_path(const std::string& run_path);

// Writes chrome_trace(run) to `path` through a temporary that is moved into place only when complete; an
// existing file is replaced only with `force` (the run file's rules). Throws std::runtime_error.
void write_timeline(const RunRecord& run, const std::string& path, bool force);

}  // namespace ddplab
