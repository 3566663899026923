// A run as it happened: every rank's step records and bucket timings, and what the run was. The trainer's rank 0
// fills one and writes it (record/run_file.h); the reader returns the same from a file; the summary, the report,
// the blame and the timeline take it from either, so a run is analysed the same in memory and from disk.
#pragma once
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/link_model.h"
#include "ddp/buckets.h"
#include "record/step_record.h"

namespace ddplab {

// The most ranks on one GPU, a GPU being a PCI bus id at one place (a host, a node): 1 where each rank had its own, 0
// where no rank names one. A run file's `gpus` by host, an allreduce_perf -J file's by node.
template <typename Place>
int most_ranks_on_one_gpu(const std::vector<std::string>& gpus, const std::vector<Place>& place_of_rank) {
  int most = 0;
  for (size_t r = 0; r < gpus.size(); ++r) {
    int same = 0;
    for (size_t q = 0; q < gpus.size(); ++q)
      same += !gpus[r].empty() && gpus[q] == gpus[r] && place_of_rank[q] == place_of_rank[r];
    most = std::max(most, same);
  }
  return most;
}

struct RunMetadata {
  std::string command;  // "train", "suite lab", "sweep"
  std::string command_line;
  std::string start_time_utc;  // ISO 8601
  std::string git_commit;
  std::string ddplab_version;
  std::string mpi_library, hdf5_version, blas, cuda;
  // The OpenBLAS kernel family rank 0 ran and why (kernels/cpu/blas_kernels.h), and any rank that ran another; ""
  // in older files.
  std::string blas_kernels;
  // --device cuda: how rank 0's GEMMs picked cuBLASLt's algorithms, as the run ended ("timed: 38 GEMM problems timed
  // now, 0 read from <table>"); "" on the CPU and in older files.
  std::string gemm_algorithms;
  // --device cuda with cuDNN's attention: what building its graphs cost rank 0 over the run ("24 graphs (static
  // shapes) built in 1.42 s, workspace 0.0 MiB"); "" otherwise and in older files.
  std::string attention_graphs;
  std::string device = "cpu";  // where the steps ran: cpu | cuda
  std::string transport;       // what rank 0's gradient all-reduces travelled over ("shm", "mpi", "NCCL", ...)
  int world_size = 1;
  std::vector<std::string> hostnames;  // by rank
  std::vector<std::string> gpus;       // by rank: its GPU's PCI bus id; empty on the CPU and in older files
  std::vector<int> node_of_rank;       // by rank (comm/topology.h); empty in files from before nodes were recorded
  LinkClasses links;                   // the emulated links per class of hop (none: no emulation)
  int host_cores = 0;  // CPUs the ranks on rank 0's host could run on (their affinity masks' union); 0: not recorded
  // How long a waiting comm thread polls before it sleeps (DDPLAB_COMM_SPIN_US, runtime/settings.h; < 0: it spins),
  // microseconds; nullopt: not recorded (older files, which ran with the default, 50).
  std::optional<int> comm_spin_us;
  // What a comm thread's sched_yield cost when it lost its core to a compute thread, microseconds (start-up probe,
  // measure_lost_yield_ms in comm/transport.h; 0: none was lost); nullopt: not measured (GPU and one-rank runs, older
  // files).
  std::optional<int> comm_lost_yield_us;
  // How far any rank's time zero may be from rank 0's, microseconds: the largest over ranks of half its fastest round
  // trip to rank 0 (common_clock_origin, train/clock.h); two other ranks may be twice that apart. nullopt: one rank,
  // or a file from before it was measured.
  std::optional<int64_t> clock_alignment_us;
  int64_t first_step = 0;              // the step the records start at (a resumed run's checkpoint step)
  // Checkpoints and snapshots (--checkpoint, --flush-every) written during the run, and the wall time they took on
  // rank 0, microseconds: time between steps, in no step's record. 0 in older files.
  int file_writes = 0;
  int64_t file_writes_us = 0;
  std::string stop_reason;  // why the run ended before its last step ("" = it did not), or a snapshot's state
};

// One gradient bucket: the same on every rank.
struct BucketRecord {
  int first_piece = 0, last_piece = 0;  // its gradient pieces, in the order backward finalises them
  int64_t count = 0;                    // elements, fp32 in memory
  std::string pieces;                   // "fc2.bias,fc2.weight[0:256]"
  int64_t bytes() const { return count * static_cast<int64_t>(sizeof(float)); }
};

// One gradient piece, in the order backward finalises them: where it lies in the flat gradient buffer. The layout
// the buckets are cut from (assign_buckets), so a predictor can cut it again with other caps.
struct PieceRecord {
  int64_t offset = 0, numel = 0;  // elements
};

// Where a run of `steps` steps with `warmup_steps` of warm-up starts its steady state: at least one step counts.
inline int first_steady_step(int steps, int warmup_steps) {
  return std::clamp(warmup_steps, 0, std::max(steps - 1, 0));
}

struct RunRecord {
  std::string path;  // where it is stored ("" before it is written)
  RunMetadata meta;
  nlohmann::json config;            // every setting of the run (TrainConfig as JSON)
  int steps = 0;                    // steps recorded, on every rank
  std::vector<StepRecord> records;  // world_size * steps, rank-major: rank r's step s at r * steps + s
  std::vector<BucketRecord> buckets;
  std::vector<PieceRecord> pieces;        // empty when read from a file written before pieces were recorded
  std::vector<BucketTimes> bucket_times;  // world_size * steps * buckets: rank, then step, then bucket

