// Reports (launcher/report.h, run_reader.h, timeline.h): slow-rank blame on synthetic runs, one per cause; the
// reader against files written by the real writer and against bad files; the Chrome trace's structure.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "analysis/report.h"
#include "record/run_file.h"
#include "record/run_file.h"
#include "record/run_reader.h"
#include "analysis/timeline.h"

namespace ddplab {
namespace {

// ---- synthetic runs ---------------------------------------------------------------------------------------------

// One rank's phases in one step, ms. Phases tile the step, as in the trainer.
struct Phases {
  double data = 0.3, forward = 3, backward = 7, exposed = 0.5, optimizer = 1, extra = 0, host_work = 0, barrier = 0;
  double untimed = 0;  // part of step_ms no phase names
};

constexpr int kSteps = 12;

// A run whose rank r, step s has the phases phases(r, s); two buckets, communicated during backward.
RunData synthetic(int world, const std::function<Phases(int, int)>& phases, bool lab_fields = true) {
  RunData run;
  run.path = "synthetic.h5";
  run.schema_version = kRunFileSchemaVersion;
  run.world_size = world;
  run.num_steps = kSteps;
  run.config = {{"batch", 32}, {"grad_accum", 1}, {"bucket_mb", 25.0}, {"overlap", true}, {"comm_dtype", "fp32"}};
  run.summary = {{"first_steady_step", 2}, {"global_batch", 32 * world}};
  for (int r = 0; r < world; ++r) run.hostnames.push_back("host" + std::to_string(r));
  std::vector<std::string> fields = kRequiredStepFields;
  if (lab_fields) fields.insert(fields.end(), {"extra_comm_ms", "host_work_ms", "barrier_ms"});
  for (const auto& f : fields) run.steps[f].assign(static_cast<size_t>(world) * kSteps, 0.0);
  BucketData& b = run.buckets;
  b.first_piece = {0, 3};
  b.last_piece = {2, 5};
  b.count = {1000, 500};
  b.bytes = {4000, 2000};
  b.param_names = {"fc2.bias,fc2.weight,fc1.bias", "fc1.weight,fc0.bias,fc0.weight"};
  const size_t n = static_cast<size_t>(world) * kSteps * 2;
  b.ready_ms.assign(n, 0), b.comm_start_ms.assign(n, 0), b.comm_end_ms.assign(n, 0);

  // Ranks leave a barrier together; each step starts when the slowest rank's previous one ended (they meet in the
  // all-reduce), so start times agree across ranks up to the phases' own differences.
  std::vector<double> start(world, 0.0);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < world; ++r) {
      const Phases p = phases(r, s);
      const double step =
          p.data + p.forward + p.backward + p.exposed + p.optimizer + p.extra + p.host_work + p.barrier + p.untimed;
      auto set = [&](const char* f, double v) {
        if (run.has(f)) run.steps[f][static_cast<size_t>(r) * kSteps + s] = v;
      };
      set("start_ms", start[r]);
      set("data_ms", p.data), set("forward_ms", p.forward), set("backward_ms", p.backward);
      set("exposed_comm_ms", p.exposed), set("optimizer_ms", p.optimizer);
      set("extra_comm_ms", p.extra), set("host_work_ms", p.host_work), set("barrier_ms", p.barrier);
      set("step_ms", step), set("loss", 2.0 - 0.01 * s);
      // Bucket 0 ready mid-backward, bucket 1 at its end; comm runs from ready to the end of the exposed wait.
      const double bwd = start[r] + p.data + p.forward;
      const double wait_end = bwd + p.backward + p.exposed;
      for (int k = 0; k < 2; ++k) {
        const size_t i = (static_cast<size_t>(r) * kSteps + s) * 2 + k;
        b.ready_ms[i] = bwd + p.backward * (k == 0 ? 0.5 : 1.0);
        b.comm_start_ms[i] = b.ready_ms[i];
        b.comm_end_ms[i] = k == 0 ? bwd + p.backward : wait_end;
      }
      set("comm_ms", wait_end - (bwd + 0.5 * p.backward));
      set("hidden_comm_ms", 0.5 * p.backward);
      start[r] += step;
    }
  }
  return run;
}

Finding first_finding(const RunData& run) {
  const std::vector<Finding> f = diagnose(run);
  EXPECT_FALSE(f.empty());
  return f.empty() ? Finding{Cause::kBalanced, -1, ""} : f.front();
}

bool has_cause(const std::vector<Finding>& findings, Cause cause) {
  for (const Finding& f : findings)
    if (f.cause == cause) return true;
  return false;
}

std::string all_text(const RunData& run) {
  std::string text;
  for (const std::string& line : blame(run)) text += line + "\n";
  return text;
}

