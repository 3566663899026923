// Reading a run file (docs/RUN_FILE.md, schema version 2) back into plain data, for `ddplab report`, `ddplab
// timeline` and tests. Everything is validated on the way in, so the code that reads a RunData can index freely.
#pragma once
#include <H5Ipublic.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddplab {

// The gradient buckets: layout per bucket, timings per rank, step and bucket ([world, steps, buckets], flat).
struct BucketData {
  std::vector<int64_t> first_piece, last_piece, count, bytes;
  std::vector<std::string> param_names;
  std::vector<double> ready_ms, comm_start_ms, comm_end_ms;  // same origin as steps/start_ms
  int size() const { return static_cast<int>(bytes.size()); }
};

struct RunData {
  std::string path;
  int64_t schema_version = 0;
  int world_size = 0;
  int num_steps = 0;
  std::map<std::string, std::string> attrs;  // every string attribute as stored (command, git_commit, ...)
  nlohmann::json config;                     // the parsed `config` attribute
  nlohmann::json summary;                    // the parsed `summary` attribute
  std::vector<std::string> hostnames;        // by rank
  // Every steps/<name> dataset, [world_size * num_steps] rank-major. Fields newer than the schema (e.g. the
  // lab's barrier_ms) are read when present; step() treats an absent field as zero.
  std::map<std::string, std::vector<double>> steps;
  BucketData buckets;

  bool has(const std::string& field) const { return steps.count(field) != 0; }
  double step(const std::string& field, int rank, int s) const;
  double bucket_time(const std::vector<double>& field, int rank, int s, int b) const {
    return field[(static_cast<size_t>(rank) * num_steps + s) * buckets.size() + b];
  }
  // Where the steady state starts: summary.first_steady_step, clamped so that at least one step counts.
  int first_steady_step() const;
  // summary.global_batch, else batch x grad_accum x world from the config.
  int global_batch() const;
  std::string host(int rank) const;
};

// The datasets every schema-2 file has under steps/.
extern const std::vector<std::string> kRequiredStepFields;

// Throws std::runtime_error with one line, "cannot read run file PATH: <problem>", when the file is missing,
// not HDF5, not a ddplab run file of schema version 2, or has a dataset of the wrong shape.
RunData read_run_file(const std::string& path);
// The same for a file already open (the fuzzer opens an in-memory image); `path` only names it in messages.
RunData read_run_file(hid_t file, const std::string& path);

}  // namespace ddplab
