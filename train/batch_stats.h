// What one rank's batch held: the per-step record's samples and tokens (record/step_record.h), from either workload.
#pragma once

namespace ddplab {

// What one rank's batch held (the token-skew lab's per-step record).
struct BatchStats {
  double samples = 0;        // sequences (packed or not)
  double useful_tokens = 0;  // real tokens (0 for the MLP)
  double padded_tokens = 0;  // rows x longest row: what the model computes on (a row: a sequence, or packed ones)
  double max_len = 0;        // the longest sequence
  double loss_terms = 0;     // what the loss is a mean over: samples (MLP, classify head), predicted tokens (lm)
};

}  // namespace ddplab
