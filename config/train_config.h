// Everything that defines a training run, one declaration per knob (flag, run-file key, meaning, check, "auto"):
// the flags of `ddplab train` (launcher/cli.cpp), the run file's config, the ranks' agreement and the analyses'
// reading of a stored config all come from visit_knobs.
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "data/tokens.h"
#include "ddp/buckets.h"
#include "model/attention_kind.h"
#include "model/mlp.h"
#include "model/optimizer.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "runtime/choices.h"

namespace ddplab {

// --grad-slice-mb auto, until resolved() resolves it.
inline constexpr double kAutoGradSliceMb = -1;
// --first-bucket-mb and --last-bucket-mb auto: no cap of its own, that end cut as the other buckets (stored as "auto").
inline constexpr double kAutoEndBucketMb = BucketCaps::kAsTheOthers;
// --link-latency-us and --link-gbps left at the --link preset's value (parse_links: negative keeps the preset's).
inline constexpr double kPresetLinkValue = -1;

enum class Device { kCpu, kCuda };
constexpr std::array<Named<Device>, 2> choice_names(Device) { return {{{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}}}; }

// --model: the MLP, or a transformer preset (TransformerConfig::preset).
enum class ModelKind { kMlp, kTiny, kSmall, kGpt2Small };
constexpr std::array<Named<ModelKind>, 4> choice_names(ModelKind) {
  return {{{ModelKind::kMlp, "mlp"}, {ModelKind::kTiny, "tiny"}, {ModelKind::kSmall, "small"},
           {ModelKind::kGpt2Small, "gpt2-small"}}};
}

enum class OnOff { kOff, kOn };
constexpr std::array<Named<OnOff>, 2> choice_names(OnOff) { return {{{OnOff::kOff, "off"}, {OnOff::kOn, "on"}}}; }

// --gemm-algo: cuBLASLt's first heuristic answer for each GEMM, or the fastest of its first few, timed once per host
// (kernels/cuda/gemm.h, set_timed_algos).
enum class GemmAlgo { kHeuristic, kTimed };
constexpr std::array<Named<GemmAlgo>, 2> choice_names(GemmAlgo) {
  return {{{GemmAlgo::kHeuristic, "heuristic"}, {GemmAlgo::kTimed, "timed"}}};
}

// --fault: what rank fault_rank does at step fault_step (train/step_rules.cpp).
enum class Fault { kNone, kHang, kKill, kThrow, kNan, kDiverge };
constexpr std::array<Named<Fault>, 6> choice_names(Fault) {
  return {{{Fault::kNone, "none"}, {Fault::kHang, "hang"}, {Fault::kKill, "kill"}, {Fault::kThrow, "throw"},
           {Fault::kNan, "nan"}, {Fault::kDiverge, "diverge"}}};
}

// A choice that also takes "auto": empty until the run resolves it (resolved()), and stored resolved.
template <typename E>
using AutoChoice = std::optional<E>;

// Everything that defines a training run. Each field's flag, JSON key, meaning and check are declared once, in
// visit_knobs below; its default is its initializer here.
struct TrainConfig {
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  AutoChoice<AttentionKind> attention;
  bool deterministic = false;
  GemmAlgo gemm_algo = GemmAlgo::kTimed;
  std::string profile_steps;  // "A:B" = the profiler captures steps A..B (docs/GPU.md); "" = all
  ModelKind model = ModelKind::kMlp;
  MlpConfig mlp;
  TransformerConfig::Head head = TransformerConfig::Head::kClassify;
  std::string data;  // token shards (data/token_files.h); empty: synthetic sequences
  std::string data_shards;  // what --data held when the run began (TokenFiles::fingerprint), filled for the run
  std::string val_data;     // token shards of the validation loss; empty: none
  int val_every = 0;        // steps between validations (0: after the last step only)
  int64_t val_windows = 0;  // windows of val_data per validation (0: all)
  LengthDist lengths = LengthDist::kLogUniform;
  int min_len = 64, max_len = 256;
  double outlier_prob = 0.08;
  Batching batching = Batching::kSample;
  int64_t max_tokens = 8192;
  int64_t epoch_size = 65536;
  OptimizerConfig optimizer;
  int batch = 128;
  int steps = 50;
  int warmup_steps = 5;
  uint64_t seed = 1234;
  float data_noise = 1.0f;
  AllreduceImpl comm = AllreduceImpl::kRing;
  RingLinkKind ring_link = RingLinkKind::kAuto;
  WireDtype comm_dtype = WireDtype::kFp32;
  double bucket_mb = 25.0;
  double first_bucket_mb = kAutoEndBucketMb;
  double last_bucket_mb = 1.0;
  BucketRule bucket_rule = BucketRule::kWithin;
  bool overlap = true;
  double grad_slice_mb = kAutoGradSliceMb;
  int grad_accum = 1;
  std::string link = "none";
  int ranks_per_node = 0;
  double link_latency_us = kPresetLinkValue;  // the --link preset's
  double link_gbps = kPresetLinkValue;
  int blas_threads = 0;  // 0: auto (launcher/run.h, cores_for_rank)
  AutoChoice<OnOff> optimizer_in_backward;
  int zero_stage = 0;
  double data_cost_ms = 0;
  int loader_threads = 0;
  int prefetch = 2;
  int slow_rank = 0;
  double straggler_ms = 0;
  int busy_threads = 0;
  double extra_allreduce_mb = 0;
  double rank0_work_ms = 0;
  int barrier_every = 1;
  double timeout_s = 300;
  int flush_every = 200;
  int check_sync = 0;
  bool skip_nonfinite = false;
  std::string checkpoint;
  int checkpoint_every = 0;
  std::string resume;
  Fault fault = Fault::kNone;
  int fault_rank = 0, fault_step = 0;
  std::string out;
  bool force = false;
  bool quiet = false;
  int log_every = 0;  // 0: at most once a second

