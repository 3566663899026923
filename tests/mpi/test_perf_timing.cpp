// allreduce_perf's timed loop (bench/allreduce_perf/measure.cpp): how -z chooses between timing each call and
// queueing the -n calls with one wait, and what each leaves for the row's per-call columns. Counted on fakes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "bench/allreduce_perf/harness.h"

namespace ddplab::perf {
namespace {

struct Counts {
  int runs = 0, enqueues = 0, waits = 0;
  double enqueued_us = 0;      // the enqueues' own time, as they measured it
  std::vector<double> run_us;  // each run's own time, in order (the warm-up's first)
};

constexpr auto kCall = std::chrono::microseconds(2000);

// A call that takes at least kCall of the host's time however it is made.
Impl counted(Counts& c, bool queues) {
  Impl impl;
  impl.label = "fake";
  impl.run = [&c](const float*, float*, size_t) {
    const auto start = std::chrono::steady_clock::now();
    ++c.runs, std::this_thread::sleep_for(kCall);
    c.run_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  };
  if (queues) {
    impl.enqueue = [&c](const float*, float*, size_t) {
      const auto start = std::chrono::steady_clock::now();
      ++c.enqueues, std::this_thread::sleep_for(kCall);
      c.enqueued_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    };
    impl.wait = [&c] { ++c.waits; };
  }
  return impl;
}

struct World {
  int rank = 0, n = 1;
  World() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
  }
};

Options timing(int blocking) {
  Options o;
  o.warmup = 2;
  o.iters = 7;
  o.blocking = blocking;
  return o;
}

// time_calls on a counted fake: what it called, and the row's figures.
struct Timed {
  Counts counts;
  Mode mode;
};
Timed time_counted(const World& w, bool queues, int blocking) {
  Timed t;
  time_calls(counted(t.counts, queues), nullptr, nullptr, 0, timing(blocking), w.rank, w.n, &t.mode);
  return t;
}

TEST(PerfTiming, ZeroQueuesTheCallsAndWaitsOnceAfterThem) {
  const World w;
  const auto [c, m] = time_counted(w, true, 0);
  EXPECT_EQ(c.runs, 2);  // the warm-up calls each wait
  EXPECT_EQ(c.enqueues, 7);
  EXPECT_EQ(c.waits, 1);
  if (w.rank != 0) return;
  EXPECT_TRUE(m.calls_us.empty());  // no call was timed alone
  EXPECT_TRUE(std::isnan(m.min_us) && std::isnan(m.p50_us) && std::isnan(m.p99_us));
  ASSERT_EQ(m.rank_means_us.size(), static_cast<size_t>(w.n));
  // Rank 0's mean call: its 7 calls' time over 7, so at least their own mean, and far from their sum (which a time
  // not divided by the calls would pass), whatever the host's load adds around them.
  const double mean_us = m.rank_means_us[0];
  EXPECT_GE(mean_us, 0.999 * c.enqueued_us / 7);
  EXPECT_LT(mean_us, c.enqueued_us / 7 + c.enqueued_us / 2);
}

// -z 2 waits after each call, -z 1 adds a barrier (nccl-tests' numbering): each call timed on its own either way.
TEST(PerfTiming, OneAndTwoTimeEveryCallOnItsOwn) {
  const World w;
  for (const int blocking : {1, 2}) {
    const auto [c, m] = time_counted(w, true, blocking);
    EXPECT_EQ(c.runs, 2 + 7) << "-z " << blocking;
    EXPECT_EQ(c.enqueues, 0);
    EXPECT_EQ(c.waits, 0);
    if (w.rank != 0) continue;
    ASSERT_EQ(m.calls_us.size(), 7u);
    EXPECT_GE(m.min_us, 2000.0);
    EXPECT_LE(m.min_us, m.p50_us);
    EXPECT_LE(m.p50_us, m.p99_us);
  }
}

// -G N (nccl-tests'): the -n calls captured into one graph, launched N times: N launches timed, after the warm-up's.
TEST(PerfTiming, AGraphRowTimesItsLaunches) {
  const World w;
  Counts counts;
  Impl graph = counted(counts, false);
  graph.calls_per_run = 7;  // the -n calls one launch runs
  graph.timed_runs = 3;     // -G 3
  Mode m;
  time_calls(graph, nullptr, nullptr, 0, timing(2), w.rank, w.n, &m);
  EXPECT_EQ(counts.runs, 2 + 3);
  if (w.rank != 0) return;
  EXPECT_EQ(m.calls_us.size(), 3u);
  // Rank 0's time per call: its 3 launches' own time over 21 calls, give or take the loop around them (what the host's
  // load adds there), and far from a launch's whole time (which a time not divided by the calls would pass).
  const double launch_us = (counts.run_us[2] + counts.run_us[3] + counts.run_us[4]) / 3;
  ASSERT_EQ(m.rank_means_us.size(), static_cast<size_t>(w.n));
  EXPECT_GE(m.rank_means_us[0], 0.999 * launch_us / 7);
  EXPECT_LT(m.rank_means_us[0], launch_us / 7 + launch_us / 2);
}

TEST(PerfTiming, AnImplementationThatCannotQueueIsTimedCallByCallUnderZero) {
  const World w;
  const auto [c, m] = time_counted(w, false, 0);
  EXPECT_EQ(c.runs, 2 + 7);
  if (w.rank != 0) return;
  EXPECT_EQ(m.calls_us.size(), 7u);
}

}  // namespace
}  // namespace ddplab::perf
