// Shared by the GPU model benchmarks (bench_mlp_cuda, bench_transformer_cuda): a model's training step (the gradients
// discarded, forward + backward + AdamW, as the trainer runs it) timed with events, and the command line's checks they
// have in common.
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
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "analysis/stats.h"
#include "bench/gpu/bench_device.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_algo_table.h"
#include "model/optimizer.h"
#include "model/precision.h"

namespace ddplab::bench {

// Medians over the timed steps, in ms. graph_step_ms: the same step replayed as one CUDA graph (--graph), NaN where
// not asked or not captured (graph_error says why).
struct StepTimes {
  double step_ms, forward_ms, backward_ms, optimizer_ms;
  double graph_step_ms = std::numeric_limits<double>::quiet_NaN();
  std::string graph_error;
  std::string gemm_algos;  // how the GEMMs picked their algorithms (GemmContext::describe_algos)
};

// On the stream the model runs on (a non-blocking one: cudaMemcpy's legacy stream would not order it).
template <typename T>
T* upload(const std::vector<T>& host, cudaStream_t s) {
  T* d = nullptr;
  cudaCheck(cudaMalloc(&d, host.size() * sizeof(T)));
  cudaCheck(cudaMemcpyAsync(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  cudaCheck(cudaStreamSynchronize(s));  // `host` may be a temporary
  return d;
}

// enqueue() captured on `s` into a CUDA graph, launched once (the upload), then `launches` times back to back, each
// launch's time from its event to the next one's into `ms`. "" on success, else why the capture or the graph failed
// (a library call that cannot be captured); the stream is usable either way.
template <class Enqueue>
std::string replay_as_graph(cudaStream_t s, int launches, Enqueue enqueue, std::vector<double>& ms) {
  cudaCheck(cudaStreamSynchronize(s));
  // Relaxed: a library's host calls during the capture (a handle's stream, a function attribute) are not refused.
  if (const cudaError_t begun = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed); begun != cudaSuccess)
    return std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(begun);
  std::string error;
  try {
    enqueue();
  } catch (const std::exception& e) {
    error = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (error.empty() && ended != cudaSuccess) error = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
  cudaGraphExec_t exec = nullptr;
  if (error.empty())
    if (const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0); made != cudaSuccess)
      error = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(made);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture's error is not sticky: clear it
  if (!error.empty()) return error;
  std::vector<cudaEvent_t> ev(launches + 1);
  for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
  cudaCheck(cudaGraphLaunch(exec, s));
  for (int i = 0; i < launches; ++i) {
    cudaCheck(cudaEventRecord(ev[i], s));
    cudaCheck(cudaGraphLaunch(exec, s));
  }
  cudaCheck(cudaEventRecord(ev[launches], s));
  cudaCheck(cudaEventSynchronize(ev[launches]));
  for (int i = 0; i < launches; ++i) {
    float t = 0;
    cudaCheck(cudaEventElapsedTime(&t, ev[i], ev[i + 1]));
    ms.push_back(t);
  }
  for (cudaEvent_t e : ev) cudaCheck(cudaEventDestroy(e));
  cudaCheck(cudaGraphExecDestroy(exec));
  return "";
}

// The flags both model benchmarks take (steps, warm-up, one precision instead of all three, a CSV file, the profile
// and graph modes, the GEMMs' algorithms); add_step_flags declares them on a CLI11 app that adds its own.
struct StepFlags {
  int steps, warmup;
  std::string precision;  // "": fp32, tf32 and bf16
  std::string csv;
  bool profile = false;             // the timed steps between cudaProfilerStart and cudaProfilerStop
  bool graph = false;               // also the step as one CUDA graph
  std::string gemm_algo = "timed";  // as ddplab train's --gemm-algo
  float grad_clip = 0;              // as ddplab train's --grad-clip: the norm first, its factor read by the update
  std::vector<Precision> precisions() const {
    if (precision.empty()) return {Precision::kFp32, Precision::kTf32, Precision::kBf16};
    return {parse_choice<Precision>(precision, "precision")};
  }
};
// flags.warmup + flags.steps training steps of `model` on stream `s`, AdamW (PyTorch's defaults) from zero moments,
// its GEMMs picking their algorithms as flags.gemm_algo says; `forward()` runs the model's forward on its batch. Throws
// if the last loss is not finite. profile: the timed steps between cudaProfilerStart and cudaProfilerStop, each called
// with the stream idle (a synchronize first), for `ncu --profile-from-start off` and a trace whose window is the host's
// time (bench/gpu/gpu_trace.cpp): without the synchronize the host, steps ahead, would open and close the window on
// earlier steps' kernels.
//
// graph: then the step captured once into a CUDA graph (after the timed steps: every plan made, every workspace
// grown) and replayed `steps` times, each launch between two events: the step without the host's launches, whose
// cost is the difference. One more step on the stream afterwards re-records what the capture held (the loss's event).
template <class Model, class Forward>
StepTimes time_training_steps(Model& model, Forward forward, const StepFlags& flags, cudaStream_t s) {
  const int warmup = flags.warmup, steps = flags.steps;
  const bool profile = flags.profile, graph = flags.graph;
  const OptimizerConfig adamw;
  model.gemm().set_timed_algos(flags.gemm_algo == "timed", cuda::GemmAlgoTable::default_dir());
  const int64_t n = model.flat_size();
  float* moments = upload(std::vector<float>(2 * n, 0.0f), s);  // AdamW's m and v
  // --grad-clip: the norm's workspace, and the norm with its factor.
  void* norm_workspace = nullptr;
  cuda::ClippedNorm* clipped = nullptr;
  if (flags.grad_clip > 0) {
    cudaCheck(cudaMalloc(&norm_workspace, cuda::grad_norm_workspace_bytes()));
    cudaCheck(cudaMalloc(&clipped, sizeof(cuda::ClippedNorm)));
  }
  // One step, the t-th update; mark(k) after its k-th phase (1 forward, 2 backward, 3 the update).
  const auto enqueue_step = [&](int t, const auto& mark) {
    model.discard_grad();  // backward writes the gradients over: no pass zeroes them
    forward();
    mark(1);
    model.backward();
    mark(2);
    const auto target = model.params_for_update();  // and the bf16 copy of a bf16 model, in the same pass
    if (clipped) cuda::grad_norm(model.flat_grads(), n, flags.grad_clip, clipped, norm_workspace, s);
    cuda::adamw_update(target.params, target.params_bf16, model.flat_grads(), moments, moments + n, n, adamw.lr,
                       adamw.beta1, adamw.beta2, adamw.eps, adamw.weight_decay, t, s, nullptr,
                       clipped ? &clipped->scale : nullptr);
    mark(3);
  };

  const int total = warmup + steps;
  std::vector<cudaEvent_t> ev(4 * total + 1);  // step i: start, forward done, backward done, optimizer done
  for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
  for (int i = 0; i < total; ++i) {
    if (profile && i == warmup) {
      cudaCheck(cudaStreamSynchronize(s));
      cudaCheck(cudaProfilerStart());
    }
    cudaCheck(cudaEventRecord(ev[4 * i], s));
    enqueue_step(i + 1, [&](int phase) { cudaCheck(cudaEventRecord(ev[4 * i + phase], s)); });
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
  StepTimes times{median(step),
                  median(fwd),
                  median(bwd),
                  median(optim),
                  std::numeric_limits<double>::quiet_NaN(),
                  "",
                  model.gemm().describe_algos()};
  if (graph) {
    std::vector<double> replayed;
    times.graph_error = replay_as_graph(s, steps, [&] { enqueue_step(total + 1, [](int) {}); }, replayed);
    if (times.graph_error.empty()) times.graph_step_ms = median(replayed);
    enqueue_step(total + 1, [](int) {});
  }
  if (!std::isfinite(model.loss())) throw std::runtime_error("non-finite loss");
  for (cudaEvent_t e : ev) cudaCheck(cudaEventDestroy(e));
  cudaCheck(cudaFree(moments));
  cudaCheck(cudaFree(norm_workspace));
  cudaCheck(cudaFree(clipped));
  return times;
}

// The lines under a step's row: how its GEMMs picked their algorithms, and with --graph the step as one CUDA graph
// beside the stream's, or why it was not captured.
inline void print_step_notes(const StepTimes& t) {
  std::printf("  GEMM algorithms: %s\n", t.gemm_algos.c_str());
  if (!t.graph_error.empty())
    std::printf("  as one CUDA graph: not captured: %s\n", t.graph_error.c_str());
  else if (std::isfinite(t.graph_step_ms))
    std::printf("  as one CUDA graph: %.3f ms per step against the stream's %.3f: the host's launches cost %+.3f ms\n",
                t.graph_step_ms, t.step_ms, t.step_ms - t.graph_step_ms);
}

inline void add_step_flags(CLI::App& app, StepFlags& flags) {
  app.add_option("--steps", flags.steps, "timed steps")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--warmup", flags.warmup, "steps before timing")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  app.add_option("--precision", flags.precision, "one of fp32, tf32, bf16 (default: all three)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--csv", flags.csv, "also write the table to this CSV file");
  app.add_flag("--graph", flags.graph,
               "also replay the step captured as one CUDA graph: what the host's launches cost it");
  app.add_option("--gemm-algo", flags.gemm_algo,
                 "heuristic (cuBLASLt's first answer) | timed (the fastest of its first 8, kept in the host's cache), "
                 "as ddplab train's")
      ->check(CLI::IsMember({"heuristic", "timed"}))
      ->capture_default_str();
  app.add_option("--grad-clip", flags.grad_clip,
                 "as ddplab train's: the gradients' global norm before each update, the update clipping by it "
                 "(llm.c's step takes it; 0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--profile", flags.profile,
               "only the timed steps between cudaProfilerStart/Stop, the stream idle at both (ncu "
               "--profile-from-start off, nsys --capture-range=cudaProfilerApi)");
}
}  // namespace ddplab::bench