  int world_size() const { return meta.world_size; }
  const StepRecord& at(int rank, int step) const { return records[static_cast<size_t>(rank) * steps + step]; }
  const BucketTimes& bucket_at(int rank, int step, int bucket) const {
    return bucket_times[(static_cast<size_t>(rank) * steps + step) * buckets.size() + bucket];
  }
  int node(int rank) const {  // 0 when not recorded: one node
    return rank >= 0 && rank < static_cast<int>(meta.node_of_rank.size()) ? meta.node_of_rank[rank] : 0;
  }
  int nodes() const {
    return meta.node_of_rank.empty() ? 1 : *std::max_element(meta.node_of_rank.begin(), meta.node_of_rank.end()) + 1;
  }
  std::string host(int rank) const {
    return rank >= 0 && rank < static_cast<int>(meta.hostnames.size()) ? meta.hostnames[rank] : "?";
  }
  // Where the steady state starts: the config's warmup_steps, clamped so that at least one step counts.
  int first_steady_step() const { return ddplab::first_steady_step(steps, config.value("warmup_steps", 0)); }
  // Whether a step past the warm-up completed, the warm-up as the run planned it (shrunk to fit a short run); if not,
  // the run stopped early and its figures come from the last warm-up step.
  bool reached_steady_state() const {
    const int planned = static_cast<int>(config.value("steps", static_cast<int64_t>(steps)) - meta.first_step);
    return steps > ddplab::first_steady_step(planned, config.value("warmup_steps", 0));
  }
  // Rank 0's host ran more CPU threads than it has cores (its ranks x BLAS threads > host_cores): the ranks took
  // turns on the cores, and every time measures that sharing, not data parallelism. The ranks on that host, or 0
  // when it was not oversubscribed (or a GPU run, or not recorded).
  int oversubscribed_ranks() const {
    if (meta.device != "cpu" || meta.host_cores <= 0 || meta.hostnames.empty()) return 0;
    const int ranks = static_cast<int>(std::count(meta.hostnames.begin(), meta.hostnames.end(), meta.hostnames[0]));
    return ranks * std::max(1, config.value("threads", 1)) > meta.host_cores ? ranks : 0;
  }
  // The most ranks of one host that ran on one GPU (the same bus id), or 0 when no GPU was shared (or a CPU run, or
  // not recorded). Ranks sharing a GPU take turns on it: their kernels, and the ring's copies between them.
  int ranks_sharing_a_gpu() const {
    if (meta.gpus.size() != meta.hostnames.size()) return 0;
    const int most = most_ranks_on_one_gpu(meta.gpus, meta.hostnames);
    return most > 1 ? most : 0;
  }
  // The loss on the global batch at step index t: each rank's mean weighted by the terms it is a mean over. Files
  // without loss_terms (read as 0): the mean over ranks, which is that where every rank holds as many terms.
  double global_loss(int t) const {
    double weighted = 0, terms = 0, mean = 0;
    for (int r = 0; r < world_size(); ++r) {
      weighted += at(r, t).loss * at(r, t).loss_terms;
      terms += at(r, t).loss_terms;
      mean += at(r, t).loss / world_size();
    }
    return terms > 0 ? weighted / terms : mean;
  }
  // Whether global_loss weighs every step's losses by their terms (files before loss_terms: none).
  bool weighs_losses() const {
    for (int t = 0; t < steps; ++t) {
      double terms = 0;
      for (int r = 0; r < world_size(); ++r) terms += at(r, t).loss_terms;
      if (terms <= 0) return false;
    }
    return steps > 0;
  }
  // Samples per step over all ranks: batch x grad_accum x world_size, in 64 bits. The product of three ints may pass an
  // int, though the CLI refuses such a run and read_run_file such a file.
  int64_t global_batch() const {
    return config.value("batch", int64_t{0}) * config.value("grad_accum", int64_t{1}) * world_size();
  }
};

// Whether a config JSON was written before --last-bucket-mb, when first_bucket_mb capped the bucket that closes
// backward (and the first bucket was cut as the others).
inline bool predates_last_bucket_cap(const nlohmann::json& config) {
  return config.is_object() && config.contains("first_bucket_mb") && !config.contains("last_bucket_mb");
}

// A config JSON (run files, checkpoints) in today's keys and values, whenever it was written: keys named after the
// flags (hidden_dim -> hidden, hidden_layers -> layers, num_classes -> classes, blas_threads -> threads); a file from
// before --last-bucket-mb read as it meant (its first_bucket_mb is last_bucket_mb, its first bucket auto); and a
// number's "auto" stored as the word, where it was stored as the knob's stand-in, -1 (the links' preset values).
inline void upgrade_config_keys(nlohmann::json& config) {
  static const std::pair<const char*, const char*> kRenamed[] = {
      {"hidden_dim", "hidden"}, {"hidden_layers", "layers"}, {"num_classes", "classes"}, {"blas_threads", "threads"}};
  static const char* const kAutoWasMinusOne[] = {"link_latency_us", "link_gbps"};
  if (!config.is_object()) return;
  if (predates_last_bucket_cap(config)) {
    config["last_bucket_mb"] = config["first_bucket_mb"];
    config["first_bucket_mb"] = "auto";
  }
  for (const char* key : kAutoWasMinusOne)
    if (config.contains(key) && config[key].is_number() && config[key].get<double>() == -1) config[key] = "auto";
  for (const auto& [old_key, key] : kRenamed) {
    const auto it = config.find(old_key);
    if (it == config.end()) continue;
    if (!config.contains(key)) config[key] = *it;
    config.erase(old_key);
  }
}

}  // namespace ddplab
