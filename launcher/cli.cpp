#include "launcher/cli.h"

#include <map>

#include "data/tokens.h"
#include "model/attention_kind.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "record/errors.h"
#include "record/files.h"

namespace ddplab {
namespace {

// What the GPU path does not do (yet), refused on every rank alike rather than ignored.
void validate_cuda(const TrainConfig& c) {
  const auto refuse = [](bool ok, const std::string& what) { require(ok, "--device cuda: " + what); };
  refuse(c.batching != "pack", "--batching pack needs attention within packed rows, which the CUDA kernels lack");
  refuse(c.comm == "nccl" || c.comm == "ring",
         "reduces gradients with NCCL or our ring: pass --comm nccl or ring (got --comm " + c.comm + ")");
  refuse(c.comm == "ring" || c.ring_link == "auto", "--ring-link needs --comm ring");
  refuse(c.optimizer.kind == "adamw", "--optimizer " + c.optimizer.kind + " has no CUDA kernel yet (use adamw)");
  refuse(c.link == "none" && c.link_latency_us < 0 && c.link_gbps < 0, "--link emulation is CPU only");
  refuse(c.ranks_per_node == 0, "--ranks-per-node (emulated nodes) is CPU only");
  if (c.attention == "fused" || c.attention == "cudnn") {
    const std::string flag = "--attention " + c.attention;
    refuse(c.model != "mlp", flag + " needs a transformer --model (the MLP has no attention)");
    refuse(c.precision == "bf16", flag + " needs --precision bf16 (its kernels are bf16; got --precision " + c.precision +
                                      ")");
    const TransformerConfig m = TransformerConfig::preset(c.model);
    const int hs = m.d_model / m.heads;
    const bool fused = c.attention == "fused";
    refuse(fused ? fused_attention_supports_head_size(hs) : cudnn_attention_supports_head_size(hs),
           flag + (fused ? " has kernels for heads of " + std::string(fused_attention_head_sizes())
                         : std::string(" takes heads of a multiple of 8 up to 128")) +
               " dimensions; --model " + c.model + " has " + std::to_string(hs) + " (d_model " +
               std::to_string(m.d_model) + " / " + std::to_string(m.heads) + " heads)");
    refuse(fused || c.min_len >= 2, "--attention cudnn needs --min-len 2 or more (cuDNN takes no single-token "
                                    "sequences; got --min-len " + std::to_string(c.min_len) + ")");
  }
  try {
    parse_profile_steps(c.profile_steps);
    parse_wire_dtype(c.comm_dtype);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

void add_train_flags(CLI::App* app, TrainConfig& c, FlagSet flags) {
  const bool one_run = flags == FlagSet::kTrain;
  app->add_option("--batch", c.batch, "samples per rank per micro-batch (global batch = batch x grad-accum x ranks)")
      ->capture_default_str();
  app->add_option("--steps", c.steps, "training steps")->capture_default_str();
  CLI::Option* warmup =
      app->add_option("--warmup-steps", c.warmup_steps, "first steps left out of the summary (fewer than --steps)")
          ->capture_default_str();
  app->add_option("--seed", c.seed, "seed of model init and synthetic data")->capture_default_str();
  app->add_option("--device", c.device, "cpu | cuda (the GPU: --comm nccl, one GPU per rank, or --comm ring)")
      ->capture_default_str();
  app->add_option("--precision", c.precision, "--device cuda: fp32 | tf32 | bf16 (GEMM math; master weights fp32)")
      ->capture_default_str();
  app->add_option("--attention", c.attention,
                  "--device cuda, transformer: unfused (fp32 kernels, S x S probabilities kept) | fused (our flash "
                  "attention in bf16: --precision bf16, heads of 32, 64 or 128) | cudnn (cuDNN's fused attention, "
                  "bf16) | auto (the fastest that can run: cudnn, else fused, else unfused)")
      ->check(CLI::IsMember({"auto", "unfused", "fused", "cudnn"}))
      ->capture_default_str();
  app->add_option("--profile-steps", c.profile_steps,
                  "--device cuda: A:B, cudaProfilerStart before step A, Stop after step B (ncu/nsys capture only those)");
  app->add_option("--model", c.model, "mlp, or a transformer preset: tiny | small | gpt2-small")->capture_default_str();
  app->add_option("--head", c.head, "transformer head: classify (mean-pooled) | lm (next token)")
      ->capture_default_str();
  app->add_option("--lengths", c.lengths, "transformer data: sequence lengths fixed | uniform | loguniform")
      ->capture_default_str();
  app->add_option("--min-len", c.min_len, "transformer data: shortest sequence")->capture_default_str();
  app->add_option("--max-len", c.max_len, "transformer data: longest sequence (fixed: every sequence)")
      ->capture_default_str();
  app->add_option("--outlier-prob", c.outlier_prob, "transformer data: share of sequences of length --max-len")
      ->capture_default_str();
  app->add_option("--batching", c.batching,
                  "transformer data: sample (fixed count) | bucket (by length) | token (--max-tokens budget) | "
                  "pack (--head lm: sequences back to back in --max-tokens / --max-len rows)")
      ->capture_default_str();
  app->add_option("--max-tokens", c.max_tokens, "token and pack batching: padded tokens per rank per step")
      ->capture_default_str();
  app->add_option("--epoch-size", c.epoch_size, "transformer data: sequences per epoch")->capture_default_str();
  app->add_option("--input-dim", c.mlp.input_dim, "MLP input features")->capture_default_str();
  app->add_option("--hidden", c.mlp.hidden_dim, "MLP hidden width")->capture_default_str();
  app->add_option("--layers", c.mlp.num_hidden_layers, "MLP hidden Linear+GELU blocks")->capture_default_str();
  app->add_option("--classes", c.mlp.num_classes, "output classes")->capture_default_str();
  app->add_option("--optimizer", c.optimizer.kind, "adamw | sgd")->capture_default_str();
  app->add_option("--lr", c.optimizer.lr, "learning rate")->capture_default_str();
  app->add_option("--weight-decay", c.optimizer.weight_decay, "weight decay (decoupled for AdamW)")
      ->capture_default_str();
  app->add_option("--momentum", c.optimizer.momentum, "SGD momentum")->capture_default_str();
  app->add_option("--data-noise", c.data_noise, "synthetic data noise around the class prototypes")
      ->capture_default_str();
  app->add_option("--comm", c.comm,
                  "gradient all-reduce: ring (ours; with every rank on one host, the direct all-reduce, the same "
                  "bits: DDPLAB_DIRECT_ALLREDUCE=0 keeps the ring) | mpi (MPI_Allreduce) | hier (ring within each "
                  "node, then across nodes; needs 2+ nodes) | nccl (--device cuda)")
      ->capture_default_str();
  app->add_option("--comm-dtype", c.comm_dtype, "gradients on the wire: fp32 | bf16 | fp16")->capture_default_str();
  app->add_option("--ring-link", c.ring_link,
                  "--device cuda --comm ring: auto | nccl | ipc (CUDA IPC; ranks may share a GPU) | host (staged)")
      ->check(CLI::IsMember({"auto", "nccl", "ipc", "host"}))
      ->capture_default_str();
  if (flags != FlagSet::kSweep) {
    app->add_option("--bucket-mb", c.bucket_mb, "gradient bucket cap in MiB (0: one bucket per parameter)")
        ->capture_default_str();
    app->add_option_function<std::string>(
           "--overlap",
           [&c](const std::string& v) {
             if (v != "on" && v != "off")
               throw CLI::ValidationError("--overlap", "must be on or off (got '" + v + "')");
             c.overlap = v == "on";
           },
           "all-reduce buckets while backward runs: on | off")
        ->default_str("on");
  }
  app->add_option("--first-bucket-mb", c.first_bucket_mb, "cap of the bucket that closes backward, MiB")
      ->capture_default_str();
  app->add_option("--grad-slice-mb", c.grad_slice_mb,
                  "compute and announce weight gradients in row blocks of this size, MiB: N (0: whole weights) or "
                  "auto (1 with the update in backward, else 0)")
      ->check(CLI::Validator(
          [](std::string& text) {
            return text == "auto" || text.rfind('-', 0) != 0 ? std::string() : std::string("must not be negative");
          },
          "", "NOT_NEGATIVE"))
      ->transform(CLI::Transformer(std::map<std::string, double>{{"auto", kAutoGradSliceMb}}))
      ->default_str("auto")
      ->type_name("MiB|auto");
  app->add_option("--grad-accum", c.grad_accum, "micro-batches per step, gradients communicated on the last")
      ->capture_default_str();
  app->add_option("--link", c.link,
                  "emulated interconnect, every hop: none | 1gbe | 10gbe | 25gbe | 100gbe-ib | pcie4 | nvlink4; or "
                  "per class of hop: intra=P,inter=P (within a node, per pair; across nodes, through the node's NIC, "
                  "shared by its ranks)")
      ->capture_default_str();
  app->add_option("--link-latency-us", c.link_latency_us, "override the link's latency (us; a single --link preset)");
  app->add_option("--link-gbps", c.link_gbps, "override the link's bandwidth (Gbit/s, positive; a single preset)");
  if (flags != FlagSet::kSuite)  // the suite's cases run on 1..N ranks: one K would not divide them all
    app->add_option("--ranks-per-node", c.ranks_per_node,
                    "emulate nodes of K consecutive ranks (K divides the ranks; 0: the hosts are the nodes); ranks "
                    "on different nodes talk MPI and take --link inter=");
  app->add_option("--threads", c.blas_threads,
                  "OpenBLAS threads per rank: N, or auto (the cores this rank may use: its --bind-to binding, else "
                  "the host's cores / ranks on the host; Open MPI's default one-core binding is lifted)")
      ->transform(CLI::Transformer(std::map<std::string, int>{{"auto", 0}}))
      ->default_str("auto")
      ->type_name("N|auto");
  app->add_option("--optimizer-in-backward", c.optimizer_in_backward,
                  "update each bucket's parameters on a thread of their own as soon as backward is done with them: "
                  "on | off | auto (on when the BLAS threads leave this rank a core idle; with --device cuda, on "
                  "updates bucket by bucket after backward, each behind its all-reduce, and auto is off)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_option("--zero-stage", c.zero_stage,
                  "ZeRO stage: 0 (every rank updates every parameter) or 1 (the update sharded: gradients "
                  "reduce-scattered, each rank updates its share, parameters all-gathered; CPU, --comm ring)")
      ->capture_default_str();
  app->add_option("--data-cost-ms", c.data_cost_ms, "input pipeline: host cost per sample, ms (a sleep)")
      ->capture_default_str();
  app->add_option("--loader-threads", c.loader_threads, "input pipeline: worker threads (0: in the training loop)")
      ->capture_default_str();
  app->add_option("--prefetch", c.prefetch, "input pipeline: batches prepared ahead (with loader threads)")
      ->capture_default_str();
  app->add_option("--slow-rank", c.slow_rank, "lab: the straggling rank")->capture_default_str();
  app->add_option("--straggler-ms", c.straggler_ms, "lab: the slow rank sleeps this long before each batch fetch")
      ->capture_default_str();
  if (flags != FlagSet::kSuite)  // the suite's ranks share the cores unbound: it would slow every rank of a case
    app->add_option("--busy-threads", c.busy_threads,
                    "lab: a noisy neighbour: from the first step the slow rank's compute thread and this many busy "
                    "threads share the core it is on")
        ->capture_default_str();
  app->add_option("--extra-allreduce-mb", c.extra_allreduce_mb, "lab: an extra all-reduce of this size every step")
      ->capture_default_str();
  app->add_option("--rank0-work-ms", c.rank0_work_ms, "lab: rank 0 works this long, then every rank barriers")
      ->capture_default_str();
  app->add_option("--barrier-every", c.barrier_every, "lab: ... every this many steps")->capture_default_str();
  app->add_option("--timeout-s", c.timeout_s, "watchdog: abort the job after this long without progress (0: off)")
      ->capture_default_str();
  app->add_option("--flush-every", c.flush_every, "write the run so far to <out>.partial every N steps (0: off)")
      ->capture_default_str();
  app->add_option("--check-sync", c.check_sync, "compare parameters across ranks every N steps (0: off)")
      ->capture_default_str();
  app->add_flag("--skip-nonfinite", c.skip_nonfinite, "skip a step with a non-finite loss or gradient (default: stop)");
  if (one_run) {
    app->add_option("--checkpoint", c.checkpoint, "save parameters and optimizer state to this HDF5 file at the end");
    app->add_option("--checkpoint-every", c.checkpoint_every, "... and every N steps (0: only at the end)")
        ->capture_default_str();
    app->add_option("--resume", c.resume, "continue from this checkpoint, at its step (same settings)");
    app->add_option("--fault", c.fault, "inject a fault: none | hang | kill | throw | nan | diverge")
        ->capture_default_str();
    app->add_option("--fault-rank", c.fault_rank, "the rank that injects the fault")->capture_default_str();
    app->add_option("--fault-step", c.fault_step, "the step at which it does")->capture_default_str();
    app->add_option("--out", c.out, "run file (HDF5); default runs/train_np<N>_<time>.h5");
  }
  app->add_flag("--force", c.force,
                one_run ? "overwrite an existing run file" : "reuse an existing --out-dir, overwriting its files");
  app->add_flag("--quiet", c.quiet, "print only errors");
  // A --warmup-steps that leaves no step to measure cannot be what was meant: refused. The default (5) is not a
  // request, so a shorter run keeps its last step (RunRecord::first_steady_step), as its "steady state" line says.
  app->parse_complete_callback([&c, warmup] {
    require(warmup->count() == 0 || c.warmup_steps < c.steps,
            "--warmup-steps " + std::to_string(c.warmup_steps) + " leaves none of the " + std::to_string(c.steps) +
                " steps (--steps) to measure: it must be smaller");
  });
}

void validate(const TrainConfig& c) {
  auto at_least = [](const char* flag, long long value, long long min) {
    require(value >= min, std::string(flag) + " must be at least " + std::to_string(min) + " (got " +
                              std::to_string(value) + ")");
  };
  at_least("--batch", c.batch, 1);
  at_least("--steps", c.steps, 1);
  at_least("--warmup-steps", c.warmup_steps, 0);
  at_least("--input-dim", c.mlp.input_dim, 1);
  at_least("--hidden", c.mlp.hidden_dim, 1);
  at_least("--layers", c.mlp.num_hidden_layers, 1);
  at_least("--classes", c.mlp.num_classes, 2);
  at_least("--threads", c.blas_threads, 0);  // 0: auto
  at_least("--ranks-per-node", c.ranks_per_node, 0);  // 0: the hosts
  require(c.optimizer.kind == "adamw" || c.optimizer.kind == "sgd",
          "--optimizer must be adamw or sgd (got '" + c.optimizer.kind + "')");
  require(c.optimizer.lr > 0, "--lr must be positive");
  require(c.optimizer.weight_decay >= 0, "--weight-decay must not be negative");
  require(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1, "--momentum must be in [0, 1)");
  require(c.data_noise >= 0, "--data-noise must not be negative");
  at_least("--grad-accum", c.grad_accum, 1);
  if (c.model != "mlp") {
    require(c.model == "tiny" || c.model == "small" || c.model == "gpt2-small",
            "unknown --model '" + c.model + "' (expected mlp, tiny, small or gpt2-small)");
    require(c.head == "classify" || c.head == "lm", "--head must be classify or lm (got '" + c.head + "')");
    require(c.batching != "pack" || c.head == "lm",
            "--batching pack needs --head lm (the classifier pools one sequence per row)");
    at_least("--min-len", c.min_len, c.head == "lm" ? 2 : 1);
    at_least("--max-len", c.max_len, c.min_len);
    at_least("--max-tokens", c.max_tokens, 1);
    // A batch holds at least one sequence (a pack row is max_len long): below the longest, the budget cannot hold.
    require(c.max_tokens >= c.max_len || (c.batching != "token" && c.batching != "pack"),
            "--max-tokens " + std::to_string(c.max_tokens) + " is below --max-len " + std::to_string(c.max_len) +
                ": a batch of one longest sequence would exceed it (--batching " + c.batching + ")");
    at_least("--epoch-size", c.epoch_size, 1);
    require(c.outlier_prob >= 0 && c.outlier_prob <= 1, "--outlier-prob must be in [0, 1]");
    try {
      parse_batching(c.batching);
      parse_length_dist(c.lengths);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  at_least("--loader-threads", c.loader_threads, 0);
  at_least("--prefetch", c.prefetch, 1);
  at_least("--barrier-every", c.barrier_every, 1);
  at_least("--slow-rank", c.slow_rank, 0);
  at_least("--busy-threads", c.busy_threads, 0);
  require(c.busy_threads <= 64, "--busy-threads must be at most 64 (got " + std::to_string(c.busy_threads) + ")");
  require(c.data_cost_ms >= 0 && c.straggler_ms >= 0 && c.extra_allreduce_mb >= 0 && c.rank0_work_ms >= 0,
          "--data-cost-ms, --straggler-ms, --extra-allreduce-mb and --rank0-work-ms must not be negative");
  // parse_link takes 0 as "unlimited", which a named link would then only pretend to be.
  require(c.link_gbps != 0, "--link-gbps must be positive (got 0); for no bandwidth limit, leave it out with --link none");
  require(c.timeout_s >= 0, "--timeout-s must not be negative (0 turns the watchdog off)");
  at_least("--flush-every", c.flush_every, 0);
  at_least("--check-sync", c.check_sync, 0);
  require(c.fault == "none" || c.fault == "hang" || c.fault == "kill" || c.fault == "throw" || c.fault == "nan" ||
              c.fault == "diverge",
          "--fault must be none, hang, kill, throw, nan or diverge (got '" + c.fault + "')");
  at_least("--fault-rank", c.fault_rank, 0);
  at_least("--checkpoint-every", c.checkpoint_every, 0);
  require(c.checkpoint_every == 0 || !c.checkpoint.empty(), "--checkpoint-every needs --checkpoint PATH");
  at_least("--fault-step", c.fault_step, 0);
  require(c.fault == "none" || c.fault_step < c.steps, "--fault-step " + std::to_string(c.fault_step) +
                                                           " is past the run's last step (--steps " +
                                                           std::to_string(c.steps) + "): the fault would never fire");
  // One file for two roles: the run file written at the end would replace the checkpoint, or fail on it after the
  // whole run.
  require(!same_file(c.out, c.checkpoint), "--out and --checkpoint name the same file (" + c.out +
                                               "): the run file and the checkpoint need a file each");
  require(!same_file(c.out, c.resume), "--out and --resume name the same file (" + c.out +
                                           "): the run file would replace the checkpoint it resumes from");
  require(c.bucket_mb >= 0 && c.first_bucket_mb >= 0 && (c.grad_slice_mb >= 0 || c.grad_slice_mb == kAutoGradSliceMb),
          "--bucket-mb, --first-bucket-mb and --grad-slice-mb must not be negative");
  require(c.device == "cpu" || c.device == "cuda", "--device must be cpu or cuda (got '" + c.device + "')");
  try {
    parse_precision(c.precision);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--precision: ") + e.what());
  }
  require(!(c.optimizer_in_backward == "on" && c.skip_nonfinite),
          "--optimizer-in-backward on and --skip-nonfinite exclude each other: a step can only be skipped before any "
          "bucket is updated");
  require(c.zero_stage == 0 || c.zero_stage == 1,
          "--zero-stage must be 0 or 1 (got " + std::to_string(c.zero_stage) + ")");
  if (c.zero_stage == 1) {
    require(c.device == "cpu", "--zero-stage 1 needs --device cpu");
    require(c.comm == "ring", "--zero-stage 1 needs --comm ring (it reduce-scatters and all-gathers on the ring)");
    require(c.comm_dtype == "fp32", "--zero-stage 1 needs --comm-dtype fp32 (the parameters travel unrounded)");
    require(c.optimizer_in_backward != "on",
            "--zero-stage 1 and --optimizer-in-backward on exclude each other: the sharded update runs after backward");
  }
  require(c.comm != "mpi" || c.comm_dtype == "fp32",
          "--comm mpi has no " + c.comm_dtype + " wire (MPI_Allreduce sums fp32 buffers as fp32); use --comm ring");
  if (c.device == "cuda") return validate_cuda(c);
  require(c.precision == "fp32", "--precision " + c.precision + " needs --device cuda (the CPU trains in fp32)");
  require(c.attention == "auto" || c.attention == "unfused",
          "--attention " + c.attention + " needs --device cuda (the CPU has one attention)");
  require(c.comm != "nccl", "--comm nccl needs --device cuda");
  require(c.ring_link == "auto", "--ring-link needs --device cuda (the CPU ring runs over MPI or shared memory)");
  require(c.profile_steps.empty(), "--profile-steps needs --device cuda (it drives the CUDA profiler)");
  try {
    comm_options(c);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

}  // namespace ddplab
