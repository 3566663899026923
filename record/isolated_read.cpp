#include "record/isolated_read.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "runtime/errors.h"

namespace ddplab {
namespace {

// The child's last byte on the pipe says how `call` ended, after the exception's message; a pipe that closes
// without one: the child was killed.
enum Outcome : char { kReturned = 'r', kThrew = 't', kThrewUsageError = 'u', kOutOfMemory = 'm' };

// The address space this process has mapped now (/proc/self/statm's first field, in pages).
double mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0;
  statm >> pages;
  return pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Lowers a resource's limits to `soft` and `hard`, never above the hard limit the process was given.
void cap(int resource, rlim_t soft, rlim_t hard) {
  rlimit now{};
  if (getrlimit(resource, &now) != 0) return;
  const rlimit capped{std::min(soft, now.rlim_max), std::min(hard, now.rlim_max)};
  setrlimit(resource, &capped);
}

void write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void be_the_child(int out, const std::function<void()>& call, double cpu_s, double memory_bytes) {
  if (const int null = open("/dev/null", O_WRONLY); null >= 0) {
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
  }
  // Die of the signal itself, not through a handler inherited from the parent (Open MPI's prints a backtrace).
  for (const int s : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGXCPU}) signal(s, SIG_DFL);
  const auto cpu = static_cast<rlim_t>(std::ceil(cpu_s));
  cap(RLIMIT_CPU, cpu, cpu + 1);  // SIGXCPU at the soft limit, SIGKILL a second later
  cap(RLIMIT_CORE, 0, 0);
  const auto space = static_cast<rlim_t>(mapped_bytes() + memory_bytes);
  cap(RLIMIT_AS, space, space);
  std::string message;
  char outcome = kReturned;
  try {
    call();
  } catch (const std::bad_alloc&) {
    outcome = kOutOfMemory;
  } catch (const UsageError& e) {
    outcome = kThrewUsageError;
    message = e.what();
  } catch (const std::exception& e) {
    outcome = kThrew;
    message = e.what();
  } catch (...) {
    outcome = kThrew;
    message = "an exception of unknown type";
  }
  write_all(out, message + outcome);
  _exit(0);
}

}  // namespace

ChildEnd run_in_child(const std::function<void()>& call, const ChildCaps& caps) {
  int pipe_ends[2];
  if (pipe2(pipe_ends, O_CLOEXEC) != 0) return {};
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_ends[0]);
    close(pipe_ends[1]);
    return {};
  }
  if (pid == 0) {
    close(pipe_ends[0]);
    be_the_child(pipe_ends[1], call, caps.cpu_s, caps.memory_bytes);
  }
  close(pipe_ends[1]);

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(caps.wall_s);
  std::string received;
  bool out_of_time = false;
  for (;;) {
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
    pollfd ready{pipe_ends[0], POLLIN, 0};
    const int polled = left_ms > 0 ? poll(&ready, 1, static_cast<int>(std::min(left_ms + 1, 1e9))) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled == 0) {
      out_of_time = true;
      break;
    }
    char bytes[4096];
    const ssize_t n = read(pipe_ends[0], bytes, sizeof bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    received.append(bytes, static_cast<size_t>(n));
  }
  close(pipe_ends[0]);
  if (out_of_time) kill(pid, SIGKILL);
  // Reaped within a few seconds, or left: a child killed in an uninterruptible wait (a file system that does not
  // answer) ends only when that wait does, and this process need not wait for it.
  int status = 0;
  pid_t reaped = -1;
  rusage used{};
  for (int tries = 0; tries < 5000 && reaped != pid; ++tries) {
    reaped = wait4(pid, &status, WNOHANG, &used);
    if (reaped < 0 && errno != EINTR) break;
    if (reaped != pid) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  using How = ChildEnd::How;
  if (out_of_time) return {How::kBlocked, ""};
  if (!received.empty()) {
    const char outcome = received.back();
    received.pop_back();
    if (outcome == kReturned) return {How::kReturned, ""};
    if (outcome == kThrew || outcome == kThrewUsageError) return {How::kThrew, received, outcome == kThrewUsageError};
    if (outcome == kOutOfMemory) return {How::kOutOfMemory, ""};
  }
  // Killed before it could say. Its status is lost where another part of the process reaped it first (a SIGCHLD
  // handler waiting for any child).
  if (reaped == pid && WIFSIGNALED(status)) {
    const int signal_number = WTERMSIG(status);
    // SIGXCPU at the soft cap; SIGKILL at the hard one a second later, or from elsewhere (the OOM killer, a user)
    // where the child's CPU time falls short of the cap.
    const double cpu_used = static_cast<double>(used.ru_utime.tv_sec + used.ru_stime.tv_sec) +
                            1e-6 * static_cast<double>(used.ru_utime.tv_usec + used.ru_stime.tv_usec);
    if (signal_number == SIGXCPU || (signal_number == SIGKILL && cpu_used >= std::ceil(caps.cpu_s) - 0.5))
      return {How::kPastCpuCap, ""};
    const char* name = sigabbrev_np(signal_number);
    return {How::kKilled, name ? std::string("SIG") + name : "signal " + std::to_string(signal_number)};
  }
  return {How::kKilled, "a cause not known"};
}

