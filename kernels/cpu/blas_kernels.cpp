#include "kernels/cpu/blas_kernels.h"

#include <cblas.h>
#include <cpuid.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "kernels/cpu/ops.h"
#include "runtime/host_cache.h"

extern char** environ;

namespace ddplab::blas {
namespace {

// argv[1] of a probe child: the program measures its GEMMs, prints "<core> <GFLOP/s>" and exits (select_kernels).
constexpr char kProbeArgument[] = "--openblas-kernel-probe";
// Set for the program run again with the chosen OPENBLAS_CORETYPE: why it was chosen (and that it was ddplab, not
// the user, who set the core).
constexpr char kChosenVariable[] = "DDPLAB_BLAS_CHOSEN";

const std::string kOwnPick = "OpenBLAS's own pick";

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::string describe(const CpuFeatures& f) {
  if (f.avx512 && f.avx512_bf16) return "AVX-512 + BF16";
  if (f.avx512) return "AVX-512";
  if (f.avx2_fma) return "AVX2+FMA";
  return "below AVX2+FMA";
}

std::vector<std::string> candidate_cores(const CpuFeatures& f) {
  std::vector<std::string> cores;
  if (!f.avx2_fma) return cores;
  cores = {"Haswell", "Zen"};  // OpenBLAS's Zen family is Haswell's kernels with AMD's cache blocking
  if (f.avx512) cores.push_back("SkylakeX");
  if (f.avx512 && f.avx512_bf16) cores.push_back("Cooperlake");
  return cores;
}

std::vector<std::string> cores_to_probe(const CpuFeatures& f, const std::string& detected) {
  std::vector<std::string> cores = candidate_cores(f);
  if (!cores.empty() && !contains(cores, detected)) cores.push_back(detected);
  return cores;
}

std::string core_without_probe(const CpuFeatures& f, const std::string& detected) {
  if (!f.avx2_fma) return "";
  const std::vector<std::string> best_set =
      f.avx512 ? std::vector<std::string>{"SkylakeX", "Cooperlake"} : std::vector<std::string>{"Haswell", "Zen"};
  return contains(best_set, detected) && contains(candidate_cores(f), detected) ? detected : best_set[0];
}

std::string choose_core(const std::vector<std::string>& candidates, const Rates& rates, const std::string& detected) {
  const CoreRate* best = nullptr;
  for (const CoreRate& r : rates)
    if (contains(candidates, r.core) && r.gflops > 0 && (!best || r.gflops > best->gflops)) best = &r;
  if (!best) return "";
  const CoreRate* own = contains(candidates, detected) ? find_rate(rates, detected) : nullptr;
  if (own && own->gflops >= (1 - kKeepDetectedWithin) * best->gflops) return detected;
  return best->core;
}

std::string list_rates(const Rates& rates, const std::string& except) {
  Rates listed;
  for (const CoreRate& r : rates)
    if (r.core != except) listed.push_back(r);
  std::stable_sort(listed.begin(), listed.end(),
                   [](const CoreRate& a, const CoreRate& b) { return a.gflops > b.gflops; });
  std::string text;
  for (const CoreRate& r : listed) {
    char number[32];
    std::snprintf(number, sizeof number, "%.0f", r.gflops);
    text += (text.empty() ? "" : ", ") + r.core + " " + number;
  }
  return text;
}

const CoreRate* find_rate(const Rates& rates, const std::string& core) {
  for (const CoreRate& r : rates)
    if (r.core == core) return &r;
  return nullptr;
}

CoreRate fastest(const Rates& rates) {
  CoreRate best;
  for (const CoreRate& r : rates)
    if (r.gflops > best.gflops) best = r;
  return best;
}

std::string describe_probe(const std::string& chosen, const Rates& rates, const std::string& detected) {
  const CoreRate* mine = find_rate(rates, chosen);
  char number[32];
  std::snprintf(number, sizeof number, "%.0f", mine ? mine->gflops : 0.0);
  const std::string others = list_rates(rates, chosen);
  return std::string("probe: ") + number + " GFLOP/s" + (others.empty() ? "" : " vs " + others) + "; " +
         (chosen == detected ? kOwnPick : "OpenBLAS detected " + detected);
}

std::string cache_file_name(const std::string& cpu_id, const CpuFeatures& f, const std::string& openblas_version) {
  const char* isa = f.avx512 && f.avx512_bf16 ? "avx512bf16" : f.avx512 ? "avx512" : f.avx2_fma ? "avx2" : "sse";
  return host_cache::file_name("openblas-kernels_" + cpu_id + "_" + isa + "_openblas-" + openblas_version) + ".json";
}

namespace {

std::optional<Decision> read_decision(const nlohmann::json& j, const std::vector<std::string>& candidates) {
  if (!j.is_object() || !j.contains("chosen") || !j["chosen"].is_string() || !j.contains("gflops") ||
      !j["gflops"].is_object())
    return std::nullopt;
  Decision d;
  d.chosen = j["chosen"].get<std::string>();
  d.detected = j.value("detected", "");
  for (const auto& [core, rate] : j["gflops"].items())
    if (rate.is_number()) d.rates.push_back({core, rate.get<double>()});
  if (!contains(candidates, d.chosen) || !find_rate(d.rates, d.chosen)) return std::nullopt;  // stale or damaged
  // A file from before the verdict was settled by two probes holds one, of unknown age.
  const nlohmann::json probes = j.value("probes", nlohmann::json(1)), at = j.value("probed_at", nlohmann::json(0));
  d.probes = probes.is_number_integer() ? std::max(1, probes.get<int>()) : 1;
  d.probed_at_s = at.is_number() ? at.get<double>() : 0;
  return d;
}

// Whether the verdict stands at now_s: settled by its probes, or its one probe too recent to repeat (kReprobeAfterS).
bool stands(const Decision& d, double now_s) {
  return d.probes >= kProbesToSettle || now_s - d.probed_at_s < kReprobeAfterS;
}

// Each family's best rate in either.
Rates best_of(Rates a, const Rates& b) {
  for (const CoreRate& r : b) {
    const auto same = std::find_if(a.begin(), a.end(), [&](const CoreRate& x) { return x.core == r.core; });
    if (same == a.end())
      a.push_back(r);
    else
      same->gflops = std::max(same->gflops, r.gflops);
  }
  return a;
}

nlohmann::json to_json(const Decision& d) {
  nlohmann::json rates = nlohmann::json::object();
  for (const CoreRate& r : d.rates) rates[r.core] = std::round(r.gflops * 10) / 10;
  return {{"detected", d.detected},
          {"chosen", d.chosen},
          {"gflops", rates},
          {"probes", d.probes},
          {"probed_at", std::round(d.probed_at_s)}};
}

}  // namespace

std::optional<Decision> cached_decision(const std::string& dir, const std::string& file,
                                        const std::vector<std::string>& candidates, const std::string& detected,
                                        const std::function<Rates()>& probe, double now_s, std::string& error) {
  if (!dir.empty())
    if (auto d = read_decision(host_cache::read(dir + "/" + file), candidates); d && stands(*d, now_s)) return d;
  // The probe runs under the file's lock: ranks probing at once on shared cores would skew each other's rates.
  std::optional<Decision> d;
  const auto measure = [&](const nlohmann::json& current) -> std::optional<nlohmann::json> {
    const std::optional<Decision> earlier = read_decision(current, candidates);
    if (earlier && stands(*earlier, now_s)) {  // measured while this process waited
      d = earlier;
      return std::nullopt;
    }
    Decision measured{detected, "", probe(), 1, now_s};
    if (earlier) measured.rates = best_of(earlier->rates, measured.rates), measured.probes = earlier->probes + 1;
    measured.chosen = choose_core(candidates, measured.rates, detected);
    if (measured.chosen.empty()) {
      error = "no candidate family ran in the probe";
      return std::nullopt;
    }
    d = measured;
    return to_json(measured);
  };
  if (!host_cache::update(dir, file, measure, error)) return std::nullopt;
  return d;
}

std::string CpuModel::id() const {
  return vendor + " family " + std::to_string(family) + " model " + std::to_string(model) + " stepping " +
         std::to_string(stepping);
}

CpuModel cpu_model() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return {};
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return {vendor};
  return decode_cpu_signature(vendor, eax);
}

CpuModel decode_cpu_signature(const std::string& vendor, unsigned eax) {
  // Intel's and AMD's manuals: the extended family and model fields count only for base families 6 and 15.
  CpuModel m;
  m.vendor = vendor;
  const int base_family = (eax >> 8) & 0xf, base_model = (eax >> 4) & 0xf;
  m.family = base_family == 15 ? base_family + ((eax >> 20) & 0xff) : base_family;
  m.model = base_family == 6 || base_family == 15 ? base_model + (((eax >> 16) & 0xf) << 4) : base_model;
  m.stepping = eax & 0xf;
  return m;
}

CpuFeatures cpu_features() {
  // libgcc's checks include the OS's support for the ymm and zmm state (XGETBV), which a bare cpuid bit does not.
  CpuFeatures f;
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  return f;
}

std::string openblas_version() {
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the second word.
  char name[64] = {}, version[64] = {};
  if (std::sscanf(openblas_get_config(), "%63s %63s", name, version) != 2) return "unknown";
  return version;
}

namespace {

KernelsInUse& in_use() {
  static KernelsInUse k{openblas_get_corename(), kOwnPick};
  return k;
}

std::string ran_instead(const std::string& asked, const std::string& ran) {
  return strcasecmp(asked.c_str(), ran.c_str()) == 0 ? "" : "; OpenBLAS ran " + ran + " instead of " + asked;
}

}  // namespace

void select_kernels(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], kProbeArgument) == 0) {
    const double gflops = measure_gemm_gflops();
    std::printf("%s %.3f\n", openblas_get_corename(), gflops);
    std::exit(0);
  }
  KernelsInUse& k = in_use();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (const char* chosen = std::getenv(kChosenVariable); chosen && forced) {
    k.why = chosen + ran_instead(forced, k.core);
    unsetenv(kChosenVariable);  // not inherited by programs this one starts
    return;
  }
  if (forced) {
    k.why = std::string("OPENBLAS_CORETYPE=") + forced + " in the environment" + ran_instead(forced, k.core);
    return;
  }
  // Empty is unset, as for every setting (runtime/settings.h): on.
  if (const char* automatic = std::getenv("DDPLAB_BLAS_AUTO");
      automatic && *automatic && std::strcmp(automatic, "on") != 0) {
    k.why = kOwnPick + "; DDPLAB_BLAS_AUTO=" + automatic;  // a value it does not take is refused once MPI is up
    return;
  }
  const CpuFeatures features = cpu_features();
  const std::string detected = k.core;
  const std::vector<std::string> candidates = candidate_cores(features);
  if (candidates.empty()) {
    k.why = kOwnPick + "; the CPU is " + describe(features);
    return;
  }
  std::string error, chosen;
  const std::optional<Decision> decision = cached_decision(
      host_cache::directory(), cache_file_name(cpu_model().id(), features, openblas_version()), candidates, detected,
      [&] { return probe_cores(cores_to_probe(features, detected)); },
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(), error);
  if (decision) {
    chosen = decision->chosen;
    k.why = describe_probe(chosen, decision->rates, detected);
  } else {
    chosen = core_without_probe(features, detected);
    k.why = (chosen == detected ? kOwnPick : "the family for " + describe(features)) + ", unmeasured: " + error +
            (chosen == detected ? "" : "; OpenBLAS detected " + detected);
  }
  if (chosen == detected) return;
  setenv("OPENBLAS_CORETYPE", chosen.c_str(), 1);
  setenv(kChosenVariable, k.why.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then the detected kernels stay
  const std::string failure = std::strerror(errno);
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kChosenVariable);
  k.why = kOwnPick + "; running again with " + chosen + " failed: " + failure;
}

