// The analysis of a run (analysis/: summary, blame, report, timeline) and its persistence (record/run_file.h):
// slow-rank blame on synthetic runs, one per cause; the summary; the reader against files written by the real
// writer (the summary stored equals the one recomputed from what is read back) and against bad files; the
// Chrome trace's structure.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/blame.h"
#include "analysis/diff.h"
#include "analysis/format.h"
#include "analysis/report.h"
#include "analysis/summary.h"
#include "analysis/time_use.h"
#include "analysis/timeline.h"
#include "comm/communicator.h"  // parse_links
#include "record/hdf5.h"
#include "record/run_file.h"

namespace ddplab {
namespace {

// ---- synthetic runs ---------------------------------------------------------------------------------------------

// One rank's phases in one step, ms. Phases tile the step, as in the trainer.
struct Phases {
  double data = 0.3, forward = 3, backward = 7, exposed = 0.5, optimizer = 1, extra = 0, host_work = 0, barrier = 0;
  double untimed = 0;  // part of step_ms no phase names
  double steal = 0, cpu_wait = 0;  // what the host took from the rank (within the phases)
};

constexpr int kSteps = 12;

// A run whose rank r, step s has the phases phases(r, s); two buckets, communicated during backward.
RunRecord synthetic(int world, const std::function<Phases(int, int)>& phases) {
  RunRecord run;
  run.path = "synthetic.h5";
  run.meta.world_size = world;
  run.steps = kSteps;
  run.config = {{"batch", 32},     {"grad_accum", 1},      {"bucket_mb", 25.0},
                {"overlap", true}, {"comm_dtype", "fp32"}, {"warmup_steps", 2}};
  for (int r = 0; r < world; ++r) run.meta.hostnames.push_back("host" + std::to_string(r));
  run.records.resize(static_cast<size_t>(world) * kSteps);
  run.buckets = {{0, 2, 1000, "fc2.bias,fc2.weight,fc1.bias"}, {3, 5, 500, "fc1.weight,fc0.bias,fc0.weight"}};
  run.bucket_times.resize(static_cast<size_t>(world) * kSteps * 2);

  // Ranks leave a barrier together; each step starts when the slowest rank's previous one ended (they meet in the
  // all-reduce), so start times agree across ranks up to the phases' own differences.
  std::vector<double> start(world, 0.0);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < world; ++r) {
      const Phases p = phases(r, s);
      StepRecord& x = run.records[static_cast<size_t>(r) * kSteps + s];
      x.start_ms = start[r];
      x.data_ms = p.data, x.forward_ms = p.forward, x.backward_ms = p.backward;
      x.exposed_comm_ms = p.exposed, x.optimizer_ms = p.optimizer;
      x.extra_comm_ms = p.extra, x.host_work_ms = p.host_work, x.barrier_ms = p.barrier;
      x.step_ms =
          p.data + p.forward + p.backward + p.exposed + p.optimizer + p.extra + p.host_work + p.barrier + p.untimed;
      x.loss = 2.0 - 0.01 * s;
      x.steal_ms = p.steal, x.cpu_wait_ms = p.cpu_wait;
      // Bucket 0 ready mid-backward, bucket 1 at its end; comm runs from ready to the end of the exposed wait.
      const double bwd = start[r] + p.data + p.forward;
      const double wait_end = bwd + p.backward + p.exposed;
      for (int k = 0; k < 2; ++k) {
        BucketTimes& b = run.bucket_times[(static_cast<size_t>(r) * kSteps + s) * 2 + k];
        b.ready_ms = bwd + p.backward * (k == 0 ? 0.5 : 1.0);
        b.comm_start_ms = b.ready_ms;
        b.comm_end_ms = k == 0 ? bwd + p.backward : wait_end;
      }
      x.comm_ms = wait_end - (bwd + 0.5 * p.backward);
      x.hidden_comm_ms = 0.5 * p.backward;
      start[r] += x.step_ms;
    }
  }
  return run;
}

std::vector<Finding> diagnose(const RunRecord& run) { return diagnose(run, summarize(run)); }
std::vector<std::string> blame(const RunRecord& run) { return blame(run, summarize(run)); }

Finding first_finding(const RunRecord& run) {
  const std::vector<Finding> f = diagnose(run);
  EXPECT_FALSE(f.empty());
  return f.empty() ? Finding{Cause::kBalanced, -1, ""} : f.front();
}

bool has_cause(const std::vector<Finding>& findings, Cause cause) {
  for (const Finding& f : findings)
    if (f.cause == cause) return true;
  return false;
}

std::string all_text(const RunRecord& run) {
  std::string text;
  for (const std::string& line : blame(run)) text += line + "\n";
  return text;
}

// What `ddplab report` prints for the run.
std::string report_text(const RunRecord& run) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_report(f, summarized(run));
  std::fclose(f);
  const std::string text(buf, len);
  std::free(buf);
  return text;
}

// ---- blame -------------------------------------------------------------------------------------------------------

// Run files and checkpoints from before the config's keys followed the flags read with today's keys.
TEST(RunRecord, OldConfigKeysAreReadAsTheFlagsNames) {
  nlohmann::json old = {{"hidden_dim", 1024}, {"hidden_layers", 2}, {"num_classes", 1000}, {"blas_threads", 1},
                        {"batch", 128}};
  upgrade_config_keys(old);
  EXPECT_EQ(old, (nlohmann::json{{"hidden", 1024}, {"layers", 2}, {"classes", 1000}, {"threads", 1}, {"batch", 128}}));
  nlohmann::json current = {{"hidden", 512}};
  upgrade_config_keys(current);
  EXPECT_EQ(current, (nlohmann::json{{"hidden", 512}}));
}

// The product of three ints, counted past an int: 2^30 x 2 x 2 ranks wrapped to 0 in ints.
TEST(RunRecord, TheGlobalBatchIsCountedIn64Bits) {
  RunRecord run;
  run.meta.world_size = 2;
  run.config = {{"batch", 1 << 30}, {"grad_accum", 2}};
  EXPECT_EQ(run.global_batch(), int64_t{1} << 32);
}

TEST(RunRecord, OversubscribedWhenRankZerosHostRunsMoreThreadsThanItHasCores) {
  RunRecord run = synthetic(4, [](int, int) { return Phases{}; });
  run.meta.hostnames = {"a", "a", "a", "b"};  // three ranks on rank 0's host
  run.config["threads"] = 1;
  run.meta.host_cores = 0;  // not recorded (an older file): nothing said
  EXPECT_EQ(run.oversubscribed_ranks(), 0);
  EXPECT_EQ(oversubscription_note(run), "");
  run.meta.host_cores = 3;  // 3 ranks x 1 thread on 3 cores: full, not over
  EXPECT_EQ(run.oversubscribed_ranks(), 0);
  run.meta.host_cores = 2;
  EXPECT_EQ(run.oversubscribed_ranks(), 3);
  EXPECT_EQ(oversubscription_note(run).rfind("oversubscribed: 3 ranks x 1 BLAS thread on 2 cores;", 0), 0u)
      << oversubscription_note(run);
  run.meta.host_cores = 1;  // every rank bound to one core (srun -n 3 --overcommit under task/affinity)
  EXPECT_EQ(oversubscription_note(run).rfind("oversubscribed: 3 ranks x 1 BLAS thread on 1 core;", 0), 0u)
      << oversubscription_note(run);
  run.meta.host_cores = 4;
  run.config["threads"] = 2;  // 3 x 2 threads on 4 cores
  EXPECT_EQ(run.oversubscribed_ranks(), 3);
  run.meta.device = "cuda";  // the BLAS threads do not run the steps
  EXPECT_EQ(run.oversubscribed_ranks(), 0);
}

// The report's config line says where a run's steps ran and in which precision, and the shared GPU under it.
TEST(Report, AGpuRunNamesItsDevicePrecisionAndSharing) {
  RunRecord run = synthetic(2, [](int, int) { return Phases{}; });
  EXPECT_EQ(report_text(run).find("device cuda"), std::string::npos);  // a CPU run says nothing of it
  run.meta.device = "cuda";
  run.config["precision"] = "bf16";
  run.meta.hostnames = {"vm", "vm"};
  run.meta.gpus = {"00000000:1B:00.0", "00000000:1B:00.0"};
  const std::string text = report_text(run);
  EXPECT_NE(text.find(", device cuda, precision bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("oversubscribed: 2 ranks on one GPU;"), std::string::npos) << text;
}

// A run stopped within its warm-up has no steady steps: every figure is its last step's, and each line says so.
TEST(Report, ARunStoppedWithinItsWarmUpNamesTheStepItsFiguresComeFrom) {
  RunRecord run = synthetic(2, [](int, int) { return Phases{}; });
  run.config["steps"] = 100, run.config["warmup_steps"] = 20;  // stopped after 12
  const std::string text = report_text(run);
  EXPECT_NE(text.find("no steady state (stopped within the warm-up: figures from step 11)"), std::string::npos) << text;
  size_t named = 0;
  for (size_t at = text.find("warm-up step 11"); at != std::string::npos; at = text.find("warm-up step 11", at + 1))
    ++named;
  EXPECT_EQ(named, 4u) << text;  // the median step, the per-rank, per-bucket and time-use tables
  EXPECT_NE(text.find("in 1 of 1 step,"), std::string::npos) << text;
  EXPECT_EQ(text.find("steady step"), std::string::npos) << text;
  run.config["steps"] = 12;
  EXPECT_EQ(report_text(run).find("warm-up step"), std::string::npos);
}

// One rank has no peer: whatever its engine recorded for the buckets (a GPU's epilogue, a few microseconds), the
// report shows no hidden share, overlap or exposed comm ('-'), where two ranks of the same phases show them.
TEST(Report, OneRankShowsNoHiddenShareOrOverlapWhateverItsBucketsRecorded) {
  const auto rows_with_a_share = [](const RunRecord& run) {
    std::string text = report_text(run);
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* f = open_memstream(&buf, &len);
    print_comparison(f, {summarized(run)});
    std::fclose(f);
    text += std::string(buf, len);
    std::free(buf);
    int rows = 0;  // the per-rank, time-use and comparison rows (a rank's number or the run's name first) with a %
    for (size_t at = 0, end; at < text.size(); at = end + 1) {
      end = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, end - at);
      const size_t first = line.find_first_not_of(' ');
      const bool row = first != std::string::npos && (std::isdigit(static_cast<unsigned char>(line[first])) ||
                                                      line.compare(first, 10, "synthetic ") == 0);
      rows += row && line.find('%') != std::string::npos;
    }
    return std::pair(rows, text);
  };
  const RunRecord one = synthetic(1, [](int, int) { return Phases{}; });
  ASSERT_GT(one.at(0, kSteps - 1).comm_ms, 0);
  const auto [one_rows, one_text] = rows_with_a_share(one);
  EXPECT_EQ(one_rows, 0) << one_text;
  EXPECT_NE(one_text.find("        -       -  single rank"), std::string::npos) << one_text;
  const auto [two_rows, two_text] = rows_with_a_share(synthetic(2, [](int, int) { return Phases{}; }));
  EXPECT_EQ(two_rows, 5) << two_text;  // 2 per-rank rows, 2 time-use rows, 1 comparison row
}

// A GPU run's ranks share a GPU when two of one host have the same bus id: the most such ranks is what the note and
// the blame say. Different hosts with the same bus id (each its own GPU) share nothing.
TEST(RunRecord, RanksSharingAGpuAreOnesOfOneHostWithOneBusId) {
  RunRecord run = synthetic(4, [](int, int) { return Phases{}; });
  run.meta.device = "cuda";
  run.meta.hostnames = {"a", "a", "b", "b"};
  EXPECT_EQ(run.ranks_sharing_a_gpu(), 0);  // not recorded (a CPU run, an older file)
  EXPECT_EQ(oversubscription_note(run), "");
  run.meta.gpus = {"0000:1b:00.0", "0000:2c:00.0", "0000:1b:00.0", "0000:2c:00.0"};  // one GPU each
  EXPECT_EQ(run.ranks_sharing_a_gpu(), 0);
  run.meta.gpus = {"0000:1b:00.0", "0000:1b:00.0", "0000:1b:00.0", "0000:2c:00.0"};  // host a: 2 on one
  EXPECT_EQ(run.ranks_sharing_a_gpu(), 2);
  run.meta.hostnames = {"a", "a", "a", "a"};
  EXPECT_EQ(run.ranks_sharing_a_gpu(), 3);
  EXPECT_EQ(oversubscription_note(run).rfind("oversubscribed: 3 ranks on one GPU;", 0), 0u)
      << oversubscription_note(run);
  run.meta.gpus = {"", "", "", ""};  // no bus id read: nothing claimed
  EXPECT_EQ(run.ranks_sharing_a_gpu(), 0);
}

TEST(Blame, StragglerInputNamesTheSlowRankAndTheOthersWaitInTheAllReduce) {
  // The straggler case of the lab: rank 0 sleeps 40 ms before each batch; the others wait in the all-reduce.
  const RunRecord run = synthetic(4, [](int r, int) {
    Phases p;
    if (r == 0) {
      p.data = 41;
    } else {
      p.exposed = 41;
    }
    return p;
  });
  const std::vector<Finding> findings = diagnose(run);
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].cause, Cause::kStragglerInput) << all_text(run);
  EXPECT_EQ(findings[0].rank, 0);
  EXPECT_NE(findings[0].text.find("rank 0 sets the pace"), std::string::npos) << findings[0].text;
  EXPECT_NE(findings[0].text.find("data loading takes 41.00 ms/step vs 0.30 ms median"), std::string::npos)
      << findings[0].text;
  EXPECT_NE(findings[0].text.find("in the all-reduce (exposed comm +40.50 ms/step)"), std::string::npos)
      << findings[0].text;
  // The others' long exposed comm must not read as a communication problem.
  EXPECT_FALSE(has_cause(findings, Cause::kCommBound)) << all_text(run);
  EXPECT_EQ(findings.size(), 1u) << all_text(run);
}

