// The GPU step's phases (launcher/cuda_trainer.cpp) from its clock readings: plain arithmetic, kept apart from CUDA
// so that it is tested without a GPU (tests/unit/test_cuda_step_phases.cpp).
//
// Two clocks: the host's (now_ms) and the compute stream's events, read as milliseconds after the step's origin
// event. The origin completes as it is recorded (the stream is idle when a step starts), so event times are placed
// on the host clock at the step's start, within a launch latency. Every boundary is one reading, so the eight phases
// of kStepPhases tile step_ms exactly (up to the rounding of double sums).
#pragma once
#include <vector>

#include "record/step_record.h"

namespace ddplab {

struct CudaStepClock {
  // Host, now_ms(): the step's start, the host's return from waiting for the update (the compute stream's end), the
  // end of --extra-allreduce-mb, of rank 0's --rank0-work-ms, and of the barrier after it: the step's end.
  double start = 0, optimized = 0, extra = 0, work = 0, end = 0;
  // Compute stream, ms after the origin: the batch is on the device; each micro-batch's forward and backward end;
  // the optimizer's launch (after the gradients' all-reduces and the host's verdict on them).
  double data_end = 0;
  std::vector<double> forward_end, backward_end;
  double optimizer_start = 0;
};

// start_ms (on the run's clock, whose zero is t0_ms), step_ms and the eight phases.
inline void set_cuda_step_phases(StepRecord& r, const CudaStepClock& c, double t0_ms) {
  r.start_ms = c.start - t0_ms;
  r.step_ms = c.end - c.start;
  r.data_ms = c.data_end;
  r.forward_ms = r.backward_ms = 0;
  double previous = c.data_end;
  for (size_t m = 0; m < c.forward_end.size(); ++m) {
    r.forward_ms += c.forward_end[m] - previous;  // zero_grad counts in the first forward
    r.backward_ms += c.backward_end[m] - c.forward_end[m];
    previous = c.backward_end[m];
  }
  r.exposed_comm_ms = c.optimizer_start - previous;  // waiting for the buckets, and for the host's verdict on them
  r.optimizer_ms = (c.optimized - c.start) - c.optimizer_start;  // AdamW, --check-sync, the final wait
  r.extra_comm_ms = c.extra - c.optimized;
  r.host_work_ms = c.work - c.extra;
  r.barrier_ms = c.end - c.work;
}

}  // namespace ddplab
