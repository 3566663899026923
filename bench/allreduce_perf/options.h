// allreduce_perf's command line (nccl-tests' flags where they apply; docs/COMM.md, "allreduce_perf", lists them).
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ddplab::perf {

// A bad command line: one line on stderr from rank 0, exit code 2 on every rank, no MPI_Abort.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How each rank's mean per call becomes the reported time: nccl-tests' -a.
enum class Aggregate { kRank0 = 0, kAverage = 1, kMin = 2, kMax = 3 };
constexpr std::array<Named<Aggregate>, 4> choice_names(Aggregate) {  // the JSON's names
  return {
      {{Aggregate::kRank0, "rank0"}, {Aggregate::kAverage, "avg"}, {Aggregate::kMin, "min"}, {Aggregate::kMax, "max"}}};
}
const char* describe(Aggregate a);

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
  bool force = false;       // --force: an existing --csv or -J file is replaced
  int ranks_per_node = 0;   // 0: the hosts are the nodes (comm/topology.h)
  bool diag = false;        // --diag: what each rank saw (CPUs, waits, page placement) under the table
  double timeout_s = 300;   // --timeout-s: the watchdog ends the job after this long without progress (0: off)
  int registered = 1;       // -R: the host buffers registered with the shm transport (single copy)
  double gpu_chunk_mb = 0;  // the GPU ring's chunk; 0: the trainer's (CudaRingConfig::chunk_bytes)
  int cuda_graph = 0;       // -G: calls captured per CUDA graph, rows beside the plain launch's; 0: no graphs
  // -z (nccl-tests' --blocking): 0, the calls of a GPU implementation that queues them (Impl::enqueue) go back to
  // back and the host waits once, after the -n calls; 2, the host waits after every call; 1, it waits and the ranks
  // meet in a barrier after every call, inside the call's time. Host implementations wait inside every call
  // either way.
  int blocking = 0;
  // --hot-cache: every call on the buffers' start, finding the last call's data in the cache; else each call one
  // call's size further along them (call_offset), as nccl-tests moves its calls.
  bool hot_cache = false;

  bool emulated() const { return link.emulated(); }
  // The floats the calls move along (call_offset): the buffers', or none with --hot-cache.
  size_t calls_span() const { return hot_cache ? 0 : max_bytes / sizeof(float); }
  std::vector<size_t> sizes() const;  // the sizes measured, in bytes (whole floats: parse_options checks)
};

// Parses and checks the command line; the same on every rank, no MPI but the knobs' agreement. Throws UsageError
// naming the flag, or returns false after --help (printed by rank 0).
bool parse_options(int argc, char** argv, int rank, int n, Options& o);

}  // namespace ddplab::perf
