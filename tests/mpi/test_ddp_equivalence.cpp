// DDP equivalence: N ranks with per-rank batch B must train the same model as one rank with batch N*B over the
// same global samples, and all ranks must hold bitwise-identical parameters after every step.
//
// Each rank runs both: the data-parallel trainer on MPI_COMM_WORLD and, as the reference, a single-rank trainer
// on MPI_COMM_SELF with the global batch (the data is a pure function of the sample index, so it sees exactly
// the samples the N ranks see together).
//
// Tolerance: the two runs differ only in fp32 summation order — the mean over N*B rows in one GEMM versus N
// per-rank means summed by the all-reduce and scaled by 1/N — so gradients agree to ~1e-7 relative. Measured
// after 6 steps at np 2-4: SGD 1.5e-8, AdamW 7.5e-8 max absolute parameter difference. We allow
// 1e-6 (SGD) and 1e-5 (AdamW, whose division by sqrt(v) amplifies differences of near-zero gradients), while
// training moves parameters by ~1e-1 and ~6e-3: a wrong averaging or a lost shard fails by orders of magnitude.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/mpi/lr_schedule_check.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/unit/token_shards.h"
#include "train/token_batches.h"
#include "train/trainer.h"

namespace ddplab {
namespace {


TrainConfig small_config(const char* optimizer, const char* comm) {
  TrainConfig c;
  c.mlp = MlpConfig{24, 40, 2, 10};
  c.optimizer.kind = parse_choice<OptimizerKind>(optimizer, "--optimizer");
  c.optimizer.lr = std::strcmp(optimizer, "sgd") == 0 ? 0.05f : 1e-3f;
  c.optimizer.momentum = std::strcmp(optimizer, "sgd") == 0 ? 0.9f : 0.0f;
  c.batch = 5;  // odd on purpose: per-rank means of unequal-looking sums
  c.steps = 6;
  c.comm = parse_choice<AllreduceImpl>(comm, "--comm");
  return c;
}

// True when every rank's buffer equals rank 0's, bit for bit.
bool identical_across_ranks(const float* data, int64_t n) {
  std::vector<float> root(data, data + n);
  MPI_Bcast(root.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int mine = std::memcmp(root.data(), data, n * sizeof(float)) == 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all;
}

// Trains `reference` and `tested` side by side on every rank: the same loss and bitwise the same parameters after
// every step, identical across ranks at the end, and moved by training.
void expect_the_same_training_bitwise(const TrainConfig& reference_config, const TrainConfig& tested_config) {
  Trainer reference(reference_config, MPI_COMM_WORLD), tested(tested_config, MPI_COMM_WORLD);
  const std::vector<float> init = reference.parameters();
  ASSERT_EQ(init, tested.parameters());
  for (int step = 0; step < reference_config.steps; ++step) {
    EXPECT_EQ(reference.step(step, 0).loss, tested.step(step, 0).loss) << "step " << step;
    ASSERT_EQ(reference.parameters(), tested.parameters()) << "parameters after step " << step;
  }
  const std::vector<float> trained = tested.parameters();
  ASSERT_TRUE(identical_across_ranks(trained.data(), static_cast<int64_t>(trained.size())));
  EXPECT_NE(trained, init) << "training must have moved the parameters";
}

struct Case {
  const char* optimizer;
  const char* comm;
};

class DdpEquivalence : public testing::TestWithParam<Case> {};

TEST_P(DdpEquivalence, MatchesOneRankWithTheGlobalBatch) {
  const auto [optimizer, comm_name] = GetParam();
  const TrainConfig config = small_config(optimizer, comm_name);
  Trainer ddp(config, MPI_COMM_WORLD);

  TrainConfig global = config;
  global.batch = config.batch * world_size();
  Trainer single(global, MPI_COMM_SELF);

  const int64_t n = static_cast<int64_t>(ddp.parameters().size());
  ASSERT_EQ(n, static_cast<int64_t>(single.parameters().size()));
  const double tol = std::strcmp(optimizer, "sgd") == 0 ? 1e-6 : 1e-5;
  for (int step = 0; step < config.steps; ++step) {
    const double ddp_loss = ddp.step(step, 0).loss;
    const double single_loss = single.step(step, 0).loss;
    ASSERT_TRUE(identical_across_ranks(ddp.parameters().data(), n)) << "ranks diverged after step " << step;
    // The mean over ranks of per-rank losses is the loss on the global batch.
    double loss_sum = 0;
    MPI_Allreduce(&ddp_loss, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_NEAR(loss_sum / world_size(), single_loss, 1e-5 * std::abs(single_loss)) << "step " << step;
  }

  const std::vector<float> a = ddp.parameters(), b = single.parameters();
  double max_diff = 0;
  for (int64_t i = 0; i < n; ++i) max_diff = std::max(max_diff, std::abs(double(a[i]) - double(b[i])));
  if (world_size() == 1) {
    EXPECT_EQ(max_diff, 0.0) << "one rank must reproduce the single-rank run bit for bit";
  } else {
    EXPECT_LE(max_diff, tol) << "parameters after " << config.steps << " steps";
  }
  // The test means something only if training moved the parameters by much more than the tolerance.
  const std::vector<float> init = Trainer(config, MPI_COMM_SELF).parameters();
  double moved = 0;
  for (int64_t i = 0; i < n; ++i) moved = std::max(moved, std::abs(double(a[i]) - init[i]));
  EXPECT_GT(moved, 10 * tol);
  if (world_rank() == 0)
    std::printf("  max |ddp - single| = %.3g (tol %.3g), max |trained - init| = %.3g\n", max_diff, tol, moved);
}

// N ranks train `c` as one rank trains it with their global batch (the same samples every step, parameters within
// fp32 summation order) and stay identical; the run crosses the end of an epoch of `epoch_sequences`.
void expect_ranks_train_as_one_rank_with_the_global_batch(const TrainConfig& c, int64_t epoch_sequences) {
  const int64_t batches = int64_t{world_size()} * c.grad_accum;
  TrainConfig global = c;
  global.batch = static_cast<int>(c.batch * batches);
  global.max_tokens = c.max_tokens * batches;
  global.grad_accum = 1;
  Trainer ddp(c, MPI_COMM_WORLD), single(global, MPI_COMM_SELF);
  double samples = 0;
  for (int step = 0; step < c.steps; ++step) {
    const double mine = ddp.step(step, 0).samples;
    double all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(all, single.step(step, 0).samples) << "step " << step;
    samples += all;
  }
  EXPECT_GT(samples, static_cast<double>(epoch_sequences)) << "the run must cross the end of the epoch";
  const std::vector<float> a = ddp.parameters(), b = single.parameters();
  const int64_t n = static_cast<int64_t>(a.size());
  ASSERT_TRUE(identical_across_ranks(a.data(), n));
  double max_diff = 0, moved = 0;
  const std::vector<float> init = Trainer(global, MPI_COMM_SELF).parameters();
  for (int64_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::abs(double(a[i]) - b[i]));
    moved = std::max(moved, std::abs(double(b[i]) - init[i]));
  }
  EXPECT_LE(max_diff, 1e-6);
  EXPECT_GT(moved, 1e-4);
}

// Variable-length batches: ranks hold different numbers of sequences and tokens at each step, and each rank's
// gradient is weighted by its share of the global loss terms (train/workload.h), so N ranks still train the
// model of one rank with the global batch. The plans give the single rank exactly the union of the ranks'
// sequences at every step: sample and bucket cut the same shuffled order into the same global batches, pack the
// same rows. With gradient accumulation the global batch spans ranks x micro-batches, and micro-batches of unequal
// loss counts are weighted as well. The epoch ends inside the run, with a partial step (empty batches on some
// ranks and micro-batches) and a new plan after it.
struct TokenCase {
  const char* head;
  const char* batching;
  int grad_accum;
};

class TransformerDdpEquivalence : public testing::TestWithParam<TokenCase> {};

TEST_P(TransformerDdpEquivalence, MatchesOneRankWithTheGlobalBatch) {
  const auto [head, batching, grad_accum] = GetParam();
  TrainConfig c;
  c.model = ModelKind::kTiny;
  c.head = parse_choice<TransformerConfig::Head>(head, "--head");
  c.batching = parse_choice<Batching>(batching, "--batching");
  c.grad_accum = grad_accum;
  c.min_len = 4;
  c.max_len = 24;
  c.outlier_prob = 0.2;
  c.batch = 3;
  c.max_tokens = 2 * 24;  // pack: two rows per rank and micro-batch
  const int64_t batches = int64_t{world_size()} * grad_accum;
  // sample/bucket: 3 full steps, then 3 sequences; pack (~2 sequences per row): the epoch ends within 2-4 steps.
  c.epoch_size = std::strcmp(batching, "pack") == 0 ? 8 * batches + 3 : 3 * c.batch * batches + 3;
  c.steps = 5;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 0.1f;
  c.comm = AllreduceImpl::kRing;
  expect_ranks_train_as_one_rank_with_the_global_batch(c, c.epoch_size);
}

// The tiny transformer's LM head on the token shards `data` (--data), in windows of `window` tokens, as the command
// line sets it up.
TrainConfig tiny_lm_on_shards(const std::string& data, int window) {
  TrainConfig c;
  c.model = ModelKind::kTiny;
  c.head = TransformerConfig::Head::kCausalLM;
  c.data = data;
  c.lengths = LengthDist::kFixed;
  c.max_len = c.min_len = window;
  return c;
}

// Token shards (--data) through the same plans: two shards of unlike lengths, so that the windows of one step come
// from both, and an epoch of 31 windows that ends inside the run.
TEST(TokenShardsDdpEquivalence, MatchesOneRankWithTheGlobalBatch) {
  const SharedTempDir dir([](const std::string& path) {
    write_token_shard(path + "/shard_0.bin", counting_tokens(15 * 23 + 1, 0, 300));  // 23 windows of 16 tokens
    write_token_shard(path + "/shard_1.bin", counting_tokens(15 * 8 + 9, 7, 300));   // 8, and 8 tokens left over
  });
  TrainConfig c = tiny_lm_on_shards(dir.path() + "/shard_*.bin", 16);
  c.batch = 4;
  c.grad_accum = 2;
  c.steps = 5;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 0.1f;
  expect_ranks_train_as_one_rank_with_the_global_batch(c, 23 + 8);
}

// A shard whose next token always follows from the one before (a cycle of 13 ids): from the uniform guess over the
// vocabulary, ln 8192 = 9.0, the loss must fall to near 0, which only the shard's own order of tokens allows.
TEST(TokenShardsDdpEquivalence, TheModelLearnsTheShardsText) {
  const SharedTempDir dir([](const std::string& path) {
    std::vector<uint16_t> cycle(4000);
    for (size_t k = 0; k < cycle.size(); ++k) cycle[k] = static_cast<uint16_t>(500 + 37 * (k % 13));
    write_token_shard(path + "/cycle.bin", cycle);
  });
  TrainConfig c = tiny_lm_on_shards(dir.path() + "/cycle.bin", 32);
  c.batch = 12 / world_size();  // the same global batch, and so the same training, at np 1-4
  c.steps = 80;
  c.optimizer.lr = 1e-2f;
  c.val_data = c.data;  // validated on its own windows: the training loss's twin
  Trainer trainer(c, MPI_COMM_WORLD);
  const double first = trainer.step(0, 0).loss;
  double last = first;
  for (int step = 1; step < c.steps; ++step) last = trainer.step(step, 0).loss;
  EXPECT_NEAR(first, std::log(8192.0), 0.5);
  EXPECT_LT(last, 0.3) << "from " << first;  // 0.10 at np 1 (2.4 at step 20, 0.40 at step 60)
  EXPECT_LT(trainer.validation_loss(), 0.3);
}

// The validation loss (--val-data) is the mean over every window's loss terms, whatever the world size and however
// the windows fall into ranks and batches: the ranks' share of 13 windows (a batch of 2 rows per rank) against one
// model that evaluates each window alone, in double. The same value on every rank, and the model left as it was.
TEST(ValidationLoss, IsTheMeanOverEveryWindowAtAnyWorldSize) {
  const SharedTempDir dir([](const std::string& path) {
    write_token_shard(path + "/val.bin", counting_tokens(9 * 13 + 5, 3, 5000));  // 13 windows of 10 tokens
  });
  TrainConfig c = tiny_lm_on_shards(dir.path() + "/val.bin", 10);
  c.val_data = c.data;
  c.batch = 2;
  c.steps = 1;
  Trainer trainer(c, MPI_COMM_WORLD);
  const std::vector<float> before = trainer.parameters();
  const double loss = trainer.validation_loss();
  EXPECT_EQ(trainer.parameters(), before);
  double root = loss;
  MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(loss, root) << "every rank the same";

  Transformer<float> model(TokenBatches::model_config(c), c.seed);  // the replicas' initial parameters
  const TokenFiles windows(c.val_data, c.max_len);
  ASSERT_EQ(windows.sequences(), 13);
  double sum = 0;
  std::vector<int32_t> tokens(10);
  for (int64_t i = 0; i < windows.sequences(); ++i) {
    windows.fill(tokens.data(), i);
    sum += model.forward(tokens.data(), nullptr, nullptr, 1, 10);  // 9 terms each
  }
  EXPECT_NEAR(loss, sum / 13, 1e-6 * loss);
  EXPECT_GT(loss, 8.0);  // untrained: about ln 8192 = 9.0

  TrainConfig first_five = c;  // --val-windows: a prefix of the windows
  first_five.val_windows = 5;
  Trainer prefix(first_five, MPI_COMM_WORLD);
  double sum5 = 0;
  for (int64_t i = 0; i < 5; ++i) {
    windows.fill(tokens.data(), i);
    sum5 += model.forward(tokens.data(), nullptr, nullptr, 1, 10);
  }
  EXPECT_NEAR(prefix.validation_loss(), sum5 / 5, 1e-6 * loss);

  TrainConfig first_one = c;  // every rank but rank 0 without a window: they still meet in the sum
  first_one.val_windows = 1;
  Trainer single_window(first_one, MPI_COMM_WORLD);
  windows.fill(tokens.data(), 0);
  EXPECT_NEAR(single_window.validation_loss(), model.forward(tokens.data(), nullptr, nullptr, 1, 10), 1e-6 * loss);
}

// --optimizer-in-backward updates each bucket while backward still runs, as soon as backward no longer reads its
// parameters (GradReadyHook's promise). The parameters must be bitwise those of the update after backward, step after
// step: an update that came before a layer's input gradient read its weight would change every gradient below it.
// Small buckets and row-block pieces put the bucket edges inside layers and weights; accumulation and overlap off
// change when the buckets are reduced. A release rule that frees a weight as soon as it is announced fails the MLP
// cases at np 1 (checked by hand); at more ranks the reduction comes later than the input gradient and hides it.
struct InBackwardCase {
  const char* model;
  double grad_slice_mb;
  int grad_accum;
  bool overlap;
};

class OptimizerInBackward : public testing::TestWithParam<InBackwardCase> {};

TEST_P(OptimizerInBackward, GivesTheParametersOfTheUpdateAfterBackwardBitwise) {
  const auto [model, grad_slice_mb, grad_accum, overlap] = GetParam();
  TrainConfig after;
  after.model = parse_choice<ModelKind>(model, "--model");
  after.mlp = MlpConfig{256, 512, 2, 10};  // GEMMs long enough for the optimizer thread to run beside them
  after.batch = 16;
  after.min_len = 4;
  after.max_len = 24;
  after.steps = 4;
  after.bucket_mb = 0.25;
  after.last_bucket_mb = 0.1;
  after.grad_slice_mb = grad_slice_mb;
  after.grad_accum = grad_accum;
  after.overlap = overlap;
  after.optimizer_in_backward = OnOff::kOff;
  TrainConfig inside = after;
  inside.optimizer_in_backward = OnOff::kOn;
  expect_the_same_training_bitwise(after, inside);
}

INSTANTIATE_TEST_SUITE_P(ModelsSlicesAccumulationOverlap, OptimizerInBackward,
                         testing::Values(InBackwardCase{"mlp", 0, 1, true}, InBackwardCase{"mlp", 0.1, 1, true},
                                         InBackwardCase{"mlp", 0.1, 2, false}, InBackwardCase{"tiny", 0, 1, true},
                                         InBackwardCase{"tiny", 0.02, 2, true}),
                         [](const testing::TestParamInfo<InBackwardCase>& info) {
                           return std::string(info.param.model) + (info.param.grad_slice_mb > 0 ? "_sliced" : "") +
                                  "_accum" + std::to_string(info.param.grad_accum) +
                                  (info.param.overlap ? "" : "_overlap_off");
                         });

// --zero-stage 1: the gradients reduce-scattered, each rank updating the elements it owns, the parameters
// all-gathered. The sums are the all-reduce's, in its order, and the update is element-wise, so the parameters must be
// bitwise those of the replicated update, step after step, on every rank. Small buckets put the owned chunks' edges
// inside layers (and the smallest buckets are all-reduced whole); accumulation and overlap off change when the
// buckets are reduced. A missing all-gather, or an owned chunk the update skips, leaves stale parameters somewhere.
struct ShardedCase {
  const char* model;
  const char* optimizer;
  double bucket_mb;
  int grad_accum;
  bool overlap;
};

class ShardedUpdate : public testing::TestWithParam<ShardedCase> {};

TEST_P(ShardedUpdate, GivesTheParametersOfTheReplicatedUpdateBitwise) {
  const auto [model, optimizer, bucket_mb, grad_accum, overlap] = GetParam();
  TrainConfig replicated;
  replicated.model = parse_choice<ModelKind>(model, "--model");
  replicated.optimizer.kind = parse_choice<OptimizerKind>(optimizer, "--optimizer");
  replicated.optimizer.momentum = std::strcmp(optimizer, "sgd") == 0 ? 0.9f : 0.0f;
  replicated.mlp = MlpConfig{64, 96, 2, 10};
  replicated.batch = 8;
  replicated.min_len = 4;
  replicated.max_len = 24;
  replicated.steps = 4;
  replicated.bucket_mb = bucket_mb;
  replicated.first_bucket_mb = bucket_mb / 4;  // the ends cut apart from the rest
  replicated.last_bucket_mb = bucket_mb / 2;
  replicated.grad_accum = grad_accum;
  replicated.overlap = overlap;
  replicated.optimizer_in_backward = OnOff::kOff;
  TrainConfig sharded = replicated;
  sharded.zero_stage = 1;
  expect_the_same_training_bitwise(replicated, sharded);
}

// --grad-clip: the norm is that of the all-reduced (mean) gradients, which every rank holds alike. Against references
// that share none of its code:
// - the arithmetic: with SGD (no momentum, no decay) a step moves the parameters by -lr g, so the unclipped step
//   gives g; the clipped step must record |g| as its norm and move by -lr g cap / (|g| + 1e-6);
// - DDP's equivalence: N ranks clip as one rank with the global batch (a norm taken over a rank's own gradients, or
//   before the all-reduce, would clip by another factor and fail it by far more than rounding);
// - the sharded update (--zero-stage 1), where each rank sums the squares of the elements it owns and the ranks' sums
//   are added: the same norm (to rounding), the same parameters on every rank, bit for bit.
TrainConfig clipped_config(const char* model, double bucket_mb, float grad_clip) {
  TrainConfig c;
  c.model = parse_choice<ModelKind>(model, "--model");
  c.mlp = MlpConfig{24, 40, 2, 10};
  c.min_len = 4;
  c.max_len = 24;
  c.batch = 5;
  c.steps = 4;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.lr = 0.1f;
  c.optimizer.weight_decay = 0.0f;
  c.optimizer.grad_clip = grad_clip;
  c.bucket_mb = bucket_mb;
  c.last_bucket_mb = bucket_mb / 2;
  c.optimizer_in_backward = OnOff::kOff;
  return c;
}

// The distance from |x| to the next float: the rounding of an update of x is half of it.
double ulp(float x) { return std::nextafter(std::fabs(x), INFINITY) - std::fabs(x); }

double l2_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum);
}

class GradClip : public testing::TestWithParam<const char*> {};

TEST_P(GradClip, ScalesTheStepByCapOverTheNormOfTheReducedGradients) {
  const TrainConfig unclipped = clipped_config(GetParam(), 0.002, 0.0f);
  Trainer free_step(unclipped, MPI_COMM_WORLD);
  const std::vector<float> init = free_step.parameters();
  EXPECT_EQ(free_step.step(0, 0).grad_norm, 0.0) << "no norm is taken without --grad-clip";
  const std::vector<float> after_free = free_step.parameters();
  const double norm = l2_distance(after_free, init) / unclipped.optimizer.lr;  // |g|, from the step it made
  for (const float cap : {static_cast<float>(norm / 4), static_cast<float>(norm * 2)}) {
    TrainConfig clipped = unclipped;
    clipped.optimizer.grad_clip = cap;
    Trainer clipped_step(clipped, MPI_COMM_WORLD);
    const StepRecord r = clipped_step.step(0, 0);
    EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm);
    const std::vector<float> after = clipped_step.parameters();
    const double scale = std::min(1.0, cap / (norm + 1e-6));
    for (size_t i = 0; i < init.size(); ++i)
      ASSERT_NEAR(after[i] - init[i], (after_free[i] - init[i]) * scale,
                  1e-6 * norm * unclipped.optimizer.lr + 2 * ulp(init[i]))
          << "parameter element " << i << ", cap " << cap << " (norm " << norm << ")";
  }
}

