#include "launcher/lab_runs.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "analysis/format.h"
#include "launcher/page.h"
#include "launcher/run.h"
#include "record/files.h"
#include "record/run_record.h"
#include "runtime/agreement.h"
#include "runtime/errors.h"
#include "runtime/watchdog.h"
#include "train/step_rules.h"
#include "train/stop_signals.h"

namespace ddplab {

std::string steps_each(const TrainConfig& c) {
  const int warmup = first_steady_step(c.steps, c.warmup_steps);
  return counted(c.steps, "step") + " each (" + std::to_string(warmup) + " warm-up, " +
         std::to_string(c.steps - warmup) + " measured)";
}

void print_few_steps_note(const TrainConfig& c) {
  if (c.steps - first_steady_step(c.steps, c.warmup_steps) < 5)
    std::printf("  few measured steps: one hiccup decides a case's figures (--steps %d or more measures 5)\n",
                std::max(0, c.warmup_steps) + 5);
}

namespace {

// The first name of a reused results folder that the command could not write, in one line; "" when none.
std::string reused_folder_problem(const std::string& dir, std::vector<std::string> outputs) {
  for (const char* name : {"summary.csv", "summary.json", "charts.log", "report.html"}) outputs.push_back(name);
  for (const std::string& name : outputs)
    if (const std::string problem = check_output_path(dir + "/" + name, /*force=*/true); !problem.empty())
      return problem;
  struct stat st;
  const std::string charts = dir + "/charts";
  if (lstat(charts.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return "the charts' folder " + charts + " exists and is not a folder";
  return "";
}

}  // namespace

std::string prepare_out_dir(std::string dir, const std::string& prefix, bool force,
                            const std::vector<std::string>& outputs, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string error;
  if (rank == 0) {
    if (dir.empty()) {
      mkdir("runs", 0755);
      dir = "runs/" + prefix + "_" + local_time_stamp();
    }
    if (mkdir(dir.c_str(), 0755) != 0) {
      const int why = errno;
      struct stat st;
      if (why != EEXIST)  // --force reuses a folder; it cannot make a missing parent or a read-only one writable
        error = "cannot create the results folder " + dir + ": " + std::strerror(why);
      else if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        error = "results folder " + dir + " exists and is not a folder";
      else if (!force)
        error = "results folder " + dir + " exists (--force reuses it, overwriting its files)";
      else
        error = reused_folder_problem(dir, outputs);
    }
  }
  error = broadcast_error(error, world);
  if (!error.empty()) throw UsageError(error);
  char buf[4096] = {};
  std::snprintf(buf, sizeof buf, "%s", dir.c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, world);
  return buf;
}

void draw_charts(const std::string& dir, const std::vector<std::string>& files,
                 const std::vector<std::string>& summary_args) {
  const std::string charts = dir + "/charts", log = dir + "/charts.log", page = dir + "/report.html";
  std::vector<std::string> args = {charts, "--page", page};
  args.insert(args.end(), summary_args.begin(), summary_args.end());
  args.insert(args.end(), files.begin(), files.end());
  std::remove(page.c_str());  // a reused folder's page describes the runs just replaced, whether or not a new one comes
  const ChartFailure failure = run_chart_script(args, log);
  end_if_stopped(failure);
  if (!failure)
    std::printf("charts: %s/ (PNG and SVG; list in %s)\n", charts.c_str(), log.c_str());
  else
    std::printf("charts: not drawn (%s)\n", failure.why.c_str());
  print_page_line(page, failure ? "charts.py writes it: see the line above" : "");
}

double between_runs_bound_s(const TrainConfig& base) {
  return base.timeout_s > 0 ? std::max(base.timeout_s, watchdog::ArmedRun::kSetupFloorS) : 0;
}

void stop_if_signalled(const std::string& next_run, const TrainConfig& base, MPI_Comm world) {
  int mine = StopSignals::received(), any = 0;
  {
    const watchdog::StartupWait agreeing("the ranks' agreement on a stop signal, between two runs",
                                         between_runs_bound_s(base));
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world);
  }
  if (any != 0)
    throw TrainingStopped(std::string(stop_signal_name(any)) + " received: stopped before " + next_run, 128 + any);
}

void require_same_options(const char* command, const std::vector<std::pair<std::string, std::string>>& options) {
  if (const std::string differing = disagreement(options, MPI_COMM_WORLD); !differing.empty())
    throw UsageError(std::string("ranks were started with different ") + command + " options: " + differing +
                     "; every rank needs the same flags");
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : ",") + word;
  return text;
}

}  // namespace ddplab
