// allreduce_perf: all-reduce bandwidth of every implementation in one run, after nccl-tests' all_reduce_perf
// (same flags where they apply; docs/COMM.md, "allreduce_perf", lists them all).
//
//   mpirun -np 2 allreduce_perf -b 8 -e 256M [-f 2 | -i BYTES] [-w 5] [-n 20] [-c 1] [-a 1]
//                               [--impls ring,mpi,mpi-raw,ring-bf16] [--link 10gbe] [--stat mean|median]
//                               [--csv F] [-J F] [--ranks-per-node K] [--diag] [-R 0|1]
//
// Implementations:  ring      ddplab's Communicator, --comm ring (recursive doubling for small buffers, the
//                             sliced ring above, or the direct all-reduce for registered buffers when every rank
//                             shares one host; docs/COMM.md), fp32 on the wire
//                   ring-only the same without the direct all-reduce: the ring (DDPLAB_DIRECT_ALLREDUCE=0)
//                   ring-bf16 / ring-fp16   the same with a 16-bit wire (buffers stay float)
//                   ring-sharded  the sharded update's two collectives in a row (--zero-stage 1): reduce-scatter,
//                             then all-gather (Communicator::reduce_scatter_gradients, all_gather; direct on one
//                             host, as the trainer runs them); out of place it copies the input into the output first
//                   mpi       ddplab's Communicator, --comm mpi: MPI_Allreduce plus the order check (and the
//                             link model when --link is set)
//                   hier      the hierarchical all-reduce (comm/hier_allreduce.h): ring in the node, ring across
//                             nodes per shard, ring in the node; nodes are the hosts, or emulated: --ranks-per-node K
//                             puts rank r on node r / K (K must divide -np)
//                   mpi-raw   MPI_Allreduce alone on a duplicate communicator: Open MPI's own number
//                   nccl      ncclAllReduce on device buffers, one GPU per rank (built with CUDA); the time
//                             includes the host's wait for the comm stream
//                   gpu-ring-nccl / gpu-ring-ipc / gpu-ring-host   our ring on device buffers (comm/ring_cuda.h)
//                             over NCCL p2p, CUDA IPC (ranks may share a GPU) or host staging; timed as nccl
// -R 1 (the default; nccl-tests' -R registers user buffers): the host buffers are RegisteredBuffers, as the
// trainer's gradients are, so a shm hop reads the peer's buffer in place (single copy, comm/shm_transport.h). The
// default measures what training gets; -R 0 measures ordinary memory, copied through the FIFOs (a caller's vector).
// Sizes are in bytes (K/M/G = 2^10/2^20/2^30) of float data. For every size and implementation: -w warm-up calls,
// then -n timed calls, out-of-place (Communicator::allreduce_sum_into; MPI: send and receive buffers) and in place.
// time = each rank's mean per call, combined over ranks as -a says (nccl-tests: 0 rank 0, 1 average, 2 min,
// 3 max), or with --stat median the median call; algbw = size / time; busbw = algbw x 2(n-1)/n, the per-link
// traffic of a bandwidth-optimal all-reduce, comparable across rank counts. Every call is also timed on its own;
// a call's time is its slowest rank's (nccl-tests -I): min, p50 and p99 of those per size. Implementations are
// interleaved per size so that drift of a shared machine hits all alike; each row is printed when measured.
//
// #wrong: after timing, each mode runs -c more times on fresh inputs and counts elements (summed over ranks) whose
// bits differ from the expected sum. Inputs are small integers (at most 256/n), so every partial sum is exact in
// fp32, bf16 and fp16 and any summation order must give exactly the expected bits.
//
// Bad arguments: one line naming the flag, exit code 2, before any work (output files are probed first).
#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "comm/communicator.h"
#include "comm/cpu_taken.h"
#include "comm/hier_allreduce.h"
#include "comm/mpi_init.h"
#include "comm/settings.h"
#include "comm/shm_transport.h"
#include "launcher/cli_errors.h"
#include "record/files.h"
#ifdef DDPLAB_HAVE_CUDA
#include "bench/allreduce_perf_nccl.h"
#endif

using namespace ddplab;
#ifdef DDPLAB_HAVE_CUDA
using namespace ddplab::bench;
#endif

namespace {

// A bad command line: one line on stderr from rank 0, exit code 2 on every rank, no MPI_Abort.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Bytes with an optional K/M/G suffix (powers of 1024), as nccl-tests reads -b, -e and -i.
size_t parse_size(const std::string& flag, const std::string& s) {
  const std::string bad = flag + " " + s + ": not a size (bytes with an optional K, M or G suffix, e.g. 64K)";
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) throw UsageError(bad);
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  double mult = 1;
  if (pos < s.size()) {
    const std::string suffixes = "KMG";
    const size_t k = suffixes.find(static_cast<char>(std::toupper(static_cast<unsigned char>(s[pos]))));
    if (k == std::string::npos || pos + 1 != s.size()) throw UsageError(bad);
    mult = std::ldexp(1.0, 10 * static_cast<int>(k + 1));
  }
  if (!std::isfinite(v) || v * mult > std::ldexp(1.0, 50)) throw UsageError(flag + " " + s + ": too large");
  return static_cast<size_t>(v * mult);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof s, "%.*f %s", bytes == std::floor(bytes) ? 0 : 1, bytes, units[u]);
  return s;
}

// How each rank's mean per call becomes the reported time: nccl-tests' -a.
enum class Aggregate { kRank0 = 0, kAverage = 1, kMin = 2, kMax = 3 };
const char* describe(Aggregate a) {
  switch (a) {
    case Aggregate::kRank0:
      return "rank 0's mean per call";
    case Aggregate::kAverage:
      return "mean per call, averaged over ranks";
    case Aggregate::kMin:
      return "mean per call of the fastest rank";
    case Aggregate::kMax:
      return "mean per call of the slowest rank";
  }
  return "?";
}
constexpr std::array<Named<Aggregate>, 4> choice_names(Aggregate) {
  return {{{Aggregate::kRank0, "rank0"}, {Aggregate::kAverage, "avg"}, {Aggregate::kMin, "min"}, {Aggregate::kMax, "max"}}};
}

// Every implementation allreduce_perf knows: the type on its wire (the table's `type` column, nccl-tests' names),
// whether it can run over an emulated link, and whether it needs the CUDA build.
struct ImplInfo {
  const char* name;
  const char* wire_type;
  bool emulates_link;
  bool needs_cuda;
};
constexpr ImplInfo kImpls[] = {
    {"ring", "float", true, false},         {"ring-only", "float", true, false},
    {"ring-bf16", "bfloat16", true, false}, {"ring-fp16", "half", true, false},
    {"ring-sharded", "float", true, false}, {"mpi", "float", true, false},
    {"hier", "float", true, false},         {"mpi-raw", "float", false, false},
    {"nccl", "float", false, true},         {"gpu-ring-nccl", "float", false, true},
    {"gpu-ring-ipc", "float", false, true}, {"gpu-ring-host", "float", false, true},
};

