// Fuzz target: the checkpoint loader (record/checkpoint.h) against a small MLP, the one the seed checkpoints
// were saved from (tests/fuzz/corpus/checkpoint/README). It runs twice per input, with AdamW and with SGD +
// momentum, so files of either optimizer get past the optimizer check. The loader's contract is checked too: any
// problem is a UsageError and leaves the parameters and the optimizer's state as they were.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/mlp.h"
#include "model/optimizer.h"
#include "record/checkpoint.h"
#include "runtime/errors.h"
#include "tests/fuzz/h5_image.h"

namespace {

void load_into_fresh_model(hid_t file, const ddplab::OptimizerConfig& config) {
  // --input-dim 4 --hidden 4 --layers 1 --classes 2: 4 tensors, 30 floats.
  ddplab::Mlp<float> model(ddplab::MlpConfig{4, 4, 1, 2}, 7);
  ddplab::Optimizer<float> opt(config, model.flat_size());
  const std::vector<float> params_before(model.flat_params(), model.flat_params() + model.flat_size());
  const std::vector<float> m_before = opt.first_moment(), v_before = opt.second_moment();
  try {
    ddplab::load_checkpoint(file, "fuzz-input.h5", model.parameters(), model.flat_params(), opt);
  } catch (const ddplab::UsageError&) {
    const bool untouched =
        std::equal(params_before.begin(), params_before.end(), model.flat_params()) &&
        opt.first_moment() == m_before && opt.second_moment() == v_before && opt.steps_taken() == 0;
    if (!untouched) {
      std::fprintf(stderr, "fuzz: a refused checkpoint changed the model or the optimizer\n");
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const hid_t file = ddplab::fuzz::open_image(data, size);
  if (file < 0) return 0;
  ddplab::OptimizerConfig sgd;
  sgd.kind = ddplab::OptimizerKind::kSgd;
  sgd.momentum = 0.9f;
  load_into_fresh_model(file, ddplab::OptimizerConfig{});
  load_into_fresh_model(file, sgd);
  ddplab::fuzz::close_image(file);
  return 0;
}
