// Writes tests/unit/synthetic_gpu_run.h's single-GPU run (GPT-2 small's layout, the H200's measured step phases) to
// a run file, for `ddplab predict` end to end without a GPU (tests/cli/check_predict_gpu.py, docs/PREDICT.md).
// usage: write_synthetic_gpu_run OUT.h5
#include <cstdio>
#include <exception>

#include "analysis/summary.h"
#include "record/run_file.h"
#include "tests/unit/synthetic_gpu_run.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_synthetic_gpu_run OUT.h5\n");
    return 2;
  }
  try {
    const ddplab::RunRecord run = ddplab::fake_runs::synthetic_gpu_run();
    ddplab::write_run_file(argv[1], /*force=*/false, run, ddplab::to_json(ddplab::summarize(run)).dump());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_synthetic_gpu_run: %s\n", e.what());
    return 1;
  }
  return 0;
}
