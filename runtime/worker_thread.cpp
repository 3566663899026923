#include "runtime/worker_thread.h"

#include <utility>

#include "runtime/watchdog.h"

namespace ddplab {

WorkerThread::WorkerThread(const char* name) : thread_([this, name] { run(name); }) {}

WorkerThread::~WorkerThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_one();
  thread_.join();
}

uint64_t WorkerThread::submit(Job job) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = ++submitted_;
    if (error_) return ticket;
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_one();
  return ticket;
}

void WorkerThread::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return finished_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void WorkerThread::wait_all() {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = submitted_;
  }
  wait(last);
}

bool WorkerThread::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return jobs_.empty() && !running_;
}

bool WorkerThread::failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_ != nullptr;
}

void WorkerThread::run(const char* name) {
  watchdog::name_thread(name);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;  // jobs not yet started are dropped
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // what the job captured is released before its waiter returns
    lock.lock();
    running_ = false;
    if (error) {
      error_ = error;
      jobs_.clear();
    } else {
      ++finished_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace ddplab
