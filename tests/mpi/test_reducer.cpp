// The Reducer in training: overlap on and off give bitwise-identical parameters for every bucket size, any bucket
// size matches the single-rank reference, gradient accumulation matches one K-times-larger batch, bucket timings
// are causal, and ranks with different bucket layouts are refused.
//
// Tolerances as in test_ddp_equivalence.cpp: different bucketings or micro-batch splits change only the fp32
// summation order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ddp/reducer.h"
#include "runtime/errors.h"
#include "tests/mpi/mpi_test_util.h"
#include "train/trainer.h"

namespace ddplab {
namespace {


TrainConfig small_config(const char* comm = "ring") {
  TrainConfig c;
  c.comm = parse_choice<AllreduceImpl>(comm, "--comm");
  c.mlp = MlpConfig{24, 40, 3, 10};  // 8 parameters, 2.3k-6k bytes each
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 0.05f;
  c.optimizer.momentum = 0.9f;
  c.batch = 6;
  c.steps = 5;
  return c;
}

std::vector<float> train(const TrainConfig& c, MPI_Comm comm) {
  Trainer t(c, comm);
  for (int s = 0; s < c.steps; ++s) t.step(s, 0);
  return t.parameters();
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  return d;
}

class ReducerTraining : public testing::TestWithParam<const char*> {};  // param: --comm

TEST_P(ReducerTraining, OverlapOnAndOffAgreeBitwiseAndMatchOneRank) {
  const MPI_Comm world = MPI_COMM_WORLD;
  const MPI_Comm self = MPI_COMM_SELF;
  TrainConfig reference_config = small_config(GetParam());
  reference_config.batch *= world_size();
  const auto reference = train(reference_config, self);

  // The two ends' caps: the first cut as the others (auto) with the last's cap at 0, small and huge; and PyTorch's
  // layout, a small first bucket and the last cut as the others.
  const std::tuple<double, double, BucketRule> ends[] = {{kAutoEndBucketMb, 0.0, BucketRule::kWithin},
                                                         {kAutoEndBucketMb, 0.01, BucketRule::kWithin},
                                                         {kAutoEndBucketMb, 1e9, BucketRule::kWithin},
                                                         {0.01, kAutoEndBucketMb, BucketRule::kReach}};
  for (double bucket_mb : {0.0, 0.005, 0.02, 25.0, 1e9}) {
    for (const auto& [first_bucket_mb, last_bucket_mb, rule] : ends) {
      TrainConfig c = small_config(GetParam());
      c.bucket_mb = bucket_mb;
      c.first_bucket_mb = first_bucket_mb;
      c.last_bucket_mb = last_bucket_mb;
      c.bucket_rule = rule;
      c.grad_slice_mb = bucket_mb == 0.005 ? 0.001 : 0.0;  // 1 KiB row blocks: weights of 3.8-6.4 KiB in pieces
      c.overlap = true;
      const auto on = train(c, world);
      c.overlap = false;
      const auto off = train(c, world);
      ASSERT_EQ(std::memcmp(on.data(), off.data(), on.size() * sizeof(float)), 0)
          << "overlap changed the result at --bucket-mb " << bucket_mb << " --first-bucket-mb " << first_bucket_mb
          << " --last-bucket-mb " << last_bucket_mb;
      EXPECT_LE(max_abs_diff(on, reference), 1e-6) << "--bucket-mb " << bucket_mb;
    }
  }
}

TEST_P(ReducerTraining, GradAccumulationMatchesOneLargerBatch) {
  const MPI_Comm world = MPI_COMM_WORLD;
  for (int k : {2, 3}) {
    TrainConfig accumulated = small_config(GetParam());
    accumulated.grad_accum = k;
    accumulated.bucket_mb = 0.01;
    TrainConfig large = small_config(GetParam());
    large.batch *= k;
    const double diff = max_abs_diff(train(accumulated, world), train(large, world));
    EXPECT_LE(diff, 1e-6) << "--grad-accum " << k;
  }
}

TEST_P(ReducerTraining, BucketTimingsAreCausal) {
  const MPI_Comm world = MPI_COMM_WORLD;
  for (bool overlap : {true, false}) {
    TrainConfig c = small_config(GetParam());
    c.bucket_mb = c.last_bucket_mb = 0;  // one bucket per parameter: 8 buckets
    c.overlap = overlap;
    Trainer t(c, world);
    for (int s = 0; s < 3; ++s) {
      const StepRecord r = t.step(s, 0);
      const double backward_end = r.start_ms + r.data_ms + r.forward_ms + r.backward_ms;
      const auto& times = t.bucket_times();
      ASSERT_EQ(times.size(), 8u);
      for (size_t b = 0; b < times.size(); ++b) {
        EXPECT_LE(times[b].ready_ms, times[b].comm_start_ms) << "bucket " << b;
        EXPECT_LE(times[b].comm_start_ms, times[b].comm_end_ms) << "bucket " << b;
        EXPECT_LE(times[b].comm_end_ms, backward_end + r.exposed_comm_ms + 1e-3) << "bucket " << b;
        if (b > 0) {
          EXPECT_LE(times[b - 1].comm_end_ms, times[b].comm_start_ms) << "buckets run in order";
        }
        if (!overlap) {
          EXPECT_GE(times[b].comm_start_ms, backward_end - 1e-3) << "overlap off starts after backward";
        }
      }
      if (!overlap) {
        EXPECT_EQ(r.hidden_comm_ms, 0.0);
      }
      EXPECT_LE(r.hidden_comm_ms, r.comm_ms + 1e-9);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Comms, ReducerTraining, testing::Values("ring", "mpi"),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

TEST(Pathologies, ChangeTimingNeverTheMath) {
  const MPI_Comm world = MPI_COMM_WORLD;
  TrainConfig slow = small_config();
  slow.straggler_ms = 1;
  slow.slow_rank = world_size() - 1;
  slow.extra_allreduce_mb = 0.01;
  slow.rank0_work_ms = 1;
  slow.barrier_every = 2;
  slow.data_cost_ms = 0.05;
  slow.loader_threads = 2;
  const auto a = train(small_config(), world), b = train(slow, world);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(Reducer, RanksWithDifferentBucketLayoutsAreRefusedOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const MPI_Comm world = MPI_COMM_WORLD;
  TrainConfig c = small_config();
  c.bucket_mb = c.last_bucket_mb = world_rank() == 0 ? 0.0 : 1e9;  // rank 0 would run 8 all-reduces, others 1
  try {
    Trainer t(c, world);
    ADD_FAILURE() << "a mismatched layout was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket layout differs"), std::string::npos) << e.what();
  }
}

// More buckets than the all-reduce has tags: bad input, refused on every rank before the first step (UsageError:
// exit 2), naming the flag to raise. One rank all-reduces nothing and needs no tags: it runs.
TEST(Reducer, MoreBucketsThanTagsAreBadInputWhereRanksTalk) {
  const size_t pieces = Communicator::kMaxTag + 2;
  std::vector<int64_t> numel(pieces, 1), offset(pieces);
  for (size_t k = 0; k < pieces; ++k) offset[k] = static_cast<int64_t>(k);
  std::vector<float> grads(pieces);
  const ReducerConfig one_bucket_per_piece{BucketCaps{}, true};
  Communicator self(MPI_COMM_SELF, AllreduceImpl::kRing);
  EXPECT_NO_THROW(Reducer(self, one_bucket_per_piece, numel, offset, grads.data()));
  if (world_size() < 2) return;
  Communicator world(MPI_COMM_WORLD, AllreduceImpl::kRing);
  try {
    Reducer reducer(world, one_bucket_per_piece, numel, offset, grads.data());
    ADD_FAILURE() << "32769 buckets were accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("raise --bucket-mb"), std::string::npos) << e.what();
  }
}

TEST(Reducer, AGradientNeverMarkedReadyIsAnError) {
  Communicator self(MPI_COMM_SELF, AllreduceImpl::kRing);
  std::vector<float> grads(10);
  Reducer reducer(self, ReducerConfig{BucketCaps{}, true}, {4, 6}, {0, 4}, grads.data());
  reducer.begin_step(0, 1.0f);
  reducer.mark_ready(0);
  EXPECT_THROW(reducer.wait_all(), std::logic_error);  // piece 1 never arrived: DDP's "unused parameter" error
}

// One rank has nobody to all-reduce with: a bucket costs no comm time at all (exactly zero, where the old comm
// thread's scale + copy + check measured a fraction of a millisecond), yet the mean's factor and the NaN check remain.
TEST(Reducer, AtWorldSizeOneNoAllReduceWorkIsDone) {
  for (bool overlap : {true, false}) {
    TrainConfig c = small_config();
    c.bucket_mb = c.last_bucket_mb = 0;  // 8 buckets
    c.overlap = overlap;
    Trainer t(c, MPI_COMM_SELF);
    for (int s = 0; s < 3; ++s) {
      const StepRecord r = t.step(s, 0);
      EXPECT_EQ(r.comm_ms, 0.0) << "overlap " << overlap;
      EXPECT_EQ(r.hidden_comm_ms, 0.0);
      for (const BucketTimes& b : t.bucket_times()) EXPECT_EQ(b.comm_start_ms, b.comm_end_ms);
    }
  }

  Communicator self(MPI_COMM_SELF, AllreduceImpl::kRing);
  std::vector<float> grads{1, 2, 3, 4, 5, 6};
  Reducer reducer(self, ReducerConfig{BucketCaps{}, true}, {2, 4}, {0, 2}, grads.data());  // a bucket per piece
  ASSERT_EQ(reducer.buckets().size(), 2u);
  reducer.begin_step(0, 0.5f, 3.0f);  // two micro-batches' mean of a batch weighted 3: x1.5, exact in fp32
  reducer.mark_ready(0);
  grads[5] = NAN;  // in piece 1 = bucket 1
  reducer.mark_ready(1);
  reducer.wait_all();
  EXPECT_EQ(grads[0], 1.5f);
  EXPECT_EQ(grads[4], 7.5f);
  EXPECT_EQ(reducer.first_nonfinite_bucket(), 1);
}

}  // namespace
}  // namespace ddplab
