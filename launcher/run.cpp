#include "launcher/run.h"

#include <cblas.h>
#include <dirent.h>
#include <hdf5.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "analysis/blame.h"
#include "analysis/format.h"
#include "analysis/report.h"
#include "comm/link_emulation.h"
#include "comm/topology.h"
#include "comm/transport.h"
#include "data/token_files.h"
#include "git_commit.h"
#include "kernels/cpu/blas_kernels.h"
#include "launcher/cli.h"
#include "launcher/page.h"
#include "launcher/rank_agreement.h"
#include "record/checkpoint.h"
#include "record/files.h"
#include "record/isolated_read.h"
#include "record/run_file.h"
#include "runtime/agreement.h"
#include "runtime/errors.h"
#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"
#include "train/clock.h"
#include "train/stop_signals.h"
#include "train/trainer.h"
#ifdef DDPLAB_HAVE_CUDA
#include "comm/nccl_allreduce.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_algo_table.h"
#endif

namespace ddplab {

std::string local_time_stamp() {
  char stamp[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  return stamp;
}

namespace {

std::string utc_now_iso8601() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string default_run_path(const std::string& command, int world_size) {
  return "runs/" + command + "_np" + std::to_string(world_size) + "_" + local_time_stamp() + ".h5";
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  return first_line(std::string(buf, len));
}

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::string blas_description() { return std::string(openblas_get_config()) + " core=" + openblas_get_corename(); }

std::string cuda_description() {
#ifdef DDPLAB_HAVE_CUDA
  std::string why;
  const bool cudnn = cuda::cudnn_attention_available(&why);
  return "built: " + cuda::describe(cuda::query_cuda()) +
         (cudnn ? "; cuDNN attention available" : "; no cuDNN attention: " + why);
#else
  return "not built (configure with nvcc present or -DDDPLAB_CUDA=ON)";
#endif
}

std::string gemm_algorithms_description() {
#ifdef DDPLAB_HAVE_CUDA
  if (!cuda::query_cuda().available) return "";
  cuda::GemmAlgoTable table(cuda::GemmAlgoTable::default_dir(), cuda::gemm_algo_table_file());
  if (table.path().empty()) return "timed ones kept nowhere (neither XDG_CACHE_HOME nor HOME is set)";
  return std::to_string(table.recorded()) + " problems timed on this GPU model so far, in " + table.path();
#else
  return "";
#endif
}

namespace {

std::vector<std::string> gather_hostnames(MPI_Comm comm) {
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(mine, &len);
  return gather_strings(mine, comm);
}

// Rank 0's kernels and why, and each rank that runs another family (another CPU, or a host that measured otherwise).
std::string blas_kernels_of_ranks(MPI_Comm comm) {
  const std::vector<std::string> cores = gather_strings(blas::kernels_in_use().core, comm);
  std::string text = blas::kernels_in_use().describe();
  for (size_t r = 1; r < cores.size(); ++r)
    if (cores[r] != cores[0]) text += "; rank " + std::to_string(r) + " runs " + cores[r];
  return text;
}

// Each rank's GPU as its PCI bus id, for a GPU run (the trainer has made the rank's device current); empty otherwise.
std::vector<std::string> gather_gpus(const TrainConfig& config, MPI_Comm comm) {
  if (config.device != Device::kCuda) return {};
#ifdef DDPLAB_HAVE_CUDA
  return gather_strings(cuda::query_cuda().bus_id, comm);
#else
  (void)comm;
  return {};
#endif
}

// The CPUs the ranks on rank 0's host may run on: the union of their affinity masks (bound ranks: their cores; an
// unbound run: the host's). What backward's and the comm threads share (analysis/predict.cpp).
int gather_host_cores(const std::vector<std::string>& hostnames, MPI_Comm comm) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0)
    for (long c = 0; c < std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)) && c < CPU_SETSIZE; ++c) CPU_SET(c, &mine);
  std::vector<cpu_set_t> all(hostnames.size());
  MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm);
  cpu_set_t host;
  CPU_ZERO(&host);
  for (size_t r = 0; r < all.size(); ++r)
    if (hostnames[r] == hostnames[0]) CPU_OR(&host, &host, &all[r]);
  return CPU_COUNT(&host);
}

// The ranks of comm on this rank's host (MPI_COMM_TYPE_SHARED). Collective.
int ranks_on_this_host(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const Topology hosts = detect_topology(comm, /*ranks_per_node=*/0);  // the hosts are the nodes
  return hosts.node_sizes()[hosts.node_of_rank[rank]];
}

}  // namespace

namespace {

// Open MPI 4 binds each rank of a job of at most 2 ranks to one core unless told otherwise (with more ranks, to a
// socket). That leaves a lone rank one core of the host, where torchrun leaves a process every core, and is why
// Horovod's documentation runs mpirun with --bind-to none. So a binding Open MPI chose by itself (it exports
// OMPI_MCA_orte_bound_at_launch, and no --bind-to exported a policy) that is narrower than the rank's share of the
// host is lifted: every thread of the process (OpenBLAS's and MPI's started inside the binding) may then run on any
// core the process's cpuset allows (the kernel narrows the full mask to it). An explicit --bind-to is kept. Returns
// the cores this thread may use afterwards, 0 if nothing was lifted.
int lift_open_mpi_default_binding(int allowed_cores, int share) {
  if (allowed_cores >= share || !std::getenv("OMPI_MCA_orte_bound_at_launch") ||
      std::getenv("OMPI_MCA_hwloc_base_binding_policy"))
    return 0;
  cpu_set_t every_cpu;
  CPU_ZERO(&every_cpu);
  for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &every_cpu);
  if (sched_setaffinity(0, sizeof every_cpu, &every_cpu) != 0) return 0;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (const dirent* task = readdir(tasks))
      if (task->d_name[0] != '.')
        sched_setaffinity(static_cast<pid_t>(std::atoi(task->d_name)), sizeof every_cpu, &every_cpu);
    closedir(tasks);
  }
  cpu_set_t now;
  CPU_ZERO(&now);
  return sched_getaffinity(0, sizeof now, &now) == 0 ? CPU_COUNT(&now) : 0;
}

}  // namespace

RankCores cores_for_rank(MPI_Comm comm) {
  const int host_ranks = ranks_on_this_host(comm);
  const int host_cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  const int share = std::max(1, host_cores / host_ranks);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : host_cores;
  if (const int lifted = lift_open_mpi_default_binding(allowed, share); lifted > allowed)
    return {std::min(share, lifted), allowed};
  if (allowed < host_cores) return {std::max(1, allowed), 0};  // bound: the cores it was given are its own
  return {share, 0};
}

