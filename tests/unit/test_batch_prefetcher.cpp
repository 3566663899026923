// The GPU trainer's input pipeline (train/batch_prefetcher.h) without a GPU: in the GPU step's order —
// take the step's batch, then the gradients' all-reduce, in which the ring's ipc and host links block the host — the
// next step's batch is staged while the host is blocked inside the all-reduce. A fake ring link blocks as those
// links do, until the next step's batch is there; staging after the all-reduce (the order this replaced) would leave
// it waiting. Also: one persistent worker, one staging at a time in step order, a resumed run's first step, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/ring_device.h"
#include "train/batch_prefetcher.h"

namespace ddplab {
namespace {

using namespace std::chrono_literals;

// What the worker did, seen from the test.
struct StagingLog {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int64_t> staged;  // in order of completion
  std::set<std::thread::id> threads;
  int running = 0, most_running = 0;

  BatchStats stage(int64_t step, std::chrono::milliseconds takes = 0ms) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
      most_running = std::max(most_running, ++running);
    }
    changed.notify_all();
    std::this_thread::sleep_for(takes);
    {
      std::lock_guard<std::mutex> lock(mutex);
      --running;
      staged.push_back(step);
    }
    changed.notify_all();
    return BatchStats{static_cast<double>(10 + step), 0, 0, 0};
  }
  bool wait_running(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, timeout, [&] { return running > 0; });
  }
  // Waits up to `timeout` for `step` to be staged.
  bool wait_staged(int64_t step, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, timeout,
                            [&] { return std::find(staged.begin(), staged.end(), step) != staged.end(); });
  }
};

// Rank 0 of a two-rank ring whose neighbour holds the same data (each exchange hands back what it sends). Like the
// ipc and host links, it blocks the host in every exchange; here until the next step's batch is staged (or a
// timeout), and it records whether that happened.
class BlockedUntilStagedLink final : public RingLink {
 public:
  BlockedUntilStagedLink(StagingLog& log, int64_t next_step) : log_(log), next_step_(next_step) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  size_t max_bytes() const override { return 256; }
  void send_recv(int, const void* send, size_t send_bytes, int, void* recv, size_t recv_bytes) override {
    if (!waited_) staged_while_blocked_ = next_step_ < 0 || log_.wait_staged(next_step_, 2s);
    waited_ = true;
    ASSERT_EQ(send_bytes, recv_bytes);
    std::memcpy(recv, send, recv_bytes);
  }
  const char* name() const override { return "blocked until staged"; }
  bool staged_while_blocked() const { return staged_while_blocked_; }

 private:
  StagingLog& log_;
  int64_t next_step_;
  bool waited_ = false, staged_while_blocked_ = false;
};

TEST(BatchPrefetcher, StagesTheNextStepWhileTheHostIsBlockedInTheAllReduce) {
  constexpr int64_t kSteps = 5;
  StagingLog log;
  BatchPrefetcher prefetcher([&](int64_t step) { return log.stage(step, 5ms); }, kSteps);
  HostMemory memory;
  std::vector<float> grads(1000), staging(device_ring_max_chunk(BlockedUntilStagedLink(log, -1)));
  for (int64_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ(prefetcher.take(step).samples, 10.0 + step);  // CudaBackend::load: the batch first, ...
    std::fill(grads.begin(), grads.end(), static_cast<float>(step));
    BlockedUntilStagedLink link(log, step + 1 < kSteps ? step + 1 : -1);
    ring_allreduce_sum(grads.data(), grads.data(), grads.size(), link, memory, staging.data());  // ... the buckets
    EXPECT_TRUE(link.staged_while_blocked()) << "step " << step + 1 << " must be staged during step " << step
                                             << "'s all-reduce, not after it";
    EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [&](float g) { return g == 2.0f * step; }))
        << "the fake ring must still sum";
  }
  EXPECT_EQ(log.staged, (std::vector<int64_t>{0, 1, 2, 3, 4})) << "each step once, in order, none beyond the last";
}

TEST(BatchPrefetcher, OnePersistentWorkerStagesOneStepAtATime) {
  StagingLog log;
  {
    BatchPrefetcher prefetcher([&](int64_t step) { return log.stage(step, 1ms); }, 20);
    for (int64_t step = 0; step < 20; ++step) prefetcher.take(step);
  }
  EXPECT_EQ(log.threads.size(), 1u) << "one thread for the run, not one per step";
  EXPECT_EQ(log.threads.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(log.most_running, 1);
}

// A resumed run starts at the checkpoint's step: staged on demand, then prefetched as usual.
TEST(BatchPrefetcher, AResumedRunStagesItsFirstStepOnDemand) {
  StagingLog log;
  BatchPrefetcher prefetcher([&](int64_t step) { return log.stage(step); }, 6);
  for (int64_t step = 3; step < 6; ++step) EXPECT_EQ(prefetcher.take(step).samples, 10.0 + step);
  EXPECT_EQ(log.staged, (std::vector<int64_t>{3, 4, 5}));
}

// A failed staging of step s + 1 (it runs during step s) reaches the caller at take(s + 1), not before.
TEST(BatchPrefetcher, AStagingErrorReachesTheStepThatNeedsTheBatch) {
  StagingLog log;
  BatchPrefetcher prefetcher(
      [&](int64_t step) {
        if (step == 2) throw std::runtime_error("cannot read shard 2");
        return log.stage(step);
      },
      5);
  prefetcher.take(0);
  prefetcher.take(1);
  try {
    prefetcher.take(2);
    ADD_FAILURE() << "nothing thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "cannot read shard 2");
  }
}

// The staging writes memory its owner frees after the prefetcher: the destructor waits for one in flight.
TEST(BatchPrefetcher, DestructionWaitsForAStagingInFlight) {
  StagingLog log;
  {
    BatchPrefetcher prefetcher([&](int64_t step) { return log.stage(step, step == 1 ? 100ms : 0ms); }, 3);
    prefetcher.take(0);  // hands step 1 to the worker
    ASSERT_TRUE(log.wait_running(2s));  // step 1 is being staged
  }
  EXPECT_EQ(log.staged, (std::vector<int64_t>{0, 1}));
}

}  // namespace
}  // namespace ddplab
