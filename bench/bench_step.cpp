// The ws=1 training step against the GEMMs it cannot avoid (the goal: the step within 8% of the GEMMs alone).
// Runs the default MLP's step through the Trainer on one rank and one BLAS thread, with the optimizer's update after
// backward and in backward (--optimizer-in-backward), and after each pair of steps the same eight GEMMs (forward 3,
// weight gradients 3, input gradients 2: the first layer's input needs none) on buffers of the same shapes through
// the same cpu:: calls. Prints medians of each, of their ratios, and the steps' parts, and the GEMMs' rate against the
// fastest of OpenBLAS's kernel families on this CPU, measured in the same run (a ratio alone hides slow kernels).
//   bench_step [--steps 40] [--batch 128] [--grad-slice-mb auto] [--loader-threads 0]
#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/bench_util.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/ops.h"
#include "train/clock.h"
#include "train/trainer.h"

using namespace ddplab;

namespace {

// The MLP's GEMMs, shape for shape and call for call as model/mlp.cpp makes them (one piece per weight), on buffers
// of their own. The weight gradients accumulate, which OpenBLAS does without a zeroing pass: what is timed is the
// GEMMs' own work. (They grow step by step, by small values: no overflow, no denormals in 10^5 steps.)
class GemmsAlone {
 public:
  GemmsAlone(const MlpConfig& m, int batch) : batch_(batch), dims_{m.input_dim} {
    for (int i = 0; i < m.num_hidden_layers; ++i) dims_.push_back(m.hidden_dim);
    dims_.push_back(m.num_classes);
    for (size_t l = 0; l < dims_.size(); ++l) act_.push_back(bench::random_vector(size_t(batch_) * dims_[l], 1 + l));
    for (size_t l = 0; l + 1 < dims_.size(); ++l) {
      w_.push_back(bench::random_vector(size_t(dims_[l + 1]) * dims_[l], 20 + l, 0.03));
      dw_.emplace_back(w_.back().size());
    }
    dout_ = bench::random_vector(size_t(batch_) * *std::max_element(dims_.begin(), dims_.end()), 40);
    dinp_.resize(dout_.size());
  }
  double forward_ms() {
    const double start = now_ms();
    for (size_t l = 0; l + 1 < dims_.size(); ++l)
      cpu::matmul_forward(act_[l + 1].data(), act_[l].data(), w_[l].data(), batch_, dims_[l], dims_[l + 1]);
    return now_ms() - start;
  }
  double flops() const {  // forward and weight gradients at every layer, input gradients above the first
    double total = 0;
    for (size_t l = 0; l + 1 < dims_.size(); ++l) total += 2.0 * batch_ * dims_[l] * dims_[l + 1] * (l > 0 ? 3 : 2);
    return total;
  }
  double backward_ms() {
    const double start = now_ms();
    for (int l = static_cast<int>(dims_.size()) - 2; l >= 0; --l) {
      // Accumulating (GEMM beta 1): told to overwrite (beta 0), OpenBLAS first zeroes the output in a pass of its own,
      // which is not GEMM work (the step with the update in backward avoids it: train/cpu_backend.h).
      cpu::matmul_backward_weight(dw_[l].data(), dout_.data(), act_[l].data(), batch_, dims_[l], dims_[l + 1], 0,
                                  dims_[l + 1], /*accumulate=*/true);
      if (l > 0) cpu::matmul_backward_input(dinp_.data(), dout_.data(), w_[l].data(), batch_, dims_[l], dims_[l + 1]);
    }
    return now_ms() - start;
  }

 private:
  int batch_;
  std::vector<int> dims_;
  std::vector<std::vector<float>> act_, w_, dw_;
  std::vector<float> dout_, dinp_;
};

// One variant of the step: its times, step by step after the first five.
struct Series {
  explicit Series(const char* n) : name(n) {}
  void add(const StepRecord& r, double gemms_ms) {
    step_ms.push_back(r.step_ms);
    ratio.push_back(r.step_ms / gemms_ms);
    data_ms.push_back(r.data_ms);
    forward_ms.push_back(r.forward_ms);
    backward_ms.push_back(r.backward_ms);
    exposed_ms.push_back(r.exposed_comm_ms);
    optimizer_ms.push_back(r.optimizer_ms);
  }
  const char* name;
  TrainConfig config;
  std::vector<double> step_ms, ratio, data_ms, forward_ms, backward_ms, exposed_ms, optimizer_ms;
};

struct GemmTimes {
  std::vector<double> forward_ms, backward_ms;
  double flops = 0;
};

// The step with the update after backward, the step with the update in backward (on the core the one BLAS thread
// leaves idle: what --optimizer-in-backward auto picks here), then the GEMMs alone, in turn: on a shared machine all
// three see the same moments of contention, and the ratios are taken within each triple.
GemmTimes run_in_turn(TrainConfig config, Series (&series)[2]) {
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int k = 0; k < 2; ++k) {
    config.optimizer_in_backward = k == 0 ? OnOff::kOff : OnOff::kOn;
    series[k].config = config;
    trainers.push_back(std::make_unique<Trainer>(config, MPI_COMM_SELF));
  }
  GemmTimes gemm;
  GemmsAlone gemms(config.mlp, config.batch);
  const double t0 = now_ms();
  for (int s = 0; s < config.steps; ++s) {
    const StepRecord r[2] = {trainers[0]->step(s, t0), trainers[1]->step(s, t0)};
    const double f = gemms.forward_ms(), b = gemms.backward_ms();
    if (s < 5) continue;  // first steps: page faults, BLAS buffers, the loader starting
    gemm.forward_ms.push_back(f);
    gemm.backward_ms.push_back(b);
    for (int k = 0; k < 2; ++k) series[k].add(r[k], f + b);
  }
  gemm.flops = gemms.flops();
  return gemm;
}

