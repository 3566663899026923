// `ddplab report FILE... [--json | --html OUT.html [--force]]`, `ddplab diff A B [--json]` and
// `ddplab timeline FILE [-o OUT] [--force]`: the analysis (analysis/) of run files read back from disk
// (docs/REPORTS.md).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "record/run_record.h"

namespace ddplab {

// True on rank 0, or when MPI is not running: the commands that read files run there alone.
bool is_rank0();
// A file that is not a readable run file is bad input: a usage error (one line, exit code 2). So is, unless allowed,
// one that holds no completed step (a run stopped in its first): the analyses need steps.
enum class EmptyRun { kRefused, kAllowed };
RunRecord read_input(const std::string& path, EmptyRun empty = EmptyRun::kRefused);

// Registers them on the ddplab program. Their callbacks run during app.parse(), on rank 0 only (no MPI
// communication; other ranks do nothing). Bad input (an unreadable run file, an output that exists without
// --force) throws UsageError (record/errors.h): one line, exit code 2.
void add_report_commands(CLI::App& app);

}  // namespace ddplab
