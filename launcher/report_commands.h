// `ddplab report FILE... [--json]` and `ddplab timeline FILE [-o OUT] [--force]`: the analysis (analysis/) of
// run files read back from disk (docs/REPORTS.md).
#pragma once
#include <CLI/CLI.hpp>

namespace ddplab {

// Registers both on the ddplab program. Their callbacks run during app.parse(), on rank 0 only (no MPI
// communication; other ranks do nothing). Bad input (an unreadable run file, an output that exists without
// --force) throws UsageError (record/errors.h): one line, exit code 2.
void add_report_commands(CLI::App& app);

}  // namespace ddplab