namespace {

// The files whose read crashed, looped or ran out of memory in this process's children, by identity (device, inode,
// size, change time) and refusal, with the refusal's line: whatever reads them next meets the same damage.
std::mutex g_refused_mutex;
std::map<std::string, std::string> g_refused;

}  // namespace

void read_first_in_child(const std::string& path, const std::string& refusal, const std::function<void()>& read) {
  struct stat about {};
  const bool exists = stat(path.c_str(), &about) == 0;
  const std::string identity = std::to_string(about.st_dev) + ":" + std::to_string(about.st_ino) + ":" +
                               std::to_string(about.st_size) + ":" + std::to_string(about.st_ctim.tv_sec) + "." +
                               std::to_string(about.st_ctim.tv_nsec) + ":" + refusal;
  if (exists) {
    const std::lock_guard<std::mutex> lock(g_refused_mutex);
    if (const auto it = g_refused.find(identity); it != g_refused.end()) throw UsageError(it->second);
  }
  const double mib = exists ? static_cast<double>(about.st_size) / (1 << 20) : 0;
  const double cpu_s = 2 + std::floor(mib / 10), memory_mib = 1024 + 4 * mib, wall_s = 30 + 4 * cpu_s;
  const ChildEnd end = run_in_child(read, {cpu_s, memory_mib * (1 << 20), wall_s});
  char why[256];
  switch (end.how) {
    case ChildEnd::How::kReturned:
      return;
    case ChildEnd::How::kThrew:  // this read's own reason, not necessarily another read's
      if (end.usage_error) throw UsageError(end.what);
      throw std::runtime_error(end.what);
    case ChildEnd::How::kOutOfMemory:
      std::snprintf(why, sizeof why, "reading it takes more than %.0f MiB of memory: a size in the file is damaged",
                    memory_mib);
      break;
    case ChildEnd::How::kBlocked:
      std::snprintf(why, sizeof why,
                    "reading it did not end within %.0f s, blocked without using its CPU (a file system that does "
                    "not answer?)",
                    wall_s);
      break;
    case ChildEnd::How::kPastCpuCap:
      std::snprintf(why, sizeof why,
                    "reading it did not end within %.0f s of CPU: the file is damaged (libhdf5 loops on some damaged "
                    "files)",
                    cpu_s);
      break;
    case ChildEnd::How::kKilled:
      std::snprintf(why, sizeof why, "reading it crashed (%s): the file is damaged", end.what.c_str());
      break;
  }
  const std::string line = refusal + ": " + why;
  if (exists) {
    const std::lock_guard<std::mutex> lock(g_refused_mutex);
    g_refused[identity] = line;
  }
  throw UsageError(line);
}

}  // namespace ddplab
