// One thread that runs jobs in the order they are submitted, for the callers that hand work off their own thread
// and later wait for it: the Reducer's comm thread (bucket all-reduces during backward), the hierarchical
// all-reduce's cross-node thread (a round's shard across the nodes while the node reduces the next) and the GPU
// ring's comm thread (its ipc and host links block the host inside each exchange).
//
//   - Jobs run one at a time, in submission order; submit() returns the job's ticket (1, 2, ...), and wait(t)
//     blocks until jobs 1..t are done.
//   - The first job to throw ends the work: its exception is kept, no later job runs (what the jobs share, a
//     transport mid-message, is in an unknown state), and every wait from then on rethrows it on the caller's thread.
//   - Destruction stops the thread: the running job finishes, jobs not yet started are dropped.
//   - The waits are plain: callers that may block on peers open their own watchdog::Wait around them.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ddplab {

class WorkerThread {
 public:
  using Job = std::function<void()>;

  // Starts the thread, named `name` (a string literal) in the watchdog's messages.
  explicit WorkerThread(const char* name);
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Queues a job; returns its ticket. After a failure the job is dropped (a wait rethrows the failure).
  uint64_t submit(Job job);
  // Blocks until jobs 1..ticket have run; rethrows the first failure, if any job failed.
  void wait(uint64_t ticket);
  // wait() for every job submitted so far.
  void wait_all();
  // No job queued or running.
  bool idle();
  // A job has failed (the next wait rethrows its exception).
  bool failed();

 private:
  void run(const char* name);

  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> jobs_;
  uint64_t submitted_ = 0, finished_ = 0;  // jobs, counted as tickets are
  bool running_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once everything above is initialized
};

}  // namespace ddplab