const ImplInfo& impl_info(const std::string& name) {
  for (const ImplInfo& i : kImpls)
    if (name == i.name) return i;
  std::string known;
  for (const ImplInfo& i : kImpls) known += (known.empty() ? "" : ", ") + std::string(i.name);
  throw UsageError("--impls " + name + ": unknown implementation (" + known + ")");
}

struct Options {
  size_t min_bytes = 0, max_bytes = 0;
  size_t step_bytes = 0;  // -i: a fixed step; 0: multiply by `factor`
  int factor = 2;
  int warmup = 5, iters = 20;
  int check_iters = 1;  // -c: 0 skips the check (#wrong N/A)
  Aggregate aggregate = Aggregate::kAverage;
  bool median = false;  // --stat median: time = p50 of the calls
  std::vector<std::string> impls;
  LinkClasses link;
  std::string csv_path, json_path, command_line;
  int ranks_per_node = 0;  // 0: the hosts are the nodes (comm/topology.h)
  bool diag = false;       // --diag: what each rank saw (CPUs, waits, page placement) under the table
  int registered = 1;      // -R: the host buffers registered with the shm transport (single copy)
  double gpu_chunk_mb = 0;  // the GPU ring's chunk; 0: the trainer's (CudaRingConfig::chunk_bytes)

  bool emulated() const { return link.emulated(); }
  // The sizes measured, in bytes, each rounded down to whole floats.
  std::vector<size_t> sizes() const {
    std::vector<size_t> out;
    for (size_t b = min_bytes;; b = step_bytes ? b + step_bytes : b * static_cast<size_t>(factor)) {
      out.push_back(b / sizeof(float) * sizeof(float));
      const bool last = step_bytes ? step_bytes > max_bytes || b > max_bytes - step_bytes
                                   : b > max_bytes / static_cast<size_t>(factor);  // no overflow past the end
      if (last) return out;
    }
  }
};

