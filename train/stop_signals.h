// Ctrl-C under mpirun: mpirun sends SIGTERM to every rank (then SIGKILL after odls_base_sigkill_timeout seconds,
// which scripts/mpirun.sh raises so ranks have time to finish). While a StopSignals lives, SIGINT and SIGTERM
// only set a flag; the training loop agrees on it across ranks at the next step boundary, writes the run file and
// exits non-zero (128 + the signal). A second signal has the default effect: the process dies at once.
// StopSignals nest: a suite or sweep holds one over all its runs, so that a signal between two runs is not lost
// (each run's own is then a no-op), and it stops before its next run.
#pragma once

namespace ddplab {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int received();  // the first signal received while installed, or 0
};

// "SIGINT", "SIGTERM", else "a signal".
const char* stop_signal_name(int signal);

}  // namespace ddplab