// On two ranks sharing two cores, the rank that waits for the straggler polls beside its backward, whose time grows
// with the wait: it is waiting, not waited for, and is no second pace-setter ("also slow ... do not wait for it
// measurably (-40.50 ms/step)").
TEST(Blame, TheRankThatWaitsForTheStragglerIsNotAlsoSlow) {
  const RunRecord run = synthetic(2, [](int r, int) {
    Phases p;
    if (r == 0) {
      p.data = 41;
    } else {
      p.exposed = 41, p.backward = 20;
    }
    return p;
  });
  const std::vector<Finding> findings = diagnose(run);
  ASSERT_FALSE(findings.empty());
  EXPECT_EQ(findings[0].cause, Cause::kStragglerInput) << all_text(run);
  for (const Finding& f : findings) EXPECT_EQ(f.text.find("also slow"), std::string::npos) << all_text(run);
}

TEST(Blame, StragglerOnTwoRanksComparesWithTheOtherRankNotTheMedianOfBoth) {
  const RunRecord run = synthetic(2, [](int r, int) {
    Phases p;
    if (r == 1) p.data = 41;
    if (r == 0) p.exposed = 41;
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kStragglerInput) << f.text;
  EXPECT_EQ(f.rank, 1) << f.text;
}

TEST(Blame, SkewedComputeNamesTheRankWithLongForwardBackward) {
  const RunRecord run = synthetic(4, [](int r, int) {
    Phases p;
    if (r == 3) {
      p.forward = 9, p.backward = 21;  // 3x the others' compute
    } else {
      p.exposed = 20.5;
    }
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kSkewedCompute) << all_text(run);
  EXPECT_EQ(f.rank, 3);
  EXPECT_NE(f.text.find("rank 3 sets the pace (skewed compute)"), std::string::npos) << f.text;
  EXPECT_NE(f.text.find("forward+backward takes 30.00 ms/step vs 10.00 ms median"), std::string::npos) << f.text;
}

// The same skew with the rank's CPUs stolen for most of it: the host's doing, said with both counters.
TEST(Blame, ComputeSkewThatStealExplainsIsCpuTaken) {
  for (const double steal : {0.0, 8.0, 12.0}) {
    const RunRecord run = synthetic(4, [steal](int r, int) {
      Phases p;
      p.cpu_wait = 0.4;  // every rank's comm thread shares its core a little
      if (r == 3) {
        p.forward = 6, p.backward = 14, p.steal = steal;  // 10 ms more compute than the others
      } else {
        p.exposed = 10.5;
      }
      return p;
    });
    const Finding f = first_finding(run);
    EXPECT_EQ(f.rank, 3);
    if (steal < 5) {  // under half the 10 ms excess: the rank's own work
      EXPECT_EQ(f.cause, Cause::kSkewedCompute) << steal << ": " << all_text(run);
      continue;
    }
    EXPECT_EQ(f.cause, Cause::kCpuTaken) << steal << ": " << all_text(run);
    EXPECT_NE(f.text.find("rank 3 sets the pace (CPU taken): its forward+backward takes 20.00 ms/step vs 10.00 ms"),
              std::string::npos)
        << f.text;
    EXPECT_NE(
        f.text.find(fmt("taken from it for %.2f ms/step vs 0.40 on the other ranks (steal %.2f", steal + 0.4, steal)),
        std::string::npos)
        << f.text;
    EXPECT_NE(f.text.find("cpu wait 0.40"), std::string::npos) << f.text;
    EXPECT_NE(f.text.find("the other ranks wait for it in the all-reduce"), std::string::npos) << f.text;
  }
}

// Waiting for a CPU of its own host (another process on its core) counts as taken too; counters a kernel lacks (-1)
// count as nothing.
TEST(Blame, ComputeSkewThatCpuWaitExplainsIsCpuTakenAndUncountedIsNothing) {
  for (const double wait : {9.0, -1.0}) {
    const RunRecord run = synthetic(2, [wait](int r, int) {
      Phases p;
      p.steal = p.cpu_wait = -1;
      if (r == 1) {
        p.forward = 6, p.backward = 14, p.cpu_wait = wait;
      } else {
        p.exposed = 10.5;
      }
      return p;
    });
    const Finding f = first_finding(run);
    EXPECT_EQ(f.rank, 1);
    EXPECT_EQ(f.cause, wait > 0 ? Cause::kCpuTaken : Cause::kSkewedCompute) << all_text(run);
    if (wait > 0) {
      EXPECT_NE(f.text.find("(steal not counted, "), std::string::npos) << f.text;
    }
  }
}

// A data straggler that also lost its CPU: the data loading is not the compute thread's work the cpu wait measures
// (a sleep here, or a loader thread), so it stays a straggler.
TEST(Blame, DataStragglerWithCpuWaitStaysAStraggler) {
  const RunRecord run = synthetic(2, [](int r, int) {
    Phases p;
    if (r == 1) {
      p.data = 20, p.cpu_wait = 15;
    } else {
      p.exposed = 20.5;
    }
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kStragglerInput) << all_text(run);
  EXPECT_EQ(f.rank, 1);
}

// Steal on every rank: no rank stands out, a finding says the host is noisy, from 5% of the step on and 5 of the
// kernel's 10 ms ticks over the steady steps (one tick over a short run is no host's habit).
TEST(Blame, StealOnEveryRankIsANoisyHost) {
  // Over 10 steady steps: of a 111.8 ms step 3%, 6%, not counted; of an 11.8 ms step 34%, but 4 ticks in all.
  for (const auto& [steal, backward] : {std::pair{4.0, 107.0}, {7.0, 107.0}, {-1.0, 107.0}, {4.0, 7.0}}) {
    const RunRecord run = synthetic(2, [steal, backward](int, int) {
      Phases p;
      p.backward = backward;
      p.steal = steal;
      return p;
    });
    const std::vector<Finding> findings = diagnose(run);
    const bool noisy = steal == 7.0;
    EXPECT_EQ(findings.front().cause, Cause::kBalanced) << all_text(run);
    EXPECT_EQ(has_cause(findings, Cause::kNoisyHost), noisy) << steal << ": " << all_text(run);
    if (noisy) {
      EXPECT_NE(findings.back().text.find("noisy host: the hypervisor ran other guests on every rank's CPUs for 7.00 "
                                          "ms/step (6% of the step"),
                std::string::npos)
          << findings.back().text;
      EXPECT_EQ(headline(findings).cause, Cause::kNoisyHost);
    }
  }
}

// Every rank's compute thread waiting for a CPU (4 ranks on 2 cores): contention, from a fifth of the step on.
TEST(Blame, EveryRankWaitingForACpuIsContention) {
  for (const double wait : {2.0, 3.0}) {  // of an 11.8 ms step: 17%, 25%
    const RunRecord run = synthetic(4, [wait](int r, int) {
      Phases p;
      p.cpu_wait = wait + 0.1 * r;
      return p;
    });
    const std::vector<Finding> findings = diagnose(run);
    EXPECT_EQ(has_cause(findings, Cause::kCpuContention), wait > 2.5) << wait << ": " << all_text(run);
    if (wait > 2.5) {
      EXPECT_NE(
          all_text(run).find(
              "CPU contention: every rank's compute thread waits 3.15 ms/step (median over ranks; 27% of the step)"),
          std::string::npos)
          << all_text(run);
    }
  }
  // One rank: no other ranks took its cores, and fewer ranks is no advice.
  const RunRecord alone = synthetic(1, [](int, int) {
    Phases p;
    p.cpu_wait = 3;
    return p;
  });
  const std::string text = all_text(alone);
  EXPECT_NE(text.find("CPU contention: the rank's compute thread waits 3.00 ms/step (25% of the step) for a CPU of its "
                      "host, behind other processes or its own threads"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("fewer ranks"), std::string::npos) << text;
}

// A tiny model's step: its wait is a third of the step but a few microseconds, which says nothing.
TEST(Blame, ATinyWaitIsNoContention) {
  const RunRecord run = synthetic(2, [](int, int) {
    Phases p;
    p.data = 0.002, p.forward = 0.01, p.backward = 0.02, p.exposed = 0.01, p.optimizer = 0.01;
    p.cpu_wait = 0.02, p.steal = 0.02;
    return p;
  });
  const std::vector<Finding> findings = diagnose(run);
  EXPECT_FALSE(has_cause(findings, Cause::kCpuContention)) << all_text(run);
  EXPECT_FALSE(has_cause(findings, Cause::kNoisyHost)) << all_text(run);
}

TEST(Blame, UniformExposedCommIsCommunicationBound) {
  const RunRecord run = synthetic(4, [](int r, int) {
    Phases p;
    p.exposed = 15 + 0.2 * r;  // every rank waits alike, half the step
    return p;
  });
  const std::vector<Finding> findings = diagnose(run);
  ASSERT_EQ(findings.size(), 1u) << all_text(run);
  EXPECT_EQ(findings[0].cause, Cause::kCommBound);
  EXPECT_EQ(findings[0].rank, -1);
  EXPECT_NE(findings[0].text.find("communication-bound: every rank waits 15.30 ms/step for the all-reduce"),
            std::string::npos)
      << findings[0].text;
  EXPECT_NE(findings[0].text.find("bf16"), std::string::npos) << findings[0].text;
  // Not "larger buckets" blindly: smaller ones may hide more; the predictor compares sizes from this run.
  EXPECT_NE(findings[0].text.find("another bucket size (--bucket-mb, now"), std::string::npos) << findings[0].text;
  EXPECT_NE(findings[0].text.find("ddplab predict"), std::string::npos) << findings[0].text;
  EXPECT_EQ(findings[0].text.find("GPU of its own"), std::string::npos) << findings[0].text;
  EXPECT_EQ(findings[0].text.find("for a CPU"), std::string::npos) << findings[0].text;

  // The same wait where every rank's compute thread also waits for a CPU: the comm thread may be waiting for one too,
  // and fewer ranks or threads come before the link's and the buckets' remedies.
  const RunRecord starved = synthetic(4, [](int r, int) {
    Phases p;
    p.exposed = 15 + 0.2 * r;
    p.cpu_wait = 6 + 0.1 * r;
    return p;
  });
  const std::string starved_text = all_text(starved);
  EXPECT_NE(starved_text.find("communication-bound: every rank waits 15.30 ms/step for the all-reduce (median over "
                              "ranks; 57% of the step); every rank's compute thread also waits 6.00 ms/step or more "
                              "for a CPU, and so may its all-reduce: fewer ranks or threads per host come first; try"),
            std::string::npos)
      << starved_text;

  // The same wait with the 4 ranks on one GPU: a GPU per rank comes first (each ring step waits for it to switch).
  RunRecord shared = run;
  shared.meta.device = "cuda";
  shared.meta.gpus.assign(4, "0000:1b:00.0");
  shared.meta.hostnames.assign(4, "vm");
  const std::vector<Finding> on_one_gpu = diagnose(shared);
  ASSERT_EQ(on_one_gpu.size(), 1u) << all_text(shared);
  EXPECT_NE(on_one_gpu[0].text.find("give each rank a GPU of its own (4 ranks share one here"), std::string::npos)
      << on_one_gpu[0].text;
  // There the fixed cost per bucket is what to cut; a 16-bit wire measured slower (its casts).
  EXPECT_NE(on_one_gpu[0].text.find("fewer, larger buckets"), std::string::npos) << on_one_gpu[0].text;
  EXPECT_EQ(on_one_gpu[0].text.find("--comm-dtype bf16"), std::string::npos) << on_one_gpu[0].text;
  // With one bucket there is nothing to merge.
  RunRecord one_bucket = shared;
  one_bucket.buckets.resize(1);
  const std::vector<Finding> single = diagnose(one_bucket);
  ASSERT_EQ(single.size(), 1u) << all_text(one_bucket);
  EXPECT_EQ(single[0].text.find("larger buckets"), std::string::npos) << single[0].text;
}

// Over 2 nodes with a slow inter-node link the same wait is named as the link's; with the link as fast as the
// node's own, or on one node, it is not.
TEST(Blame, CommunicationBoundAcrossNodesNamesTheInterNodeLink) {
  RunRecord run = synthetic(4, [](int r, int) {
    Phases p;
    p.exposed = 15 + 0.2 * r;
    return p;
  });
  run.meta.node_of_rank = {0, 0, 1, 1};
  run.meta.links = parse_links("intra=nvlink4,inter=25gbe");
  const std::string named = "exposed comm on the inter-node link (25gbe, shared by 2 ranks per NIC)";
  EXPECT_NE(all_text(run).find(named), std::string::npos) << all_text(run);
  EXPECT_NE(all_text(run).find("a faster inter-node link, --comm hier"), std::string::npos) << all_text(run);
  run.meta.links = parse_links("25gbe");  // every hop alike: no class to blame
  EXPECT_EQ(all_text(run).find("inter-node link"), std::string::npos) << all_text(run);
  run.meta.links = parse_links("intra=nvlink4,inter=25gbe");
  run.meta.node_of_rank = {0, 0, 0, 0};
  EXPECT_EQ(all_text(run).find("inter-node link"), std::string::npos) << all_text(run);
}

TEST(Blame, ExtraAllReduceOnEveryRankIsCommunicationBoundAndSaysSo) {
  const RunRecord run = synthetic(4, [](int, int) {
    Phases p;
    p.extra = 25;
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kCommBound) << all_text(run);
  EXPECT_NE(f.text.find("extra all-reduce"), std::string::npos) << f.text;
}

TEST(Blame, RankZeroWorkBeforeABarrierEveryFourSteps) {
  // rank 0 works 20 ms, then all ranks barrier, every 4th step (steps 3, 7, 11).
  const RunRecord run = synthetic(4, [](int r, int s) {
    Phases p;
    if ((s + 1) % 4 == 0) {
      if (r == 0) {
        p.host_work = 20;
      } else {
        p.barrier = 20;
      }
    }
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kWorkBeforeBarrier) << all_text(run);
  EXPECT_EQ(f.rank, 0);
  EXPECT_NE(f.text.find("rank 0 sets the pace"), std::string::npos) << f.text;
  EXPECT_NE(f.text.find("before a barrier every 4 steps (20.00 ms each time"), std::string::npos) << f.text;
  EXPECT_NE(f.text.find("wait for it at the barrier"), std::string::npos) << f.text;
}

TEST(Blame, WorkBeforeABarrierThatNoPhaseRecordsIsStillFound) {
  // A writer without host_work_ms: rank 2's work is step time outside every phase; the others wait at a barrier.
  RunRecord run = synthetic(3, [](int r, int) {
    Phases p;
    if (r == 2) {
      p.untimed = 10;
    } else {
      p.barrier = 10;
    }
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kWorkBeforeBarrier) << all_text(run);
  EXPECT_EQ(f.rank, 2);
  EXPECT_NE(f.text.find("every step"), std::string::npos) << f.text;
}

TEST(Blame, UntimedWorkWithoutABarrier) {
  const RunRecord run = synthetic(
      2,
      [](int r, int) {
        Phases p;
        if (r == 0) {
          p.untimed = 8;
        } else {
          p.exposed = 8.5;
        }
        return p;
      });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kUntimedWork) << all_text(run);
  EXPECT_EQ(f.rank, 0);
}

TEST(Blame, EveryRankWaitingForInputIsInputBound) {
  RunRecord run = synthetic(2, [](int r, int) {
    Phases p;
    p.data = 20 + r;
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kInputBound) << all_text(run);
  EXPECT_NE(f.text.find("more --loader-threads (now 0) and a deeper --prefetch (now 2)"), std::string::npos) << f.text;
  // The remedy is one the run reads: the GPU's prefetcher takes --loader-threads alone, the CPU transformer neither.
  run.config["device"] = "cuda";
  const std::string gpu = first_finding(run).text;
  EXPECT_NE(gpu.find("more --loader-threads (now 0)"), std::string::npos) << gpu;
  EXPECT_EQ(gpu.find("--prefetch"), std::string::npos) << gpu;
  run.config["device"] = "cpu";
  run.config["model"] = "tiny";
  const std::string transformer = first_finding(run).text;
  EXPECT_EQ(transformer.find("--loader-threads"), std::string::npos) << transformer;
  EXPECT_NE(transformer.find("makes its batches within the step"), std::string::npos) << transformer;
}

TEST(Blame, PaddingIsNamedWhereAFifthOfTheTokensAreIt) {
  for (const double useful_share : {0.6, 0.9}) {
    RunRecord run = synthetic(2, [](int, int) { return Phases{}; });
    for (StepRecord& x : run.records) x.padded_tokens = 1000, x.useful_tokens = 1000 * useful_share;
    const std::vector<Finding> findings = diagnose(run);
    const auto padding = std::find_if(findings.begin(), findings.end(),
                                      [](const Finding& f) { return f.cause == Cause::kPaddingBound; });
    const bool named = padding != findings.end();
    EXPECT_EQ(named, useful_share <= 1 - kPaddingBoundShare) << all_text(run);
    EXPECT_EQ(findings[0].cause, Cause::kBalanced) << "the breakdown comes first: " << all_text(run);
    EXPECT_EQ(headline(findings).cause, named ? Cause::kPaddingBound : Cause::kBalanced) << "and padding heads it";
    if (named) {
      EXPECT_NE(padding->text.find("40% of the tokens"), std::string::npos) << padding->text;
      EXPECT_NE(padding->text.find("--batching bucket"), std::string::npos) << padding->text;
    }
  }
}

TEST(Blame, BalancedRunBlamesNobody) {
  const RunRecord run = synthetic(4, [](int r, int s) {
    Phases p;
    p.backward += 0.1 * ((r + s) % 3);  // jitter well under the thresholds
    return p;
  });
  const std::vector<Finding> findings = diagnose(run);
  ASSERT_EQ(findings.size(), 1u) << all_text(run);
  EXPECT_EQ(findings[0].cause, Cause::kBalanced);
  EXPECT_NE(findings[0].text.find("no rank stands out (none spends 10% of the step more than the others on its own "
                                  "work): rank " +
                                  std::to_string(summarize(run).slowest_rank) + "'s step, the slowest, "),
            std::string::npos)
      << findings[0].text;
}

TEST(Blame, SingleRank) {
  const RunRecord run = synthetic(1, [](int, int) { return Phases{}; });
  EXPECT_EQ(first_finding(run).cause, Cause::kSingleRank);
}

TEST(Blame, WarmUpStepsAreIgnored) {
  // A slow first steps on rank 1 (warm-up) must not be blamed.
  const RunRecord run = synthetic(2, [](int r, int s) {
    Phases p;
    if (s < 2 && r == 1) p.data = 500;
    return p;
  });
  EXPECT_EQ(first_finding(run).cause, Cause::kBalanced) << all_text(run);
}

TEST(Summary, ThroughputFromTheSlowestRank) {
  const RunRecord run = synthetic(2, [](int r, int) {
    Phases p;
    p.optimizer = r == 1 ? 3.2 : 1.2;  // steps of 12 and 14 ms
    return p;
  });
  const RunSummary st = summarize(run);
  EXPECT_EQ(st.slowest_rank, 1);
  EXPECT_NEAR(st.slowest_step_ms, 14.0, 1e-9);
  EXPECT_NEAR(st.samples_per_s, 64 / 0.014, 1e-6);
  EXPECT_NEAR(st.mean_spread_ms, 2.0, 1e-9);
  EXPECT_EQ(st.first_steady_step, 2);
  EXPECT_EQ(st.steady_steps(), kSteps - 2);
  ASSERT_EQ(st.ranks.size(), 2u);
  EXPECT_NEAR(st.ranks[1].optimizer_ms, 3.2, 1e-12);
  EXPECT_EQ(st.ranks[1].start_ms, 0.0);  // a point in time has no mean
  // Bucket 1 is ready at the end of backward: comm = backward/2 + exposed, hidden = backward/2 of min(bwd, comm).
  EXPECT_NEAR(st.hidden_fractions[0], 3.5 / 4.0, 1e-12);
}

// What backward could hide: with gradient accumulation only the last micro-batch's backward runs beside the
// all-reduces, and --zero-stage 1's all-gathers come after the update, where no backward runs.
TEST(Summary, TheHiddenShareCountsOnlyTheBackwardAndCommunicationThatCanOverlap) {
  // Backward 4 ms over 2 micro-batches (the last: 2 ms); comm 3 ms, 1.5 of them hidden.
  RunRecord run = synthetic(1, [](int, int) {
    Phases p;
    p.backward = 4;
    return p;
  });
  run.config["grad_accum"] = 2;
  for (StepRecord& x : run.records) x.comm_ms = 3, x.hidden_comm_ms = 1.5;
  EXPECT_NEAR(summarize(run).hidden_fractions[0], 1.5 / 2.0, 1e-12) << "of the last micro-batch's 2 ms (an older file)";
  // Micro-batches of unequal sizes (a token budget): the last backward as measured, not half of the step's.
  for (StepRecord& x : run.records) x.last_backward_ms = 2.5;
  EXPECT_NEAR(summarize(run).hidden_fractions[0], 1.5 / 2.5, 1e-12) << "of the last micro-batch's measured 2.5 ms";
  for (StepRecord& x : run.records) x.last_backward_ms = 0;
  // A 2.5 ms all-gather of bucket 0 after the update: 0.5 ms of comm was hideable, all of it hidden.
  for (int s = 0; s < kSteps; ++s) {
    BucketTimes& gather = run.bucket_times[static_cast<size_t>(s) * run.buckets.size()];
    gather.gather_start_ms = 100, gather.gather_end_ms = 102.5;
    run.records[s].hidden_comm_ms = 0.5;
  }
  EXPECT_NEAR(summarize(run).hidden_fractions[0], 1.0, 1e-12);
}

// The median step: each step as long as its slowest rank, the median over the steady steps (2..11 here). Rank 1 is
// slow on 7 of them (the steps not a multiple of 3), rank 0 on step 5 by far: the mean moves with that one step, the
// median does not.
TEST(Summary, TheMedianStepIsOverEachStepsSlowestRank) {
  RunRecord run = synthetic(2, [](int r, int s) {
    Phases p;
    p.forward = 10 + (r == 1 && s % 3 != 0 ? 2 : 0) + (r == 0 && s == 5 ? 100 : 0);
    return p;
  });
  const RunSummary s = summarize(run);
  std::vector<double> slowest;
  for (int t = 2; t < kSteps; ++t) slowest.push_back(std::max(run.at(0, t).step_ms, run.at(1, t).step_ms));
  std::sort(slowest.begin(), slowest.end());
  EXPECT_DOUBLE_EQ(s.median_step_ms, (slowest[4] + slowest[5]) / 2);
  EXPECT_DOUBLE_EQ(s.median_step_ms, run.at(1, 4).step_ms) << "the slow rank's steps, 6 of the 10 but step 5";
  EXPECT_GT(s.slowest_step_ms, s.median_step_ms + 5) << "the mean carries step 5's 100 ms";
}

TEST(Summary, SamplesPerSecondFromTheSamplesTheRanksRecorded) {
  // A token budget per batch (--batching token): the ranks' sample counts vary by step and rank, and the config's
  // batch (32 a rank: 64 a step) says nothing about them.
  RunRecord run = synthetic(2, [](int, int) { return Phases{}; });  // 11.8 ms steps
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < kSteps; ++t) run.records[static_cast<size_t>(r) * kSteps + t].samples = 10 + r + t % 2;
  const RunSummary st = summarize(run);
  double recorded = 0;  // over the steady steps 2..11 and both ranks, per step
  for (int r = 0; r < 2; ++r)
    for (int t = 2; t < kSteps; ++t) recorded += 10 + r + t % 2;
  recorded /= kSteps - 2;
  EXPECT_NEAR(st.samples_per_step, recorded, 1e-12);
  EXPECT_NEAR(st.samples_per_s, recorded / 0.0118, 1e-6);
  EXPECT_EQ(st.batch_text(), "22.0 samples per step (a mean: a token budget, or an epoch's short step)");
  // Files that recorded no samples count the global batch.
  EXPECT_EQ(summarize(synthetic(2, [](int, int) { return Phases{}; })).batch_text(), "global batch 64");
}

TEST(Summary, WarmUpIsClampedSoThatOneStepCounts) {
  RunRecord run = synthetic(2, [](int, int) { return Phases{}; });
  run.config["warmup_steps"] = 100;
  EXPECT_EQ(summarize(run).first_steady_step, kSteps - 1);
  run.config["warmup_steps"] = -3;
  EXPECT_EQ(summarize(run).first_steady_step, 0);
}

// ---- timeline ----------------------------------------------------------------------------------------------------

// ---- time use: overlap, idle time, bucket arrival ---------------------------------------------------------------

// The synthetic run's comm: bucket 0 from mid-backward to its end, bucket 1 through the exposed wait. With a
// --zero-stage 1 all-gather in the optimizer on rank 1, HTA's overlap counts it (the optimizer computes) where
// hidden% (overlap with backward) does not.
TEST(TimeUse, OverlapIsComputingWhileCommunicatingOverCommunicating) {
  RunRecord run = synthetic(2, [](int, int) { return Phases{}; });
  for (int s = 0; s < kSteps; ++s) {
    const StepRecord& x = run.at(1, s);
    const double optimizer_start = x.start_ms + 0.3 + 3 + 7 + 0.5;
    BucketTimes& b = run.bucket_times[(static_cast<size_t>(1) * kSteps + s) * 2 + 0];
    b.gather_start_ms = optimizer_start + 0.25, b.gather_end_ms = optimizer_start + 0.75;  // inside the optimizer
  }
  const RunSummary st = summarize(run);
  ASSERT_EQ(st.time_use.size(), 2u);
  // Rank 0: comm [bwd + 3.5, bwd + 7.5) = 4 ms, of which backward's last 3.5 ms computed beside it.
  EXPECT_NEAR(st.time_use[0].comm_ms, 4.0, 1e-9);
  EXPECT_NEAR(st.time_use[0].overlapped_ms, 3.5, 1e-9);
  EXPECT_NEAR(st.time_use[0].overlap(), 3.5 / 4.0, 1e-12);
  // Rank 1: + 0.5 ms of all-gather, all of it beside the optimizer.
  EXPECT_NEAR(st.time_use[1].comm_ms, 4.5, 1e-9);
  EXPECT_NEAR(st.time_use[1].overlap(), 4.0 / 4.5, 1e-12);
  EXPECT_NEAR(st.time_use[1].computing_ms, 3 + 7 + 1, 1e-9);
  // No comm (one rank): no overlap to speak of.
  EXPECT_EQ(RankTimeUse{}.overlap(), 0.0);
}

TEST(TimeUse, IdleTimeIsWaitingForDataForPeersAndHostWork) {
  const RunRecord run = synthetic(2, [](int r, int) {
    Phases p;
    if (r == 0) p.extra = 1, p.host_work = 2, p.barrier = 0.7, p.untimed = 0.4;
    return p;
  });
  const RunSummary st = summarize(run);
  const RankTimeUse& u = st.time_use[0];
  EXPECT_NEAR(u.idle_data_ms, 0.3, 1e-9);              // data
  EXPECT_NEAR(u.idle_peers_ms, 0.5 + 1 + 0.7, 1e-9);   // exposed comm + extra all-reduce + barrier
  EXPECT_NEAR(u.idle_host_ms, 2 + 0.4, 1e-9);          // host work + untimed
  // Compute and idle tile the step.
  EXPECT_NEAR(u.computing_ms + u.idle_ms(), st.ranks[0].step_ms, 1e-9);
  EXPECT_NEAR(st.time_use[1].idle_ms(), 0.3 + 0.5, 1e-9);
  const nlohmann::json j = to_json(st)["ranks"][0]["time_use"];
  EXPECT_DOUBLE_EQ(j["idle"]["peers_ms"].get<double>(), u.idle_peers_ms);
  EXPECT_DOUBLE_EQ(j["overlap"].get<double>(), u.overlap());
}

// Bucket 0: rank 1 ready 2 ms after rank 0 and rank 2 0.5 ms after, in steady steps 2..9; in steps 10 and 11 rank 2
// is 3 ms late instead. Rank 1 is last in 8 of the 10 steady steps; median spread 2 ms; its lead over rank 2 1.5 ms.
TEST(TimeUse, BucketArrivalNamesTheLastRankAndByHowMuch) {
  RunRecord run = synthetic(3, [](int, int) { return Phases{}; });
  for (int s = 0; s < kSteps; ++s) {
    run.bucket_times[(static_cast<size_t>(1) * kSteps + s) * 2].ready_ms += s == 0 ? 50 : 2.0;  // warm-up: ignored
    run.bucket_times[(static_cast<size_t>(2) * kSteps + s) * 2].ready_ms += s >= 10 ? 3.0 : 0.5;
  }
  const RunSummary st = summarize(run);
  ASSERT_EQ(st.arrivals.size(), 2u);
  EXPECT_EQ(st.arrivals[0].last_rank, 1);
  EXPECT_EQ(st.arrivals[0].last_steps, 8);
  EXPECT_NEAR(st.arrivals[0].spread_ms, 2.0, 1e-9);
  EXPECT_NEAR(st.arrivals[0].lead_ms, 1.5, 1e-9);
  EXPECT_NEAR(st.arrivals[1].spread_ms, 0.0, 1e-9);  // every rank at once
  EXPECT_EQ(to_json(st)["bucket_arrival"][0]["last_rank"], 1);
  const std::string text = report_text(run);
  EXPECT_NE(text.find("last to have a bucket ready: rank 1, bucket 0 in 8 of 10 steady steps, 2.00 ms after the first "
                      "rank (median; 1.50 ms after the next-latest)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("time use per rank"), std::string::npos);
  // One rank: nobody to arrive after.
  EXPECT_EQ(summarize(synthetic(1, [](int, int) { return Phases{}; })).arrivals[0].last_rank, -1);
}

// The exposed wait cut into the buckets still finishing when backward ended, the closing bucket alone, and the rest.
TEST(Report, ExposedCommIsSplitIntoTheBacklogAndTheClosingBucket) {
  RunRecord run = synthetic(2, [](int, int) {
    Phases p;
    p.exposed = 6;
    return p;
  });
  // Bucket 0 still runs 3 ms past backward's end; bucket 1 then runs 2 ms alone; 1 ms of the wait is neither.
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < kSteps; ++s) {
      const StepRecord& x = run.records[static_cast<size_t>(r) * kSteps + s];
      const double backward_end = x.start_ms + x.data_ms + x.forward_ms + x.backward_ms;
      BucketTimes* b = &run.bucket_times[(static_cast<size_t>(r) * kSteps + s) * 2];
      b[0].comm_end_ms = backward_end + 3;
      b[1].comm_start_ms = b[0].comm_end_ms;
      b[1].comm_end_ms = backward_end + 5;
    }
  const std::string text = report_text(run);
  EXPECT_NE(text.find("exposed 6.00 ms a step: 3.00 finishing buckets 0..0 (1.0 of the 1 still running when backward "
                      "ended), 2.00 the closing bucket (1) alone, 1.00 the rest"),
            std::string::npos)
      << text;
  // One rank exposes nothing to split.
  EXPECT_EQ(report_text(synthetic(1, [](int, int) { return Phases{}; })).find("a step: "), std::string::npos);
}

// ---- diff -------------------------------------------------------------------------------------------------------

TEST(Diff, MedianAndRobustSpreadIgnoreOneSlowStep) {
  const Sampled s = sampled({1, 2, 3, 4, 100});  // deviations from 3: 2 1 0 1 97, their median 1
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.spread, 1.4826);
  EXPECT_DOUBLE_EQ(sampled({5, 1, 3, 7}).median, 4.0);
}

TEST(Diff, BeyondNoiseIsKSpreadsCombinedAndAboveTheFloor) {
  const Sampled a{10, 1};
  const double combined = kNoiseSpreads * std::sqrt(2.0);
  EXPECT_TRUE(beyond_noise(a, {10 + combined + 0.01, 1}, 0.05));
  EXPECT_FALSE(beyond_noise(a, {10 + combined - 0.01, 1}, 0.05));
  EXPECT_TRUE(beyond_noise(a, {10 - combined - 0.01, 1}, 0.05));  // either way
  // No spread at all (a synthetic or very quiet run): the floor decides.
  EXPECT_FALSE(beyond_noise({10, 0}, {10.04, 0}, 0.05));
  EXPECT_TRUE(beyond_noise({10, 0}, {10.06, 0}, 0.05));
}

// Steps that scatter widely on a busy host, yet every one of B's slower than every one of A's (A 30..58 ms, B
// 70..196): beyond the noise though the spreads' bound (~164 ms) is not passed, either way round; not with fewer than
// kApartSamples steps each, nor where one step of B falls among A's.
TEST(Diff, RunsWhoseStepsAreApartDifferWhateverTheSpreads) {
  std::vector<double> a, b;
  for (int i = 0; i < kApartSamples; ++i) a.push_back(30 + 4 * i), b.push_back(70 + 18 * i);
  EXPECT_GT(noise_bound_ms(sampled(a), sampled(b)), sampled(b).median - sampled(a).median);
  EXPECT_TRUE(apart(sampled(a), sampled(b)));
  EXPECT_TRUE(beyond_noise(sampled(a), sampled(b), 0.05));
  EXPECT_TRUE(beyond_noise(sampled(b), sampled(a), 0.05));
  EXPECT_FALSE(beyond_noise(sampled(a), sampled(b), 100.0));  // the floor still decides what is too small to matter
  std::vector<double> fewer_a(a.begin() + 1, a.end()), fewer_b(b.begin() + 1, b.end());
  EXPECT_FALSE(beyond_noise(sampled(fewer_a), sampled(fewer_b), 0.05));
  b.front() = 50;
  EXPECT_FALSE(beyond_noise(sampled(a), sampled(b), 0.05));
}

// Backward jitters 7.0 / 7.1 / 7.2 ms with the step (medians 7.1 over steady steps 2..11), so spreads are not zero.
Phases jittered(int, int s) {
  Phases p;
  p.backward = 7 + 0.1 * (s % 3);
  return p;
}

// The step is each step's slowest rank, the median step report prints, not the step of the rank the others waited
// for: rank 1 loads its data 5 ms longer, rank 0 waits for it in exposed comm and then spends 1 ms untimed, so rank
// 0's step is the longer by 1 ms and rank 1 is the one the others waited for.
TEST(Diff, TheStepIsTheMedianStepReportGives) {
  const RunRecord run = synthetic(2, [](int r, int s) {
    Phases p = jittered(r, s);
    if (r == 1) {
      p.data += 5;
    } else {
      p.exposed += 5;
      p.untimed += 1;
    }
    return p;
  });
  const RunDiff d = diff_runs(run, run);
  EXPECT_DOUBLE_EQ(d.metrics.front().a.median, summarize(run).median_step_ms);
  const MetricDiff& data =
      *std::find_if(d.metrics.begin(), d.metrics.end(), [](const MetricDiff& m) { return m.name == "data"; });
  EXPECT_DOUBLE_EQ(data.a.median, 5.3);  // the straggler's, on the rank the others waited for
}

TEST(Diff, TheSameRunTwiceIsNoDifferenceBeyondNoise) {
  const RunRecord a = synthetic(2, jittered);
  const RunDiff d = diff_runs(a, a);
  EXPECT_TRUE(d.config.empty());
  EXPECT_TRUE(d.same_buckets);
  EXPECT_EQ(d.verdict.rfind("no difference beyond noise in the step (median A 11.90 ms, B 11.90 ms)", 0), 0u) << d.verdict;
  for (const MetricDiff& m : d.metrics) EXPECT_FALSE(m.beyond) << m.name;
  EXPECT_TRUE(d.loss.compared());
  EXPECT_EQ(d.loss.first_difference, -1);
  EXPECT_EQ(d.loss.first, 0);
  EXPECT_EQ(d.loss.count, kSteps);
}

// B's backward scatters over 7 / 17 / 27 ms: its median step is 9.9 ms longer, far more than a tenth of A's, yet inside
// the noise rule's bound (3 x ~14.8 ms). Not "the same": the verdict says the scatter hides it.
TEST(Diff, ALargeDifferenceTheScatterHidesIsSaidToBeHidden) {
  const RunDiff d = diff_runs(synthetic(2, jittered), synthetic(2, [](int, int s) {
                                Phases p;
                                p.backward = 7 + 10 * (s % 3);
                                return p;
                              }));
  const MetricDiff& step = d.metrics.front();
  EXPECT_FALSE(step.beyond);
  EXPECT_GE(step.delta(), 0.1 * step.a.median);
  EXPECT_EQ(d.verdict.rfind("no difference beyond noise in the step", 0), 0u) << d.verdict;
  EXPECT_NE(d.verdict.find("; the steps scatter too much to call +9.9 ms (a difference must pass 44.48 ms, or every "
                           "step of one run be slower than every step of the other): a quieter host would tell"),
            std::string::npos)
      << d.verdict;
  // The same run twice says nothing of the kind.
  EXPECT_EQ(diff_runs(synthetic(2, jittered), synthetic(2, jittered)).verdict.find("scatter"), std::string::npos);
}

// The losses compared bit for bit, rank by rank: the first step where any rank's differs (here one ulp on rank 1 at
// step 5), and the largest relative difference over the steps (1e-3 on rank 0 at step 8).
TEST(Diff, LossesThatDifferAreNamedFromTheirFirstStep) {
  const RunRecord a = synthetic(2, jittered);
  RunRecord b = a;
  double& ulp_off = b.records[static_cast<size_t>(1) * kSteps + 5].loss;
  ulp_off = std::nextafter(ulp_off, 10.0);
  b.records[8].loss *= 1.001;
  const RunDiff d = diff_runs(a, b);
  ASSERT_TRUE(d.loss.compared());
  EXPECT_EQ(d.loss.first_difference, 5);
  EXPECT_EQ(d.loss.rank, 1);
  EXPECT_EQ(d.loss.a, a.at(1, 5).loss);
  EXPECT_EQ(d.loss.b, ulp_off);
  EXPECT_NEAR(d.loss.max_relative, 0.001 / 1.001, 1e-12);
  // A NaN against a number is an infinite difference; NaN against NaN, the same bits, none.
  b = a;
  b.records[3].loss = NAN;
  EXPECT_EQ(diff_runs(a, b).loss.max_relative, INFINITY);
  EXPECT_EQ(diff_runs(b, b).loss.first_difference, -1);
}

// A run resumed from a checkpoint at step 4 is compared with the uninterrupted one on the steps both recorded, by step
// number; runs of different world sizes (each rank's loss is over its own shard) are not compared.
TEST(Diff, AResumedRunIsComparedOnTheStepsBothRecorded) {
  const RunRecord a = synthetic(2, jittered);
  RunRecord resumed = a;
  resumed.meta.first_step = 4;
  resumed.steps = kSteps - 4;
  resumed.records.clear();
  for (int r = 0; r < 2; ++r)
    for (int step = 4; step < kSteps; ++step) resumed.records.push_back(a.at(r, step));
  resumed.bucket_times.resize(static_cast<size_t>(2) * resumed.steps * 2);
  LossDiff d = diff_runs(a, resumed).loss;
  EXPECT_TRUE(d.compared());
  EXPECT_EQ(d.first, 4);
  EXPECT_EQ(d.count, kSteps - 4);
  EXPECT_EQ(d.first_difference, -1);
  resumed.records[3].loss += 1;  // rank 0, step 7
  d = diff_runs(a, resumed).loss;
  EXPECT_EQ(d.first_difference, 7);
  resumed.meta.first_step = kSteps;  // starts where A ends
  d = diff_runs(a, resumed).loss;
  EXPECT_FALSE(d.compared());
  EXPECT_EQ(d.not_compared, "no step in common (A steps 0..11, B 12..19)");
}

// Runs of different world sizes, in files without the ranks' loss terms: compared on the mean over ranks, the global
// loss where every rank's shard holds as many samples and tokens (one rank against two with the same global batch);
// not compared where a shard differs.
TEST(Diff, RunsOfOtherWorldSizesWithoutLossTermsAreComparedOnTheMeanOverRanks) {
  RunRecord two = synthetic(2, jittered), one = synthetic(1, jittered);
  for (int s = 0; s < kSteps; ++s) {
    two.records[s].loss = 2.0 + 0.5 / (s + 1);                          // rank 0
    two.records[kSteps + s].loss = 2.0 - 0.5 / (s + 1);                 // rank 1
    one.records[s].loss = (two.at(0, s).loss + two.at(1, s).loss) / 2;  // their mean, in rank order
    for (RunRecord* run : {&two, &one})
      for (int r = 0; r < run->world_size(); ++r) run->records[static_cast<size_t>(r) * kSteps + s].samples = 32;
  }
  LossDiff d = diff_runs(one, two).loss;
  ASSERT_TRUE(d.compared()) << d.not_compared;
  EXPECT_TRUE(d.rank_means);
  EXPECT_EQ(d.first_difference, -1);
  one.records[6].loss *= 1 + 1e-6;
  d = diff_runs(one, two).loss;
  EXPECT_EQ(d.first_difference, 6);
  EXPECT_EQ(d.rank, -1);
  EXPECT_NEAR(d.max_relative, 1e-6, 1e-9);
  two.records[kSteps + 3].samples = 31;  // rank 1's shard of step 3 is smaller: the mean is no longer the global loss
  d = diff_runs(one, two).loss;
  EXPECT_FALSE(d.compared());
  EXPECT_NE(d.not_compared.find("A ran 1 rank, B 2, and some rank's shard held another number"), std::string::npos)
      << d.not_compared;
}

// Ranks holding different numbers of loss terms (variable lengths): the global-batch loss weighs each rank's mean by
// its terms, in the summary and in diff, which then compares one rank with two even though their shards differ.
TEST(Diff, RunsOfOtherWorldSizesAreComparedOnTheLossWeightedByEachRanksTerms) {
  RunRecord two = synthetic(2, jittered), one = synthetic(1, jittered);
  for (int s = 0; s < kSteps; ++s) {
    StepRecord& rank0 = two.records[s];
    StepRecord& rank1 = two.records[kSteps + s];
    rank0.loss = 2.0 + 0.5 / (s + 1), rank0.loss_terms = 21, rank0.samples = 3;
    rank1.loss = 1.0 - 0.5 / (s + 2), rank1.loss_terms = 2, rank1.samples = 1;
    one.records[s].loss = (21 * rank0.loss + 2 * rank1.loss) / 23;
    one.records[s].loss_terms = 23, one.records[s].samples = 4;
  }
  const double last0 = two.at(0, kSteps - 1).loss, last1 = two.at(1, kSteps - 1).loss;
  EXPECT_DOUBLE_EQ(summarize(two).final_loss, (21 * last0 + 2 * last1) / 23);
  EXPECT_GT(std::fabs(summarize(two).final_loss - (last0 + last1) / 2), 0.1) << "not the plain mean over ranks";
  LossDiff d = diff_runs(one, two).loss;
  ASSERT_TRUE(d.compared()) << d.not_compared;
  EXPECT_TRUE(d.rank_means);
  EXPECT_LT(d.max_relative, 1e-15);
  one.records[6].loss *= 1 + 1e-6;
  d = diff_runs(one, two).loss;
  EXPECT_EQ(d.first_difference, 6);
  EXPECT_EQ(d.rank, -1);
  EXPECT_NEAR(d.max_relative, 1e-6, 1e-9);
}

TEST(Diff, MoreExposedCommIsNamedWithTheSettingThatChanged) {
  const RunRecord a = synthetic(2, jittered);
  RunRecord b = synthetic(2, [](int r, int s) {
    Phases p = jittered(r, s);
    p.exposed = 5.5;
    return p;
  });
  b.config["bucket_mb"] = 5.0;
  const RunDiff d = diff_runs(a, b);
  ASSERT_EQ(d.config.size(), 1u);
  EXPECT_EQ(d.config[0].key, "bucket_mb");
  // Step medians 11.9 -> 16.9 ms: 42% slower.
  EXPECT_EQ(d.verdict, "B is 42% slower: exposed comm +5.0 ms (bucket_mb 25.0 -> 5.0); compute unchanged");
  // Bucket 1 is what runs through the exposed wait: its all-reduce is 5 ms longer; bucket 0's is unchanged.
  ASSERT_EQ(d.buckets.size(), 2u);
  EXPECT_FALSE(d.buckets[0].beyond);
  EXPECT_TRUE(d.buckets[1].beyond);
  EXPECT_NEAR(d.buckets[1].b.median - d.buckets[1].a.median, 5.0, 1e-9);
  const nlohmann::json j = to_json(d);
  EXPECT_EQ(j["verdict"], d.verdict);
  EXPECT_EQ(j["metrics"][0]["name"], "step");
  EXPECT_TRUE(j["metrics"][0]["beyond_noise"].get<bool>());
}

// Where files went, what was printed, and a fault's step where neither run injects one are no cause of a time
// difference: only the setting that changes a step is named. A fault's step where one run injects it is.
TEST(Diff, SettingsThatChangeNoStepAreNotNamed) {
  const RunRecord a = synthetic(2, jittered);
  RunRecord b = a;
  b.config["checkpoint"] = "ck.h5";
  b.config["resume"] = "old.h5";
  b.config["log_every"] = 5;
  b.config["fault_step"] = 3;
  b.config["bucket_mb"] = 5.0;
  RunDiff d = diff_runs(a, b);
  ASSERT_EQ(d.config.size(), 1u);
  EXPECT_EQ(d.config[0].key, "bucket_mb");
  b.config["fault"] = "hang";
  d = diff_runs(a, b);
  std::vector<std::string> keys;
  for (const ConfigChange& c : d.config) keys.push_back(c.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"bucket_mb", "fault", "fault_step"}));
}

// --ring-link auto against the link it resolved to is the same run; against another link it is a change.
TEST(Diff, ARingLinkIsTheOneEachRunTravelledOver) {
  RunRecord a = synthetic(2, jittered);
  a.config["ring_link"] = "auto";
  a.meta.transport = "ring/ipc";
  RunRecord b = a;
  b.config["ring_link"] = "ipc";
  EXPECT_TRUE(diff_runs(a, b).config.empty());
  b.meta.transport = "ring/host";
  b.config["ring_link"] = "host";
  const RunDiff d = diff_runs(a, b);
  ASSERT_EQ(d.config.size(), 1u);
  EXPECT_EQ(d.config[0].key, "ring_link");
}

// Two ranks, rank 1 loading each batch `ms` longer and rank 0 waiting as long for it in the all-reduce.
RunRecord with_straggler(double ms) {
  return synthetic(2, [ms](int r, int s) {
    Phases p = jittered(r, s);
    if (r == 1) p.data += ms;
    if (r == 0) p.exposed += ms;
    return p;
  });
}

// Backward shorter and forward as much longer: each phase passes its own noise bound, their sum does not. The verdict
// says so rather than "compute unchanged" after naming one of them.
TEST(Diff, ComputePhasesThatMovedAreNotCalledUnchanged) {
  const RunRecord a = synthetic(2, jittered);
  const RunRecord b = synthetic(2, [](int r, int s) {
    Phases p = jittered(r, s);
    p.backward -= 2, p.forward += 2, p.exposed += 5;
    return p;
  });
  const RunDiff d = diff_runs(a, b);
  EXPECT_EQ(d.verdict, "B is 42% slower: exposed comm +5.0 ms, forward +2.0 ms; compute +0.00 ms (within noise)");
}

// A step 1.998x as long reads "2.0x slower", as rounded, not "100% slower".
TEST(Diff, ANearlyDoubledStepIsARatio) {
  const RunRecord a = synthetic(2, jittered);  // median step 11.9 ms
  const RunRecord b = synthetic(2, [](int r, int s) {
    Phases p = jittered(r, s);
    p.exposed += 11.9 - 0.02;
    return p;
  });
  const RunDiff d = diff_runs(a, b);
  EXPECT_EQ(d.verdict.rfind("B is 2.0x slower: exposed comm +11.9 ms", 0), 0u) << d.verdict;
}

// A straggler's extra data loading is the other rank's wait: the diff takes each step's phases on the rank the others
// waited for, so it names the data loading, not the wait.
TEST(Diff, AStragglerIsNamedByItsOwnWorkNotByTheOthersWait) {
  const RunRecord a = synthetic(2, jittered);
  RunRecord b = with_straggler(20);
  b.config["straggler_ms"] = 20.0;
  const RunDiff d = diff_runs(a, b);
  EXPECT_EQ(d.verdict.rfind("B is 2.7x slower: data +20.0 ms (straggler_ms unset -> 20.0); compute unchanged", 0), 0u)
      << d.verdict;
  const MetricDiff& data = d.metrics[1];
  EXPECT_EQ(data.name, "data");
  EXPECT_NEAR(data.rank_spread_b, 20.0, 1e-9);
}

// A cost of every 4th step (20 ms of rank 0's host work, the others waiting in the barrier) has a median of 0 over
// the steps: the diff still shows its row, marks it and the step +, gives their means, and the verdict says the mean
// step moved where the medians cannot.
TEST(Diff, ACostOfSomeStepsOnlyIsShownByItsMean) {
  RunRecord b = synthetic(2, [](int r, int s) {
    Phases p = jittered(r, s);
    if (s % 4 == 0) (r == 0 ? p.host_work : p.barrier) = 20;
    return p;
  });
  b.config["barrier_every"] = 4;
  const RunDiff d = diff_runs(synthetic(2, jittered), b);
  const auto metric = [&](const std::string& name) {
    return *std::find_if(d.metrics.begin(), d.metrics.end(), [&](const MetricDiff& m) { return m.name == name; });
  };
  EXPECT_EQ(metric("host work").b.median, 0);
  EXPECT_NEAR(metric("host work").mean_b, 20.0 * 2 / 10, 1e-9);  // steady steps 2..11: 4 and 8 of 10 have it
  EXPECT_TRUE(metric("host work").median_misses(d.floor_ms) && metric("step").median_misses(d.floor_ms));
  EXPECT_FALSE(metric("forward").median_misses(d.floor_ms) || metric("backward").median_misses(d.floor_ms));
  EXPECT_NE(d.verdict.find("; but the mean step went 11.91 -> 15.91 ms (+: a cost of some steps only"),
            std::string::npos)
      << d.verdict;
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_diff(f, d);
  std::fclose(f);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("host work: A 0.00, B 4.00)"), std::string::npos) << text;
  // Where neither run has a cost of some steps, no mark and no note; where both have the same, the rows are marked
  // but the verdict says nothing of means that did not move.
  EXPECT_EQ(diff_runs(synthetic(2, jittered), synthetic(2, jittered)).verdict.find("mean step"), std::string::npos);
  const RunDiff same = diff_runs(b, b);
  EXPECT_TRUE(same.metrics.front().median_misses(same.floor_ms));
  EXPECT_EQ(same.verdict.find("mean step"), std::string::npos) << same.verdict;
}

// A run on token shards against one on synthetic sequences: the data line names the change ("none" where no --data
// was given), and the synthetic sequences' knobs, which the shards' run stores as its windows' shape, are left out.
TEST(Diff, TokenShardsAgainstSyntheticSequencesNameTheDataOnly) {
  RunRecord a = synthetic(2, jittered), b = synthetic(2, jittered);
  a.config.update({{"data", ""}, {"lengths", "loguniform"}, {"min_len", 64}, {"epoch_size", 65536}, {"lr", 0.001}});
  b.config.update({{"data", "lic.bin"}, {"lengths", "fixed"}, {"min_len", 256}, {"epoch_size", 0}, {"lr", 0.002}});
  std::vector<std::string> keys;
  for (const ConfigChange& c : diff_runs(a, b).config) keys.push_back(c.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"data", "lr"}));
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_diff(f, diff_runs(a, b));
  std::fclose(f);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("data                   none -> lic.bin"), std::string::npos) << text;
  // Between two synthetic runs the same knobs are what changed.
  b.config["data"] = "";
  keys.clear();
  for (const ConfigChange& c : diff_runs(a, b).config) keys.push_back(c.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"epoch_size", "lengths", "lr", "min_len"}));
}

