// CPU op benchmark at the default MLP's shapes (batch 128, 1024 -> 1024 -> 1024 -> 1000): time per call
// (median of repeats) and achieved GFLOP/s (GEMMs) or GB/s (everything else, bytes read + written).
// Each rate is set against what this host does at best, measured in the same run: the GEMMs against the fastest of
// OpenBLAS's kernel families the CPU can run (each in a child process, kernels/cpu/blas_kernels.h), the passes
// against this core's memory floor (memcpy and y += x over buffers far larger than the caches, bytes read + written;
// the better of the two; the target: at least 70%). A good ratio elsewhere can hide a slow core: on an
// Emerald Rapids Xeon, OpenBLAS's own pick ran the GEMMs at a fifth of its best kernels'.
// It checks that the kernels in use run within 15% of the best family's rate, and exits 1 when they do not.
//   bench_cpu_ops [--batch 128] [--repeats 20] [--floor-mb 256]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/bench_util.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rng.h"

using namespace ddplab;

namespace {

using bench::median_ms;
using bench::random_vector;

double floor_gbps = 0;       // this run's memory floor; 0 until measured
double best_gemm_gflops = 0;  // this run's best kernel family's GEMM rate; 0 until measured

void row(const char* name, const char* shape, double ms, double amount, const char* unit) {
  const double rate = amount / (ms * 1e-3) / 1e9;
  std::printf("%-32s %-22s %9.3f ms %9.1f %-7s", name, shape, ms, rate, unit);
  if (floor_gbps > 0 && !std::strcmp(unit, "GB/s")) std::printf(" %5.0f%% of floor", 100 * rate / floor_gbps);
  if (best_gemm_gflops > 0 && !std::strcmp(unit, "GFLOP/s"))
    std::printf(" %5.0f%% of the best kernels", 100 * rate / best_gemm_gflops);
  std::printf("\n");
}

// Streams two buffers of `mb` MiB each: memcpy (2 streams) and y += x (3 streams). Returns the better rate.
double measure_memory_floor(int mb, int repeats) {
  const size_t n = size_t(mb) * 1048576 / sizeof(float);
  std::vector<float> x(n, 1.0f), y(n, 2.0f);  // written: the pages exist before the clock starts
  char shape[64];
  std::snprintf(shape, sizeof shape, "2 x %d MiB", mb);
  const double copy_ms = median_ms([&] { std::memcpy(y.data(), x.data(), n * sizeof(float)); }, repeats);
  row("floor: memcpy", shape, copy_ms, 2.0 * n * sizeof(float), "GB/s");
  const double add_ms = bench::add_stream_ms(y, x, repeats);
  row("floor: y += x", shape, add_ms, 3.0 * n * sizeof(float), "GB/s");
  return std::max(2.0 * n * sizeof(float) / copy_ms, 3.0 * n * sizeof(float) / add_ms) / 1e6;
}

// The layer's ops at batch B, C -> OC, and the softmax cross-entropy over V classes, each on what the ops before it
// left in the buffers.
void bench_layer_ops(int B, int C, int OC, int V, int repeats) {
  auto x = random_vector(size_t(B) * C, 1), w = random_vector(size_t(OC) * C, 2), out = random_vector(size_t(B) * OC, 3);
  auto dout = random_vector(size_t(B) * OC, 4), dx = random_vector(size_t(B) * C, 5), dw = random_vector(size_t(OC) * C, 6);
  auto bias = random_vector(OC, 7), dbias = random_vector(OC, 8);
  const double gemm_flops = 2.0 * B * C * OC;
  char shape[64];
  std::snprintf(shape, sizeof shape, "%dx%d @ %dx%d^T", B, C, OC, C);
  row("matmul_forward", shape, median_ms([&] { cpu::matmul_forward(out.data(), x.data(), w.data(), B, C, OC); }, repeats),
      gemm_flops, "GFLOP/s");
  row("matmul_backward (dinp+dw)", shape,
      median_ms([&] { cpu::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), B, C, OC); }, repeats),
      2 * gemm_flops, "GFLOP/s");
  const double act_bytes = 4.0 * B * OC;
  std::snprintf(shape, sizeof shape, "%dx%d", B, OC);
  row("bias_forward", shape, median_ms([&] { cpu::bias_forward(out.data(), bias.data(), B, OC); }, repeats),
      2 * act_bytes, "GB/s");
  row("bias_backward", shape, median_ms([&] { cpu::bias_backward(dbias.data(), dout.data(), B, OC); }, repeats),
      act_bytes, "GB/s");
  auto logits = random_vector(size_t(B) * V, 9), exps = logits, losses = random_vector(B, 10), sums = losses;
  std::vector<int32_t> targets(B);
  for (int b = 0; b < B; ++b) targets[b] = b * 7 % V;
  std::snprintf(shape, sizeof shape, "%dx%d", B, V);
  // The kernels with two widths (vector_math.h) at the one this CPU runs and, where that is 16 lanes (AVX-512), at 8
  // too: the two compared in one run.
  const int native_lanes = cpu::float_lanes();
  for (int lanes : native_lanes == 16 ? std::vector<int>{16, 8} : std::vector<int>{8}) {
    cpu::set_float_lanes(lanes);
    const std::string width = native_lanes == 16 ? " (" + std::to_string(lanes) + " lanes)" : "";
    char act_shape[32];
    std::snprintf(act_shape, sizeof act_shape, "%dx%d", B, OC);
    row(("gelu_forward" + width).c_str(), act_shape,
        median_ms([&] { cpu::gelu_forward(dx.data(), out.data(), int64_t(B) * OC); }, repeats), 2 * act_bytes, "GB/s");
    row(("gelu_backward" + width).c_str(), act_shape,
        median_ms([&] { cpu::gelu_backward(dx.data(), out.data(), dout.data(), int64_t(B) * OC); }, repeats),
        3 * act_bytes, "GB/s");
    row(("softmax_xent_forward" + width).c_str(), shape,
        median_ms(
            [&] {
              cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(),
                                                 B, V);
            },
            repeats),
        8.0 * B * V, "GB/s");
  }
  cpu::set_float_lanes(native_lanes);
  row("softmax_xent_backward", shape,
      median_ms(
          [&] { cpu::softmax_cross_entropy_backward(logits.data(), exps.data(), sums.data(), targets.data(), B, V); },
          repeats),
      8.0 * B * V, "GB/s");
}

