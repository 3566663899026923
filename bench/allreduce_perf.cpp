// allreduce_perf: all-reduce bandwidth of every implementation in one run, after nccl-tests' all_reduce_perf.
//
//   mpirun -np 2 allreduce_perf -b 8 -e 256M -f 2 [-w 5] [-n 20] [-i ring,mpi,mpi-raw,ring-bf16]
//                               [--link 10gbe] [--link-latency-us U] [--link-gbps G] [--stat mean|median]
//                               [--csv F] [--json F]
//
// Implementations:  ring      ddplab's Communicator, --comm ring (recursive doubling for small buffers, the
//                             sliced ring above; docs/COMM.md), fp32 on the wire
//                   ring-bf16 / ring-fp16   the same with a 16-bit wire
//                   mpi       ddplab's Communicator, --comm mpi: MPI_Allreduce plus the order check (and the
//                             link model when --link is set)
//                   mpi-raw   MPI_Allreduce alone on a duplicate communicator: Open MPI's own number
//                   nccl      ncclAllReduce on device buffers, one GPU per rank (built with CUDA); the time
//                             includes the host's wait for the comm stream
//                   gpu-ring-nccl / gpu-ring-ipc / gpu-ring-host   our ring on device buffers (comm/ring_cuda.h)
//                             over NCCL p2p, CUDA IPC (ranks may share a GPU) or host staging; timed as nccl
// Sizes are in bytes (K/M/G = 2^10/2^20/2^30) of fp32 data. For every size and implementation: -w warm-up
// calls, then -n timed calls, out-of-place (Communicator::allreduce_sum_into; MPI: send and receive buffers) and
// in place. time = the slowest rank's mean per call; algbw = size / time; busbw = algbw x 2(n-1)/n,
// the per-link traffic of a bandwidth-optimal all-reduce, comparable across rank counts. Implementations are
// interleaved per size so that drift of a shared machine hits all alike.
//
// #wrong: after timing, each mode runs once more on fresh inputs and counts elements (summed over ranks) whose
// bits differ from the expected sum. Inputs are small integers (at most 256/n), so every partial sum is exact in
// fp32, bf16 and fp16 and any summation order must give exactly the expected bits.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_init.h"
#ifdef DDPLAB_HAVE_CUDA
#include "bench/allreduce_perf_nccl.h"
#endif

using namespace ddplab;
#ifdef DDPLAB_HAVE_CUDA
using namespace ddplab::bench;
#endif

