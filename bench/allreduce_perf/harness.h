// allreduce_perf's harness, after nccl-tests' common.cu: the exactly summable inputs, timing (warm-up, per-call
// times, the combination over ranks), the check, the machine checks before any work, and the output (the
// nccl-tests table, CSV, JSON). The implementations are impl.h's.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/allreduce_perf/impl.h"
#include "bench/allreduce_perf/options.h"
#include "comm/topology.h"

namespace ddplab::perf {

// Exact inputs: small integers whose sums over n ranks stay <= 256, exact in fp32, bf16 and fp16. `rep` varies them
// between check calls. Each element's value comes from a hash of its index, as nccl-tests derives it from its offset:
// a pattern that repeats (it did every 16 elements) reads right where a chunk landed a whole period off, the typical
// ring bug.
struct Inputs {
  int n;
  int rep = 0;
  int range() const { return std::max(1, std::min(16, 256 / n)); }
  // splitmix64's finalizer: neighbouring indices get unrelated values.
  static uint64_t hashed(size_t i) {
    uint64_t x = static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  float value_at(uint64_t hash, int rank) const {
    const uint64_t shift = static_cast<uint64_t>(rank) * 13 + static_cast<uint64_t>(rep) * 5;
    return static_cast<float>((hash + shift) % static_cast<uint64_t>(range()) + 1);
  }
  float value(int rank, size_t i) const { return value_at(hashed(i), rank); }
  float sum(size_t i) const {
    const uint64_t hash = hashed(i);
    float s = 0;
    for (int r = 0; r < n; ++r) s += value_at(hash, r);
    return s;
  }
  void fill(float* x, size_t count, int rank) const {
    for (size_t i = 0; i < count; ++i) x[i] = value(rank, i);
  }
};

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
  std::string impl;  // the Impl's label
  const char* type;  // on the wire
  const char* algorithm;  // the Impl's (nullptr: not said)
  size_t bytes = 0, count = 0;
  Mode oop, ip;
  std::vector<double> round_trip_ns;  // --diag: rank 0's cache-line round trip to each other rank of its node
  std::vector<double> stream_gbps;    // --diag: each rank's memory stream rate just before this size (MemoryStream)
};

// measure.cpp
// Times -n calls after -w warm-up calls into m (rank 0's; every rank takes part), per collective: a run of several
// (-G) counts as that many. Returns the steal time of this rank's CPUs over the timed calls (--diag; else 0).
double time_calls(const Impl& impl, const float* in, float* out, size_t count, const Options& o, int rank, int n,
                  Mode* m);
// One call on fresh inputs; the elements, summed over ranks, whose bits differ from the exact sum. Collective.
long long count_wrong(const Impl& impl, const Inputs& inputs, int rank, float* in_host, float* out_host, size_t count,
                      bool in_place);

// output.cpp
std::string human_bytes(double bytes);
void print_header(const Options& o, int n, const Topology& topology, const std::vector<std::string>& transports,
                  int host_ranks);
void print_row(const Row& r);  // as soon as it is measured
// gpus: each rank's GPU (PCI bus id) where the implementations ran on GPUs, else empty.
std::string results_json(const Options& o, int n, const Topology& topology, const std::vector<std::string>& transports,
                         const std::vector<std::string>& gpus, const std::vector<Row>& rows,
                         const nlohmann::json& avg_busbw, long long total_wrong);
std::string results_csv(const Options& o, int n, const std::vector<Row>& rows);
// Checks that need the machine: rank 0's output files, the GPU, every rank's memory. Collective. The lowest rank
// that finds a problem prints it; every rank then returns false.
bool preflight(const Options& o, const Topology& hosts, int rank, int n);

}  // namespace ddplab::perf