// From ten times as long the ratio is written whole: "167x slower", not "166.8x".
TEST(Diff, ARatioOfTenOrMoreIsWrittenWhole) {
  const RunDiff d = diff_runs(synthetic(2, jittered), with_straggler(300));
  const double ratio = d.metrics[0].b.median / d.metrics[0].a.median;
  ASSERT_GE(ratio, 10);
  char expected[64];
  std::snprintf(expected, sizeof expected, "B is %.0fx slower: data +300.0 ms", ratio);
  EXPECT_EQ(d.verdict.rfind(expected, 0), 0u) << d.verdict;
}

// The same two runs the other way round read alike: "2.7x faster", not "63% faster" (which reads as 1.63x).
TEST(Diff, AStepHalfAsLongOrLessIsWrittenAsARatioToo) {
  RunRecord slow = with_straggler(20);
  slow.config["straggler_ms"] = 20.0;
  const RunDiff d = diff_runs(slow, synthetic(2, jittered));
  const double times = d.metrics[0].a.median / d.metrics[0].b.median;
  ASSERT_GE(times, 2);
  char expected[64];
  std::snprintf(expected, sizeof expected, "B is %.1fx faster: data -20.0 ms", times);
  EXPECT_EQ(d.verdict.rfind(expected, 0), 0u) << d.verdict;
}