const KernelsInUse& kernels_in_use() { return in_use(); }

double measure_gemm_gflops(double budget_ms) {
  constexpr int B = 128, C = 1024, OC = 1024;
  std::vector<float> inp(size_t(B) * C), weight(size_t(OC) * C), dout(size_t(B) * OC);
  std::vector<float> out(dout.size()), dinp(inp.size()), dweight(weight.size());
  // Small values that stay normal (no denormal slow paths) however many times dweight accumulates.
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = float(int(i % 19) - 9) * 1e-2f;
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = float(int(i % 23) - 11) * 1e-2f;
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(int(i % 17) - 8) * 1e-3f;
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  const auto layer = [&] {
    cpu::matmul_forward(out.data(), inp.data(), weight.data(), B, C, OC);
    cpu::matmul_backward(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), B, C, OC);
  };
  using Clock = std::chrono::steady_clock;
  layer();  // page faults, OpenBLAS's buffers
  double best_ms = std::numeric_limits<double>::infinity();
  const auto start = Clock::now();
  for (int repeats = 0;
       repeats < 3 || std::chrono::duration<double, std::milli>(Clock::now() - start).count() < budget_ms; ++repeats) {
    const auto t = Clock::now();
    layer();
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(Clock::now() - t).count());
  }
  openblas_set_num_threads(threads);
  return 6.0 * B * C * OC / best_ms / 1e6;
}

