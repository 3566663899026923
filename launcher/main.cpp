// ddplab: the program. Runs as one process or as every rank of an mpirun job.
//
//   mpirun -np 4 build/ddplab train [flags]     data-parallel training, summary on rank 0, one HDF5 run file
//   build/ddplab devices                        what this build and machine offer (BLAS, MPI, CUDA)
//
// Error policy (the program's edge): bad input → one line "ddplab: error: ..." from rank 0 and exit code 2 on
// every rank (every rank validates the same arguments, so none waits for another); a failure during the run →
// the failing rank prints one line naming itself and aborts the whole job, so no rank is left hanging.
#include <cblas.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "git_commit.h"
#include "launcher/run_file.h"
#include "launcher/summary.h"
#include "launcher/trainer.h"
#ifdef DDPLAB_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace ddplab {
namespace {

constexpr const char* kVersion = "0.1.0";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// OpenBLAS 0.3.21 (Debian 12) predates Zen 4/5 and runs its Haswell (AVX2) kernels on them; on a CPU with
// AVX-512 its SkylakeX kernels are ~1.6x faster for our GEMMs (docs/BENCHMARKS.md). OpenBLAS picks its
// kernels when the library is loaded, before main(), so the only way to choose them is the environment of a
// fresh process image: re-exec once with OPENBLAS_CORETYPE set. This happens before MPI_Init, so mpirun does
// not notice. An OPENBLAS_CORETYPE set by the user always wins; DDPLAB_BLAS_AUTO=0 turns this off.
void select_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("DDPLAB_BLAS_AUTO")) return;
  const std::string core = openblas_get_corename();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (!avx512 || (core != "Haswell" && core != "Zen")) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  setenv("DDPLAB_BLAS_AUTO", "done", 1);  // never loop
  execv("/proc/self/exe", argv);           // returns only on failure: then keep the detected kernels
}

std::string utc_now_iso8601() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string default_run_path(int world_size) {
  char stamp[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&t));
  return "runs/train_np" + std::to_string(world_size) + "_" + stamp + ".h5";
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

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

std::string blas_description() {
  return std::string(openblas_get_config()) + " core=" + openblas_get_corename();
}

std::string cuda_description() {
#ifdef DDPLAB_HAVE_CUDA
  return "built: " + cuda::describe(cuda::query_cuda());
#else
  return "not built (configure with nvcc present or -DDDPLAB_CUDA=ON)";
#endif
}

std::vector<std::string> gather_hostnames(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(mine, &len);
  std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm);
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) names.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
  return names;
}

// Rank 0 decides something that can fail (e.g. checks the output path); every rank learns the outcome.
std::string broadcast_error(const std::string& error_on_root, MPI_Comm comm) {
  char buf[1024] = {};
  std::snprintf(buf, sizeof buf, "%s", error_on_root.c_str());
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm);
  return buf;
}

// Rank 0 receives every rank's `mine` (all ranks send the same number of plain-data records), rank-major.
template <typename Record>
void gather_to_root(const std::vector<Record>& mine, std::vector<Record>& all, MPI_Comm comm) {
  static_assert(std::is_trivially_copyable_v<Record>);
  const int bytes = static_cast<int>(sizeof(Record) * mine.size());
  MPI_Gather(mine.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, 0, comm);
}

// "fc2.bias,fc2.weight,fc1.bias" — or "fc1.weight[0:256]" for a block of rows of a weight.
std::string bucket_contents(const Mlp<float>& model, const Bucket& bucket) {
  std::string text;
  for (int k = bucket.first_piece; k <= bucket.last_piece; ++k) {
    const GradPiece& g = model.grad_pieces()[k];
    const Parameter<float>& p = model.parameters()[g.param];
    text += (text.empty() ? "" : ",") + p.name;
    if (g.numel < p.numel) {
      const int64_t rows = g.numel / p.shape[1];
      text += "[" + std::to_string(g.first_row) + ":" + std::to_string(g.first_row + rows) + "]";
    }
  }
  return text;
}