// A run with one steady step has no spread: no difference is starred against a noise it cannot measure, and the
// verdict says why instead of calling B faster or slower.
TEST(Diff, OneSteadyStepTellsNoDifferenceFromNoise) {
  RunRecord b = with_straggler(20);
  b.config["warmup_steps"] = kSteps - 1;
  const RunDiff d = diff_runs(synthetic(2, jittered), b);
  EXPECT_EQ(d.steady_a, kSteps - 2);
  EXPECT_EQ(d.steady_b, 1);
  for (const MetricDiff& m : d.metrics) EXPECT_FALSE(m.beyond) << m.name;
  for (const BucketDiff& bucket : d.buckets) EXPECT_FALSE(bucket.beyond);
  EXPECT_EQ(d.verdict.rfind("too few steady steps to tell a difference from noise (A 10, B 1; 2 each at least)", 0), 0u)
      << d.verdict;
  EXPECT_TRUE(diff_runs(synthetic(2, jittered), with_straggler(20)).metrics[0].beyond);  // with its steps: starred
}

TEST(Diff, BucketsCutDifferentlyAreListedNotCompared) {
  const RunRecord a = synthetic(2, jittered);
  RunRecord b = a;
  b.buckets[1].count = 400;  // another cut of the same gradients
  const RunDiff d = diff_runs(a, b);
  EXPECT_FALSE(d.same_buckets);
  for (const BucketDiff& bucket : d.buckets) EXPECT_FALSE(bucket.beyond);
  EXPECT_EQ(d.buckets[1].bytes_b, 1600);
}

