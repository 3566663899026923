// ddplab: the program. Runs as one process or as every rank of an mpirun job.
//
//   mpirun -np 4 build/launcher/ddplab train [flags]   data-parallel training, summary on rank 0, one HDF5 run file
//   mpirun -np 4 build/launcher/ddplab suite lab       the DDP lab: scaling and pathology cases in one launch
//   mpirun -np 2 build/launcher/ddplab sweep ...       bucket size x overlap grid
//   build/launcher/ddplab devices                      what this build and machine offer (BLAS, MPI, CUDA)
//   build/launcher/ddplab --version                    version and git commit
//
// Every rank first checks that all ranks run the same subcommand of the same build (launcher/rank_agreement.h).
// Error policy (the program's edge): bad input → one line "ddplab: error: ..." from rank 0 and exit code 2 on
// every rank (every rank validates the same arguments, or learns rank 0's verdict, so none waits for another);
// a stop every rank reaches at the same step (a non-finite number, a signal, a result that could not be written)
// → one line from rank 0 and exit code 4, 128 + the signal, or 5 on every rank, without an abort; any other failure
// during the run → the failing rank prints one line naming itself and aborts the whole job, so no rank is left
// hanging. The codes: docs/RELIABILITY.md.
#include <hdf5.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "git_commit.h"
#include "kernels/cpu/blas_kernels.h"
#include "launcher/cli.h"
#include "launcher/cli_errors.h"
#include "launcher/page.h"
#include "launcher/predict_command.h"
#include "launcher/rank_agreement.h"
#include "launcher/report_commands.h"
#include "launcher/run.h"
#include "launcher/suite.h"
#include "launcher/sweep.h"
#include "runtime/errors.h"
#include "runtime/mpi_init.h"
#include "runtime/settings.h"
#include "runtime/watchdog.h"
#include "train/trainer.h"

namespace ddplab {
namespace {

std::string version_line() { return std::string("ddplab ") + kVersion + " (commit " + DDPLAB_GIT_COMMIT + ")"; }

int run_devices() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  std::printf("%s\n", version_line().c_str());
  const blas::CpuModel cpu = blas::cpu_model();
  const blas::CpuFeatures features = blas::cpu_features();
  const std::optional<blas::FmaPeak> peak = blas::fma_peak(cpu, features);
  std::printf("  CPU   %s, %s", cpu.id().c_str(), blas::describe(features).c_str());
  if (peak) {
    std::printf("; FMA peak %.0f GFLOP/s per core (estimate: %d flop/cycle x %.2f GHz", peak->gflops,
                peak->flops_per_cycle, peak->ghz);
    if (peak->measured && peak->reported_ghz > 0)
      std::printf(", the clock measured now; the OS reports %.2f", peak->reported_ghz);
    std::printf(")");
  }
  std::printf("\n  BLAS  %s\n", blas_description().c_str());
  std::printf("        kernels %s\n", blas::kernels_in_use().describe().c_str());
  // Measured now: this process's rate (75 ms), then every family the CPU could run, the one in use among them, each
  // in a child, three rounds of 25 ms in turn. The share of the best is taken between the children, measured alike:
  // on a shared host the rate drifts by 10-20% from one second to the next, and set against the first measurement it
  // read as a difference between kernels (a family "110% of the best").
  const double gflops = blas::measure_gemm_gflops(75);
  const blas::Rates alternatives = blas::measure_alternatives();
  const blas::CoreRate best = blas::fastest(alternatives);
  const blas::CoreRate* in_use = blas::find_rate(alternatives, blas::kernels_in_use().core);
  std::printf("        GEMM, a 1024 -> 1024 layer at batch 128 (forward + backward, 1 thread): %.1f GFLOP/s", gflops);
  if (peak) std::printf(", %.0f%% of the FMA peak", 100 * gflops / peak->gflops);
  if (best.gflops > 0 && in_use)
    std::printf("; measured alike, %s %.0f%% of the best (%s)", in_use->core.c_str(),
                100 * in_use->gflops / best.gflops, blas::list_rates(alternatives).c_str());
  std::printf("\n");
  std::printf("  MPI   %s\n", mpi_library_version().c_str());
  std::printf("  HDF5  %s\n", hdf5_version().c_str());
  std::printf("  CUDA  %s\n", cuda_description().c_str());
  if (const std::string gemm = gemm_algorithms_description(); !gemm.empty())
    std::printf("        GEMM algorithms: %s\n", gemm.c_str());
  std::printf("  settings (DDPLAB_* in the environment, read once per run):\n");
  for (const std::string& line : settings::describe()) std::printf("    %s\n", line.c_str());
  return 0;
}

// Edits (insert, delete, substitute, swap two neighbours) that turn a into b: "trian" is 1 from "train".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The first word after the program name must be a command; CLI11 would only say "A subcommand is required".
void require_known_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return;  // flags (--help, --version) or nothing: CLI11's own messages
  const std::string word = argv[1];
  std::string names, nearest;
  size_t best = SIZE_MAX;
  for (const CLI::App* command : app.get_subcommands({})) {
    const std::string& name = command->get_name();
    if (name == word) return;
    names += (names.empty() ? "" : ", ") + name;
    if (const size_t d = edit_distance(word, name); d < best) best = d, nearest = name;
  }
  const bool close = best <= std::max<size_t>(2, nearest.size() / 3);
  throw UsageError("unknown command '" + word + "'" + (close ? " (did you mean '" + nearest + "'?)" : "") +
                   "; commands: " + names);
}