std::string broadcast_error(const std::string& error_on_root, MPI_Comm comm) {
  // Rank 0 may be writing a snapshot or a checkpoint meanwhile: stopped or hung there, it must not hold the others
  // in this broadcast for good (the timeout then bounds the write as it bounds a library collective).
  const watchdog::Wait wait("rank 0's verdict on a file it checks or writes");
  char buf[1024] = {};
  std::snprintf(buf, sizeof buf, "%s", error_on_root.c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm);
  return buf;
}

namespace {

// Rank 0 receives every rank's `mine` (all ranks send the same number of plain-data records), rank-major.
template <typename Record>
void gather_to_root(const std::vector<Record>& mine, std::vector<Record>& all, MPI_Comm comm) {
  static_assert(std::is_trivially_copyable_v<Record>);
  // Counted in records, not bytes: a long run without snapshots passes 2^31 bytes of records (13M steps of
  // StepRecord) long before 2^31 records.
  if (mine.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw std::runtime_error("more than 2^31 records to gather at once: take snapshots (--flush-every)");
  MPI_Datatype record;
  mpiCheck(MPI_Type_contiguous(static_cast<int>(sizeof(Record)), MPI_BYTE, &record));
  mpiCheck(MPI_Type_commit(&record));
  const int count = static_cast<int>(mine.size());
  mpiCheck(MPI_Gather(mine.data(), count, record, all.data(), count, record, 0, comm));
  mpiCheck(MPI_Type_free(&record));
}

// Ranks of one job must train the same thing: MPMD launches (`mpirun -np 2 ddplab train ... : -np 2 ddplab train
// ...`) or a wrapper script can hand them different flags, which would pair unrelated buffers or hang later. Every
// knob but those that may differ by rank (kPerRank: the output path) must agree; the message lists each differing
// field with a rank that differs.
std::string config_disagreement(const TrainConfig& config, MPI_Comm comm) {
  nlohmann::json json = to_json(config);
  visit_knobs(config, [&](const Knob& knob, const auto&) {
    if (knob.key && (knob.traits & kPerRank)) json.erase(knob.key);
  });
  std::vector<std::pair<std::string, std::string>> fields;
  for (const auto& [key, value] : json.items()) fields.emplace_back(key, value.dump());
  const std::string differing = disagreement(fields, comm);
  if (differing.empty()) return "";
  return "ranks were started with different settings: " + differing + "; every rank needs the same flags";
}

// What a checkpoint records of the run: its settings, world size and nodes, which a resumed run must share wherever
// they change the arithmetic.
nlohmann::json checkpoint_config(const TrainConfig& config, const std::vector<int>& node_of_rank) {
  nlohmann::json j = to_json(config);
  j["world_size"] = static_cast<int>(node_of_rank.size());
  j["node_of_rank"] = node_of_rank;
  if (config.device == Device::kCpu) j["blas_kernels"] = blas::kernels_in_use().core;
  return j;
}

// Where a resumed CPU run's GEMMs may round unlike its checkpoint's run although every setting matches: OpenBLAS's
// kernel families sum in their own orders (SkylakeX's and Haswell's differ in the last bits), and so may its thread
// counts. Said, not refused: both are the host's (--threads auto takes its cores), and another CPU may not run the
// checkpoint's kernels at all. "" where they match, or where the checkpoint does not say.
std::string resume_rounding_note(const TrainConfig& config) {
  if (config.device != Device::kCpu || config.resume.empty()) return "";
  const nlohmann::json then = nlohmann::json::parse(checkpoint_config_json(config.resume).value_or("{}"));
  const nlohmann::json now = checkpoint_config(config, {});
  // A value as the checkpoint recorded it (one from before it was recorded counts as this run's), and as now.
  const auto text = [](const nlohmann::json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); };
  const auto was = [&](const char* key) { return text(then.contains(key) ? then[key] : now[key]); };
  const std::string threads = was("threads"), kernels = was("blas_kernels");
  const std::string threads_now = text(now["threads"]), kernels_now = text(now["blas_kernels"]);
  if (threads == threads_now && kernels == kernels_now) return "";
  const std::string match_threads = "--threads " + threads, match_kernels = "OPENBLAS_CORETYPE=" + kernels;
  const std::string to_match = threads == threads_now   ? match_kernels + " matches"
                               : kernels == kernels_now ? match_threads + " matches"
                                                        : match_threads + " and " + match_kernels + " match";
  return "its run had " + threads + " BLAS thread" + (threads == "1" ? "" : "s") + " a rank and " + kernels +
         "'s kernels, this one " + threads_now + " and " + kernels_now +
         "'s: the GEMMs may round unlike the uninterrupted run's (" + to_match + " it)";
}

// A resumed run must repeat the settings that change what a step computes (keys_a_resume_repeats); one line lists
// every one that differs.
void require_same_settings(const TrainConfig& config, const Topology& topology, const std::string& config_json) {
  nlohmann::json saved;
  bool older_bucket_caps = false;
  try {
    saved = nlohmann::json::parse(config_json);
    older_bucket_caps = predates_last_bucket_cap(saved);
    upgrade_config_keys(saved);
  } catch (const nlohmann::json::exception&) {
    throw UsageError("cannot resume from " + config.resume + ": its config attribute is not valid JSON");
  }
  require(saved.is_object(), "cannot resume from " + config.resume + ": its config attribute is not a JSON object");
  const nlohmann::json now = checkpoint_config(config, topology.node_of_rank);
  // A key the checkpoint lacks came after it was written: it ran as that knob's default (config_from_json's rule).
  // node_of_rank has none: a hier checkpoint from before it was recorded is refused, its nodes unknown.
  const nlohmann::json defaults = to_json(TrainConfig{});
  std::string differing;
  for (const std::string& key : keys_a_resume_repeats(config)) {
    const nlohmann::json then = saved.value(key, defaults.value(key, nlohmann::json()));
    if (then != now[key])
      differing += std::string(differing.empty() ? "" : ", ") + key + " (checkpoint " + then.dump() + ", now " +
                   now[key].dump() + ")";
  }
  // A checkpoint from before --last-bucket-mb: its run's --first-bucket-mb X is --last-bucket-mb X now.
  const std::string renamed = older_bucket_caps && differing.find("bucket_mb") != std::string::npos
                                  ? " (this checkpoint predates --last-bucket-mb: its --first-bucket-mb " +
                                        saved["last_bucket_mb"].dump() + " is --last-bucket-mb " +
                                        saved["last_bucket_mb"].dump() + " now)"
                                  : "";
  require(differing.empty(), "cannot resume from " + config.resume + ": settings differ from the checkpoint's: " +
                                 differing + "; a resumed run must repeat the original's settings" + renamed);
}

// Every rank loads the checkpoint and learns the step to start at. The settings are compared first: another model's
// checkpoint would otherwise fail on a tensor's shape. Collective: the file may read differently on different ranks
// (a node-local path that exists on rank 0's node only), so the ranks agree, and all refuse with the lowest failing
// rank's reason.
int64_t resume_from_checkpoint(const TrainConfig& config, const Topology& topology, Trainer& runner, MPI_Comm world) {
  std::string problem;
  int64_t step = 0;
  try {
    // The whole read once in a child first (record/isolated_read.h), in the order below, so that it refuses a file
    // for the same reason first; the tensors into scratch memory, as load_checkpoint fills them.
    StepBackend& backend = runner.backend();
    read_first_in_child(config.resume, "cannot load checkpoint " + config.resume, [&] {
      if (const std::optional<std::string> saved = checkpoint_config_json(config.resume))
        require_same_settings(config, topology, *saved);
      std::vector<float> flat_params(static_cast<size_t>(backend.flat_size()));
      Optimizer<float> optimizer(config.optimizer, backend.flat_size());
      (void)load_checkpoint(config.resume, backend.parameters(), flat_params.data(), optimizer);
    });
    if (const std::optional<std::string> saved = checkpoint_config_json(config.resume))
      require_same_settings(config, topology, *saved);
    step = runner.read_checkpoint(config.resume).step;  // it read the same config to load
    require(step < config.steps, "checkpoint " + config.resume + " is at step " + std::to_string(step) +
                                     ", and --steps " + std::to_string(config.steps) + " leaves nothing to run");
    require(config.fault == Fault::kNone || config.fault_step >= step,
            "--fault-step " + std::to_string(config.fault_step) + " comes before step " + std::to_string(step) +
                ", where this run resumes from " + config.resume + ": the fault would never happen");
  } catch (const UsageError& e) {
    problem = e.what();
  }
  if (const std::string why = first_failing_reason(problem, world); !why.empty()) throw UsageError(why);
  return step;
}

// "fc2.bias,fc2.weight,fc1.bias" — or "fc1.weight[0:256]" for a block of rows of a weight.
std::string bucket_contents(const Trainer& runner, const Bucket& bucket) {
  std::string text;
  for (int k = bucket.first_piece; k <= bucket.last_piece; ++k)
    text += (text.empty() ? "" : ",") + runner.piece_name(runner.grad_pieces()[k]);
  return text;
}

}  // namespace