TEST(Timeline, EveryRankHasBothTracksAndEventsLieInsideTheirStep) {
  RunRecord run = synthetic(3, [](int r, int s) {
    Phases p;
    if ((s + 1) % 4 == 0) (r == 0 ? p.host_work : p.barrier) = 5;
    return p;
  });
  run.config["rank0_work_ms"] = 5.0;  // the feature behind host work and the barrier, every 4 steps
  run.config["barrier_every"] = 4;
  const nlohmann::json trace = chrome_trace(run);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::set<std::pair<int, int>> threads;
  std::set<int> processes;
  int buckets = 0, ready = 0, phases = 0;
  for (const auto& e : trace["traceEvents"]) {
    const int rank = e["pid"].get<int>() - 1;  // Perfetto keeps pid 0 for the idle task
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") {
        processes.insert(rank);
        EXPECT_EQ(e["args"]["name"], "rank " + std::to_string(rank) + " (host" + std::to_string(rank) + ")");
      }
      if (e["name"] == "thread_name") threads.insert({rank, e["tid"].get<int>()});
      continue;
    }
    const double ts = e["ts"];
    EXPECT_GE(ts, 0.0);
    if (e["ph"] == "i") {
      ++ready;
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    const double dur = e["dur"];
    EXPECT_GE(dur, 0.0);
    if (e["cat"] == "step") continue;
    const int s = e["args"]["step"];
    const double start = run.at(rank, s).start_ms * 1e3, end = start + run.at(rank, s).step_ms * 1e3;
    // Whole nanoseconds, each half a nanosecond above its boundary (timeline.cpp): an end reads up to 1.5 ns late.
    EXPECT_GE(ts, start - 1e-6) << e.dump();
    EXPECT_LE(ts + dur, end + 2e-3) << e.dump();
    if (e["cat"] == "bucket") {
      ++buckets;
      EXPECT_EQ(e["tid"], 2);
    } else {
      ++phases;
      EXPECT_EQ(e["tid"], 1);
    }
  }
  EXPECT_EQ(processes, (std::set<int>{0, 1, 2}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(threads.count({r, 1})) << "rank " << r << " compute track";
    EXPECT_TRUE(threads.count({r, 2})) << "rank " << r << " communication track";
  }
  EXPECT_EQ(buckets, 3 * kSteps * 2);
  EXPECT_EQ(ready, 3 * kSteps * 2);
  // Five phases every step; in the barrier steps 3, 7 and 11 a barrier wait on every rank (rank 0's is empty) and
  // rank 0's host work. No extra all-reduce: its feature is off.
  EXPECT_EQ(phases, 3 * kSteps * 5 + 3 * (3 + 1));
}