TEST_P(GradClip, MatchesOneRankWithTheGlobalBatch) {
  const TrainConfig c = clipped_config(GetParam(), 0.002, 0.05f);
  TrainConfig global = c;
  global.batch = c.batch * world_size();
  Trainer ddp(c, MPI_COMM_WORLD), single(global, MPI_COMM_SELF);
  for (int step = 0; step < c.steps; ++step) {
    const double ddp_norm = ddp.step(step, 0).grad_norm, single_norm = single.step(step, 0).grad_norm;
    EXPECT_GT(single_norm, 2 * c.optimizer.grad_clip) << "step " << step << " must clip";
    EXPECT_NEAR(ddp_norm, single_norm, 1e-5 * single_norm) << "step " << step;
    double root = ddp_norm;
    MPI_Bcast(&root, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    EXPECT_EQ(ddp_norm, root) << "every rank takes the same norm, step " << step;
  }
  const std::vector<float> a = ddp.parameters(), b = single.parameters();
  ASSERT_TRUE(identical_across_ranks(a.data(), static_cast<int64_t>(a.size())));
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::abs(double(a[i]) - b[i]));
  EXPECT_LE(max_diff, 1e-6);
}

TEST_P(GradClip, ShardedTakesTheNormOfTheReplicatedUpdate) {
  const TrainConfig replicated = clipped_config(GetParam(), 0.002, 0.05f);
  TrainConfig sharded = replicated;
  sharded.zero_stage = 1;
  Trainer a(replicated, MPI_COMM_WORLD), b(sharded, MPI_COMM_WORLD);
  for (int step = 0; step < replicated.steps; ++step) {
    const double norm_a = a.step(step, 0).grad_norm, norm_b = b.step(step, 0).grad_norm;
    EXPECT_GT(norm_a, replicated.optimizer.grad_clip) << "step " << step << " must clip";
    EXPECT_NEAR(norm_b, norm_a, 1e-12 * norm_a) << "step " << step;
    const std::vector<float> pa = a.parameters(), pb = b.parameters();
    ASSERT_TRUE(identical_across_ranks(pb.data(), static_cast<int64_t>(pb.size()))) << "step " << step;
    for (size_t i = 0; i < pa.size(); ++i)
      ASSERT_NEAR(pb[i], pa[i], 1e-7 * (1 + std::abs(pa[i]))) << "element " << i << ", step " << step;
  }
}

