// `ddplab predict`: the step time of a configuration that was not run (bucket caps, overlap, link, world size,
// all-reduce implementation, wire), from one run's records. docs/PREDICT.md describes the model, term by term.
//
// The parts, each testable alone:
//   allreduce_terms   what one all-reduce costs, as message steps and bytes per rank (ring, recursive doubling,
//                     16-bit wire); time = steps * alpha + bytes * beta
//   fit_comm          alpha and beta from measured (terms, time) pairs: the run's own buckets timed alone, or an
//                     allreduce_perf file
//   simulate_step     one step: each rank's backward releasing gradient pieces, buckets cut by assign_buckets, one
//                     comm thread reducing them in order, on a full host waiting beside backward for a core, backward
//                     slowed while comm runs beside it, the slowest rank setting the pace
//   build_model / predict   the measured run turned into those inputs, and one configuration's prediction
#pragma once
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "analysis/format.h"
#include "comm/communicator.h"
#include "record/run_record.h"
#include "config/train_config.h"

namespace ddplab {

// One all-reduce as the cost model sees it: time = message_steps * alpha + bytes * beta.
struct AllreduceTerms {
  double message_steps = 0;  // sequential message latencies
  double bytes = 0;          // bytes each rank sends, one after another
};
// `bytes`: the fp32 buffer. The ring: 2(n-1) steps moving 2(n-1)/n of the buffer; recursive doubling (ring
// implementation, buffers up to small_max_bytes): log2 p exchanges of the whole buffer, plus 2 to fold in and
// out ranks beyond the power of two p. --comm mpi is modelled as the ring (as its link emulation is). A 16-bit
// wire halves the bytes. chunk_bytes > 0: the ring on GPU buffers, which runs in rounds of ranks x chunk_bytes of the
// fp32 buffer (comm/ring_cuda.h), each a whole ring: 2(n-1) steps a round; with `doubling` (gpu_ring_doubles,
// comm/communicator.h), rounds of chunk_bytes, each recursive doubling's steps over the whole round. One rank:
// nothing. --comm hier on N nodes of
// K (K > 1): its cross-node phase as the NIC sees it, 2(N-1) steps, 2(N-1)/N of the buffer (K shards of 1/K); the
// phases within the node are in hier_ms. These are the terms a run's timed buckets are fitted on: for ring and mpi
// every hop's, for hier the inter link's.
AllreduceTerms allreduce_terms(double bytes, int ranks, AllreduceImpl impl, WireDtype wire, double small_max_bytes,
                               int nodes = 1, double chunk_bytes = 0, bool doubling = false);

struct AlphaBeta {
  double alpha_ms = 0;  // per message step
  double beta_ms_per_byte = 0;
  double ms(const AllreduceTerms& t) const { return t.message_steps * alpha_ms + t.bytes * beta_ms_per_byte; }
};

// Alpha and beta of each class of hop: between the ranks of a node, and across nodes through the sending node's NIC
// (one NIC per node: beta is per byte that NIC sends, whichever of the node's ranks sends it).
struct HopCosts {
  AlphaBeta intra, inter;
};

// The ring's hops that leave a node at once, with K ranks per node and the ring in rank order: only the node's
// last rank sends to the next node, so 1 (docs/PREDICT.md), and the node's NIC carries one rank's traffic.
inline constexpr int kRingStreamsPerNic = 1;

// One all-reduce of `bytes` (fp32) on `ranks` ranks in `nodes` equal nodes, per implementation (docs/PREDICT.md):
//   ring  each step waits for its slowest hop: across nodes the NIC (kRingStreamsPerNic), within a node the pair's
//         link; recursive doubling's exchanges at distance >= K cross nodes with all K ranks on the NIC at once
//   mpi   the ring's 2(n-1) steps on the slowest class of hop (as its link emulation models it)
//   hier  reduce-scatter within the node (intra), the shards' ring across the nodes (inter, the node's K shards
//         sharing its NIC), all-gather within the node (intra), pipelined by rounds: the longer of the node's
//         phases and the crossing, plus the shorter over the number of rounds
double ring_ms(double bytes, int ranks, int nodes, WireDtype wire, double small_max_bytes, const HopCosts& costs,
               double chunk_bytes = 0, bool doubling = false);
double mpi_ms(double bytes, int ranks, int nodes, const HopCosts& costs);
double hier_ms(double bytes, int ranks, int nodes, WireDtype wire, const HopCosts& costs);

// Least squares with every coefficient >= 0 (the best of the fits on each subset of the columns that comes out
// non-negative). Columns a row set cannot tell apart leave their subset singular; it is skipped.
std::vector<double> nonnegative_least_squares(const std::vector<std::vector<double>>& rows,
                                              const std::vector<double>& y);

// What an all-reduce costs alone (with every rank out of backward).
struct CommFit {
  AlphaBeta alone;
  bool latency_from_link = false;  // the sizes alone were timed at could not tell alpha from beta
};

// Whether costs fitted on these all-reduces can be split into a part per message step and a part per byte: their
// bytes per message step at least 2x apart. Otherwise the part per step is taken as known (the time alone: the
// link's latency; the comm thread's CPU: its polls) and only the part per byte is fitted.
bool per_step_cost_separable(const std::vector<AllreduceTerms>& terms);

// Least squares with coefficients >= 0 of time = alpha x steps + beta x bytes. Sizes per message step less than 2x
// apart cannot tell alpha from beta: then alpha is `link_latency_ms` and the rest beta, or nullopt without one.
std::optional<CommFit> fit_comm(const std::vector<AllreduceTerms>& terms, const std::vector<double>& time_ms,
                                std::optional<double> link_latency_ms = std::nullopt);

// The cores that compute and comm share on a host: `ranks` ranks of `threads` compute threads each on `cores`.
struct HostCores {
  int cores = 0, ranks = 1, threads = 1;  // cores 0: not known (no slowdown and no stall modelled)
  // What a comm thread's sched_yield cost when it lost the core to a compute thread (the run's start-up probe,
  // measure_lost_yield_ms; 0: none lost, a spare core); nullopt: not measured (older files).
  std::optional<double> lost_yield_ms;
  int ranks_per_gpu = 0;  // ranks taking turns on one GPU (RunRecord::ranks_sharing_a_gpu); 0: a GPU each, or CPUs
  bool full() const { return cores > 0 && ranks * threads >= cores; }
  // How long an all-reduce of so many message steps stalls beside backward: its comm thread, polling for a late
  // peer, yields its core between polls, and a yield lost to backward's thread returns after that thread's time
  // slice; once per message step. Not measured, on a full host: until backward ends (infinity). Ranks taking turns
  // on one GPU: until backward ends too.
  double stall_beside_backward_ms(double message_steps) const;
  // Backward beside an all-reduce whose comm thread spends cpu_ms on a core over wall_ms: (1 + this) x as long.
  double backward_slowdown(double cpu_ms, double wall_ms) const;
};

// One rank's step, as the model replays it (times in ms, steady-state means).
struct RankProfile {
  double before_ms =
      0;  // step start to the start of the backward that communicates: data, forward, earlier micro-batches
  double backward_ms = 0;              // that backward alone, without comm running beside it
  std::vector<double> piece_ready_ms;  // per gradient piece (ready order): when it became final in that backward
  double after_ms = 0;                 // optimizer and whatever follows the wait for the gradients
};

struct SimulatedStep {
  double step_ms = 0;      // the slowest rank's step
  int pace_rank = 0;       // that rank
  double backward_ms = 0;  // its backward, slowdown included
  double comm_ms = 0;      // sum of the buckets' all-reduce times
  double exposed_ms = 0;   // its wait for the last all-reduce after its backward
  double hidden_ms = 0;    // comm that ran while its backward ran
};
// A bucket's all-reduce: its time alone, its comm thread's CPU, its message steps.
struct BucketCost {
  double alone_ms = 0, cpu_ms = 0, message_steps = 0;
};
// The comm thread takes bucket j when every rank has released its last piece and bucket j-1 is done (overlap on),
// or after every rank's backward (overlap off). Compute and comm share the host's cores: an all-reduce started
// beside backward advances at alone / (alone + its stalls) of its pace while any rank's backward runs
// (HostCores::stall_beside_backward_ms), at its pace alone after. While it runs beside backward, backward advances
// at 1 / (1 + s) of its pace, s from its CPU over its time (HostCores::backward_slowdown). Replayed in time steps of
// 1/20000 of the step.
SimulatedStep simulate_step(const std::vector<RankProfile>& ranks, const std::vector<Bucket>& buckets,
                            const std::vector<BucketCost>& cost, bool overlap, const HostCores& host = {});
// The same over a sequence of steps (each with its own profiles, per rank), replayed in order with each rank
// starting its next step when it finishes this one; means over the steps, of the rank with the longest mean step.
// update_share: per bucket, its share of `after_ms`, run on each rank as soon as its backward and that bucket's
// all-reduce are done, in bucket order (PredictSetting::bucketed_update); empty: all of it after the last all-reduce.
// exposed_ms is then what the all-reduces add beyond backward and the update.
SimulatedStep simulate_steps(const std::vector<std::vector<RankProfile>>& steps, const std::vector<Bucket>& buckets,
                             const std::vector<BucketCost>& cost, bool overlap, const HostCores& host = {},
                             const std::vector<double>& update_share = {});

// Backward's slowdown beside an all-reduce (backward takes 1 + this times as long) with `ranks` ranks of `threads`
// compute threads each on `cores` cores, whose comm threads spend `comm_cpu_share` of an all-reduce's time on a
// core: fair shares leave compute cores - ranks x share of the cores, so its pace is min(1, (cores - ranks x
// share) / (ranks x threads)) beside comm against min(1, cores / (ranks x threads)) alone. At most 1/threads (the
// comm thread is one more thread beside a rank's `threads`). docs/PREDICT.md.
double backward_slowdown_beside_comm(int cores, int ranks, int threads, double comm_cpu_share);

// --link as parse_links reads it: "25gbe" (every hop) or "intra=none,inter=25gbe".
std::string link_spec(const LinkClasses& links);

// A configuration to predict.
struct PredictSetting {
  // The caps, MiB (--bucket-mb, --first-bucket-mb, --last-bucket-mb; an end's kAutoEndBucketMb: cut as the others).
  double bucket_mb = TrainConfig().bucket_mb, first_bucket_mb = TrainConfig().first_bucket_mb,
         last_bucket_mb = TrainConfig().last_bucket_mb;
  BucketRule bucket_rule = BucketRule::kWithin;  // --bucket-rule
  bool overlap = true;
  LinkClasses link;  // per class of hop (one link: every hop)
  int ranks = 1;
  int ranks_per_node = 0;  // K: nodes of K consecutive ranks (comm/topology.h); 0: one node, whatever the ranks
  AllreduceImpl impl = AllreduceImpl::kRing;
  WireDtype wire = WireDtype::kFp32;
  // The update bucket by bucket after backward, each as soon as its all-reduce is done, beside the closing buckets'
  // all-reduces (--device cuda --optimizer-in-backward on); false: the whole update after the last all-reduce.
  bool bucketed_update = false;
  // GPU runs: ranks taking turns on one GPU (their kernels run between each other's, so each one's compute takes that
  // many times as long, and their all-reduces wait for backward's end), at most the world; 1: a GPU each. nullopt:
  // the run's own on the run's link, a GPU each on another. predict() resolves it (Prediction::setting).
  std::optional<int> ranks_per_gpu;

