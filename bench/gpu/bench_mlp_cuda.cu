// bench_mlp_cuda: the training step of MlpCuda (forward + backward + AdamW) on the default MLP
// 1024-1024x2-1000 at batch 128, 512 and 2048 in fp32, tf32 and bf16, timed as bench/gpu/train_step_timing.h says:
// each figure is the median over --steps steps after --warmup.
// TFLOP/s counts the conventional 6 * parameters * batch per step (forward 2PB, backward 4PB), the figure PyTorch
// comparisons use; the first layer's input gradient is never computed, so the GEMMs really do 2 * 1024 * 1024 *
// batch (11%) less.
//
//   bench_mlp_cuda [--steps 50] [--warmup 10] [--batch N] [--precision fp32|tf32|bf16] [--csv out.csv]
//                  [--profile] [--graph] [--gemm-algo timed|heuristic]
// --batch and --precision restrict the sweep to one value (e.g. to profile one configuration with nsys or ncu);
// --gemm-algo as ddplab train's (bench/gpu/train_step_timing.h).
// Needs a GPU; exits 2 with the reason without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/gpu/train_step_timing.h"
#include "kernels/cuda/check.cuh"
#include "model/mlp_cuda.h"
#include "model/precision.h"

namespace {

using ddplab::Precision;
using ddplab::bench::upload;

struct Options : ddplab::bench::StepFlags {
  Options() : StepFlags{50, 10, "", ""} {}
  std::vector<int> batches = {128, 512, 2048};
};

struct Result {
  Precision precision;
  int batch;
  ddplab::bench::StepTimes t;
  double tflops;
};

Result run(const Options& opt, Precision precision, int batch, cudaStream_t s) {
  const ddplab::MlpConfig config;  // the default MLP
  ddplab::MlpCuda model(config, 1, precision, batch, s);
  const int64_t n = model.flat_size();

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(batch) * config.input_dim);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> y(batch);
  for (int32_t& t : y) t = static_cast<int32_t>(rng() % config.num_classes);
  float* d_x = upload(x, s);
  int32_t* d_y = upload(y, s);
  const auto forward = [&] { model.forward(d_x, d_y, batch); };
  Result r{precision, batch, ddplab::bench::time_training_steps(model, forward, opt, s), 0};
  cudaCheck(cudaFree(d_x));
  cudaCheck(cudaFree(d_y));
  r.tflops = 6.0 * n * batch / (r.t.step_ms * 1e-3) / 1e12;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"MlpCuda's training step (forward + backward + AdamW) on the default MLP"};
  ddplab::bench::add_step_flags(app, opt);
  int one_batch = 0;
  app.add_option("--batch", one_batch, "one batch size (default: 128, 512 and 2048)")->check(CLI::Range(1, 1 << 20));
  if (const auto code = ddplab::bench::parse_command_line(app, argc, argv, "bench_mlp_cuda")) return *code;
  if (one_batch > 0) opt.batches = {one_batch};
  if (const auto code = ddplab::bench::refuse_output("--csv", opt.csv, "bench_mlp_cuda")) return *code;
  if (!ddplab::bench::report_device("bench_mlp_cuda")) return 2;
  try {
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::printf(
        "MLP 1024-1024x2-1000, AdamW; median of %d steps after %d warm-up; TFLOP/s = 6 * params * batch / step\n",
        opt.steps, opt.warmup);
    std::printf("%-9s %6s %9s %9s %9s %9s %8s\n", "precision", "batch", "step ms", "fwd ms", "bwd ms", "adamw ms",
                "TFLOP/s");
    std::vector<Result> results;
    for (Precision p : opt.precisions()) {
      for (int batch : opt.batches) {
        const Result r = run(opt, p, batch, s);
        std::printf("%-9s %6d %9.4f %9.4f %9.4f %9.4f %8.1f\n", ddplab::to_string(p), batch, r.t.step_ms,
                    r.t.forward_ms, r.t.backward_ms, r.t.optimizer_ms, r.tflops);
        ddplab::bench::print_step_notes(r.t);
        results.push_back(r);
      }
    }
    cudaCheck(cudaStreamDestroy(s));
    if (!opt.csv.empty()) {  // whole or not at all (record/files.h), its path checked before the run
      std::string text = "precision,batch,step_ms,forward_ms,backward_ms,optimizer_ms,tflop_per_s,gemm_algo\n";
      char line[256];
      for (const Result& r : results) {
        std::snprintf(line, sizeof line, "%s,%d,%.6f,%.6f,%.6f,%.6f,%.3f,%s\n", ddplab::to_string(r.precision), r.batch,
                      r.t.step_ms, r.t.forward_ms, r.t.backward_ms, r.t.optimizer_ms, r.tflops, opt.gemm_algo.c_str());
        text += line;
      }
      ddplab::write_text_file(opt.csv, text, /*force=*/true);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mlp_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
