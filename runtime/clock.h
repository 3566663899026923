// The process's one clock, CLOCK_MONOTONIC: the step phases, the Reducer's bucket times, the transports' polls and
// naps and the headers link emulation stamps all read it, so a time taken in one layer compares with another's.
#pragma once
#include <time.h>

#include <cstdint>

namespace ddplab {

inline int64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// Milliseconds on the same clock (exact to the ns for centuries of uptime: a double holds integers to 2^53).
inline double now_ms() { return static_cast<double>(monotonic_ns()) * 1e-6; }

}  // namespace ddplab
