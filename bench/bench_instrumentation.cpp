// What ddplab's per-step bookkeeping costs, against the step it measures (docs/BENCHMARKS.md, "Instrumentation").
//
//   mpirun -np 2 build/bench/bench_instrumentation --step-ms MS [--buckets 2] [--waits 16]
//
// Per step, the trainer reads the clock ~12 times plus 3 times per bucket, opens a watchdog Wait around every
// blocking wait (~4 per bucket and ring step), checks the reduced gradients for NaN/Inf (one pass over them, on
// the communication thread), completes one 2-int MPI_Iallreduce (the stop/finite agreement), and appends one
// StepRecord and a BucketTimes per bucket. This times each piece in isolation for the default MLP
// (1024-1024x2-1000, 3.15M parameters) and prints it next to the step time --step-ms gives (required: the measured
// step of the run it is compared with).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/bench_util.h"
#include "kernels/cpu/ops.h"
#include "runtime/clock.h"
#include "runtime/watchdog.h"

int main(int argc, char** argv) {
  using namespace ddplab;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"cost of ddplab's per-step instrumentation"};
  double step_ms = 0;
  int buckets = 2, waits = 16;
  app.add_option("--step-ms", step_ms, "the step time to compare with (ms)")
      ->required()
      ->check([](const std::string& text) {  // the percentages divide by it
        char* end = nullptr;
        const double ms = std::strtod(text.c_str(), &end);
        return *end == '\0' && ms > 0 && std::isfinite(ms) ? std::string()
                                                           : "expected milliseconds above 0, got " + text;
      });
  app.add_option("--buckets", buckets, "buckets per step")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--waits", waits, "watchdog waits per step (receives, sends, collectives)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  // Every rank parses the same command line and ends alike; rank 0 alone says why.
  if (const auto code = bench::parse_command_line(app, argc, argv, "bench_instrumentation", rank == 0)) {
    MPI_Finalize();
    return *code;
  }

  constexpr int kReps = 1'000'000;
  const double clock_ns = bench::median_ms([] {
    volatile double sink = 0;
    for (int i = 0; i < kReps; ++i) sink = sink + now_ms();
  }, 5) * 1e6 / kReps;

  watchdog::arm(300);
  const double wait_ns = bench::median_ms([] {
    for (int i = 0; i < kReps; ++i) const watchdog::Wait wait("bench", 1, i & 1023);
  }, 5) * 1e6 / kReps;

  const int64_t num_grads = 1024LL * 1024 + 1024 + 1024LL * 1024 + 1024 + 1024LL * 1000 + 1000;  // 1024-1024x2-1000
  const std::vector<float> grads = bench::random_vector(num_grads, 7);
  bool finite = true;
  const double finite_ms = bench::median_ms([&] { finite = finite && cpu::all_finite(grads.data(), num_grads); }, 21);

  MPI_Comm control;
  MPI_Comm_dup(MPI_COMM_WORLD, &control);
  int mine[2] = {0, 0}, all[2];
  const double agree_ms = bench::median_ms([&] {
    MPI_Request r;
    MPI_Iallreduce(mine, all, 2, MPI_INT, MPI_MAX, control, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }, 201);
  watchdog::disarm();

  if (rank == 0) {
    const int clock_reads = 12 + 3 * buckets;
    const double clocks_ms = clock_reads * clock_ns * 1e-6, waits_ms = waits * wait_ns * 1e-6;
    const double total = clocks_ms + waits_ms + finite_ms + agree_ms;
    std::printf("# instrumentation per step, %d ranks, default MLP (%.2fM gradients)%s\n", size, num_grads / 1e6,
                finite ? "" : " [non-finite?!]");
    std::printf("%-44s %12s %10s\n", "piece", "ms/step", "% of step");
    auto row = [&](const char* name, double ms) {
      std::printf("%-44s %12.4f %9.3f%%\n", name, ms, 100 * ms / step_ms);
    };
    char text[96];
    std::snprintf(text, sizeof text, "clock reads (%d x %.1f ns)", clock_reads, clock_ns);
    row(text, clocks_ms);
    std::snprintf(text, sizeof text, "watchdog waits (%d x %.1f ns)", waits, wait_ns);
    row(text, waits_ms);
    row("non-finite check of all gradients (comm thd)", finite_ms);
    row("stop/finite agreement (2-int all-reduce)", agree_ms);
    row("total, upper bound (nothing hidden)", total);
    std::printf("step time compared with: %.2f ms\n", step_ms);
  }
  MPI_Comm_free(&control);
  MPI_Finalize();
  return 0;
}
