// allreduce_perf: all-reduce bandwidth of every implementation in one run, after nccl-tests' all_reduce_perf (same
// flags where they apply; docs/COMM.md, "allreduce_perf", lists them all).
//
//   mpirun -np 2 allreduce_perf -b 8 -e 256M [-f 2 | -i BYTES] [-w 5] [-n 20] [-c 1] [-a 1] [-G N] [-z 0|1|2]
//                               [--impls ring,mpi,mpi-raw,ring-bf16] [--link 10gbe] [--stat mean|median]
//                               [--csv F] [-J F] [--ranks-per-node K] [--diag] [-R 0|1] [--hot-cache]
//
// The implementations are impls.cpp's table, one file each saying how to set up and run its collective; this
// harness runs them alike. -R 1 (the default; nccl-tests' -R registers user buffers): the host buffers are
// RegisteredBuffers, as the trainer's gradients are, so a shm hop reads the peer's buffer in place (single copy,
// comm/shm_transport.h). The default measures what training gets; -R 0 measures ordinary memory, copied through the
// FIFOs (a caller's vector). Sizes are in bytes (K/M/G = 2^10/2^20/2^30) of float data. For every size and
// implementation: -w warm-up calls, then -n timed calls (each one call's size further along the -e buffers than the
// last, as nccl-tests moves them; --hot-cache: all at their start), out-of-place (Communicator::allreduce_sum_into;
// MPI: send and receive buffers) and in place. time = each rank's mean per call, combined over ranks as -a says
// (nccl-tests: 0 rank 0, 1 average, 2 min, 3 max), or with --stat median the median call; algbw = size / time; busbw =
// algbw x 2(n-1)/n, the per-link traffic of a bandwidth-optimal all-reduce, comparable across rank counts. Every call
// is also timed on its own; a call's time is its slowest rank's (nccl-tests -I): min, p50 and p99 of those per size.
// The exception, as in nccl-tests (-z 0, the default): a GPU implementation whose calls need no host wait between
// them (nccl, gpu-ring-nccl, -G's rows) has its -n calls queued back to back and one wait after them, so its time
// is the mean and its per-call columns N/A; -z 2 waits after each call and times it, -z 1 adds a barrier after it.
// Implementations are interleaved per size so that drift of a shared machine hits all alike; each row is printed
// when measured. -G N (nccl-tests' -G): beside each GPU implementation's row, one whose -n calls are captured into a
// CUDA graph launched N times, its times per call: the collective without the per-call launch and host wait.
//
// #wrong: after timing, each mode runs -c more times on fresh inputs and counts elements (summed over ranks) whose
// bits differ from the expected sum. Inputs are small integers (at most 256/n), so every partial sum is exact in
// fp32, bf16 and fp16 and any summation order must give exactly the expected bits.
//
// Bad arguments: one line naming the flag, exit code 2, before any work (output files are probed first).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/allreduce_perf/diag.h"
#include "bench/allreduce_perf/harness.h"
#ifdef DDPLAB_HAVE_CUDA
#include "bench/allreduce_perf/device.h"
#endif
#include "comm/shm_transport.h"
#include "comm/topology.h"
#include "git_commit.h"
#include "record/files.h"
#include "record/version.h"
#include "runtime/agreement.h"
#include "runtime/mpi_init.h"
#include "runtime/rank_identity.h"
#include "runtime/watchdog.h"

