// The charts and the page of run files: scripts/charts.py draws the charts and writes the run as one
// self-contained HTML page (scripts/report_page.py). Found beside the program: <prefix>/share/ddplab/scripts for an
// installed ddplab, the source tree's scripts/ for one run from its build tree.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "analysis/summary.h"

namespace ddplab {

// The folder the helper scripts are run from, or "" when there is none (an installed ddplab without its share/).
std::string scripts_dir();

// Why charts.py drew nothing: its one line, whether that line was its refusal of the run files (its exit code 2) or
// an output it could not write (its exit code 5) rather than a failure of its own, and the log worth reading (a
// failure of its own; "" where the line says it all).
struct ChartFailure {
  std::string why;  // "" when it succeeded
  bool refused_input = false;
  bool write_failed = false;
  std::string log = {};
  int stop_signal = 0;  // the signal that stopped it (passed on to it), which end_if_stopped raises
  explicit operator bool() const { return !why.empty(); }
};

// A command stopped while charts.py ran ends by that signal, once it has cleaned up after it.
void end_if_stopped(const ChartFailure& failure);

// Runs charts.py with these arguments (after OUT_DIR: --suite/--sweep/--page/--report and the run files), its
// output into log.
ChartFailure run_chart_script(const std::vector<std::string>& args, const std::string& log);

// The page of these runs alone (`train`, `report --html`): their charts drawn into a temporary folder that is
// removed after, their blame from `report --json`. A failure of the script's own keeps the folder, and names its log.
ChartFailure write_run_page(const std::vector<SummarizedRun>& runs, const std::string& page);

// `<stem>.report.html` beside a run file.
std::string default_page_path(const std::string& run_file);

// The line that says where the page is, or why it was not written (a page is a convenience: the run goes on).
void print_page_line(const std::string& page, const std::string& error);

// `ddplab train`'s page, beside its run file (rank 0); the line about it unless quiet.
void write_train_page(const SummarizedRun& run, bool quiet);

// Rank 0's charts and pages, seconds to minutes of matplotlib, wait until MPI is finalized (launcher/main.cpp): the
// other ranks wait in their MPI_Finalize for rank 0's, under a bound (DDPLAB_MPI_WAIT_S), and must not wait through
// them. after_mpi queues the work; main runs the queue, in order, once MPI_Finalize has returned.
void after_mpi(std::function<void()> work);
void run_after_mpi();

}  // namespace ddplab