namespace {

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

size_t parse_size(const std::string& s) {
  size_t pos = 0;
  const double v = std::stod(s, &pos);
  double mult = 1;
  if (pos < s.size()) {
    switch (std::toupper(static_cast<unsigned char>(s[pos]))) {
      case 'K':
        mult = 1024.0;
        break;
      case 'M':
        mult = 1024.0 * 1024;
        break;
      case 'G':
        mult = 1024.0 * 1024 * 1024;
        break;
      default:
        throw std::invalid_argument("bad size '" + s + "' (bytes, with optional K/M/G suffix)");
    }
    if (pos + 1 != s.size()) throw std::invalid_argument("bad size '" + s + "'");
  }
  if (!(v >= 0)) throw std::invalid_argument("bad size '" + s + "'");
  return static_cast<size_t>(v * mult);
}

// Exact inputs: small integers whose sums over n ranks stay <= 256, exact in fp32, bf16 and fp16.
struct Inputs {
  int n;
  int range() const { return std::max(1, std::min(16, 256 / n)); }
  float value(int rank, size_t i) const {
    return static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % static_cast<size_t>(range()) + 1);
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
  float* in(std::vector<float>& host) const { return device_in ? device_in : host.data(); }
  float* out(std::vector<float>& host) const { return device_out ? device_out : host.data(); }
  // The host's first `count` values of `in`, where the implementation reads them.
  void load(const std::vector<float>& host, size_t count) const {
#ifdef DDPLAB_HAVE_CUDA
    if (device_in) copy_to_device(device_in, host.data(), count);
#endif
    (void)host, (void)count;
  }
};

Impl make_communicator_impl(const std::string& name, AllreduceImpl impl, WireDtype wire, const LinkModel& link) {
  auto comm = std::make_shared<Communicator>(MPI_COMM_WORLD, CommOptions{impl, wire, link});
  int tag = 0;
  return {name, [comm, tag](const float* in, float* out, size_t count) mutable {
            comm->allreduce_sum_into(in, out, count, tag);
            tag = (tag + 1) % 32768;  // a tag per call, as the Reducer's buckets: the order check runs too
          }, nullptr, nullptr, nullptr};
}

Impl make_mpi_raw_impl() {
  auto comm = std::shared_ptr<MPI_Comm>(new MPI_Comm, [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(c);
    delete c;
  });
  MPI_Comm_dup(MPI_COMM_WORLD, comm.get());
  return {"mpi-raw", [comm](const float* in, float* out, size_t count) {
            if (count > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("mpi-raw: count > INT_MAX");
            MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, *comm);
          }, nullptr, nullptr, nullptr};
}

Impl make_impl(const std::string& name, const LinkModel& link, size_t max_count) {
  if (name == "nccl") {
#ifdef DDPLAB_HAVE_CUDA
    if (link.gbps > 0 || link.latency_us > 0) throw std::invalid_argument("nccl cannot emulate a link");
    DeviceAllreduce d = make_nccl_allreduce(max_count);
    return {name, d.run, d.in, d.out, d.owner};
#else
    (void)max_count;
    throw std::invalid_argument("nccl needs a build with CUDA (configure with -DDDPLAB_CUDA=ON)");
#endif
  }
  if (name.rfind("gpu-ring-", 0) == 0) {
#ifdef DDPLAB_HAVE_CUDA
    if (link.gbps > 0 || link.latency_us > 0) throw std::invalid_argument(name + " cannot emulate a link");
    DeviceAllreduce d = make_ring_cuda_allreduce(max_count, name.substr(9));
    return {name, d.run, d.in, d.out, d.owner};
#else
    throw std::invalid_argument(name + " needs a build with CUDA (configure with -DDDPLAB_CUDA=ON)");
#endif
  }
  if (name == "ring") return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kFp32, link);
  if (name == "ring-bf16") return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kBf16, link);
  if (name == "ring-fp16") return make_communicator_impl(name, AllreduceImpl::kRing, WireDtype::kFp16, link);
  if (name == "mpi") return make_communicator_impl(name, AllreduceImpl::kMpi, WireDtype::kFp32, link);
  if (name == "mpi-raw") {
    if (link.gbps > 0 || link.latency_us > 0)
      throw std::invalid_argument("mpi-raw cannot emulate a link (use mpi, which applies the link model)");
    return make_mpi_raw_impl();
  }
  throw std::invalid_argument("unknown implementation '" + name +
                              "' (ring, ring-bf16, ring-fp16, mpi, mpi-raw, nccl, gpu-ring-nccl, gpu-ring-ipc, " +
                              "gpu-ring-host)");
}

struct Mode {
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = 0;
};
struct Row {
  std::string impl;
  size_t bytes = 0, count = 0;
  Mode oop, ip;
};

