// The flags of `ddplab train` (shared by `ddplab suite`, whose cases start from them) and their validation.
#pragma once
#include <CLI/CLI.hpp>

#include "train/train_config.h"

namespace ddplab {

// sweep_axes == false leaves out --bucket-mb and --overlap, which `ddplab sweep` takes as lists.
void add_train_flags(CLI::App* app, TrainConfig& config, bool sweep_axes = true);
// Throws UsageError (record/errors.h) naming the first bad flag.
void validate(const TrainConfig& config);

}  // namespace ddplab