  bool transformer() const { return model != ModelKind::kMlp; }
  // The input pipeline that --data-cost-ms and --loader-threads shape: the MLP's loader (train/workload.cpp) or the
  // GPU's batch prefetcher (train/cuda_backend.cpp); the transformer on the CPU makes its batches within the step.
  bool has_input_pipeline() const { return !transformer() || device == Device::kCuda; }
  // --prefetch: the depth of the CPU MLP's loader threads, the one pipeline with a queue of its own.
  bool reads_prefetch() const { return !transformer() && device == Device::kCpu && loader_threads > 0; }
  bool update_in_backward() const { return optimizer_in_backward == OnOff::kOn; }
};

// Which commands offer a knob's flag, and what the knob is beside its value.
enum KnobTraits : unsigned {
  kNotInSuite = 1u << 0,                // `suite` runs cases of its own on 1..N ranks
  kNotInSweep = 1u << 1,                // `sweep` takes it as a list of its own
  kOneRun = kNotInSuite | kNotInSweep,  // about one run's files, its injected fault or its progress lines
  kMath = 1u << 2,                      // changes what a step computes: a resumed run must repeat it
  kPerRank = 1u << 3,                   // may differ between ranks (the output path, overwriting)
  kOnOff = 1u << 4,                     // a bool given as on | off (other bools are flags)
  kPositive = 1u << 5,                  // a number that must be above `min`, not just at least it
  kBelowMax = 1u << 6,                  // ... below `max`, not just at most it
  kTransformer = 1u << 7,               // only a transformer --model reads it: given with the MLP, refused
  kMlp = 1u << 8,                       // only the MLP reads it: given with a transformer, refused
  kSynthetic = 1u << 9,                 // shapes synthetic sequences: given with --data, refused
  kCuda = 1u << 10,                     // only --device cuda reads it: given on the CPU, refused
};

// One knob of `ddplab train`: its flag (nullptr: none), its key in the run file's config (nullptr: not stored), what
// it means (the flag's help), its check (numbers in [min, max]; choices: their names), and whether it takes "auto"
// and as what value a number stores it until resolved.
struct Knob {
  const char* flag;
  const char* key;
  const char* help;
  double min = -std::numeric_limits<double>::infinity(), max = std::numeric_limits<double>::infinity();
  unsigned traits = 0;
  const char* auto_text = nullptr;  // numbers: what "auto" means, for the help; the value is auto_value
  double auto_value = 0;
};

inline constexpr double kNoMin = -std::numeric_limits<double>::infinity();
inline constexpr double kNoMax = std::numeric_limits<double>::infinity();
// The largest size in MiB a size flag takes, far past any memory: a million TiB. Beyond ~3.5e13 its count of floats
// would not fit the 64-bit integers that hold it, and a larger size reads as a crash instead of a refusal.
inline constexpr double kMaxMiB = 1e12;
// The longest a lab's emulated cost (a sleep) or a link's latency may be, in ms: hours, past any watchdog
// (--timeout-s), where 1e300 overflowed the sleep's nanoseconds and became no delay at all.
inline constexpr double kMaxLabMs = 1e7;
// The bucket caps, MiB, that a search tries where the user names none: `ddplab sweep`'s points, and the caps
// `ddplab predict` weighs for its recommendation beside the run's own.
inline constexpr double kBucketCapsToTry[] = {0.5, 1, 5, 25, 100};
// The slowest emulated link, Gbit/s (a kbit/s): slower ones overflowed a message's transfer time into no time.
inline constexpr double kMinLinkGbps = 1e-6;

// Calls visit(knob, field) for every knob of c, in the order `ddplab train --help` lists them. Config is TrainConfig
// or const TrainConfig.
template <typename Config, typename Visit>
void visit_knobs(Config& c, Visit&& visit) {
  visit(Knob{"--batch", "batch", "samples per rank per micro-batch (global batch = batch x grad-accum x ranks)", 1,
             kNoMax, kMath},
        c.batch);
  visit(Knob{"--steps", "steps", "training steps", 1}, c.steps);
  visit(Knob{"--warmup-steps", "warmup_steps", "first steps left out of the summary (fewer than --steps)", 0},
        c.warmup_steps);
  visit(Knob{"--seed", "seed", "seed of model init and synthetic data", kNoMin, kNoMax, kMath}, c.seed);
  visit(Knob{"--device", "device", "cpu | cuda (the GPU: --comm nccl, one GPU per rank, or --comm ring)", kNoMin, kNoMax,
             kMath},
        c.device);
  visit(Knob{"--precision", "precision", "--device cuda: fp32 | tf32 | bf16 (GEMM math; master weights fp32)", kNoMin,
             kNoMax, kMath},
        c.precision);
  visit(Knob{"--attention", "attention",
             "--device cuda, transformer: unfused (fp32 kernels, S x S probabilities kept) | fused (our flash "
             "attention in bf16: --precision bf16, heads of 32, 64 or 128) | cudnn (cuDNN's fused attention, "
             "bf16) | auto (the fastest that can run: cudnn, else fused, else unfused)",
             kNoMin, kNoMax, kTransformer},
        c.attention);
  visit(Knob{"--deterministic", "deterministic",
             "the same bits from the same inputs, as torch.use_deterministic_algorithms: on | off (--device cuda: "
             "the fused attentions' dQ summed in a fixed order, not by atomics: cuDNN's deterministic backward, "
             "ours from per-key-block shares; the CPU is deterministic either way)",
             kNoMin, kNoMax, kOnOff},
        c.deterministic);
  visit(Knob{"--gemm-algo", "gemm_algo",
             "--device cuda: each GEMM's cuBLASLt algorithm: heuristic (the library's first answer) | timed (the "
             "fastest of its first 8, timed once per GPU model and kept in $XDG_CACHE_HOME/ddplab)",
             kNoMin, kNoMax, kCuda},
        c.gemm_algo);
  visit(Knob{"--profile-steps", "profile_steps",
             "--device cuda: A:B, cudaProfilerStart before step A, Stop after step B, counted from 0 (ncu/nsys capture "
             "only those)",
             kNoMin, kNoMax, kCuda},
        c.profile_steps);
  visit(Knob{"--model", "model", "mlp, or a transformer preset: tiny | small | gpt2-small", kNoMin, kNoMax, kMath},
        c.model);
  visit(Knob{"--head", "head", "transformer head: classify (mean-pooled) | lm (next token)", kNoMin, kNoMax,
             kMath | kTransformer},
        c.head);
  visit(Knob{"--data", "data",
             "transformer --head lm: train on token shards in llm.c's format (a file or a quoted glob of .bin "
             "files: a 1024-byte header, then uint16 tokens), read in windows of --max-len tokens; empty: "
             "synthetic sequences",
             kNoMin, kNoMax, kNotInSuite | kTransformer},
        c.data);
  // The shards themselves, not the path they were named by: a resume may name them from another folder.
  visit(Knob{nullptr, "data_shards", nullptr, kNoMin, kNoMax, kMath}, c.data_shards);
  visit(Knob{"--val-data", "val_data",
             "transformer --head lm: the validation loss, on token shards in --data's format (llm.c's val "
             "shard), the mean over every rank's share of them; empty: none",
             kNoMin, kNoMax, kNotInSuite | kTransformer},
        c.val_data);
  visit(
      Knob{"--val-every", "val_every", "--val-data: validate every N steps and after the last (0: after the last only)",
           0, kNoMax, kNotInSuite | kTransformer},
      c.val_every);
  visit(Knob{"--val-windows", "val_windows",
             "--val-data: the first N windows of --max-len tokens, split across the ranks (0: all)", 0, kNoMax,
             kNotInSuite | kTransformer},
        c.val_windows);
  visit(Knob{"--lengths", "lengths", "transformer data: sequence lengths fixed | uniform | loguniform", kNoMin, kNoMax,
             kMath | kTransformer | kSynthetic},
        c.lengths);
  visit(Knob{"--min-len", "min_len", "transformer data: shortest sequence (--head lm: 2 or more)", 1, kNoMax,
             kMath | kTransformer | kSynthetic},
        c.min_len);
  visit(Knob{"--max-len", "max_len", "transformer data: longest sequence (fixed: every sequence)", 1, kNoMax,
             kMath | kTransformer},
        c.max_len);
  visit(Knob{"--outlier-prob", "outlier_prob", "transformer data: share of sequences of length --max-len", 0, 1,
             kMath | kTransformer | kSynthetic},
        c.outlier_prob);
  visit(Knob{"--batching", "batching",
             "transformer data: sample (fixed count) | bucket (by length) | token (--max-tokens budget) | "
             "pack (--head lm: sequences back to back in --max-tokens / --max-len rows)",
             kNoMin, kNoMax, kMath | kTransformer},
        c.batching);
  visit(Knob{"--max-tokens", "max_tokens",
             "token and pack batching: padded tokens per rank per micro-batch (a step takes grad-accum of them)", 1,
             kNoMax, kMath | kTransformer},
        c.max_tokens);
  visit(Knob{"--epoch-size", "epoch_size", "transformer data: sequences per epoch (not with --data)", 0, kNoMax,
             kMath | kTransformer | kSynthetic},
        c.epoch_size);
  visit(Knob{"--input-dim", "input_dim", "MLP input features", 1, kNoMax, kMath | kMlp}, c.mlp.input_dim);
  visit(Knob{"--hidden", "hidden", "MLP hidden width", 1, kNoMax, kMath | kMlp}, c.mlp.hidden_dim);
  visit(Knob{"--layers", "layers", "MLP hidden Linear+GELU blocks", 1, kNoMax, kMath | kMlp}, c.mlp.num_hidden_layers);
  visit(Knob{"--classes", "classes", "MLP output classes (a transformer's classify head has its preset's)", 2, kNoMax,
             kMath | kMlp},
        c.mlp.num_classes);
  visit(Knob{"--optimizer", "optimizer", "adamw | sgd", kNoMin, kNoMax, kMath}, c.optimizer.kind);
  visit(Knob{"--lr", "lr", "learning rate", 0, kNoMax, kMath | kPositive}, c.optimizer.lr);
  visit(Knob{nullptr, "beta1", nullptr, kNoMin, kNoMax, kMath}, c.optimizer.beta1);
  visit(Knob{nullptr, "beta2", nullptr, kNoMin, kNoMax, kMath}, c.optimizer.beta2);
  visit(Knob{nullptr, "eps", nullptr, kNoMin, kNoMax, kMath}, c.optimizer.eps);
  visit(Knob{"--weight-decay", "weight_decay", "weight decay (decoupled for AdamW), on every parameter as PyTorch's one-group AdamW", 0, kNoMax, kMath},
        c.optimizer.weight_decay);
  visit(Knob{"--momentum", "momentum", "SGD momentum", 0, 1, kMath | kBelowMax}, c.optimizer.momentum);
  visit(Knob{"--grad-clip", "grad_clip",
             "clip the all-reduced gradients' global L2 norm to this before the update, as PyTorch's "
             "clip_grad_norm_ (llm.c: 1.0); 0: off",
             0, kNoMax, kMath},
        c.optimizer.grad_clip);
  visit(Knob{"--lr-schedule", "lr_schedule",
             "the learning rate after the warm-up: constant | cosine (decays over the rest of --steps towards "
             "--lr x --lr-final, as llm.c's; a resume must repeat --steps)",
             kNoMin, kNoMax, kMath},
        c.optimizer.lr_schedule);
  visit(Knob{"--lr-warmup", "lr_warmup", "steps of linear learning-rate warm-up, (step + 1) / N of --lr", 0, kNoMax,
             kMath},
        c.optimizer.lr_warmup);
  visit(Knob{"--lr-final", "lr_final", "--lr-schedule cosine: the learning rate it decays towards, a fraction of --lr",
             0, 1, kMath},
        c.optimizer.lr_final);
  visit(Knob{"--data-noise", "data_noise", "MLP: synthetic data noise around the class prototypes", 0, kNoMax,
             kMath | kMlp},
        c.data_noise);
  visit(Knob{"--comm", "comm",
             "gradient all-reduce: ring (ours; with every rank on one host, the direct all-reduce, the same "
             "bits: DDPLAB_DIRECT_ALLREDUCE=0 keeps the ring) | mpi (MPI_Allreduce) | hier (ring within each "
             "node, then across nodes; needs 2+ nodes) | nccl (--device cuda)",
             kNoMin, kNoMax, kMath},
        c.comm);
  visit(Knob{"--comm-dtype", "comm_dtype", "gradients on the wire: fp32 | bf16 | fp16", kNoMin, kNoMax, kMath},
        c.comm_dtype);
  visit(Knob{"--ring-link", "ring_link",
             "--device cuda --comm ring: auto | nccl | ipc (CUDA IPC; ranks may share a GPU) | host (staged)", kNoMin,
             kNoMax, kCuda},
        c.ring_link);
  visit(Knob{"--bucket-mb", "bucket_mb",
             "gradient bucket cap in MiB (0: a bucket per gradient piece, a parameter or a --grad-slice-mb row block; "
             "each end may have a cap of its own: --first-bucket-mb, --last-bucket-mb)",
             0, kMaxMiB, kMath | kNotInSweep},
        c.bucket_mb);
  visit(Knob{"--overlap", "overlap", "all-reduce buckets while backward runs: on | off", kNoMin, kNoMax,
             kOnOff | kNotInSweep},
        c.overlap);
  visit(Knob{"--first-bucket-mb", "first_bucket_mb",
             "cap of the first bucket to become ready, MiB (the last layers', the first to launch: PyTorch's first "
             "bucket, 1 MiB there; 0: its first piece alone); auto: cut as the others",
             0, kMaxMiB, kMath, "MiB|auto", kAutoEndBucketMb},
        c.first_bucket_mb);
  visit(Knob{"--last-bucket-mb", "last_bucket_mb",
             "cap of the bucket that closes backward, MiB (the first layers', the last to launch: the tail no "
             "backward hides; 0: its last piece alone); auto: cut as the others, as PyTorch does",
             0, kMaxMiB, kMath, "MiB|auto", kAutoEndBucketMb},
        c.last_bucket_mb);
  visit(Knob{"--bucket-rule", "bucket_rule",
             "how a cap closes a bucket: within (it stays within its cap; a piece past it alone) | reach (it takes "
             "pieces until it reaches its cap, that piece included: PyTorch DDP's rule). PyTorch's layout: "
             "--first-bucket-mb 1 --last-bucket-mb auto --bucket-rule reach",
             kNoMin, kNoMax, kMath},
        c.bucket_rule);
  visit(Knob{"--grad-slice-mb", "grad_slice_mb",
             "compute and announce weight gradients in row blocks of this size, MiB: N (0: whole weights) or "
             "auto (1 with the update in backward on the CPU, else 0)",
             0, kMaxMiB, kMath, "MiB|auto", kAutoGradSliceMb},
        c.grad_slice_mb);
  visit(Knob{"--grad-accum", "grad_accum", "micro-batches per step, gradients communicated on the last", 1, kNoMax,
             kMath},
        c.grad_accum);
  visit(Knob{"--link", "link",
             "emulated interconnect, every hop: none | 1gbe | 10gbe | 25gbe | 100gbe-ib | pcie4 | nvlink4 | "
             "nvlink4-nccl | ndr400-x8 (the last two: NCCL's figures, for predict); or "
             "per class of hop: intra=P,inter=P (within a node, per pair; across nodes, through the node's NIC, "
             "shared by its ranks)"},
        c.link);
  visit(Knob{"--link-latency-us", "link_latency_us",
             "the link's latency, us: N or auto (the --link preset's); N replaces a single preset's, or alone makes a "
             "link of its own, not with intra=,inter=",
             0, kMaxLabMs * 1e3, 0, "US|auto", kPresetLinkValue},
        c.link_latency_us);
  visit(Knob{"--link-gbps", "link_gbps",
             "the link's bandwidth, Gbit/s: N (1e-6 or more) or auto (the --link preset's); N replaces a single "
             "preset's, or alone makes a link of its own, not with intra=,inter=",
             kMinLinkGbps, kNoMax, 0, "GBIT/S|auto", kPresetLinkValue},
        c.link_gbps);
  visit(Knob{"--ranks-per-node", "ranks_per_node",
             "emulate nodes of K consecutive ranks (K divides the ranks; 0: the hosts are the nodes); ranks "
             "on different nodes talk MPI and take --link inter=",
             0, kNoMax, kNotInSuite},
        c.ranks_per_node);
  visit(Knob{"--threads", "threads",
             "OpenBLAS threads per rank: N, or auto (the cores this rank may use: its --bind-to binding, else "
             "the host's cores / ranks on the host; Open MPI's default one-core binding is lifted)",
             1, kNoMax, 0, "N|auto", 0},
        c.blas_threads);
  visit(Knob{"--optimizer-in-backward", "optimizer_in_backward",
             "update each bucket's parameters on a thread of their own as soon as backward is done with them: "
             "on | off | auto (on when the BLAS threads leave this rank a core idle; with --device cuda, on "
             "updates bucket by bucket after backward, each behind its all-reduce, and auto is off)"},
        c.optimizer_in_backward);
  visit(Knob{"--zero-stage", "zero_stage",
             "ZeRO stage: 0 (every rank updates every parameter) or 1 (the update sharded: gradients "
             "reduce-scattered, each rank updates its share, parameters all-gathered; CPU, --comm ring)",
             0, 1},
        c.zero_stage);
  visit(Knob{"--data-cost-ms", "data_cost_ms",
             "input pipeline (the MLP, or --device cuda): host cost per sample, ms (a sleep)", 0, kMaxLabMs},
        c.data_cost_ms);
  // At most 1024, past any host's cores for one rank: 100000 ran into the process's thread limit after the header.
  visit(Knob{"--loader-threads", "loader_threads",
             "input pipeline (the MLP, or --device cuda): worker threads (0: in the training loop)", 0, 1024},
        c.loader_threads);
  visit(Knob{"--prefetch", "prefetch", "input pipeline: batches the CPU MLP's loader threads prepare ahead", 1},
        c.prefetch);
  visit(Knob{"--slow-rank", "slow_rank", "lab: the straggling rank (of --straggler-ms or --busy-threads)", 0},
        c.slow_rank);
  visit(Knob{"--straggler-ms", "straggler_ms", "lab: the slow rank sleeps this long before each batch fetch", 0,
             kMaxLabMs},
        c.straggler_ms);
  visit(Knob{"--busy-threads", "busy_threads",
             "lab: a noisy neighbour: from the first step the slow rank's compute thread and this many busy "
             "threads share the core it is on",
             0, 64, kNotInSuite},
        c.busy_threads);
  visit(Knob{"--extra-allreduce-mb", "extra_allreduce_mb", "lab: an extra all-reduce of this size every step", 0,
             kMaxMiB},
        c.extra_allreduce_mb);
  visit(Knob{"--rank0-work-ms", "rank0_work_ms", "lab: rank 0 works this long, then every rank barriers", 0, kMaxLabMs},
        c.rank0_work_ms);
  visit(Knob{"--barrier-every", "barrier_every", "lab: ... every this many steps", 1}, c.barrier_every);
  visit(Knob{"--timeout-s", "timeout_s", "watchdog: abort the job after this long without progress (0: off)", 0, 1e7},
        c.timeout_s);
  visit(Knob{"--flush-every", "flush_every", "write the run so far to <out>.partial every N steps (0: off)", 0},
        c.flush_every);
  visit(Knob{"--check-sync", "check_sync", "compare parameters across ranks every N steps (0: off)", 0}, c.check_sync);
  visit(Knob{"--skip-nonfinite", "skip_nonfinite", "skip a step with a non-finite loss or gradient (default: stop)"},
        c.skip_nonfinite);
  visit(Knob{"--checkpoint", "checkpoint", "save parameters and optimizer state to this HDF5 file at the end", kNoMin,
             kNoMax, kOneRun},
        c.checkpoint);
  visit(Knob{"--checkpoint-every", "checkpoint_every", "... and every N steps (0: only at the end)", 0, kNoMax,
             kOneRun},
        c.checkpoint_every);
  visit(Knob{"--resume", "resume", "continue from this checkpoint, at its step (same settings)", kNoMin, kNoMax,
             kOneRun},
        c.resume);
  visit(Knob{"--fault", "fault", "inject a fault: none | hang | kill | throw | nan | diverge", kNoMin, kNoMax, kOneRun},
        c.fault);
  visit(Knob{"--fault-rank", "fault_rank", "the rank that injects the fault", 0, kNoMax, kOneRun}, c.fault_rank);
  visit(Knob{"--fault-step", "fault_step",
             "the step at which it does, counted from 0 (the progress lines count from 1)", 0, kNoMax, kOneRun},
        c.fault_step);
  visit(Knob{"--out", "out", "run file (HDF5); default runs/train_np<N>_<time>.h5", kNoMin, kNoMax,
             kOneRun | kPerRank},
        c.out);
  visit(Knob{"--force", "force", nullptr, kNoMin, kNoMax, kPerRank}, c.force);
  // One run's: suite and sweep print their tables, not their runs' progress lines.
  visit(Knob{"--quiet", nullptr, "print only errors", kNoMin, kNoMax, kOneRun}, c.quiet);
  visit(Knob{"--log-every", "log_every", "the progress line every N steps (0: at most once a second)", 0, kNoMax,
             kOneRun},
        c.log_every);
}

// A range of steps "A:B" (--profile-steps, timeline --steps) as {A, B} (0 <= A <= B); {-1, -1} when empty. Throws
// std::invalid_argument naming the flag.
inline std::pair<int, int> parse_step_range(const std::string& text, const char* flag) {
  if (text.empty()) return {-1, -1};
  int first = -1, last = -1, used = 0;
  long long a = -1, b = -1;
  if (std::sscanf(text.c_str(), "%lld:%lld%n", &a, &b, &used) != 2 || used != static_cast<int>(text.size()) || a < 0 ||
      b < a || b > INT_MAX)
    throw std::invalid_argument(std::string(flag) + " must be A:B with 0 <= A <= B (got '" + text + "')");
  first = static_cast<int>(a), last = static_cast<int>(b);
  return {first, last};
}
inline std::pair<int, int> parse_profile_steps(const std::string& text) {
  return parse_step_range(text, "--profile-steps");
}

// A float flag as the decimal the user typed (0.9, not 0.8999999761581421).
inline double decimal(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.7g", x);  // 7 significant digits round-trip any float
  return std::strtod(text, nullptr);
}

// Why the update in backward (each bucket updated as soon as it is reduced) cannot run with the rest of c, or "": the
// CLI refuses such a config, and so does a Trainer built from one directly.
inline std::string update_in_backward_conflict(const TrainConfig& c) {
  if (!c.update_in_backward()) return "";
  if (c.skip_nonfinite)
    return "--optimizer-in-backward on and --skip-nonfinite exclude each other: a step can only be skipped before "
           "any bucket is updated";
  if (c.optimizer.clips())
    return "--optimizer-in-backward on and --grad-clip exclude each other: clipping needs the norm of every "
           "gradient before any bucket is updated";
  if (c.zero_stage == 1)
    return "--zero-stage 1 and --optimizer-in-backward on exclude each other: the sharded update runs after backward";
  return "";
}

// --attention auto as it runs (auto_attention: cuDNN's where its library loads on every rank, no sequence is a single
// token and rows are not packed, else our fused kernels, else unfused; docs/GPU.md, "Fused attention"); an explicit
// choice as given (validate refuses what cannot run).
inline AttentionKind resolved_attention(const TrainConfig& c, bool cudnn_available) {
  if (c.attention) return *c.attention;
  if (!c.transformer()) return AttentionKind::kUnfused;
  const TransformerConfig m = TransformerConfig::preset(to_string(c.model));
  // cuDNN takes no single-token sequences: with --min-len 1 a batch could be one. Nor packed rows as ours come
  // (validate_cuda says why).
  return auto_attention(c.device == Device::kCuda && c.precision == Precision::kBf16, m.d_model / m.heads,
                        cudnn_available && c.min_len >= 2 && c.batching != Batching::kPack);
}

// What the choices left to "auto" depend on, as this rank finds it (launcher/run.cpp gathers it, the same on every
// rank where the ranks must agree).
struct RunFacts {
  int cores = 1;                       // the cores this rank may use (cores_for_rank): its own BLAS threads
  bool spare_core_every_rank = false;  // every rank has a core its BLAS threads leave idle
  bool cudnn_available = false;        // cuDNN's attention loads on every rank
};

// A size in MiB (--grad-slice-mb, --extra-allreduce-mb) as a count of fp32 elements.
inline int64_t floats_in_mb(double mb) { return static_cast<int64_t>(mb * 1048576.0 / sizeof(float)); }

// --grad-slice-mb as it runs: auto (see resolved) is 1 MiB with the update in backward on the CPU, else 0 (whole
// weights). Not on the GPU: 1 MiB row blocks cut gpt2-small's weight gradients into ~750 small GEMMs, and its
// backward took 63.8 ms instead of 25.3 (2 ranks sharing an H200, docs/BENCHMARKS.md).
inline double resolved_grad_slice_mb(const TrainConfig& c) {
  if (c.grad_slice_mb != kAutoGradSliceMb) return c.grad_slice_mb;
  return c.update_in_backward() && c.device == Device::kCpu ? 1.0 : 0.0;
}

// The row blocks' size as the models take it (set_grad_piece_elements: 0 = whole weights, else blocks of whole rows,
// one at least): a size below one float is still row blocks, not whole weights by rounding down to 0.
inline int64_t grad_slice_elements(const TrainConfig& c) {
  const double mb = resolved_grad_slice_mb(c);
  return mb > 0 ? std::max<int64_t>(1, floats_in_mb(mb)) : 0;
}

// The bucket caps as the run cuts its buckets (ddp/buckets.h).
inline BucketCaps bucket_caps(const TrainConfig& c) {
  return BucketCaps::mib(c.bucket_mb, c.first_bucket_mb, c.last_bucket_mb, c.bucket_rule);
}

// The bucket flags in one phrase, as the train header, the report and predict print them:
// "cap 25 MiB, first auto, last 1 MiB, within".
inline std::string bucket_layout_text(double bucket_mb, double first_mb, double last_mb, BucketRule rule) {
  const auto mib = [](double mb) {
    char text[32];
    std::snprintf(text, sizeof text, "%g MiB", mb);
    return mb == kAutoEndBucketMb ? std::string("auto") : std::string(text);
  };
  return "cap " + mib(bucket_mb) + ", first " + mib(first_mb) + ", last " + mib(last_mb) + ", " + to_string(rule);
}
inline std::string bucket_layout_text(const TrainConfig& c) {
  return bucket_layout_text(c.bucket_mb, c.first_bucket_mb, c.last_bucket_mb, c.bucket_rule);
}

// The config with every "auto" resolved, as the run file stores it: --threads auto takes the rank's cores; the update
// in backward takes a core only where the BLAS threads leave one idle on every rank (it slices the gradients, and the
// ranks' buckets must match even where a host's cores split unevenly among its ranks), and never with --skip-nonfinite
// or --grad-clip (both must see every gradient before anything is updated) or ZeRO-1; --grad-slice-mb auto: with the
// update in backward on the CPU, 1 MiB row blocks. The update of the layer backward ends with then follows its gradient
// block by block, and only its last block's is left after backward (docs/ARCHITECTURE.md, "The update in backward").
// Otherwise whole weights, as PyTorch's autograd produces them.
inline TrainConfig resolved(TrainConfig c, const RunFacts& facts) {
  if (c.blas_threads == 0) c.blas_threads = facts.cores;
  if (!c.optimizer_in_backward) {
    const bool needs_every_gradient_first = c.skip_nonfinite || c.optimizer.clips();
    c.optimizer_in_backward =
        c.device == Device::kCpu && !needs_every_gradient_first && c.zero_stage == 0 && facts.spare_core_every_rank
            ? OnOff::kOn
            : OnOff::kOff;
  }
  c.grad_slice_mb = resolved_grad_slice_mb(c);
  c.attention = resolved_attention(c, facts.cudnn_available);
  return c;
}

// The communication options a TrainConfig asks for. Throws std::invalid_argument on a bad --link.
inline CommOptions comm_options(const TrainConfig& c) {
  CommOptions o;
  o.impl = c.comm;
  o.wire = c.comm_dtype;
  o.link = parse_links(c.link, c.link_latency_us, c.link_gbps);
  o.ranks_per_node = c.ranks_per_node;
  return o;
}

namespace knob_json {
template <typename T>
nlohmann::json stored(const T& value) { return value; }
inline nlohmann::json stored(float value) { return decimal(value); }
template <typename E>
nlohmann::json stored(const AutoChoice<E>& value) { return value ? nlohmann::json(*value) : nlohmann::json("auto"); }
template <typename T>
void load(const nlohmann::json& j, T& value) { j.get_to(value); }
template <typename E>
void load(const nlohmann::json& j, AutoChoice<E>& value) {
  const std::string name = j.get<std::string>();
  value = name == "auto" ? AutoChoice<E>() : AutoChoice<E>(parse_choice<E>(name, "a stored choice"));
}
}  // namespace knob_json

// The checkpoint's keys whose values a run resumed from it must repeat, because they change what a step computes:
// the knobs marked kMath and the world size; under --comm hier the node of each rank (it sums within each node first:
// the nodes it found, not the --ranks-per-node that asked, since 0 takes the hosts); with a cosine schedule --steps
// (it decays over the run's length); on the GPU the attention, --deterministic and --gemm-algo (their kernels, the
// order of dQ's sums and the cuBLASLt algorithms change the bits; the CPU has one of each). The rest (overlap, links,
// the lab's knobs, paths) only moves time.
inline std::vector<std::string> keys_a_resume_repeats(const TrainConfig& c) {
  std::vector<std::string> keys = {"world_size"};
  visit_knobs(c, [&](const Knob& knob, const auto&) {
    if (knob.key && (knob.traits & kMath)) keys.push_back(knob.key);
  });
  if (c.comm == AllreduceImpl::kHier) keys.push_back("node_of_rank");
  if (c.optimizer.lr_schedule == LrSchedule::kCosine) keys.push_back("steps");
  if (c.device == Device::kCuda) keys.insert(keys.end(), {"attention", "deterministic", "gemm_algo"});
  return keys;
}

// The settings as a JSON object keyed by the flags' names (--min-len is min_len); the few with no flag (beta1, beta2,
// eps) by their own. Files from before the keys followed the flags are read through upgrade_config_keys.
inline nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  visit_knobs(c, [&](const Knob& knob, const auto& value) {
    if (!knob.key) return;
    j[knob.key] = knob_json::stored(value);
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>)
      if (knob.auto_text && static_cast<double>(value) == knob.auto_value) j[knob.key] = "auto";
  });
  return j;
}

// A stored config (a run file's, a checkpoint's) as a TrainConfig: a key it lacks (an older file) keeps the default.
// Throws std::invalid_argument on a value of the wrong type or name, naming its key.
inline TrainConfig config_from_json(const nlohmann::json& j) {
  TrainConfig c;
  if (!j.is_object()) return c;
  visit_knobs(c, [&](const Knob& knob, auto& value) {
    if (!knob.key || !j.contains(knob.key) || j.at(knob.key).is_null()) return;
    try {
      if constexpr (std::is_arithmetic_v<std::decay_t<decltype(value)>>)
        if (knob.auto_text && j.at(knob.key) == "auto") {  // a number's "auto" still unresolved when stored
          value = static_cast<std::decay_t<decltype(value)>>(knob.auto_value);
          return;
        }
      knob_json::load(j.at(knob.key), value);
    } catch (const nlohmann::json::exception& e) {  // "[json.exception.type_error.302] type must be ..."
      const std::string what = e.what();
      const size_t id_end = what.find("] ");
      throw std::invalid_argument(std::string(knob.key) + ": " +
                                  (id_end == std::string::npos ? what : what.substr(id_end + 2)));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(knob.key) + ": " + e.what());
    }
  });
  return c;
}

}  // namespace ddplab