// A list flag's empty item (`--bucket-mb 1,,2`, `--overlap on,`): a typo, not a shorter list. CLI11 drops empty items
// as it splits a value, before any check of its sees them, so the command line's own text is read here.
void require_whole_lists(const CLI::App& app, int argc, char** argv) {
  const CLI::App* command = nullptr;
  for (const CLI::App* sub : app.get_subcommands({}))
    if (argc >= 2 && sub->get_name() == argv[1]) command = sub;
  if (command == nullptr) return;
  for (int i = 2; i < argc; ++i) {
    const std::string token = argv[i];
    if (token.rfind("--", 0) != 0) continue;
    const size_t equals = token.find('=');
    const std::string name = token.substr(0, equals);
    const CLI::Option* option = command->get_option_no_throw(name);
    if (option == nullptr || option->get_delimiter() != ',') continue;
    const std::string value = equals != std::string::npos ? token.substr(equals + 1) : i + 1 < argc ? argv[i + 1] : "";
    if (!value.empty() && (value.front() == ',' || value.back() == ',' || value.find(",,") != std::string::npos))
      throw UsageError(name + ": an empty item in '" + value + "' (a list is values separated by single commas)");
  }
}

// The commands and what their flags fill in (CLI11 keeps pointers to them: they stay where main made them).
struct Commands {
  TrainConfig config;
  SuiteOptions suite_options;
  SweepOptions sweep_options;
  CLI::App* train = nullptr;
  CLI::App* suite = nullptr;
  CLI::App* sweep = nullptr;
  CLI::App* devices = nullptr;
  FileCommand file_command;  // report, timeline, diff or predict, when one was parsed
};

void add_commands(CLI::App& app, Commands& c) {
  app.require_subcommand(1);
  app.set_version_flag("--version", version_line(), "print the version and the git commit of this build");
  c.train = app.add_subcommand(
      "train",
      "data-parallel training of an MLP or a transformer (--model) on synthetic data or token shards (--data)");
  add_train_flags(c.train, c.config);
  c.suite = add_suite_command(app, c.suite_options);
  c.sweep = add_sweep_command(app, c.sweep_options);
  c.devices = app.add_subcommand("devices", "show BLAS, MPI, HDF5 and CUDA as this build sees them");
  add_report_commands(app, c.file_command);  // report, timeline, diff
  add_predict_command(app, c.file_command);
}