// Parses and checks the command line; the same on every rank, no MPI. Throws UsageError naming the flag, or
// returns false after --help (printed by rank 0).
bool parse_options(int argc, char** argv, int rank, int n, Options& o) {
  CLI::App app{"all-reduce bandwidth of every implementation (after nccl-tests' all_reduce_perf)"};
  std::string min_s = "8", max_s = "256M", step_s, impls_s, link_name = "none", dtype = "float", op = "sum";
  std::string stat = "mean";
  int ngpus = 1, nthreads = 1, aggregate = 1;
  double link_latency_us = -1, link_gbps = -1;
  app.add_option("-b,--minbytes", min_s, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size in bytes")->capture_default_str();
  CLI::Option* factor =
      app.add_option("-f,--stepfactor", o.factor, "multiply the size by this factor each step")->capture_default_str();
  CLI::Option* step = app.add_option("-i,--stepbytes", step_s, "add this many bytes each step instead of -f");
  app.add_option("-w,--warmup_iters", o.warmup, "untimed calls per size and mode")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed calls per size and mode")->capture_default_str();
  app.add_option("-c,--check", o.check_iters, "checked calls per size and mode (0: no check)")->capture_default_str();
  CLI::Option* average =
      app.add_option("-a,--average", aggregate, "ranks' mean times: 0 rank 0, 1 average, 2 min, 3 max")
          ->capture_default_str();
  app.add_option("-g,--ngpus", ngpus, "GPUs per thread (1: one process per GPU)")->capture_default_str();
  app.add_option("-t,--nthreads", nthreads, "threads per process (1)")->capture_default_str();
  app.add_option("-d,--datatype", dtype, "datatype in memory (float)")->capture_default_str();
  app.add_option("-o,--op", op, "reduction (sum)")->capture_default_str();
  app.add_option("--impls", impls_s,
                 "comma-separated: ring, ring-only, ring-bf16, ring-fp16, ring-sharded, mpi, mpi-raw, hier; GPU: nccl, "
                 "gpu-ring-nccl, "
                 "gpu-ring-ipc, "
                 "gpu-ring-host (default ring,mpi,mpi-raw,ring-bf16; no mpi-raw with --link)");
  app.add_option("--link", link_name,
                 "emulated link, every hop: none, 1gbe, 10gbe, 25gbe, 100gbe-ib, pcie4, nvlink4; or per class: "
                 "intra=P,inter=P (across nodes through the node's NIC, shared by its ranks)")
      ->capture_default_str();
  app.add_option("--link-latency-us", link_latency_us, "override the link's latency (us; a single preset)");
  app.add_option("--link-gbps", link_gbps, "override the link's bandwidth (Gbit/s; a single preset)");
  app.add_option("--stat", stat, "time per call: mean (nccl-tests, combined over ranks by -a) or median (the p50 call)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "median"}));
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "emulate nodes of K consecutive ranks (K divides -np; default: the hosts are the nodes)");
  app.add_option("-R,--local-register", o.registered,
                 "1: buffers registered with the shm transport (single copy, as the trainer's gradients); 0: copied")
      ->capture_default_str();
  app.add_option("--gpu-chunk-mb", o.gpu_chunk_mb,
                 "gpu-ring-*: the largest chunk one ring step moves, MiB (each exchange's fixed cost is paid once per "
                 "chunk); 0: the trainer's")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 4096.0));
  app.add_flag("--diag", o.diag,
               "what each rank saw: before each size rank 0's cache-line round trip to its peers and every rank's "
               "memory stream rate; under the table per rank its CPUs (start, end, affinity), context switches, "
               "shared-memory waits and its CPUs' steal time per implementation, direct collectives, the shared "
               "segments' NUMA placement");
  app.add_option("--csv", o.csv_path, "also write the results as CSV (rank 0)");
  app.add_option("-J,--json,--output_file", o.json_path, "also write the results as JSON (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (rank == 0) std::printf("%s", app.help().c_str());
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(parse_error_text(e, app));
  }
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);

  if (o.registered != 0 && o.registered != 1)
    throw UsageError("-R " + std::to_string(o.registered) + ": 0 (ordinary buffers) or 1 (registered buffers)");
  // -R is DDPLAB_LOCAL_REGISTER for this run: one fact, so that the Communicators' transport names (single copy,
  // direct collectives) say what the buffers get. Set before any knob is read (settings read each once); a value
  // that is neither 0 nor 1 is left for the knobs' own check to name.
  const std::string register_value = std::to_string(o.registered);
  const std::string environment =
      std::getenv(settings::kLocalRegister.name) ? std::getenv(settings::kLocalRegister.name) : "";
  if ((environment == "0" || environment == "1") && environment != register_value)
    throw UsageError("-R " + register_value + " and " + settings::kLocalRegister.name + "=" + environment +
                     " disagree");
  if (environment.empty()) setenv(settings::kLocalRegister.name, register_value.c_str(), 1);
  if (ngpus != 1)
    throw UsageError("-g " + std::to_string(ngpus) + ": one GPU per process here (start one rank per GPU: -np)");
  if (nthreads != 1)
    throw UsageError("-t " + std::to_string(nthreads) + ": one thread per process here (start more ranks: -np)");
  if (dtype != "float")
    throw UsageError("-d " + dtype + ": buffers hold float here (-d float); for a 16-bit wire use --impls " +
                     "ring-bf16 or ring-fp16");
  if (op != "sum") throw UsageError("-o " + op + ": every implementation here sums (-o sum)");

  o.min_bytes = parse_size("-b", min_s);
  o.max_bytes = parse_size("-e", max_s);
  if (o.min_bytes < sizeof(float)) throw UsageError("-b " + min_s + ": at least 4 bytes (one float)");
  if (o.max_bytes < o.min_bytes) throw UsageError("-e " + max_s + ": smaller than -b " + min_s);
  if (step->count() && factor->count()) throw UsageError("-i and -f: give one, a fixed step or a factor");
  if (step->count()) {
    try {
      o.step_bytes = parse_size("-i", step_s);
    } catch (const UsageError& e) {
      throw UsageError(std::string(e.what()) + "; -i is the step, as in nccl-tests: implementations are --impls");
    }
    if (o.step_bytes < sizeof(float)) throw UsageError("-i " + step_s + ": at least 4 bytes (one float)");
  } else if (o.factor < 2) {
    throw UsageError("-f " + std::to_string(o.factor) + ": the factor must be at least 2 (a fixed step is -i BYTES)");
  }
  if (o.warmup < 0) throw UsageError("-w " + std::to_string(o.warmup) + ": must not be negative");
  if (o.iters < 1) throw UsageError("-n " + std::to_string(o.iters) + ": at least 1 timed call");
  if (o.check_iters < 0) throw UsageError("-c " + std::to_string(o.check_iters) + ": must not be negative");
  if (aggregate < 0 || aggregate > 3)
    throw UsageError("-a " + std::to_string(aggregate) + ": 0 (rank 0), 1 (average), 2 (min) or 3 (max)");
  o.aggregate = static_cast<Aggregate>(aggregate);
  o.median = stat == "median";
  if (o.median && average->count())
    throw UsageError("-a: --stat median times each call by its slowest rank; -a applies to --stat mean");

  try {
    o.link = parse_links(link_name, link_latency_us, link_gbps);
    settings::check_all();  // every DDPLAB_* knob, alike on every rank, before any work
    settings::check_same_on_every_rank(MPI_COMM_WORLD);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (impls_s.empty()) impls_s = o.emulated() ? "ring,mpi,ring-bf16" : "ring,mpi,mpi-raw,ring-bf16";
  for (size_t pos = 0; pos <= impls_s.size();) {
    const size_t comma = std::min(impls_s.find(',', pos), impls_s.size());
    const std::string name = impls_s.substr(pos, comma - pos);
    const ImplInfo& info = impl_info(name);
    if (std::count(o.impls.begin(), o.impls.end(), name)) throw UsageError("--impls: " + name + " given twice");
#ifndef DDPLAB_HAVE_CUDA
    if (info.needs_cuda)
      throw UsageError("--impls " + name + ": needs a build with CUDA (configure with -DDDPLAB_CUDA=ON)");
#endif
    if (o.emulated() && !info.emulates_link)
      throw UsageError("--impls " + name + ": cannot emulate a link (--link " + link_name + "; ring, mpi, hier can)");
    o.impls.push_back(name);
    pos = comma + 1;
  }
  if (o.ranks_per_node < 0 || (o.ranks_per_node > 0 && n % o.ranks_per_node != 0))
    throw UsageError("--ranks-per-node " + std::to_string(o.ranks_per_node) + " does not divide the " +
                     std::to_string(n) + " ranks into equal nodes");
  if (!o.csv_path.empty() && o.csv_path == o.json_path) throw UsageError("--csv and -J: the same file " + o.csv_path);
  return true;
}

// Written whole or not at all: a temporary beside `path` (record/files.h), renamed over it once complete.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    const int error = errno;
    unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(error));
  }
  publish_file(tmp, path, /*force=*/true);
}

// Checks that need the machine: rank 0's output files, every rank's memory. Collective. The lowest rank that
// finds a problem prints it; every rank then returns false.
bool preflight(const Options& o, const Topology& hosts, int rank, int n) {
  std::string problem;
  // A file that exists is replaced (as nccl-tests' output files are): only a folder or an unwritable place refuses.
  const auto writable = [](const char* flag, const std::string& path) {
    const std::string why = check_output_path(path, /*force=*/true);
    return why.empty() ? why : std::string(flag) + " " + path + ": " + why;
  };
  if (rank == 0) problem = o.csv_path.empty() ? "" : writable("--csv", o.csv_path);
  if (rank == 0 && problem.empty() && !o.json_path.empty()) problem = writable("-J", o.json_path);
#ifdef DDPLAB_HAVE_CUDA
  for (const std::string& name : o.impls)
    if (problem.empty() && impl_info(name).needs_cuda)
      if (const std::string why = device_problem(); !why.empty()) problem = "--impls " + name + ": " + why;
#endif
  const int local_ranks = hosts.node_sizes()[hosts.node_of_rank[rank]];  // share this rank's memory
  // In and out buffers per rank, and --diag's MemoryStream.
  const double need =
      (2.0 * static_cast<double>(o.max_bytes) + (o.diag ? 4.0 * static_cast<double>(last_level_cache_bytes()) : 0.0)) *
      local_ranks;
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (problem.empty() && need > have)
    problem = "-e: " + std::to_string(local_ranks) + " ranks here need 2 buffers of " +
              human_bytes(static_cast<double>(o.max_bytes)) + " each" + (o.diag ? " and --diag's" : "") + ", " +
              human_bytes(need) + "; this machine has " + human_bytes(have);
  int first_bad = problem.empty() ? n : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == first_bad) std::fprintf(stderr, "allreduce_perf: error: %s\n", problem.c_str());
  return first_bad == n;
}

