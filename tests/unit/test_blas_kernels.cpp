// The choice of OpenBLAS's kernel family (kernels/cpu/blas_kernels.h): over a table of CPUs as OpenBLAS 0.3.21 sees
// them, the measured verdict, the cache and processes racing to fill it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/blas_kernels.h"
#include "tests/unit/scoped_variable.h"
#include "tests/unit/temp_dir.h"

using namespace ddplab::blas;

namespace {

const CpuFeatures kSse{};
const CpuFeatures kAvx2{true, false, false};
const CpuFeatures kAvx512{true, true, false};
const CpuFeatures kAvx512Bf16{true, true, true};

using Names = std::vector<std::string>;

// The test binary run as a probe child (probe_cores runs /proc/self/exe --openblas-kernel-probe) while the test sets
// DDPLAB_TEST_PROBE_HANGS: before gtest's main, it hangs with nothing written ("silent"), or writes an answer, closes
// its output and hangs ("after_output", a hang in an exit handler).
const bool kHangingProbeChild = [] {
  const char* how = std::getenv("DDPLAB_TEST_PROBE_HANGS");
  std::ifstream cmdline("/proc/self/cmdline");
  std::string program, argument;
  if (!how || !std::getline(cmdline, program, '\0') || !std::getline(cmdline, argument, '\0') ||
      argument != "--openblas-kernel-probe")
    return false;
  if (std::string(how) == "after_output") {
    std::printf("%s 50.0\n", std::getenv("OPENBLAS_CORETYPE"));
    std::fflush(stdout);
    close(STDOUT_FILENO);
  }
  pause();
  std::_Exit(0);
}();

struct PlanCase {
  const char* host;
  CpuFeatures features;
  std::string detected;
  Names probed;               // cores_to_probe
  std::string without_probe;  // core_without_probe
};

TEST(BlasKernels, WhatIsMeasuredAndWhatRunsWithoutAMeasurement) {
  const PlanCase cases[] = {
      // OpenBLAS 0.3.21 does not know Emerald Rapids and runs its SSE3 kernels on it.
      {"Xeon model 207", kAvx512Bf16, "Prescott", {"Haswell", "Zen", "SkylakeX", "Cooperlake", "Prescott"}, "SkylakeX"},
      {"Zen 4", kAvx512Bf16, "Cooperlake", {"Haswell", "Zen", "SkylakeX", "Cooperlake"}, "Cooperlake"},
      {"Zen 5 as Zen", kAvx512Bf16, "Zen", {"Haswell", "Zen", "SkylakeX", "Cooperlake"}, "SkylakeX"},
      {"Skylake-SP", kAvx512, "SkylakeX", {"Haswell", "Zen", "SkylakeX"}, "SkylakeX"},
      {"AVX-512 as Haswell", kAvx512, "Haswell", {"Haswell", "Zen", "SkylakeX"}, "SkylakeX"},
      {"AVX-512 as Sandybridge", kAvx512, "Sandybridge", {"Haswell", "Zen", "SkylakeX", "Sandybridge"}, "SkylakeX"},
      {"Zen 3", kAvx2, "Zen", {"Haswell", "Zen"}, "Zen"},
      {"Haswell", kAvx2, "Haswell", {"Haswell", "Zen"}, "Haswell"},
      {"AVX2 as Nehalem", kAvx2, "Nehalem", {"Haswell", "Zen", "Nehalem"}, "Haswell"},
      {"AVX2 as Prescott", kAvx2, "Prescott", {"Haswell", "Zen", "Prescott"}, "Haswell"},
      // Below AVX2 there is nothing better to run: OpenBLAS's pick stands, unmeasured.
      {"Sandy Bridge", kSse, "Sandybridge", {}, ""},
      {"Core 2", kSse, "Core2", {}, ""},
  };
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(std::string(c.host) + " (" + describe(c.features) + "), OpenBLAS picks " + c.detected);
    EXPECT_EQ(cores_to_probe(c.features, c.detected), c.probed);
    EXPECT_EQ(core_without_probe(c.features, c.detected), c.without_probe);
  }
}

struct VerdictCase {
  const char* host;
  CpuFeatures features;
  std::string detected;
  Rates rates;
  std::string chosen;
};

