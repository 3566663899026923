// Fuzz target: the command line of the ddplab program, built as main() builds it (train, suite, sweep, devices,
// report, timeline, diff), then the validation that runs before any work, then the parsed file command. Input: the
// arguments, separated by NUL or newline (a corpus file is readable as one argument per line). A bad command line must
// end in a CLI11 parse error or a UsageError; anything else escaping would reach main()'s "internal error" path (exit
// 1, MPI_Abort).
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/report_commands.h"
#include "launcher/suite.h"
#include "launcher/sweep.h"
#include "runtime/errors.h"

namespace {

// `report`, `timeline` and `diff` read the run files they name (timeline then writes a trace). They are fuzzed as main
// runs them, kept harmless: an input that names one of them together with an existing path is skipped, so every file
// they are given is missing and they stop at "cannot read run file".
bool touches_files(const std::vector<std::string>& args) {
  bool subcommand = false, existing = false;
  for (const std::string& a : args) {
    struct stat st;
    subcommand |= a == "report" || a == "timeline" || a == "diff";
    existing |= stat(a.c_str(), &st) == 0;
  }
  return subcommand && existing;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args{"ddplab"};
  std::string arg;
  for (size_t i = 0; i <= size; ++i) {
    if (i == size || data[i] == '\0' || data[i] == '\n') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg += static_cast<char>(data[i]);
    }
  }
  if (touches_files(args)) return 0;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());

  CLI::App app{"ddplab"};
  app.require_subcommand(1);
  ddplab::TrainConfig config;
  CLI::App* train = app.add_subcommand("train");
  ddplab::add_train_flags(train, config);
  ddplab::SuiteOptions suite_options;
  CLI::App* suite = ddplab::add_suite_command(app, suite_options);
  ddplab::SweepOptions sweep_options;
  CLI::App* sweep = ddplab::add_sweep_command(app, sweep_options);
  app.add_subcommand("devices");
  ddplab::FileCommand file_command;
  ddplab::add_report_commands(app, file_command);

  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    if (train->parsed()) ddplab::validate(config);
    if (suite->parsed()) ddplab::validate(suite_options.base);
    if (sweep->parsed()) ddplab::validate(sweep_options.base);
    if (file_command) file_command();
  } catch (const CLI::Error&) {
  } catch (const ddplab::UsageError&) {
  }
  return 0;
}