// Exact inputs: small integers whose sums over n ranks stay <= 256, exact in fp32, bf16 and fp16. `rep` varies them
// between check calls.
struct Inputs {
  int n;
  int rep = 0;
  int range() const { return std::max(1, std::min(16, 256 / n)); }
  float value(int rank, size_t i) const {
    return static_cast<float>(
        (i * 7 + static_cast<size_t>(rank) * 13 + static_cast<size_t>(rep) * 5) % static_cast<size_t>(range()) + 1);
  }
  float sum(size_t i) const {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, i);
    return s;
  }
  void fill(float* x, size_t count, int rank) const {
    for (size_t i = 0; i < count; ++i) x[i] = value(rank, i);
  }
};

// One implementation under test: out = allreduce_sum(in) (in == out: in place). A GPU implementation runs on
// device buffers of its own (device_in/out, max size): the harness copies inputs in and results out, untimed.
struct Impl {
  std::string name;
  std::function<void(const float* in, float* out, size_t count)> run;
  float* device_in = nullptr;
  float* device_out = nullptr;
  std::shared_ptr<void> owner;
  float* in(float* host) const { return device_in ? device_in : host; }
  float* out(float* host) const { return device_out ? device_out : host; }
  // The host's first `count` values of `in`, where the implementation reads them.
  void load(const float* host, size_t count) const {
#ifdef DDPLAB_HAVE_CUDA
    if (device_in) copy_to_device(device_in, host, count);
#endif
    (void)host, (void)count;
  }
};

// Bad nodes for hier (one node, unequal nodes) are refused on every rank alike (std::invalid_argument): a usage
// error, exit code 2. `transports` collects what each implementation's hops use, for the header.
Impl make_communicator_impl(const std::string& name, AllreduceImpl impl, WireDtype wire, const Options& o,
                            std::vector<std::string>& transports, bool direct = true) {
  std::shared_ptr<Communicator> comm;
  try {
    comm = std::make_shared<Communicator>(MPI_COMM_WORLD, CommOptions{impl, wire, o.link, o.ranks_per_node, direct});
  } catch (const std::invalid_argument& e) {
    throw UsageError("--impls " + name + ": " + e.what());
  }
  transports.push_back(name + " over " + comm->transport_name());
  int tag = 0;
  return {name,
          [comm, tag](const float* in, float* out, size_t count) mutable {
            comm->allreduce_sum_into(in, out, count, tag);
            tag = (tag + 1) % 32768;  // a tag per call, as the Reducer's buckets: the order check runs too
          },
          nullptr, nullptr, nullptr};
}

// --zero-stage 1's collectives: the reduce-scatter, then the all-gather, each with its own tag as the Reducer gives
// them (direct where the Communicator takes it, as in training). The sum comes out as the ring all-reduce's, bit for
// bit.
Impl make_sharded_impl(const Options& o, std::vector<std::string>& transports) {
  auto comm = std::make_shared<Communicator>(
      MPI_COMM_WORLD, CommOptions{AllreduceImpl::kRing, WireDtype::kFp32, o.link, o.ranks_per_node});
  transports.push_back("ring-sharded over " + comm->transport_name());
  int tag = 0;
  return {"ring-sharded",
          [comm, tag](const float* in, float* out, size_t count) mutable {
            if (in != out) std::memcpy(out, in, count * sizeof(float));
            comm->reduce_scatter_gradients(out, count, 1.0f, tag);
            comm->all_gather(out, count, tag + 1);
            tag = (tag + 2) % 32768;
          },
          nullptr, nullptr, nullptr};
}

Impl make_mpi_raw_impl() {
  auto comm = std::shared_ptr<MPI_Comm>(new MPI_Comm, [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(c);
    delete c;
  });
  MPI_Comm_dup(MPI_COMM_WORLD, comm.get());
  return {"mpi-raw",
          [comm](const float* in, float* out, size_t count) {
            if (count > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("mpi-raw: count > INT_MAX");
            MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, *comm);
          },
          nullptr, nullptr, nullptr};
}

// Builds a checked name (parse_options): collective over MPI_COMM_WORLD.
Impl make_impl(const std::string& name, const Options& o, size_t max_count, std::vector<std::string>& transports) {
#ifdef DDPLAB_HAVE_CUDA
  if (name == "nccl") {
    DeviceAllreduce d = make_nccl_allreduce(max_count);
    return {name, d.run, d.in, d.out, d.owner};
  }
  if (name.rfind("gpu-ring-", 0) == 0) {
    DeviceAllreduce d =
        make_ring_cuda_allreduce(max_count, name.substr(9), static_cast<size_t>(o.gpu_chunk_mb * (1 << 20)));
    return {name, d.run, d.in, d.out, d.owner};
  }
#endif
  (void)max_count;
  if (name == "ring") return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kFp32, o, transports);
  if (name == "ring-only")
    return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kFp32, o, transports, /*direct=*/false);
  if (name == "ring-bf16") return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kBf16, o, transports);
  if (name == "ring-fp16") return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kFp16, o, transports);
  if (name == "ring-sharded") return make_sharded_impl(o, transports);
  if (name == "mpi") return make_communicator_impl(name, AllreduceImpl::kMpi, WireDtype::kFp32, o, transports);
  if (name == "mpi-raw") return make_mpi_raw_impl();
  if (name == "hier") return make_communicator_impl(name, AllreduceImpl::kHier, WireDtype::kFp32, o, transports);
  throw std::logic_error("make_impl: " + name);
}

// One mode (out-of-place or in place) at one size. On rank 0 only: the other ranks just take part.
struct Mode {
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = -1;               // -1: not checked (-c 0)
  std::vector<double> rank_means_us;  // each rank's mean per call
  std::vector<double> calls_us;       // per call, the slowest rank's time
  std::vector<double> steal_ms;       // --diag: per rank, its CPUs' steal time over the timed calls
  double min_us = 0, p50_us = 0, p99_us = 0;
};
struct Row {
  std::string impl;
  size_t bytes = 0, count = 0;
  Mode oop, ip;
  std::vector<double> round_trip_ns;  // --diag: rank 0's cache-line round trip to each other rank of its node
  std::vector<double> stream_gbps;    // --diag: each rank's memory stream rate just before this size (MemoryStream)
};

// Nearest-rank percentile (as nccl-tests' i_p99): the smallest value with at least p% of the calls at or below it.
double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::max<size_t>(rank, 1) - 1];
}