// --device cuda needs a usable GPU and NCCL on every rank: otherwise every rank refuses (exit 2) with the reason of
// the lowest failing rank.
void require_device(const TrainConfig& config, MPI_Comm comm) {
  if (config.device != Device::kCuda) return;
#ifdef DDPLAB_HAVE_CUDA
  const std::string mine = cuda::NcclAllreduce::availability();
#else
  const std::string mine = "this ddplab was built without CUDA (configure with -DDDPLAB_CUDA=ON)";
#endif
  if (const std::string reason = first_failing_reason(mine, comm); !reason.empty())
    throw UsageError("--device cuda: " + reason);
}

namespace {

// Whether cuDNN's attention loads on every rank, where the run may take it: --attention auto takes it only then; an
// explicit cudnn where it does not is refused on every rank (exit 2) with the lowest failing rank's reason.
bool cudnn_on_every_rank(const TrainConfig& config, MPI_Comm comm) {
  const bool asks_cudnn =
      config.device == Device::kCuda && config.transformer() &&
      (config.attention == AttentionKind::kCudnn || (!config.attention && config.precision == Precision::kBf16));
  if (!asks_cudnn) return false;
#ifdef DDPLAB_HAVE_CUDA
  std::string mine;
  cuda::cudnn_attention_available(&mine);
#else
  const std::string mine = "this ddplab was built without CUDA";
#endif
  const std::string reason = first_failing_reason(mine, comm);
  if (reason.empty() || !config.attention) return reason.empty();
  throw UsageError("--attention cudnn: " + reason);
}

}  // namespace

