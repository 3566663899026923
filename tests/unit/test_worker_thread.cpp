// The job queue on a thread that the Reducer and the hierarchical all-reduce hand their work to
// (runtime/worker_thread.h): jobs run in submission order on one thread that is not the caller's, wait(t) returns only
// once jobs 1..t are done, the first failure is rethrown on the waiting thread and stops all later jobs,
// and destruction drops the jobs not yet started without waiting for them. A hang fails through CTest's timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/worker_thread.h"

namespace ddplab {
namespace {

TEST(WorkerThread, RunsJobsInSubmissionOrderOnItsOwnThread) {
  constexpr int kJobs = 200;
  std::vector<int> order;  // written by the worker only; read after wait_all
  std::vector<std::thread::id> ran_on(kJobs);
  WorkerThread worker("test worker");
  for (int i = 0; i < kJobs; ++i) {
    const uint64_t ticket = worker.submit([&, i] {
      order.push_back(i);
      ran_on[i] = std::this_thread::get_id();
    });
    EXPECT_EQ(ticket, static_cast<uint64_t>(i + 1));
  }
  worker.wait_all();
  ASSERT_EQ(order.size(), static_cast<size_t>(kJobs));
  for (int i = 0; i < kJobs; ++i) {
    EXPECT_EQ(order[i], i);
    EXPECT_EQ(ran_on[i], ran_on[0]) << "job " << i << " ran on another thread";
  }
  EXPECT_NE(ran_on[0], std::this_thread::get_id());
  EXPECT_TRUE(worker.idle());
}

TEST(WorkerThread, WaitReturnsOnlyOnceEveryEarlierJobIsDone) {
  constexpr int kJobs = 64;
  std::vector<std::atomic<bool>> done(kJobs);
  WorkerThread worker("test worker");
  std::vector<uint64_t> tickets;
  for (int i = 0; i < kJobs; ++i)
    tickets.push_back(worker.submit([&done, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // the waiter would overtake an unfinished job
      done[i] = true;
    }));
  for (int t : {1, 17, 40, kJobs}) {
    worker.wait(tickets[t - 1]);
    for (int i = 0; i < t; ++i) ASSERT_TRUE(done[i]) << "wait(" << t << ") returned before job " << i + 1 << " ended";
  }
}

TEST(WorkerThread, FirstFailureIsRethrownAndStopsLaterJobs) {
  WorkerThread worker("test worker");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  worker.submit([&ran, gate] {
    gate.wait();  // jobs 2..4 are queued behind this one before anything fails
    ++ran;
  });
  EXPECT_FALSE(worker.failed());
  const uint64_t failing = worker.submit([] { throw std::runtime_error("bucket 1 lost its peer"); });
  worker.submit([&ran] { ++ran; });
  const uint64_t last = worker.submit([] { throw std::logic_error("a second failure must not replace the first"); });
  release.set_value();
  for (uint64_t ticket : {failing, last}) {
    try {
      worker.wait(ticket);
      ADD_FAILURE() << "wait(" << ticket << ") returned after a job threw";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "bucket 1 lost its peer");
    }
  }
  EXPECT_THROW(worker.wait(1), std::runtime_error);  // every wait after a failure rethrows it
  worker.submit([&ran] { ++ran; });                  // dropped: what the jobs share is in an unknown state
  EXPECT_THROW(worker.wait_all(), std::runtime_error);
  EXPECT_EQ(ran.load(), 1);  // only the job before the failure
  EXPECT_TRUE(worker.idle());
  EXPECT_TRUE(worker.failed());
}

TEST(WorkerThread, DestructionFinishesTheRunningJobAndDropsThePending) {
  auto worker = std::make_unique<WorkerThread>("test worker");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> running{false}, first_done{false};
  std::atomic<int> pending_ran{0};
  worker->submit([&, gate] {
    running = true;
    gate.wait();
    first_done = true;
  });
  for (int i = 0; i < 10; ++i) worker->submit([&pending_ran] { ++pending_ran; });
  while (!running) std::this_thread::yield();
  EXPECT_FALSE(worker->idle());
  // The destructor runs on its own thread and blocks until the running job ends. The job is released after a
  // pause that lets the destructor ask the worker to stop first (were it late, pending jobs would run and the
  // test fail: the pause cannot make it pass).
  std::thread destroyer([&worker] { worker.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(first_done);
  release.set_value();
  destroyer.join();
  EXPECT_TRUE(first_done);
  EXPECT_EQ(pending_ran.load(), 0);
}

TEST(WorkerThread, DestructionOfAnIdleWorkerReturns) {
  for (int i = 0; i < 100; ++i) {
    WorkerThread worker("test worker");
    if (i % 2) worker.submit([] {});
  }
}

}  // namespace
}  // namespace ddplab
