// The check that a learning-rate schedule reaches the update, shared by the CPU's and the GPU's trainer tests.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include "train/trainer.h"

namespace ddplab {

// `config` on a 10-step run, a warm-up of 3 steps then a cosine. Step k of it, from the same start, must update as a
// run at the constant learning rate of step k, bit for bit, and its record must carry that rate: at two steps of the
// warm-up, mid-decay and the last step (none of them at --lr itself, so a schedule that never reached the update
// would fail).
inline void expect_the_schedule_reaches_the_update(TrainConfig scheduled) {
  scheduled.optimizer.lr = 1e-2f;
  scheduled.optimizer.lr_warmup = 3;
  scheduled.optimizer.lr_schedule = LrSchedule::kCosine;
  scheduled.optimizer.lr_final = 0.1f;
  scheduled.steps = 10;
  for (int step : {0, 1, 5, 9}) {
    const float lr = learning_rate(scheduled.optimizer, step, scheduled.steps);
    TrainConfig constant = scheduled;
    constant.optimizer.lr = lr;
    constant.optimizer.lr_warmup = 0;
    constant.optimizer.lr_schedule = LrSchedule::kConstant;
    constant.optimizer.lr_final = 0;
    Trainer a(scheduled, MPI_COMM_WORLD), b(constant, MPI_COMM_WORLD);
    const std::vector<float> init = a.parameters();
    EXPECT_EQ(a.step(step, 0).lr, lr) << "step " << step;
    b.step(step, 0);
    const std::vector<float> after = a.parameters();
    EXPECT_EQ(after, b.parameters()) << "step " << step << " at lr " << lr;
    EXPECT_NE(after, init) << "step " << step << " must move the parameters";
  }
}

}  // namespace ddplab