// --lr-schedule and --lr-warmup reach the update however the CPU updates: after backward, in backward, sharded
// (tests/mpi/lr_schedule_check.h; the rates themselves: LearningRate in test_optimizer.cpp).
class LrScheduleReachesTheUpdate : public testing::TestWithParam<const char*> {};

TEST_P(LrScheduleReachesTheUpdate, AsAConstantRateOfThatStep) {
  TrainConfig config = clipped_config("mlp", 0.002, 0.0f);
  config.optimizer.kind = OptimizerKind::kAdamW;
  const std::string update = GetParam();
  if (update == "in_backward") config.optimizer_in_backward = OnOff::kOn;
  if (update == "sharded") config.zero_stage = 1;
  expect_the_schedule_reaches_the_update(config);
  // And step after step in one run: the same parameters as the update after backward on the same schedule.
  if (update == "after_backward") return;
  TrainConfig reference = clipped_config("mlp", 0.002, 0.0f);
  reference.optimizer.kind = OptimizerKind::kAdamW;
  reference.optimizer.lr_warmup = 3;
  reference.optimizer.lr_schedule = LrSchedule::kCosine;
  reference.optimizer.lr_final = 0.1f;
  reference.steps = 10;
  TrainConfig tested = reference;
  tested.optimizer_in_backward = config.optimizer_in_backward;
  tested.zero_stage = config.zero_stage;
  expect_the_same_training_bitwise(reference, tested);
}

