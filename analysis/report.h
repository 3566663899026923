// `ddplab report` and `ddplab timeline`: text tables and slow-rank blame from run files (docs/REPORTS.md).
// Library code: it throws; the subcommands registered by add_report_commands() are the program's edge.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "record/run_reader.h"

namespace CLI {
class App;
}

namespace ddplab {

// One rank's steady-state means per step, ms (loss in nats). Fields a file lacks are zero.
struct RankProfile {
  double step = 0, data = 0, forward = 0, backward = 0, exposed_comm = 0, optimizer = 0;
  double extra_comm = 0, host_work = 0, barrier = 0;  // the lab's pathologies (zero unless switched on)
  double comm = 0, hidden_comm = 0, loss = 0;
  double compute() const { return forward + backward; }
  // Step time outside every recorded phase: work the run file does not name.
  double unaccounted() const;
  // hidden / min(backward, comm), as in the run summary: 1 when there was nothing to hide.
  double hidden_fraction() const;
};

struct RunStats {
  int first_steady_step = 0, steady_steps = 0, global_batch = 0;
  std::vector<RankProfile> ranks;
  int slowest_rank = 0;
  double slowest_step_ms = 0;  // the slowest rank's mean step
  double samples_per_s = 0;    // global batch / slowest_step_ms
  double mean_spread_ms = 0;   // mean over steady steps of (max - min) step time across ranks
  double final_loss = 0;       // mean over ranks of the last step's loss
};

RunStats run_stats(const RunData& run);

enum class Cause {
  kStragglerInput,     // one rank's data loading sets the pace
  kSkewedCompute,      // one rank's forward+backward sets the pace
  kSlowOptimizer,      // one rank's optimizer step sets the pace
  kWorkBeforeBarrier,  // one rank works while the others wait at a barrier
  kUntimedWork,        // one rank spends time outside the recorded phases
  kCommBound,          // every rank waits for communication
  kInputBound,         // every rank waits for its input
  kBalanced,           // nothing stands out
  kSingleRank,         // nothing to compare
};
const char* cause_name(Cause cause);

struct Finding {
  Cause cause;
  int rank;  // the rank that sets the pace; -1 when the cause is shared by all ranks
  std::string text;
};

// Who sets the pace and why, from the steady-state timings (thresholds in report.cpp). Pure: data in, lines out.
std::vector<Finding> diagnose(const RunData& run);
std::vector<std::string> blame(const RunData& run);

// The summary, per-rank and per-bucket tables and the blame lines of one run.
void print_report(std::FILE* out, const RunData& run);
// One row per run: name, world, samples/s, step ms, exposed comm, hidden%, blame.
void print_comparison(std::FILE* out, const std::vector<RunData>& runs);

// Registers `report FILE...` and `timeline FILE [-o OUT] [--force]` on the ddplab program. Their callbacks run
// during app.parse(), on rank 0 only (no MPI communication; other ranks do nothing). Bad input (an unreadable
// run file, an output that exists without --force) throws UsageError (launcher/errors.h): one line, exit code 2.
void add_report_commands(CLI::App& app);

}  // namespace ddplab
