// bench_mlp_cuda: the training step of MlpCuda (zero_grad + forward + backward + AdamW) on the default MLP
// 1024-1024x2-1000 at batch 128, 512 and 2048 in fp32, tf32 and bf16.
//
// Steps run back to back, as in training (the host enqueues ahead; nothing syncs between steps), with an event at
// every phase boundary. A step's time runs from its first event to the next step's, so GPU time lost waiting for the
// host's launches counts. Each figure is the median over --steps steps after --warmup (plans, clocks).
// TFLOP/s counts the conventional 6 * parameters * batch per step (forward 2PB, backward 4PB), the figure PyTorch
// comparisons use; the first layer's input gradient is never computed, so the GEMMs really do 2 * 1024 * 1024 *
// batch (11%) less.
//
//   bench_mlp_cuda [--steps 50] [--warmup 10] [--batch N] [--precision fp32|tf32|bf16] [--csv out.csv]
// --batch and --precision restrict the sweep to one value (e.g. to profile one configuration with nsys or ncu).
// Needs a GPU; exits 2 with the reason without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "model/mlp_cuda.h"
#include "model/optimizer.h"
#include "model/precision.h"

namespace {

using ddplab::Precision;
namespace cuda = ddplab::cuda;

struct Options {
  int steps = 50, warmup = 10;
  std::vector<int> batches = {128, 512, 2048};
  std::vector<Precision> precisions = {Precision::kFp32, Precision::kTf32, Precision::kBf16};
  std::string csv;
};

struct Result {
  Precision precision;
  int batch;
  double step_ms, forward_ms, backward_ms, optimizer_ms, tflops;
};

double median(std::vector<double> v) {
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

Result run(const Options& opt, Precision precision, int batch, cudaStream_t s) {
  const ddplab::MlpConfig config;  // the default MLP
  const ddplab::OptimizerConfig adamw;
  ddplab::MlpCuda model(config, 1, precision, batch, s);
  const int64_t n = model.num_parameters();

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(batch) * config.input_dim);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> y(batch);
  for (int32_t& t : y) t = static_cast<int32_t>(rng() % config.num_classes);
  float* d_x = upload(x, s);
  int32_t* d_y = upload(y, s);
  float* moments = upload(std::vector<float>(2 * n, 0.0f), s);  // AdamW's m and v

  const int total = opt.warmup + opt.steps;
  std::vector<cudaEvent_t> ev(4 * total + 1);  // step i: start, forward done, backward done, optimizer done
  for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
  for (int i = 0; i < total; ++i) {
    cudaCheck(cudaEventRecord(ev[4 * i], s));
    model.zero_grad();
    model.forward(d_x, d_y, batch);
    cudaCheck(cudaEventRecord(ev[4 * i + 1], s));
    model.backward();
    cudaCheck(cudaEventRecord(ev[4 * i + 2], s));
    cuda::adamw_update(model.flat_params(), model.flat_grads(), moments, moments + n, n, adamw.lr, adamw.beta1,
                       adamw.beta2, adamw.eps, adamw.weight_decay, i + 1, s);
    cudaCheck(cudaEventRecord(ev[4 * i + 3], s));
  }
  cudaCheck(cudaEventRecord(ev[4 * total], s));
  cudaCheck(cudaEventSynchronize(ev[4 * total]));
  const auto ms = [&](int a, int b) {
    float t = 0;
    cudaCheck(cudaEventElapsedTime(&t, ev[a], ev[b]));
    return static_cast<double>(t);
  };
  std::vector<double> step, fwd, bwd, optim;
  for (int i = opt.warmup; i < total; ++i) {
    step.push_back(ms(4 * i, 4 * i + 4));
    fwd.push_back(ms(4 * i, 4 * i + 1));
    bwd.push_back(ms(4 * i + 1, 4 * i + 2));
    optim.push_back(ms(4 * i + 2, 4 * i + 3));
  }
  if (!std::isfinite(model.loss())) throw std::runtime_error("non-finite loss");
  for (cudaEvent_t e : ev) cudaCheck(cudaEventDestroy(e));
  cudaCheck(cudaFree(d_x));
  cudaCheck(cudaFree(d_y));
  cudaCheck(cudaFree(moments));

  Result r{precision, batch, median(step), median(fwd), median(bwd), median(optim), 0};
  r.tflops = 6.0 * n * batch / (r.step_ms * 1e-3) / 1e12;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--steps" && has_value) {
      opt.steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has_value) {
      opt.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--batch" && has_value && std::atoi(argv[i + 1]) > 0) {
      opt.batches = {std::atoi(argv[++i])};
    } else if (a == "--precision" && has_value) {
      try {
        opt.precisions = {ddplab::parse_precision(argv[++i])};
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 2;
      }
    } else if (a == "--csv" && has_value) {
      opt.csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--warmup N] [--batch N] [--precision fp32|tf32|bf16] [--csv FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  const cuda::CudaInfo info = cuda::query_cuda();
  std::printf("device: %s\n", cuda::describe(info).c_str());
  if (!info.available) {
    std::fprintf(stderr, "bench_mlp_cuda: needs a GPU: %s\n", info.reason.c_str());
    return 2;
  }
  try {
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::printf(
        "MLP 1024-1024x2-1000, AdamW; median of %d steps after %d warm-up; TFLOP/s = 6 * params * batch / step\n",
        opt.steps, opt.warmup);
    std::printf("%-9s %6s %9s %9s %9s %9s %8s\n", "precision", "batch", "step ms", "fwd ms", "bwd ms", "adamw ms",
                "TFLOP/s");
    std::vector<Result> results;
    for (Precision p : opt.precisions) {
      for (int batch : opt.batches) {
        const Result r = run(opt, p, batch, s);
        std::printf("%-9s %6d %9.4f %9.4f %9.4f %9.4f %8.1f\n", ddplab::precision_name(p), batch, r.step_ms,
                    r.forward_ms, r.backward_ms, r.optimizer_ms, r.tflops);
        results.push_back(r);
      }
    }
    cudaCheck(cudaStreamDestroy(s));
    if (!opt.csv.empty()) {
      FILE* f = std::fopen(opt.csv.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + opt.csv);
      std::fprintf(f, "precision,batch,step_ms,forward_ms,backward_ms,optimizer_ms,tflop_per_s\n");
      for (const Result& r : results)
        std::fprintf(f, "%s,%d,%.6f,%.6f,%.6f,%.6f,%.3f\n", ddplab::precision_name(r.precision), r.batch, r.step_ms,
                     r.forward_ms, r.backward_ms, r.optimizer_ms, r.tflops);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_mlp_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