void print_results(const TrainConfig& config, int timed_steps, const GemmTimes& gemm, const Series (&series)[2]) {
  std::printf(
      "# bench_step: MLP %d-%dx%d-%d, batch %d, ws=1, 1 BLAS thread, %d loader threads, medians of %d; OpenBLAS "
      "kernels %s\n",
      config.mlp.input_dim, config.mlp.hidden_dim, config.mlp.num_hidden_layers, config.mlp.num_classes, config.batch,
      config.loader_threads, timed_steps, blas::kernels_in_use().describe().c_str());
  const double gemm_ms = median(gemm.forward_ms) + median(gemm.backward_ms);
  const double gemm_gflops = gemm.flops / gemm_ms / 1e6;
  std::printf("%-34s %9.3f ms  (forward %.3f, backward %.3f)  %.1f GFLOP/s", "GEMMs alone (same shapes, calls)",
              gemm_ms, median(gemm.forward_ms), median(gemm.backward_ms), gemm_gflops);
  const blas::Rates alternatives = blas::measure_alternatives();
  if (const blas::CoreRate best = blas::fastest(alternatives); best.gflops > 0)
    std::printf(", %.0f%% of the best kernels (%s GFLOP/s at one layer's shapes, each family in a child)",
                100 * gemm_gflops / best.gflops, blas::list_rates(alternatives).c_str());
  std::printf("\n");
  for (const Series& x : series) {
    std::printf("step, %-28s %9.3f ms  step / GEMMs %.3f (median of the triples' ratios; target <= 1.08)\n", x.name,
                median(x.step_ms), median(x.ratio));
    std::printf("  --grad-slice-mb %g\n", resolved_grad_slice_mb(x.config));
    std::printf("  parts (ms): data %.3f  forward %.3f  backward %.3f  exposed comm %.3f  optimizer %.3f\n",
                median(x.data_ms), median(x.forward_ms), median(x.backward_ms), median(x.exposed_ms),
                median(x.optimizer_ms));
  }
}

}  // namespace

int main(int argc, char** argv) {
  blas::select_kernels(argc, argv);  // the kernels ddplab runs here (and this program is also the probe's child)
  int steps = 40, batch = 128;
  double grad_slice_mb = kAutoGradSliceMb;
  int loader_threads = 0;
  CLI::App app{"the ws=1 training step of the default MLP against its GEMMs alone (one thread)"};
  app.add_option("--steps", steps, "timed steps (after 5 untimed)")
      ->capture_default_str()
      ->check(CLI::Range(3, 100000));
  app.add_option("--batch", batch, "rows per batch")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--grad-slice-mb", grad_slice_mb,
                 "the steps' --grad-slice-mb (default: what auto picks for each; the GEMMs alone keep whole weights)")
      ->check(CLI::Range(0.0, 1024.0));
  app.add_option("--loader-threads", loader_threads, "the steps' --loader-threads (0: batches made in the step)")
      ->capture_default_str()
      ->check(CLI::Range(0, 8));
  if (const auto code = bench::parse_command_line(app, argc, argv, "bench_step")) return *code;
  MPI_Init(&argc, &argv);
  openblas_set_num_threads(1);
  TrainConfig config;  // the defaults: MLP 1024-1024x2-1000, AdamW, ring (no peer at ws=1)
  config.batch = batch;
  config.blas_threads = 1;
  config.grad_slice_mb = grad_slice_mb;
  config.loader_threads = loader_threads;
  config.steps = steps + 5;
  Series series[2] = {Series("update after backward"), Series("update in backward")};
  const GemmTimes gemm = run_in_turn(config, series);
  print_results(config, steps, gemm, series);
  MPI_Finalize();
  return 0;
}