TEST(BlasKernels, TheProbesVerdict) {
  const VerdictCase cases[] = {
      // Measured on the hosts (docs/BENCHMARKS.md, shared/MACHINE.md), rounded.
      {"Xeon model 207",
       kAvx512Bf16,
       "Prescott",
       {{"Haswell", 88}, {"Zen", 85}, {"SkylakeX", 104}, {"Cooperlake", 68}, {"Prescott", 21}},
       "SkylakeX"},
      {"Zen 4",
       kAvx512Bf16,
       "Cooperlake",
       {{"Haswell", 88}, {"Zen", 87}, {"SkylakeX", 72}, {"Cooperlake", 71}},
       "Haswell"},
      {"Zen 5",
       kAvx512Bf16,
       "Zen",
       {{"Haswell", 125}, {"Zen", 124}, {"SkylakeX", 202}, {"Cooperlake", 180}},
       "SkylakeX"},
      // OpenBLAS's own pick is kept within 5% of the fastest, and left beyond it.
      {"within 5%", kAvx2, "Zen", {{"Haswell", 78}, {"Zen", 75}}, "Zen"},
      {"beyond 5%", kAvx2, "Zen", {{"Haswell", 80}, {"Zen", 75}}, "Haswell"},
      // A pick below the CPU's instruction set is measured for the record, never chosen, however it measured.
      {"noise", kAvx2, "Sandybridge", {{"Haswell", 50}, {"Zen", 49}, {"Sandybridge", 60}}, "Haswell"},
      // A family whose child died (an illegal instruction) has no rate.
      {"a child died", kAvx512, "SkylakeX", {{"Haswell", 70}, {"Zen", 71}}, "Zen"},
      {"nothing ran", kAvx512, "SkylakeX", {}, ""},
  };
  for (const VerdictCase& c : cases) {
    SCOPED_TRACE(c.host);
    EXPECT_EQ(choose_core(candidate_cores(c.features), c.rates, c.detected), c.chosen);
  }
}

TEST(BlasKernels, TheWhy) {
  const Rates rates{{"Haswell", 88.4}, {"SkylakeX", 104.2}, {"Prescott", 21.3}, {"Cooperlake", 68}};
  EXPECT_EQ(describe_probe("SkylakeX", rates, "Prescott"),
            "probe: 104 GFLOP/s vs Haswell 88, Cooperlake 68, Prescott 21; OpenBLAS detected Prescott");
  EXPECT_EQ(describe_probe("Zen", {{"Zen", 75.6}, {"Haswell", 74.9}}, "Zen"),
            "probe: 76 GFLOP/s vs Haswell 75; OpenBLAS's own pick");
  EXPECT_EQ(list_rates(rates), "SkylakeX 104, Haswell 88, Cooperlake 68, Prescott 21");
  EXPECT_EQ(fastest(rates).core, "SkylakeX");
  EXPECT_EQ(fastest({}).core, "");
  ASSERT_NE(find_rate(rates, "Haswell"), nullptr);
  EXPECT_EQ(find_rate(rates, "Haswell")->gflops, 88.4);
  EXPECT_EQ(find_rate(rates, "Zen"), nullptr);
}

TEST(BlasKernels, CpuSignatures) {
  const CpuModel emerald = decode_cpu_signature("GenuineIntel", 0x000C06F2);
  EXPECT_EQ(emerald.id(), "GenuineIntel family 6 model 207 stepping 2");
  const CpuModel milan = decode_cpu_signature("AuthenticAMD", 0x00A00F11);
  EXPECT_EQ(milan.id(), "AuthenticAMD family 25 model 1 stepping 1");
  const CpuModel zen4 = decode_cpu_signature("AuthenticAMD", 0x00A10F11);
  EXPECT_EQ(zen4.id(), "AuthenticAMD family 25 model 17 stepping 1");
}

TEST(BlasKernels, FmaFlopsPerCycleFromFeatures) {
  const CpuModel emerald{"GenuineIntel", 6, 207, 2}, zen4{"AuthenticAMD", 25, 17, 1}, zen5{"AuthenticAMD", 26, 2, 0};
  EXPECT_EQ(fma_flops_per_cycle(emerald, kAvx512Bf16), 64);
  EXPECT_EQ(fma_flops_per_cycle(zen5, kAvx512Bf16), 64);
  EXPECT_EQ(fma_flops_per_cycle(zen4, kAvx512Bf16), 32);  // 512-bit work on 256-bit units
  EXPECT_EQ(fma_flops_per_cycle(emerald, kAvx2), 32);     // a hypervisor that hides AVX-512
  EXPECT_EQ(fma_flops_per_cycle(emerald, kSse), 0);
  EXPECT_FALSE(fma_peak(emerald, kSse));
}

