// An all-reduce implementation as allreduce_perf's harness runs it. Each implementation's file (ring.cpp, mpi.cpp,
// hier.cpp, nccl.cpp, gpu_ring.cpp, ...) only says how to set up and run its collective, as nccl-tests'
// all_reduce.cu; impls.cpp is the table of them.
#pragma once
#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/allreduce_perf/options.h"
#include "comm/communicator.h"

namespace ddplab::perf {

// One implementation under test, as the harness runs it: out = allreduce_sum(in) (in == out: in place). A GPU
// implementation runs on device buffers of its own (device_in/out, max size): the harness copies inputs in and
// results out, untimed.
struct Impl {
  std::string label;                // the row's name: the implementation's, "-graph" added for -G's rows
  const char* wire_type = "float";  // the table's `type` column (nccl-tests' names): the spec's
  // Our GPU ring's algorithm at a call's count, "ring" or "recursive doubling" (-J's rows; predict reads it).
  std::function<const char*(size_t count)> algorithm;
  std::function<void(const float* in, float* out, size_t count)> run;       // a timed call; returns when it is done
  std::function<void(const float* in, float* out, size_t count)> run_once;  // the check's: one collective
  // Set where a call need not make the host wait (queues_calls): `run` split in two, one call queued, and the host's
  // wait for all queued. -z 0 times -n enqueues and one wait, as nccl-tests does.
  std::function<void(const float* in, float* out, size_t count)> enqueue;
  std::function<void()> wait;
  int calls_per_run = 1;  // collectives per `run` (-G's rows: a graph of -n), which the times are divided by
  // Whether `run` places its collectives in the buffers itself (-G's graph captured its -n calls each at its
  // call_offset): the harness then passes the buffers' starts every time instead of moving each run along.
  bool places_calls = false;
  int timed_runs = 0;     // runs timed per size and mode; 0: -n (-G N's rows: N launches, as nccl-tests' -G)
  float* device_in = nullptr;
  float* device_out = nullptr;
  std::shared_ptr<void> owner;
  float* in(float* host) const { return device_in ? device_in : host; }
  float* out(float* host) const { return device_out ? device_out : host; }
  // The host buffers' first `count` values where run reads them (in) and where it writes (out), and the result
  // back into the host's buffer (in place: in). No-ops for an implementation on host buffers.
  void load_in(const float* host, size_t count) const;
  void load_out(const float* host, size_t count) const;
  void fetch_result(float* host, bool in_place, size_t count) const;
};

// Where call number `call` of `count` floats starts in buffers whose first `span` floats the calls move along (as
// nccl-tests' startColl moves each call): one call's size further than the call before, wrapping where the next
// would pass the span. A call then finds little of the last ones in the cache; a call of more than half the span,
// or any call when the span is 0 (--hot-cache), stays at the start.
inline size_t call_offset(size_t call, size_t count, size_t span) {
  const size_t places = count ? std::max<size_t>(span / count, 1) : 1;
  return call % places * count;
}

// What an implementation is made from; making one is collective over MPI_COMM_WORLD.
struct ImplContext {
  std::string name;  // as in --impls
  const Options& options;
  size_t max_count;                      // the largest call's floats
  std::vector<std::string>& transports;  // what each implementation's hops use, for the header (rank 0's)
};

// Every implementation allreduce_perf knows (impls.cpp): the type on its wire, whether it can run over an emulated
// link, whether it needs the CUDA build, why -G cannot capture it (nullptr: it can), and its maker, which returns
// the plain launch's Impl and, with -G, the CUDA graph's beside it.
struct ImplSpec {
  const char* name;
  const char* wire_type;
  bool emulates_link;
  bool needs_cuda;
  const char* capture_problem;
  std::vector<Impl> (*make)(const ImplContext&);  // nullptr in a build without CUDA
};
const ImplSpec& impl_spec(const std::string& name);  // UsageError naming the known ones
// Whether the implementation's calls can go on its stream back to back with no host wait between them: a CUDA graph
// can capture them, and -z 0 queues them. An emulated link waits on the host.
inline bool queues_calls(const ImplSpec& spec, const Options& o) {
  return spec.needs_cuda && !spec.capture_problem && !o.emulated();
}
// Makes a checked name's implementations (collective), each with its label and its wire's type.
std::vector<Impl> make_impls(const std::string& name, const Options& o, size_t max_count,
                             std::vector<std::string>& transports);

// The Communicator's all-reduce as an implementation (ring.cpp, mpi.cpp, hier.cpp): bad nodes for hier are refused
// on every rank alike, as a UsageError.
std::vector<Impl> communicator_impl(const ImplContext& c, const CommOptions& options);

// The makers, one file each.
std::vector<Impl> make_ring(const ImplContext& c);
std::vector<Impl> make_ring_only(const ImplContext& c);
std::vector<Impl> make_ring_bf16(const ImplContext& c);
std::vector<Impl> make_ring_fp16(const ImplContext& c);
std::vector<Impl> make_ring_sharded(const ImplContext& c);
std::vector<Impl> make_mpi(const ImplContext& c);
std::vector<Impl> make_mpi_raw(const ImplContext& c);
std::vector<Impl> make_hier(const ImplContext& c);
std::vector<Impl> make_nccl(const ImplContext& c);      // CUDA build only
std::vector<Impl> make_gpu_ring(const ImplContext& c);  // CUDA build only; the link is the name's tail

}  // namespace ddplab::perf
