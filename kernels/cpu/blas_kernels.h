// Which OpenBLAS kernels this process runs, and why.
//
// OpenBLAS (DYNAMIC_ARCH) picks a kernel family ("core") from the CPU's model number when the library loads. A release
// older than the CPU guesses: Debian 12's 0.3.21 runs its Prescott (SSE3) kernels on an Emerald Rapids Xeon, 4-5x
// below its SkylakeX ones, and its Cooperlake kernels on Zen 4, where Haswell's are faster. So the family is chosen
// here by what the CPU can run (cpuid), among the families that use its best instructions, and where more than one
// fits, by measuring them: a GEMM at the default MLP's shapes in a child process per family (the family is fixed when
// the library loads, so only a new process can run another). The verdict is cached per CPU model and OpenBLAS version
// ($XDG_CACHE_HOME/ddplab), so a host measures twice (the second time at a later start, below), and every rank of a
// job on it reads the same verdict.
//
// The choice itself is pure (candidate_cores .. describe_choice) and unit-tested over a table of CPUs; the rest
// measures, caches and re-executes.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddplab::blas {

// The instruction sets OpenBLAS's x86-64 kernel families are written for.
struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA3: Haswell's and Zen's kernels
  bool avx512 = false;       // AVX-512 F, BW, DQ and VL: SkylakeX's
  bool avx512_bf16 = false;  // and AVX512_BF16: Cooperlake's
};
// "AVX-512 + BF16", "AVX-512", "AVX2+FMA" or "below AVX2+FMA".
std::string describe(const CpuFeatures& features);

struct CoreRate {
  std::string core;  // an OpenBLAS core name, as openblas_get_corename() spells it
  double gflops = 0;
};
using Rates = std::vector<CoreRate>;

// ---- the choice: pure functions of the CPU's features, OpenBLAS's own pick and measured rates ----

// The families worth running on a CPU with these features: every one written for AVX2+FMA or above that it can run,
// the AVX2 ones on AVX-512 CPUs too (Zen 4 runs AVX-512 on 256-bit halves, and Haswell's kernels won there). Empty
// below AVX2+FMA: there OpenBLAS's pick stands.
std::vector<std::string> candidate_cores(const CpuFeatures& features);
// What the probe measures: the candidates, and OpenBLAS's own pick where it is not one (its rate goes on record).
std::vector<std::string> cores_to_probe(const CpuFeatures& features, const std::string& detected);
// The family to run when nothing can be measured and cached (ranks measuring on their own could disagree): OpenBLAS's
// pick where it is written for the CPU's best instruction set, else that set's first family (SkylakeX on AVX-512,
// Haswell on AVX2); "" below AVX2.
std::string core_without_probe(const CpuFeatures& features, const std::string& detected);
// The probe's verdict among the candidates: the fastest, unless OpenBLAS's pick is a candidate within
// kKeepDetectedWithin of it (no change for noise). "" when no candidate has a rate.
inline constexpr double kKeepDetectedWithin = 0.05;
std::string choose_core(const std::vector<std::string>& candidates, const Rates& rates, const std::string& detected);
// The why of a measured choice: "probe: 104 GFLOP/s vs Haswell 88, Prescott 21; OpenBLAS detected Prescott".
std::string describe_probe(const std::string& chosen, const Rates& rates, const std::string& detected);
// "Haswell 88, Prescott 21": the rates but `except`'s, fastest first, in whole GFLOP/s.
std::string list_rates(const Rates& rates, const std::string& except = "");
// The fastest; a zero rate with no core when there is none.
CoreRate fastest(const Rates& rates);
// core's rate; null where it was not measured.
const CoreRate* find_rate(const Rates& rates, const std::string& core);

// ---- the cache ----

struct Decision {
  std::string detected, chosen;  // OpenBLAS's own pick; the family to run
  Rates rates;                   // each family's best rate over the probes, GFLOP/s
  int probes = 1;                // how many probes the rates are the best of
  double probed_at_s = 0;        // when the last one ran, seconds since the epoch
};
// A verdict is settled after two probes at two starts: a host busy while one probe ran (another tenant, a build) slows
// every family alike and hides their difference (Zen 4: every family at 82-85 GFLOP/s in one probe, Haswell 102
// against Cooperlake 86 on that host minutes later), and a busy host only ever slows a family, so each family's best
// rate over the probes is kept. The second probe runs at the first start at least kReprobeAfterS after the first:
// ranks that start together all read the first probe's verdict instead of measuring again one after the other.
inline constexpr int kProbesToSettle = 2;
inline constexpr double kReprobeAfterS = 60;
// One file name per CPU model (vendor, family, model, stepping), feature set and OpenBLAS version.
std::string cache_file_name(const std::string& cpu_id, const CpuFeatures& features,
                            const std::string& openblas_version);
