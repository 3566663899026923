// The charts and the page of run files: scripts/charts.py draws the charts and writes the run as one
// self-contained HTML page (scripts/report_page.py). Found beside the program: <prefix>/share/ddplab/scripts for an
// installed ddplab, the source tree's scripts/ for one run from its build tree.
#pragma once
#include <string>
#include <vector>

#include "analysis/summary.h"

namespace ddplab {

// The folder the helper scripts are run from, or "" when there is none (an installed ddplab without its share/).
std::string scripts_dir();

// Runs charts.py with these arguments (after OUT_DIR: --suite/--sweep/--page/--report and the run files), its
// output into log. Returns "" when it succeeded, else why not in a few words.
std::string run_chart_script(const std::vector<std::string>& args, const std::string& log);

// The page of these runs alone (`train`, `report --html`): their charts drawn into a temporary folder that is
// removed after, their blame from `report --json`. Returns "" when written, else why not.
std::string write_run_page(const std::vector<SummarizedRun>& runs, const std::string& page);

// `<stem>.report.html` beside a run file.
std::string default_page_path(const std::string& run_file);

// The line that says where the page is, or why it was not written (a page is a convenience: the run goes on).
void print_page_line(const std::string& page, const std::string& error);

// `ddplab train`'s page, beside its run file (rank 0); the line about it unless quiet.
void write_train_page(const SummarizedRun& run, bool quiet);

}  // namespace ddplab
