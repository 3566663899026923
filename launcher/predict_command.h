// `ddplab predict RUN.h5 [--bucket-mb LIST] [--first-bucket-mb LIST] [--last-bucket-mb LIST] [--overlap on,off]
// [--link LIST] [--ranks LIST] [--comm ring,mpi] [--comm-dtype LIST] [--calibration FILE] [--json OUT]`: the predicted
// step time of every combination of the lists, from one measured run (analysis/predict.h, docs/PREDICT.md), with the
// recommended setting per link and world size.
#pragma once
#include <CLI/CLI.hpp>

#include "launcher/report_commands.h"

namespace ddplab {

// Registers it on the ddplab program, as the report commands (launcher/report_commands.h): the parsed command sets
// `parsed`, which main runs on rank 0 after every check. Bad input (an unreadable or untimed run
// file, an unknown link, a bucket size <= 0, an existing --json file without --force) throws UsageError before
// anything is written.
void add_predict_command(CLI::App& app, FileCommand& parsed);

}  // namespace ddplab