void add_train_flags(CLI::App* app, TrainConfig& c) {
  app->add_option("--batch", c.batch, "samples per rank per step (global batch = batch x ranks)")
      ->capture_default_str();
  app->add_option("--steps", c.steps, "training steps")->capture_default_str();
  app->add_option("--warmup-steps", c.warmup_steps, "first steps left out of the summary")->capture_default_str();
  app->add_option("--seed", c.seed, "seed of model init and synthetic data")->capture_default_str();
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
  app->add_option("--comm", c.comm, "gradient all-reduce: ring (ours) | mpi (MPI_Allreduce)")->capture_default_str();
  app->add_option("--comm-dtype", c.comm_dtype, "gradients on the wire: fp32 | bf16 | fp16")->capture_default_str();
  app->add_option("--bucket-mb", c.bucket_mb, "gradient bucket cap in MiB (0: one bucket per parameter)")
      ->capture_default_str();
  app->add_option("--first-bucket-mb", c.first_bucket_mb, "cap of the bucket that closes backward, MiB")
      ->capture_default_str();
  app->add_option_function<std::string>(
         "--overlap",
         [&c](const std::string& v) {
           if (v != "on" && v != "off") throw CLI::ValidationError("--overlap", "must be on or off (got '" + v + "')");
           c.overlap = v == "on";
         },
         "all-reduce buckets while backward runs: on | off")
      ->default_str("on");
  app->add_option("--grad-slice-mb", c.grad_slice_mb,
                  "compute and announce weight gradients in row blocks of this size, MiB (0: whole weights)")
      ->capture_default_str();
  app->add_option("--grad-accum", c.grad_accum, "micro-batches per step, gradients communicated on the last")
      ->capture_default_str();
  app->add_option("--link", c.link, "emulated interconnect: none | 10gbe | 25gbe | 100gbe-ib | pcie4 | nvlink4")
      ->capture_default_str();
  app->add_option("--link-latency-us", c.link_latency_us, "override the link's latency (us)");
  app->add_option("--link-gbps", c.link_gbps, "override the link's bandwidth (Gbit/s)");
  app->add_option("--threads", c.blas_threads, "OpenBLAS threads per rank")->capture_default_str();
  app->add_option("--data-cost-ms", c.data_cost_ms, "input pipeline: host cost per sample, ms (a sleep)")
      ->capture_default_str();
  app->add_option("--loader-threads", c.loader_threads, "input pipeline: worker threads (0: in the training loop)")
      ->capture_default_str();
  app->add_option("--prefetch", c.prefetch, "input pipeline: batches prepared ahead (with loader threads)")
      ->capture_default_str();
  app->add_option("--slow-rank", c.slow_rank, "lab: the straggling rank")->capture_default_str();
  app->add_option("--straggler-ms", c.straggler_ms, "lab: the slow rank sleeps this long before each batch fetch")
      ->capture_default_str();
  app->add_option("--extra-allreduce-mb", c.extra_allreduce_mb, "lab: an extra all-reduce of this size every step")
      ->capture_default_str();
  app->add_option("--rank0-work-ms", c.rank0_work_ms, "lab: rank 0 works this long, then every rank barriers")
      ->capture_default_str();
  app->add_option("--barrier-every", c.barrier_every, "lab: ... every this many steps")->capture_default_str();
  app->add_option("--out", c.out, "run file (HDF5); default runs/train_np<N>_<time>.h5");
  app->add_flag("--force", c.force, "overwrite an existing run file");
  app->add_flag("--quiet", c.quiet, "print only errors");
}