namespace {

// The run's metadata: what ran, where, with which build and libraries.
RunMetadata run_metadata(const TrainConfig& config, const RunOptions& options, int64_t first_step, MPI_Comm world) {
  RunMetadata meta;
  meta.first_step = first_step;
  meta.command = options.command;
  meta.command_line = options.command_line;
  meta.start_time_utc = utc_now_iso8601();
  meta.git_commit = DDPLAB_GIT_COMMIT;
  meta.ddplab_version = kVersion;
  meta.mpi_library = mpi_library_version();
  meta.hdf5_version = hdf5_version();
  meta.blas = blas_description();
  meta.blas_kernels = blas_kernels_of_ranks(world);
  meta.cuda = cuda_description();
  meta.device = to_string(config.device);
  MPI_Comm_size(world, &meta.world_size);
  meta.hostnames = gather_hostnames(world);
  meta.gpus = gather_gpus(config, world);
  meta.host_cores = gather_host_cores(meta.hostnames, world);
  meta.comm_spin_us = PollPolicy::from_env().spin_us;
  // What backward beside an all-reduce costs its comm thread: measured here, with the ranks' compute threads
  // standing in for backward's (ddplab predict; docs/PREDICT.md).
  if (config.device == Device::kCpu && meta.world_size > 1)
    meta.comm_lost_yield_us =
        static_cast<int>(std::lround(1000 * measure_lost_yield_ms(world, std::max(1, config.blas_threads))));
  return meta;
}

// The update, for the header: the optimizer and where it runs, and the learning rate's schedule and the clipping
// where they are not the defaults ("adamw, lr 0.0006 over 10 warm-up steps, then cosine to 6e-05, gradient norm
// clipped at 1").
std::string describe_update(const TrainConfig& config, int world_size) {
  const OptimizerConfig& o = config.optimizer;
  std::string text = to_string(o.kind);
  if (config.update_in_backward())
    text += " (in backward)";
  else if (config.zero_stage == 1)
    text += world_size > 1 ? " (sharded across the ranks: ZeRO-1)" : " (ZeRO-1: one rank, nothing to shard)";
  if (o.lr_varies()) {
    text += fmt(", lr %g", o.lr);
    if (o.lr_warmup > 0) text += fmt(" over %d warm-up step%s", o.lr_warmup, o.lr_warmup == 1 ? "" : "s");
    if (o.lr_warmup >= config.steps)  // what the run reaches, not what it never gets to
      text += fmt(" (longer than the run: it ends at %g)", learning_rate(o, config.steps - 1, config.steps));
    else if (o.lr_schedule == LrSchedule::kCosine && o.lr_final < 1)
      text += fmt(", then cosine to %g", o.lr * o.lr_final);
  }
  if (o.clips()) text += fmt(", gradient norm clipped at %g", o.grad_clip);
  return text;
}

// The run's header on rank 0: model and data, ranks and batch, the communication setup.
void print_run_header(const TrainConfig& config, const RunOptions& options, const Trainer& trainer, int world_size,
                      int64_t first_step, const Topology& topology, const RankCores& rank_cores,
                      const std::string& blas_kernels) {
  if (!options.label.empty()) std::printf("== %s\n", options.label.c_str());
  std::printf("ddplab %s: %s, %d rank%s x batch %d%s, %s, %s, %d BLAS thread%s per rank\n", options.command.c_str(),
              trainer.describe().c_str(), world_size, world_size == 1 ? "" : "s", config.batch,
              config.grad_accum > 1 ? (" x " + std::to_string(config.grad_accum) + " micro-batches").c_str() : "",
              describe_update(config, world_size).c_str(), counted(config.steps, "step").c_str(), config.blas_threads,
              config.blas_threads == 1 ? "" : "s");
  if (rank_cores.lifted_from > 0)
    std::printf("  Open MPI's default binding (%d core%s) lifted: rank 0 may use %d (an explicit --bind-to keeps it)\n",
                rank_cores.lifted_from, rank_cores.lifted_from == 1 ? "" : "s", rank_cores.cores);
  std::printf("  BLAS kernels %s\n", blas_kernels.c_str());
  if (first_step > 0) std::printf("  resumed from %s at step %lld\n", config.resume.c_str(), (long long)first_step);
  if (const std::string note = resume_rounding_note(config); !note.empty()) std::printf("  %s\n", note.c_str());
  if (topology.nodes() > 1) std::printf("  %s\n", topology.describe().c_str());
  if (const ValidationSet* v = trainer.validation())
    std::printf("  validation loss on %s, %s\n", v->describe().c_str(),
                config.val_every > 0
                    ? ("every " + std::to_string(config.val_every) + " steps and after the last").c_str()
                    : "after the last step");
  char slices[64] = "";
  if (config.grad_slice_mb > 0)
    std::snprintf(slices, sizeof slices, ", weight gradients in %g MiB row blocks", config.grad_slice_mb);
  // The caps, and the closing bucket as cut (a piece past its cap is a bucket of its own).
  std::string caps = bucket_layout_text(config);
  if (!trainer.buckets().empty())
    caps += "; the closing one " + size_text(trainer.buckets().back().count * static_cast<int64_t>(sizeof(float)));
  std::printf("  comm %s over %s (%s on the wire), link %s, %zu bucket%s (%s), overlap %s%s\n", to_string(config.comm),
              trainer.transport().c_str(), to_string(config.comm_dtype), describe(comm_options(config).link).c_str(),
              trainer.buckets().size(), trainer.buckets().size() == 1 ? "" : "s", caps.c_str(),
              config.overlap ? "on" : "off", slices);
  std::fflush(stdout);
}

// Every rank's step records on their way to rank 0's RunRecord. Each rank keeps its own only until the next gather
// (a snapshot, or the end), so the other ranks' memory stays flat however long the run.
class RecordGatherer {
 public:
  RecordGatherer(RunRecord& record, MPI_Comm world) : record_(record), world_(world) {
    MPI_Comm_rank(world, &rank_);
    MPI_Comm_size(world, &size_);
  }
  void add(const StepRecord& step, const std::vector<BucketTimes>& buckets) {
    mine_.push_back(step);
    my_buckets_.insert(my_buckets_.end(), buckets.begin(), buckets.end());
  }
  int steps() const { return steps_done_ + static_cast<int>(mine_.size()); }  // this rank's, gathered or not

