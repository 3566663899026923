// allreduce_perf's command line: nccl-tests' flags where they apply, each checked before any work.
#include "bench/allreduce_perf/options.h"

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/allreduce_perf/impl.h"
#include "config/knob_flags.h"
#include "config/train_config.h"
#include "launcher/cli_errors.h"
#include "runtime/settings.h"

namespace ddplab::perf {

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

std::vector<size_t> Options::sizes() const {
  std::vector<size_t> out;
  for (size_t b = min_bytes;; b = step_bytes ? b + step_bytes : b * static_cast<size_t>(factor)) {
    out.push_back(b);
    const bool last = step_bytes ? step_bytes > max_bytes || b > max_bytes - step_bytes
                                 : b > max_bytes / static_cast<size_t>(factor);  // no overflow past the end
    if (last) return out;
  }
}

namespace {

// The flags as typed, before they are checked into Options.
struct Typed {
  std::string min = "8", max = "256M", step, impls, dtype = "float", op = "sum", stat = "mean";
  int ngpus = 1, nthreads = 1, aggregate = 1;
  TrainConfig train;  // the link's knobs, as `ddplab train` takes them
  CLI::Option *factor = nullptr, *step_given = nullptr, *aggregate_given = nullptr, *impls_given = nullptr;
};

// A number in [lo, hi]: CLI::Range lets NaN through (it compares false both ways).
CLI::Validator finite_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end != text.c_str() && *end == '\0' && std::isfinite(v) && v >= lo && v <= hi) return std::string();
        char range[160];
        if (std::isinf(hi))
          std::snprintf(range, sizeof range, "must be a number of at least %g (got %s)", lo, text.c_str());
        else
          std::snprintf(range, sizeof range, "must be a number from %g to %g (got %s)", lo, hi, text.c_str());
        return std::string(range);
      },
      "", "NUMBER");
}

// Bytes with an optional K/M/G suffix (powers of 1024), as nccl-tests reads -b, -e and -i: digits, perhaps a
// fraction (1.5M), no sign, exponent or hex. A whole number of floats, which is what the buffers hold (nccl-tests
// rounds down without a word).
size_t parse_size(const std::string& flag, const std::string& s) {
  const std::string bad = flag + " " + s + ": not a size (bytes with an optional K, M or G suffix, e.g. 64K)";
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) ++pos;
  const std::string number = s.substr(0, pos);
  if (number.empty() || !std::isdigit(static_cast<unsigned char>(number[0])) ||
      std::count(number.begin(), number.end(), '.') > 1)
    throw UsageError(bad);
  double mult = 1;
  if (pos < s.size()) {
    const std::string suffixes = "KMG";
    const size_t k = suffixes.find(static_cast<char>(std::toupper(static_cast<unsigned char>(s[pos]))));
    if (k == std::string::npos || pos + 1 != s.size()) throw UsageError(bad);
    mult = std::ldexp(1.0, 10 * static_cast<int>(k + 1));
  }
  const double v = std::strtod(number.c_str(), nullptr) * mult;  // digits only: it cannot fail, only overflow
  if (!std::isfinite(v) || v > std::ldexp(1.0, 50)) throw UsageError(flag + " " + s + ": too large");
  if (v != std::floor(v) || static_cast<size_t>(v) % sizeof(float) != 0)
    throw UsageError(flag + " " + s + ": not a whole number of floats (a multiple of 4 bytes)");
  return static_cast<size_t>(v);
}

