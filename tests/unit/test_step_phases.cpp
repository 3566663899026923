// A step's record from its clock readings (train/step_phases.h), for any device: the phases are what their
// definitions say, and all eight of them tile step_ms to within one tick of the host clock (1 ns), whatever the
// readings, the way tests/gpu/test_cuda_trainer.cpp checks them on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/step_phases.h"

namespace ddplab {
namespace {

constexpr double kClockTickMs = 1e-6;  // steady_clock counts nanoseconds

TEST(StepPhases, FollowTheirDefinitions) {
  // Host: the step starts at 1000 ms; device: ms after the origin.
  // Two micro-batches; the second's data takes 0.25 ms after the first's backward.
  StepClock c{1000.0, 1008.0, 1009.0, 1011.0, 1012.0, {0.5, 2.75}, {1.5, 3.5}, {2.5, 5.0}, 6.0};
  StepRecord r;
  set_step_phases(r, c, 400.0);
  EXPECT_EQ(r.start_ms, 600.0);
  EXPECT_EQ(r.step_ms, 12.0);
  EXPECT_EQ(r.data_ms, 0.75);     // 0.5 + (2.75 - 2.5)
  EXPECT_EQ(r.forward_ms, 1.75);  // (1.5 - 0.5) + (3.5 - 2.75)
  EXPECT_EQ(r.backward_ms, 2.5);  // (2.5 - 1.5) + (5.0 - 3.5)
  EXPECT_EQ(r.last_backward_ms, 1.5);  // the second micro-batch's, which the all-reduces run beside
  EXPECT_EQ(r.exposed_comm_ms, 1.0);
  EXPECT_EQ(r.optimizer_ms, 2.0);  // 8 ms since the start, minus the device's 6
  EXPECT_EQ(r.extra_comm_ms, 1.0);
  EXPECT_EQ(r.host_work_ms, 2.0);
  EXPECT_EQ(r.barrier_ms, 1.0);
  EXPECT_EQ(sum_of_phases(r), r.step_ms);
}

// Readings as the trainer takes them: host times are nanosecond counts since boot (up to a year of uptime here) in
// ms, device times are cudaEventElapsedTime's floats (the GPU's marks); 1 to 4 micro-batches; the lab's phases on or off.
TEST(StepPhases, TileTheStepWithinOneClockTick) {
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const auto host_ms = [](double ms) { return std::round(ms * 1e6) / 1e6; };
  const auto device_ms = [](double ms) { return static_cast<double>(static_cast<float>(ms)); };
  for (int trial = 0; trial < 10000; ++trial) {
    const double scale = std::pow(10.0, -1.0 + 4.0 * uniform(rng));  // steps of ~0.1 ms to ~1 s
    const auto gap = [&] { return scale * uniform(rng); };
    const bool lab = trial % 2 == 1;
    StepClock c;
    c.start = host_ms(3.2e10 * uniform(rng));
    double device = 0;
    for (int m = 0, micro = 1 + trial % 4; m < micro; ++m) {
      c.data_end.push_back(device_ms(device += gap()));
      c.forward_end.push_back(device_ms(device += gap()));
      c.backward_end.push_back(device_ms(device += gap()));
    }
    c.optimizer_start = device_ms(device += gap());
    c.optimized = host_ms(c.start + device + gap());
    c.extra = host_ms(c.optimized + (lab ? gap() : 2e-5));  // without the lab: two clock reads apart
    c.work = host_ms(c.extra + (lab ? gap() : 2e-5));
    c.end = host_ms(c.work + (lab ? gap() : 2e-5));
    StepRecord r;
    set_step_phases(r, c, c.start - 5000.0);
    ASSERT_NEAR(sum_of_phases(r), r.step_ms, kClockTickMs) << "trial " << trial;
    for (const StepField& f : kStepFields) {
      if (f.kind == FieldKind::kPhase) {
        ASSERT_GE(r.*f.member, 0.0) << f.name << ", trial " << trial;
      }
    }
    ASSERT_EQ(r.start_ms, 5000.0);
  }
}

}  // namespace
}  // namespace ddplab
