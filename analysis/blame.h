// Who sets the pace of a run, and why: slow-rank blame from the steady-state means of its summary (and, for the
// barrier's period, its step records). Pure: data in, findings out. Rules and thresholds: docs/REPORTS.md.
#pragma once
#include <string>
#include <vector>

#include "analysis/summary.h"
#include "runtime/choices.h"

namespace ddplab {

enum class Cause {
  kStragglerInput,     // one rank's data loading sets the pace
  kSkewedCompute,      // one rank's forward+backward sets the pace
  kSlowOptimizer,      // one rank's optimizer step sets the pace
  kWorkBeforeBarrier,  // one rank works while the others wait at a barrier
  kUntimedWork,        // one rank spends time outside the recorded phases
  kCpuTaken,           // one rank's work is slow because the host took its CPUs (steal, or other threads)
  kCommBound,          // every rank waits for communication
  kInputBound,         // every rank waits for its input
  kPaddingBound,       // every rank computes on padding: a share of its tokens carries no data
  kCpuContention,      // every rank's compute thread waits for a CPU of its host (more threads than cores)
  kNoisyHost,          // the hypervisor takes every rank's CPUs for a share of the step (steal)
  kBalanced,           // nothing stands out
  kSingleRank,         // nothing to compare
};
constexpr std::array<Named<Cause>, 13> choice_names(Cause) {
  return {{{Cause::kStragglerInput, "straggler input"},
           {Cause::kSkewedCompute, "skewed compute"},
           {Cause::kSlowOptimizer, "slow optimizer"},
           {Cause::kWorkBeforeBarrier, "work before a barrier"},
           {Cause::kUntimedWork, "untimed work"},
           {Cause::kCpuTaken, "CPU taken"},
           {Cause::kCommBound, "communication-bound"},
           {Cause::kInputBound, "input-bound"},
           {Cause::kPaddingBound, "padding-bound"},
           {Cause::kCpuContention, "CPU contention"},
           {Cause::kNoisyHost, "noisy host"},
           {Cause::kBalanced, "balanced"},
           {Cause::kSingleRank, "single rank"}}};
}

// Communication-bound: every rank waits for communication at least this share of the step (`ddplab predict` names
// its predicted steps by the same rule).
inline constexpr double kCommBoundShare = 0.20;
// Padding-bound: at least this share of the tokens computed on are padding (sequence runs).
inline constexpr double kPaddingBoundShare = 0.20;

struct Finding {
  Cause cause;
  int rank;  // the rank that sets the pace; -1 when the cause is shared by all ranks
  std::string text;
};

// `summary` is summarize(run).
std::vector<Finding> diagnose(const RunRecord& run, const RunSummary& summary);
std::vector<std::string> blame(const RunRecord& run, const RunSummary& summary);
// The finding that names a run in one word (report's comparison): the first, unless it only says nothing stands out
// (balanced, or a single rank) while a later one (padding) does. `findings` is diagnose()'s, never empty.
const Finding& headline(const std::vector<Finding>& findings);
// "the inter-node link (25gbe, shared by 2 ranks per NIC)" when the run spans nodes and its inter-node link is the
// slower class (its bandwidth, else its latency), so exposed comm waits on it; "" otherwise.
std::string slow_inter_node_link(const RunRecord& run);

}  // namespace ddplab
