// `ddplab report FILE... [--json | --html OUT.html [--force]]`, `ddplab diff A B [--json]` and
// `ddplab timeline FILE [-o OUT] [--force]`: the analysis (analysis/) of run files read back from disk
// (docs/REPORTS.md).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "record/run_record.h"

namespace ddplab {

// A file that is not a readable run file is bad input: a usage error (one line, exit code 2). So is, unless allowed,
// one that holds no completed step (a run stopped in its first): the analyses need steps.
enum class EmptyRun { kRefused, kAllowed };
RunRecord read_input(const std::string& path, EmptyRun empty = EmptyRun::kRefused);

// The work of the file command that was parsed (report, timeline, diff, predict). Its CLI11 callback only sets it:
// main runs it once the command line and the DDPLAB_* settings are checked on every rank, so that a refused setting
// leaves nothing read or written, and on rank 0 alone (the file commands communicate with no other rank).
using FileCommand = std::function<void()>;

// Registers them on the ddplab program; the one parsed sets `parsed`. Bad input (an unreadable run file, an output
// that exists without --force) throws UsageError (runtime/errors.h) when it runs: one line, exit code 2.
void add_report_commands(CLI::App& app, FileCommand& parsed);

}  // namespace ddplab
