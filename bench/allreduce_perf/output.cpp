// The nccl-tests table, the CSV and the JSON; and what is checked of the machine before any work.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/allreduce_perf/harness.h"
#include "comm/link_emulation.h"
#include "comm/shm_direct.h"
#include "comm/shm_transport.h"
#include "record/files.h"
#ifdef DDPLAB_HAVE_CUDA
#include "bench/allreduce_perf/device.h"
#endif

namespace ddplab::perf {
namespace {

// `value` in at most `width` characters, with as many of 2 decimals as fit (nccl-tests' columns); NaN, a per-call
// figure of queued calls (-z 0), as N/A.
std::string fit(double value, int width) {
  char s[64];
  if (std::isnan(value)) {
    std::snprintf(s, sizeof s, "%*s", width, "N/A");
    return s;
  }
  for (int decimals = 2; decimals >= 0; --decimals)
    if (std::snprintf(s, sizeof s, "%*.*f", width, decimals, value) <= width) return s;
  std::snprintf(s, sizeof s, "%*.1e", width, value);
  return s;
}

// The impl column holds the longest label, gpu-ring-nccl-graph (19).
constexpr const char* kRowFormat = "%-19s %12s %12s %8s %5s  %8s %6s %6s %6s %8s %8s  %8s %6s %6s %6s %8s %8s\n";

}  // namespace

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof s, "%.*f %s", bytes == std::floor(bytes) ? 0 : 1, bytes, units[u]);
  return s;
}

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
  std::printf("# calls: %s\n", o.hot_cache ? "each on the buffers' start, finding the last one's data in the cache "
                                             "(--hot-cache)"
                                           : "each one call's size further along the buffers than the last (as "
                                             "nccl-tests), so a call finds little of the last ones in the cache");
  const std::vector<size_t> sizes = o.sizes();  // the sizes run: the last is -e only where the steps land on it
  std::printf("# sizes %s .. %s, %s; warm-up %d, iters %d, check %d\n",
              human_bytes(static_cast<double>(sizes.front())).c_str(),
              human_bytes(static_cast<double>(sizes.back())).c_str(), step.c_str(), o.warmup, o.iters, o.check_iters);
  std::printf("# time = %s; algbw = size / time; busbw = algbw x 2(n-1)/n; GB = 1e9 bytes\n",
              o.median ? "p50 over calls" : describe(o.aggregate));
  if (o.cuda_graph)
    std::printf(
        "# -G %d: a row <impl>-graph captures the %d timed calls into one CUDA graph and launches it %d times; its "
        "times are per call\n",
        o.cuda_graph, o.iters, o.cuda_graph);
  bool queued = false;
  for (const std::string& name : o.impls) queued = queued || queues_calls(impl_spec(name), o);
  const char* barrier = o.blocking == 1 ? "; a barrier after every call, timed with it" : "";
  std::printf("# -z %d: %s%s\n", o.blocking,
              !queued      ? "no implementation here queues its calls: each waits in every call"
              : o.blocking ? "the host waits after every call of every implementation"
                           : "the GPU implementations' -n calls go on the stream back to back and the host waits "
                             "once (nccl-tests' default): time is their mean, i_min and i_p99 N/A; -z 2 times each",
              barrier);
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
  std::printf(kRowFormat, r.impl.c_str(), std::to_string(r.bytes).c_str(), std::to_string(r.count).c_str(), r.type,
              "sum", fit(a.time_us, 8).c_str(), fit(a.algbw, 6).c_str(), fit(a.busbw, 6).c_str(),
              wrong(a.wrong).c_str(), fit(a.min_us, 8).c_str(), fit(a.p99_us, 8).c_str(), fit(b.time_us, 8).c_str(),
              fit(b.algbw, 6).c_str(), fit(b.busbw, 6).c_str(), wrong(b.wrong).c_str(), fit(b.min_us, 8).c_str(),
              fit(b.p99_us, 8).c_str());
  std::fflush(stdout);  // a row as soon as it is measured
}

namespace {

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

}  // namespace

