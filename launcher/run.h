// One training run, from a TrainConfig to a run file: the body of `ddplab train`, and of each case of
// `ddplab suite` (which runs it on sub-communicators of one launch).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/summary.h"
#include "config/train_config.h"
#include "record/version.h"

namespace ddplab {

struct RunOptions {
  std::string command = "train";  // stored in the run file; names the default output file
  std::string command_line;
  std::string label;         // printed above the run's header (suite case name)
  bool writes_page = false;  // rank 0 writes the page beside the run file (train's), a stopped run's too
};

// Collective over comm. Validates the config (UsageError), checks the output path (rank 0 decides, every rank
// learns), trains, gathers every rank's records on rank 0, which writes the run file and prints the summary
// unless config.quiet, and the page when options.writes_page. Returns, on rank 0, the run's record (record.path: the
// run file) and its summary, the ones the file holds; the other ranks' record has no steps. Throws std::runtime_error
// on failure, on every rank.
SummarizedRun run_training(const TrainConfig& config, MPI_Comm comm, const RunOptions& options);

// The checks run_training makes before any work, for a launch of every rank of `world` (UsageError, alike on every
// rank): the ranks' agreement on the config, its ranges, the ranks it names, the nodes --comm hier needs, the
// device and cuDNN's attention. For suite and sweep, before their results folder is made. Collective.
void validate_launch(const TrainConfig& config, MPI_Comm world);

// The first of those checks: every rank of comm was given the same config (every knob but the per-rank ones), else
// UsageError on every rank listing what differs. Suite and sweep make it before checks of their own, which ranks
// given different flags would otherwise pass on some ranks only, leaving the others waiting. Collective.
void require_same_config(const TrainConfig& config, MPI_Comm comm);

// --device cuda: every rank of comm has a usable GPU (and the build has CUDA); otherwise every rank throws the same
// UsageError naming the lowest failing rank's reason. Collective; nothing for --device cpu.
void require_device(const TrainConfig& config, MPI_Comm comm);

// Shared by the subcommands.
std::string local_time_stamp();  // 20261121-213000
std::string blas_description();
std::string mpi_library_version();
std::string hdf5_version();
std::string cuda_description();
// The GPU's table of timed GEMM algorithms (--gemm-algo timed): how many problems it holds, and where; "" without a
// usable GPU.
std::string gemm_algorithms_description();
// The cores this rank may use (--threads auto, and --optimizer-in-backward auto's spare core). A rank bound to some
// cores (mpirun --bind-to core) gets those; an unbound one its share of the host's cores (cores / ranks on this
// host), at least 1. Open MPI's own default binding, narrower than that share, is lifted first (run.cpp), whatever
// --threads says. Collective.
struct RankCores {
  int cores = 1;
  int lifted_from = 0;  // the cores of the default binding it lifted; 0: none lifted
};
RankCores cores_for_rank(MPI_Comm comm);
// Rank 0 decides something that can fail; every rank learns the outcome ("" = fine).
std::string broadcast_error(const std::string& error_on_root, MPI_Comm comm);

}  // namespace ddplab
