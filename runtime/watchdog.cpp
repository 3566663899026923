#include "runtime/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddplab::watchdog {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Frame {
  const char* what;
  int peer, tag;
};

// One thread's open waits. Written by its thread, read by the watchdog's, both under `mutex` (uncontended but
// for the watchdog's rare look).
struct ThreadWaits {
  static constexpr int kMaxDepth = 8;
  std::mutex mutex;
  const char* name = "thread";
  Frame frames[kMaxDepth];
  int depth = 0;  // may exceed kMaxDepth: deeper frames are counted, not kept
};

std::atomic<int64_t> g_timeout_ns{0};
std::atomic<int64_t> g_last_progress_ns{0};
std::atomic<int> g_step{-1};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_mpi_can_abort{false};  // false around MPI_Init and MPI_Finalize: the watchdog exits alone

// This process's rank before MPI_Init has returned, as the launcher gave it (Open MPI, PMIx, Slurm); -1 unknown.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return -1;
}

struct AbortHook {
  int id;
  void (*hook)(void*);
  void* context;
};
std::mutex g_hooks_mutex;
std::vector<AbortHook> g_hooks;
int g_next_hook_id = 0;

class Monitor {
 public:
  static Monitor& get() {
    static Monitor monitor;
    return monitor;
  }
  void add(ThreadWaits* t) {
    std::lock_guard<std::mutex> lock(mutex_);
    threads_.push_back(t);
  }
  void remove(ThreadWaits* t) {
    std::lock_guard<std::mutex> lock(mutex_);
    threads_.erase(std::remove(threads_.begin(), threads_.end(), t), threads_.end());
  }
  void start_once() {
    std::lock_guard<std::mutex> lock(mutex_);
    // Its first look counts from now, not from when the thread first runs: a process stopped in between has not run.
    if (!thread_.joinable()) thread_ = std::thread([this, armed = now_ns()] { loop(armed); });
  }
  ~Monitor() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop(int64_t last_look) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      // A few looks per timeout: the abort comes at most ~25% after the deadline.
      const int64_t planned = g_timeout_ns.load();
      const int64_t period = planned > 0 ? std::clamp<int64_t>(planned / 4, 10'000'000, 1'000'000'000) : 1'000'000'000;
      cv_.wait_for(lock, std::chrono::nanoseconds(period), [&] { return stop_; });
      // The timeout as armed now: the process may have been armed (and then stopped) during the wait.
      const int64_t timeout = g_timeout_ns.load();
      const int64_t now = now_ns(), absent = now - last_look - period;
      last_look = now;
      if (stop_ || timeout <= 0) continue;
      // This process did not run for half a timeout (SIGSTOP, a debugger, a host that descheduled it): its own
      // absence is no peer's fault, so the clock starts again. Its peers, which waited for it, end the job; once
      // resumed (mpirun continues a stopped rank to end it), it says why it was the one, if it was in a wait.
      if (absent > timeout / 2) {
        g_last_progress_ns = now;
        if (!describe_open_waits().empty()) {
          std::fprintf(stderr,
                       "ddplab: rank %d: watchdog: this rank did not run for %.1f s (stopped, or its host did not "
                       "schedule it): its peers waited for it\n",
                       g_rank.load(), absent / 1e9);
          std::fflush(stderr);
        }
        continue;
      }
      const int64_t stalled = now - g_last_progress_ns.load();
      if (stalled < timeout) continue;
      std::vector<std::string> open = describe_open_waits();
      if (!open.empty()) abort_job(stalled, open);
    }
  }

  std::vector<std::string> describe_open_waits() {
    std::vector<std::string> lines;
    for (ThreadWaits* t : threads_) {
      std::lock_guard<std::mutex> lock(t->mutex);
      if (t->depth == 0) continue;
      std::string line;
      // Innermost first: "recv from rank 1 (tag 3) in all-reduce (tag 3) [comm thread]"; the Reducer's tags are
      // its bucket indices.
      for (int d = std::min(t->depth, ThreadWaits::kMaxDepth) - 1; d >= 0; --d) {
        const Frame& f = t->frames[d];
        line += line.empty() ? "" : " in ";
        line += f.what;
        if (f.peer >= 0) line += " rank " + std::to_string(f.peer);
        if (f.tag >= 0) line += " (tag " + std::to_string(f.tag) + ")";
      }
      lines.push_back(line + " [" + t->name + "]");
    }
    return lines;
  }

  [[noreturn]] void abort_job(int64_t stalled_ns, const std::vector<std::string>& open) {
    const int rank = g_rank.load(), step = g_step.load();
    char head[160];
    std::snprintf(head, sizeof head, "ddplab: error on rank %d: watchdog: no progress for %.1f s%s", rank,
                  stalled_ns / 1e9, step >= 0 ? (" at step " + std::to_string(step)).c_str() : "");
    for (const std::string& wait : open) std::fprintf(stderr, "%s: waiting for %s\n", head, wait.c_str());
    if (g_mpi_can_abort)
      std::fprintf(stderr,
                   "ddplab: rank %d aborts the job (exit code %d): a peer is dead, hung or out of step; raise "
                   "--timeout-s if the wait was legitimate\n",
                   rank, kExitCode);
    else  // in MPI_Init or MPI_Finalize, where MPI_Abort cannot be called
      std::fprintf(stderr,
                   "ddplab: rank %d leaves (exit code %d): a peer is dead, stopped or was never started; mpirun "
                   "ends the others\n",
                   rank, kExitCode);
    std::fflush(stderr);
    {
      std::lock_guard<std::mutex> lock(g_hooks_mutex);
      for (const AbortHook& h : g_hooks) h.hook(h.context);
    }
    if (g_mpi_can_abort) MPI_Abort(MPI_COMM_WORLD, kExitCode);
    _exit(kExitCode);  // MPI_Abort does not return; if it did, or cannot be called here, still never hang
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<ThreadWaits*> threads_;
  std::thread thread_;
  bool stop_ = false;
};