// ---- blame -------------------------------------------------------------------------------------------------------

TEST(Blame, StragglerInputNamesTheSlowRankAndTheOthersWaitInTheAllReduce) {
  // The straggler case of the lab: rank 0 sleeps 40 ms before each batch; the others wait in the all-reduce.
  const RunData run = synthetic(4, [](int r, int) {
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

TEST(Blame, StragglerOnTwoRanksComparesWithTheOtherRankNotTheMedianOfBoth) {
  const RunData run = synthetic(2, [](int r, int) {
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
  const RunData run = synthetic(4, [](int r, int) {
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

TEST(Blame, UniformExposedCommIsCommunicationBound) {
  const RunData run = synthetic(4, [](int r, int) {
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
}

TEST(Blame, ExtraAllReduceOnEveryRankIsCommunicationBoundAndSaysSo) {
  const RunData run = synthetic(4, [](int, int) {
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
  const RunData run = synthetic(4, [](int r, int s) {
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
  RunData run = synthetic(3, [](int r, int) {
    Phases p;
    if (r == 2) {
      p.untimed = 10;
    } else {
      p.barrier = 10;
    }
    return p;
  });
  run.steps.erase("host_work_ms");
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kWorkBeforeBarrier) << all_text(run);
  EXPECT_EQ(f.rank, 2);
  EXPECT_NE(f.text.find("every step"), std::string::npos) << f.text;
}

TEST(Blame, UntimedWorkWithoutABarrier) {
  const RunData run = synthetic(
      2,
      [](int r, int) {
        Phases p;
        if (r == 0) {
          p.untimed = 8;
        } else {
          p.exposed = 8.5;
        }
        return p;
      },
      /*lab_fields=*/false);
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kUntimedWork) << all_text(run);
  EXPECT_EQ(f.rank, 0);
}

TEST(Blame, EveryRankWaitingForInputIsInputBound) {
  const RunData run = synthetic(2, [](int r, int) {
    Phases p;
    p.data = 20 + r;
    return p;
  });
  const Finding f = first_finding(run);
  EXPECT_EQ(f.cause, Cause::kInputBound) << all_text(run);
  EXPECT_NE(f.text.find("--loader-threads"), std::string::npos) << f.text;
}

TEST(Blame, BalancedRunBlamesNobody) {
  const RunData run = synthetic(4, [](int r, int s) {
    Phases p;
    p.backward += 0.1 * ((r + s) % 3);  // jitter well under the thresholds
    return p;
  });
  const std::vector<Finding> findings = diagnose(run);
  ASSERT_EQ(findings.size(), 1u) << all_text(run);
  EXPECT_EQ(findings[0].cause, Cause::kBalanced);
  EXPECT_NE(findings[0].text.find("no rank stands out (spread"), std::string::npos) << findings[0].text;
}

TEST(Blame, SingleRank) {
  const RunData run = synthetic(1, [](int, int) { return Phases{}; });
  EXPECT_EQ(first_finding(run).cause, Cause::kSingleRank);
}

TEST(Blame, WarmUpStepsAreIgnored) {
  // A slow first steps on rank 1 (warm-up) must not be blamed.
  const RunData run = synthetic(2, [](int r, int s) {
    Phases p;
    if (s < 2 && r == 1) p.data = 500;
    return p;
  });
  EXPECT_EQ(first_finding(run).cause, Cause::kBalanced) << all_text(run);
}

TEST(RunStats, ThroughputFromTheSlowestRank) {
  const RunData run = synthetic(2, [](int r, int) {
    Phases p;
    p.optimizer = r == 1 ? 3.2 : 1.2;  // steps of 12 and 14 ms
    return p;
  });
  const RunStats st = run_stats(run);
  EXPECT_EQ(st.slowest_rank, 1);
  EXPECT_NEAR(st.slowest_step_ms, 14.0, 1e-9);
  EXPECT_NEAR(st.samples_per_s, 64 / 0.014, 1e-6);
  EXPECT_NEAR(st.mean_spread_ms, 2.0, 1e-9);
  EXPECT_EQ(st.steady_steps, kSteps - 2);
}

// ---- timeline ----------------------------------------------------------------------------------------------------

TEST(Timeline, EveryRankHasBothTracksAndEventsLieInsideTheirStep) {
  const RunData run = synthetic(3, [](int r, int s) {
    Phases p;
    if ((s + 1) % 4 == 0) (r == 0 ? p.host_work : p.barrier) = 5;
    return p;
  });
  const nlohmann::json trace = chrome_trace(run);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::set<std::pair<int, int>> threads;
  std::set<int> processes;
  int buckets = 0, ready = 0, phases = 0;
  for (const auto& e : trace["traceEvents"]) {
    const int pid = e["pid"];
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") {
        processes.insert(pid);
        EXPECT_EQ(e["args"]["name"], "rank " + std::to_string(pid) + " (host" + std::to_string(pid) + ")");
      }
      if (e["name"] == "thread_name") threads.insert({pid, e["tid"].get<int>()});
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
    const double start = run.step("start_ms", pid, s) * 1e3, end = start + run.step("step_ms", pid, s) * 1e3;
    EXPECT_GE(ts, start - 1e-6) << e.dump();
    EXPECT_LE(ts + dur, end + 1e-6) << e.dump();
    if (e["cat"] == "bucket") {
      ++buckets;
      EXPECT_EQ(e["tid"], 1);
    } else {
      ++phases;
      EXPECT_EQ(e["tid"], 0);
    }
  }
  EXPECT_EQ(processes, (std::set<int>{0, 1, 2}));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(threads.count({r, 0})) << "rank " << r << " compute track";
    EXPECT_TRUE(threads.count({r, 1})) << "rank " << r << " communication track";
  }
  EXPECT_EQ(buckets, 3 * kSteps * 2);
  EXPECT_EQ(ready, 3 * kSteps * 2);
  EXPECT_EQ(phases, 3 * kSteps * 5 + 3 * 3);  // five phases, plus host work or barrier in steps 3, 7, 11
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

  // A run file written by the real writer (launcher/run_file.h): 2 ranks, 3 steps, 2 buckets.
  std::string write_real(const std::string& name) {
    const int world = 2, steps = 3;
    RunMetadata meta;
    meta.command = "train";
    meta.config_json = R"({"batch":8,"comm":"ring","bucket_mb":25.0,"overlap":true,"grad_accum":1})";
    meta.world_size = world;
    meta.hostnames = {"alpha", "beta"};
    meta.git_commit = "abc123";
    std::vector<StepRecord> records(world * steps);
    for (int i = 0; i < world * steps; ++i) {
      double v = 1.0;
      for (const auto& [field, member] : kStepFields) records[i].*member = (v += 1.0) + 100.0 * i;
    }
    RunBuckets buckets;
    Bucket b0, b1;
    b0.first_piece = 0, b0.last_piece = 1, b0.count = 10;
    b1.first_piece = 2, b1.last_piece = 2, b1.count = 20;
    buckets.layout = {b0, b1};
    buckets.names = {"fc1.bias,fc1.weight", "fc0.weight"};
    for (int i = 0; i < world * steps * 2; ++i) buckets.times.push_back({1.0 * i, 1.0 * i + 0.25, 1.0 * i + 0.5});
    const std::string path = dir_ + "/" + name;
    write_run_file(path, false, meta, records, steps, R"({"first_steady_step":1,"global_batch":16})", buckets);
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
  const RunData run = read_run_file(write_real("run.h5"));
  EXPECT_EQ(run.schema_version, kRunFileSchemaVersion);
  EXPECT_EQ(run.world_size, 2);
  EXPECT_EQ(run.num_steps, 3);
  EXPECT_EQ(run.hostnames, (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_EQ(run.attrs.at("git_commit"), "abc123");
  EXPECT_EQ(run.config.at("comm"), "ring");
  EXPECT_EQ(run.first_steady_step(), 1);
  EXPECT_EQ(run.global_batch(), 16);
  for (const auto& f : kRequiredStepFields) EXPECT_TRUE(run.has(f)) << f;
  // Every field the writer has, at rank 1 step 2 (record 5).
  double v = 1.0;
  for (const auto& [field, member] : kStepFields) EXPECT_EQ(run.step(field, 1, 2), (v += 1.0) + 500.0) << field;
  EXPECT_EQ(run.step("no_such_field_ms", 1, 2), 0.0);
  ASSERT_EQ(run.buckets.size(), 2);
  EXPECT_EQ(run.buckets.bytes, (std::vector<int64_t>{40, 80}));
  EXPECT_EQ(run.buckets.param_names[0], "fc1.bias,fc1.weight");
  EXPECT_EQ(run.bucket_time(run.buckets.comm_start_ms, 1, 2, 1), 11.25);  // flat index (1*3+2)*2+1 = 11
}

TEST_F(Reader, BadFilesGiveOneLineNamingTheFileAndTheProblem) {
  const std::string missing = dir_ + "/missing.h5";
  const std::string empty = dir_ + "/empty.h5";
  const std::string text = dir_ + "/text.h5";
  const std::string bare = dir_ + "/bare.h5";
  const std::string old = dir_ + "/old.h5";
  std::ofstream(empty).close();
  std::ofstream(text) << "this is not HDF5\n";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  for (const auto& [path, version] : {std::pair{bare, -1}, std::pair{old, 1}}) {
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
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
}

}  // namespace
}  // namespace ddplab
