// The watchdog: no rank waits forever.
//
// Every blocking wait of a training step (a receive from a peer, a send's completion, a library collective, a
// barrier, the main thread waiting for its gradient buckets) runs inside a watchdog::Wait, which names what is waited
// for; a run's whole setup is one more (launcher/run.cpp, with a longer bound). A
// thread of the watchdog wakes a few times per timeout and, when some wait is open and no wait anywhere in the
// process has started or ended for `timeout_s`, prints one line per open wait ("rank 2: watchdog: no progress
// for 5.0 s at step 12: recv from rank 1 (tag 3) in ring all-reduce of bucket 3 [comm thread]") and calls
// MPI_Abort, which takes every rank of the job down: nobody stays behind.
//
// "No progress anywhere" rather than "this wait is long": a 1 GiB all-reduce is a long wait made of many short
// receives, and the main thread waits for its buckets while the communication thread works; neither is a hang.
// A wait inside the MPI library (MPI_Allreduce, MPI_Barrier) has no inner steps, so the timeout must exceed the
// longest such call; the default (300 s, like the order of NCCL's and Gloo's defaults) does.
//
// Cost: a Wait is a thread-local push/pop under an uncontended mutex and two clock reads, ~170 ns measured
// (bench/bench_instrumentation), so waits may be marked at receive granularity.
#pragma once

#include <optional>
#include <string>

namespace ddplab::watchdog {

inline constexpr int kExitCode = 3;  // the job's exit code when the watchdog aborts it

// Arms the watchdog (starts its thread on first use) with this timeout; 0 disarms it. Not thread-safe against
// itself: called by the main thread around a run.
void arm(double timeout_s);
void disarm();
double timeout_s();  // 0 when disarmed

// Context for the messages: the training step this rank is in (-1: none).
void set_step(int step);

// A blocking wait, open while this object lives. `what` must outlive it (a string literal). peer/tag < 0: none.
// Waits nest (an all-reduce around its receives); the message lists the open ones, outermost first.
class Wait {
 public:
  explicit Wait(const char* what, int peer = -1, int tag = -1);
  ~Wait();
  Wait(const Wait&) = delete;
  Wait& operator=(const Wait&) = delete;
};

// Local work that takes long inside a wait of the setup (a scan of every token of the shards) says it is making
// progress, as a wait's start or end does.
void note_progress();

// Names the calling thread in the watchdog's messages ("main", "comm thread"). `name` must be a literal.
void name_thread(const char* name);

// The watchdog over one run of a program, armed while this object lives and disarmed however the run ends. The run's
// setup (the ranks' agreement, the transports, CUDA's and NCCL's start) is one wait, named by `setup`, so that a
// rank stopped or hung there ends the job too. Its bound is the timeout but at least kSetupFloorS: ranks reach their
// first collective seconds apart under a busy launcher, and NCCL's start on a cluster takes seconds; neither is a
// hang that a short --timeout-s meant to catch. After setup_done() the run's waits are under the timeout itself.
class ArmedRun {
 public:
  static constexpr double kSetupFloorS = 30;
  ArmedRun(double timeout_s, const std::string& setup);
  ~ArmedRun();
  void setup_done();
  ArmedRun(const ArmedRun&) = delete;
  ArmedRun& operator=(const ArmedRun&) = delete;

 private:
  double timeout_s_;
  std::string setup_what_;  // what the setup's wait names: it must outlive the wait
  std::optional<Wait> setup_;
};

// A wait outside any run: MPI_Init and MPI_Finalize (runtime/mpi_init.h), the ranks' first agreements after MPI_Init
// (the program and its build, the arguments and settings), before any --timeout-s is read, and a suite's hand-over
// from one case to the next. Armed for `bound_s` while this object lives, as one wait named `what`, so that a rank
// stopped or hung there ends the job rather than keeping the others in the call for good. Around MPI_Init and
// MPI_Finalize (`mpi` kOutside) MPI cannot abort the job: the watchdog ends this process alone, and mpirun, seeing a
// rank leave without finalizing, ends the others. Never inside an ArmedRun (it disarms on its way out).
class StartupWait {
 public:
  enum class Mpi { kInside, kOutside };
  explicit StartupWait(const char* what, double bound_s = ArmedRun::kSetupFloorS, Mpi mpi = Mpi::kInside);
  ~StartupWait();
  StartupWait(const StartupWait&) = delete;
  StartupWait& operator=(const StartupWait&) = delete;

 private:
  std::optional<Wait> wait_;
};

// Called by the watchdog, in its own thread, before it aborts the job: releases what MPI_Abort cannot, such as an
// NCCL communicator whose kernels spin on the GPU waiting for a dead peer (ncclCommAbort). Returns an id for
// remove_abort_hook, which the owner calls before it is destroyed.
int add_abort_hook(void (*hook)(void* context), void* context);
void remove_abort_hook(int id);

}  // namespace ddplab::watchdog
