// One rank's timings of one training step; the unit of everything the run file stores per step.
#pragma once
#include <array>
#include <utility>

namespace ddplab {

struct StepRecord {
  double start_ms = 0;      // step start, ms since the run's common start (ranks leave a barrier together)
  double data_ms = 0;       // waiting for / producing the batch
  double forward_ms = 0;
  double backward_ms = 0;
  double allreduce_ms = 0;  // gradient all-reduce after backward
  double optimizer_ms = 0;
  double step_ms = 0;       // the whole step, data to optimizer
  double loss = 0;          // this rank's mean loss on its own shard
};

// Field table: the run file writes one dataset per entry, the summary reads them by name.
inline constexpr std::array<std::pair<const char*, double StepRecord::*>, 8> kStepFields = {{
    {"start_ms", &StepRecord::start_ms},
    {"data_ms", &StepRecord::data_ms},
    {"forward_ms", &StepRecord::forward_ms},
    {"backward_ms", &StepRecord::backward_ms},
    {"allreduce_ms", &StepRecord::allreduce_ms},
    {"optimizer_ms", &StepRecord::optimizer_ms},
    {"step_ms", &StepRecord::step_ms},
    {"loss", &StepRecord::loss},
}};

}  // namespace ddplab
