// bench_transformer_cuda: the training step of TransformerCuda (forward + backward + AdamW) on the
// gpt2-small preset (GPT-2 124M, the LM head tied to wte: 124.5M parameters, docs/TRANSFORMER.md),
// full-length sequences of 1024 tokens, batch 8, in fp32, tf32 and bf16.
//
// Timed as bench/gpu/train_step_timing.h says: each figure is the median over --steps steps after --warmup. Reported
// per step: time and its forward,
// backward and AdamW parts, tokens/s, TFLOP/s = 3 x TransformerConfig::flops_per_token(S) x tokens / step (the
// counted FLOPs: every Linear, the attention's whole S x S square (PaLM's convention), the LM head; not embeddings,
// LayerNorm, GELU, softmax), and MFU = that over the dense bf16 peak of an H100 SXM, 989 TFLOP/s (the H200 has the
// same tensor cores and clocks, so the same peak), whatever the precision. A causal kernel computes about half the
// square, so MFU is printed by that count too ("MFU causal": llm.c's 6N + 6LCT and FlashAttention's convention).
//
//   bench_transformer_cuda [--steps 10] [--warmup 3] [--model gpt2-small] [--batch 8] [--seq 1024]
//                          [--precision fp32|tf32|bf16] [--attention auto|unfused|fused|cudnn] [--csv out.csv]
//                          [--profile] [--graph] [--gemm-algo timed|heuristic] [--deterministic] [--grad-clip F]
// --precision restricts the sweep to one; --gemm-algo timed (the default, as ddplab train's) runs each GEMM with the
// fastest of cuBLASLt's first 8 answers, timed in the warm-up where the host's cache does not have it yet; --attention
// auto (the default, as ddplab train's) runs cuDNN's attention where it loads, else our fused one
// (kernels/cuda/flash_attention.h), in bf16, and the unfused one otherwise; --deterministic runs as ddplab train's
// --deterministic on (the fused attentions' dQ summed in a fixed order): the price of the same bits every step;
// --grad-clip F takes the gradients' norm before each update, as ddplab train's --grad-clip and llm.c's step do;
// --profile brackets the timed steps with cudaProfilerStart/Stop, to profile them with nsys, ncu or
// bench/gpu/gpu_trace.cpp (bench/device/run.sh 2 ranks one step's kernels that way, and traces 20). Needs a GPU; exits
// 2 with the reason without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/gpu/train_step_timing.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "model/attention_kind.h"
#include "model/precision.h"
#include "model/transformer_cuda.h"