namespace {

// One probe child: this program with OPENBLAS_CORETYPE=core. Its rate, or nullopt if it failed or ran another core.
std::optional<double> probe_in_child(const std::string& core, int deadline_ms) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("OPENBLAS_CORETYPE=", 0) != 0 && entry.rfind("OPENBLAS_NUM_THREADS=", 0) != 0) env.push_back(entry);
  }
  env.push_back("OPENBLAS_CORETYPE=" + core);
  env.push_back("OPENBLAS_NUM_THREADS=1");  // no thread pool to start for a one-thread measurement
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", argument = kProbeArgument;
  char* child_argv[] = {exe.data(), argument.data(), nullptr};

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return std::nullopt;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);  // a crash stays quiet
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, exe.c_str(), &actions, nullptr, child_argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  // A child that hangs must not hold up the rank, nor every rank of the host behind the probe's lock: past the
  // deadline it is killed and counts as failed. It takes well under a second.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  std::string text;
  bool timed_out = false;
  char buffer[256];
  while (spawned == 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd ready{out[0], POLLIN, 0};
    const int polled = left.count() > 0 ? poll(&ready, 1, static_cast<int>(left.count())) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled == 0) timed_out = true;
    if (polled <= 0) break;
    const ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // its end of the pipe closed: it exited
    text.append(buffer, n);
  }
  close(out[0]);
  if (spawned != 0) return std::nullopt;
  // Its output closed is not its exit (it can hang in an exit handler): the wait keeps the deadline too.
  int status = 0;
  bool killed = false;
  for (;;) {
    if (timed_out && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    const pid_t waited = waitpid(pid, &status, killed ? 0 : WNOHANG);
    if (waited == pid) break;
    if (waited < 0 && errno != EINTR) return std::nullopt;
    if (waited == 0) {  // still running
      timed_out = std::chrono::steady_clock::now() >= deadline;
      if (!timed_out) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (timed_out) return std::nullopt;
  char ran[64] = {};
  double gflops = 0;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || std::sscanf(text.c_str(), "%63s %lf", ran, &gflops) != 2 ||
      strcasecmp(ran, core.c_str()) != 0 || !(gflops > 0))
    return std::nullopt;
  return gflops;
}

}  // namespace

