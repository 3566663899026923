// A single-GPU run file (`ddplab train --device cuda --comm nccl`, np 1) made up from a measured step's phases and
// GPT-2 small's gradient layout, for testing `ddplab predict` on GPU runs where no GPU is at hand
// (tests/unit/test_predict.cpp; tests/cli/write_synthetic_gpu_run.cpp writes it to a file for tests/cli and the
// docs). Backward order: the LM head's backward first (a share of backward in proportion to its FLOPs), ln_f, the 12
// blocks from the last, then the embeddings: wpe, and wte, whose tied gradient is final only after the embedding
// backward. Within a block, pieces are final in proportion to the matmul FLOPs before them. At np 1 NCCL's all-reduce
// is a few microseconds per bucket.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/reducer.h"
#include "record/run_record.h"

namespace ddplab::fake_runs {

struct GpuPhases {  // a measured step (H200, gpt2-small bf16, batch 8 x 1024: bench/results/2026-11-28-h200-final)
  double forward_ms = 5.518, backward_ms = 10.556, optimizer_ms = 1.182, data_ms = 0.02;
  double head_share = 0.3;  // of backward: the LM head's two GEMMs, 2 x 2 x 8192 x 768 x 50304 of ~4.3 TFLOP
  int batch = 8, seq = 1024;
};

struct GpuPiece {
  std::string name;
  int64_t numel = 0;
  double ready_share = 0;  // of backward, when it is final
};

// GPT-2 small (d 768, 12 blocks, 1024 positions, vocabulary 50304, tied wte) in backward order.
inline std::vector<GpuPiece> gpt2_small_pieces(double head_share) {
  constexpr int64_t d = 768, layers = 12, vocab = 50304, ctx = 1024;
  std::vector<GpuPiece> p;
  p.push_back({"ln_f.bias", d, head_share});
  p.push_back({"ln_f.weight", d, head_share});
  const double block = (1 - head_share) / layers;
  for (int64_t l = layers - 1; l >= 0; --l) {
    const double at = head_share + block * static_cast<double>(layers - 1 - l);
    const std::string h = "h" + std::to_string(l) + ".";
    // Matmul FLOPs per block: fc_proj 4, fc 4, attn proj 1, qkv 3 (of 12).
    p.push_back({h + "mlp.proj.bias", d, at + block * 4 / 12});
    p.push_back({h + "mlp.proj.weight", 4 * d * d, at + block * 4 / 12});
    p.push_back({h + "mlp.fc.bias", 4 * d, at + block * 8 / 12});
    p.push_back({h + "mlp.fc.weight", 4 * d * d, at + block * 8 / 12});
    p.push_back({h + "ln_2.bias", d, at + block * 8 / 12});
    p.push_back({h + "ln_2.weight", d, at + block * 8 / 12});
    p.push_back({h + "attn.proj.bias", d, at + block * 9 / 12});
    p.push_back({h + "attn.proj.weight", d * d, at + block * 9 / 12});
    p.push_back({h + "attn.qkv.bias", 3 * d, at + block});
    p.push_back({h + "attn.qkv.weight", 3 * d * d, at + block});
    p.push_back({h + "ln_1.bias", d, at + block});
    p.push_back({h + "ln_1.weight", d, at + block});
  }
  p.push_back({"wpe", ctx * d, 1.0});
  p.push_back({"wte", vocab * d, 1.0});
  return p;
}

// `steps` steps (the first is warm-up), buckets cut as the CudaReducer cuts them at the given caps.
inline RunRecord synthetic_gpu_run(const GpuPhases& g = {}, int steps = 6, double bucket_mb = 25,
                                   double last_bucket_mb = 1) {
  RunRecord run;
  run.path = "synthetic-gpu.h5";
  run.meta.command = "train";
  run.meta.device = "cuda";
  run.meta.transport = "NCCL";
  run.meta.world_size = 1;
  run.meta.hostnames = {"gpu-node"};
  run.steps = steps;
  run.config = {{"bucket_mb", bucket_mb},
                {"first_bucket_mb", "auto"},
                {"last_bucket_mb", last_bucket_mb},
                {"overlap", true},
                {"link", "none"},
                {"comm", "nccl"},
                {"comm_dtype", "fp32"},
                {"device", "cuda"},
                {"model", "gpt2-small"},
                {"precision", "bf16"},
                {"batch", g.batch},
                {"grad_accum", 1},
                {"warmup_steps", 1},
                {"link_latency_us", -1},
                {"link_gbps", -1}};
  const std::vector<GpuPiece> pieces = gpt2_small_pieces(g.head_share);
  std::vector<int64_t> numel, offset;
  for (const GpuPiece& p : pieces) {
    offset.push_back(numel.empty() ? 0 : offset.back() + numel.back());
    numel.push_back(p.numel);
    run.pieces.push_back({offset.back(), p.numel});
  }
  const std::vector<Bucket> buckets =
      assign_buckets(numel, offset, BucketCaps::mib(bucket_mb, BucketCaps::kAsTheOthers, last_bucket_mb));
  for (const Bucket& b : buckets)
    run.buckets.push_back(
        {b.first_piece, b.last_piece, b.count, pieces[b.first_piece].name + ".." + pieces[b.last_piece].name});
  constexpr double kNcclAloneMs = 0.005;  // one rank: NCCL returns at once
  double start = 0;
  for (int s = 0; s < steps; ++s) {
    StepRecord x;
    x.start_ms = start;
    x.data_ms = g.data_ms;
    x.forward_ms = g.forward_ms;
    x.backward_ms = g.backward_ms;
    x.optimizer_ms = g.optimizer_ms;
    x.samples = g.batch;
    x.useful_tokens = x.padded_tokens = static_cast<double>(g.batch) * g.seq;
    const double backward_start = start + g.data_ms + g.forward_ms;
    double comm_free = 0;
    for (const Bucket& b : buckets) {
      BucketTimes t;
      t.ready_ms = backward_start + g.backward_ms * pieces[b.last_piece].ready_share;
      t.comm_start_ms = std::max(t.ready_ms, comm_free);
      t.comm_end_ms = comm_free = t.comm_start_ms + kNcclAloneMs;
      x.comm_ms += kNcclAloneMs;
      run.bucket_times.push_back(t);
    }
    x.exposed_comm_ms = std::max(0.0, comm_free - (backward_start + g.backward_ms));
    x.hidden_comm_ms = x.comm_ms - x.exposed_comm_ms;
    x.step_ms = g.data_ms + g.forward_ms + g.backward_ms + x.exposed_comm_ms + g.optimizer_ms;
    start += x.step_ms;
    run.records.push_back(x);
  }
  return run;
}

}  // namespace ddplab::fake_runs
