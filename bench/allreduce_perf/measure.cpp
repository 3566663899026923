// Timing and checking one implementation at one size and mode.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

#include "bench/allreduce_perf/harness.h"
#include "runtime/cpu_taken.h"
#include "runtime/watchdog.h"

namespace ddplab::perf {
namespace {

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Nearest-rank percentile (as nccl-tests' i_p99): the smallest value with at least p% of the calls at or below it.
double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::max<size_t>(rank, 1) - 1];
}

// --diag: how long the hypervisor gave the CPUs this rank may run on (its one vCPU when bound) to someone else while
// the guest had work for them (runtime/cpu_taken.h), in ms since boot, in steps of USER_HZ (10 ms). A call that took
// several times its median while steal grew was stalled from outside: no setting of ours decides it. 0 where it is
// not counted (bare metal, or a kernel without it).
double steal_ms_now() {
  static const CpuTakenMeter meter;  // made on first use, on the rank's main thread
  return std::max(0.0, meter.read().steal_ms);
}

// Rank 0: the per-call statistics (NaN where the calls were queued and timed together) and the time the row
// reports, from every rank's mean and every call's slowest.
void summarize(const Options& o, int n, Mode* m) {
  const std::vector<double>& r = m->rank_means_us;
  if (m->calls_us.empty()) {
    if (o.median) throw std::logic_error("summarize: --stat median without per-call times");  // parse_options refuses
    m->min_us = m->p50_us = m->p99_us = std::nan("");
  } else {
    m->min_us = *std::min_element(m->calls_us.begin(), m->calls_us.end());
    m->p50_us = percentile(m->calls_us, 50);
    m->p99_us = percentile(m->calls_us, 99);
  }
  double sum = 0;
  for (double v : r) sum += v;
  const double by_ranks[] = {r[0], sum / n, *std::min_element(r.begin(), r.end()),
                             *std::max_element(r.begin(), r.end())};
  m->time_us = o.median ? m->p50_us : by_ranks[static_cast<int>(o.aggregate)];
}

}  // namespace

double time_calls(const Impl& impl, const float* in, float* out, size_t count, const Options& o, int rank, int n,
                  Mode* m) {
  const int runs = impl.timed_runs > 0 ? impl.timed_runs : o.iters;
  std::vector<double> t(runs);
  const double per_run = impl.calls_per_run;
  // -z 0 (nccl-tests' default): the calls go on the stream back to back and the host waits once, so the mean is
  // the collective's own rate, not a launch and a host wait each; no call is timed alone. Alike on every rank.
  const bool queued = o.blocking == 0 && impl.enqueue;
  // Each call, warm-up included, on its own stretch of the buffers (call_offset; --hot-cache: all at their start);
  // a run that places its calls itself gets the starts.
  size_t call = 0;
  const auto placed = [&](auto* buffer) {
    return impl.places_calls ? buffer : buffer + call_offset(call, count, o.calls_span());
  };
  double steal_at_start = 0, mean_us = 0;
  {
    // The watchdog acts only while a wait is open, and mpi-raw's calls open none (Open MPI's own number, without a
    // wait's ~170 ns): one wait around the calls, and progress noted between them.
    const watchdog::Wait calls("the warm-up and timed calls");
    for (int i = 0; i < o.warmup; ++i, ++call) {
      impl.run(placed(in), placed(out), count);
      watchdog::note_progress();
    }
    steal_at_start = o.diag ? steal_ms_now() : 0;  // before the barrier: the calls start together
    {                                              // a peer stopped before the barrier must not leave this rank in it
      const watchdog::Wait start("the ranks, to start the timed calls together");
      MPI_Barrier(MPI_COMM_WORLD);
    }
    const double t0 = now_s();
    if (queued) {
      {  // a launch can block where the stream's queue is full: the watchdog names it if it never returns
        const watchdog::Wait queuing("the timed calls to be queued");
        for (int i = 0; i < runs; ++i, ++call) impl.enqueue(placed(in), placed(out), count);
      }
      impl.wait();
    } else {
      // One clock read a call, its end the next one's start; progress noted from it at most once a millisecond
      // (each note a store the watchdog's thread reads): sub-microsecond calls carry ~25 ns of timing, not ~75.
      double start = t0, noted = t0;
      for (int i = 0; i < runs; ++i, ++call) {
        impl.run(placed(in), placed(out), count);
        if (o.blocking == 1) {  // nccl-tests' -z 1: every rank done before the next call, the barrier in the time
          const watchdog::Wait after("the ranks, after a call (-z 1)");
          MPI_Barrier(MPI_COMM_WORLD);
        }
        const double end = now_s();
        t[i] = (end - start) * 1e6 / per_run;
        start = end;
        if (end - noted > 1e-3) watchdog::note_progress(), noted = end;
      }
    }
    mean_us = (now_s() - t0) / runs * 1e6 / per_run;
  }
  const double stolen = o.diag ? steal_ms_now() - steal_at_start : 0;
  const watchdog::Wait gather("the ranks' times");
  if (o.diag) {
    m->steal_ms.assign(rank == 0 ? n : 0, 0.0);
    MPI_Gather(&stolen, 1, MPI_DOUBLE, m->steal_ms.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  m->rank_means_us.assign(rank == 0 ? n : 0, 0.0);
  m->calls_us.assign(rank == 0 && !queued ? runs : 0, 0.0);
  MPI_Gather(&mean_us, 1, MPI_DOUBLE, m->rank_means_us.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (!queued) MPI_Reduce(t.data(), m->calls_us.data(), runs, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) summarize(o, n, m);
  return stolen;
}

long long count_wrong(const Impl& impl, const Inputs& inputs, int rank, float* in_host, float* out_host, size_t count,
                      bool in_place) {
  inputs.fill(in_host, count, rank);
  impl.load_in(in_host, count);
  float* result = in_place ? in_host : out_host;
  if (!in_place) {
    std::fill(result, result + count, -1.0f);
    impl.load_out(result, count);
  }
  {
    const watchdog::Wait call("the check's call");
    impl.run_once(impl.in(in_host), in_place ? impl.in(in_host) : impl.out(out_host), count);
  }
  impl.fetch_result(result, in_place, count);
  long long wrong = 0, total = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = inputs.sum(i);
    wrong += std::memcmp(&result[i], &want, sizeof want) != 0;
  }
  const watchdog::Wait gather("the ranks' counts of wrong values");
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

}  // namespace ddplab::perf
