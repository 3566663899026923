// `ddplab sweep`, below; what it shares with `ddplab suite` (the results folder, its charts and page): lab_runs.h.
#pragma once
#include <CLI/CLI.hpp>
#include <iterator>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace ddplab {

// `ddplab sweep`: the bucket size x overlap grid, every point a `ddplab train` run on all ranks. With --predict, a
// first run at the default bucket cap and overlap predicts every point (analysis/predict.h) before it is measured;
// with --repeats, each round has its own first run, and each point's error is the median of its rounds'.
struct SweepOptions {
  TrainConfig base;
  std::vector<double> bucket_mb{std::begin(kBucketCapsToTry), std::end(kBucketCapsToTry)};
  std::vector<std::string> overlap{"on", "off"};
  std::string out_dir;  // default runs/sweep_<time>
  bool predict = false;
  std::string calibration;  // with --predict: an allreduce_perf -J file whose all-reduce times the predictions use
  int repeats = 1;  // each point measured this many times, in interleaved rounds; the median one counts
};

// Registers `sweep` with the train flags plus its own.
CLI::App* add_sweep_command(CLI::App& app, SweepOptions& options);
// Collective over MPI_COMM_WORLD. Returns the exit code.
int run_sweep(SweepOptions options, const std::string& command_line);

}  // namespace ddplab