INSTANTIATE_TEST_SUITE_P(Updates, LrScheduleReachesTheUpdate,
                         testing::Values("after_backward", "in_backward", "sharded"));

// The update in backward cannot wait for the norm, skip a step it has begun to apply, or shard the update: a Trainer
// built from such a config directly (the CLI refuses it earlier) refuses it on every rank rather than train wrongly.
TEST(UpdateInBackwardRefused, WithClippingSkippingOrTheShardedUpdate) {
  TrainConfig c = clipped_config("mlp", 0.002, 0.05f);
  c.optimizer_in_backward = OnOff::kOn;
  EXPECT_THROW(Trainer(c, MPI_COMM_WORLD), std::invalid_argument);
  c.optimizer.grad_clip = 0;
  c.skip_nonfinite = true;
  EXPECT_THROW(Trainer(c, MPI_COMM_WORLD), std::invalid_argument);
  c.skip_nonfinite = false;
  c.zero_stage = 1;
  EXPECT_THROW(Trainer(c, MPI_COMM_WORLD), std::invalid_argument);
}

// Small buckets: the norm spans many buckets. With ZeRO-1, the tiny transformer's embeddings are sharded and its other
// buckets too small to shard (the MLP's all are); test_ddp_equivalence_sharded_small_rounds shards every bucket.
INSTANTIATE_TEST_SUITE_P(Models, GradClip, testing::Values("mlp", "tiny"));

