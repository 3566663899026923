// The flags of `ddplab train` (shared by `ddplab suite`, whose cases start from them) and their validation.
#pragma once
#include <CLI/CLI.hpp>

#include "launcher/train_config.h"

namespace ddplab {

void add_train_flags(CLI::App* app, TrainConfig& config);
// Throws UsageError (launcher/errors.h) naming the first bad flag.
void validate(const TrainConfig& config);

}  // namespace ddplab