// The passes over every parameter: the optimizers' updates, the gradient's scaling, norm and finiteness check.
void bench_parameter_passes(int repeats) {
  const int64_t n = 3'122'152;  // the default MLP's parameter count
  auto p = random_vector(n, 11), g = random_vector(n, 12), m = random_vector(n, 13), v = random_vector(n, 14);
  for (auto& e : v) e = e * e;
  char shape[64];
  std::snprintf(shape, sizeof shape, "%lld params", static_cast<long long>(n));
  int t = 0;
  row("adamw_update", shape,
      median_ms([&] { cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, ++t); },
                repeats),
      4.0 * n * 7, "GB/s");  // reads p g m v, writes p m v
  row("sgd_update (momentum)", shape,
      median_ms([&] { cpu::sgd_update(p.data(), g.data(), m.data(), n, 1e-3f, 0.9f, 0.0f); }, repeats), 4.0 * n * 5,
      "GB/s");
  row("scale", shape, median_ms([&] { cpu::scale(g.data(), 0.5f, n); }, repeats), 8.0 * n, "GB/s");
  double squares = 0;  // kept, so the sum is not optimised away
  row("sum_of_squares (--grad-clip)", shape, median_ms([&] { squares += cpu::sum_of_squares(g.data(), n); }, repeats),
      4.0 * n, "GB/s");
  if (!(squares > 0)) std::printf("(sum_of_squares gave %g for random normals)\n", squares);
  bool finite = true;  // kept, so the check is not optimised away
  row("all_finite", shape, median_ms([&] { finite = finite && cpu::all_finite(g.data(), n); }, repeats), 4.0 * n,
      "GB/s");
  // The two rows above in one pass, as the Reducer at ws=1 and the non-ring all-reduces run them. Alternating x0.5
  // and x2 keeps the values where they started over any number of repeats.
  int flips = 0;
  row("scale_and_check_finite", shape,
      median_ms([&] { finite = cpu::scale_and_check_finite(g.data(), ++flips % 2 ? 0.5f : 2.0f, n) && finite; },
                repeats),
      8.0 * n, "GB/s");
  if (!finite) std::printf("(all_finite found a NaN or Inf in the gradients: they are random normals)\n");
}

// The check: the kernels in use against the best family, both as the children measured them. Returns the exit code.
int check_kernels_in_use(const blas::KernelsInUse& kernels, const blas::Rates& alternatives) {
  const blas::CoreRate best = blas::fastest(alternatives);
  if (const blas::CoreRate* r = blas::find_rate(alternatives, kernels.core)) {
    const bool met = r->gflops >= 0.85 * best.gflops;
    std::printf("kernels in use: %s %.1f GFLOP/s, %.0f%% of the best (%s %.1f; target >= 85%%): %s\n", r->core.c_str(),
                r->gflops, 100 * r->gflops / best.gflops, best.core.c_str(), best.gflops, met ? "met" : "MISSED");
    return met ? 0 : 1;
  }
  std::printf("kernels in use: %s, not among the families measured (%s)\n", kernels.core.c_str(),
              alternatives.empty() ? "none to choose from on this CPU" : "its probe failed");
  return alternatives.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  blas::select_kernels(argc, argv);  // the kernels ddplab runs here (and this program is also the probe's child)
  int B = 128, repeats = 20, floor_mb = 256;
  CLI::App app{"the CPU ops at the default MLP's shapes against this core's memory floor"};
  app.add_option("--batch", B, "rows per batch")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--repeats", repeats, "timed calls per op (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--floor-mb", floor_mb, "MiB per buffer of the floor's streams (far above the caches)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  if (const auto code = bench::parse_command_line(app, argc, argv, "bench_cpu_ops")) return *code;
  openblas_set_num_threads(1);
  const int C = 1024, OC = 1024, V = 1000;
  const blas::KernelsInUse& kernels = blas::kernels_in_use();
  std::printf("# bench_cpu_ops: batch %d, 1 BLAS thread, OpenBLAS kernels %s, float kernels at %d lanes\n", B,
              kernels.describe().c_str(), cpu::float_lanes());
  const blas::Rates alternatives = blas::measure_alternatives();
  best_gemm_gflops = blas::fastest(alternatives).gflops;
  std::printf("# the kernel families, each in a child (one 1024 -> 1024 layer at batch 128, forward + backward): %s "
              "GFLOP/s\n",
              alternatives.empty() ? "none to choose from" : blas::list_rates(alternatives).c_str());
  std::printf("%-32s %-22s %12s %14s\n", "op", "shape", "time", "rate");
  floor_gbps = measure_memory_floor(floor_mb, repeats);
  std::printf("%-32s %-22s %12s %9.1f GB/s\n", "memory floor", "", "", floor_gbps);
  bench_layer_ops(B, C, OC, V, repeats);
  bench_parameter_passes(repeats);
  return check_kernels_in_use(kernels, alternatives);
}