  // Gathers the steps done so far on rank 0, which summarizes them and writes them to `path`: the run file, or the
  // snapshot of a run in progress. Collective; returns rank 0's write error ("" = written), known to every rank.
  std::string write(const std::string& path, bool force, RunSummary& summary) {
    gather();
    std::string error;
    if (rank_ == 0) {
      summary = summarize(record_);
      try {
        write_run_file(path, force, record_, to_json(summary).dump());
        record_.path = path;
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    return broadcast_error(error, world_);
  }

 private:
  // Moves every rank's records since the last gather to rank 0 (every rank ran the same steps).
  void gather() {
    const size_t k = mine_.size(), nb = record_.buckets.size();
    std::vector<StepRecord> records(rank_ == 0 ? k * size_ : 0);
    std::vector<BucketTimes> times(rank_ == 0 ? my_buckets_.size() * size_ : 0);
    {
      const watchdog::Wait wait("gather of the step records");
      gather_to_root(mine_, records, world_);
      gather_to_root(my_buckets_, times, world_);
    }
    if (rank_ == 0) {
      // Rank-major: rank r's new steps go after its earlier ones, which end where ranks 0..r-1 (grown by k
      // already) and its own steps_done records end.
      for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
        const size_t end = (r + 1) * steps_done_ + r * k;
        record_.records.insert(record_.records.begin() + end, records.begin() + r * k, records.begin() + (r + 1) * k);
        record_.bucket_times.insert(record_.bucket_times.begin() + end * nb, times.begin() + r * k * nb,
                                    times.begin() + (r + 1) * k * nb);
      }
      record_.steps = steps_done_ + static_cast<int>(k);
    }
    steps_done_ += static_cast<int>(k);
    mine_.clear();
    my_buckets_.clear();
  }

  RunRecord& record_;
  MPI_Comm world_;
  int rank_ = 0, size_ = 1, steps_done_ = 0;
  std::vector<StepRecord> mine_;
  std::vector<BucketTimes> my_buckets_;
};

// Rank 0 writes checkpoints (the replicas are identical); every rank learns whether that worked: returns rank 0's
// error, "" if written.
std::string save_checkpoint_collectively(Trainer& trainer, const TrainConfig& config,
                                         const std::vector<int>& node_of_rank, int64_t next_step, bool replace,
                                         MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string error;
  trainer.gather_optimizer_state();
  if (rank == 0) {
    try {
      trainer.write_checkpoint(config.checkpoint, config.force || replace,
                               CheckpointInfo{next_step, checkpoint_config(config, node_of_rank).dump(), "", ""});
      // Said as it happens: after a stop, the user learns where a resume starts.
      if (!config.quiet) {
        std::printf("  checkpoint: %s (a resume starts at step %lld)\n", config.checkpoint.c_str(),
                    static_cast<long long>(next_step));
        std::fflush(stdout);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  return broadcast_error(error, world);
}

// Rank 0's check, before the first step, that the output's file systems have room for what the run will write:
// its run file (twice while snapshots are taken: the last one is still there while the file is written) and its
// checkpoint (twice where one replaces another: the old is kept until the new one is complete). "" if they have.
// Whether a file written after every `every` steps (counted from step 0, as run_steps does: after step s where
// (s + 1) % every == 0 and a step follows) is written at all by a run of steps first_step..steps-1.
bool writes_between(int64_t every, int64_t first_step, int64_t steps) {
  return every > 0 && (first_step / every + 1) * every <= steps - 1;
}

std::string check_room_for_outputs(const TrainConfig& config, const Trainer& trainer, int world_size,
                                   int64_t first_step) {
  const int64_t steps = config.steps - first_step;
  const bool snapshots = writes_between(config.flush_every, first_step, config.steps);
  std::vector<std::pair<std::string, uint64_t>> files = {
      {config.out, run_file_least_bytes(world_size, steps, trainer.buckets().size()) * (snapshots ? 2 : 1)}};
  if (!config.checkpoint.empty()) {
    const bool replaces = writes_between(config.checkpoint_every, first_step, config.steps) ||
                          access(config.checkpoint.c_str(), F_OK) == 0;
    files.push_back({config.checkpoint,
                     checkpoint_data_bytes(trainer.backend().flat_size(), config.optimizer) * (replaces ? 2 : 1)});
  }
  return check_free_space(files);
}

TrainingStopped stopped_by_signal(int signal, int step) {
  return TrainingStopped(
      std::string(stop_signal_name(signal)) + " received: stopped after step " + std::to_string(step), 128 + signal);
}

// This rank's share of the token shards' vocabulary check, {part, parts}: the ranks that read the same files split it,
// so that every copy (one per node, or per folder a launch gives its ranks) is read whole, once. Collective.
std::pair<int, int> token_scan_share(const TrainConfig& c, MPI_Comm world) {
  if (!c.transformer() || (c.data.empty() && c.val_data.empty())) return {0, 1};  // alike on every rank
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  // The files by host, device and inode: another host's disk may number its own files alike.
  std::string files = std::to_string(host_of_rank(world)[rank]);
  for (const std::string& pattern : {c.data, c.val_data}) {
    try {
      for (const std::string& path : pattern.empty() ? std::vector<std::string>{} : token_shard_paths(pattern))
        if (struct stat s; stat(path.c_str(), &s) == 0)
          files += " " + std::to_string(s.st_dev) + ":" + std::to_string(s.st_ino);
    } catch (const std::invalid_argument&) {  // validate names it
    }
  }
  const uint64_t mine = std::hash<std::string>{}(files);
  std::vector<uint64_t> all(size);
  mpiCheck(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, world));
  return {static_cast<int>(std::count(all.begin(), all.begin() + rank, mine)),
          static_cast<int>(std::count(all.begin(), all.end(), mine))};
}

// The checks before any work, alike on every rank (UsageError): the ranks were given the same config, it holds for
// this many ranks, and every rank has the device it asks for.
void validate_run(const TrainConfig& asked, int world_size, MPI_Comm world) {
  require_same_config(asked, world);  // before anything a rank could decide on its own
  const auto [scan_part, scan_parts] = token_scan_share(asked, world);
  // The checks read each rank's own --out too (against --checkpoint and --resume): a rank that refused alone would
  // leave the others waiting in the next collective, so every rank refuses with the lowest refusing rank's reason.
  std::string mine;
  try {
    validate(asked);
    validate_for_ranks(asked, world_size, scan_part, scan_parts);
  } catch (const UsageError& e) {
    mine = e.what();
  }
  if (const std::string reason = first_failing_reason(mine, world); !reason.empty()) throw UsageError(reason);
  require_device(asked, world);
}

// The nodes: computed here for the checks and the run file as the Communicator computes them (comm/topology.h).
// --comm hier needs several nodes with as many ranks on each (UsageError).
Topology checked_topology(const TrainConfig& asked, int world_size, MPI_Comm world) {
  Topology topology;
  try {
    topology = detect_topology(world, asked.ranks_per_node);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  require(asked.comm != AllreduceImpl::kHier || topology.nodes() > 1,
          "--comm hier needs more than one node, and all " + std::to_string(world_size) +
              " ranks are on one (emulate nodes with --ranks-per-node K)");
  if (comm_options(asked).link.emulated())
    if (const std::string why = clocks_differ(world); !why.empty()) throw UsageError(why);
  const std::vector<int> node_sizes = topology.node_sizes();
  require(asked.comm != AllreduceImpl::kHier ||
              std::count(node_sizes.begin(), node_sizes.end(), node_sizes[0]) == static_cast<long>(node_sizes.size()),
          "--comm hier needs the same number of ranks on every node: " + topology.describe());
  return topology;
}

}  // namespace

void require_same_config(const TrainConfig& config, MPI_Comm comm) {
  if (const std::string error = config_disagreement(config, comm); !error.empty()) throw UsageError(error);
}

void validate_launch(const TrainConfig& config, MPI_Comm world) {
  int size = 1;
  MPI_Comm_size(world, &size);
  validate_run(config, size, world);
  checked_topology(config, size, world);
  cudnn_on_every_rank(config, world);  // --attention cudnn where its library does not load
}

namespace {

// Rank 0's run file: --out, or a new one under runs/ named after the command. The other ranks write none.
std::string run_file_path(const TrainConfig& asked, const RunOptions& options, int rank, int world_size) {
  return rank == 0 && asked.out.empty() ? default_run_path(options.command, world_size) : asked.out;
}

// A resumed run repeats the checkpoint's arithmetic: --grad-slice-mb left at auto takes the value the checkpoint ran
// with, where this host would resolve it otherwise (a spare core there and not here turns auto's 1 MiB into whole
// weights, and the resume would be refused for a setting the user never gave). A checkpoint that cannot be read
// leaves auto as it is: resume_from_checkpoint refuses it, on every rank alike.
void take_checkpoints_autos(TrainConfig& config) {
  if (config.resume.empty() || config.grad_slice_mb != kAutoGradSliceMb) return;
  try {
    read_first_in_child(config.resume, "cannot load checkpoint " + config.resume,
                        [&] { (void)checkpoint_config_json(config.resume); });
    nlohmann::json saved = nlohmann::json::parse(checkpoint_config_json(config.resume).value_or(""));
    upgrade_config_keys(saved);
    if (saved.is_object() && saved.contains("grad_slice_mb") && saved["grad_slice_mb"].is_number() &&
        saved["grad_slice_mb"].get<double>() >= 0)
      config.grad_slice_mb = saved["grad_slice_mb"].get<double>();
  } catch (const std::exception&) {
  }
}

// Every "auto" resolved once, here: the run header, the run file and the model see the choices made.
TrainConfig resolved_for_run(const TrainConfig& asked, const std::string& run_file, const RankCores& rank_cores,
                             MPI_Comm world) {
  TrainConfig config = asked;
  config.out = run_file;
  take_checkpoints_autos(config);
  // Alike on every rank, or not at all: a rank that cannot read the checkpoint keeps auto, and so do the others.
  double slice[2] = {config.grad_slice_mb, -config.grad_slice_mb};
  MPI_Allreduce(MPI_IN_PLACE, slice, 2, MPI_DOUBLE, MPI_MIN, world);
  if (slice[0] != -slice[1]) config.grad_slice_mb = asked.grad_slice_mb;
  // Every rank reads the plan's windows (and the validation's) from its own copy of the shards: a node holding other
  // files would train or validate on other windows, silently. Rank 0's fingerprint is the run's. (Opened and checked
  // by validate_run: headers only here.)
  for (const auto& [flag, pattern] :
       {std::pair<std::string, std::string>{"--data", config.data}, {"--val-data", config.val_data}}) {
    if (!config.transformer() || pattern.empty()) continue;
    std::string fingerprint, problem;
    try {
      fingerprint = TokenFiles(pattern, config.max_len).fingerprint();
    } catch (const std::invalid_argument& e) {
      problem = flag + " " + e.what();
    }
    // A rank that cannot open them says so on every rank before any rank waits for rank 0's fingerprint.
    if (const std::string reason = first_failing_reason(problem, world); !reason.empty()) throw UsageError(reason);
    char root[128] = {};
    fingerprint.copy(root, sizeof root - 1);
    MPI_Bcast(root, sizeof root, MPI_CHAR, 0, world);
    const std::string mine = fingerprint == root ? ""
                                                 : flag + " " + pattern + ": other shards than rank 0's (" +
                                                       fingerprint + ", against " + root + ")";
    if (const std::string reason = first_failing_reason(mine, world); !reason.empty()) throw UsageError(reason);
    if (flag == "--data") config.data_shards = fingerprint;
  }
  const int threads = asked.blas_threads > 0 ? asked.blas_threads : rank_cores.cores;
  int spare_core_every_rank = rank_cores.cores > threads ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &spare_core_every_rank, 1, MPI_INT, MPI_MIN, world);
  return resolved(config, RunFacts{rank_cores.cores, spare_core_every_rank == 1, cudnn_on_every_rank(asked, world)});
}

// A runs/ folder made for the default run file goes again if the run ends before writing anything there (a refused
// --resume, say): rmdir keeps a non-empty one.
class RunsDirIfMade {
 public:
  explicit RunsDirIfMade(bool make) : made_(make && mkdir("runs", 0755) == 0) {}
  ~RunsDirIfMade() {
    if (made_) rmdir("runs");
  }
  RunsDirIfMade(const RunsDirIfMade&) = delete;
  RunsDirIfMade& operator=(const RunsDirIfMade&) = delete;

 private:
  bool made_;
};

// The run file's snapshot while --flush-every writes one: the complete run file replaces it at the end.
std::string snapshot_path(const std::string& run_file) { return run_file + ".partial"; }

// Rank 0 owns the run file: it checks that the run file, the checkpoint, and the files beside the run file (the
// snapshot, train's page) can be written before any time is spent on training, and every rank learns the outcome
// (UsageError). An existing snapshot or page is another run's (a crashed run's snapshot may be all that is left of
// it): replaced only with --force, as the run file is.
void check_output_paths(const TrainConfig& config, bool saves_over_resumed, bool writes_page, int rank,
                        MPI_Comm world) {
  std::string error;
  if (rank == 0) {
    // --force replaces an output, never an input: the token shards the run reads (validate opened them already), and
    // the checkpoint it resumes from, unless that is the checkpoint it saves over.
    std::vector<std::string> shards;
    try {
      for (const std::string& pattern : {config.data, config.val_data})
        if (!pattern.empty())
          for (const std::string& shard : token_shard_paths(pattern)) shards.push_back(shard);
    } catch (const std::invalid_argument& e) {
      error = e.what();  // every rank learns it below
    }
    std::vector<std::string> inputs = shards;
    if (!config.resume.empty()) inputs.push_back(config.resume);
    // An output the shard patterns would match is read as a shard by the next run of the same command (a resume).
    const auto check = [&](const std::string& path, bool force, const std::vector<std::string>& reads) {
      if (!error.empty()) return;
      error = check_output_path(path, force, reads);
      for (const std::string& pattern : {config.data, config.val_data})
        if (error.empty() && token_pattern_matches(pattern, path))
          error = "output " + path + " matches the token shards' pattern " + pattern +
                  ", so the next run of this command (a resume) would read it as a shard: name another";
    };
    check(config.out, config.force, inputs);
    if (!config.checkpoint.empty()) check(config.checkpoint, config.force || saves_over_resumed, shards);
    const std::string snapshot = snapshot_path(config.out), page = default_page_path(config.out);
    // Checked as for a run from step 0: a resumed run's first step is not read yet, so this may refuse an old
    // snapshot that a short resumed run would leave alone.
    if (writes_between(config.flush_every, 0, config.steps)) check(snapshot, config.force, inputs);
    if (error.empty() && same_file(config.checkpoint, snapshot))
      error = "--checkpoint " + config.checkpoint + " is the snapshot of --out " + config.out +
              ", which the run file replaces at the end: the checkpoint needs a file of its own";
    if (error.empty() && writes_page && same_file(config.checkpoint, page))
      error = "--checkpoint " + config.checkpoint + " is the page train writes beside --out " + config.out +
              ": the checkpoint needs a file of its own";
    if (error.empty() && writes_page) {
      check(page, config.force, inputs);
      if (!error.empty()) error += "; it is the page train writes beside its run file (DDPLAB_TRAIN_PAGE=off: none)";
    }
  }
  error = broadcast_error(error, world);
  if (!error.empty()) throw UsageError(error);
}

// The run as its run file describes it before the first step: metadata, config, buckets and gradient pieces.
RunRecord run_description(const TrainConfig& config, const RunOptions& options, const Trainer& trainer,
                          const Topology& topology, int64_t first_step, MPI_Comm world) {
  RunRecord record;
  record.meta = run_metadata(config, options, first_step, world);
  record.meta.transport = trainer.transport();
  record.meta.node_of_rank = topology.node_of_rank;
  record.meta.links = comm_options(config).link;
  record.config = to_json(config);
  for (const Bucket& b : trainer.buckets())
    record.buckets.push_back({b.first_piece, b.last_piece, b.count, bucket_contents(trainer, b)});
  for (const GradPiece& p : trainer.grad_pieces()) record.pieces.push_back({p.offset, p.numel});
  return record;
}

// What a run writes between its steps: checkpoints and snapshots (--flush-every), each timed for the summary, since
// no step records that wall time. A result that cannot be written (disk full, quota, I/O error) stops the run after
// `step` on every rank, all of which learned it from the write's broadcast. A snapshot that fails leaves the last
// snapshot, and the end checkpoint is still written (finish_run): it may well be on another disk, and the training
// state is not lost with the snapshot. A checkpoint that fails still leaves the run file, for the same reason.
class RunWriter {
 public:
  RunWriter(const TrainConfig& config, Trainer& trainer, RecordGatherer& gathered, RunRecord& record,
            int64_t first_step, bool saves_over_resumed, MPI_Comm world)
      : config_(config),
        trainer_(trainer),
        gathered_(gathered),
        record_(record),
        world_(world),
        first_step_(first_step),
        checkpoint_written_(saves_over_resumed),
        partial_(snapshot_path(config.out)) {}

  // Throws the stop (exit code 5) on a failure: the run file is still to be written.
  void checkpoint(int64_t next_step) {
    const std::string error = timed([&] {
      return save_checkpoint_collectively(trainer_, config_, record_.meta.node_of_rank, next_step, checkpoint_written_,
                                          world_);
    });
    if (!error.empty())
      throw TrainingStopped(error + " (after step " + std::to_string(next_step - 1) + ")", kExitWriteFailed);
    checkpoint_written_ = true;
  }

  void snapshot(int step, RunSummary& summary) {
    record_.meta.stop_reason = "in progress: a snapshot after " + std::to_string(step + 1) + " of " +
                               std::to_string(config_.steps) + " steps (--flush-every)";
    const std::string error = timed([&] { return gathered_.write(partial_, true, summary); });
    snapshot_failed_ = !error.empty();
    if (snapshot_failed_) throw failed(error, step);
    snapshot_steps_ = gathered_.steps();
  }
  bool snapshot_failed() const { return snapshot_failed_; }

  // The snapshot this run wrote, if it wrote one: what the complete run file replaces.
  std::string written_snapshot() const { return snapshot_steps_ > 0 ? partial_ : ""; }

  TrainingStopped failed(const std::string& reason, int64_t step) const {
    const std::string kept = snapshot_steps_ == 0 ? "no snapshot was taken (--flush-every)"
                                                  : partial_ + " keeps steps " + std::to_string(first_step_) + ".." +
                                                        std::to_string(first_step_ + snapshot_steps_ - 1);
    return TrainingStopped(reason + " (after step " + std::to_string(step) + "); " + kept, kExitWriteFailed);
  }

 private:
  template <typename Write>
  std::string timed(const Write& write) {
    const double start = now_ms();
    const std::string error = write();
    ++record_.meta.file_writes;
    record_.meta.file_writes_us += static_cast<int64_t>((now_ms() - start) * 1e3);
    return error;
  }

  const TrainConfig& config_;
  Trainer& trainer_;
  RecordGatherer& gathered_;
  RunRecord& record_;
  MPI_Comm world_;
  int64_t first_step_;
  bool checkpoint_written_;  // replacing the file is ours: we wrote it, or resumed from it
  std::string partial_;
  int64_t snapshot_steps_ = 0;  // in the last snapshot written
  bool snapshot_failed_ = false;
};

// Progress, at most once a second or every --log-every steps: rank 0's steps since the last line, by the wall clock
// (checkpoint and snapshot writes included, validation passes not), its samples and tokens scaled to the ranks (exact
// for a fixed batch; an estimate where a token budget varies them), and its own loss (the summary has everyone's).
class ProgressLine {
 public:
  ProgressLine(const TrainConfig& config, int world_size, double t0)
      : config_(config), world_size_(world_size), t0_(t0), interval_{t0} {}

  // Time between steps that is no step's (a validation pass): left out of the ms per step, kept in the elapsed time.
  void leave_out(double ms) { interval_.start_ms += ms; }

  void step_done(int step, const StepRecord& last, bool print) {
    ++interval_.steps, interval_.samples += last.samples, interval_.tokens += last.useful_tokens;
    const bool due =
        !std::isnan(last.val_loss) ||  // a validation is always shown
        (config_.log_every > 0 ? (step + 1) % config_.log_every == 0 : now_ms() - interval_.start_ms >= 1000);
    if (!print || !due) return;
    const double now = now_ms();
    const double ms_per_step = (now - interval_.start_ms) / interval_.steps, seconds = (now - interval_.start_ms) / 1e3;
    std::printf("  step %d/%d  %.2f ms/step  %.0f samples/s", step + 1, config_.steps, ms_per_step,
                interval_.samples * world_size_ / seconds);
    if (interval_.tokens > 0) std::printf("  %.0f tokens/s", interval_.tokens * world_size_ / seconds);
    std::printf("  loss %.4f (rank 0)", last.loss);
    if (config_.optimizer.lr_varies()) std::printf("  lr %.3g", last.lr);
    if (config_.optimizer.clips()) std::printf("  grad norm %.4g", last.grad_norm);
    if (!std::isnan(last.val_loss)) std::printf("  val loss %.4f", last.val_loss);
    std::printf("  elapsed %.0f s, eta %.0f s\n", (now - t0_) / 1e3, (config_.steps - step - 1) * ms_per_step / 1e3);
    std::fflush(stdout);
    interval_ = Interval{now};
  }

 private:
  struct Interval {
    double start_ms = 0;
    int steps = 0;
    double samples = 0, tokens = 0;
  };
  const TrainConfig& config_;
  int world_size_;
  double t0_;
  Interval interval_;
};

// Steps first_step.. up to --steps, each gathered for the run file and followed by the checkpoint, snapshot and
// progress line due after it. Returns what stopped the run before its last step (alike on every rank), or nullptr.
std::unique_ptr<TrainingStopped> run_steps(Trainer& trainer, const TrainConfig& config, int64_t first_step,
                                           RecordGatherer& gathered, RunWriter& writer, RunSummary& summary, double t0,
                                           MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Barrier(world);  // the ranks start their first step together
  ProgressLine progress(config, size, t0);
  for (int s = static_cast<int>(first_step); s < config.steps; ++s) {
    StepRecord last;
    try {
      last = trainer.step(s, t0);
    } catch (const TrainingStopped& e) {  // every rank, at this step: keep the steps before it
      return std::make_unique<TrainingStopped>(e);
    }
    if (trainer.validates_after(s)) {
      const double start = now_ms();
      last.val_loss = trainer.validation_loss();
      progress.leave_out(now_ms() - start);
    }
    gathered.add(last, trainer.bucket_times());
    if (const int signal = trainer.stop_signal())
      return std::make_unique<TrainingStopped>(stopped_by_signal(signal, s));
    const bool more = s + 1 < config.steps;
    try {
      if (config.checkpoint_every > 0 && (s + 1) % config.checkpoint_every == 0 && more) writer.checkpoint(s + 1);
      if (config.flush_every > 0 && (s + 1) % config.flush_every == 0 && more) writer.snapshot(s, summary);
    } catch (const TrainingStopped& e) {  // every rank: finish_run writes what is still due
      return std::make_unique<TrainingStopped>(e);
    }
    if (rank == 0 && !config.quiet && last.skipped > 0) {
      std::printf("  step %d skipped: %s (--skip-nonfinite: no update)\n", s, trainer.skipped_because().c_str());
      std::fflush(stdout);
    }
    progress.step_done(s, last, rank == 0 && !config.quiet && more);
  }
  return nullptr;
}

// Rank 0's last words on a run: its steady state, the summary, and the run file if it was written.
void print_run_end(const TrainConfig& config, const SummarizedRun& result, bool written, bool stopped) {
  const RunRecord& record = result.record;
  const int first = static_cast<int>(record.meta.first_step);  // a resumed run counts on from its checkpoint
  if (record.steps == 0) {
    std::printf("no step completed: nothing to summarize\n");
  } else {
    const int last = first + record.steps - 1, warmup = result.summary.first_steady_step;
    if (record.reached_steady_state()) {
      std::printf("steady state: steps %d..%d of %d (%s), %s\n", first + warmup, last, last + 1,
                  warmup == 0 ? "no warm-up" : (counted(warmup, "warm-up step") + " left out").c_str(),
                  result.summary.batch_text().c_str());
      // As the suite and sweep say of their cases: a median of a few steps is one hiccup away from another figure.
      if (!stopped && record.steps - warmup < 5)
        std::printf("  few measured steps: one hiccup decides the figures (--steps %d or more measures 5)\n",
                    std::max(0, config.warmup_steps) + 5);
    } else
      std::printf("no steady state: stopped within the warm-up, figures from step %d, %s\n", last,
                  result.summary.batch_text().c_str());
    print_summary(stdout, record, result.summary);
    // What `ddplab report` finds of the run: who sets the pace, or why no rank does, and what the host took.
    std::printf("  blame:\n");
    for (const std::string& line : blame(record, result.summary)) std::printf("    %s\n", line.c_str());
  }
  if (!record.meta.gemm_algorithms.empty()) std::printf("GEMM algorithms: %s\n", record.meta.gemm_algorithms.c_str());
  if (!record.meta.attention_graphs.empty()) std::printf("cuDNN attention: %s\n", record.meta.attention_graphs.c_str());
  if (written) std::printf("run file: %s%s\n", config.out.c_str(), stopped ? " (stopped early)" : "");
  std::fflush(stdout);
}

// After the steps: the last checkpoint, the run file, and rank 0's summary. A run stopped by a signal keeps its state
// too (resume continues it), and so does one whose snapshot failed; a stop for bad numbers does not. After a failed
// snapshot the run file is not written: it goes beside the snapshot, to the disk that just failed, and the last
// snapshot keeps the steps. Throws the stop, or the failed write.
void finish_run(const TrainConfig& config, const TrainingStopped* stopped, RecordGatherer& gathered, RunWriter& writer,
                SummarizedRun& result, int64_t first_step, bool writes_page, int rank) {
  std::optional<TrainingStopped> checkpoint_failed;
  if (!config.checkpoint.empty() && (!stopped || stopped->exit_code > 128 || writer.snapshot_failed())) {
    try {
      writer.checkpoint(first_step + gathered.steps());
    } catch (const TrainingStopped& e) {  // after a stop, both are named: the write failure's code wins
      checkpoint_failed = stopped ? TrainingStopped(std::string(stopped->what()) + "; " + e.what(), e.exit_code) : e;
    }
  }
  const TrainingStopped* stop = checkpoint_failed ? &*checkpoint_failed : stopped;
  if (writer.snapshot_failed()) throw *stop;
  result.record.meta.stop_reason = stop ? stop->what() : "";
  const std::string error = gathered.write(config.out, config.force, result.summary);
  if (rank == 0 && error.empty() && !writer.written_snapshot().empty())
    unlink(writer.written_snapshot().c_str());  // the complete file replaces the snapshot
  if (rank == 0 && !config.quiet) print_run_end(config, result, error.empty(), stop != nullptr);
  if (!error.empty()) {
    const TrainingStopped lost = writer.failed(error, first_step + gathered.steps() - 1);
    // A checkpoint that failed first is the stop to name; the run file's failure (often the same full disk) follows.
    if (stop && stop->exit_code == kExitWriteFailed)
      throw TrainingStopped(std::string(stop->what()) + "; " + lost.what(), kExitWriteFailed);
    throw lost;
  }
  // A stopped run's page too: the one beside the file it replaced would describe another run (the page says the
  // run stopped, and why).
  if (rank == 0 && writes_page) after_mpi([result, quiet = config.quiet] { write_train_page(result, quiet); });
  if (stop) throw *stop;
}

}  // namespace

SummarizedRun run_training(const TrainConfig& asked, MPI_Comm world, const RunOptions& options) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  watchdog::ArmedRun armed(asked.timeout_s,
                           "the run's setup (the ranks' agreement, the transports, CUDA's and NCCL's start, a "
                           "checkpoint read)");
  validate_run(asked, size, world);
  const Topology topology = checked_topology(asked, size, world);
  const RankCores rank_cores = cores_for_rank(world);
  const TrainConfig config = resolved_for_run(asked, run_file_path(asked, options, rank, size), rank_cores, world);
  openblas_set_num_threads(config.blas_threads);

  // The checkpoint a run resumed from may be saved over without --force (llm.c's and torchrun's habit).
  const bool saves_over_resumed = same_file(config.checkpoint, config.resume);
  const RunsDirIfMade runs_dir(rank == 0 && asked.out.empty());
  check_output_paths(config, saves_over_resumed, options.writes_page, rank, world);

  SummarizedRun result;
  const auto trainer = std::make_unique<Trainer>(config, world);
  const int64_t first_step = config.resume.empty() ? 0 : resume_from_checkpoint(config, topology, *trainer, world);
  trainer->check_replicas_start_alike();
  const std::string error =
      broadcast_error(rank == 0 ? check_room_for_outputs(config, *trainer, size, first_step) : "", world);
  if (!error.empty()) throw UsageError(error);
  result.record = run_description(config, options, *trainer, topology, first_step, world);
  if (rank == 0 && !config.quiet) {
    print_run_header(config, options, *trainer, size, first_step, topology, rank_cores,
                     result.record.meta.blas_kernels);
    if (const std::string note = oversubscription_note(result.record); !note.empty())
      std::printf("  %s\n", note.c_str());
  }

  RecordGatherer gathered(result.record, world);  // rank 0 fills in the records when it writes them
  RunWriter writer(config, *trainer, gathered, result.record, first_step, saves_over_resumed, world);
  const StopSignals signals;
  const ClockOrigin clock = common_clock_origin(world);  // the time zero of every rank's step and bucket times
  if (size > 1) result.record.meta.clock_alignment_us = static_cast<int64_t>(std::ceil(1000 * clock.uncertainty_ms));
  armed.setup_done();
  const std::unique_ptr<TrainingStopped> stopped =
      run_steps(*trainer, config, first_step, gathered, writer, result.summary, clock.origin_ms, world);
  result.record.meta.gemm_algorithms = trainer->gemm_algorithms();
  result.record.meta.attention_graphs = trainer->attention_graphs();
  finish_run(config, stopped.get(), gathered, writer, result, first_step, options.writes_page, rank);
  return result;
}

}  // namespace ddplab
