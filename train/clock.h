// The host clock every rank times its steps with, the origin the ranks share, and the lab's emulated costs (input,
// straggler, rank-0 work).
#pragma once
#include <mpi.h>

#include <chrono>
#include <thread>

#include "runtime/clock.h"  // now_ms

namespace ddplab {

// A sleep of ms milliseconds, if positive.
inline void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

// One instant on every rank's own clock: the run's time zero.
struct ClockOrigin {
  double origin_ms = 0;     // this rank's now_ms() at rank 0's time zero
  double uncertainty_ms = 0;  // the largest error of any rank's origin against rank 0's: half its fastest round trip
};

// Collective over comm. Rank 0 reads its clock once; every other rank finds that instant on its own clock from a few
// round trips to rank 0, keeping the fastest (Cristian's algorithm). A barrier's exit would not do: a rank
// descheduled as it leaves reads its clock late, and every time it records stays shifted by that delay.
ClockOrigin common_clock_origin(MPI_Comm comm, int round_trips = 8);

}  // namespace ddplab