// Registers the calling thread on first use, unregisters at thread exit.
struct Registration {
  ThreadWaits waits;
  Registration() { Monitor::get().add(&waits); }
  ~Registration() { Monitor::get().remove(&waits); }
};

ThreadWaits& this_thread_waits() {
  thread_local Registration registration;
  return registration.waits;
}

}  // namespace

void arm(double seconds) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  g_mpi_can_abort = initialized && !finalized;
  if (g_mpi_can_abort) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    g_rank = rank;
  } else if (g_rank < 0) {
    g_rank = launcher_rank();
  }
  g_last_progress_ns = now_ns();
  // At least a millisecond: a smaller positive timeout would round to 0 ns, which means disarmed.
  g_timeout_ns = seconds > 0 ? static_cast<int64_t>(std::max(seconds, 1e-3) * 1e9) : 0;
  if (seconds > 0) Monitor::get().start_once();
}

void disarm() { g_timeout_ns = 0; }

double timeout_s() { return g_timeout_ns.load() / 1e9; }

void set_step(int step) { g_step = step; }

void note_progress() { g_last_progress_ns = now_ns(); }

int add_abort_hook(void (*hook)(void*), void* context) {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  g_hooks.push_back(AbortHook{g_next_hook_id, hook, context});
  return g_next_hook_id++;
}

void remove_abort_hook(int id) {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  g_hooks.erase(std::remove_if(g_hooks.begin(), g_hooks.end(), [id](const AbortHook& h) { return h.id == id; }),
                g_hooks.end());
}

void name_thread(const char* name) {
  ThreadWaits& t = this_thread_waits();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.name = name;
}

Wait::Wait(const char* what, int peer, int tag) {
  ThreadWaits& t = this_thread_waits();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.depth < ThreadWaits::kMaxDepth) t.frames[t.depth] = Frame{what, peer, tag};
    ++t.depth;
  }
  g_last_progress_ns.store(now_ns(), std::memory_order_relaxed);
}

Wait::~Wait() {
  ThreadWaits& t = this_thread_waits();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    --t.depth;
  }
  g_last_progress_ns.store(now_ns(), std::memory_order_relaxed);
}

ArmedRun::ArmedRun(double timeout_s, const std::string& setup) : timeout_s_(timeout_s) {
  char floor[32];
  std::snprintf(floor, sizeof floor, "%g", kSetupFloorS);
  setup_what_ = setup + ", bounded by --timeout-s but at least " + floor + " s";
  arm(timeout_s > 0 ? std::max(timeout_s, kSetupFloorS) : 0);
  setup_.emplace(setup_what_.c_str());
}

void ArmedRun::setup_done() {
  setup_.reset();
  arm(timeout_s_);
}

ArmedRun::~ArmedRun() {
  setup_.reset();
  disarm();
  set_step(-1);
}

StartupWait::StartupWait(const char* what, double bound_s, Mpi mpi) {
  arm(bound_s);
  if (mpi == Mpi::kOutside) g_mpi_can_abort = false;
  wait_.emplace(what);
}

StartupWait::~StartupWait() {
  wait_.reset();
  disarm();
}

}  // namespace ddplab::watchdog