Rates probe_cores(const std::vector<std::string>& cores, int rounds, int deadline_ms) {
  Rates rates;
  for (int round = 0; round < rounds; ++round) {  // in turn: a burst of load on the host hits one round, not one core
    for (const std::string& core : cores) {
      const std::optional<double> gflops = probe_in_child(core, deadline_ms);
      if (!gflops) continue;
      CoreRate* r = nullptr;
      for (CoreRate& x : rates)
        if (x.core == core) r = &x;
      if (!r) r = &rates.emplace_back(CoreRate{core, 0});
      r->gflops = std::max(r->gflops, *gflops);
    }
  }
  return rates;
}

Rates measure_alternatives() { return probe_cores(cores_to_probe(cpu_features(), kernels_in_use().core)); }

int fma_flops_per_cycle(const CpuModel& cpu, const CpuFeatures& f) {
  const bool zen4 = cpu.vendor == "AuthenticAMD" && cpu.family == 25 && f.avx512;
  return f.avx512 && !zen4 ? 64 : f.avx2_fma ? 32 : 0;
}

std::optional<double> measure_core_ghz() {
#if defined(__x86_64__)
  // Two registers adding into each other: every add waits for the one before, and a register-to-register add takes
  // one cycle on every x86 core (no core removes it at rename, as some do moves and small immediates). 16 adds per
  // iteration; the loop's own decrement and branch run beside them. Best of rounds of ~3 ms: a round the host
  // preempts only reads slow.
  constexpr int64_t kIterations = 1 << 19;
  constexpr int kAddsPerIteration = 16;
  double best_ghz = 0;
  for (int round = 0; round < 7; ++round) {
    uint64_t x = 1, y = 2;
    int64_t n = kIterations;
    const auto start = std::chrono::steady_clock::now();
    asm volatile(
        "1:\n\t"
        "add %[y], %[x]\n\tadd %[x], %[y]\n\tadd %[y], %[x]\n\tadd %[x], %[y]\n\t"
        "add %[y], %[x]\n\tadd %[x], %[y]\n\tadd %[y], %[x]\n\tadd %[x], %[y]\n\t"
        "add %[y], %[x]\n\tadd %[x], %[y]\n\tadd %[y], %[x]\n\tadd %[x], %[y]\n\t"
        "add %[y], %[x]\n\tadd %[x], %[y]\n\tadd %[y], %[x]\n\tadd %[x], %[y]\n\t"
        "dec %[n]\n\t"
        "jnz 1b"
        : [x] "+r"(x), [y] "+r"(y), [n] "+r"(n)
        :
        : "cc");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 0) best_ghz = std::max(best_ghz, double(kIterations) * kAddsPerIteration / seconds / 1e9);
  }
  if (best_ghz > 0) return best_ghz;
#endif
  return std::nullopt;
}

std::optional<FmaPeak> fma_peak(const CpuModel& cpu, const CpuFeatures& f) {
  FmaPeak peak;
  peak.flops_per_cycle = fma_flops_per_cycle(cpu, f);
  if (peak.flops_per_cycle == 0) return std::nullopt;
  double mhz = 0;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; mhz == 0 && std::getline(cpuinfo, line);)
    if (line.rfind("cpu MHz", 0) == 0 && line.find(':') != std::string::npos)
      mhz = std::atof(line.c_str() + line.find(':') + 1);
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (mhz <= 0 && __get_cpuid_max(0, nullptr) >= 0x16 && __get_cpuid(0x16, &eax, &ebx, &ecx, &edx))
    mhz = eax & 0xffff;  // the base frequency, MHz (Intel)
  peak.reported_ghz = std::max(mhz, 0.0) / 1000;
  const std::optional<double> measured = measure_core_ghz();
  peak.measured = measured.has_value();
  peak.ghz = measured ? *measured : peak.reported_ghz;
  if (peak.ghz <= 0) return std::nullopt;
  peak.gflops = peak.flops_per_cycle * peak.ghz;
  return peak;
}

}  // namespace ddplab::blas
