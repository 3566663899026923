// Time a thread's CPU was not its own: what the host took from a rank while it had work. Two counters, because they
// name two different culprits:
// - steal: the hypervisor ran another guest on the CPUs this thread may use (/proc/stat's "steal", the mean over
//   those CPUs: exact for a thread bound to one, an estimate for one that moves; 0 on bare metal). Counted in USER_HZ
//   ticks (10 ms), so it is meaningful as a mean over many steps, not per step.
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
// is two preads of files opened once and the thread's affinity (10 us on 2 vCPUs; /proc/stat grows with the CPUs).
class CpuTakenMeter {
 public:
  CpuTakenMeter();  // on the thread to be measured: its schedstat (its CPUs are read at each reading)
  ~CpuTakenMeter();
  CpuTakenMeter(const CpuTakenMeter&) = delete;
  CpuTakenMeter& operator=(const CpuTakenMeter&) = delete;

  CpuTaken read() const;

 private:
  int stat_fd_ = -1, schedstat_fd_ = -1;
};

// The span between two readings, at least 0; a counter missing from either stays -1.
CpuTaken taken_between(const CpuTaken& before, const CpuTaken& after);

// Parsing, apart for the tests. The mean steal ticks over the "cpuN" lines of /proc/stat whose N is in `cpus`
// (ascending; the all-CPU "cpu" line never counts); -1 when none of them has a steal field.
double mean_steal_ticks(const std::string& proc_stat, const std::vector<int>& cpus);
// The run queue delay (second field of a schedstat line) in ms; -1 when the line has none, or says the thread never
// ran (a kernel without sched_info prints zeros).
double run_delay_ms(const std::string& schedstat);

}  // namespace ddplab
