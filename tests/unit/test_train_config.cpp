// The choices a run leaves to "auto" (config/train_config.h, resolved): the update in backward, the weight gradients'
// row blocks and the attention, per device and per host.
#include <gtest/gtest.h>

#include <algorithm>

#include "config/train_config.h"
#include "record/run_record.h"  // upgrade_config_keys

namespace ddplab {
namespace {

RunFacts host_with_a_spare_core() {
  RunFacts facts;
  facts.cores = 1;
  facts.spare_core_every_rank = true;
  return facts;
}

// On the CPU, with a core left idle by the BLAS threads, the update runs in backward and follows each weight's
// gradient in 1 MiB row blocks; without one, neither.
TEST(ResolvedConfig, CpuUpdateInBackwardTakesRowBlocksWhereACoreIsSpare) {
  TrainConfig spare = resolved(TrainConfig{}, host_with_a_spare_core());
  EXPECT_TRUE(spare.update_in_backward());
  EXPECT_EQ(spare.grad_slice_mb, 1.0);
  TrainConfig full = resolved(TrainConfig{}, RunFacts{});
  EXPECT_FALSE(full.update_in_backward());
  EXPECT_EQ(full.grad_slice_mb, 0.0);
}

// What must see every gradient before any update, --skip-nonfinite and --grad-clip, keeps auto's update after backward,
// core to spare or not (and whole weights with it); ZeRO-1 too.
TEST(ResolvedConfig, NoUpdateInBackwardWhereTheStepNeedsEveryGradientFirst) {
  TrainConfig skip, clip, sharded;
  skip.skip_nonfinite = true;
  clip.optimizer.grad_clip = 1.0f;
  sharded.zero_stage = 1;
  for (const TrainConfig& c : {skip, clip, sharded}) {
    const TrainConfig r = resolved(c, host_with_a_spare_core());
    EXPECT_FALSE(r.update_in_backward());
    EXPECT_EQ(r.grad_slice_mb, 0.0);
  }
}

// On the GPU the update in backward is asked for, never chosen, and keeps whole weights: row blocks there are many
// small GEMMs.
TEST(ResolvedConfig, GpuUpdateInBackwardKeepsWholeWeights) {
  TrainConfig c;
  c.device = Device::kCuda;
  EXPECT_FALSE(resolved(c, host_with_a_spare_core()).update_in_backward());
  c.optimizer_in_backward = OnOff::kOn;
  const TrainConfig r = resolved(c, host_with_a_spare_core());
  EXPECT_TRUE(r.update_in_backward());
  EXPECT_EQ(r.grad_slice_mb, 0.0);
}

// A size the user gave is kept, on either device.
TEST(ResolvedConfig, AGivenSliceSizeIsKept) {
  for (Device device : {Device::kCpu, Device::kCuda}) {
    TrainConfig c;
    c.device = device;
    c.optimizer_in_backward = OnOff::kOn;
    c.grad_slice_mb = 4;
    EXPECT_EQ(resolved(c, RunFacts{}).grad_slice_mb, 4.0);
  }
}

// Any positive size is row blocks, however small (a block is one row at least); 0 alone is whole weights.
TEST(ResolvedConfig, ASliceSizeBelowOneFloatIsStillRowBlocks) {
  TrainConfig c;
  c.grad_slice_mb = 1e-6;  // 1.05 bytes
  EXPECT_EQ(grad_slice_elements(c), 1);
  c.grad_slice_mb = 1.0;
  EXPECT_EQ(grad_slice_elements(c), 262144);
  c.grad_slice_mb = 0;
  EXPECT_EQ(grad_slice_elements(c), 0);
}

// --attention auto on the GPU in bf16: cuDNN's where it loads on every rank and no sequence is one token, else our
// fused kernels, else unfused, with --deterministic on or off (each then runs its deterministic backward). fp32 and
// tf32 and the CPU: unfused. A choice given is kept.
TEST(ResolvedConfig, AutoAttentionTakesTheFastestThatCanRun) {
  TrainConfig c;
  c.model = ModelKind::kGpt2Small;  // heads of 64: every attention has them
  c.head = TransformerConfig::Head::kCausalLM;
  c.device = Device::kCuda;
  c.precision = Precision::kBf16;
  RunFacts with_cudnn;
  with_cudnn.cudnn_available = true;
  EXPECT_EQ(resolved(c, with_cudnn).attention, AttentionKind::kCudnn);
  EXPECT_EQ(resolved(c, RunFacts{}).attention, AttentionKind::kFused);
  c.min_len = 1;
  EXPECT_EQ(resolved(c, with_cudnn).attention, AttentionKind::kFused) << "cuDNN takes no single-token sequence";
  c.deterministic = true;
  EXPECT_EQ(resolved(c, with_cudnn).attention, AttentionKind::kFused);
  c.min_len = 64;
  EXPECT_EQ(resolved(c, with_cudnn).attention, AttentionKind::kCudnn);
  c.deterministic = false;
  for (Precision p : {Precision::kFp32, Precision::kTf32}) {
    c.precision = p;
    EXPECT_EQ(resolved(c, with_cudnn).attention, AttentionKind::kUnfused) << to_string(p);
  }
  c.precision = Precision::kBf16;
  c.attention = AttentionKind::kUnfused;
  EXPECT_EQ(resolved(c, with_cudnn).attention, AttentionKind::kUnfused);
  TrainConfig cpu;
  cpu.model = ModelKind::kGpt2Small;
  EXPECT_EQ(resolved(cpu, with_cudnn).attention, AttentionKind::kUnfused);
}

// What a resumed run must repeat: what changes a step's arithmetic, each a key the run file's config has (a misspelt
// key would compare null with null and pass anything); under hier the nodes; on the GPU the attention, the order of
// dQ's sums and the GEMMs' algorithms too; what only moves time, never (the bucket size does change the sums: a ring's
// chunks are cut per bucket).
TEST(ResumeSettings, RepeatWhatChangesTheArithmeticAndNothingElse) {
  const auto has = [](const std::vector<std::string>& keys, const std::string& key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  TrainConfig cpu;
  const nlohmann::json stored = to_json(cpu);
  const std::vector<std::string> on_cpu = keys_a_resume_repeats(cpu);
  for (const char* key : {"world_size", "seed", "device", "precision", "model", "lr"})
    EXPECT_TRUE(has(on_cpu, key)) << key;
  for (const char* key :
       {"attention", "deterministic", "gemm_algo", "node_of_rank", "steps", "overlap", "link", "straggler_ms", "out"})
    EXPECT_FALSE(has(on_cpu, key)) << key;
  for (const std::string& key : on_cpu) EXPECT_TRUE(key == "world_size" || stored.contains(key)) << key;

  TrainConfig gpu = cpu;
  gpu.device = Device::kCuda;
  gpu.optimizer.lr_schedule = LrSchedule::kCosine;
  const std::vector<std::string> on_gpu = keys_a_resume_repeats(gpu);
  for (const char* key : {"attention", "deterministic", "gemm_algo", "steps"}) {
    EXPECT_TRUE(has(on_gpu, key)) << key;
    EXPECT_TRUE(stored.contains(key)) << key;
  }
  EXPECT_FALSE(has(on_gpu, "overlap"));

  TrainConfig hier = cpu;  // it sums within each node first; the checkpoint records the nodes, not a knob
  hier.comm = AllreduceImpl::kHier;
  EXPECT_TRUE(has(keys_a_resume_repeats(hier), "node_of_rank"));
}

// The bucket caps a run cuts its buckets at (ddp/buckets.h): a number is an end's own cap, auto none of its own; a
// config stores "auto" as such and reads it back; a file older than --last-bucket-mb stored the closing bucket's
// cap as first_bucket_mb, its first bucket cut as the others: read as what it meant.
TEST(BucketCapsConfig, AutoEndsAreStoredAsAutoAndOlderFilesReadAsTheyMeant) {
  TrainConfig c;
  EXPECT_EQ(bucket_caps(c).first_bytes, BucketCaps::kAsTheOthers);  // the defaults: ddplab's 1 MiB tail
  EXPECT_EQ(bucket_caps(c).last_bytes, 1048576.0);
  c.bucket_mb = 5;
  c.first_bucket_mb = 0.5;
  c.last_bucket_mb = kAutoEndBucketMb;  // PyTorch's layout
  EXPECT_EQ(bucket_caps(c).bucket_bytes, 5 * 1048576.0);
  EXPECT_EQ(bucket_caps(c).first_bytes, 0.5 * 1048576.0);
  EXPECT_EQ(bucket_caps(c).last_bytes, BucketCaps::kAsTheOthers);
  const nlohmann::json stored = to_json(c);
  EXPECT_EQ(stored.at("first_bucket_mb"), 0.5);
  EXPECT_EQ(stored.at("last_bucket_mb"), "auto");
  const TrainConfig back = config_from_json(stored);
  EXPECT_EQ(back.first_bucket_mb, 0.5);
  EXPECT_EQ(back.last_bucket_mb, kAutoEndBucketMb);

  nlohmann::json older = {{"bucket_mb", 5.0}, {"first_bucket_mb", 0.25}, {"link_gbps", -1.0}, {"link_latency_us", 3.0}};
  EXPECT_TRUE(predates_last_bucket_cap(older));
  upgrade_config_keys(older);
  EXPECT_EQ(older, (nlohmann::json{{"bucket_mb", 5.0},
                                   {"first_bucket_mb", "auto"},
                                   {"last_bucket_mb", 0.25},
                                   {"link_gbps", "auto"},  // stored as its stand-in then
                                   {"link_latency_us", 3.0}}));
  EXPECT_FALSE(predates_last_bucket_cap(older));
  const TrainConfig read = config_from_json(older);
  EXPECT_EQ(bucket_caps(read).first_bytes, BucketCaps::kAsTheOthers);
  EXPECT_EQ(bucket_caps(read).last_bytes, 0.25 * 1048576.0);
  nlohmann::json current = to_json(TrainConfig{});
  const nlohmann::json before = current;
  upgrade_config_keys(current);
  EXPECT_EQ(current, before);
}

}  // namespace
}  // namespace ddplab
