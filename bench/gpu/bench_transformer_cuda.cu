// bench_transformer_cuda: the training step of TransformerCuda (zero_grad + forward + backward + AdamW) on the
// gpt2-small preset (GPT-2 124M's shapes plus an untied LM head with bias: 163M parameters, docs/TRANSFORMER.md),
// full-length sequences of 1024 tokens, batch 8, in fp32, tf32 and bf16.
//
// Steps run back to back, as in training (the host enqueues ahead; nothing syncs between steps), with an event at
// every phase boundary; a step's time runs from its first event to the next step's, so GPU time lost waiting for the
// host counts. Each figure is the median over --steps steps after --warmup. Reported per step: time and its forward,
// backward and AdamW parts, tokens/s, TFLOP/s = 3 x TransformerConfig::flops_per_token(S) x tokens / step (the
// counted FLOPs: every Linear, the attention square including the causal half the kernels compute anyway, the LM
// head; not embeddings, LayerNorm, GELU, softmax), and MFU = that over the dense bf16 peak of an H100 SXM, 989
// TFLOP/s (the H200 has the same tensor cores and clocks, so the same peak), whatever the precision.
//
//   bench_transformer_cuda [--steps 10] [--warmup 3] [--model gpt2-small] [--batch 8] [--seq 1024]
//                          [--precision fp32|tf32|bf16] [--csv out.csv]
// --precision restricts the sweep to one (e.g. to profile it with nsys or ncu). Needs a GPU; exits 2 with the
// reason without one.
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
#include "model/optimizer.h"
#include "model/precision.h"
#include "model/transformer_cuda.h"

namespace {

using ddplab::Precision;
namespace cuda = ddplab::cuda;

constexpr double kPeakBf16DenseTflops = 989.0;  // H100 SXM (and H200), dense bf16 tensor cores

struct Options {
  int steps = 10, warmup = 3, batch = 8, seq = 1024;
  std::string model = "gpt2-small";
  std::vector<Precision> precisions = {Precision::kFp32, Precision::kTf32, Precision::kBf16};
  std::string csv;
};

struct Result {
  Precision precision;
  double step_ms, forward_ms, backward_ms, optimizer_ms, tokens_per_s, tflops, mfu;
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

Result run(const Options& opt, Precision precision, cudaStream_t s) {
  const ddplab::TransformerConfig config = ddplab::TransformerConfig::preset(opt.model);
  const ddplab::OptimizerConfig adamw;
  const int B = opt.batch, S = opt.seq;
  ddplab::TransformerCuda model(config, 1, precision, int64_t{B} * S, S, s);
  const int64_t n = model.num_parameters();

  std::mt19937 rng(7);
  std::vector<int32_t> tokens(int64_t{B} * S), labels(B);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % config.vocab);
  for (int32_t& t : labels) t = static_cast<int32_t>(rng() % config.num_classes);  // the classifier's targets
  int32_t* d_tokens = upload(tokens, s);
  int32_t* d_labels = upload(labels, s);
  float* moments = upload(std::vector<float>(2 * n, 0.0f), s);  // AdamW's m and v

  const int total = opt.warmup + opt.steps;
  std::vector<cudaEvent_t> ev(4 * total + 1);  // step i: start, forward done, backward done, optimizer done
  for (cudaEvent_t& e : ev) cudaCheck(cudaEventCreate(&e));
  for (int i = 0; i < total; ++i) {
    cudaCheck(cudaEventRecord(ev[4 * i], s));
    model.zero_grad();
    model.forward(d_tokens, nullptr, d_labels, B, S);  // null lengths: every sequence is S long
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
  cudaCheck(cudaFree(d_tokens));
  cudaCheck(cudaFree(d_labels));
  cudaCheck(cudaFree(moments));

  Result r{precision, median(step), median(fwd), median(bwd), median(optim), 0, 0, 0};
  const double tokens_per_step = static_cast<double>(B) * S;
  r.tokens_per_s = tokens_per_step / (r.step_ms * 1e-3);
  r.tflops = 3.0 * config.flops_per_token(S) * r.tokens_per_s / 1e12;
  r.mfu = r.tflops / kPeakBf16DenseTflops;
  return r;
}

int positive(const char* text) { return std::max(1, std::atoi(text)); }

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--steps" && has_value) {
      opt.steps = positive(argv[++i]);
    } else if (a == "--warmup" && has_value) {
      opt.warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--batch" && has_value) {
      opt.batch = positive(argv[++i]);
    } else if (a == "--seq" && has_value) {
      opt.seq = positive(argv[++i]);
    } else if (a == "--model" && has_value) {
      opt.model = argv[++i];
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
      std::fprintf(stderr,
                   "usage: %s [--steps N] [--warmup N] [--model PRESET] [--batch N] [--seq N] "
                   "[--precision fp32|tf32|bf16] [--csv FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  const cuda::CudaInfo info = cuda::query_cuda();
  std::printf("device: %s\n", cuda::describe(info).c_str());
  if (!info.available) {
    std::fprintf(stderr, "bench_transformer_cuda: needs a GPU: %s\n", info.reason.c_str());
    return 2;
  }
  try {
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const ddplab::TransformerConfig config = ddplab::TransformerConfig::preset(opt.model);
    std::printf(
        "transformer %s (%d layers, d_model %d, %d heads, vocab %d), batch %d x %d tokens, AdamW; median of %d steps "
        "after %d warm-up\nTFLOP/s = 3 x %.4g FLOP/token x tokens/s; MFU against %.0f TFLOP/s (dense bf16, "
        "H100/H200 SXM)\n",
        opt.model.c_str(), config.layers, config.d_model, config.heads, config.vocab, opt.batch, opt.seq, opt.steps,
        opt.warmup, config.flops_per_token(opt.seq), kPeakBf16DenseTflops);
    std::printf("%-9s %9s %9s %9s %9s %10s %8s %6s\n", "precision", "step ms", "fwd ms", "bwd ms", "adamw ms",
                "tokens/s", "TFLOP/s", "MFU");
    std::vector<Result> results;
    for (Precision p : opt.precisions) {
      const Result r = run(opt, p, s);
      std::printf("%-9s %9.3f %9.3f %9.3f %9.3f %10.0f %8.1f %5.1f%%\n", ddplab::precision_name(p), r.step_ms,
                  r.forward_ms, r.backward_ms, r.optimizer_ms, r.tokens_per_s, r.tflops, 100 * r.mfu);
      results.push_back(r);
    }
    cudaCheck(cudaStreamDestroy(s));
    if (!opt.csv.empty()) {
      FILE* f = std::fopen(opt.csv.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + opt.csv);
      std::fprintf(f,
                   "model,precision,batch,seq,step_ms,forward_ms,backward_ms,optimizer_ms,tokens_per_s,tflop_per_s,"
                   "mfu\n");
      for (const Result& r : results)
        std::fprintf(f, "%s,%s,%d,%d,%.6f,%.6f,%.6f,%.6f,%.1f,%.3f,%.5f\n", opt.model.c_str(),
                     ddplab::precision_name(r.precision), opt.batch, opt.seq, r.step_ms, r.forward_ms, r.backward_ms,
                     r.optimizer_ms, r.tokens_per_s, r.tflops, r.mfu);
      std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_transformer_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