// A resumed run's trace numbers its steps as training counts them (from the checkpoint's step on): the events, the
// steps shown and the first steady step alike.
TEST(Timeline, AResumedRunsTraceCountsTrainingSteps) {
  RunRecord run = synthetic(1, [](int, int) { return Phases{}; });
  run.meta.first_step = 8;
  const nlohmann::json trace = chrome_trace(run);
  EXPECT_EQ(trace["otherData"]["first_step"], 8);
  EXPECT_EQ(trace["otherData"]["first_steady_step"], 8 + run.first_steady_step());
  EXPECT_EQ(trace["otherData"]["steps_shown"], nlohmann::json({8, 8 + kSteps - 1}));
  int lowest = INT32_MAX;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("args") && e["args"].contains("step")) lowest = std::min(lowest, e["args"]["step"].get<int>());
  EXPECT_EQ(lowest, 8);
}

// --zero-stage 1: a bucket with an all-gather shows it as an event of its own on the communication track, and its
// bar in backward is named for what it is, the reduce-scatter; a bucket without one (all-reduced whole) is unchanged.
TEST(Timeline, ShardedBucketsShowTheirReduceScatterAndTheirAllGather) {
  RunRecord run = synthetic(2, [](int, int) { return Phases{}; });
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < kSteps; ++s) {
      BucketTimes& t = run.bucket_times[(static_cast<size_t>(r) * kSteps + s) * run.buckets.size()];  // bucket 0
      const double end = run.at(r, s).start_ms + run.at(r, s).step_ms;
      t.gather_start_ms = end - 1.0;
      t.gather_end_ms = end - 0.5;
    }
  const nlohmann::json trace = chrome_trace(run);
  std::map<std::string, int> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || (e["cat"] != "bucket" && e["cat"] != "all-gather")) continue;
    const std::string name = e["name"];
    ++names[name.substr(0, name.find(" ("))];
    EXPECT_EQ(e["tid"], 2) << name;
    if (e["cat"] == "all-gather") {
      EXPECT_NEAR(e["dur"].get<double>(), 500.0, 1e-3) << "0.5 ms in us";
    }
  }
  EXPECT_EQ(names, (std::map<std::string, int>{{"bucket 0 reduce-scatter", 2 * kSteps},
                                               {"bucket 0 all-gather", 2 * kSteps},
                                               {"bucket 1", 2 * kSteps}}));
}

