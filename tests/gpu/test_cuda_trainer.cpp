// The Trainer on --device cuda (CudaBackend) under mpirun (tests/mpi/mpi_test_main.cpp), np 1 and 2: GPU data parallelism against one GPU with the
// global batch (the MLP and the transformer), the bucket timings, the non-finite stop and skip, and the refusal
// without a device.
//
// Equivalence tolerance: as tests/mpi/test_ddp_equivalence.cpp, the two runs differ only in fp32 summation order
// (the GEMMs' reduction over N·B rows versus N per-rank reductions summed by NCCL and scaled by 1/N), so 1e-5
// absolute on the parameters after six AdamW steps (lr 1e-3; training moves them by ~6e-3), 1e-5 relative on the
// loss. The test prints what it measures, for tightening after the first GPU runs. Against the CPU model the GPU
// differs by GEMM order and cuBLASLt's GELU epilogue (docs/GPU.md): 1e-3 relative on each loss, test_mlp_cuda's
// fp32 bound for the same comparison.
//
// Without a device the GPU tests skip with the reason on every rank; with fewer GPUs than ranks on the node they
// skip too (NCCL refuses two ranks on one GPU). CudaTrainerHost.* never skips: ctest runs it on its own
// (test_cuda_trainer_host_npN), so the refusal is checked on every machine.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/nccl_allreduce.h"
#include "kernels/cuda/cudnn_attention.h"
#include "launcher/run.h"
#include "runtime/errors.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/mpi/lr_schedule_check.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/unit/token_shards.h"
#include "train/trainer.h"

namespace ddplab {
namespace {

using cuda::NcclAllreduce;
using gpu_test::device_count;

TrainConfig small_config() {
  TrainConfig c;
  c.device = Device::kCuda;
  c.comm = AllreduceImpl::kNccl;
  c.mlp = MlpConfig{24, 40, 2, 10};
  c.optimizer.lr = 1e-3f;
  c.batch = 5;  // odd on purpose: per-rank means of unequal-looking sums
  c.steps = 6;
  c.bucket_mb = 0;  // a bucket per parameter: several launches per backward
  c.quiet = true;
  return c;
}

// The tiny transformer (head size 12: the unfused attention) on short sequences of varying length.
TrainConfig small_transformer(TransformerConfig::Head head) {
  TrainConfig c = small_config();
  c.model = ModelKind::kTiny;
  c.head = head;
  c.min_len = 4;
  c.max_len = 24;
  c.batch = 3;
  c.epoch_size = 1000;
  return c;
}

// Rank 0's parameters equal every rank's, bit for bit.
bool identical_across_ranks(const std::vector<float>& mine) {
  std::vector<float> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), mine.data(), mine.size() * sizeof(float)) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  return d;
}

// All eight phases of the record (FieldKind::kPhase) are non-negative and add up to step_ms within one tick of the host
// clock: every boundary between two phases is one clock reading (train/step_phases.h), so only the rounding
// of the double sums is left (far below 1 ns). Two clock reads, the least a phase left out weighs, take ~20 ns.
void expect_phases_tile_the_step(const StepRecord& r) {
  constexpr double kClockTickMs = 1e-6;  // steady_clock counts nanoseconds
  EXPECT_NEAR(sum_of_phases(r), r.step_ms, kClockTickMs) << "the phases tile the step";
  for (const StepField& f : kStepFields) {
    if (f.kind != FieldKind::kPhase) continue;
    EXPECT_GE(r.*f.member, 0.0) << f.name;
  }
  // What the host took from the launching thread (runtime/cpu_taken.h): ms, or -1 where the kernel does not count it.
  for (const double taken : {r.steal_ms, r.cpu_wait_ms}) EXPECT_TRUE(taken >= 0 || taken == -1) << taken;
}

// ---- host side: runs, and must pass, on every machine -------------------------------------------------------------

// Without a usable device every rank refuses alike, naming the reason, before anything is written.
TEST(CudaTrainerHost, RefusedOnEveryRankWithoutADevice) {
  const std::string reason = NcclAllreduce::availability();
  if (reason.empty()) GTEST_SKIP() << "a device is usable: nothing to refuse";
  TrainConfig c = small_config();
  c.out = "/nonexistent/run.h5";  // a refusal of the path instead would fail the test, not write a file
  std::string message = "(nothing thrown)";
  try {
    run_training(c, MPI_COMM_WORLD, RunOptions{});
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("--device cuda: "), std::string::npos) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
  if (world_rank() == 0) std::printf("  refused: %s\n", message.c_str());
}

