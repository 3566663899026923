// The host clock every rank times its steps with, and the lab's emulated costs (input, straggler, rank-0 work).
#pragma once
#include <chrono>
#include <thread>

namespace ddplab {

// Milliseconds on the monotonic clock.
inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A sleep of ms milliseconds, if positive.
inline void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace ddplab
