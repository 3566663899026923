#include "launcher/cli.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "config/knob_flags.h"
#include "data/loader.h"
#include "data/token_files.h"
#include "data/tokens.h"
#include "model/attention_kind.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "record/files.h"
#include "runtime/errors.h"
#include "runtime/watchdog.h"
#include "train/token_batches.h"

namespace ddplab {
namespace {

using Head = TransformerConfig::Head;

// What the GPU path does not do (yet), refused on every rank alike rather than ignored.
void validate_cuda(const TrainConfig& c) {
  const auto refuse = [](bool ok, const std::string& what) { require(ok, "--device cuda: " + what); };
  refuse(c.comm == AllreduceImpl::kNccl || c.comm == AllreduceImpl::kRing,
         "reduces gradients with NCCL or our ring: pass --comm nccl or ring (got --comm " + std::string(to_string(c.comm)) +
             ")");
  refuse(c.comm == AllreduceImpl::kRing || c.ring_link == RingLinkKind::kAuto, "--ring-link needs --comm ring");
  refuse(c.optimizer.kind == OptimizerKind::kAdamW,
         "--optimizer " + std::string(to_string(c.optimizer.kind)) + " has no CUDA kernel yet (use adamw)");
  refuse(!comm_options(c).link.emulated() || c.comm == AllreduceImpl::kRing,
         "--link emulates the links of our ring (--comm ring); NCCL's transfers are its own");
  refuse(c.ranks_per_node == 0 || c.comm == AllreduceImpl::kRing,
         "--ranks-per-node (emulated nodes) needs --comm ring, whose --link it shapes");
  if (c.attention == AttentionKind::kFused || c.attention == AttentionKind::kCudnn) {
    const bool fused = c.attention == AttentionKind::kFused;
    const std::string flag = "--attention " + std::string(to_string(*c.attention));
    refuse(c.transformer(), flag + " needs a transformer --model (the MLP has no attention)");
    refuse(c.precision == Precision::kBf16, flag + " needs --precision bf16 (its kernels are bf16; got --precision " +
                                                to_string(c.precision) + ")");
    const TransformerConfig m = TransformerConfig::preset(to_string(c.model));
    const int hs = m.d_model / m.heads;
    refuse(fused ? fused_attention_supports_head_size(hs) : cudnn_attention_supports_head_size(hs),
           flag + (fused ? " has kernels for heads of " + std::string(fused_attention_head_sizes())
                         : std::string(" takes heads of a multiple of 8 up to 128")) +
               " dimensions; --model " + to_string(c.model) + " has " + std::to_string(hs) + " (d_model " +
               std::to_string(m.d_model) + " / " + std::to_string(m.heads) + " heads)");
    refuse(fused || c.min_len >= 2, "--attention cudnn needs --min-len 2 or more (cuDNN takes no single-token "
                                    "sequences; got --min-len " + std::to_string(c.min_len) + ")");
  }
  // Packed rows: only the fused kernels keep each sequence's queries to its own keys in place. cuDNN's ragged layout
  // wants each sequence as a row of its own (a row's offset per sequence, the batch re-cut every step), and the
  // unfused attention masks by length alone.
  if (c.batching == Batching::kPack && c.transformer()) {
    refuse(c.precision == Precision::kBf16,
           "--batching pack needs --precision bf16: only the fused attention, bf16, "
           "keeps each packed sequence to its own keys (got --precision " +
               std::string(to_string(c.precision)) + ")");
    refuse(!c.attention || *c.attention == AttentionKind::kFused,
           "--batching pack needs --attention fused (or auto): cuDNN's takes a sequence per row, and the unfused "
           "attention masks by length alone (got --attention " +
               std::string(c.attention ? to_string(*c.attention) : "auto") + ")");
    const TransformerConfig m = TransformerConfig::preset(to_string(c.model));
    refuse(fused_attention_supports_head_size(m.d_model / m.heads),
           "--batching pack needs the fused attention, whose kernels have heads of " +
               std::string(fused_attention_head_sizes()) + " dimensions; --model " + to_string(c.model) + " has " +
               std::to_string(m.d_model / m.heads));
  }
  std::pair<int, int> profiled;
  try {
    profiled = parse_profile_steps(c.profile_steps);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // Otherwise the profiler would never stop (or never start), and the capture would hold the run's end or nothing.
  require(profiled.second < c.steps, "--profile-steps " + c.profile_steps + " goes past the run's last step, " +
                                         std::to_string(c.steps - 1) + " (--steps " + std::to_string(c.steps) + ")");
}

bool offered(const Knob& knob, FlagSet flags) {
  if (!knob.flag) return false;
  if (flags == FlagSet::kSuite) return !(knob.traits & kNotInSuite);
  if (flags == FlagSet::kSweep) return !(knob.traits & kNotInSweep);
  return true;
}

// A flag that the run reads only where another knob is set: given without it, refused rather than ignored
// (--fault-step 3 without --fault ran no fault, --prefetch 8 without loader threads prefetched nothing).
struct FlagPartner {
  const char* flag;
  bool (*read)(const TrainConfig&);
  const char* needs;  // completes "<flag> needs ..."
};
constexpr FlagPartner kFlagPartners[] = {
    {"--fault-rank", [](const TrainConfig& c) { return c.fault != Fault::kNone; },
     "a --fault other than none (it names the rank that injects it)"},
    {"--fault-step", [](const TrainConfig& c) { return c.fault != Fault::kNone; },
     "a --fault other than none (it names the step at which it fires)"},
    {"--prefetch", [](const TrainConfig& c) { return c.reads_prefetch(); },
     "--loader-threads 1 or more, with the MLP on the CPU (it counts the batches their loader prepares ahead)"},
    {"--loader-threads", [](const TrainConfig& c) { return c.has_input_pipeline(); },
     "the MLP or --device cuda (the transformer on the CPU makes its batches within the step, with no input "
     "pipeline to emulate)"},
    {"--data-cost-ms", [](const TrainConfig& c) { return c.has_input_pipeline(); },
     "the MLP or --device cuda (the transformer on the CPU makes its batches within the step, with no input "
     "pipeline to emulate)"},
    {"--barrier-every", [](const TrainConfig& c) { return c.rank0_work_ms > 0; },
     "--rank0-work-ms above 0 (it spaces rank 0's work and the barrier after it)"},
    {"--slow-rank", [](const TrainConfig& c) { return c.straggler_ms > 0 || c.busy_threads > 0; },
     "--straggler-ms or --busy-threads above 0 (they are what slows it)"},
    {"--momentum", [](const TrainConfig& c) { return c.optimizer.kind == OptimizerKind::kSgd; },
     "--optimizer sgd (AdamW's moments are its betas)"},
};

}  // namespace

void add_train_flags(CLI::App* app, TrainConfig& c, FlagSet flags) {
  CLI::Option* warmup = nullptr;
  std::vector<CLI::Option*> synthetic, transformer_only, mlp_only, cuda_only;  // the flags of each trait, as given
  visit_knobs(c, [&](const Knob& knob, auto& value) {
    if (!offered(knob, flags)) return;
    CLI::Option* option = add_knob_flag(app, knob, value);
    const void* field = &value;
    if (field == &c.warmup_steps) warmup = option;
    if (knob.traits & kSynthetic) synthetic.push_back(option);
    if (knob.traits & kTransformer) transformer_only.push_back(option);
    if (knob.traits & kMlp) mlp_only.push_back(option);
    if (knob.traits & kCuda) cuda_only.push_back(option);
  });
  // --force's meaning depends on the command: one run's file, or the folder of many.
  if (CLI::Option* force = app->get_option_no_throw("--force"))
    force->description(flags == FlagSet::kTrain ? "overwrite an existing run file or --checkpoint file"
                                                : "reuse an existing --out-dir, overwriting its files");
  // A --warmup-steps that leaves no step to measure cannot be what was meant: refused. The default (5) is not a
  // request, so a shorter run keeps its last step (RunRecord::first_steady_step), as its "steady state" line says.
  // A flag the run would not read is refused, not ignored: --classes 4 with a transformer trained its preset's 16.
  // Not in a suite, whose cases choose the model after its flags are parsed.
  const bool one_model = flags != FlagSet::kSuite;
  app->parse_complete_callback([app, &c, warmup, synthetic, transformer_only, mlp_only, cuda_only, one_model] {
    const auto given = [app](const char* flag) {
      const CLI::Option* option = app->get_option_no_throw(flag);
      return option && option->count() > 0;
    };
    // An empty path given is a mistake (a variable left unset), not a request for none or for the default.
    const std::pair<const char*, const std::string*> paths[] = {
        {"--out", &c.out}, {"--checkpoint", &c.checkpoint}, {"--resume", &c.resume}};
    for (const auto& [flag, path] : paths)
      require(!given(flag) || !path->empty(), std::string(flag) + " needs a path (got an empty one)");
    require(warmup->count() == 0 || c.warmup_steps < c.steps,
            "--warmup-steps " + std::to_string(c.warmup_steps) + " leaves none of the " + std::to_string(c.steps) +
                " steps (--steps) to measure: it must be smaller");
    for (const CLI::Option* option : cuda_only)
      require(c.device == Device::kCuda || option->count() == 0,
              option->get_name() + " needs --device cuda (the CPU run has nothing it sets): leave it out");
    if (one_model) {
      for (const CLI::Option* option : c.transformer() ? mlp_only : transformer_only)
        require(option->count() == 0, c.transformer()
                                          ? option->get_name() + " shapes the MLP (--model mlp), and --model " +
                                                to_string(c.model) + " is a transformer: leave it out"
                                          : option->get_name() +
                                                " needs a transformer --model (got --model mlp, which trains "
                                                "on synthetic features): leave it out or name one");
      // A suite's cases set the partners themselves (its straggler, barrier and input cases).
      for (const FlagPartner& partner : kFlagPartners)
        require(!given(partner.flag) || partner.read(c), std::string(partner.flag) + " needs " + partner.needs);
    }
    if (c.data.empty()) return;
    for (const CLI::Option* option : synthetic)
      require(option->count() == 0, option->get_name() +
                                        " shapes synthetic sequences, and --data reads its shards in "
                                        "windows of --max-len tokens instead: leave it out");
    // What the run file then says of them: every sequence a window of --max-len, the epoch the shards' windows (0).
    c.lengths = LengthDist::kFixed;
    c.min_len = c.max_len;
    c.outlier_prob = 0;
    c.epoch_size = 0;
  });
}

namespace {

void at_least(const char* flag, long long value, long long min) {
  require(value >= min,
          std::string(flag) + " must be at least " + std::to_string(min) + " (got " + std::to_string(value) + ")");
}

// The rules between knobs of a transformer's data.
void validate_tokens(const TrainConfig& c) {
  require(c.batching != Batching::kPack || c.head == Head::kCausalLM,
          "--batching pack needs --head lm (the classifier pools one sequence per row)");
  require(c.data.empty() || c.head == Head::kCausalLM,
          "--data needs --head lm (token shards hold no class labels for the classify head)");
  require(c.val_data.empty() || c.head == Head::kCausalLM,
          "--val-data needs --head lm (token shards hold no class labels for the classify head)");
  if (!c.data.empty()) at_least("--max-len", c.max_len, 2);  // a window: a token and its next
  if (c.head == Head::kCausalLM) at_least("--min-len", c.min_len, 2);  // a token and its next
  at_least("--max-len", c.max_len, c.min_len);
  // A batch holds at least one sequence (a pack row is max_len long): below the longest, the budget cannot hold.
  require(c.max_tokens >= c.max_len || (c.batching != Batching::kToken && c.batching != Batching::kPack),
          "--max-tokens " + std::to_string(c.max_tokens) + " is below --max-len " + std::to_string(c.max_len) +
              ": a batch of one longest sequence would exceed it (--batching " + to_string(c.batching) + ")");
  if (c.data.empty()) at_least("--epoch-size", c.epoch_size, 1);
}

// What a step's sequences are dealt to: every rank's every micro-batch, each of which needs one at least.
std::string slots_text(const TrainConfig& c, int ranks) {
  return std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") +
         (c.grad_accum > 1 ? " x " + std::to_string(c.grad_accum) + " micro-batches (--grad-accum)" : "");
}

// The shards of --data or --val-data (flag), opened as the run will read them: each one llm.c's format, every token
// inside the model's vocabulary (this rank reads shards scan_part, scan_part + scan_parts, ...), and --data's hold a
// window for every rank.
void validate_token_shards(const TrainConfig& c, const std::string& flag, const std::string& pattern, int ranks,
                           int scan_part, int scan_parts) {
  try {
    const TokenFiles shards(pattern, c.max_len);
    const int64_t windows = shards.sequences();
    require(flag == "--val-data" || windows >= int64_t{ranks} * c.grad_accum,
            flag + " " + pattern + ": " + std::to_string(windows) + (windows == 1 ? " window of " : " windows of ") +
                std::to_string(c.max_len) + " tokens, fewer than the " + slots_text(c, ranks) +
                "; lower --max-len or add tokens");
    const int vocab = TransformerConfig::preset(to_string(c.model)).vocab;
    // Inside the run's setup wait (launcher/run.cpp): a scan of many GB is no hang.
    const std::string outside = shards.first_token_outside(vocab, scan_part, scan_parts, watchdog::note_progress);
    require(outside.empty(), flag + " " + outside + ", outside --model " + to_string(c.model) + "'s vocabulary of " +
                                 std::to_string(vocab) + " tokens");
  } catch (const std::invalid_argument& e) {
    throw UsageError(flag + " " + e.what());
  }
}

// This host's memory, RAM and swap: what a rank allocates past it cannot be had, whatever else runs.
uint64_t host_memory_bytes() {
  struct sysinfo info;
  if (sysinfo(&info) != 0) return UINT64_MAX;
  return (static_cast<uint64_t>(info.totalram) + info.totalswap) * info.mem_unit;
}

// What the flags make a rank allocate before its first step is done, within this host's memory: past it, the run
// would fail in that step instead of before any work. The least each takes, so that a refusal is certain.
void validate_memory(const TrainConfig& c, int ranks) {
  const uint64_t memory = host_memory_bytes();
  const std::string host = " on this host, whose memory is " + bytes_text(memory);
  if (c.transformer() && c.data.empty()) {
    const int64_t most = static_cast<int64_t>(memory / BatchPlan::kLeastBytesPerSequence);
    require(c.epoch_size <= most, "--epoch-size must be at most " + std::to_string(most) + host +
                                      ": an epoch's plan takes " + std::to_string(BatchPlan::kLeastBytesPerSequence) +
                                      " bytes a sequence (got " + std::to_string(c.epoch_size) + ")");
  }
  if (!c.transformer() && c.device == Device::kCpu && c.loader_threads > 0) {  // the MLP's loader (train/workload.cpp)
    const LoaderConfig loader{c.batch, c.data_cost_ms, c.loader_threads, c.prefetch};
    const int64_t most =
        std::max<int64_t>(0, static_cast<int64_t>(memory / BatchLoader::slot_bytes(loader, c.mlp.input_dim)) - 1);
    require(BatchLoader::slots(loader) - 1 <= most,
            "--prefetch must be at most " + std::to_string(most) + host +
                ": the loader holds --prefetch + 1 batches of " + std::to_string(c.batch) + " samples (--batch) of " +
                std::to_string(c.mlp.input_dim) + " features (--input-dim) (got " + std::to_string(c.prefetch) + ")");
  }
  if (c.device == Device::kCpu) {
    // The activations a step keeps for backward, at the least (a typo such as --batch 20000000 ran into bad_alloc
    // after the header): the MLP's input, each hidden layer before and after GELU, its logits and their gradient;
    // the transformer's as Transformer::activation_elements counts them, for the micro-batch that holds the epoch's
    // longest sequence: batched by sample or length bucket, its --batch rows are padded to it; otherwise it is at
    // least that sequence.
    double floats = 0;
    std::string sized_by;
    if (!c.transformer()) {
      const MlpConfig& m = c.mlp;
      floats =
          static_cast<double>(c.batch) * (m.input_dim + 2.0 * m.hidden_dim * m.num_hidden_layers + 2.0 * m.num_classes);
      sized_by = "--batch " + std::to_string(c.batch) + " at the MLP's widths";
      // Its parameters and their gradients, 8 bytes a parameter at the least (AdamW's moments come on top).
      const double parameters = mlp_parameter_count(m);
      require(8 * parameters <= static_cast<double>(memory),
              "the MLP's widths (--input-dim, --hidden, --layers, --classes) make " + value_text(parameters) +
                  " parameters, whose values and gradients take at least " +
                  bytes_text(static_cast<uint64_t>(std::min(8 * parameters, 1e18))) + ", more than this host's " +
                  "memory, " + bytes_text(memory) + ": lower them");
    } else {
      const int longest = TokenBatches::longest_sequence(c);
      const bool padded = c.batching == Batching::kSample || c.batching == Batching::kBucket;
      int64_t rows = padded ? c.batch : 1;
      bool budget = false;  // the rows come from the token budget and the epoch's share
      if (!padded && c.data.empty()) {
        // token and pack: a micro-batch fills its budget (--max-tokens) while its slot's share of the epoch lasts. The
        // largest slot holds at least the average share, --epoch-size / (ranks x --grad-accum) sequences of at least
        // --min-len tokens each; a budget past it takes the whole share.
        const int64_t share = c.epoch_size / (int64_t{ranks} * c.grad_accum);
        const int64_t least_tokens = std::min(TokenBatches::max_tokens(c) - longest, share * c.min_len);
        rows = std::clamp<int64_t>(least_tokens / longest, 1, INT_MAX);  // the model counts rows in an int
        budget = rows > 1;
      }
      const double tokens = static_cast<double>(rows) * longest;
      floats = Transformer<float>::activation_elements(TokenBatches::model_config(c), static_cast<int>(rows), longest);
      const std::string sequence =
          longest == c.max_len ? "--max-len" : "the epoch's longest sequence, " + std::to_string(longest) + " tokens";
      sized_by = std::to_string(static_cast<int64_t>(tokens)) + " tokens a micro-batch (" +
                 (budget ? "--max-tokens " + std::to_string(c.max_tokens) + " over --epoch-size " +
                               std::to_string(c.epoch_size) + " on " + slots_text(c, ranks) + ": at least " +
                               std::to_string(rows) + " rows of " + sequence
                         : (padded ? "--batch x " : "one sequence of ") + sequence) +
                 ") of --model " + to_string(c.model);
    }
    const double bytes = floats * sizeof(float);
    require(bytes <= static_cast<double>(memory),
            sized_by + " keeps at least " + bytes_text(static_cast<uint64_t>(std::min(bytes, 1e18))) +
                " of activations for backward, more than this host's memory, " + bytes_text(memory) + ": lower them");
    // --extra-allreduce-mb: a buffer of its own, on the host (on the GPU it is the device's memory)
    const double most = static_cast<double>(memory) / (1 << 20);
    require(c.extra_allreduce_mb <= most, "--extra-allreduce-mb must be at most " + value_text(most) + host + " (got " +
                                              value_text(c.extra_allreduce_mb) + ")");
  }
}

}  // namespace

void validate(const TrainConfig& c) {
  check_knob_ranges(c);
  require(c.data.empty() || c.transformer(),
          "--data needs a transformer --model (the MLP trains on synthetic features)");
  require(c.val_data.empty() || c.transformer(), "--val-data needs a transformer --model (the MLP has no token loss)");
  require(!c.val_data.empty() || (c.val_every == 0 && c.val_windows == 0),
          std::string(c.val_every != 0 ? "--val-every" : "--val-windows") + " needs --val-data");
  if (c.transformer()) validate_tokens(c);
  require(c.checkpoint_every == 0 || !c.checkpoint.empty(), "--checkpoint-every needs --checkpoint PATH");
  require(c.fault == Fault::kNone || c.fault_step < c.steps,
          "--fault-step " + std::to_string(c.fault_step) + " is past the run's last step (--steps " +
              std::to_string(c.steps) + "): the fault would never fire");
  // One file for two roles: the run file written at the end would replace the checkpoint, or fail on it after the
  // whole run.
  require(!same_file(c.out, c.checkpoint), "--out and --checkpoint name the same file (" + c.out +
                                               "): the run file and the checkpoint need a file each");
  require(!same_file(c.out, c.resume), "--out and --resume name the same file (" + c.out +
                                           "): the run file would replace the checkpoint it resumes from");
  const std::string in_backward = update_in_backward_conflict(c);
  require(in_backward.empty(), in_backward);
  require(c.optimizer.lr_schedule == LrSchedule::kCosine || c.optimizer.lr_final == 0,
          "--lr-final needs --lr-schedule cosine (it is where the decay ends; got --lr-schedule " +
              std::string(to_string(c.optimizer.lr_schedule)) + ")");
  if (c.zero_stage == 1) {
    require(c.device == Device::kCpu, "--zero-stage 1 needs --device cpu");
    require(c.comm == AllreduceImpl::kRing,
            "--zero-stage 1 needs --comm ring (it reduce-scatters and all-gathers on the ring)");
    require(c.comm_dtype == WireDtype::kFp32,
            "--zero-stage 1 needs --comm-dtype fp32 (the parameters travel unrounded)");
  }
  require(c.comm != AllreduceImpl::kMpi || c.comm_dtype == WireDtype::kFp32,
          "--comm mpi has no " + std::string(to_string(c.comm_dtype)) +
              " wire (MPI_Allreduce sums fp32 buffers as fp32); use --comm ring");
  try {
    comm_options(c);  // --link on either device
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (c.device == Device::kCuda) return validate_cuda(c);
  require(c.precision == Precision::kFp32,
          "--precision " + std::string(to_string(c.precision)) + " needs --device cuda (the CPU trains in fp32)");
  require(!c.attention || c.attention == AttentionKind::kUnfused,
          "--attention " + std::string(c.attention ? to_string(*c.attention) : "auto") +
              " needs --device cuda (the CPU has one attention)");
  require(c.comm != AllreduceImpl::kNccl, "--comm nccl needs --device cuda");
}

void validate_for_ranks(const TrainConfig& c, int ranks, int scan_part, int scan_parts) {
  const std::string job = " is not a rank of this " + std::to_string(ranks) + "-rank job";
  require(c.fault == Fault::kNone || c.fault_rank < ranks, "--fault-rank " + std::to_string(c.fault_rank) + job);
  // The watchdog watches waits, and a hung rank is found by its peers, waiting for it: alone it would sleep forever.
  require(c.fault != Fault::kHang || ranks > 1,
          "--fault hang needs 2 or more ranks: a hung rank is found by its peers' watchdogs, and 1 rank has none");
  require(c.slow_rank < ranks, "--slow-rank " + std::to_string(c.slow_rank) + job);
  // The global batch is an int where the trainers count it (a rank's share of the sample stream, batch x grad_accum;
  // the suite's batch x ranks), and read_run_file refuses a file with a larger one.
  require(int64_t{c.batch} * c.grad_accum <= INT_MAX / ranks,
          "--batch " + std::to_string(c.batch) + " x " + slots_text(c, ranks) + " is more than the " +
              std::to_string(INT_MAX) + " samples a step can count (the global batch): lower --batch");
  validate_memory(c, ranks);
  if (!c.transformer()) return;
  if (!c.val_data.empty()) validate_token_shards(c, "--val-data", c.val_data, ranks, scan_part, scan_parts);
  if (!c.data.empty())
    validate_token_shards(c, "--data", c.data, ranks, scan_part, scan_parts);
  else
    require(c.epoch_size >= int64_t{ranks} * c.grad_accum,
            "fewer sequences per epoch (--epoch-size " + std::to_string(c.epoch_size) + ") than the " +
                slots_text(c, ranks) + ": each needs at least one; raise --epoch-size");
}

}  // namespace ddplab