namespace {

using ddplab::Precision;
using ddplab::bench::upload;

constexpr double kPeakBf16DenseTflops = 989.0;  // H100 SXM (and H200), dense bf16 tensor cores

struct Options : ddplab::bench::StepFlags {
  Options() : StepFlags{10, 3, "", ""} {}
  int batch = 8, seq = 1024;
  std::string model = "gpt2-small";
  std::string attention = "auto";
  bool deterministic = false;
};

struct Result {
  Precision precision;
  ddplab::AttentionKind attention;
  ddplab::bench::StepTimes t;
  double tokens_per_s, tflops, mfu, mfu_causal_half;
};

Result run(const Options& opt, Precision precision, cudaStream_t s) {
  const ddplab::TransformerConfig config = ddplab::TransformerConfig::preset(opt.model);
  const int B = opt.batch, S = opt.seq;
  const ddplab::AttentionKind attention =
      opt.attention == "auto" ? ddplab::auto_attention(precision == Precision::kBf16, config.d_model / config.heads,
                                                       ddplab::cuda::cudnn_attention_available())
                              : ddplab::parse_choice<ddplab::AttentionKind>(opt.attention, "attention");
  ddplab::TransformerCuda model(config, 1, precision, int64_t{B} * S, S, s, attention, opt.deterministic);

  std::mt19937 rng(7);
  std::vector<int32_t> tokens(int64_t{B} * S), labels(B);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % config.vocab);
  for (int32_t& t : labels) t = static_cast<int32_t>(rng() % config.num_classes);  // the classifier's targets
  int32_t* d_tokens = upload(tokens, s);
  int32_t* d_labels = upload(labels, s);
  const auto forward = [&] { model.forward(d_tokens, nullptr, d_labels, B, S); };  // null lengths: all S long
  Result r{precision, attention, ddplab::bench::time_training_steps(model, forward, opt, s), 0, 0, 0, 0};
  cudaCheck(cudaFree(d_tokens));
  cudaCheck(cudaFree(d_labels));
  const double tokens_per_step = static_cast<double>(B) * S;
  r.tokens_per_s = tokens_per_step / (r.t.step_ms * 1e-3);
  // Training counts 3x the forward's FLOPs (flops_per_token).
  const auto tflops_counting = [&](ddplab::TransformerConfig::AttentionCount attention) {
    return 3.0 * config.flops_per_token(S, attention) * r.tokens_per_s / 1e12;
  };
  r.tflops = tflops_counting(ddplab::TransformerConfig::AttentionCount::kFullSquare);
  r.mfu = r.tflops / kPeakBf16DenseTflops;
  r.mfu_causal_half = tflops_counting(ddplab::TransformerConfig::AttentionCount::kCausalHalf) / kPeakBf16DenseTflops;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"TransformerCuda's training step (forward + backward + AdamW): tokens/s, TFLOP/s, MFU"};
  ddplab::bench::add_step_flags(app, opt);
  app.add_option("--model", opt.model, "transformer preset")
      ->check(CLI::IsMember({"tiny", "small", "gpt2-small"}))
      ->capture_default_str();
  app.add_option("--batch", opt.batch, "sequences per step")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--seq", opt.seq, "tokens per sequence")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--attention", opt.attention, "auto (as ddplab train's: cudnn, else fused for bf16, else unfused) | unfused | fused | cudnn (bf16 only)")
      ->check(CLI::IsMember({"auto", "unfused", "fused", "cudnn"}))
      ->capture_default_str();
  app.add_flag(
      "--deterministic", opt.deterministic,
      "as ddplab train's --deterministic on: the fused attentions' dQ summed in a fixed order, not by atomics");
  if (const auto code = ddplab::bench::parse_command_line(app, argc, argv, "bench_transformer_cuda")) return *code;
  if ((opt.attention == "fused" || opt.attention == "cudnn") && opt.precision != "bf16") {
    std::fprintf(stderr, "bench_transformer_cuda: --attention %s needs --precision bf16 (its kernels are bf16)\n",
                 opt.attention.c_str());
    return 2;
  }
  if (const auto code = ddplab::bench::refuse_output("--csv", opt.csv, "bench_transformer_cuda")) return *code;
  if (!ddplab::bench::report_device("bench_transformer_cuda")) return 2;
  try {
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const ddplab::TransformerConfig config = ddplab::TransformerConfig::preset(opt.model);
    std::printf(
        "transformer %s (%d layers, d_model %d, %d heads, vocab %d), batch %d x %d tokens, %s attention%s, AdamW%s; "
        "median "
        "of %d steps after %d warm-up\nTFLOP/s = 3 x %.4g FLOP/token x tokens/s (attention's whole square; %.4g "
        "counting its causal half: MFU causal); MFU against %.0f TFLOP/s (dense bf16, H100/H200 SXM)\n",
        opt.model.c_str(), config.layers, config.d_model, config.heads, config.vocab, opt.batch, opt.seq,
        opt.attention.c_str(), opt.deterministic ? " (deterministic)" : "",
        opt.grad_clip > 0 ? " after the gradients' norm (--grad-clip)" : "", opt.steps, opt.warmup,
        config.flops_per_token(opt.seq),
        config.flops_per_token(opt.seq, ddplab::TransformerConfig::AttentionCount::kCausalHalf), kPeakBf16DenseTflops);
    std::printf("%-9s %-9s %9s %9s %9s %9s %10s %8s %6s %11s\n", "precision", "attention", "step ms", "fwd ms",
                "bwd ms", "adamw ms", "tokens/s", "TFLOP/s", "MFU", "MFU causal");
    std::vector<Result> results;
    for (Precision p : opt.precisions()) {
      const Result r = run(opt, p, s);
      std::printf("%-9s %-9s %9.3f %9.3f %9.3f %9.3f %10.0f %8.1f %5.1f%% %10.1f%%\n", ddplab::to_string(p),
                  ddplab::to_string(r.attention), r.t.step_ms, r.t.forward_ms, r.t.backward_ms, r.t.optimizer_ms,
                  r.tokens_per_s, r.tflops, 100 * r.mfu, 100 * r.mfu_causal_half);
      ddplab::bench::print_step_notes(r.t);
      results.push_back(r);
    }
    cudaCheck(cudaStreamDestroy(s));
    if (!opt.csv.empty()) {  // whole or not at all (record/files.h), its path checked before the run
      std::string text =
          "model,precision,attention,batch,seq,step_ms,forward_ms,backward_ms,optimizer_ms,tokens_per_s,tflop_per_s,"
          "mfu,graph_step_ms,gemm_algo,deterministic,grad_clip,mfu_causal_half\n";
      char line[512];
      for (const Result& r : results) {
        std::snprintf(line, sizeof line, "%s,%s,%s,%d,%d,%.6f,%.6f,%.6f,%.6f,%.1f,%.3f,%.5f,%s,%s,%d,%g,%.5f\n",
                      opt.model.c_str(), ddplab::to_string(r.precision), ddplab::to_string(r.attention), opt.batch,
                      opt.seq, r.t.step_ms, r.t.forward_ms, r.t.backward_ms, r.t.optimizer_ms, r.tokens_per_s, r.tflops,
                      r.mfu, std::isfinite(r.t.graph_step_ms) ? std::to_string(r.t.graph_step_ms).c_str() : "",
                      opt.gemm_algo.c_str(), opt.deterministic ? 1 : 0, opt.grad_clip, r.mfu_causal_half);
        text += line;
      }
      ddplab::write_text_file(opt.csv, text, /*force=*/true);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_transformer_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