// Time per call in microseconds: the slowest rank's mean (nccl-tests), or with `median` the median over calls of
// the slowest rank's time for that call — robust to a shared machine that now and then takes a core away.
double time_calls(const Impl& impl, const float* in, float* out, size_t count, int warmup, int iters, bool median) {
  for (int i = 0; i < warmup; ++i) impl.run(in, out, count);
  std::vector<double> t(iters);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) {
    const double a = now_s();
    impl.run(in, out, count);
    t[i] = (now_s() - a) * 1e6;
  }
  double mean_us = (now_s() - t0) / iters * 1e6, slowest = 0;
  MPI_Allreduce(&mean_us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (!median) return slowest;
  MPI_Allreduce(MPI_IN_PLACE, t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
  return t[iters / 2];
}

long long count_wrong(const Impl& impl, const Inputs& inputs, int rank, std::vector<float>& in_host,
                      std::vector<float>& out_host, size_t count, bool in_place) {
  float* in = in_host.data();
  inputs.fill(in, count, rank);
  impl.load(in_host, count);
  float* result = in_place ? in : out_host.data();
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

void print_table(const std::vector<Row>& rows, const std::string& impl, double* avg_busbw) {
  std::printf("#\n# %s\n", impl.c_str());
  std::printf("#                                         out-of-place                          in-place\n");
  std::printf(
      "#       size         count   type redop      time   algbw   busbw  #wrong       time   algbw   busbw  #wrong\n");
  std::printf("#        (B)    (elements)                   (us)  (GB/s)  (GB/s)               (us)  (GB/s)  (GB/s)\n");
  double sum = 0;
  int k = 0;
  for (const Row& r : rows) {
    if (r.impl != impl) continue;
    std::printf("%12zu  %12zu  float   sum %10.2f %7.2f %7.2f  %6lld %10.2f %7.2f %7.2f  %6lld\n", r.bytes, r.count,
                r.oop.time_us, r.oop.algbw, r.oop.busbw, r.oop.wrong, r.ip.time_us, r.ip.algbw, r.ip.busbw, r.ip.wrong);
    sum += r.oop.busbw + r.ip.busbw;
    k += 2;
  }
  *avg_busbw = k ? sum / k : 0;
  std::printf("# Avg bus bandwidth    : %g (%s)\n", *avg_busbw, impl.c_str());
}

int run(int argc, char** argv, int rank, int n) {
  CLI::App app{"all-reduce bandwidth of every implementation (after nccl-tests' all_reduce_perf)"};
  std::string min_s = "8", max_s = "256M", impls_s, link_name = "none", csv_path, json_path;
  int factor = 2, warmup = 5, iters = 20;
  double link_latency_us = -1, link_gbps = -1;
  app.add_option("-b,--minbytes", min_s, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_s, "largest size in bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "multiply the size by this factor each step")->capture_default_str();
  app.add_option("-w,--warmup_iters", warmup, "untimed calls per size and mode")->capture_default_str();
  app.add_option("-n,--iters", iters, "timed calls per size and mode")->capture_default_str();
  app.add_option("-i,--impls", impls_s,
                 "comma-separated: ring, ring-bf16, ring-fp16, mpi, mpi-raw; GPU: nccl, gpu-ring-nccl, gpu-ring-ipc, "
                 "gpu-ring-host (default ring,mpi,mpi-raw,ring-bf16; no mpi-raw with --link)");
  app.add_option("--link", link_name, "emulated link: none, 10gbe, 25gbe, 100gbe-ib, pcie4, nvlink4")
      ->capture_default_str();
  app.add_option("--link-latency-us", link_latency_us, "override the link's latency (us)");
  app.add_option("--link-gbps", link_gbps, "override the link's bandwidth (Gbit/s)");
  std::string stat = "mean";
  app.add_option("--stat", stat, "time per call: mean (nccl-tests) or median (robust on a shared machine)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mean", "median"}));
  app.add_option("--csv", csv_path, "also write the results as CSV (rank 0)");
  app.add_option("--json", json_path, "also write the results as JSON (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }
  const size_t min_bytes = parse_size(min_s), max_bytes = parse_size(max_s);
  if (factor < 2 || warmup < 0 || iters < 1 || min_bytes < sizeof(float) || max_bytes < min_bytes)
    throw std::invalid_argument("need -f >= 2, -w >= 0, -n >= 1, 4 <= -b <= -e");
  const LinkModel link = parse_link(link_name, link_latency_us, link_gbps);
  const bool median = stat == "median";
  const bool emulated = link.gbps > 0 || link.latency_us > 0;
  if (impls_s.empty()) impls_s = emulated ? "ring,mpi,ring-bf16" : "ring,mpi,mpi-raw,ring-bf16";
  std::vector<Impl> impls;
  std::vector<std::string> names;
  for (size_t pos = 0; pos <= impls_s.size();) {
    const size_t comma = std::min(impls_s.find(',', pos), impls_s.size());
    names.push_back(impls_s.substr(pos, comma - pos));
    if (std::count(names.begin(), names.end(), names.back()) > 1)
      throw std::invalid_argument("implementation '" + names.back() + "' given twice");
    impls.push_back(make_impl(names.back(), link, max_bytes / sizeof(float)));
    pos = comma + 1;
  }

  char host[256] = "?";
  gethostname(host, sizeof host);
  if (rank == 0) {
    std::printf("# ddplab allreduce_perf: %d ranks, host %s, link %s (%g us, %g Gbit/s), warm-up %d, iters %d\n", n,
                host, link.name.c_str(), link.latency_us, link.gbps, warmup, iters);
    std::printf("# busbw = algbw x 2(n-1)/n; time = %s; GB = 1e9 bytes\n",
                median ? "median over calls of the slowest rank's time" : "slowest rank's mean per call");
  }

  const Inputs inputs{n};
  std::vector<float> in(max_bytes / sizeof(float)), out(in.size());
  inputs.fill(in.data(), in.size(), rank);  // touch every page before timing
  std::fill(out.begin(), out.end(), 0.0f);
  // A first, untimed pass of every implementation (connections, scratch buffers, code paths warm), so that the
  // first size measured is not the one that pays for it.
  for (const Impl& impl : impls) {
    impl.load(in, min_bytes / sizeof(float));
    for (int i = 0; i < 100; ++i) impl.run(impl.in(in), impl.in(in), min_bytes / sizeof(float));
  }
  inputs.fill(in.data(), in.size(), rank);
  std::vector<Row> rows;
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const size_t count = bytes / sizeof(float);
    for (const Impl& impl : impls) {
      Row r{impl.name, count * sizeof(float), count, {}, {}};
      for (Mode* m : {&r.oop, &r.ip}) {
        const bool in_place = m == &r.ip;
        inputs.fill(in.data(), count, rank);
        impl.load(in, count);
        m->time_us = time_calls(impl, impl.in(in), in_place ? impl.in(in) : impl.out(out), count, warmup, iters, median);
        m->algbw = static_cast<double>(r.bytes) / (m->time_us * 1e-6) / 1e9;
        m->busbw = m->algbw * bus_factor;
        m->wrong = count_wrong(impl, inputs, rank, in, out, count, in_place);
      }
      rows.push_back(r);
    }
    if (bytes > max_bytes / factor) break;  // no overflow on the last multiplication
  }

  if (rank != 0) return 0;
  nlohmann::json j;
  j["nranks"] = n;
  j["host"] = host;
  j["link"] = {{"name", link.name}, {"latency_us", link.latency_us}, {"gbps", link.gbps}};
  j["warmup"] = warmup;
  j["iters"] = iters;
  j["stat"] = stat;
  j["results"] = nlohmann::json::array();
  long long total_wrong = 0;
  for (const std::string& name : names) {
    double avg = 0;
    print_table(rows, name, &avg);
    j["avg_busbw"][name] = avg;
  }
  std::FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (!csv_path.empty() && !csv) throw std::runtime_error("cannot write " + csv_path);
  if (csv)
    std::fprintf(csv,
                 "impl,nranks,link,size_bytes,count,type,redop,oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,"
                 "ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong\n");
  for (const Row& r : rows) {
    total_wrong += r.oop.wrong + r.ip.wrong;
    j["results"].push_back(
        {{"impl", r.impl},
         {"size_bytes", r.bytes},
         {"count", r.count},
         {"type", "float"},
         {"redop", "sum"},
         {"out_of_place",
          {{"time_us", r.oop.time_us}, {"algbw_gbs", r.oop.algbw}, {"busbw_gbs", r.oop.busbw}, {"wrong", r.oop.wrong}}},
         {"in_place",
          {{"time_us", r.ip.time_us}, {"algbw_gbs", r.ip.algbw}, {"busbw_gbs", r.ip.busbw}, {"wrong", r.ip.wrong}}}});
    if (csv)
      std::fprintf(csv, "%s,%d,%s,%zu,%zu,float,sum,%.3f,%.4f,%.4f,%lld,%.3f,%.4f,%.4f,%lld\n", r.impl.c_str(), n,
                   link.name.c_str(), r.bytes, r.count, r.oop.time_us, r.oop.algbw, r.oop.busbw, r.oop.wrong,
                   r.ip.time_us, r.ip.algbw, r.ip.busbw, r.ip.wrong);
  }
  if (csv) std::fclose(csv);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << j.dump(1) << "\n";
    if (!f) throw std::runtime_error("cannot write " + json_path);
  }
  std::printf("# Out of bounds values : %lld %s\n#\n", total_wrong, total_wrong ? "FAILED" : "OK");
  return total_wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  ddplab::init_mpi_multithreaded(&argc, &argv, "allreduce_perf");  // the GPU ring runs a comm thread
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int code = 0;
  try {
    code = run(argc, argv, rank, n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the program's edge: other ranks may be waiting in a collective
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0 knows the verdict
  MPI_Finalize();
  return code;
}