// Perfetto reads an event's ts and dur as two numbers and truncates each to whole nanoseconds; a slice that then ends
// past its parent (or past the next slice's start on its track) is dropped as malformed. Phases of irregular lengths on
// a clock far from zero: read as Perfetto reads them, every phase lies inside its step, the phases follow each other
// without overlap, and the buckets on the communication track likewise.
TEST(Timeline, SlicesNestAndFollowEachOtherInWholeNanoseconds) {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> length(0.001, 3.0);
  RunRecord run = synthetic(2, [&](int, int) {
    Phases p;
    p.data = length(random), p.forward = length(random), p.backward = length(random);
    p.exposed = length(random), p.optimizer = length(random), p.barrier = length(random);
    return p;
  });
  run.config["rank0_work_ms"] = 1.0;  // barrier waits every step
  for (StepRecord& x : run.records) x.start_ms += 1656533.7 + 1e-7 / 3;
  for (BucketTimes& b : run.bucket_times)
    b.ready_ms += 1656533.7 + 1e-7 / 3, b.comm_start_ms += 1656533.7 + 1e-7 / 3, b.comm_end_ms += 1656533.7 + 1e-7 / 3;
  const auto nanoseconds = [](double us) { return static_cast<int64_t>(us * 1000.0); };   // Perfetto's reading
  std::map<std::pair<int, int>, std::vector<std::tuple<int64_t, int64_t, bool>>> tracks;  // begin, end, is a step
  const nlohmann::json trace = chrome_trace(run);
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const int64_t begin = nanoseconds(e["ts"].get<double>());
    tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(begin, begin + nanoseconds(e["dur"].get<double>()),
                                                                    e["cat"] == "step");
  }
  ASSERT_EQ(tracks.size(), 4u) << "two ranks, two tracks each";
  int checked = 0;
  for (auto& [track, slices] : tracks) {
    std::stable_sort(slices.begin(), slices.end(), [](const auto& a, const auto& b) {  // ties: the file's order
      return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) < std::get<0>(b) : std::get<2>(a) > std::get<2>(b);
    });
    int64_t step_end = -1, previous_end = -1;
    for (const auto& [begin, end, step] : slices) {
      if (step) {
        EXPECT_GE(begin, step_end) << "steps follow each other";
        step_end = end;
        continue;
      }
      EXPECT_GE(begin, previous_end) << "a slice starts where the one before it on its track ended, or later";
      if (std::get<1>(track) == 1) {
        EXPECT_LE(end, step_end) << "a phase ends inside its step";
      }
      previous_end = end;
      ++checked;
    }
  }
  // Per step: rank 0 seven phases (its host work, empty, among them), rank 1 six; two buckets each.
  EXPECT_EQ(checked, kSteps * (7 + 2) + kSteps * (6 + 2));
}

// A line of the analysis holds what it names whole: a blame hint names the run file, whose path may be long.
TEST(Format, LinesOfAnyLength) {
  const std::string path = "/" + std::string(3000, 'd') + "/run.h5";
  EXPECT_EQ(fmt("compare sizes with ddplab predict %s)", path.c_str()),
            "compare sizes with ddplab predict " + path + ")");
  EXPECT_EQ(fmt("%s", ""), "");
}

TEST(Timeline, DefaultPath) {
  EXPECT_EQ(default_timeline_path("runs/a.h5"), "runs/a.trace.json");
  EXPECT_EQ(default_timeline_path("runs/a"), "runs/a.trace.json");
}

// ---- reader ------------------------------------------------------------------------------------------------------

