// The run file: one HDF5 file per run with every rank's per-step timings and the run's metadata.
// Schema: docs/RUN_FILE.md. Written by rank 0 into a temporary next to the target and moved into place
// only when complete, so a failed write never leaves a half-written result under the real name.
#pragma once
#include <string>
#include <vector>

#include "comm/reducer.h"
#include "record/step_record.h"

namespace ddplab {

inline constexpr int kRunFileSchemaVersion = 3;

struct RunMetadata {
  std::string command;      // "train"
  std::string config_json;  // the full TrainConfig
  std::string command_line;
  std::string start_time_utc;  // ISO 8601
  std::string git_commit;
  std::string ddplab_version;
  std::string mpi_library, hdf5_version, blas, cuda;
  std::string device = "cpu";  // where the steps ran: cpu | cuda
  int world_size = 1;
  std::vector<std::string> hostnames;  // by rank
  int64_t first_step = 0;   // the step the records start at (a resumed run's checkpoint step)
  std::string stop_reason;  // why the run ended before its last step ("" = it did not), or a snapshot's state
};

// The gradient buckets: their layout (the same on every rank) and what happened to each in each step.
struct RunBuckets {
  std::vector<Bucket> layout;
  std::vector<std::string> names;   // per bucket, its gradient pieces: "fc2.bias,fc2.weight[0:256]"
  std::vector<BucketTimes> times;   // world_size * steps * layout.size(): rank, then step, then bucket
};

// Empty when `path` can be written (its folder exists and is writable; it does not exist unless `force`),
// otherwise a one-line reason. Leaves nothing behind.
std::string check_output_path(const std::string& path, bool force);

// records: world_size * steps, rank-major (rank r's step s at r*steps + s). Throws std::runtime_error.
void write_run_file(const std::string& path, bool force, const RunMetadata& meta, const std::vector<StepRecord>& records,
                    int steps, const std::string& summary_json, const RunBuckets& buckets);

}  // namespace ddplab