// In nccl-tests' order, then ours.
void add_flags(CLI::App& app, Options& o, Typed& t) {
  app.add_option("-b,--minbytes", t.min, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", t.max, "largest size in bytes")->capture_default_str();
  t.factor =
      app.add_option("-f,--stepfactor", o.factor, "multiply the size by this factor each step")->capture_default_str();
  t.step_given = app.add_option("-i,--stepbytes", t.step, "add this many bytes each step instead of -f");
  app.add_option("-w,--warmup_iters", o.warmup, "untimed calls per size and mode")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed calls per size and mode")->capture_default_str();
  app.add_option("-c,--check", o.check_iters, "checked calls per size and mode (0: no check)")->capture_default_str();
  app.add_option("-z,--blocking", o.blocking,
                 "nccl-tests' -z: 0 queues the -n calls of nccl, gpu-ring-nccl and their -G graphs and waits once "
                 "after them; 2 waits after every call and also times each call alone (i_min, i_p99: ours, not "
                 "nccl-tests'); 1 as 2, and a barrier after every call, timed with it. Host implementations, "
                 "gpu-ring-ipc and gpu-ring-host wait in every call either way")
      ->capture_default_str();
  t.aggregate_given =
      app.add_option("-a,--average", t.aggregate, "ranks' mean times: 0 rank 0, 1 average, 2 min, 3 max")
          ->capture_default_str();
  app.add_option("-g,--ngpus", t.ngpus, "GPUs per thread (1: one process per GPU)")->capture_default_str();
  app.add_option("-t,--nthreads", t.nthreads, "threads per process (1)")->capture_default_str();
  app.add_option("-d,--datatype", t.dtype, "datatype in memory (float)")->capture_default_str();
  app.add_option("-o,--op", t.op, "reduction (sum)")->capture_default_str();
  t.impls_given = app.add_option(
      "--impls", t.impls,
      "comma-separated: ring, ring-only, ring-bf16, ring-fp16, ring-sharded, mpi, mpi-raw, hier; GPU: nccl, "
      "gpu-ring-nccl, gpu-ring-ipc, gpu-ring-host (default ring,mpi,mpi-raw,ring-bf16; no mpi-raw with "
      "--link; nccl with -G)");
  add_knob_flags(&app, t.train, {"--link", "--link-latency-us", "--link-gbps", "--ranks-per-node"});
  app.add_option("--stat", t.stat,
                 "time per call: mean (nccl-tests, combined over ranks by -a) or median (the p50 call)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "median"}));
  app.add_option("-R,--local-register", o.registered,
                 "1: buffers registered with the shm transport (single copy, as the trainer's gradients); 0: copied")
      ->capture_default_str();
  app.add_flag("--hot-cache", o.hot_cache,
               "every call on the buffers' start, so that it finds the last call's data in the cache, as a training "
               "step's bucket finds the gradients backward just wrote (IMB's default); without it each call runs "
               "one call's size further along the -e buffers, as nccl-tests moves them");
  app.add_option("--gpu-chunk-mb", o.gpu_chunk_mb,
                 "gpu-ring-*: the largest chunk one ring step moves, MiB (each exchange's fixed cost is paid once per "
                 "chunk); 0: the trainer's")
      ->capture_default_str()
      ->check(finite_in(0, 4096));
  app.add_option("-G,--cuda-graph", o.cuda_graph,
                 "nccl, gpu-ring-nccl: also capture the -n timed calls into one CUDA graph, launched N times; rows "
                 "<impl>-graph beside the plain launch's, times per call (nccl-tests' -G); 0: no graphs")
      ->capture_default_str();
  app.add_flag("--diag", o.diag,
               "what each rank saw: before each size rank 0's cache-line round trip to its peers and every rank's "
               "memory stream rate; under the table per rank its CPUs (start, end, affinity), context switches, "
               "shared-memory waits and its CPUs' steal time per implementation, direct collectives, the shared "
               "segments' NUMA placement");
  app.add_option("--timeout-s", o.timeout_s,
                 "watchdog: end the job after this long without progress, naming what each rank waits for (0: off)")
      ->check(CLI::Validator(
          [](std::string& text) {
            const double v = std::strtod(text.c_str(), nullptr);
            return std::isfinite(v) && v >= 0 ? std::string() : std::string("must be a number of seconds, 0 or more");
          },
          "", "SECONDS"))
      ->capture_default_str();
  app.add_option("--csv", o.csv_path, "also write the results as CSV (rank 0)")->check(non_empty_path());
  app.add_option("-J,--json,--output_file", o.json_path, "also write the results as JSON (rank 0)")
      ->check(non_empty_path());
  app.add_flag("--force", o.force, "replace an existing --csv or -J file (never done otherwise)");
}

// -R is DDPLAB_LOCAL_REGISTER for this run: one fact, so that the Communicators' transport names (single copy,
// direct collectives) say what the buffers get. Set before any knob is read (settings read each once); a value
// that is neither 0 nor 1 is left for the knobs' own check to name.
void apply_register(const Options& o) {
  if (o.registered != 0 && o.registered != 1)
    throw UsageError("-R " + std::to_string(o.registered) + ": 0 (ordinary buffers) or 1 (registered buffers)");
  const std::string register_value = std::to_string(o.registered);
  const std::string environment =
      std::getenv(settings::kLocalRegister.name) ? std::getenv(settings::kLocalRegister.name) : "";
  if ((environment == "0" || environment == "1") && environment != register_value)
    throw UsageError("-R " + register_value + " and " + settings::kLocalRegister.name + "=" + environment +
                     " disagree");
  if (environment.empty()) setenv(settings::kLocalRegister.name, register_value.c_str(), 1);
}

constexpr size_t kMostSizes = 10000;

// nccl-tests' flags that have one value here, the sizes and the counts.
void check_sizes_and_counts(const Typed& t, Options& o) {
  if (t.ngpus != 1)
    throw UsageError("-g " + std::to_string(t.ngpus) + ": one GPU per process here (start one rank per GPU: -np)");
  if (t.nthreads != 1)
    throw UsageError("-t " + std::to_string(t.nthreads) + ": one thread per process here (start more ranks: -np)");
  if (t.dtype != "float")
    throw UsageError("-d " + t.dtype + ": buffers hold float here (-d float); for a 16-bit wire use --impls " +
                     "ring-bf16 or ring-fp16");
  if (t.op != "sum") throw UsageError("-o " + t.op + ": every implementation here sums (-o sum)");
  o.min_bytes = parse_size("-b", t.min);
  o.max_bytes = parse_size("-e", t.max);
  if (o.min_bytes < sizeof(float)) throw UsageError("-b " + t.min + ": at least 4 bytes (one float)");
  if (o.max_bytes < o.min_bytes) throw UsageError("-e " + t.max + ": smaller than -b " + t.min);
  if (t.step_given->count() && t.factor->count()) throw UsageError("-i and -f: give one, a fixed step or a factor");
  if (t.step_given->count()) {
    try {
      o.step_bytes = parse_size("-i", t.step);
    } catch (const UsageError& e) {
      const bool a_name = !t.step.empty() && std::isalpha(static_cast<unsigned char>(t.step[0]));  // -i ring
      throw UsageError(std::string(e.what()) +
                       (a_name ? "; -i is the step, as in nccl-tests: implementations are --impls" : ""));
    }
    if (o.step_bytes < sizeof(float)) throw UsageError("-i " + t.step + ": at least 4 bytes (one float)");
  } else if (o.factor < 2) {
    throw UsageError("-f " + std::to_string(o.factor) + ": the factor must be at least 2 (a fixed step is -i BYTES)");
  }
  // Every size is a row and held in a list: a fixed step across gigabytes would be millions of them.
  if (o.step_bytes > 0 && (o.max_bytes - o.min_bytes) / o.step_bytes >= kMostSizes)
    throw UsageError("-i " + t.step + " from -b " + t.min + " to -e " + t.max + ": " +
                     std::to_string((o.max_bytes - o.min_bytes) / o.step_bytes + 1) + " sizes, at most " +
                     std::to_string(kMostSizes) + " (a larger -i, or -f)");
  if (o.warmup < 0) throw UsageError("-w " + std::to_string(o.warmup) + ": must not be negative");
  if (o.iters < 1) throw UsageError("-n " + std::to_string(o.iters) + ": at least 1 timed call");
  if (o.check_iters < 0) throw UsageError("-c " + std::to_string(o.check_iters) + ": must not be negative");
  if (t.aggregate < 0 || t.aggregate > 3)
    throw UsageError("-a " + std::to_string(t.aggregate) + ": 0 (rank 0), 1 (average), 2 (min) or 3 (max)");
  o.aggregate = static_cast<Aggregate>(t.aggregate);
  o.median = t.stat == "median";
  if (o.median && t.aggregate_given->count())
    throw UsageError("-a: --stat median times each call by its slowest rank; -a applies to --stat mean");
  if (o.cuda_graph < 0) throw UsageError("-G " + std::to_string(o.cuda_graph) + ": must not be negative");
  if (o.blocking < 0 || o.blocking > 2)
    throw UsageError("-z " + std::to_string(o.blocking) +
                     ": 0 (queue the calls, wait once), 1 (wait and a barrier after each) or 2 (wait after each)");
}

void check_impls(const Typed& t, Options& o) {
  if (t.impls_given->count() && t.impls.empty())
    throw UsageError("--impls: an empty list (name implementations, or leave the flag out for the default set)");
  std::string list = t.impls;
  if (list.empty()) list = o.cuda_graph ? "nccl" : o.emulated() ? "ring,mpi,ring-bf16" : "ring,mpi,mpi-raw,ring-bf16";
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    const ImplSpec& spec = impl_spec(name);
    if (std::count(o.impls.begin(), o.impls.end(), name)) throw UsageError("--impls: " + name + " given twice");
    if (spec.needs_cuda && !spec.make)
      throw UsageError("--impls " + name + ": needs a build with CUDA (configure with -DDDPLAB_CUDA=ON)");
    if (o.cuda_graph && spec.capture_problem)
      throw UsageError("-G " + std::to_string(o.cuda_graph) + ": --impls " + name +
                       " cannot be captured: " + spec.capture_problem);
    if (o.emulated() && !spec.emulates_link)
      throw UsageError("--impls " + name + ": cannot emulate a link (--link " + t.train.link +
                       "; ring, mpi, hier and gpu-ring-* can)");
    // The emulated link delays each exchange on the host, which a CUDA graph's replay leaves out.
    if (o.emulated() && o.cuda_graph && spec.needs_cuda)
      throw UsageError("-G " + std::to_string(o.cuda_graph) + " with --link " + t.train.link + ": --impls " + name +
                       " waits for the emulated link on the host, which a CUDA graph cannot capture");
    if (o.median && o.blocking == 0 && queues_calls(spec, o))
      throw UsageError("--stat median: --impls " + name +
                       " queues its calls under -z 0 and is timed once per -n calls; add -z 2 to time each call");
    o.impls.push_back(name);
    pos = comma + 1;
  }
}

}  // namespace

