// Ctrl-C under mpirun: mpirun sends SIGTERM to every rank (then SIGKILL after odls_base_sigkill_timeout seconds,
// which scripts/mpirun.sh raises so ranks have time to finish). While a StopSignals lives, SIGINT and SIGTERM
// only set a flag; the training loop agrees on it across ranks at the next step boundary, writes the run file and
// exits non-zero (128 + the signal). A second signal has the default effect: the process dies at once.
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

}  // namespace ddplab
