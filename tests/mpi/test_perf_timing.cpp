// allreduce_perf's timed loop (bench/allreduce_perf/measure.cpp): how -z chooses between timing each call and
// queueing the -n calls with one wait, what each leaves for the row's per-call columns, and where in the buffers
// each call runs. Counted on fakes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <string>
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

// Each call, warm-up and queued ones included, starts one call's size further along the buffers than the one before
// (nccl-tests' startColl), wrapping at their end; a run that places its calls itself (a -G graph) gets the starts, as
// every call does with --hot-cache.
TEST(PerfTiming, EveryCallMovesAlongTheBuffers) {
  const World w;
  constexpr size_t kCount = 5, kPlaces = 3;
  std::vector<float> in(kPlaces * kCount + 2), out(in.size());  // 2 floats short of a 4th place
  for (const bool places_calls : {false, true})
    for (const bool hot_cache : {false, true})
      for (const int blocking : {0, 2}) {
        std::vector<size_t> in_at, out_at;
        Impl impl;
        impl.label = "fake";
        impl.places_calls = places_calls;
        const auto record = [&](const float* i, float* o, size_t count) {
          ASSERT_EQ(count, kCount);
          in_at.push_back(static_cast<size_t>(i - in.data()));
          out_at.push_back(static_cast<size_t>(o - out.data()));
        };
        impl.run = record;
        impl.enqueue = record;
        impl.wait = [] {};
        Options o = timing(blocking);
        o.max_bytes = in.size() * sizeof(float);
        o.hot_cache = hot_cache;
        Mode m;
        time_calls(impl, in.data(), out.data(), kCount, o, w.rank, w.n, &m);
        ASSERT_EQ(in_at.size(), 2u + 7u);
        for (size_t call = 0; call < in_at.size(); ++call) {
          const size_t want = places_calls || hot_cache ? 0 : call % kPlaces * kCount;
          const auto where = [&] {
            return "call " + std::to_string(call) + ", -z " + std::to_string(blocking) +
                   (places_calls ? ", places its calls" : "") + (hot_cache ? ", --hot-cache" : "");
          };
          EXPECT_EQ(in_at[call], want) << where();
          EXPECT_EQ(out_at[call], want) << where();
        }
      }
}

// A call of the whole buffer, or of more than half of it, has one place.
TEST(PerfTiming, ACallOfMoreThanHalfTheBuffersStaysInPlace) {
  for (size_t call = 0; call < 4; ++call) {
    EXPECT_EQ(call_offset(call, 8, 8), 0u);
    EXPECT_EQ(call_offset(call, 5, 9), 0u);
    EXPECT_EQ(call_offset(call, 0, 9), 0u);
  }
  EXPECT_EQ(call_offset(1, 4, 9), 4u);
  EXPECT_EQ(call_offset(2, 4, 9), 0u);
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
