// Where each rank's step goes, in the terms trace analysers use: comm-compute overlap as Holistic Trace Analysis
// defines it, the idle time split by what the rank waited for, and each bucket's arrival spread across ranks
// (Horovod's timeline straggler signal). Pure functions of a RunRecord's steady steps; definitions: docs/REPORTS.md.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "record/run_record.h"

namespace ddplab {

// One rank, per steady step (means).
struct RankTimeUse {
  double comm_ms = 0;        // the communication thread communicating: the union of its bucket intervals
  double overlapped_ms = 0;  // ... of which the compute thread computed (forward, backward or optimizer)
  double computing_ms = 0;   // forward + backward + optimizer
  double idle_data_ms = 0;   // waiting for data: the data phase
  double idle_peers_ms = 0;  // waiting for peers: exposed comm + extra all-reduce + barrier wait
  double idle_host_ms = 0;   // host work: the lab's host work + step time outside every recorded phase
  // HTA's comm-compute overlap: (time computing while communicating) / (time communicating); 0 with no comm.
  double overlap() const { return comm_ms > 0 ? overlapped_ms / comm_ms : 0; }
  double idle_ms() const { return idle_data_ms + idle_peers_ms + idle_host_ms; }
};

// One bucket over the steady steps: which rank was last to have it ready, and by how much.
struct BucketArrival {
  int last_rank = -1;    // the rank that was last in the most steady steps (the lowest on a tie); -1: one rank
  int last_steps = 0;    // in how many steady steps it was last
  double spread_ms = 0;  // median over steady steps of (last ready - first ready) across ranks
  double lead_ms = 0;    // median over the steps last_rank was last of (its ready - the next-latest rank's)
};

// Per rank, from the steps first_steady.. of the run.
std::vector<RankTimeUse> time_use(const RunRecord& run, int first_steady);
// Per bucket, likewise.
std::vector<BucketArrival> bucket_arrivals(const RunRecord& run, int first_steady);

nlohmann::json to_json(const RankTimeUse& u);
nlohmann::json to_json(const BucketArrival& a);

}  // namespace ddplab
