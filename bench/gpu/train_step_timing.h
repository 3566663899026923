// Shared by the GPU model benchmarks (bench_mlp_cuda, bench_transformer_cuda): a model's training step (zero_grad +
// forward + backward + AdamW) timed with events, and the command line's checks they have in common.
//
// Steps run back to back, as in training (the host enqueues ahead; nothing syncs between steps), with an event at
// every phase boundary. A step's time runs from its first event to the next step's, so GPU time lost waiting for the
// host's launches counts. Each figure is the median over the timed steps after the warm-up ones (plans, clocks).
#pragma once
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "model/optimizer.h"
#include "model/precision.h"

namespace ddplab::bench {

// Medians over the timed steps, in ms.
struct StepTimes {
  double step_ms, forward_ms, backward_ms, optimizer_ms;
};

inline double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// On the stream the model runs on (a non-blocking one: cudaMemcpy's legacy stream would not order it).
template <typename T>
T* upload(const std::vector<T>& host, cudaStream_t s) {
  T* d = nullptr;
  cudaCheck(cudaMalloc(&d, host.size() * sizeof(T)));
  cudaCheck(cudaMemcpyAsync(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  cudaCheck(cudaStreamSynchronize(s));  // `host` may be a temporary
  return d;
}

// `warmup` + `steps` training steps of `model` on stream `s`, AdamW (PyTorch's defaults) from zero moments;
// `forward()` runs the model's forward on its batch. Throws if the last loss is not finite. profile: the timed steps
// between cudaProfilerStart and cudaProfilerStop, each called with the stream idle (a synchronize first), for
// `ncu --profile-from-start off` and a trace whose window is the host's time (bench/gpu/gpu_trace.cpp): without the
// synchronize the host, steps ahead, would open and close the window on earlier steps' kernels.
template <class Model, class Forward>
StepTimes time_training_steps(Model& model, Forward forward, int warmup, int steps, cudaStream_t s,
                              bool profile = false) {
  const OptimizerConfig adamw;
  const int64_t n = model.flat_size();
  float* moments = upload(std::vector<float>(2 * n, 0.0f), s);  // AdamW's m and v

  const int total = warmup + steps;
  std::vector<cudaEvent_t> ev(4 * total + 1);  // step i: start, forward done, backward done, optimizer done
  for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
  for (int i = 0; i < total; ++i) {
    if (profile && i == warmup) {
      cudaCheck(cudaStreamSynchronize(s));
      cudaCheck(cudaProfilerStart());
    }
    cudaCheck(cudaEventRecord(ev[4 * i], s));
    model.zero_grad();
    forward();
    cudaCheck(cudaEventRecord(ev[4 * i + 1], s));
    model.backward();
    cudaCheck(cudaEventRecord(ev[4 * i + 2], s));
    const auto target = model.params_for_update();  // and the bf16 copy of a bf16 model, in the same pass
    cuda::adamw_update(target.params, target.params_bf16, model.flat_grads(), moments, moments + n, n, adamw.lr,
                       adamw.beta1, adamw.beta2, adamw.eps, adamw.weight_decay, i + 1, s);
    cudaCheck(cudaEventRecord(ev[4 * i + 3], s));
  }
  cudaCheck(cudaEventRecord(ev[4 * total], s));  // the last step's end, before any synchronize
  cudaCheck(cudaEventSynchronize(ev[4 * total]));
  if (profile) cudaCheck(cudaProfilerStop());
  const auto ms = [&](int a, int b) {
    float t = 0;
    cudaCheck(cudaEventElapsedTime(&t, ev[a], ev[b]));
    return static_cast<double>(t);
  };
  std::vector<double> step, fwd, bwd, optim;
  for (int i = warmup; i < total; ++i) {
    step.push_back(ms(4 * i, 4 * i + 4));
    fwd.push_back(ms(4 * i, 4 * i + 1));
    bwd.push_back(ms(4 * i + 1, 4 * i + 2));
    optim.push_back(ms(4 * i + 2, 4 * i + 3));
  }
  if (!std::isfinite(model.loss())) throw std::runtime_error("non-finite loss");
  for (cudaEvent_t e : ev) cudaCheck(cudaEventDestroy(e));
  cudaCheck(cudaFree(moments));
  return {median(step), median(fwd), median(bwd), median(optim)};
}

// The flags both model benchmarks take (steps, warm-up, one precision instead of all three, a CSV file), on a
// CLI11 app that adds its own. Parses; returns -1 to go on, else the exit code: 0 after --help, 2 on a bad flag.
struct StepFlags {
  int steps, warmup;
  std::string precision;  // "": fp32, tf32 and bf16
  std::string csv;
  bool profile = false;  // the timed steps between cudaProfilerStart and cudaProfilerStop
  std::vector<Precision> precisions() const {
    if (precision.empty()) return {Precision::kFp32, Precision::kTf32, Precision::kBf16};
    return {parse_choice<Precision>(precision, "precision")};
  }
};
inline void add_step_flags(CLI::App& app, StepFlags& flags) {
  app.add_option("--steps", flags.steps, "timed steps")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--warmup", flags.warmup, "steps before timing")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--precision", flags.precision, "one of fp32, tf32, bf16 (default: all three)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--csv", flags.csv, "also write the table to this CSV file");
  app.add_flag("--profile", flags.profile,
               "only the timed steps between cudaProfilerStart/Stop, the stream idle at both (ncu "
               "--profile-from-start off, nsys --capture-range=cudaProfilerApi)");
}
inline int parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the help or the error
    return code == 0 ? 0 : 2;
  }
}

// Prints the device line every benchmark starts with; false, with the reason on stderr, where there is no GPU.
inline bool report_device(const char* bench) {
  const cuda::CudaInfo info = cuda::query_cuda();
  std::printf("device: %s\n", cuda::describe(info).c_str());
  if (info.available) return true;
  std::fprintf(stderr, "%s: needs a GPU: %s\n", bench, info.reason.c_str());
  return false;
}

}  // namespace ddplab::bench