  int nodes() const { return ranks_per_node > 0 && ranks % ranks_per_node == 0 ? ranks / ranks_per_node : 1; }
  BucketCaps caps() const { return BucketCaps::mib(bucket_mb, first_bucket_mb, last_bucket_mb, bucket_rule); }
  int ranks_on_a_node() const { return ranks / nodes(); }
};
std::string shape_text(const PredictSetting& s);  // "1 node", "2 nodes x 2"

// Measured all-reduce times from an allreduce_perf -J file (docs/COMM.md): per implementation name
// ("ring", "mpi", "ring-bf16", ...) the out-of-place time against size, at `ranks` ranks over `link`.
struct Calibration {
  std::string path, link;  // link: the preset's name as the file gives it
  LinkModel link_model;
  int ranks = 0;
  int nodes = 1;  // the nodes its ranks ran on (node_of_rank; files without it: one)
  // The implementations that ran beside the direct all-reduce on one host (-J's transports), whose small buffers
  // take recursive doubling only up to its lower limit (small_allreduce_bytes).
  std::vector<std::string> direct_impls;
  double gpu_chunk_bytes = kGpuRingChunkBytes;  // its gpu-ring-* rows' chunk (files without it: the trainer's)
  // The most ranks that shared one GPU (`gpus`, each rank's bus id, on one node); 0: not said (files before it, or
  // rows on the host).
  int ranks_per_gpu = 0;
  // Its calls moved along the buffers (hot_cache false), each finding its data out of the cache; files before the
  // field ran every call in place.
  bool cold_calls = false;
  struct Point {
    std::string impl;
    double bytes = 0, time_ms = 0;
    bool doubling = false;  // our GPU ring ran recursive doubling (the row's `algorithm`; not said: the ring)
  };
  std::vector<Point> points;
};
// Throws std::runtime_error with one line naming the file and the problem.
Calibration read_calibration(const std::string& path);

// What the model took from the run: the inputs of simulate_step and the cost of an all-reduce.
struct StepModel {
  PredictSetting measured;                      // the run's own setting
  bool on_gpu = false;                          // the run trained on the GPU (--device cuda)
  double measured_step_ms = 0;                  // its slowest rank's mean steady step
  double step_noise = 0;  // that mean's standard error, as a fraction of it: how well the run pinned its own step
  std::vector<PieceRecord> pieces;              // the layout buckets are cut from
  std::vector<std::vector<RankProfile>> steps;  // per steady step, per rank
  // Backward beside an all-reduce: the comm thread's CPU per all-reduce (on its terms; nullopt: not recorded) on
  // the cores of rank 0's host.
  std::optional<AlphaBeta> comm_cpu;
  HostCores host;
  double backward_slowdown = 0;  // the run's own all-reduces beside backward, pooled: backward (1 + this) x as long
  std::string slowdown_source;   // how it was found, one phrase
  std::optional<CommFit> comm_fit;              // from the run's bucket timings (nullopt: one rank)
  LinkModel fitted_link;    // the class of hop comm_fit describes: the one that bounds the run's all-reduce
  std::string fitted_hops;  // which: "every hop", "the inter-node hops", "the intra-node hops"
  // The run's bucket sizes, bytes: each one's all-reduce was timed, alone or beside backward, and the replay of the
  // run's own setting checks the model there, although the fit may take only those timed alone.
  double measured_min_bucket = 0, measured_max_bucket = 0;
  std::optional<Calibration> calibration;
  std::string calibration_gpu_impl;  // a GPU run's: the calibration's GPU all-reduce that stands for its own
  double ring_chunk_bytes = 0;       // a GPU run over our ring: its rounds' chunk (allreduce_terms); 0: NCCL, the CPU
  bool measured_doubling = false;    // that ring ran recursive doubling where the rule says (its transport names it)
  // The CPU run's ranks, on one host, took the direct all-reduce above the small-buffer size (its transport names
  // "direct collectives"), whose size is then smaller at 2 ranks (small_allreduce_bytes): so do the settings where
  // ranks could take it (one host, the ring on the fp32 wire, no emulated link), and all such from a 1-rank run.
  bool measured_direct = false;
  int run_turns() const { return std::max(1, host.ranks_per_gpu); }  // the run's ranks taking turns on a GPU, >= 1
  double samples_per_rank = 0, tokens_per_rank = 0;  // per step (tokens: 0 for the MLP)
  std::vector<std::string> notes;                    // what the output must say about the model's sources
};
// Throws std::invalid_argument when the run has no bucket timings to model from, or a config value that names no
// link, implementation or wire.
StepModel build_model(const RunRecord& run, std::optional<Calibration> calibration);

struct Prediction {
  PredictSetting setting;  // ranks_per_gpu resolved
  int buckets = 0;
  SimulatedStep step;
  double samples_per_s = 0, tokens_per_s = 0;
  std::vector<std::string> extrapolated;  // why a number goes beyond what was measured (empty: within it)
  std::string comm_source;                // "run", "calibration" or "link model"; "+ link" on another link
};
Prediction predict(const StepModel& model, const PredictSetting& setting);
// Weak scaling (each rank keeps its batch): the predicted step of one rank at p's setting over p's step; 1 is
// perfect.
double weak_scaling_efficiency(const StepModel& model, const Prediction& p);

// The setting to recommend among the predictions for one link and world size. Predictions closer than
// `tolerance` (a fraction of the fastest) cannot be ranked: `ranking_tolerance` is two standard errors of the
// measured step every prediction replays. Among the rows within it of the fastest: the run's own setting if it is
// one (its prediction replays a measurement), else the fewest buckets (each all-reduce beside backward stalls and
// takes cycles from backward, which the model sees only in part: many small buckets measured slower than predicted,
// never faster), then the fastest prediction.
struct Recommendation {
  size_t row = 0;        // into the rows given
  int within_noise = 0;  // the other rows within the tolerance of the fastest prediction
  bool own = false;      // the row is the run's own setting
};
Recommendation recommend(const std::vector<Prediction>& rows, const PredictSetting& own, double tolerance);
inline double ranking_tolerance(const StepModel& m) { return 2 * m.step_noise; }

// The reasons rows go beyond what was measured, each once with its row count: "link 10gbe (measured none) (3 rows)".
std::vector<std::string> extrapolation_footnotes(const std::vector<Prediction>& rows);

}  // namespace ddplab