// ---- on the device --------------------------------------------------------------------------------------------

// Why this machine cannot run a GPU test: no device; fewer GPUs than ranks on the node where NCCL carries the
// gradients (its collective or the ring's nccl link); GPUs the ranks would share in a compute mode that refuses
// a second process. "" if it can.
std::string skip_reason(bool gpu_per_rank) {
  std::string reason = NcclAllreduce::availability();
  if (reason.empty() && gpu_per_rank && ranks_on_this_node() > device_count())
    reason = "needs " + std::to_string(ranks_on_this_node()) + " GPUs: NCCL refuses two ranks on one GPU (" +
             std::to_string(device_count()) + " here)";
  if (reason.empty()) reason = gpu_test::gpu_sharing_refused(ranks_on_this_node());
  return reason;
}

class CudaTrainerTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = skip_reason(/*gpu_per_rank=*/true);
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

struct Case {
  int grad_accum;
  bool overlap;
  double grad_slice_mb;
  std::string comm = "nccl";
  std::string ring_link = "auto";  // --comm ring: on one GPU, ipc and host let the ranks share it
};

class CudaDdpEquivalence : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string reason = skip_reason(GetParam().comm == "nccl" || GetParam().ring_link == "nccl");
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

// What an equivalence run must show; the defaults are the tolerances the file's header explains.
struct Equivalence {
  double params = 1e-5;    // max |ddp - single GPU| on the parameters after training
  double loss = 1e-5;      // relative: the ranks' mean loss against the single GPU's
  double cpu_loss = 1e-3;  // relative: the single GPU's loss against the CPU Trainer's
  // Whether the plain mean of the ranks' losses is the global loss (every rank's batch counts as many loss terms);
  // where it is not, it is compared at one rank without accumulation only.
  bool mean_loss_is_global = true;
  bool one_rank_bit_for_bit = true;  // one rank without accumulation reproduces the single-GPU run exactly
};