// --diag: how long the hypervisor gave the CPUs this rank may run on (its one vCPU when bound) to someone else while
// the guest had work for them (comm/cpu_taken.h), in ms since boot, in steps of USER_HZ (10 ms). A call that took
// several times its median while steal grew was stalled from outside: no setting of ours decides it. 0 where it is
// not counted (bare metal, or a kernel without it).
double steal_ms_now() {
  static const CpuTakenMeter meter;  // made on first use, on the rank's main thread
  return std::max(0.0, meter.read().steal_ms);
}

// Returns the steal time of this rank's CPUs over the timed calls (--diag; else 0).
double time_calls(const Impl& impl, const float* in, float* out, size_t count, const Options& o, int rank, int n,
                  Mode* m) {
  for (int i = 0; i < o.warmup; ++i) impl.run(in, out, count);
  std::vector<double> t(o.iters);
  const double steal_at_start = o.diag ? steal_ms_now() : 0;  // before the barrier: the calls start together
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  for (int i = 0; i < o.iters; ++i) {
    const double a = now_s();
    impl.run(in, out, count);
    t[i] = (now_s() - a) * 1e6;
  }
  const double mean_us = (now_s() - t0) / o.iters * 1e6;
  const double stolen = o.diag ? steal_ms_now() - steal_at_start : 0;
  if (o.diag) {
    m->steal_ms.assign(rank == 0 ? n : 0, 0.0);
    MPI_Gather(&stolen, 1, MPI_DOUBLE, m->steal_ms.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  m->rank_means_us.assign(rank == 0 ? n : 0, 0.0);
  m->calls_us.assign(rank == 0 ? o.iters : 0, 0.0);
  MPI_Gather(&mean_us, 1, MPI_DOUBLE, m->rank_means_us.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Reduce(t.data(), m->calls_us.data(), o.iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank != 0) return stolen;
  const std::vector<double>& r = m->rank_means_us;
  m->min_us = *std::min_element(m->calls_us.begin(), m->calls_us.end());
  m->p50_us = percentile(m->calls_us, 50);
  m->p99_us = percentile(m->calls_us, 99);
  double sum = 0;
  for (double v : r) sum += v;
  const double by_ranks[] = {r[0], sum / n, *std::min_element(r.begin(), r.end()),
                             *std::max_element(r.begin(), r.end())};
  m->time_us = o.median ? m->p50_us : by_ranks[static_cast<int>(o.aggregate)];
  return stolen;
}

long long count_wrong(const Impl& impl, const Inputs& inputs, int rank, float* in_host, float* out_host,
                      size_t count, bool in_place) {
  float* in = in_host;
  inputs.fill(in, count, rank);
  impl.load(in_host, count);
  float* result = in_place ? in : out_host;
  if (!in_place) {
    std::fill(result, result + count, -1.0f);
#ifdef DDPLAB_HAVE_CUDA
    if (impl.device_out) copy_to_device(impl.device_out, result, count);
#endif
  }
  impl.run(impl.in(in_host), in_place ? impl.in(in_host) : impl.out(out_host), count);
#ifdef DDPLAB_HAVE_CUDA
  if (impl.device_in) copy_to_host(result, in_place ? impl.device_in : impl.device_out, count);
#endif
  long long wrong = 0, total = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = inputs.sum(i);
    wrong += std::memcmp(&result[i], &want, sizeof want) != 0;
  }
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

// `value` in at most `width` characters, with as many of 2 decimals as fit (nccl-tests' columns).
std::string fit(double value, int width) {
  char s[64];
  for (int decimals = 2; decimals >= 0; --decimals)
    if (std::snprintf(s, sizeof s, "%*.*f", width, decimals, value) <= width) return s;
  std::snprintf(s, sizeof s, "%*.1e", width, value);
  return s;
}

constexpr const char* kRowFormat = "%-13s %12s %12s %8s %5s  %8s %6s %6s %6s %8s %8s  %8s %6s %6s %6s %8s %8s\n";

void print_header(const Options& o, int n, const Topology& topology, const std::vector<std::string>& transports,
                  int host_ranks) {
  char host[256] = "?";
  gethostname(host, sizeof host);
  const std::string step =
      o.step_bytes ? "+" + human_bytes(static_cast<double>(o.step_bytes)) : "x" + std::to_string(o.factor);
  std::printf("# ddplab allreduce_perf: %d ranks, host %s, %s, link %s\n", n, host, topology.describe().c_str(),
              describe(o.link).c_str());
  for (const std::string& t : transports) std::printf("# %s\n", t.c_str());
  if (const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)); host_ranks > cores)
    std::printf(
        "# oversubscribed: %d ranks on this host's %ld cores take turns on them, so the times measure this "
        "machine's sharing\n",
        host_ranks, cores);
  std::printf("# host buffers: %s\n",
              o.registered ? "registered (-R 1): shm hops read the peer's buffer in place"
                           : "not registered (-R 0): shm hops copy through the FIFOs, and no direct collectives");
  const std::vector<size_t> sizes = o.sizes();  // the sizes run: the last is -e only where the steps land on it
  std::printf("# sizes %s .. %s, %s; warm-up %d, iters %d, check %d\n",
              human_bytes(static_cast<double>(sizes.front())).c_str(),
              human_bytes(static_cast<double>(sizes.back())).c_str(), step.c_str(), o.warmup, o.iters, o.check_iters);
  std::printf("# time = %s; algbw = size / time; busbw = algbw x 2(n-1)/n; GB = 1e9 bytes\n",
              o.median ? "p50 over calls" : describe(o.aggregate));
  std::printf(
      "# i_min, i_p99: per call, each call timed by its slowest rank. size, count: the float buffer's, whatever the\n"
      "# wire; type: on the wire (a 16-bit wire moves half the bytes, so its busbw is the buffer's rate, not the "
      "wire's)\n");
  std::printf("#\n#%58s%-51s%s\n", "", "out-of-place", "in-place");
  std::printf(kRowFormat, "# impl", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "i_min",
              "i_p99", "time", "algbw", "busbw", "#wrong", "i_min", "i_p99");
  std::printf(kRowFormat, "#", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)",
              "(GB/s)", "(GB/s)", "", "(us)", "(us)");
  std::fflush(stdout);
}

void print_row(const Row& r) {
  auto wrong = [](long long w) { return w < 0 ? std::string("N/A") : std::to_string(w); };
  const Mode &a = r.oop, &b = r.ip;
  std::printf(kRowFormat, r.impl.c_str(), std::to_string(r.bytes).c_str(), std::to_string(r.count).c_str(),
              impl_info(r.impl).wire_type, "sum", fit(a.time_us, 8).c_str(), fit(a.algbw, 6).c_str(),
              fit(a.busbw, 6).c_str(), wrong(a.wrong).c_str(), fit(a.min_us, 8).c_str(), fit(a.p99_us, 8).c_str(),
              fit(b.time_us, 8).c_str(), fit(b.algbw, 6).c_str(), fit(b.busbw, 6).c_str(), wrong(b.wrong).c_str(),
              fit(b.min_us, 8).c_str(), fit(b.p99_us, 8).c_str());
  std::fflush(stdout);  // a row as soon as it is measured
}

