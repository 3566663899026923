// A step's phases from its clock readings: plain arithmetic, apart from any device, so that it is tested on its own
// (tests/unit/test_step_phases.cpp).
//
// Two clocks: the host's (now_ms) and the device's marks (StepBackend::mark), read as ms after the step's origin. On
// the CPU both are the host clock; on the GPU the marks are events on the compute stream, whose origin completes as
// it is recorded (the stream is idle when a step starts), so they sit on the host clock within a launch latency.
// Every boundary is one reading, so the eight phases tile step_ms exactly (up to the rounding of double sums).
#pragma once
#include <vector>

#include "record/step_record.h"

namespace ddplab {

struct StepClock {
  // Host: the step's start, the return from waiting for the update (the device's end), the end of the extra
  // all-reduce (--extra-allreduce-mb), of rank 0's work (--rank0-work-ms), and of the barrier after it: the end.
  double start = 0, optimized = 0, extra = 0, work = 0, end = 0;
  // Device marks, ms after the origin: per micro-batch the end of its data, forward and backward; the optimizer's
  // start (after the gradients' all-reduces and every rank's verdict on them).
  std::vector<double> data_end, forward_end, backward_end;
  double optimizer_start = 0;
};

// start_ms (on the run's clock, whose zero is t0_ms), step_ms and the eight phases; data, forward and backward sum
// over the micro-batches; and the last micro-batch's backward.
inline void set_step_phases(StepRecord& r, const StepClock& c, double t0_ms) {
  r.start_ms = c.start - t0_ms;
  r.step_ms = c.end - c.start;
  r.data_ms = r.forward_ms = r.backward_ms = 0;
  double previous = 0;
  for (size_t m = 0; m < c.backward_end.size(); ++m) {
    r.data_ms += c.data_end[m] - previous;
    r.forward_ms += c.forward_end[m] - c.data_end[m];  // start_gradients counts in the first forward
    r.backward_ms += c.backward_end[m] - c.forward_end[m];
    previous = c.backward_end[m];
  }
  r.last_backward_ms = c.backward_end.empty() ? 0 : c.backward_end.back() - c.forward_end.back();
  r.exposed_comm_ms = c.optimizer_start - previous;  // waiting for the buckets, and for the verdict on them
  r.optimizer_ms = (c.optimized - c.start) - c.optimizer_start;  // the update, --check-sync, the device's end
  r.extra_comm_ms = c.extra - c.optimized;
  r.host_work_ms = c.work - c.extra;
  r.barrier_ms = c.end - c.work;
}

}  // namespace ddplab