// N ranks with batch B (x K micro-batches) train `config` as one GPU trains it with batch N·K·B on the same samples,
// every rank holding the same bits after every step; the single GPU's losses follow the CPU Trainer's.
void expect_matches_one_gpu_with_global_batch(const TrainConfig& config, const Equivalence& expect,
                                              const std::string& label) {
  std::vector<float> initial, trained;
  std::vector<double> mean_loss(config.steps);
  {
    Trainer ddp(config, MPI_COMM_WORLD);
    initial = ddp.parameters();
    for (int step = 0; step < config.steps; ++step) {
      const double loss = ddp.step(step, 0).loss;
      ASSERT_TRUE(identical_across_ranks(ddp.parameters())) << "ranks diverged after step " << step;
      MPI_Allreduce(&loss, &mean_loss[step], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      mean_loss[step] /= world_size();
    }
    trained = ddp.parameters();
  }
  // One GPU with the global batch, and the CPU Trainer with it, on rank 0 alone (its own device, MPI_COMM_SELF).
  if (world_rank() == 0) {
    TrainConfig global = config;
    global.batch = config.batch * config.grad_accum * world_size();
    global.grad_accum = 1;
    global.ring_link = RingLinkKind::kHost;  // one rank: nothing travels; no IPC buffers on MPI_COMM_SELF (--comm nccl ignores it)
    Trainer single(global, MPI_COMM_SELF);
    TrainConfig on_cpu = global;
    on_cpu.device = Device::kCpu;
    on_cpu.comm = AllreduceImpl::kRing;
    on_cpu.ring_link = RingLinkKind::kAuto;
    Trainer cpu(on_cpu, MPI_COMM_SELF);
    const bool one_rank_whole_batch = world_size() == 1 && config.grad_accum == 1;
    for (int step = 0; step < config.steps; ++step) {
      const double single_loss = single.step(step, 0).loss, cpu_loss = cpu.step(step, 0).loss;
      if (expect.mean_loss_is_global || one_rank_whole_batch) {
        EXPECT_NEAR(mean_loss[step], single_loss, expect.loss * std::abs(single_loss)) << "step " << step;
      }
      EXPECT_NEAR(single_loss, cpu_loss, expect.cpu_loss * std::abs(cpu_loss)) << "step " << step << " against the CPU";
    }
    const std::vector<float> reference = single.parameters();
    const std::vector<float> cpu_params = cpu.parameters();
    const double diff = max_abs_diff(trained, reference), moved = max_abs_diff(trained, initial);
    if (expect.one_rank_bit_for_bit && one_rank_whole_batch) {
      EXPECT_EQ(diff, 0.0) << "one rank must reproduce the single-GPU run bit for bit";
    }
    EXPECT_LE(diff, expect.params);
    EXPECT_GT(moved, 1e-4) << "training must move the parameters far more than the tolerance";
    std::printf("  %s: max |ddp - single GPU| = %.3g (tol %.3g), |single GPU - CPU| = %.3g, |trained - init| = %.3g\n",
                label.c_str(), diff, expect.params, max_abs_diff(reference, cpu_params), moved);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_P(CudaDdpEquivalence, MatchesOneGpuWithTheGlobalBatch) {
  const Case p = GetParam();
  TrainConfig config = small_config();
  config.grad_accum = p.grad_accum;
  config.overlap = p.overlap;
  config.grad_slice_mb = p.grad_slice_mb;
  config.comm = parse_choice<AllreduceImpl>(p.comm, "--comm");
  config.ring_link = parse_choice<RingLinkKind>(p.ring_link, "--ring-link");
  expect_matches_one_gpu_with_global_batch(config, Equivalence{}, "mlp");
}

// --grad-clip on the GPU: every rank takes the same norm of the reduced gradients, bit for bit; one GPU with the global
// batch takes it too (to the summation order's rounding), and the CPU Trainer (to the GEMMs' order); the clipped run
// trains the model of the single GPU as the unclipped ones do (the factor is read by the update on the device).
TEST_F(CudaTrainerTest, ClipsByTheNormThatOneGpuAndTheCpuTake) {
  TrainConfig config = small_config();
  config.optimizer.grad_clip = 0.05f;
  std::vector<double> norms;
  {
    Trainer ddp(config, MPI_COMM_WORLD);
    for (int step = 0; step < config.steps; ++step) {
      norms.push_back(ddp.step(step, 0).grad_norm);
      double root = norms.back();
      MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      EXPECT_EQ(norms.back(), root) << "every rank takes the same norm, step " << step;
    }
  }
  if (world_rank() == 0) {
    TrainConfig global = config;
    global.batch = config.batch * world_size();
    Trainer single(global, MPI_COMM_SELF);
    TrainConfig on_cpu = global;
    on_cpu.device = Device::kCpu;
    on_cpu.comm = AllreduceImpl::kRing;
    Trainer cpu(on_cpu, MPI_COMM_SELF);
    for (int step = 0; step < config.steps; ++step) {
      const double single_norm = single.step(step, 0).grad_norm, cpu_norm = cpu.step(step, 0).grad_norm;
      EXPECT_GT(cpu_norm, 2 * config.optimizer.grad_clip) << "step " << step << " must clip";
      EXPECT_NEAR(norms[step], single_norm, 1e-5 * single_norm) << "step " << step;
      EXPECT_NEAR(single_norm, cpu_norm, 1e-3 * cpu_norm) << "step " << step << " against the CPU";
      std::printf("  step %d: gradient norm %.6g (GPU, %d ranks), %.6g (one GPU), %.6g (CPU)\n", step, norms[step],
                  world_size(), single_norm, cpu_norm);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_matches_one_gpu_with_global_batch(config, Equivalence{}, "mlp, --grad-clip 0.05");
}

// --val-data on the GPU: the loss over the validation windows is the CPU Trainer's (to the GEMMs' order), the same on
// every rank, and validating between steps leaves training as it was, bit for bit (the pass has its own device buffer;
// the staged next batch and the model's state are untouched).
TEST_F(CudaTrainerTest, ValidatesAsTheCpuTrainerDoesWithoutDisturbingTraining) {
  const SharedTempDir dir([](const std::string& path) {
    write_token_shard(path + "/val.bin", counting_tokens(23 * 11 + 1, 5, 4000));  // 11 windows of 24 tokens
  });
  TrainConfig config = small_transformer(TransformerConfig::Head::kCausalLM);
  config.steps = 3;
  TrainConfig validated = config;
  validated.val_data = dir.path() + "/val.bin";
  Trainer plain(config, MPI_COMM_WORLD), checked(validated, MPI_COMM_WORLD);
  const double at_start = checked.validation_loss();
  double root = at_start;
  MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(at_start, root) << "every rank the same";
  for (int step = 0; step < config.steps; ++step) {
    EXPECT_EQ(plain.step(step, 0).loss, checked.step(step, 0).loss) << "step " << step;
    EXPECT_GT(std::abs(checked.validation_loss() - at_start), 0.0) << "the model moved by step " << step;
  }
  EXPECT_EQ(plain.parameters(), checked.parameters()) << "validating between steps changed training";
  if (world_rank() == 0) {
    TrainConfig on_cpu = validated;
    on_cpu.device = Device::kCpu;
    on_cpu.comm = AllreduceImpl::kRing;
    Trainer cpu(on_cpu, MPI_COMM_SELF);
    const double cpu_loss = cpu.validation_loss();
    EXPECT_NEAR(at_start, cpu_loss, 1e-3 * cpu_loss);
    std::printf("  validation loss at the start: %.7g (GPU, %d ranks), %.7g (CPU)\n", at_start, world_size(), cpu_loss);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// --lr-schedule and --lr-warmup reach AdamW on the device: the whole update's launch, and each bucket's in the update
// bucket by bucket.
TEST_F(CudaTrainerTest, TheLrScheduleReachesTheUpdate) {
  expect_the_schedule_reaches_the_update(small_config());
  TrainConfig bucketed = small_config();
  bucketed.optimizer_in_backward = OnOff::kOn;
  expect_the_schedule_reaches_the_update(bucketed);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDdpEquivalence,
                         testing::Values(Case{1, true, 0.0}, Case{2, true, 0.0}, Case{1, false, 0.002},
                                         Case{1, true, 0.0, "ring", "ipc"}, Case{2, true, 0.002, "ring", "ipc"},
                                         Case{1, false, 0.0, "ring", "host"}, Case{1, true, 0.0, "ring", "nccl"}),
                         [](const testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return c.comm + (c.comm == "ring" ? "_" + c.ring_link : "") + "_accum" +
                                  std::to_string(c.grad_accum) + (c.overlap ? "_overlap" : "_no_overlap") +
                                  (c.grad_slice_mb > 0 ? "_sliced" : "");
                         });

// The transformer (both heads, variable lengths, --grad-accum 1 and 2): N ranks train what one GPU trains with the
// global batch, as the CPU Trainer does (tests/mpi/test_ddp_equivalence.cpp). The ranks' batches count different
// numbers of loss terms, so this checks the weighting (TokenBatches::weight and micro_scale, folded into backward's
// loss scale) as well as the averaging. Same tolerances as the MLP's: the runs differ in fp32 summation order only
// (one rank alone reproduces the single GPU bit for bit), 1e-5 on the parameters after six AdamW steps; 1e-3 relative
// on the loss against the CPU Trainer (GEMM order, GELU's tanh, attention's scale after the dot product).
struct TokenCase {
  const char* head;
  int grad_accum;
};

class CudaTransformerDdpEquivalence : public CudaTrainerTest, public testing::WithParamInterface<TokenCase> {};

TEST_P(CudaTransformerDdpEquivalence, MatchesOneGpuWithTheGlobalBatch) {
  const TokenCase p = GetParam();
  TrainConfig config = small_transformer(parse_choice<TransformerConfig::Head>(p.head, "--head"));
  config.grad_accum = p.grad_accum;
  config.outlier_prob = 0.2;
  // AdamW turns a gradient that is 0 in exact arithmetic but rounding noise in practice (the key bias's: softmax
  // ignores a shift common to all scores) into a step of up to ~lr / 10 with the noise's sign, which differs between
  // the two runs. An eps far above that noise (~1e-8) keeps such steps negligible and the others (gradients ~1e-3)
  // about as they were. (The CPU test of the same equivalence uses SGD, which has no such amplification.)
  config.optimizer.eps = 1e-4f;
  Equivalence expect;
  // The ranks' losses are means over their own terms: only their weighted mean is the global one.
  expect.mean_loss_is_global = false;
  expect_matches_one_gpu_with_global_batch(config, expect,
                                           std::string(p.head) + ", accum " + std::to_string(p.grad_accum));
}

INSTANTIATE_TEST_SUITE_P(HeadsAccumulation, CudaTransformerDdpEquivalence,
                         testing::Values(TokenCase{"classify", 1}, TokenCase{"lm", 1}, TokenCase{"lm", 2}),
                         [](const testing::TestParamInfo<TokenCase>& info) {
                           return std::string(info.param.head) + "_accum" + std::to_string(info.param.grad_accum);
                         });

// Each bucket's ready <= comm start <= comm end; the phases tile the step; with overlap on, every bucket but the
// closing one starts while backward still runs (each layer's backward GEMMs take ~0.3 ms at batch 4096, a 4 MiB
// bucket's all-reduce ~30 us over NVLink), and with overlap off none starts before backward ends.
TEST_F(CudaTrainerTest, BucketTimingsAreOrderedAndOverlapBackward) {
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap on" : "overlap off");
    TrainConfig c = small_config();
    c.mlp = MlpConfig{1024, 1024, 4, 1000};
    c.batch = 4096;
    c.steps = 3;
    c.bucket_mb = 1;  // a bucket per weight (4 MiB), the biases in between
    c.overlap = overlap;
    Trainer trainer(c, MPI_COMM_WORLD);
    ASSERT_GE(trainer.buckets().size(), 4u);
    for (int step = 0; step < c.steps; ++step) {
      const StepRecord r = trainer.step(step, 0);
      expect_phases_tile_the_step(r);
      const double backward_end = r.start_ms + r.data_ms + r.forward_ms + r.backward_ms;
      const std::vector<BucketTimes>& times = trainer.bucket_times();
      for (size_t b = 0; b < times.size(); ++b) {
        SCOPED_TRACE("step " + std::to_string(step) + " bucket " + std::to_string(b));
        EXPECT_LE(r.start_ms, times[b].ready_ms);
        EXPECT_LE(times[b].ready_ms, times[b].comm_start_ms);
        EXPECT_LE(times[b].comm_start_ms, times[b].comm_end_ms);
        if (step == 0) continue;  // cuBLASLt's plans and NCCL's first launches warm up
        if (overlap && b + 1 < times.size()) {
          EXPECT_LT(times[b].comm_start_ms, backward_end);
        } else if (!overlap) {
          EXPECT_GE(times[b].comm_start_ms, backward_end - 1e-6);
        }
      }
      if (world_rank() == 0 && step == c.steps - 1)
        std::printf("  overlap %s: step %.3f ms, backward %.3f, comm %.3f (hidden %.3f), exposed %.3f\n",
                    overlap ? "on" : "off", r.step_ms, r.backward_ms, r.comm_ms, r.hidden_comm_ms, r.exposed_comm_ms);
    }
  }
}

// The lab's data-bound case on the GPU: --data-cost-ms per sample is paid on the staging thread, one step ahead.
// A cost far above the step shows in the data phase (~cost x samples / loader threads, minus the step it overlaps);
// four loader threads cut it by about four.
TEST_F(CudaTrainerTest, InputCostShowsInTheDataPhaseAndLoaderThreadsDivideIt) {
  std::vector<double> data_ms;
  for (int threads : {1, 4}) {
    TrainConfig c = small_config();
    c.data_cost_ms = 4.0;  // x 5 samples: 20 ms per step with one thread, far above the step itself
    c.loader_threads = threads;
    Trainer trainer(c, MPI_COMM_WORLD);
    double total = 0;
    for (int step = 0; step < c.steps; ++step) {
      const double d = trainer.step(step, 0).data_ms;
      if (step > 0) total += d;  // step 0 stages its own batch
    }
    data_ms.push_back(total / (c.steps - 1));
  }
  if (world_rank() == 0) std::printf("  data phase: %.2f ms (1 thread), %.2f ms (4 threads)\n", data_ms[0], data_ms[1]);
  EXPECT_GT(data_ms[0], 10.0) << "20 ms of input cost per step must show up in the data phase";
  EXPECT_LT(data_ms[0], 25.0);
  EXPECT_LT(data_ms[1], data_ms[0] / 2.5) << "four loader threads must cut the wait";
}

// The lab's pathologies on the GPU land in the phases the CPU puts them in: a straggler's sleep in its data phase,
// the extra all-reduce in extra_comm, rank 0's work in its host_work and the others' wait in barrier.
TEST_F(CudaTrainerTest, LabPathologiesShowInTheirPhases) {
  TrainConfig c = small_config();
  c.straggler_ms = 15;
  c.slow_rank = world_size() - 1;
  c.extra_allreduce_mb = 4;
  c.rank0_work_ms = 25;
  c.barrier_every = 1;
  Trainer trainer(c, MPI_COMM_WORLD);
  for (int step = 0; step < c.steps; ++step) {
    const StepRecord r = trainer.step(step, 0);
    SCOPED_TRACE("step " + std::to_string(step));
    if (world_rank() == c.slow_rank) {
      EXPECT_GE(r.data_ms, 14.0);
    }
    EXPECT_GT(r.extra_comm_ms, 0.0);
    if (world_rank() == 0) {
      EXPECT_GE(r.host_work_ms, 24.0);
    } else {
      EXPECT_GE(r.barrier_ms, 15.0) << "waited for rank 0's work";
    }
    expect_phases_tile_the_step(r);
  }
}

// A run resumed from a checkpoint continues bit for bit as if it had not stopped: the master weights and AdamW's
// moments go back to the device in order with the steps (on the compute stream), and in bf16 the weights' bf16 copy
// is remade from them rather than kept from before the resume.
void expect_resumed_run_continues_bit_for_bit(const TrainConfig& c, const std::string& name) {
  const int stop = 3;
  std::vector<float> straight;
  {
    Trainer trainer(c, MPI_COMM_WORLD);
    for (int step = 0; step < c.steps; ++step) trainer.step(step, 0);
    straight = trainer.parameters();
    // --gemm-algo timed (the default): the GEMMs' algorithms timed, or read from the host's cache, which the runs
    // below read back: that is what keeps them bit for bit.
    EXPECT_EQ(trainer.gemm_algorithms().rfind("timed: ", 0), 0u) << trainer.gemm_algorithms();
    // What cuDNN's graph builds cost is said where its attention ran, and nowhere else.
    const bool cudnn = c.attention && *c.attention == AttentionKind::kCudnn;
    EXPECT_EQ(trainer.attention_graphs().find(" graphs (") != std::string::npos, cudnn) << trainer.attention_graphs();
    EXPECT_EQ(trainer.attention_graphs().empty(), !cudnn) << trainer.attention_graphs();
  }
  const std::string path = testing::TempDir() + "resume_" + name + "_rank" + std::to_string(world_rank()) + ".h5";
  {
    Trainer first(c, MPI_COMM_WORLD);
    for (int step = 0; step < stop; ++step) first.step(step, 0);
    first.write_checkpoint(path, /*force=*/true, CheckpointInfo{stop, "{}", "", ""});
  }
  Trainer resumed(c, MPI_COMM_WORLD);
  EXPECT_EQ(resumed.read_checkpoint(path).step, stop);
  for (int step = stop; step < c.steps; ++step) resumed.step(step, 0);
  EXPECT_EQ(max_abs_diff(resumed.parameters(), straight), 0.0) << "the resumed run must continue bit for bit";
  std::remove(path.c_str());
}

// The MLP and the tiny transformer (its tied embedding's dwte summed in a fixed order; the unfused attention, as its
// head size 12 takes).
TEST_F(CudaTrainerTest, ResumedRunContinuesBitForBit) {
  for (const auto& [model, precision] : {std::pair{ModelKind::kMlp, "fp32"}, std::pair{ModelKind::kMlp, "bf16"},
                                         std::pair{ModelKind::kTiny, "fp32"}, std::pair{ModelKind::kTiny, "bf16"}}) {
    SCOPED_TRACE(to_string(model) + std::string(" ") + precision);
    TrainConfig c = model == ModelKind::kMlp ? small_config() : small_transformer(TransformerConfig::Head::kCausalLM);
    c.precision = parse_choice<Precision>(precision, "--precision");
    expect_resumed_run_continues_bit_for_bit(c, to_string(model) + std::string("_") + precision);
  }
}

// --deterministic on with the fused attentions (the small preset's heads of 32, which both take): their backwards sum
// dQ in a fixed order, so a resumed run continues bit for bit there too. Sequences of 65 to 200 tokens: two to four
// key blocks, whose dQ shares atomics would add in any order. cuDNN's is skipped, with the reason, where its
// attention does not load.
TrainConfig deterministic_small_lm(AttentionKind attention) {
  TrainConfig c = small_transformer(TransformerConfig::Head::kCausalLM);
  c.model = ModelKind::kSmall;
  c.min_len = 65;
  c.max_len = 200;
  c.precision = Precision::kBf16;
  c.attention = attention;
  c.deterministic = true;
  return c;
}

TEST_F(CudaTrainerTest, ResumedRunWithDeterministicFusedAttentionContinuesBitForBit) {
  expect_resumed_run_continues_bit_for_bit(deterministic_small_lm(AttentionKind::kFused), "small_bf16_fused");
}

TEST_F(CudaTrainerTest, ResumedRunWithDeterministicCudnnAttentionContinuesBitForBit) {
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << why;
  expect_resumed_run_continues_bit_for_bit(deterministic_small_lm(AttentionKind::kCudnn), "small_bf16_cudnn");
}

// The rows of `parameter` (a matrix of `width` columns) that differ between two copies of a trainer's flat
// parameters: "1" changed, "." not, row by row.
std::string changed_rows(Trainer& trainer, const std::string& parameter, int64_t width,
                         const std::vector<float>& before, const std::vector<float>& after) {
  int64_t offset = -1, numel = 0;
  for (const GradPiece& piece : trainer.grad_pieces()) {
    const std::string name = trainer.piece_name(piece);
    if (name != parameter && name.rfind(parameter + "[", 0) != 0) continue;
    offset = offset < 0 ? piece.offset : std::min(offset, piece.offset);
    numel += piece.numel;
  }
  std::string rows;
  for (int64_t r = 0; offset >= 0 && r < numel / width; ++r) {
    const auto first = before.begin() + offset + r * width;
    rows += std::equal(first, first + width, after.begin() + offset + r * width) ? '.' : '1';
  }
  return rows;
}

// --batching pack through the GPU trainer (bf16, auto: the fused attention, heads of 32), against the CPU Trainer
// on the same packed batches (sequences of 20 to 100 tokens, log-uniform, in rows of up to 100, crossing 64-row
// blocks). The first step's update of wpe, without weight decay, changes exactly the rows of the positions its
// sequences reach with a target, which only the staged positions give: 89 rows (its longest sequence is 90 tokens,
// whose last has none), where a row offset taken for a position would change 99 (rows hold up to 100 tokens; seen
// on the CPU Trainer with its embedding so broken). Then three steps, each loss within 1% of the CPU's: on
// random tokens a packing error moves the loss less than that; the attention's packing is checked at the model
// (test_transformer_cuda's FusedAttentionOnPackedRowsMatchesCpu). One rank each, the same batches.
TEST_F(CudaTrainerTest, PackedRowsTrainAsOnTheCpu) {
  if (world_rank() == 0) {
    TrainConfig config = deterministic_small_lm(AttentionKind::kFused);
    config.attention.reset();
    config.deterministic = false;
    config.batching = Batching::kPack;
    config.lengths = LengthDist::kLogUniform;
    config.min_len = 20;
    config.max_len = 100;
    config.max_tokens = 400;
    config.optimizer.weight_decay = 0;
    config.steps = 3;
    TrainConfig on_cpu = config;
    on_cpu.device = Device::kCpu;
    on_cpu.comm = AllreduceImpl::kRing;
    on_cpu.precision = Precision::kFp32;
    Trainer gpu(config, MPI_COMM_SELF), cpu(on_cpu, MPI_COMM_SELF);
    const int64_t width = TransformerConfig::preset("small").d_model;
    const std::vector<float> gpu_start = gpu.parameters(), cpu_start = cpu.parameters();
    for (int step = 0; step < config.steps; ++step) {
      const double want = cpu.step(step, 0).loss, got = gpu.step(step, 0).loss;
      EXPECT_NEAR(got, want, 1e-2 * want) << "step " << step;
      std::printf("  packed step %d: loss %.6g (GPU, bf16) against %.6g (CPU)\n", step, got, want);
      if (step > 0) continue;
      const std::string on_gpu = changed_rows(gpu, "wpe", width, gpu_start, gpu.parameters()),
                        want_rows = changed_rows(cpu, "wpe", width, cpu_start, cpu.parameters());
      const size_t reached = want_rows.find('.');
      EXPECT_TRUE(reached > 0 && reached < static_cast<size_t>(config.max_len)) << want_rows;
      EXPECT_EQ(on_gpu, want_rows) << "wpe rows the first step changed (1), on the GPU against the CPU";
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// --optimizer-in-backward on: the update bucket by bucket (each behind its own all-reduce, the closing bucket's last)
// is the whole update, bit for bit (AdamW is elementwise; only the order of the launches changes), on every rank, on
// the MLP and on the transformer with its tied embedding closing backward. A NaN in one rank's first gradient stops
// every rank with that bucket not updated and the other finite buckets but the closing one updated.
TEST_F(CudaTrainerTest, TheUpdateBucketByBucketIsTheWholeUpdate) {
  for (const ModelKind model : {ModelKind::kMlp, ModelKind::kTiny}) {
    SCOPED_TRACE(to_string(model));
    TrainConfig c = model == ModelKind::kMlp ? small_config() : small_transformer(TransformerConfig::Head::kCausalLM);
    std::vector<float> params[2];
    for (int bucketed = 0; bucketed < 2; ++bucketed) {
      c.optimizer_in_backward = bucketed ? OnOff::kOn : OnOff::kOff;
      Trainer trainer(c, MPI_COMM_WORLD);
      for (int step = 0; step < c.steps; ++step) trainer.step(step, 0);
      params[bucketed] = trainer.parameters();
      EXPECT_TRUE(identical_across_ranks(params[bucketed]));
    }
    EXPECT_EQ(max_abs_diff(params[1], params[0]), 0.0);
  }
  TrainConfig c = small_config();
  c.optimizer_in_backward = OnOff::kOn;
  c.fault = Fault::kNan;
  c.fault_rank = world_size() - 1;
  c.fault_step = 1;
  Trainer trainer(c, MPI_COMM_WORLD);
  trainer.step(0, 0);
  const std::vector<float> before = trainer.parameters();
  std::string stopped;
  try {
    trainer.step(1, 0);
  } catch (const TrainingStopped& e) {
    stopped = e.what();
  }
  EXPECT_NE(stopped.find("already applied"), std::string::npos) << stopped;
  const std::vector<float> after = trainer.parameters();
  const std::vector<Bucket>& buckets = trainer.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const bool changed =
        !std::equal(after.begin() + buckets[b].offset, after.begin() + buckets[b].offset + buckets[b].count,
                    before.begin() + buckets[b].offset);
    EXPECT_EQ(changed, b > 0 && b + 1 < buckets.size()) << "bucket " << b;
  }
}

// A NaN in one rank's gradient stops every rank before the update; with --skip-nonfinite every rank skips the
// update instead and training goes on.
TEST_F(CudaTrainerTest, NonFiniteGradientStopsOrSkipsOnEveryRank) {
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "skip" : "stop");
    TrainConfig c = small_config();
    c.fault = Fault::kNan;
    c.fault_rank = world_size() - 1;
    c.fault_step = 1;
    c.skip_nonfinite = skip;
    Trainer trainer(c, MPI_COMM_WORLD);
    trainer.step(0, 0);
    const std::vector<float> before = trainer.parameters();
    std::string stopped;
    try {
      EXPECT_EQ(trainer.step(1, 0).skipped, skip ? 1.0 : 0.0);
    } catch (const TrainingStopped& e) {
      stopped = e.what();
    }
    EXPECT_EQ(stopped.empty(), skip) << stopped;
    if (!skip) {
      EXPECT_NE(stopped.find("non-finite gradient fc2.bias at step 1"), std::string::npos) << stopped;
    }
    EXPECT_EQ(max_abs_diff(trainer.parameters(), before), 0.0) << "the update must not be made";
    if (skip) {
      EXPECT_EQ(trainer.step(2, 0).skipped, 0.0);
      EXPECT_GT(max_abs_diff(trainer.parameters(), before), 0.0);
      EXPECT_TRUE(identical_across_ranks(trainer.parameters()));
    }
  }
}

}  // namespace
}  // namespace ddplab