// The decision in dir/file (dir: host_cache::directory()) where it is there, chose a candidate and is settled or its
// one probe younger than kReprobeAfterS at now_s; otherwise, holding the file's lock, measured by probe(), merged
// with the file's rates and written: processes that start together on a host measure once and all read that one
// decision. nullopt with `error` set when dir cannot be made or locked, or no candidate could be measured.
std::optional<Decision> cached_decision(const std::string& dir, const std::string& file,
                                        const std::vector<std::string>& candidates, const std::string& detected,
                                        const std::function<Rates()>& probe, double now_s, std::string& error);

// ---- this process ----

struct CpuModel {
  std::string vendor;  // GenuineIntel, AuthenticAMD
  int family = 0, model = 0, stepping = 0;
  std::string id() const;  // "GenuineIntel family 6 model 207 stepping 2"
};
CpuModel cpu_model();  // cpuid
// The displayed family, model and stepping from cpuid leaf 1's eax (0x000C06F2: family 6 model 207 stepping 2).
CpuModel decode_cpu_signature(const std::string& vendor, unsigned eax);
CpuFeatures cpu_features();      // cpuid, with the OS's support for the vector registers' state
std::string openblas_version();  // "0.3.21"

struct KernelsInUse {
  std::string core;  // openblas_get_corename()
  std::string why;   // "probe: 104 GFLOP/s vs Haswell 88, Prescott 21; OpenBLAS detected Prescott"
  std::string describe() const { return core + " (" + why + ")"; }
};
// First thing in main, before MPI_Init and before any thread starts. In a probe child (see probe_cores) it measures
// and exits. Otherwise it decides which kernels to run, unless OPENBLAS_CORETYPE is set (the user's choice wins) or
// DDPLAB_BLAS_AUTO is set to anything but "on"; where the decision differs from OpenBLAS's own pick, it executes the
// program again, same arguments, with OPENBLAS_CORETYPE set, and returns there.
void select_kernels(int argc, char** argv);
// What select_kernels found or decided (OpenBLAS's pick and the reason, if it was never called).
const KernelsInUse& kernels_in_use();

// GFLOP/s of one Linear layer of the default MLP (batch 128, 1024 -> 1024), forward and both backward GEMMs, on this
// process's kernels and one thread: the best of repeats over about budget_ms.
double measure_gemm_gflops(double budget_ms = 25);
// The same measured for each core in a child process of this program (which must call select_kernels first) with
// OPENBLAS_CORETYPE set, `rounds` times in turn, the best of each core's. A core whose child fails (an illegal
// instruction), runs another core than asked, or has not exited by deadline_ms (it is killed) is left out.
Rates probe_cores(const std::vector<std::string>& cores, int rounds = 3, int deadline_ms = 30000);

// Every family cores_to_probe names for this CPU and the kernels in use, each measured now in a child: the yardstick
// `ddplab devices` and the benchmarks set their GEMM rates against (the kernels in use among them, measured alike).
Rates measure_alternatives();

// fp32 flops per cycle of one core's FMA units: 2 per FMA x lanes x 2 units (Xeons from Skylake-SP Gold up, Zen 2-5);
// Zen 4 (AMD family 25 with AVX-512) splits 512-bit work in 256-bit halves. 0 below AVX2+FMA (no estimate).
int fma_flops_per_cycle(const CpuModel& cpu, const CpuFeatures& features);
// The clock this core runs at now, GHz, measured over a chain of dependent adds (one per cycle): turbo included,
// which the nominal clock a guest's /proc/cpuinfo reports leaves out. nullopt where it cannot be measured (not x86).
std::optional<double> measure_core_ghz();
// The core's fp32 FMA peak, estimated: fma_flops_per_cycle x the clock, measured where it can be, else the one the
// OS reports (/proc/cpuinfo's cpu MHz, else cpuid leaf 0x16).
struct FmaPeak {
  double gflops = 0, ghz = 0;
  double reported_ghz = 0;  // what the OS reports, 0 if nothing
  bool measured = false;    // ghz is measure_core_ghz's
  int flops_per_cycle = 0;
};
std::optional<FmaPeak> fma_peak(const CpuModel& cpu, const CpuFeatures& features);

}  // namespace ddplab::blas