void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
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
  at_least("--threads", c.blas_threads, 1);
  require(c.optimizer.kind == "adamw" || c.optimizer.kind == "sgd",
          "--optimizer must be adamw or sgd (got '" + c.optimizer.kind + "')");
  require(c.optimizer.lr > 0, "--lr must be positive");
  require(c.optimizer.weight_decay >= 0, "--weight-decay must not be negative");
  require(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1, "--momentum must be in [0, 1)");
  require(c.data_noise >= 0, "--data-noise must not be negative");
  at_least("--grad-accum", c.grad_accum, 1);
  at_least("--loader-threads", c.loader_threads, 0);
  at_least("--prefetch", c.prefetch, 1);
  at_least("--barrier-every", c.barrier_every, 1);
  at_least("--slow-rank", c.slow_rank, 0);
  require(c.data_cost_ms >= 0 && c.straggler_ms >= 0 && c.extra_allreduce_mb >= 0 && c.rank0_work_ms >= 0,
          "--data-cost-ms, --straggler-ms, --extra-allreduce-mb and --rank0-work-ms must not be negative");
  require(c.bucket_mb >= 0 && c.first_bucket_mb >= 0 && c.grad_slice_mb >= 0,
          "--bucket-mb, --first-bucket-mb and --grad-slice-mb must not be negative");
  try {
    comm_options(c);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

int run_train(TrainConfig config, const std::string& command_line) {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  validate(config);
  openblas_set_num_threads(config.blas_threads);

  // Rank 0 owns the run file: check it can be written before spending time on training.
  std::string error;
  if (rank == 0) {
    if (config.out.empty()) {
      mkdir("runs", 0755);
      config.out = default_run_path(size);
    }
    error = check_output_path(config.out, config.force);
  }
  error = broadcast_error(error, world);
  if (!error.empty()) throw UsageError(error);

  Communicator comm(world, comm_options(config));
  Trainer trainer(config, comm);
  RunMetadata meta;
  meta.command = "train";
  meta.command_line = command_line;
  meta.start_time_utc = utc_now_iso8601();
  meta.git_commit = DDPLAB_GIT_COMMIT;
  meta.ddplab_version = kVersion;
  meta.mpi_library = mpi_library_version();
  meta.hdf5_version = hdf5_version();
  meta.blas = blas_description();
  meta.cuda = cuda_description();
  meta.world_size = size;
  meta.hostnames = gather_hostnames(world);

  if (rank == 0 && !config.quiet) {
    const auto& m = config.mlp;
    std::printf("ddplab train: MLP %d-%dx%d-%d (%.2fM params), %d rank%s x batch %d%s, %s, %d steps\n", m.input_dim,
                m.hidden_dim, m.num_hidden_layers, m.num_classes, trainer.model().num_parameters() / 1e6, size,
                size == 1 ? "" : "s", config.batch,
                config.grad_accum > 1 ? (" x " + std::to_string(config.grad_accum) + " micro-batches").c_str() : "",
                config.optimizer.kind.c_str(), config.steps);
    std::printf("  comm %s (%s on the wire), link %s, %zu bucket%s (cap %g MiB, closing %g MiB), overlap %s\n",
                config.comm.c_str(), config.comm_dtype.c_str(), config.link.c_str(),
                trainer.reducer().buckets().size(), trainer.reducer().buckets().size() == 1 ? "" : "s",
                config.bucket_mb, config.first_bucket_mb, config.overlap ? "on" : "off");
    std::fflush(stdout);
  }

  const size_t num_buckets = trainer.reducer().buckets().size();
  std::vector<StepRecord> mine(config.steps);
  std::vector<BucketTimes> my_buckets;
  my_buckets.reserve(config.steps * num_buckets);
  MPI_Barrier(world);  // common start: step start times of all ranks share one origin
  const double t0 = now_ms();
  for (int s = 0; s < config.steps; ++s) {
    mine[s] = trainer.step(s, t0);
    const auto& times = trainer.reducer().bucket_times();
    my_buckets.insert(my_buckets.end(), times.begin(), times.end());
  }

  std::vector<StepRecord> all(rank == 0 ? static_cast<size_t>(size) * config.steps : 0);
  gather_to_root(mine, all, world);
  RunBuckets buckets;
  buckets.layout = trainer.reducer().buckets();
  for (const Bucket& b : buckets.layout) buckets.names.push_back(bucket_contents(trainer.model(), b));
  buckets.times.resize(rank == 0 ? my_buckets.size() * size : 0);
  gather_to_root(my_buckets, buckets.times, world);

  if (rank == 0) {
    meta.config_json = to_json(config).dump();
    const RunSummary summary = summarize(all, size, config.steps, config.warmup_steps, config.batch * size);
    try {
      write_run_file(config.out, config.force, meta, all, config.steps, to_json(summary).dump(), buckets);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!config.quiet) {
      print_summary(stdout, summary, meta.hostnames);
      if (error.empty()) std::printf("run file: %s\n", config.out.c_str());
      std::fflush(stdout);
    }
  }
  error = broadcast_error(error, world);
  if (!error.empty()) throw std::runtime_error(error);
  return 0;
}

int run_devices() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  std::printf("ddplab %s (commit %s)\n", kVersion, DDPLAB_GIT_COMMIT);
  std::printf("  BLAS  %s\n", blas_description().c_str());
  std::printf("  MPI   %s\n", mpi_library_version().c_str());
  std::printf("  HDF5  %s\n", hdf5_version().c_str());
  std::printf("  CUDA  %s\n", cuda_description().c_str());
  return 0;
}

}  // namespace
}  // namespace ddplab

int main(int argc, char** argv) {
  using namespace ddplab;
  select_blas_kernels(argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App app{"ddplab: data-parallel training engine and performance lab"};
  app.require_subcommand(1);
  TrainConfig config;
  CLI::App* train = app.add_subcommand("train", "data-parallel training of an MLP on synthetic data");
  add_train_flags(train, config);
  CLI::App* devices = app.add_subcommand("devices", "show BLAS, MPI, HDF5 and CUDA as this build sees them");

  int code = 0;
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      if (rank == 0) std::printf("%s", app.help().c_str());  // the selected subcommand's help, if any
      MPI_Finalize();
      return 0;
    } catch (const CLI::ParseError& e) {
      throw UsageError(e.what());
    }
    if (train->parsed()) code = run_train(config, command_line);
    if (devices->parsed()) code = run_devices();
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "ddplab: error: %s (see ddplab --help)\n", e.what());
    MPI_Finalize();
    return 2;
  } catch (const std::exception& e) {
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(host, &len);
    std::fprintf(stderr, "ddplab: error on rank %d (%s): %s\n", rank, host, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);  // takes every other rank down with us: nobody waits forever
    return 1;
  }
  MPI_Finalize();
  return code;
}