nlohmann::json mode_json(const Mode& m) {
  return {{"time_us", m.time_us},
          {"algbw_gbs", m.algbw},
          {"busbw_gbs", m.busbw},
          {"wrong", m.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.wrong)},
          {"min_us", m.min_us},
          {"p50_us", m.p50_us},
          {"p99_us", m.p99_us},
          {"times_us", m.calls_us},
          {"rank_means_us", m.rank_means_us},
          {"steal_ms", m.steal_ms}};
}

std::string results_json(const Options& o, int n, const Topology& topology, const std::vector<Row>& rows,
                         const nlohmann::json& avg_busbw, long long total_wrong) {
  nlohmann::json j;
  j["args"] = o.command_line;
  j["nranks"] = n;
  const auto link_json = [](const LinkModel& l) {
    return nlohmann::json{{"name", l.name}, {"latency_us", l.latency_us}, {"gbps", l.gbps}};
  };
  j["link"] = link_json(o.link.inter);  // the link across nodes: every hop's with one preset
  j["links"] = {{"intra", link_json(o.link.intra)}, {"inter", link_json(o.link.inter)}};
  j["node_of_rank"] = topology.node_of_rank;
  j["warmup"] = o.warmup;
  j["iters"] = o.iters;
  j["check_iters"] = o.check_iters;
  j["registered"] = o.registered == 1;  // -R
  j["stat"] = o.median ? "median" : "mean";
  j["aggregate"] = o.median ? nlohmann::json(nullptr) : nlohmann::json(to_string(o.aggregate));  // -a
  j["results"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["results"].push_back({{"impl", r.impl},
                            {"size_bytes", r.bytes},
                            {"count", r.count},
                            {"type", impl_info(r.impl).wire_type},
                            {"redop", "sum"},
                            {"out_of_place", mode_json(r.oop)},
                            {"in_place", mode_json(r.ip)},
                            {"round_trip_ns", r.round_trip_ns},
                            {"stream_gbps", r.stream_gbps}});
  j["avg_busbw"] = avg_busbw;
  j["wrong"] = total_wrong;
  return j.dump(1) + "\n";
}

std::string results_csv(const Options& o, int n, const std::vector<Row>& rows) {
  std::ostringstream s;
  s << "impl,nranks,link,size_bytes,count,type,redop";
  for (const char* m : {"oop", "ip"})
    for (const char* c : {"time_us", "algbw_gbs", "busbw_gbs", "wrong", "min_us", "p50_us", "p99_us"})
      s << "," << m << "_" << c;
  s << "\n";
  char line[512];
  for (const Row& r : rows) {
    const std::string link = o.link.per_class() ? o.link.intra.name + "/" + o.link.inter.name : o.link.intra.name;
    std::snprintf(line, sizeof line, "%s,%d,%s,%zu,%zu,%s,sum", r.impl.c_str(), n, link.c_str(), r.bytes,
                  r.count, impl_info(r.impl).wire_type);
    s << line;
    for (const Mode* m : {&r.oop, &r.ip}) {
      const std::string wrong = m->wrong < 0 ? "" : std::to_string(m->wrong);
      std::snprintf(line, sizeof line, ",%.3f,%.4f,%.4f,%s,%.3f,%.3f,%.3f", m->time_us, m->algbw, m->busbw,
                    wrong.c_str(), m->min_us, m->p50_us, m->p99_us);
      s << line;
    }
    s << "\n";
  }
  return s.str();
}

// --diag: what one rank saw, to tell a slow run from a fast one (issue #18: the ring's bandwidth is bimodal).
struct RankDiagnosis {
  int cpu_at_start = -1;
  std::string affinity = cpu_list();
  rusage usage_at_start = usage();
  struct Seen {  // per implementation, over its timed calls
    std::string impl;
    ShmWaitStats waits;
    double steal_ms = 0;  // its CPUs' (steal_ms_now)
  };
  std::vector<Seen> seen;

  RankDiagnosis() : cpu_at_start(sched_getcpu()) {}
  static rusage usage() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u;
  }
  static std::string cpu_list() {  // "0-1", "3"
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
    std::string text;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &set) || (c > 0 && CPU_ISSET(c - 1, &set))) continue;
      int last = c;
      while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
      text += (text.empty() ? "" : ",") + std::to_string(c) + (last > c ? "-" + std::to_string(last) : "");
    }
    return text;
  }
  void add(const std::string& impl, const ShmWaitStats& waits, double steal_ms) {
    for (Seen& s : seen)
      if (s.impl == impl) {
        s.waits += waits;
        s.steal_ms += steal_ms;
        return;
      }
    seen.push_back({impl, waits, steal_ms});
  }
  // This rank's lines, at the end of the run.
  std::string report(int rank) const {
    const rusage now = usage();
    char line[512];
    std::snprintf(line, sizeof line,
                  "#  rank %d: cpu %d at start, %d at end, affinity %s; context switches %ld voluntary, %ld "
                  "involuntary\n",
                  rank, cpu_at_start, sched_getcpu(), affinity.c_str(), now.ru_nvcsw - usage_at_start.ru_nvcsw,
                  now.ru_nivcsw - usage_at_start.ru_nivcsw);
    std::string text = line;
    for (const Seen& s : seen) {
      const ShmWaitStats& w = s.waits;
      std::snprintf(line, sizeof line,
                    "#    %-10s shm waits %llu (%.1f ms): polls %llu spinning, %llu yielding, %llu after sleeps "
                    "(%.1f ms asleep); steal %.0f ms\n",
                    s.impl.c_str(), static_cast<unsigned long long>(w.waits), w.wait_ns * 1e-6,
                    static_cast<unsigned long long>(w.spin_polls), static_cast<unsigned long long>(w.yield_polls),
                    static_cast<unsigned long long>(w.sleeps), w.sleep_ns * 1e-6, s.steal_ms);
      text += line;
    }
    const ShmSendCounts sent = shm_send_counts();
    std::snprintf(line, sizeof line, "#    shm sends: %llu by reference (single copy), %llu copied through FIFOs\n",
                  static_cast<unsigned long long>(sent.by_reference), static_cast<unsigned long long>(sent.copied));
    text += line;
    std::snprintf(line, sizeof line, "#    direct collectives: %llu, of which %llu stored non-temporally\n",
                  static_cast<unsigned long long>(shm_direct_collectives()),
                  static_cast<unsigned long long>(shm_streamed_collectives()));
    text += line;
    return text + "#    shared segments: " + shm_page_placement() + "\n";
  }
};

