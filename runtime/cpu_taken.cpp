#include "runtime/cpu_taken.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

namespace ddplab {
namespace {

// The whole of a /proc file through an fd kept open: pread from 0 regenerates it.
std::string pread_all(int fd) {
  std::string text;
  char buffer[4096];
  for (off_t offset = 0;;) {
    const ssize_t n = pread(fd, buffer, sizeof buffer, offset);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    offset += n;
  }
  return text;
}

// The CPUs this thread may run on now (a lab knob or Open MPI's binding may have changed them since the last reading).
std::vector<int> allowed_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  return cpus;
}

}  // namespace

double mean_steal_ticks(const std::string& proc_stat, const std::vector<int>& cpus) {
  long long total = 0, listed = 0;
  size_t line_start = 0;
  while (line_start < proc_stat.size()) {
    size_t line_end = proc_stat.find('\n', line_start);
    if (line_end == std::string::npos) line_end = proc_stat.size();
    const std::string line = proc_stat.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line.compare(0, 3, "cpu") != 0) break;                        // the per-CPU lines come first, together
    if (line.size() < 4 || line[3] < '0' || line[3] > '9') continue;  // the all-CPU line
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    long long user, nice, system, idle, iowait, irq, softirq, steal;
    if (!(fields >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal)) continue;
    if (!std::binary_search(cpus.begin(), cpus.end(), cpu)) continue;
    total += steal;
    ++listed;
  }
  return listed ? static_cast<double>(total) / static_cast<double>(listed) : -1;
}

double run_delay_ms(const std::string& schedstat) {
  std::istringstream fields(schedstat);
  long long run_ns = 0, delay_ns = 0;
  // "0 0 0" is what a kernel without sched_info prints: a thread reading it has run, so it is not a count.
  return fields >> run_ns >> delay_ns && run_ns > 0 ? static_cast<double>(delay_ns) / 1e6 : -1;
}

CpuTakenMeter::CpuTakenMeter()
    : stat_fd_(open("/proc/stat", O_RDONLY | O_CLOEXEC)),
      schedstat_fd_(open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)) {}  // this thread's, for the fd's life

CpuTakenMeter::~CpuTakenMeter() {
  if (stat_fd_ >= 0) close(stat_fd_);
  if (schedstat_fd_ >= 0) close(schedstat_fd_);
}

CpuTaken CpuTakenMeter::read() const {
  CpuTaken now;
  if (stat_fd_ >= 0) {
    const double ticks = mean_steal_ticks(pread_all(stat_fd_), allowed_cpus());
    if (ticks >= 0) now.steal_ms = 1000.0 * ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  if (schedstat_fd_ >= 0) now.cpu_wait_ms = run_delay_ms(pread_all(schedstat_fd_));
  return now;
}

CpuTaken taken_between(const CpuTaken& before, const CpuTaken& after) {
  CpuTaken span;  // clamped at 0: a mean over CPUs can step back when the thread's CPUs change between the readings
  if (before.steal_ms >= 0 && after.steal_ms >= 0) span.steal_ms = std::max(0.0, after.steal_ms - before.steal_ms);
  if (before.cpu_wait_ms >= 0 && after.cpu_wait_ms >= 0)
    span.cpu_wait_ms = std::max(0.0, after.cpu_wait_ms - before.cpu_wait_ms);
  return span;
}

}  // namespace ddplab