std::string results_json(const Options& o, int n, const Topology& topology, const std::vector<std::string>& transports,
                         const std::vector<std::string>& gpus, const std::vector<Row>& rows,
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
  // Each rank's GPU: how many ranks shared one, which `ddplab predict` weighs a calibration's rows by.
  if (!gpus.empty()) j["gpus"] = gpus;
  // What each implementation ran over, as the header says ("ring over shm + direct collectives"): `ddplab predict`
  // fits the ring's small sizes by the algorithm the transport runs them with.
  j["transports"] = transports;
  j["warmup"] = o.warmup;
  j["iters"] = o.iters;
  j["check_iters"] = o.check_iters;
  j["cuda_graph"] = o.cuda_graph;       // -G: calls per graph in the rows labelled <impl>-graph; 0: none
  j["blocking"] = o.blocking;           // -z: 0, the queueing implementations' rows have no per-call times (null)
  j["registered"] = o.registered == 1;  // -R
  j["hot_cache"] = o.hot_cache;         // every call on the buffers' start; else moved along them (nccl-tests)
  // The gpu-ring-* rows' chunk (--gpu-chunk-mb, or the trainer's): `ddplab predict` counts their rounds from it.
  j["gpu_chunk_mb"] = o.gpu_chunk_mb > 0 ? o.gpu_chunk_mb : static_cast<double>(kGpuRingChunkBytes) / (1 << 20);
  j["stat"] = o.median ? "median" : "mean";
  j["aggregate"] = o.median ? nlohmann::json(nullptr) : nlohmann::json(to_string(o.aggregate));  // -a
  j["results"] = nlohmann::json::array();
  for (const Row& r : rows) {
    j["results"].push_back({{"impl", r.impl},
                            {"size_bytes", r.bytes},
                            {"count", r.count},
                            {"type", r.type},
                            {"redop", "sum"},
                            {"out_of_place", mode_json(r.oop)},
                            {"in_place", mode_json(r.ip)},
                            {"round_trip_ns", r.round_trip_ns},
                            {"stream_gbps", r.stream_gbps}});
    if (r.algorithm) j["results"].back()["algorithm"] = r.algorithm;
  }
  j["avg_busbw"] = avg_busbw;
  j["wrong"] = o.check_iters > 0 ? nlohmann::json(total_wrong) : nlohmann::json(nullptr);  // -c 0: not checked
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
    std::snprintf(line, sizeof line, "%s,%d,%s,%zu,%zu,%s,sum", r.impl.c_str(), n, link.c_str(), r.bytes, r.count,
                  r.type);
    s << line;
    for (const Mode* m : {&r.oop, &r.ip}) {
      const std::string wrong = m->wrong < 0 ? "" : std::to_string(m->wrong);
      std::snprintf(line, sizeof line, ",%.3f,%.4f,%.4f,%s", m->time_us, m->algbw, m->busbw, wrong.c_str());
      s << line;
      for (double per_call : {m->min_us, m->p50_us, m->p99_us}) {  // empty where the calls were queued (-z 0)
        std::snprintf(line, sizeof line, ",%.3f", per_call);
        s << (std::isnan(per_call) ? "," : line);
      }
    }
    s << "\n";
  }
  return s.str();
}

bool preflight(const Options& o, const Topology& hosts, int rank, int n) {
  std::string problem = o.emulated() ? clocks_differ(MPI_COMM_WORLD) : "";  // collective: before any other check
  // A file that exists is replaced only with --force, as ddplab's outputs (a run file given as -J was lost); a folder,
  // a device, a pipe, a link or an unwritable place refuses either way (the written file is renamed over the name).
  const auto writable = [&o](const char* flag, const std::string& path) {
    const std::string why = check_output_path(path, o.force);
    return why.empty() ? why : std::string(flag) + " " + path + ": " + why;
  };
  if (rank == 0 && problem.empty() && !o.csv_path.empty()) problem = writable("--csv", o.csv_path);
  if (rank == 0 && problem.empty() && !o.json_path.empty()) problem = writable("-J", o.json_path);
#ifdef DDPLAB_HAVE_CUDA
  for (const std::string& name : o.impls)
    if (problem.empty() && impl_spec(name).needs_cuda)
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

}  // namespace ddplab::perf
