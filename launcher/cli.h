// The flags of `ddplab train` (shared by `ddplab suite`, whose cases start from them) and their validation.
#pragma once
#include <CLI/CLI.hpp>

#include "config/train_config.h"

namespace ddplab {

// Which of the train flags a command offers. `suite` and `sweep` run many cases and name their files themselves, so
// they leave out the flags about one run's files and its injected fault (--out, --checkpoint, --checkpoint-every,
// --resume, --fault, --fault-rank, --fault-step); `sweep` also takes --bucket-mb and --overlap as lists of its own.
enum class FlagSet { kTrain, kSuite, kSweep };
void add_train_flags(CLI::App* app, TrainConfig& config, FlagSet flags = FlagSet::kTrain);
// Throws UsageError (runtime/errors.h) naming the first bad flag: each knob's own check (config/train_config.h), then
// the rules between knobs.
void validate(const TrainConfig& config);
// What a job of `ranks` ranks adds: the ranks a flag names exist, each rank gets a sequence, and --data's and
// --val-data's tokens fit the model, this rank reading share scan_part of scan_parts of the shards (the caller picks
// the shares and agrees the ranks' verdicts). Throws UsageError.
void validate_for_ranks(const TrainConfig& config, int ranks, int scan_part = 0, int scan_parts = 1);

}  // namespace ddplab