// The clock from the chain of dependent adds: within what any x86 core of the last 20 years runs at (a wrong count
// of adds, or of seconds, reads off by a factor of 16 or 1000), and the peak is the flops per cycle at that clock.
TEST(BlasKernels, FmaPeakAtTheMeasuredClock) {
#if defined(__x86_64__)
  const std::optional<double> ghz = measure_core_ghz();
  ASSERT_TRUE(ghz);
  EXPECT_GT(*ghz, 0.8);
  EXPECT_LT(*ghz, 7.0);
  const CpuModel zen4{"AuthenticAMD", 25, 17, 1};
  const std::optional<FmaPeak> peak = fma_peak(zen4, kAvx512Bf16);
  ASSERT_TRUE(peak);
  EXPECT_TRUE(peak->measured);
  EXPECT_EQ(peak->flops_per_cycle, 32);
  EXPECT_DOUBLE_EQ(peak->gflops, 32 * peak->ghz);
  EXPECT_GT(peak->ghz, 0.8);
#else
  GTEST_SKIP() << "the clock is measured on x86-64 only";
#endif
}

// A probe child that never exits, silent or after its answer, is killed at the deadline and left out: the probe
// holds every rank of the host behind its lock. The bound on the time is a hang guard, far above the deadline.
TEST(BlasKernels, AProbeChildThatHangsIsKilledAtTheDeadline) {
  for (const char* how : {"silent", "after_output"}) {
    ScopedVariable hang("DDPLAB_TEST_PROBE_HANGS", how);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(probe_cores({"Haswell"}, 1, /*deadline_ms=*/300).empty()) << how;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << how;
  }
}

TEST(BlasKernels, CacheFileNames) {
  const std::string cpu = "GenuineIntel family 6 model 207 stepping 2";
  EXPECT_EQ(cache_file_name(cpu, kAvx512Bf16, "0.3.21"),
            "openblas-kernels_GenuineIntel-family-6-model-207-stepping-2_avx512bf16_openblas-0.3.21.json");
  // A hypervisor that hides AVX-512, or another OpenBLAS, is another decision.
  EXPECT_NE(cache_file_name(cpu, kAvx2, "0.3.21"), cache_file_name(cpu, kAvx512Bf16, "0.3.21"));
  EXPECT_NE(cache_file_name(cpu, kAvx2, "0.3.26"), cache_file_name(cpu, kAvx2, "0.3.21"));
}

constexpr double kNow = 1.8e9;  // seconds since the epoch: any time

class Cache : public ddplab::TempDirTest {
 protected:
  const std::string file_ = "cpu.json";
  const Names candidates_ = candidate_cores(kAvx512);
};

TEST_F(Cache, MeasuresOnceThenReads) {
  int probes = 0;
  const auto probe = [&] {
    ++probes;
    return Rates{{"Haswell", 88}, {"Zen", 80}, {"SkylakeX", 104}, {"Prescott", 21}};
  };
  std::string error;
  const auto first = cached_decision(dir_ + "/made/here", file_, candidates_, "Prescott", probe, kNow, error);
  ASSERT_TRUE(first) << error;
  EXPECT_EQ(first->chosen, "SkylakeX");
  const auto second = cached_decision(dir_ + "/made/here", file_, candidates_, "Prescott", probe, kNow, error);
  ASSERT_TRUE(second) << error;
  EXPECT_EQ(probes, 1);
  EXPECT_EQ(second->chosen, "SkylakeX");
  EXPECT_EQ(describe_probe(second->chosen, second->rates, second->detected),
            describe_probe(first->chosen, first->rates, first->detected));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/made/here/" + file_ + ".tmp" + std::to_string(getpid())));
}

