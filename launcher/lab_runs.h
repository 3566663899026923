// What `ddplab suite` and `ddplab sweep` share: a run of many `ddplab train` runs into one results folder, with the
// same header notes, charts and page, and the same rule that every rank was started with the same options.
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "config/train_config.h"

namespace ddplab {

// "300 steps each (5 warm-up, 295 measured)": the warm-up as the run files will clamp it (a default longer than the
// run leaves one step to measure).
std::string steps_each(const TrainConfig& c);

// Below 5 measured steps, one hiccup decides a case's figures: said under the header, with the --steps that
// measures 5 after the whole warm-up asked for (the clamped one grows back with the run).
void print_few_steps_note(const TrainConfig& c);

// Rank 0 creates the results folder (default runs/<prefix>_<time>); every rank learns its name or the error.
// A folder reused with --force has every name the command will write checked first (`outputs`, the run files and
// timelines, and the summaries, charts and page every such folder gets): a name it cannot write, such as a folder
// where a file goes, is refused before any run rather than after the runs before it replaced their files.
// Collective over world.
std::string prepare_out_dir(std::string dir, const std::string& prefix, bool force,
                            const std::vector<std::string>& outputs, MPI_Comm world);

// Charts of the given run files into dir/charts and the page, dir/report.html (scripts/charts.py with Debian's
// python3: h5py, matplotlib, jinja2), its output into dir/charts.log. Charts and page are a convenience: without
// them the command says why and goes on.
// `summary_args`: --suite SUMMARY.json (groups, oversubscription, blame) or --sweep SUMMARY.json (the prediction).
void draw_charts(const std::string& dir, const std::vector<std::string>& files,
                 const std::vector<std::string>& summary_args);

// A command's own options (the training flags are compared with every run's), alike on every rank before any
// work: an MPMD launch can hand ranks different ones, and they would then run different cases and wait on each other.
// Collective over MPI_COMM_WORLD; throws UsageError naming the options that differ.
void require_same_options(const char* command, const std::vector<std::pair<std::string, std::string>>& options);

// Between two runs of a suite or sweep (which holds a StopSignals over all of them): a stop signal that reached any
// rank stops the command before `next_run`, on every rank alike, with TrainingStopped (exit code 128 + the signal).
// Collective over world; its wait bounded by between_runs_bound_s.
void stop_if_signalled(const std::string& next_run, const TrainConfig& base, MPI_Comm world);

// The bound of a suite's or sweep's waits between its runs, where rank 0 also reads and writes the run just done:
// --timeout-s, but at least the setup's floor (watchdog::ArmedRun); 0 (no bound) where --timeout-s 0 turns the
// watchdog off.
double between_runs_bound_s(const TrainConfig& base);

// "a,b,c".
std::string joined(const std::vector<std::string>& words);

}  // namespace ddplab