namespace ddplab::perf {
namespace {

// What every implementation runs on: the host's in and out buffers (device implementations copy from and to them,
// untimed) and the inputs' generator.
struct Buffers {
  float* in;
  float* out;
  Inputs& inputs;
};

// Both modes of one implementation at one size, each timed, then checked -c times. Rank 0's row.
Row measure(const Impl& impl, size_t bytes, const SizeDiagnosis& seen, const Buffers& b, const Options& o, int rank,
            int n, RankDiagnosis& diagnosis) {
  const size_t count = bytes / sizeof(float);
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  Row r{impl.label,         impl.wire_type,  impl.algorithm ? impl.algorithm(count) : nullptr, bytes, count, {}, {},
        seen.round_trip_ns, seen.stream_gbps};
  for (Mode* m : {&r.oop, &r.ip}) {
    const bool in_place = m == &r.ip;
    b.inputs.rep = 0;
    b.inputs.fill(b.in, count, rank);
    impl.load_in(b.in, count);
    const ShmWaitStats waits_before = shm_wait_stats();
    const double stolen =
        time_calls(impl, impl.in(b.in), in_place ? impl.in(b.in) : impl.out(b.out), count, o, rank, n, m);
    diagnosis.add(impl.label, shm_wait_stats() - waits_before, stolen);
    m->algbw = static_cast<double>(bytes) / (m->time_us * 1e-6) / 1e9;
    m->busbw = m->algbw * bus_factor;
    if (o.check_iters > 0) m->wrong = 0;
    for (int c = 0; c < o.check_iters && m->wrong == 0; ++c) {
      b.inputs.rep = c + 1;
      m->wrong = count_wrong(impl, b.inputs, rank, b.in, b.out, count, in_place);
    }
  }
  return r;
}

// Rank 0, after the table: the files, the check's verdict, each row label's average bus bandwidth. The exit code.
int finish(const Options& o, int n, const Topology& topology, const std::vector<std::string>& transports,
           const std::vector<std::string>& gpus, const std::vector<Impl>& impls, const std::vector<Row>& rows) {
  nlohmann::json avg_busbw;
  long long total_wrong = 0;
  for (const Impl& impl : impls) {
    double sum = 0;
    int k = 0;
    for (const Row& r : rows)
      if (r.impl == impl.label) sum += r.oop.busbw + r.ip.busbw, k += 2;
    avg_busbw[impl.label] = k ? sum / k : 0.0;
  }
  for (const Row& r : rows) total_wrong += std::max(0LL, r.oop.wrong) + std::max(0LL, r.ip.wrong);
  // Whole or not at all (record/files.h). A file that cannot be written (a full disk) is said, and the table and its
  // summary still printed: the measurement is not lost with it.
  bool write_failed = false;
  try {
    if (!o.csv_path.empty()) write_text_file(o.csv_path, results_csv(o, n, rows), o.force);
    if (!o.json_path.empty())
      write_text_file(o.json_path, results_json(o, n, topology, transports, gpus, rows, avg_busbw, total_wrong),
                      o.force);
  } catch (const WriteFailed& e) {
    std::fprintf(stderr, "allreduce_perf: error: %s\n", e.what());
    write_failed = true;
  }
  if (o.check_iters > 0)
    std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  else
    std::printf("# Out of bounds values : not checked (-c 0)\n");
  for (const Impl& impl : impls)
    std::printf("# Avg bus bandwidth    : %g (%s)\n", avg_busbw[impl.label].get<double>(), impl.label.c_str());
  std::printf("#\n");
  return total_wrong ? 1 : write_failed ? kExitWriteFailed : 0;
}

int run(const Options& o, const Topology& hosts, int rank, int n, watchdog::ArmedRun& armed) {
  RankDiagnosis diagnosis;
  const size_t max_count = o.max_bytes / sizeof(float);
  const Topology topology = detect_topology(MPI_COMM_WORLD, o.ranks_per_node);
  std::vector<Impl> impls;
  std::vector<std::string> transports;  // rank 0's
  for (const std::string& name : o.impls)
    for (Impl& impl : make_impls(name, o, max_count, transports)) impls.push_back(std::move(impl));
  // Each rank's GPU where the implementations run on GPUs (the same ones on every rank): made above, they chose it.
  std::vector<std::string> gpus;
#ifdef DDPLAB_HAVE_CUDA
  if (std::any_of(impls.begin(), impls.end(), [](const Impl& impl) { return impl.device_in != nullptr; }))
    gpus = gather_strings(device_bus_id(), MPI_COMM_WORLD);
#endif
  const int host_ranks = hosts.node_sizes()[hosts.node_of_rank[0]];  // on rank 0's host, which prints
  if (rank == 0) print_header(o, n, topology, transports, host_ranks);

  const size_t min_count = o.min_bytes / sizeof(float);
  Inputs inputs{n};
  // Collective; each is registered where the host's shm transports can use it (RegisteredBuffer).
  const RegisteredBuffer in_memory(MPI_COMM_WORLD, max_count * sizeof(float), o.registered == 1);
  const RegisteredBuffer out_memory(MPI_COMM_WORLD, max_count * sizeof(float), o.registered == 1);
  for (const RegisteredBuffer* memory : {&in_memory, &out_memory})
    if (!memory->registration_error().empty())  // a /dev/shm too small: that host's rows measure copies
      std::fprintf(stderr, "allreduce_perf: %s; the buffer goes by copy\n", memory->registration_error().c_str());
  const Buffers buffers{static_cast<float*>(in_memory.data()), static_cast<float*>(out_memory.data()), inputs};
  // Zeros, touching every page before timing. A size's inputs fill its first stretch; its calls move along the
  // buffers past it (call_offset) and reduce zeros there, whose sum stays zero however often a call in place repeats
  // it (inputs would grow n-fold with every call).
  std::fill(buffers.in, buffers.in + max_count, 0.0f);
  std::fill(buffers.out, buffers.out + max_count, 0.0f);
  // A first, untimed pass of every implementation (connections, scratch buffers, code paths warm), so that the
  // first size measured is not the one that pays for it.
  for (const Impl& impl : impls) {
    impl.load_in(buffers.in, min_count);
    for (int i = 0; i < 100; ++i) impl.run(impl.in(buffers.in), impl.in(buffers.in), min_count);
  }
  std::vector<Row> rows;
  std::unique_ptr<CacheLineRoundTrip> round_trip;
  std::unique_ptr<MemoryStream> stream;
  if (o.diag) {
    round_trip = std::make_unique<CacheLineRoundTrip>();
    stream = std::make_unique<MemoryStream>();
  }
  armed.setup_done();
  for (const size_t bytes : o.sizes()) {
    const SizeDiagnosis seen = diagnose_size(round_trip.get(), stream.get(), rank, n);
    for (const Impl& impl : impls) {
      rows.push_back(measure(impl, bytes, seen, buffers, o, rank, n, diagnosis));
      if (rank == 0) print_row(rows.back());
    }
  }
  if (o.diag) {
    const watchdog::Wait wait("the ranks' --diag reports");
    round_trip->free();
    print_diagnosis(diagnosis, rank, n);
  }
  return rank == 0 ? finish(o, n, topology, transports, gpus, impls, rows) : 0;
}

// Rank 0's exit code, on every rank: 2 for arguments refused before any work.
int run_checked(const Options& o, int rank, int n) {
  // A peer that hangs or died ends the job with the wait it left open, as in train, instead of waiting forever: the
  // setup (the hosts, the transports, the buffers, the first untimed calls) is one wait, the measurement many.
  watchdog::ArmedRun armed(o.timeout_s,
                           "allreduce_perf's setup (the ranks' hosts, the transports, the buffers, the first untimed "
                           "calls)");
  const Topology hosts = detect_topology(MPI_COMM_WORLD, /*ranks_per_node=*/0);
  if (!preflight(o, hosts, rank, n)) return 2;
  int code = 0;
  try {
    code = run(o, hosts, rank, n, armed);
  } catch (const UsageError& e) {  // raised alike on every rank before any work (communicator_impl)
    if (rank == 0) std::fprintf(stderr, "allreduce_perf: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the program's edge: other ranks may be waiting in a collective
  }
  const watchdog::Wait verdict("rank 0's verdict");
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0 knows the verdict
  return code;
}

}  // namespace
}  // namespace ddplab::perf

int main(int argc, char** argv) {
  using namespace ddplab::perf;
  ddplab::watchdog::name_thread("main thread");
  const int provided = ddplab::start_mpi_multithreaded(&argc, &argv);  // the GPU ring runs a comm thread
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  // Before anything else collective: ranks that run another program (a ddplab rank in an MPMD launch, another build)
  // or were given different command lines would measure other sizes or implementations and wait on each other in
  // different collectives. The first check is the collective every ddplab program makes first
  // (runtime/rank_identity.h). A rank stopped here ends the job too (StartupWait), as in the run's setup.
  std::string command_line;
  for (int i = 1; i < argc; ++i) command_line += (i > 1 ? " " : "") + std::string(argv[i]);
  std::string refused;  // the first reason to exit 2, alike on every rank
  Options options;
  bool asked_for_help = false;
  {
    const ddplab::watchdog::StartupWait agreeing(
        "the ranks' agreement on MPI's thread level, the program, its build and its arguments");
    ddplab::require_mpi_thread_multiple(provided, "allreduce_perf");  // exits 2 below MPI_THREAD_MULTIPLE
    refused = ddplab::identity_disagreement(
        ddplab::this_rank_runs("allreduce_perf", ddplab::kVersion, DDPLAB_GIT_COMMIT), MPI_COMM_WORLD);
    if (refused.empty())
      if (const std::string differing = ddplab::disagreement({{"arguments", command_line}}, MPI_COMM_WORLD);
          !differing.empty())
        refused = "ranks disagree on the " + differing;
    if (refused.empty()) {
      try {
        asked_for_help = !parse_options(argc, argv, rank, n, options);
      } catch (const UsageError& e) {
        // Every rank parsed the same command line (checked above) and got here alike: none waits for another.
        refused = std::string(e.what()) + " (see allreduce_perf --help)";
      }
    }
  }
  if (!refused.empty() || asked_for_help) {
    if (rank == 0 && !refused.empty()) std::fprintf(stderr, "allreduce_perf: error: %s\n", refused.c_str());
    ddplab::finalize_mpi();
    return refused.empty() ? 0 : 2;
  }
  const int code = run_checked(options, rank, n);
  ddplab::finalize_mpi();
  return code;
}