INSTANTIATE_TEST_SUITE_P(ModelsBucketsAccumulationOverlap, ShardedUpdate,
                         testing::Values(ShardedCase{"mlp", "adamw", 25, 1, true},
                                         ShardedCase{"mlp", "adamw", 0.02, 1, true},
                                         ShardedCase{"mlp", "sgd", 0.02, 2, false},
                                         ShardedCase{"tiny", "adamw", 0.05, 1, true},
                                         ShardedCase{"tiny", "adamw", 0.05, 2, true}),
                         [](const testing::TestParamInfo<ShardedCase>& info) {
                           return std::string(info.param.model) + "_" + info.param.optimizer +
                                  (info.param.bucket_mb < 1 ? "_small_buckets" : "") + "_accum" +
                                  std::to_string(info.param.grad_accum) + (info.param.overlap ? "" : "_overlap_off");
                         });

INSTANTIATE_TEST_SUITE_P(HeadsBatchingsAccumulation, TransformerDdpEquivalence,
                         testing::Values(TokenCase{"classify", "sample", 1}, TokenCase{"classify", "bucket", 1},
                                         TokenCase{"lm", "sample", 1}, TokenCase{"lm", "bucket", 1},
                                         TokenCase{"lm", "pack", 1}, TokenCase{"classify", "bucket", 2},
                                         TokenCase{"lm", "sample", 2}, TokenCase{"lm", "pack", 2}),
                         [](const testing::TestParamInfo<TokenCase>& info) {
                           return std::string(info.param.head) + "_" + info.param.batching + "_accum" +
                                  std::to_string(info.param.grad_accum);
                         });

INSTANTIATE_TEST_SUITE_P(OptimizersAndComms, DdpEquivalence,
                         testing::Values(Case{"sgd", "ring"}, Case{"adamw", "ring"}, Case{"sgd", "mpi"},
                                         Case{"adamw", "mpi"}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.optimizer) + "_" + info.param.comm;
                         });

}  // namespace
}  // namespace ddplab