class Reader : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddplab_test_report_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  // A run as the trainer's rank 0 holds it: 2 ranks, 3 steps, 2 buckets, every field distinct.
  static RunRecord real_record() {
    RunRecord run;
    run.steps = 3;
    run.meta.command = "train";
    run.meta.world_size = 2;
    run.meta.hostnames = {"alpha", "beta"};
    run.meta.git_commit = "abc123";
    run.meta.first_step = 4;
    run.config = {{"batch", 8}, {"comm", "ring"}, {"bucket_mb", 25.0}, {"overlap", true}, {"grad_accum", 1},
                  {"warmup_steps", 1}};
    run.records.resize(6);
    for (int i = 0; i < 6; ++i) {
      double v = 1.0;
      for (const StepField& f : kStepFields) run.records[i].*f.member = (v += 1.0) + 100.0 * i;
    }
    run.buckets = {{0, 1, 10, "fc1.bias,fc1.weight"}, {2, 2, 20, "fc0.weight"}};
    for (int i = 0; i < 12; ++i) run.bucket_times.push_back({1.0 * i, 1.0 * i + 0.25, 1.0 * i + 0.5});
    return run;
  }

  // That run, written by the real writer with its summary, as run_training() writes it.
  std::string write_real(const std::string& name, const RunRecord& run = real_record()) {
    const std::string path = dir_ + "/" + name;
    write_run_file(path, false, run, to_json(summarize(run)).dump());
    return path;
  }

  // The one-line message read_run_file() throws for `path`.
  static std::string error_of(const std::string& path) {
    try {
      read_run_file(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(no error)";
  }

  std::string dir_;
};

TEST_F(Reader, ReadsBackWhatTheWriterWrote) {
  const RunRecord written = real_record();
  const std::string path = write_real("run.h5", written);
  const RunRecord run = read_run_file(path);
  EXPECT_EQ(run.path, path);
  EXPECT_EQ(run.world_size(), 2);
  EXPECT_EQ(run.steps, 3);
  EXPECT_EQ(run.meta.hostnames, (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_TRUE(run.meta.gpus.empty());  // a CPU run writes none
  EXPECT_EQ(run.meta.git_commit, "abc123");
  EXPECT_EQ(run.meta.command, "train");
  EXPECT_EQ(run.meta.first_step, 4);
  EXPECT_EQ(run.config, written.config);
  EXPECT_EQ(run.first_steady_step(), 1);
  EXPECT_EQ(run.global_batch(), 16);
  ASSERT_EQ(run.records.size(), written.records.size());
  for (size_t i = 0; i < run.records.size(); ++i)
    for (const StepField& f : kStepFields) EXPECT_EQ(run.records[i].*f.member, written.records[i].*f.member) << f.name;
  ASSERT_EQ(run.buckets.size(), 2u);
  EXPECT_EQ(run.buckets[0].bytes(), 40);
  EXPECT_EQ(run.buckets[1].bytes(), 80);
  EXPECT_EQ(run.buckets[1].first_piece, 2);
  EXPECT_EQ(run.buckets[0].pieces, "fc1.bias,fc1.weight");
  EXPECT_EQ(run.bucket_at(1, 2, 1).comm_start_ms, 11.25);  // flat index (1*3+2)*2+1 = 11
}

// A GPU run's bus ids come back by rank, and so does what they say: both ranks on one GPU of one host.
TEST_F(Reader, GpusComeBackByRank) {
  RunRecord written = real_record();
  written.meta.device = "cuda";
  written.meta.hostnames = {"vm", "vm"};
  written.meta.gpus = {"00000000:1B:00.0", "00000000:1B:00.0"};
  const RunRecord run = read_run_file(write_real("gpu.h5", written));
  EXPECT_EQ(run.meta.gpus, written.meta.gpus);
  EXPECT_EQ(run.ranks_sharing_a_gpu(), 2);
}

// The run file's `summary` (what scripts and the charts read) is summarize() of the records it holds: the same
// JSON from the writer's record in memory (what the suite blames from) and from the record read back.
TEST_F(Reader, StoredSummaryIsTheSummaryOfWhatIsReadBack) {
  const RunRecord written = real_record();
  const std::string path = write_real("run.h5", written);
  nlohmann::json stored;
  {
    H5Id file(open_for_reading(path), H5Fclose);
    stored = nlohmann::json::parse(read_string_attr(file, "summary"));
  }
  const nlohmann::json in_memory = to_json(summarize(written));
  const nlohmann::json read_back = to_json(summarize(read_run_file(path)));
  EXPECT_EQ(stored, in_memory);
  EXPECT_EQ(read_back, in_memory);
  // Not vacuous: the summary holds the fields' steady-state means (step 0 is warm-up): rank 1's step_ms is the
  // 10th field, (11 + 100*4 + 11 + 100*5) / 2.
  EXPECT_EQ(stored["first_steady_step"], 1);
  EXPECT_DOUBLE_EQ(stored["ranks"][1]["step_ms"].get<double>(), 461.0);
  // Every field averaged (not start_ms, a point in time, nor lr, a setting, nor val_loss, a sample of some steps), and
  // hidden_fraction and time_use.
  const size_t averaged_fields = std::count_if(std::begin(kStepFields), std::end(kStepFields),
                                               [](const StepField& f) { return averaged(f.kind); });
  EXPECT_EQ(averaged_fields, std::size(kStepFields) - 3);
  EXPECT_EQ(stored["ranks"][1].size(), averaged_fields + 2);
  EXPECT_FALSE(stored["ranks"][1].contains("lr")) << "a setting has no mean";
  EXPECT_FALSE(stored["ranks"][1].contains("val_loss")) << "a sample of some steps has no mean";
  // The last validation, rank 0's: every step of this file took one, the last is step 4 + 2.
  EXPECT_EQ(stored["final_val_step"], 6);
  EXPECT_EQ(stored["final_val_loss"].get<double>(), written.at(0, 2).val_loss);
  // And `ddplab report --json` prints that summary, with the blame.
  const nlohmann::json report = report_json(summarized(read_run_file(path)));
  EXPECT_EQ(report["summary"], in_memory);
  EXPECT_EQ(report["run_file"], path);
  ASSERT_FALSE(report["blame"].empty());
  EXPECT_TRUE(report["blame"][0].contains("cause") && report["blame"][0].contains("text"));
}

TEST_F(Reader, NodesAndLinkClassesRoundTripAndOlderFilesReadAsOneNode) {
  RunRecord written = real_record();
  written.meta.node_of_rank = {0, 1};
  written.meta.links = parse_links("intra=pcie4,inter=10gbe");
  const std::string path = write_real("nodes.h5", written);
  const RunRecord run = read_run_file(path);
  EXPECT_EQ(run.meta.node_of_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(run.nodes(), 2);
  EXPECT_EQ(run.meta.links.intra.name, "pcie4");
  EXPECT_EQ(run.meta.links.intra.gbps, 252);
  EXPECT_EQ(run.meta.links.inter.name, "10gbe");
  EXPECT_EQ(run.meta.links.inter.latency_us, 10);
  {  // a file from before nodes and links were recorded
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(file.ok());
    ASSERT_GE(H5Ldelete(file, "node", H5P_DEFAULT), 0);
    ASSERT_GE(H5Adelete(file, "links"), 0);
  }
  const RunRecord old = read_run_file(path);
  EXPECT_TRUE(old.meta.node_of_rank.empty());
  EXPECT_EQ(old.nodes(), 1);
  EXPECT_EQ(old.node(1), 0);
  EXPECT_EQ(old.meta.links.inter.name, "none");
}

TEST_F(Reader, CommCpuAndGatherTimesHostCoresSpinAndLostYieldRoundTripAndOlderFilesReadAsNotRecorded) {
  RunRecord written = real_record();
  written.meta.host_cores = 6;
  written.meta.comm_spin_us = -1;
  written.meta.comm_lost_yield_us = 3250;
  for (size_t i = 0; i < written.bucket_times.size(); ++i) {
    written.bucket_times[i].comm_cpu_ms = 0.125 * i;
    written.bucket_times[i].gather_start_ms = 20 + 0.5 * i;  // --zero-stage 1's all-gathers
    written.bucket_times[i].gather_end_ms = 21 + 0.5 * i;
  }
  const std::string path = write_real("cpu.h5", written);
  const RunRecord run = read_run_file(path);
  EXPECT_EQ(run.meta.host_cores, 6);
  EXPECT_EQ(run.meta.comm_spin_us, -1);
  EXPECT_EQ(run.meta.comm_lost_yield_us, 3250);
  ASSERT_EQ(run.bucket_times.size(), written.bucket_times.size());
  for (size_t i = 0; i < run.bucket_times.size(); ++i) {
    EXPECT_EQ(run.bucket_times[i].comm_cpu_ms, 0.125 * i);
    EXPECT_EQ(run.bucket_times[i].gather_start_ms, 20 + 0.5 * i);
    EXPECT_EQ(run.bucket_times[i].gather_end_ms, 21 + 0.5 * i);
  }
  EXPECT_EQ(run.bucket_at(1, 2, 1).comm_cpu_ms, 0.125 * 11);  // in the same order as the other timings
  // A file from before they were recorded.
  {
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(file.ok());
    ASSERT_GE(H5Ldelete(file, "buckets/comm_cpu_ms", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(file, "buckets/gather_start_ms", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(file, "buckets/gather_end_ms", H5P_DEFAULT), 0);
    ASSERT_GE(H5Adelete(file, "host_cores"), 0);
    ASSERT_GE(H5Adelete(file, "comm_spin_us"), 0);
    ASSERT_GE(H5Adelete(file, "comm_lost_yield_us"), 0);
  }
  const RunRecord old = read_run_file(path);
  EXPECT_EQ(old.meta.host_cores, 0);
  EXPECT_FALSE(old.meta.comm_spin_us);
  EXPECT_FALSE(old.meta.comm_lost_yield_us);
  for (const BucketTimes& t : old.bucket_times) {
    EXPECT_EQ(t.comm_cpu_ms, BucketTimes::kNotRecorded);
    EXPECT_EQ(t.gather_start_ms, 0.0);
    EXPECT_EQ(t.gather_end_ms, 0.0);
  }
  EXPECT_EQ(old.bucket_at(1, 2, 1).comm_start_ms, 11.25);
}

TEST_F(Reader, StepFieldsAFileLacksReadAsZero) {
  const std::string path = write_real("run.h5");
  {
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_TRUE(file.ok());
    ASSERT_GE(H5Ldelete(file, "steps/barrier_ms", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(file, "steps/skipped", H5P_DEFAULT), 0);
  }
  const RunRecord run = read_run_file(path);
  for (const StepRecord& r : run.records) {
    EXPECT_EQ(r.barrier_ms, 0.0);
    EXPECT_EQ(r.skipped, 0.0);
    EXPECT_NE(r.host_work_ms, 0.0);
  }
}

TEST_F(Reader, BadFilesGiveOneLineNamingTheFileAndTheProblem) {
  const std::string missing = dir_ + "/missing.h5";
  const std::string empty = dir_ + "/empty.h5";
  const std::string text = dir_ + "/text.h5";
  const std::string bare = dir_ + "/bare.h5";
  const std::string old = dir_ + "/old.h5";
  const std::string checkpoint = dir_ + "/checkpoint.h5";  // another kind of ddplab file, named by its format
  std::ofstream(empty).close();
  std::ofstream(text) << "this is not HDF5\n";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  for (const auto& [path, version] : {std::pair{bare, -1}, std::pair{old, 1}, std::pair{checkpoint, -1}}) {
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    if (path == checkpoint) write_string_attr(f, "format", "ddplab-checkpoint");
    if (version >= 0) {
      const hid_t space = H5Screate(H5S_SCALAR);
      const hid_t attr = H5Acreate2(f, "schema_version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      const long long v = version;
      H5Awrite(attr, H5T_NATIVE_LLONG, &v);
      H5Aclose(attr), H5Sclose(space);
    }
    H5Fclose(f);
  }
  const std::pair<std::string, std::string> cases[] = {
      {missing, "No such file or directory"},
      {empty, "empty file"},
      {text, "not an HDF5 file"},
      {bare, "no schema_version attribute (not a ddplab run file)"},
      {checkpoint, "no schema_version attribute (not a ddplab run file: its format attribute says ddplab-checkpoint)"},
      {old, "schema version 1, this ddplab reads version " + std::to_string(kRunFileSchemaVersion)},
      {dir_, "is a folder"},
  };
  for (const auto& [path, problem] : cases) {
    const std::string message = error_of(path);
    EXPECT_EQ(message.rfind("cannot read run file " + path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(problem), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

// Values no trainer writes, each refused with one line naming its field: a first step whose runs' last step is past
// an int (the readers number steps in ints), a piece index past an int (it was read as its low 32 bits), a negative
// duration or count, node numbers that skip a node, links that are JSON but no links, a global batch past an int (it
// was read wrapped: 2^30 x 1 x 2 ranks as -2^31).
TEST_F(Reader, ValuesNoTrainerWritesAreRefusedNamingTheField) {
  using Damage = std::function<void(hid_t)>;
  const auto attr = [](const char* name, long long value) -> Damage {
    return [=](hid_t file) {
      ASSERT_GE(H5Adelete(file, name), 0);
      write_int_attr(file, name, value);
    };
  };
  const auto element = [](const char* dataset, size_t i, double value) -> Damage {
    return [=](hid_t file) {
      H5Id set(H5Dopen2(file, dataset, H5P_DEFAULT), H5Dclose);
      H5Id space(H5Dget_space(set), H5Sclose);
      std::vector<double> values(H5Sget_simple_extent_npoints(space));
      ASSERT_GE(H5Dread(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
      values.at(i) = value;
      ASSERT_GE(H5Dwrite(set, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    };
  };
  const auto config = [](const char* key, long long value) -> Damage {
    return [=](hid_t file) {
      nlohmann::json changed = real_record().config;
      changed[key] = value;
      ASSERT_GE(H5Adelete(file, "config"), 0);
      write_string_attr(file, "config", changed.dump());
    };
  };
  int files = 0;
  const auto damaged = [&](const std::vector<Damage>& damages) {
    RunRecord run = real_record();  // 3 steps
    run.meta.node_of_rank = {0, 1};
    const std::string path = write_real("run" + std::to_string(files++) + ".h5", run);
    H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    for (const Damage& damage : damages) damage(file);
    return path;
  };
  const std::pair<std::vector<Damage>, std::string> refused[] = {
      {{attr("first_step", INT_MAX - 2)}, "attribute first_step is out of range: 2147483645"},
      {{attr("first_step", 1LL << 40)}, "attribute first_step is out of range: 1099511627776"},
      {{element("buckets/first_piece", 0, 0x1p32), element("buckets/last_piece", 0, 0x1p32 + 1)},
       "buckets/first_piece and last_piece[0]: 4294967296..4294967297 is not a range of pieces"},
      {{element("steps/step_ms", 1, -5)}, "steps/step_ms holds a negative value (element 1)"},
      {{element("steps/loss_terms", 1, -3)}, "steps/loss_terms holds a negative value (element 1)"},
      {{element("steps/steal_ms", 1, -2)}, "steps/steal_ms holds a negative value (element 1)"},
      {{element("buckets/comm_cpu_ms", 1, -0.5)}, "buckets/comm_cpu_ms holds a negative value (element 1)"},
      {{element("buckets/comm_cpu_ms", 2, -2)}, "buckets/comm_cpu_ms holds a negative value (element 2)"},
      {{element("node", 0, 1)}, "node: rank 0 is on node 1, but nodes are numbered 0, 1, ..."},
      {{[](hid_t file) {
         ASSERT_GE(H5Adelete(file, "links"), 0);
         write_string_attr(file, "links", R"({"intra": 1})");
       }},
       "attribute links is not two links' JSON ("},
      {{config("batch", 1 << 30)},
       "config: batch x grad_accum x world_size, 1073741824 x 1 x 2, is not a global batch of 0..2147483647 samples"},
      {{config("grad_accum", 1LL << 40)}, "config: batch x grad_accum x world_size, 8 x 1099511627776 x 2, is not"},
      {{config("batch", -8)}, "config: batch x grad_accum x world_size, -8 x 1 x 2, is not"},
  };
  for (const auto& [damages, problem] : refused) {
    const std::string path = damaged(damages);
    const std::string message = error_of(path);
    EXPECT_EQ(message.rfind("cannot read run file " + path + ": " + problem, 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // Their neighbours read: the last first step whose steps are ints, steal_ms's -1, "not counted", and comm_cpu_ms
  // measured as 0 beside the -1 of a run that does not record it (the CUDA reducer's: real_record's).
  EXPECT_EQ(read_run_file(damaged({attr("first_step", INT_MAX - 3)})).meta.first_step, INT_MAX - 3);
  EXPECT_EQ(read_run_file(damaged({element("steps/steal_ms", 1, -1)})).records[1].steal_ms, -1);
  EXPECT_EQ(read_run_file(damaged({config("batch", INT_MAX / 2)})).global_batch(), INT_MAX - 1);
  const RunRecord cpu = read_run_file(damaged({element("buckets/comm_cpu_ms", 1, 0)}));
  EXPECT_EQ(cpu.bucket_times[1].comm_cpu_ms, 0);
  EXPECT_EQ(cpu.bucket_times[2].comm_cpu_ms, BucketTimes::kNotRecorded);
}

TEST_F(Reader, MissingOrMisshapenDatasetsAreNamed) {
  const std::string path = write_real("run.h5");
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "steps/backward_ms", H5P_DEFAULT), 0);
  H5Fclose(f);
  EXPECT_NE(error_of(path).find("missing dataset steps/backward_ms"), std::string::npos) << error_of(path);

  const std::string path2 = write_real("run2.h5");
  const hid_t g = H5Fopen(path2.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(g, 0);
  ASSERT_GE(H5Ldelete(g, "buckets/ready_ms", H5P_DEFAULT), 0);
  const hsize_t dims[2] = {2, 3};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t set = H5Dcreate2(g, "buckets/ready_ms", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(set), H5Sclose(space), H5Fclose(g);
  EXPECT_NE(error_of(path2).find("buckets/ready_ms has shape [2, 3], expected [2, 3, 2]"), std::string::npos)
      << error_of(path2);

  // A bucket's size in bytes that is not 4 x its count: the file contradicts itself.
  const std::string path3 = write_real("run3.h5");
  {
    H5Id file(H5Fopen(path3.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    H5Id bytes(H5Dopen2(file, "buckets/bytes", H5P_DEFAULT), H5Dclose);
    const int64_t wrong[2] = {40, 81};
    ASSERT_GE(H5Dwrite(bytes, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, wrong), 0);
  }
  EXPECT_NE(error_of(path3).find("buckets/bytes[1] is 81, not 4 x buckets/count (20)"), std::string::npos)
      << error_of(path3);
}

}  // namespace
}  // namespace ddplab
