#include "comm/cpu_taken.h"

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

}  // namespace

long long steal_ticks(const std::string& proc_stat, const std::vector<int>& cpus) {
  long long total = -1;
  std::istringstream lines(proc_stat);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, 3, "cpu") != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    long long user, nice, system, idle, iowait, irq, softirq, steal;
    if (!(fields >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal)) continue;
    if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) continue;
    total = std::max(total, 0LL) + steal;
  }
  return total;
}

double run_delay_ms(const std::string& schedstat) {
  std::istringstream fields(schedstat);
  long long run_ns = 0, delay_ns = 0;
  return fields >> run_ns >> delay_ns ? static_cast<double>(delay_ns) / 1e6 : -1;
}

CpuTakenMeter::CpuTakenMeter() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &mask)) cpus_.push_back(cpu);
  stat_fd_ = open("/proc/stat", O_RDONLY | O_CLOEXEC);
  schedstat_fd_ = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);  // this thread's, for the fd's life
}

CpuTakenMeter::~CpuTakenMeter() {
  if (stat_fd_ >= 0) close(stat_fd_);
  if (schedstat_fd_ >= 0) close(schedstat_fd_);
}

CpuTaken CpuTakenMeter::read() const {
  CpuTaken now;
  if (stat_fd_ >= 0) {
    const long long ticks = steal_ticks(pread_all(stat_fd_), cpus_);
    if (ticks >= 0) now.steal_ms = 1000.0 * static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  if (schedstat_fd_ >= 0) now.cpu_wait_ms = run_delay_ms(pread_all(schedstat_fd_));
  return now;
}

CpuTaken taken_between(const CpuTaken& before, const CpuTaken& after) {
  CpuTaken span;
  if (before.steal_ms >= 0 && after.steal_ms >= 0) span.steal_ms = after.steal_ms - before.steal_ms;
  if (before.cpu_wait_ms >= 0 && after.cpu_wait_ms >= 0) span.cpu_wait_ms = after.cpu_wait_ms - before.cpu_wait_ms;
  return span;
}

}  // namespace ddplab
