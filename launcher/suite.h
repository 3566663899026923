// `ddplab suite lab`: the classic DDP experiments in one mpirun — weak and strong scaling, a straggler, an extra
// all-reduce, rank-0 work before a barrier, a data-bound input pipeline — each case a `ddplab train` run (on a
// sub-communicator when it needs fewer ranks than were launched), one run file per case, and a combined table,
// CSV and JSON.
// `ddplab suite tokens`: the token-skew lab on the transformer — uniform 128-token sequences, variable lengths
// with a fixed sample count, length bucketing, a token budget — side by side, with the same outputs.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace ddplab {

struct SuiteOptions {
  std::string name = "lab";
  TrainConfig base;       // every train flag applies to every case; the pathology knobs to their own case only
  std::string out_dir;    // default runs/suite_<name>_<time>
  bool full = false;      // 100 steps instead of 20 (set in base.steps as --full is parsed, unless --steps is given)
  bool batch_given = false, max_tokens_given = false;
  std::vector<std::string> given_flags;  // the flags on the command line, as `--name`
};

// Registers `suite` with the train flags plus its own, and suite defaults for the pathology knobs.
CLI::App* add_suite_command(CLI::App& app, SuiteOptions& options);
// Collective over MPI_COMM_WORLD. Returns the exit code.
int run_suite(SuiteOptions options, const std::string& command_line);

}  // namespace ddplab
