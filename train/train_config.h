// Everything that defines a training run. Every field is a flag of `ddplab train` (launcher/cli.cpp) and is
// stored, as JSON, in the run file's metadata.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/communicator.h"
#include "model/attention_kind.h"
#include "model/mlp.h"
#include "model/optimizer.h"
#include "model/transformer.h"

namespace ddplab {

// --grad-slice-mb auto, until resolved_grad_slice_mb() resolves it.
inline constexpr double kAutoGradSliceMb = -1;

struct TrainConfig {
  std::string device = "cpu";       // cpu | cuda: one GPU per rank, NCCL all-reduce (docs/GPU.md)
  std::string precision = "fp32";   // --device cuda: fp32 | tf32 | bf16 (model/precision.h)
  std::string attention = "auto";   // --device cuda, transformer: auto | unfused | fused | cudnn (model/attention_kind.h)
  std::string profile_steps;        // --device cuda: "A:B" = the profiler captures steps A..B (docs/GPU.md); "" = all
  std::string model = "mlp";        // mlp | tiny | small | gpt2-small (transformer presets)
  MlpConfig mlp;
  // Transformer workloads: the head and the token data.
  std::string head = "classify";    // classify | lm
  std::string lengths = "loguniform";  // sequence lengths: fixed | uniform | loguniform
  int min_len = 64, max_len = 256;
  double outlier_prob = 0.08;       // share of sequences of length max_len
  std::string batching = "sample";  // sample | bucket | token
  int64_t max_tokens = 8192;        // token batching: padded tokens per rank per step
  int64_t epoch_size = 65536;       // sequences per epoch
  OptimizerConfig optimizer;
  int batch = 128;          // samples per rank per micro-batch (global batch = batch * grad_accum * world size)
  int steps = 50;
  int warmup_steps = 5;     // left out of the summary's steady-state means
  uint64_t seed = 1234;     // model init and data
  float data_noise = 1.0f;  // synthetic data: noise amplitude around the class prototypes
  std::string comm = "ring";        // all-reduce implementation: ring | mpi | hier; nccl with --device cuda
  std::string ring_link = "auto";   // --device cuda --comm ring: auto | nccl | ipc | host (comm/ring_cuda.h)
  std::string comm_dtype = "fp32";  // on the wire: fp32 | bf16 | fp16
  double bucket_mb = 25.0;          // gradient bucket cap (MiB); 0 = one bucket per parameter
  double first_bucket_mb = 1.0;     // cap of the bucket that closes backward
  bool overlap = true;              // all-reduce buckets while backward runs
  // Weight gradients computed and announced in row blocks of this size (MiB); 0 = whole weights; auto (stored
  // resolved): see resolved_grad_slice_mb.
  double grad_slice_mb = kAutoGradSliceMb;
  int grad_accum = 1;               // micro-batches per step; communication on the last only
  std::string link = "none";        // emulated interconnect: a preset for every hop, or "intra=P,inter=P"
  int ranks_per_node = 0;           // emulated nodes of K consecutive ranks; 0: the hosts (comm/topology.h)
  double link_latency_us = -1;      // overrides of the preset (negative: keep the preset's)
  double link_gbps = -1;
  int blas_threads = 0;  // OpenBLAS threads per rank; 0: auto (launcher/run.h, cores_for_rank)
  // The optimizer's update piece by piece on a thread of its own, while backward runs (train/cpu_backend.h):
  // on | off | auto (on when this rank has a core its BLAS threads leave idle; stored resolved).
  std::string optimizer_in_backward = "auto";
  // ZeRO stage (llm.c's -z, DeepSpeed's stage): 0 = every rank updates every parameter; 1 = the update is sharded:
  // gradients reduce-scattered, each rank updates the elements it owns, parameters all-gathered (CPU, --comm ring).
  int zero_stage = 0;
  // Input pipeline.
  double data_cost_ms = 0;  // host cost per sample (a sleep, like I/O latency)
  int loader_threads = 0;   // 0: batches are produced in the training thread when needed
  int prefetch = 2;         // batches produced ahead of use (with loader threads)
  // Pathologies (the DDP lab): they change timing, never the math.
  int slow_rank = 0;            // the straggler
  double straggler_ms = 0;      // it sleeps this long before each batch fetch
  int busy_threads = 0;         // it shares its compute thread's core with this many busy threads: a noisy neighbour
  double extra_allreduce_mb = 0;  // an extra all-reduce of this size every step (e.g. metrics done badly)
  double rank0_work_ms = 0;     // rank 0 works this long, then all ranks barrier, ...
  int barrier_every = 1;        // ... every this many steps
  // Reliability (docs/RELIABILITY.md).
  double timeout_s = 300;       // watchdog: abort the job after this long without progress in any wait; 0 = off
  int flush_every = 200;        // rank 0 snapshots the run so far into <out>.partial every this many steps; 0 = off
  int check_sync = 0;           // compare parameter checksums across ranks every this many steps; 0 = off
  bool skip_nonfinite = false;  // a non-finite loss or gradient skips the step instead of stopping the run
  std::string checkpoint;       // save parameters + optimizer state here at the end (and every checkpoint_every)
  int checkpoint_every = 0;     // steps; 0 = only at the end
  std::string resume;           // start from this checkpoint, at its step
  // Fault injection, to test the above: at step fault_step, rank fault_rank ...
  std::string fault = "none";   // none | hang (sleeps forever) | kill (SIGKILL) | throw | nan (a gradient) | diverge
  int fault_rank = 0, fault_step = 0;
  std::string out;          // run file; empty = runs/train_np<N>_<time>.h5
  bool force = false;       // overwrite an existing run file
  bool quiet = false;
};

// --profile-steps "A:B" as {A, B} (0 <= A <= B); {-1, -1} when empty. Throws std::invalid_argument.
inline std::pair<int, int> parse_profile_steps(const std::string& text) {
  if (text.empty()) return {-1, -1};
  int first = -1, last = -1, used = 0;
  if (std::sscanf(text.c_str(), "%d:%d%n", &first, &last, &used) != 2 || used != static_cast<int>(text.size()) ||
      first < 0 || last < first)
    throw std::invalid_argument("--profile-steps must be A:B with 0 <= A <= B (got '" + text + "')");
  return {first, last};
}

// A float flag as the decimal the user typed (0.9, not 0.8999999761581421).
inline double decimal(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", x);  // 7 significant digits round-trip any float
  return std::strtod(text, nullptr);
}

// --attention auto as it runs (auto_attention: cuDNN's where its library loads on every rank and no sequence is a
// single token, else our fused kernels, else unfused; docs/GPU.md, "Fused attention"); an explicit choice as given (validate refuses what cannot run).
inline std::string resolved_attention(const TrainConfig& c, bool cudnn_available) {
  if (c.attention != "auto") return c.attention;
  if (c.model == "mlp") return "unfused";
  const TransformerConfig m = TransformerConfig::preset(c.model);
  // cuDNN takes no single-token sequences: with --min-len 1 a batch could be one.
  return attention_name(auto_attention(c.device == "cuda" && c.precision == "bf16", m.d_model / m.heads,
                                       cudnn_available && c.min_len >= 2));
}

// The communication options a TrainConfig asks for. Throws std::invalid_argument on a bad name or value.
// --grad-slice-mb auto: with the update in backward, 1 MiB row blocks. The update of the layer backward ends with
// then follows its gradient block by block, and only its last block's is left after backward (docs/ARCHITECTURE.md,
// "The update in backward"). Otherwise whole weights, as PyTorch's autograd produces them.
inline double resolved_grad_slice_mb(const TrainConfig& c) {
  if (c.grad_slice_mb != kAutoGradSliceMb) return c.grad_slice_mb;
  return c.optimizer_in_backward == "on" ? 1.0 : 0.0;
}

inline CommOptions comm_options(const TrainConfig& c) {
  CommOptions o;
  o.impl = parse_allreduce_impl(c.comm);
  o.wire = parse_wire_dtype(c.comm_dtype);
  o.link = parse_links(c.link, c.link_latency_us, c.link_gbps);
  o.ranks_per_node = c.ranks_per_node;
  return o;
}

// The settings as a JSON object keyed by the flags' names (--min-len is min_len); the few with no flag (beta1, beta2,
// eps) by their own. Files from before the keys followed the flags are read through upgrade_config_keys.
inline nlohmann::json to_json(const TrainConfig& c) {
  return {
      {"device", c.device},
      {"precision", c.precision},
      {"attention", c.attention},
      {"profile_steps", c.profile_steps},
      {"model", c.model},
      {"head", c.head},
      {"lengths", c.lengths},
      {"min_len", c.min_len},
      {"max_len", c.max_len},
      {"outlier_prob", c.outlier_prob},
      {"batching", c.batching},
      {"max_tokens", c.max_tokens},
      {"epoch_size", c.epoch_size},
      {"input_dim", c.mlp.input_dim},
      {"hidden", c.mlp.hidden_dim},
      {"layers", c.mlp.num_hidden_layers},
      {"classes", c.mlp.num_classes},
      {"optimizer", c.optimizer.kind},
      {"lr", decimal(c.optimizer.lr)},
      {"beta1", decimal(c.optimizer.beta1)},
      {"beta2", decimal(c.optimizer.beta2)},
      {"eps", decimal(c.optimizer.eps)},
      {"weight_decay", decimal(c.optimizer.weight_decay)},
      {"momentum", decimal(c.optimizer.momentum)},
      {"batch", c.batch},
      {"steps", c.steps},
      {"warmup_steps", c.warmup_steps},
      {"seed", c.seed},
      {"data_noise", decimal(c.data_noise)},
      {"comm", c.comm},
      {"comm_dtype", c.comm_dtype},
      {"ring_link", c.ring_link},
      {"bucket_mb", c.bucket_mb},
      {"first_bucket_mb", c.first_bucket_mb},
      {"overlap", c.overlap},
      {"grad_slice_mb", c.grad_slice_mb},
      {"grad_accum", c.grad_accum},
      {"link", c.link},
      {"link_latency_us", c.link_latency_us},
      {"link_gbps", c.link_gbps},
      {"ranks_per_node", c.ranks_per_node},
      {"data_cost_ms", c.data_cost_ms},
      {"loader_threads", c.loader_threads},
      {"prefetch", c.prefetch},
      {"slow_rank", c.slow_rank},
      {"straggler_ms", c.straggler_ms},
      {"busy_threads", c.busy_threads},
      {"extra_allreduce_mb", c.extra_allreduce_mb},
      {"rank0_work_ms", c.rank0_work_ms},
      {"barrier_every", c.barrier_every},
      {"threads", c.blas_threads},
      {"optimizer_in_backward", c.optimizer_in_backward},
      {"zero_stage", c.zero_stage},
      {"timeout_s", c.timeout_s},
      {"flush_every", c.flush_every},
      {"check_sync", c.check_sync},
      {"skip_nonfinite", c.skip_nonfinite},
      {"checkpoint", c.checkpoint},
      {"checkpoint_every", c.checkpoint_every},
      {"resume", c.resume},
      {"fault", c.fault},
      {"fault_rank", c.fault_rank},
      {"fault_step", c.fault_step},
      {"out", c.out},
      {"force", c.force},
  };
}

}  // namespace ddplab