// Parses the command line, then checks the DDPLAB_* settings. False once rank 0 printed the help or the version
// every rank asked for: nothing to run. Throws UsageError (the command line) or settings::BadSetting.
//
// Each rank parses its own command line and environment, and an MPMD launch or an environment set per host can make
// one rank refuse what another accepts. The ranks agree first (collectives every rank reaches, whatever it parsed):
// the lowest failing rank's reason goes to every rank, and all refuse together with exit code 2, rather than some
// waiting forever in a later collective for ranks that have left.
bool parse_command_line(CLI::App& app, const Commands& c, int argc, char** argv, int rank) {
  const watchdog::StartupWait agreeing("the ranks' agreement on the command line and the DDPLAB_* settings");
  std::string usage, setting;
  std::string answer;  // the help or the version, when asked for: nothing runs
  try {
    require_known_command(app, argc, argv);
    require_whole_lists(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    answer = app.help();  // the selected subcommand's help, if any
  } catch (const CLI::CallForVersion& e) {
    answer = std::string(e.what()) + "\n";
  } catch (const CLI::ParseError& e) {
    usage = parse_error_text(e, app);
  } catch (const UsageError& e) {
    usage = e.what();
  }
  // An MPMD launch can ask for the help on some ranks only: the others' command would end, unrun, with exit 0.
  int world = 1, asking = answer.empty() ? 0 : 1, asked = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Allreduce(&asking, &asked, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (asking && asked < world) usage = "--help or --version asked on some ranks only, the others have a command to run";
  // Every DDPLAB_* knob in the environment, on every rank, before any work (`devices` lists them as they are).
  if (answer.empty() && usage.empty() && !c.devices->parsed()) {
    try {
      settings::check_all();
    } catch (const settings::BadSetting& e) {
      setting = e.what();
    }
  }
  if (const std::string why = first_failing_reason(usage, MPI_COMM_WORLD); !why.empty()) throw UsageError(why);
  if (const std::string why = first_failing_reason(setting, MPI_COMM_WORLD); !why.empty())
    throw settings::BadSetting(why);
  if (asked == world) {
    if (rank == 0) std::printf("%s", answer.c_str());
    return false;
  }
  // Collective: only the commands that run collectives (the file commands run on rank 0 alone).
  if (c.train->parsed() || c.suite->parsed() || c.sweep->parsed()) settings::check_same_on_every_rank(MPI_COMM_WORLD);
  return true;
}

// The command parsed and checked; returns the exit code.
int run_command(const Commands& c, const std::string& command_line, int rank) {
  if (c.file_command) {
    // Rank 0 alone, and no MPI: every rank finalizes first, so that the others do not wait in MPI_Finalize, under its
    // bound, through rank 0's work (a page's charts take minutes on a small host). A failure that is no bad input is
    // one line; exit 5 for an output that could not be written, else 1 (a page whose scripts are missing).
    finalize_mpi();
    if (rank != 0) return 0;
    try {
      c.file_command();
    } catch (const UsageError&) {
      throw;
    } catch (const WriteFailed& e) {
      std::fprintf(stderr, "ddplab: error: %s\n", e.what());
      return kExitWriteFailed;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddplab: error: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (c.train->parsed()) {
    const bool page = settings::choice(settings::kTrainPage) == "on";
    run_training(c.config, MPI_COMM_WORLD, RunOptions{"train", command_line, "", page});
  }
  if (c.suite->parsed()) return run_suite(c.suite_options, command_line);
  if (c.sweep->parsed()) return run_sweep(c.sweep_options, command_line);
  if (c.devices->parsed()) return run_devices();
  return 0;
}

}  // namespace
}  // namespace ddplab

int main(int argc, char** argv) {
  using namespace ddplab;
  // Before any other HDF5 call: HDF5 1.10 keeps a file whose close failed (its last flush met a full disk) open, and
  // its exit handler then crashes closing it again; the process exits anyway, and the failure is already reported.
  H5dont_atexit();
  // A reader that closes standard output early (`ddplab train | head`) must not kill the run before its files and page
  // are written: the writes to the closed pipe fail with EPIPE instead, and are lost; the files are not.
  std::signal(SIGPIPE, SIG_IGN);
  // Before MPI_Init: it may run this program again with other OpenBLAS kernels (kernels/cpu/blas_kernels.h).
  blas::select_kernels(argc, argv);
  watchdog::name_thread("main thread");
  const int provided = start_mpi_multithreaded(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Before anything else collective: ranks running different subcommands or builds would enter different
  // collectives and wait on each other forever; this one all-gather is the same in all of them.
  std::string differing;
  {
    const watchdog::StartupWait agreeing("the ranks' agreement on MPI's thread level, the program and its build");
    require_mpi_thread_multiple(provided, "ddplab");  // exits 2, with the reason, below MPI_THREAD_MULTIPLE
    differing = identity_disagreement(this_rank_identity(argc, argv), MPI_COMM_WORLD);
  }
  if (!differing.empty()) {
    if (rank == 0) std::fprintf(stderr, "ddplab: error: %s\n", differing.c_str());
    finalize_mpi();
    return 2;
  }
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App app{"ddplab: data-parallel training engine and performance lab"};
  Commands commands;
  add_commands(app, commands);
  int code = 0;
  try {
    if (!parse_command_line(app, commands, argc, argv, rank)) {
      finalize_mpi();
      return 0;
    }
    code = run_command(commands, command_line, rank);
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "ddplab: error: %s (see ddplab --help)\n", e.what());
    finalize_mpi();
    return 2;
  } catch (const settings::BadSetting& e) {  // from check_all or check_same_on_every_rank, on every rank
    if (rank == 0) std::fprintf(stderr, "ddplab: error: %s (ddplab devices lists the settings)\n", e.what());
    finalize_mpi();
    return 2;
  } catch (const TrainingStopped& e) {
    // Every rank stopped at the same place (a step, or between a suite's or sweep's runs) with its run file written;
    // a suite case that leaves ranks outside it ends the job itself (launcher/suite.cpp). So the job ends cleanly.
    if (rank == 0) std::fprintf(stderr, "ddplab: stopped: %s\n", e.what());
    finalize_mpi();
    run_after_mpi();
    return e.exit_code;
  } catch (const std::exception& e) {
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(host, &len);
    // std::bad_alloc says only its name: say what ran out, and which flags size it.
    const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    std::fprintf(stderr, "ddplab: error on rank %d (%s): %s%s\n", rank, host,
                 memory ? "out of memory: the run needs more than this host gives (a smaller --batch, --hidden, "
                          "--layers, --model, --max-len, --epoch-size or --extra-allreduce-mb; "
                        : "",
                 memory ? (std::string(e.what()) + ")").c_str() : e.what());
    std::fflush(stderr);
    const int code = dynamic_cast<const WriteFailed*>(&e) ? kExitWriteFailed : 1;  // a suite's or sweep's summary
    MPI_Abort(MPI_COMM_WORLD, code);  // takes every other rank down with us: nobody waits forever
    return code;
  }
  finalize_mpi();
  run_after_mpi();
  return code;
}