bool parse_options(int argc, char** argv, int rank, int n, Options& o) {
  CLI::App app{"all-reduce bandwidth of every implementation (after nccl-tests' all_reduce_perf)"};
  Typed t;
  add_flags(app, o, t);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (rank == 0) std::printf("%s", app.help().c_str());
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(parse_error_text(e, app));
  }
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  apply_register(o);
  check_sizes_and_counts(t, o);
  try {
    check_knob_ranges(t.train);  // the link's knobs in train's ranges
    o.link = parse_links(t.train.link, t.train.link_latency_us, t.train.link_gbps);
    settings::check_all();  // every DDPLAB_* knob, alike on every rank, before any work
    settings::check_same_on_every_rank(MPI_COMM_WORLD);
  } catch (const ddplab::UsageError& e) {
    throw UsageError(e.what());
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  check_impls(t, o);
  o.ranks_per_node = t.train.ranks_per_node;
  if (o.ranks_per_node > 0 && n % o.ranks_per_node != 0)
    throw UsageError("--ranks-per-node " + std::to_string(o.ranks_per_node) + " does not divide the " +
                     std::to_string(n) + " ranks into equal nodes");
  if (!o.csv_path.empty() && o.csv_path == o.json_path) throw UsageError("--csv and -J: the same file " + o.csv_path);
  return true;
}

}  // namespace ddplab::perf