// A probe while the host was busy (every family slowed alike: a Zen 4 seen so) is measured again at the first start a
// while later, each family's best rate kept; two probes settle the verdict, and a busy second probe cannot undo it.
TEST_F(Cache, ASecondProbeAtALaterStartSettlesTheVerdict) {
  const Names candidates = candidate_cores(kAvx512Bf16);
  int probes = 0;
  const Rates busy{{"Haswell", 81.5}, {"Zen", 83.8}, {"SkylakeX", 85.3}, {"Cooperlake", 85.4}};
  const Rates quiet{{"Haswell", 102}, {"Zen", 99}, {"SkylakeX", 88}, {"Cooperlake", 86}};
  std::vector<Rates> measured = {busy, quiet, busy};
  const auto probe = [&] { return measured[probes++]; };
  std::string error;
  const auto decide = [&](double at) {
    const auto d = cached_decision(dir_, file_, candidates, "Cooperlake", probe, at, error);
    return d ? d->chosen + " after " + std::to_string(d->probes) : "error: " + error;
  };
  EXPECT_EQ(decide(kNow), "Cooperlake after 1");  // within 5% of the fastest: OpenBLAS's pick stands
  EXPECT_EQ(decide(kNow + kReprobeAfterS - 1), "Cooperlake after 1");  // ranks starting together: no second probe
  EXPECT_EQ(probes, 1);
  EXPECT_EQ(decide(kNow + kReprobeAfterS + 1), "Haswell after 2");
  EXPECT_EQ(decide(kNow + 1e6), "Haswell after 2");
  EXPECT_EQ(probes, 2);
  // Settled the other way round: a quiet first probe, a busy second; the best rates still choose Haswell.
  std::filesystem::remove(dir_ + "/" + file_);
  measured = {quiet, busy};
  probes = 0;
  EXPECT_EQ(decide(kNow), "Haswell after 1");
  EXPECT_EQ(decide(kNow + kReprobeAfterS + 1), "Haswell after 2");
  // A verdict written before two probes settled it (no count, no time) is measured once more, whenever it is read.
  std::ofstream(dir_ + "/" + file_) << R"({"detected": "Cooperlake", "chosen": "Cooperlake", "gflops": )"
                                    << R"({"Cooperlake": 85.4, "Haswell": 81.5}})";
  measured = {quiet};
  probes = 0;
  EXPECT_EQ(decide(kNow), "Haswell after 2");
  EXPECT_EQ(probes, 1);
}

TEST_F(Cache, DamagedOrStaleFilesAreMeasuredAgain) {
  int probes = 0;
  const auto probe = [&] {
    ++probes;
    return Rates{{"Haswell", 88}, {"SkylakeX", 104}};
  };
  std::string error;
  for (const char* text : {"not json", R"({"chosen": "SkylakeX"})",
                           R"({"detected": "Zen", "chosen": "Cooperlake", "gflops": {"Cooperlake": 99}})"}) {
    std::ofstream(dir_ + "/" + file_) << text;
    const auto d = cached_decision(dir_, file_, candidates_, "Haswell", probe, kNow, error);
    ASSERT_TRUE(d) << error;
    EXPECT_EQ(d->chosen, "SkylakeX") << text;
  }
  EXPECT_EQ(probes, 3);
}

TEST_F(Cache, NothingMeasuredOrNowhereToWrite) {
  std::string error;
  EXPECT_FALSE(cached_decision(
      dir_, file_, candidates_, "Prescott", [] { return Rates{}; }, kNow, error));
  EXPECT_NE(error.find("no candidate"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/" + file_));
  const auto probe = [] { return Rates{{"SkylakeX", 100}}; };
  std::ofstream(dir_ + "/a-file") << "";
  EXPECT_FALSE(cached_decision(dir_ + "/a-file/under", file_, candidates_, "Prescott", probe, kNow, error));
  EXPECT_NE(error.find("cannot make"), std::string::npos) << error;
  EXPECT_FALSE(cached_decision("", file_, candidates_, "Prescott", probe, kNow, error));
}

// Ranks starting together on one host: one measures, all read its verdict, though each would have measured otherwise.
TEST_F(Cache, ProcessesRacingAgree) {
  constexpr int kProcesses = 4;
  const std::string probes = dir_ + "/probes";
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    const auto probe = [&] {
      std::ofstream(probes, std::ios::app) << i << "\n";
      usleep(100000);  // a probe's length: the others arrive meanwhile
      return i % 2 ? Rates{{"Haswell", 90}, {"SkylakeX", 80}} : Rates{{"Haswell", 80}, {"SkylakeX", 90}};
    };
    std::string error;
    const auto d = cached_decision(dir_ + "/cache", file_, candidates_, "Prescott", probe, kNow, error);
    std::ofstream(dir_ + "/chosen" + std::to_string(i)) << (d ? d->chosen : "error: " + error);
    _exit(0);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::ifstream in(probes);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 1);
  std::string first;
  std::getline(std::ifstream(dir_ + "/chosen0"), first);
  EXPECT_TRUE(first == "Haswell" || first == "SkylakeX") << first;
  for (int i = 1; i < kProcesses; ++i) {
    std::string chosen;
    std::getline(std::ifstream(dir_ + "/chosen" + std::to_string(i)), chosen);
    EXPECT_EQ(chosen, first) << "process " << i;
  }
}

}  // namespace
