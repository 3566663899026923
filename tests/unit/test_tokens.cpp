// Token data and batching (data/tokens.h): deterministic sequences with the requested lengths, and batch plans
// that cover every sequence of an epoch exactly once, respect the token budget, group similar lengths, and pack
// rows nearly full; token shards in llm.c's format read as windows (data/token_files.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokens.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/token_shards.h"

namespace ddplab {
namespace {

TokenDataConfig lab_config(int64_t epoch) {
  TokenDataConfig c;  // the lab's: log-uniform [64, 256] with 8% at 256
  c.epoch_size = epoch;
  return c;
}

TEST(SyntheticTokens, LengthsFollowTheDistributionAndTokensAreInRange) {
  const SyntheticTokens data(lab_config(20000));
  int outliers = 0, below_100 = 0;
  std::vector<int32_t> tokens(256);
  for (int64_t i = 0; i < 20000; ++i) {
    const int len = data.length(i);
    ASSERT_GE(len, 64);
    ASSERT_LE(len, 256);
    outliers += len == 256;
    below_100 += len < 100;
    if (i < 200) {
      data.fill(tokens.data(), i);
      for (int t = 0; t < len; ++t) ASSERT_TRUE(tokens[t] >= 0 && tokens[t] < 8192);
      ASSERT_LT(data.label(i), 16);
    }
  }
  EXPECT_NEAR(outliers / 20000.0, 0.08, 0.01);
  // Log-uniform on [64, 257): P(len < 100) = ln(100/64) / ln(257/64) = 0.32, times 0.92 for the non-outliers.
  EXPECT_NEAR(below_100 / 20000.0, 0.92 * std::log(100.0 / 64) / std::log(257.0 / 64), 0.015);
  EXPECT_EQ(data.length(123), SyntheticTokens(lab_config(20000)).length(123));  // deterministic
}

// Every sequence of the epoch exactly once, over all steps and ranks, and the rows account for every sequence.
void expect_exact_cover(const BatchPlan& plan, int world, int64_t epoch) {
  std::vector<int> seen(epoch, 0);
  for (int64_t s = 0; s < plan.num_steps(); ++s) {
    for (int r = 0; r < world; ++r) {
      for (int64_t id : plan.batch(s, r)) ++seen[id];
      int64_t in_rows = 0;
      for (int count : plan.rows(s, r)) in_rows += count;
      ASSERT_EQ(in_rows, static_cast<int64_t>(plan.batch(s, r).size())) << "step " << s << " rank " << r;
    }
  }
  for (int64_t i = 0; i < epoch; ++i) ASSERT_EQ(seen[i], 1) << "sequence " << i;
}

TEST(BatchPlan, EveryStrategyCoversTheEpochExactlyOnce) {
  const int64_t epoch = 5003;  // not a multiple of anything
  const SyntheticTokens data(lab_config(epoch));
  for (Batching strategy : {Batching::kSample, Batching::kBucket, Batching::kToken, Batching::kPack}) {
    for (int world : {1, 3, 4}) {
      const BatchPlan plan(data, BatchingConfig{strategy, 8, 4096, 16}, world, 99);
      expect_exact_cover(plan, world, epoch);
    }
  }
}

TEST(BatchPlan, TokenBudgetIsRespected) {
  const SyntheticTokens data(lab_config(3000));
  const BatchPlan plan(data, BatchingConfig{Batching::kToken, 8, 2048, 16}, 4, 5);
  for (int64_t s = 0; s < plan.num_steps(); ++s)
    for (int r = 0; r < 4; ++r) {
      if (plan.batch(s, r).size() > 1) {
        EXPECT_LE(plan.padded_tokens(s, r), 2048);
      }
    }
}

// Packing: rows of at most max_len tokens, max_tokens / max_len rows per rank (the last step's fewer, split evenly),
// nearly full. Sequences of 193..255 tokens leave gaps no sequence (>= 64) fits, so about 5% stays padding on the
// lab's distribution; next-fit (a new row whenever the next sequence does not fit) would leave about 24%.
TEST(BatchPlan, PackingFillsRowsWithinTheBudget) {
  const SyntheticTokens data(lab_config(6000));
  for (int world : {1, 3}) {
    const BatchPlan plan(data, BatchingConfig{Batching::kPack, 8, 4 * 256 + 100, 16}, world, 11);
    int64_t useful = 0, padded = 0, full_steps = 0;
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      size_t lo = SIZE_MAX, hi = 0;
      for (int r = 0; r < world; ++r) {
        const auto& ids = plan.batch(s, r);
        size_t next = 0;
        for (int count : plan.rows(s, r)) {
          int row = 0;
          for (int k = 0; k < count; ++k) row += data.length(ids[next++]);
          ASSERT_LE(row, 256) << "step " << s << " rank " << r;
          ASSERT_GE(count, 1);
        }
        lo = std::min(lo, plan.rows(s, r).size());
        hi = std::max(hi, plan.rows(s, r).size());
        useful += plan.useful_tokens(s, r);
        padded += plan.padded_tokens(s, r);
        EXPECT_LE(plan.padded_tokens(s, r), 4 * 256);
      }
      EXPECT_LE(hi, 4u);
      EXPECT_LE(hi - lo, 1u);
      full_steps += lo == 4;
    }
    EXPECT_GE(full_steps, plan.num_steps() - 1);
    const double padding = 1.0 - static_cast<double>(useful) / padded;
    EXPECT_LT(padding, 0.08) << "world " << world;
    EXPECT_GT(padding, 0.0);
  }
}

TEST(BatchPlan, BucketingEvensOutTokensAcrossRanks) {
  // Mean over steps of (max - min) useful tokens across ranks: bucketing must cut it well below sample order.
  const SyntheticTokens data(lab_config(8192));
  auto spread = [&](Batching b) {
    const BatchPlan plan(data, BatchingConfig{b, 16, 4096, 16}, 4, 7);
    double total = 0;
    for (int64_t s = 0; s < plan.num_steps(); ++s) {
      int64_t lo = INT64_MAX, hi = 0;
      for (int r = 0; r < 4; ++r) {
        lo = std::min(lo, plan.useful_tokens(s, r));
        hi = std::max(hi, plan.useful_tokens(s, r));
      }
      total += static_cast<double>(hi - lo) / plan.num_steps();
    }
    return total;
  };
  const double by_sample = spread(Batching::kSample), by_bucket = spread(Batching::kBucket);
  EXPECT_LT(by_bucket, by_sample / 3) << "sample " << by_sample << " bucket " << by_bucket;
}

TEST(BatchPlan, SameOnEveryRankAndBadInputRefused) {
  const SyntheticTokens data(lab_config(500));
  const BatchPlan a(data, BatchingConfig{Batching::kBucket, 4, 4096, 4}, 2, 3);
  const BatchPlan b(data, BatchingConfig{Batching::kBucket, 4, 4096, 4}, 2, 3);
  ASSERT_EQ(a.num_steps(), b.num_steps());
  for (int64_t s = 0; s < a.num_steps(); ++s) EXPECT_EQ(a.batch(s, 1), b.batch(s, 1));
  for (int64_t s = 0; s < a.num_steps(); ++s) EXPECT_EQ(a.rows(s, 1), std::vector<int>(a.batch(s, 1).size(), 1));
  const BatchingConfig pack{Batching::kPack, 4, 4096, 4};
  const BatchPlan p(data, pack, 2, 3), q(data, pack, 2, 3);
  ASSERT_EQ(p.num_steps(), q.num_steps());
  for (int64_t s = 0; s < p.num_steps(); ++s) EXPECT_EQ(p.rows(s, 0), q.rows(s, 0));
  EXPECT_THROW(BatchPlan(data, BatchingConfig{Batching::kSample, 0, 1, 1}, 2, 3), std::invalid_argument);
  EXPECT_THROW(parse_choice<Batching>("random", "--batching"), std::invalid_argument);
  EXPECT_EQ(parse_choice<Batching>("pack", "--batching"), Batching::kPack);
  EXPECT_THROW(parse_choice<LengthDist>("normal", "--lengths"), std::invalid_argument);
}

// Token shards in llm.c's format (data/token_files.h).
using TokenShards = TempDirTest;

// Windows of 5 tokens, each starting on the last token of the one before, in the shards' name order, never across
// two shards: every (token, next token) pair of a shard is the pair of exactly one window.
TEST_F(TokenShards, WindowsOverlapByOneTokenAndStayInTheirShard) {
  write_token_shard(path("b_001.bin"), counting_tokens(10, 1000));  // (10 - 1) / 4 = 2 windows, 1 token left
  write_token_shard(path("b_000.bin"), counting_tokens(13));        // 3 windows
  write_token_shard(path("b_002.bin"), counting_tokens(4, 2000));   // none: shorter than a window
  const TokenFiles files(path("b_*.bin"), 5);
  EXPECT_EQ(files.shards(), 3);
  EXPECT_EQ(files.tokens(), 27);
  ASSERT_EQ(files.sequences(), 5);
  EXPECT_EQ(files.length(4), 5);
  EXPECT_EQ(files.min_len(), 5);
  const std::vector<std::vector<int32_t>> expected = {{0, 1, 2, 3, 4},
                                                      {4, 5, 6, 7, 8},
                                                      {8, 9, 10, 11, 12},
                                                      {1000, 1001, 1002, 1003, 1004},
                                                      {1004, 1005, 1006, 1007, 1008}};
  for (int64_t i = 0; i < 5; ++i) {
    std::vector<int32_t> window(5, -1);
    files.fill(window.data(), i);
    EXPECT_EQ(window, expected[i]) << "window " << i;
  }
  EXPECT_THROW(files.fill(std::vector<int32_t>(5).data(), 5), std::out_of_range);
  EXPECT_EQ(files.describe(), "data " + path("b_*.bin") + " (2.7e-05M tokens in 3 shards, 5 windows of 5)");
  // A batch plan over them covers each window once an epoch, as it does synthetic sequences.
  const BatchPlan plan(files, BatchingConfig{Batching::kSample, 2, 4096, 16}, 2, 7);
  expect_exact_cover(plan, 2, files.sequences());
}

// A resumed run compares the shards by their fingerprint: the same files from another folder match; a shard added, or
// one of another length, does not.
TEST_F(TokenShards, TheFingerprintFollowsTheShardsNotTheirFolder) {
  std::filesystem::create_directory(path("here"));
  std::filesystem::create_directory(path("there"));
  for (const char* folder : {"here", "there"}) {
    write_token_shard(path(folder) + "/s_0.bin", counting_tokens(100));
    write_token_shard(path(folder) + "/s_1.bin", counting_tokens(50, 9));
  }
  const std::string fingerprint = TokenFiles(path("here/s_*.bin"), 8).fingerprint();
  EXPECT_EQ(fingerprint.substr(0, 27), "21 windows of 8 in 2 shards");  // 99 / 7 + 49 / 7
  EXPECT_EQ(TokenFiles(path("there/s_*.bin"), 8).fingerprint(), fingerprint);
  EXPECT_NE(TokenFiles(path("here/s_*.bin"), 9).fingerprint(), fingerprint) << "another window";
  write_token_shard(path("there/s_1.bin"), counting_tokens(51, 9));
  EXPECT_NE(TokenFiles(path("there/s_*.bin"), 8).fingerprint(), fingerprint)
      << "a shard one token longer (as many windows)";
  write_token_shard(path("here/s_2.bin"), counting_tokens(3));
  EXPECT_NE(TokenFiles(path("here/s_*.bin"), 8).fingerprint(), fingerprint) << "a shard more, with no window";
}

TEST_F(TokenShards, TheFirstTokenOutsideTheVocabularyIsNamed) {
  std::vector<uint16_t> tokens = counting_tokens(100);
  tokens[77] = 50304;
  write_token_shard(path("a.bin"), tokens);
  const TokenFiles files(path("a.bin"), 8);
  EXPECT_EQ(files.first_token_outside(50304), path("a.bin") + ": token 50304 at index 77");
  EXPECT_EQ(files.first_token_outside(50305), "");
}

// Each refusal names the shard and what is wrong, before any window is read.
TEST_F(TokenShards, DamagedOrForeignFilesAreRefusedByName) {
  const auto refusal = [&](const std::string& pattern, int window = 4) {
    try {
      TokenFiles files(pattern, window);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refusal(path("none_*.bin")), path("none_*.bin") + ": no such file");
  write_token_shard(path("truncated.bin"), counting_tokens(100), 101);
  EXPECT_EQ(refusal(path("truncated.bin")), path("truncated.bin") +
                                                ": the header counts 101 tokens, the file holds 100 "
                                                "(1224 bytes): truncated or not a token shard");
  write_token_shard(path("magic.bin"), counting_tokens(100), -1, 20240801);
  EXPECT_EQ(refusal(path("magic.bin")),
            path("magic.bin") + ": not a token shard (magic 20240801, llm.c's is 20240520)");
  write_token_shard(path("version.bin"), counting_tokens(100), -1, kTokenShardMagic, 7);
  EXPECT_EQ(refusal(path("version.bin")),
            path("version.bin") + ": token shard version 7, only version 1 (uint16 tokens, GPT-2's) is read");
  std::FILE* text = std::fopen(path("text.bin").c_str(), "wb");
  std::fputs("hello", text);
  std::fclose(text);
  EXPECT_EQ(refusal(path("text.bin")),
            path("text.bin") + ": not a token shard (5 bytes, shorter than llm.c's 1024-byte header)");
  write_token_shard(path("short.bin"), counting_tokens(3));
  EXPECT_EQ(refusal(path("short.bin")), path("short.bin") +
                                            ": no shard holds a window of --max-len 4 tokens (3 tokens "
                                            "in all); lower --max-len");
  EXPECT_EQ(refusal(path("short.bin"), 3), "accepted");
  // One damaged shard among good ones refuses the set.
  write_token_shard(path("set_0.bin"), counting_tokens(100));
  write_token_shard(path("set_1.bin"), counting_tokens(100), 99);
  EXPECT_EQ(refusal(path("set_*.bin")), path("set_1.bin") +
                                            ": the header counts 99 tokens, the file holds 100 "
                                            "(1224 bytes): truncated or not a token shard");
}

}  // namespace
}  // namespace ddplab
