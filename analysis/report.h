// The text (and JSON) of `ddplab train`'s closing summary and of `ddplab report` (docs/REPORTS.md). Library code:
// it throws; the subcommands that call it are the program's (launcher/report_commands.cpp).
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/summary.h"

namespace ddplab {

// The steady-state summary: slowest rank, throughput, spread, loss, tokens, and the per-rank table.
void print_summary(std::FILE* out, const RunRecord& run, const RunSummary& summary);
// Per rank: compute, comm, comm-compute overlap beside hidden%, and the idle time by what it waited for.
void print_time_use(std::FILE* out, const RunSummary& summary);
// One run: what it was (config, lab knobs, build, status), the summary, the per-bucket table and the blame.
void print_report(std::FILE* out, const SummarizedRun& run);
// "oversubscribed: 4 ranks x 1 BLAS thread on 2 cores; ..." for a run whose ranks took turns on rank 0's host's cores
// (RunRecord::oversubscribed_ranks), "oversubscribed: 4 ranks on one GPU; ..." for one whose ranks shared a GPU
// (RunRecord::ranks_sharing_a_gpu); "" otherwise. The train header and the report both say it.
std::string oversubscription_note(const RunRecord& run);
// hidden% as every table prints it: "93%", or "-" where there was no communication to hide (one rank, or no comm).
bool has_hidden_share(double comm_ms, int world);
std::string hidden_text(double fraction, double comm_ms, int world);
// One row per run: name, world, samples/s, step ms, exposed comm, hidden%, blame.
void print_comparison(std::FILE* out, const std::vector<SummarizedRun>& runs);
// `ddplab report --json`: the run file, what the run was, the summary (as the run file stores it) and the blame.
nlohmann::json report_json(const SummarizedRun& run);

}  // namespace ddplab
