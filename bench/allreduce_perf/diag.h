// allreduce_perf --diag: what each rank saw, to tell a slow run from a fast one. Before each size, rank 0's
// cache-line round trip to its peers and every rank's memory stream rate; under the table, per rank, its CPUs,
// context switches, shared-memory waits and steal time per implementation, direct collectives, page placement.
#pragma once
#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "comm/shm_direct.h"
#include "comm/shm_transport.h"
#include "runtime/watchdog.h"

namespace ddplab::perf {

// --diag: what one rank saw, to tell a slow run from a fast one (the ring's bandwidth on a shared host is bimodal).
struct RankDiagnosis {
  int cpu_at_start = -1;
  std::string affinity = cpu_list();
  rusage usage_at_start = usage();
  struct Seen {  // per implementation, over its timed calls
    std::string impl;
    ShmWaitStats waits;
    double steal_ms = 0;  // its CPUs' (measure.cpp: steal_ms_now)
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
// Zen 5 VM the hypervisor moved the two vCPUs between the two from minute to minute, and the ring's
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
inline void print_diagnosis(const RankDiagnosis& d, int rank, int n) {
  const std::string mine = d.report(rank);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(n), offsets(n);
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < n; ++r) offsets[r] = total, total += lengths[r];
  std::string all(rank == 0 ? total : 0, '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) std::printf("# per rank (--diag):\n%s", all.c_str());
}

// --diag: how fast every rank streams memory just before each size, all at once as the all-reduce will: y += x over
// two buffers each twice the last-level cache (bench::add_stream_ms), GB/s read + written. On a shared host this
// moves with the other tenants' memory traffic, which the guest sees no other way: on one such host it moved between
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

// Before each size: the round trips and stream rates, printed by rank 0 (collective). Empty without --diag.
struct SizeDiagnosis {
  std::vector<double> round_trip_ns;  // rank 0's, to each other rank of its node
  std::vector<double> stream_gbps;    // rank 0's copy of every rank's
};
inline SizeDiagnosis diagnose_size(CacheLineRoundTrip* round_trip, MemoryStream* stream, int rank, int n) {
  SizeDiagnosis d;
  if (!round_trip && !stream) return d;
  // Barriers, and the peers' echo loops, which spin until rank 0 stops them: a rank gone must end the job here too.
  const watchdog::Wait wait("--diag's measures before the size");
  if (round_trip) {
    d.round_trip_ns = round_trip->measure();
    if (rank == 0 && !d.round_trip_ns.empty()) {
      std::printf("# cache-line round trip from rank 0 (--diag):");
      for (size_t p = 0; p < d.round_trip_ns.size(); ++p) std::printf(" rank %zu %.0f ns", p + 1, d.round_trip_ns[p]);
      std::printf("\n");
    }
  }
  if (stream) {
    d.stream_gbps = stream->measure(rank, n);
    if (rank == 0) {
      std::printf("# memory stream per rank, y += x (--diag):");
      for (double g : d.stream_gbps) std::printf(" %.1f", g);
      std::printf(" GB/s\n");
    }
  }
  return d;
}

}  // namespace ddplab::perf