// --diag: how far apart the ranks' cores are, as the round trip of one cache line between rank 0 and each other rank
// of its node through a shared window. About 110 ns where two cores share an L3, about 500 where they do not: on a
// Zen 5 VM (session 13) the hypervisor moved the two vCPUs between the two from minute to minute, and the ring's
// in-place busbw at 16 MiB followed (24-29 GB/s near, 11 far). Measured before each size, since it can change
// within a run. Collective; rank 0 gets the median of its batches per peer (ns), the other ranks nothing. At most
// 20 ms per peer (past that, one batch, shorter), for hosts with more ranks than cores.
class CacheLineRoundTrip {
 public:
  CacheLineRoundTrip() {
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_);
    MPI_Comm_rank(node_, &rank_);
    MPI_Comm_size(node_, &size_);
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    measures_ = world_rank == 0;  // only rank 0's node: the others would spin for nothing
    MPI_Allreduce(MPI_IN_PLACE, &measures_, 1, MPI_INT, MPI_MAX, node_);
    // One spare line, to start on a line boundary whatever the window's alignment.
    MPI_Win_allocate_shared(rank_ == 0 ? kLine * (2 * size_ + 1) : 0, 1, MPI_INFO_NULL, node_, &window_base_, &window_);
    MPI_Aint bytes = 0;
    int unit = 0;
    MPI_Win_shared_query(window_, 0, &bytes, &unit, &window_base_);
    if (rank_ == 0) std::memset(window_base_, 0, bytes);
    const auto address = reinterpret_cast<uintptr_t>(window_base_);
    lines_ = reinterpret_cast<char*>((address + kLine - 1) / kLine * kLine);
    last_.assign(size_, 0);
    MPI_Barrier(node_);
  }
  // Collective: call it on every rank once done. (Not from the destructor: a rank unwinding after an error must not
  // wait in a collective for ranks that will never join it.)
  void free() {
    MPI_Win_free(&window_);
    MPI_Comm_free(&node_);
  }
  CacheLineRoundTrip(const CacheLineRoundTrip&) = delete;
  CacheLineRoundTrip& operator=(const CacheLineRoundTrip&) = delete;

  std::vector<double> measure() {
    std::vector<double> ns;
    if (!measures_) return ns;
    for (int peer = 1; peer < size_; ++peer) {
      MPI_Barrier(node_);
      if (rank_ == 0) ns.push_back(ping(peer));
      if (rank_ == peer) echo(peer);
    }
    MPI_Barrier(node_);
    return ns;
  }

 private:
  static constexpr int kLine = 128;  // a line each way per peer, a line apart (the adjacent-line prefetcher)
  static constexpr int kBatches = 5, kTripsPerBatch = 1000;
  int* line(int peer, int way) { return reinterpret_cast<int*>(lines_ + kLine * (2 * peer + way)); }
  // Waits until *p differs from `last` and returns it; yields now and then so that ranks sharing a core get on.
  static int next_value(const int* p, int last) {
    for (unsigned spins = 1;; ++spins) {
      const int v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
      if (v != last) return v;
      if (spins % 256 == 0) sched_yield();
    }
  }
  static void wait_until(const int* p, int value) {
    for (unsigned spins = 1; __atomic_load_n(p, __ATOMIC_ACQUIRE) != value; ++spins)
      if (spins % 256 == 0) sched_yield();
  }
  // Rank 0: batches of round trips (at most 20 ms of them, for hosts with more ranks than cores), then the stop value.
  double ping(int peer) {
    int* to_peer = line(peer, 0);
    const int* from_peer = line(peer, 1);
    std::vector<double> batch_ns;
    const double deadline = MPI_Wtime() + 0.02;
    for (int b = 0; b < kBatches; ++b) {
      const double start = MPI_Wtime();
      int trips = 0;
      while (trips < kTripsPerBatch && (trips % 64 != 0 || MPI_Wtime() < deadline)) {
        __atomic_store_n(to_peer, ++last_[peer], __ATOMIC_RELEASE);
        wait_until(from_peer, last_[peer]);
        ++trips;
      }
      if (trips > 0) batch_ns.push_back((MPI_Wtime() - start) * 1e9 / trips);
      if (trips < kTripsPerBatch) break;
    }
    __atomic_store_n(to_peer, -(++last_[peer]), __ATOMIC_RELEASE);  // stop
    std::sort(batch_ns.begin(), batch_ns.end());
    return batch_ns[batch_ns.size() / 2];
  }
  // The peer: echoes each value until the stop value (negative; the next measure's values differ from it).
  void echo(int peer) {
    for (;;) {
      const int v = next_value(line(peer, 0), last_[peer]);
      last_[peer] = v;
      if (v < 0) return;
      __atomic_store_n(line(peer, 1), v, __ATOMIC_RELEASE);
    }
  }

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win window_ = MPI_WIN_NULL;
  void* window_base_ = nullptr;
  char* lines_ = nullptr;
  int rank_ = 0, size_ = 1, measures_ = 0;
  std::vector<int> last_;  // per peer: the last value sent (rank 0) or seen, stop values included (the peer)
};

// Rank 0 prints every rank's report in rank order (collective).
void print_diagnosis(const RankDiagnosis& d, int rank, int n) {
  const std::string mine = d.report(rank);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(n), offsets(n);
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < n; ++r) offsets[r] = total, total += lengths[r];
  std::string all(rank == 0 ? total : 0, '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
              MPI_COMM_WORLD);
  if (rank == 0) std::printf("# per rank (--diag):\n%s", all.c_str());
}

// --diag: how fast every rank streams memory just before each size, all at once as the all-reduce will: y += x over
// two buffers each twice the last-level cache (bench::add_stream_ms), GB/s read + written. On a shared host this
// moves with the other tenants' memory traffic, which the guest sees no other way: in session 17 it moved between
// about 18 and 39 GB/s from size to size, and the direct all-reduce's busbw with it (docs/BENCHMARKS.md). About 30 ms
// per size; it leaves the cache full of its own lines, which the size's warm-up calls (-w) replace.
class MemoryStream {
 public:
  MemoryStream() : x_(2 * last_level_cache_bytes() / sizeof(float), 1.0f), y_(x_.size(), 0.0f) {}
  // Collective; rank 0 gets each rank's rate, the other ranks nothing.
  std::vector<double> measure(int rank, int n) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double gbps = 3.0 * static_cast<double>(x_.size() * sizeof(float)) / bench::add_stream_ms(y_, x_, 3) / 1e6;
    std::vector<double> all(rank == 0 ? n : 0);
    MPI_Gather(&gbps, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return all;
  }

