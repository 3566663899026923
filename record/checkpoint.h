// Checkpoints: a model's parameters and its optimizer's state in one HDF5 file, so that a run can be resumed and
// continue with the same loss curve as an uninterrupted one. Layout, validation and resume: docs/CHECKPOINT.md.
#pragma once
#include <H5Ipublic.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/optimizer.h"
#include "model/parameters.h"

namespace ddplab {

inline constexpr int kCheckpointFormatVersion = 1;

// What a checkpoint records besides the tensors.
struct CheckpointInfo {
  int64_t step = 0;         // the next step to run: a run resumed from here starts at this step
  std::string config_json;  // the run's settings, for the record and for comparison on resume
  // Filled by load_checkpoint from the file (save_checkpoint writes this build's).
  std::string git_commit, ddplab_version;
};

// Writes the parameters (flat_params laid out as `params` say) and the optimizer's state to `path`: into a
// temporary next to it, synced to disk, then moved into place, so `path` is either the old file or the complete
// new one. Refuses an existing `path` unless `force`. Throws std::runtime_error (nothing left behind), or
// std::invalid_argument for a parameter name that cannot be a dataset name (empty, ".", or containing '/').
void save_checkpoint(const std::string& path, bool force, const std::vector<Parameter<float>>& params,
                     const float* flat_params, const Optimizer<float>& opt, const CheckpointInfo& info);

// The bytes of tensor data in a checkpoint of `params` elements (the parameters and the optimizer's state): the least
// its file takes, for the check that the disk has room before a run.
uint64_t checkpoint_data_bytes(int64_t params, const OptimizerConfig& optimizer);

// Reads `path` into flat_params and opt (replacing its state and step count) after checking everything against
// `params` and opt's configuration: the same parameter names, shapes and float32 dtype, the same optimizer kind
// and state, intact data (checksums). Any problem — a missing, truncated or corrupt file, a mismatch — throws
// UsageError with one line, "cannot load checkpoint PATH: <problem>", and leaves flat_params and opt untouched.
CheckpointInfo load_checkpoint(const std::string& path, const std::vector<Parameter<float>>& params, float* flat_params,
                               Optimizer<float>& opt);
// The same for a file already open (the fuzzer opens an in-memory image); `path` only names it in messages.
CheckpointInfo load_checkpoint(hid_t file, const std::string& path, const std::vector<Parameter<float>>& params,
                               float* flat_params, Optimizer<float>& opt);
// The settings a checkpoint was saved with (its `config` attribute, as stored: "" is no JSON object), read alone: a
// resume compares them before the tensors, whose shapes would otherwise be the first thing another model's
// checkpoint fails on. None when the file cannot say (missing, not a checkpoint): load_checkpoint then names the
// problem.
std::optional<std::string> checkpoint_config_json(const std::string& path);

}  // namespace ddplab
