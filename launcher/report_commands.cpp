#include "launcher/report_commands.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "analysis/diff.h"
#include "analysis/format.h"
#include "analysis/report.h"
#include "analysis/timeline.h"
#include "config/knob_flags.h"
#include "config/train_config.h"
#include "launcher/page.h"
#include "record/files.h"
#include "record/isolated_read.h"
#include "record/run_file.h"
#include "runtime/errors.h"

namespace ddplab {

RunRecord read_input(const std::string& path, EmptyRun empty) {
  RunRecord run;
  try {
    read_first_in_child(path, "cannot read run file " + path, [&] { (void)read_run_file(path); });
    run = read_run_file(path);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  try {  // the analyses read the config as the trainer's settings: each stored value must be one
    (void)config_from_json(run.config);
  } catch (const std::exception& e) {
    throw UsageError("cannot read run file " + path + ": config " + e.what());
  }
  if (run.steps == 0 && empty == EmptyRun::kRefused)
    throw UsageError("run file " + path + " holds no completed step" +
                     (run.meta.stop_reason.empty() ? std::string() : ": " + run.meta.stop_reason));
  return run;
}

namespace {

struct ReportArgs {
  std::vector<std::string> files;
  bool json = false;
  std::string html;
  bool force = false;
};

// `report`: every file read first, then one page (--html), one JSON array (--json), or the tables.
void run_report(const ReportArgs& args) {
  if (!args.html.empty()) {
    if (const std::string problem = check_output_path(args.html, args.force, args.files); !problem.empty())
      throw UsageError(problem);
  }
  std::vector<SummarizedRun> runs;
  // All readable first. The tables say of a run stopped in its first step why; the page needs steps.
  const EmptyRun empty = args.html.empty() ? EmptyRun::kAllowed : EmptyRun::kRefused;
  for (const std::string& path : args.files) runs.push_back(summarized(read_input(path, empty)));
  if (!args.html.empty()) {
    if (const ChartFailure failure = write_run_page(runs, args.html)) {
      if (failure.write_failed) throw WriteFailed(failure.why);  // it names the page, or the chart in its folder
      const std::string what = "cannot write the page " + args.html + ": " + failure.why;
      if (failure.refused_input) throw UsageError(what);
      throw std::runtime_error(what);
    }
    print_page_line(args.html, "");
  } else if (args.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const SummarizedRun& run : runs) all.push_back(report_json(run));
    // Strings come from the files as stored: bytes that are not UTF-8 become U+FFFD rather than an exception.
    std::printf("%s\n", all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    for (size_t i = 0; i < runs.size(); ++i) {
      if (i) std::printf("\n");
      print_report(stdout, runs[i]);
    }
    if (runs.size() > 1) {
      std::printf("\n");
      print_comparison(stdout, runs);
    }
  }
  std::fflush(stdout);
}

void add_report_command(CLI::App& app, FileCommand& parsed) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* report = app.add_subcommand("report", "tables and slow-rank blame from run files (docs/REPORTS.md)");
  report->add_option("files", args->files, "run files (HDF5)")->required()->type_name("FILE.h5");
  report->add_flag("--json", args->json,
                   "print a JSON array on standard output instead, one object per file: its summary and blame "
                   "findings (> FILE to keep it)");
  CLI::Option* html =
      report
          ->add_option("--html", args->html,
                       "write the runs as one self-contained HTML page instead (setup, table, charts, blame)")
          ->check(non_empty_path())
          ->type_name("OUT.html")
          ->excludes("--json");
  report->add_flag("--force", args->force, "overwrite an existing --html page")->needs(html);
  report->callback([args, &parsed] { parsed = [args] { run_report(*args); }; });
}

struct TimelineArgs {
  std::string file, out, steps;
  bool force = false;
};

// `timeline`: the run's steps (all, or --steps A:B) as a Chrome trace.
void run_timeline(const TimelineArgs& args) {
  StepSpan span;
  try {
    if (const auto [first, last] = parse_step_range(args.steps, "--steps"); first >= 0) span = {first, last};
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const RunRecord run = read_input(args.file);
  const StepSpan shown = steps_held(run, span), held = steps_held(run, {});
  if (shown.first > shown.last)
    throw UsageError(fmt("--steps %s: %s holds steps %lld..%lld", args.steps.c_str(), args.file.c_str(),
                         static_cast<long long>(held.first), static_cast<long long>(held.last)));
  const std::string out = args.out.empty() ? default_timeline_path(args.file) : args.out;
  const std::string problem = check_output_path(out, args.force, {args.file});
  if (!problem.empty()) throw UsageError(problem);
  write_timeline(run, out, args.force, span);
  std::printf("timeline: %s (%s, steps %lld..%lld; open in https://ui.perfetto.dev or chrome://tracing)\n", out.c_str(),
              counted(run.world_size(), "rank").c_str(), static_cast<long long>(shown.first),
              static_cast<long long>(shown.last));
  std::fflush(stdout);
}

void add_timeline_command(CLI::App& app, FileCommand& parsed) {
  auto args = std::make_shared<TimelineArgs>();
  CLI::App* timeline = app.add_subcommand("timeline", "export a run to Chrome-trace JSON (Perfetto, chrome://tracing)");
  timeline->add_option("file", args->file, "run file (HDF5)")->required()->type_name("FILE.h5");
  timeline->add_option("-o,--out", args->out, "trace file; default FILE with .trace.json")->check(non_empty_path());
  timeline->add_flag("--force", args->force, "overwrite an existing trace file");
  timeline
      ->add_option("--steps", args->steps,
                   "only training steps A to B, counted from 0 as the run file and reports count them (a long "
                   "run's whole trace can outgrow what a browser opens)")
      ->type_name("A:B");
  timeline->callback([args, &parsed] { parsed = [args] { run_timeline(*args); }; });
}

struct DiffArgs {
  std::vector<std::string> files;
  bool json = false;
};

// `diff`: both files read first, then the comparison as a table or JSON.
void run_diff(const DiffArgs& args) {
  const RunRecord a = read_input(args.files[0]), b = read_input(args.files[1]);
  const RunDiff d = diff_runs(a, b);
  if (args.json)
    std::printf("%s\n", to_json(d).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  else
    print_diff(stdout, d);
  std::fflush(stdout);
}

void add_diff_command(CLI::App& app, FileCommand& parsed) {
  auto args = std::make_shared<DiffArgs>();
  CLI::App* diff = app.add_subcommand("diff", "what changed between two runs, beyond the noise (docs/REPORTS.md)");
  diff->add_option("files", args->files, "run files A and B (HDF5)")->required()->expected(2)->type_name("FILE.h5");
  diff->add_flag("--json", args->json, "print the comparison as one JSON object on standard output instead");
  diff->callback([args, &parsed] { parsed = [args] { run_diff(*args); }; });
}

}  // namespace

void add_report_commands(CLI::App& app, FileCommand& parsed) {
  add_report_command(app, parsed);
  add_timeline_command(app, parsed);
  add_diff_command(app, parsed);
}

}  // namespace ddplab