 private:
  std::vector<float> x_, y_;
};

int run(const Options& o, const Topology& hosts, int rank, int n) {
  RankDiagnosis diagnosis;
  const size_t max_count = o.max_bytes / sizeof(float);
  const Topology topology = detect_topology(MPI_COMM_WORLD, o.ranks_per_node);
  std::vector<Impl> impls;
  std::vector<std::string> transports;  // rank 0's
  for (const std::string& name : o.impls) impls.push_back(make_impl(name, o, max_count, transports));
  const int host_ranks = hosts.node_sizes()[hosts.node_of_rank[0]];  // on rank 0's host, which prints
  if (rank == 0) print_header(o, n, topology, transports, host_ranks);

  const size_t min_count = o.min_bytes / sizeof(float);
  Inputs inputs{n};
  // Collective; each is registered where the host's shm transports can use it (RegisteredBuffer).
  const RegisteredBuffer in_memory(MPI_COMM_WORLD, max_count * sizeof(float), o.registered == 1);
  const RegisteredBuffer out_memory(MPI_COMM_WORLD, max_count * sizeof(float), o.registered == 1);
  float* in = static_cast<float*>(in_memory.data());
  float* out = static_cast<float*>(out_memory.data());
  inputs.fill(in, max_count, rank);  // touch every page before timing
  std::fill(out, out + max_count, 0.0f);
  // A first, untimed pass of every implementation (connections, scratch buffers, code paths warm), so that the
  // first size measured is not the one that pays for it.
  for (const Impl& impl : impls) {
    impl.load(in, min_count);
    for (int i = 0; i < 100; ++i) impl.run(impl.in(in), impl.in(in), min_count);
  }
  std::vector<Row> rows;
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  std::unique_ptr<CacheLineRoundTrip> round_trip;
  std::unique_ptr<MemoryStream> stream;
  if (o.diag) {
    round_trip = std::make_unique<CacheLineRoundTrip>();
    stream = std::make_unique<MemoryStream>();
  }
  for (const size_t bytes : o.sizes()) {
    const size_t count = bytes / sizeof(float);
    std::vector<double> round_trip_ns;  // rank 0's, to each other rank of its node
    if (round_trip) {
      round_trip_ns = round_trip->measure();
      if (rank == 0 && !round_trip_ns.empty()) {
        std::printf("# cache-line round trip from rank 0 (--diag):");
        for (size_t p = 0; p < round_trip_ns.size(); ++p) std::printf(" rank %zu %.0f ns", p + 1, round_trip_ns[p]);
        std::printf("\n");
      }
    }
    std::vector<double> stream_gbps;  // rank 0's copy of every rank's
    if (stream) {
      stream_gbps = stream->measure(rank, n);
      if (rank == 0) {
        std::printf("# memory stream per rank, y += x (--diag):");
        for (double g : stream_gbps) std::printf(" %.1f", g);
        std::printf(" GB/s\n");
      }
    }
    for (const Impl& impl : impls) {
      Row r{impl.name, bytes, count, {}, {}, round_trip_ns, stream_gbps};
      for (Mode* m : {&r.oop, &r.ip}) {
        const bool in_place = m == &r.ip;
        inputs.rep = 0;
        inputs.fill(in, count, rank);
        impl.load(in, count);
        const ShmWaitStats waits_before = shm_wait_stats();
        const double stolen =
            time_calls(impl, impl.in(in), in_place ? impl.in(in) : impl.out(out), count, o, rank, n, m);
        diagnosis.add(impl.name, shm_wait_stats() - waits_before, stolen);
        m->algbw = static_cast<double>(bytes) / (m->time_us * 1e-6) / 1e9;
        m->busbw = m->algbw * bus_factor;
        if (o.check_iters > 0) m->wrong = 0;
        for (int c = 0; c < o.check_iters && m->wrong == 0; ++c) {
          inputs.rep = c + 1;
          m->wrong = count_wrong(impl, inputs, rank, in, out, count, in_place);
        }
      }
      if (rank == 0) print_row(r);
      rows.push_back(std::move(r));
    }
  }
  if (round_trip) round_trip->free();
  if (o.diag) print_diagnosis(diagnosis, rank, n);
  if (rank != 0) return 0;

  nlohmann::json avg_busbw;
  long long total_wrong = 0;
  for (const std::string& name : o.impls) {
    double sum = 0;
    int k = 0;
    for (const Row& r : rows)
      if (r.impl == name) sum += r.oop.busbw + r.ip.busbw, k += 2;
    avg_busbw[name] = k ? sum / k : 0.0;
  }
  for (const Row& r : rows) total_wrong += std::max(0LL, r.oop.wrong) + std::max(0LL, r.ip.wrong);
  if (!o.csv_path.empty()) write_atomically(o.csv_path, results_csv(o, n, rows));
  if (!o.json_path.empty()) write_atomically(o.json_path, results_json(o, n, topology, rows, avg_busbw, total_wrong));
  if (o.check_iters > 0)
    std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  else
    std::printf("# Out of bounds values : not checked (-c 0)\n");
  for (const std::string& name : o.impls)
    std::printf("# Avg bus bandwidth    : %g (%s)\n", avg_busbw[name].get<double>(), name.c_str());
  std::printf("#\n");
  return total_wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  ddplab::init_mpi_multithreaded(&argc, &argv, "allreduce_perf");  // the GPU ring runs a comm thread
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  Options options;
  int code = 0;
  try {
    if (!parse_options(argc, argv, rank, n, options)) {
      MPI_Finalize();
      return 0;
    }
  } catch (const UsageError& e) {
    // Every rank parsed the same command line and got here alike: no collective needed, none waits.
    if (rank == 0) std::fprintf(stderr, "allreduce_perf: error: %s (see allreduce_perf --help)\n", e.what());
    MPI_Finalize();
    return 2;
  }
  const Topology hosts = detect_topology(MPI_COMM_WORLD, /*ranks_per_node=*/0);  // the hosts, whatever the nodes
  if (!preflight(options, hosts, rank, n)) {
    MPI_Finalize();
    return 2;
  }
  try {
    code = run(options, hosts, rank, n);
  } catch (const UsageError& e) {  // raised alike on every rank before any work (make_communicator_impl)
    if (rank == 0) std::fprintf(stderr, "allreduce_perf: error: %s\n", e.what());
    MPI_Finalize();
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the program's edge: other ranks may be waiting in a collective
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0 knows the verdict
  MPI_Finalize();
  return code;
}
