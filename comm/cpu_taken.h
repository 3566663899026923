// Time a thread's CPU was not its own: what the host took from a rank while it had work. Two counters, because they
// name two different culprits:
// - steal: the hypervisor ran another guest on the CPUs this thread may use (/proc/stat's "steal" of each of them;
//   0 on bare metal). Counted in USER_HZ ticks (10 ms), so it is meaningful as a mean over many steps, not per step.
// - cpu wait: the thread was runnable but waited for a CPU of its own host, behind other threads or processes
//   (the run queue delay of /proc/thread-self/schedstat, in ns). A rank's communication thread on the same core
//   counts here too, alike on every rank; a rank that waits more than the others has company the others lack.
// allreduce_perf --diag and every training step read them (docs/REPORTS.md, "CPU taken").
#pragma once
#include <string>
#include <vector>

namespace ddplab {

struct CpuTaken {
  double steal_ms = -1;     // -1: not counted by this kernel
  double cpu_wait_ms = -1;  // -1: not counted by this kernel
};

// Cumulative readings for the thread that made the meter; the difference of two readings is the span's. Each reading
// is two preads of files opened once (about 10 us in all).
class CpuTakenMeter {
 public:
  CpuTakenMeter();  // on the thread to be measured: its CPUs (its affinity now) and its schedstat
  ~CpuTakenMeter();
  CpuTakenMeter(const CpuTakenMeter&) = delete;
  CpuTakenMeter& operator=(const CpuTakenMeter&) = delete;

  CpuTaken read() const;
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  std::vector<int> cpus_;
  int stat_fd_ = -1, schedstat_fd_ = -1;
};

// The span between two readings; a counter missing from either stays -1.
CpuTaken taken_between(const CpuTaken& before, const CpuTaken& after);

// Parsing, apart for the tests. Steal ticks summed over the "cpuN" lines of /proc/stat whose N is in `cpus` (the
// all-CPU "cpu" line never counts); -1 when none of them has a steal field.
long long steal_ticks(const std::string& proc_stat, const std::vector<int>& cpus);
// The run queue delay (second field of a schedstat line) in ms; -1 when the line has no such field.
double run_delay_ms(const std::string& schedstat);

}  // namespace ddplab
