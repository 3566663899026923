// The checks `ddplab train` makes before any work (launcher/cli.h: validate, validate_for_ranks) on flags parsed as it
// parses them: sizes the run could not hold are refused with one line naming the flag and the limit, where the run
// would otherwise fail in its first step. And the checks made as `ddplab suite`'s flags are parsed.
#include <gtest/gtest.h>
#include <sys/sysinfo.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/suite.h"
#include "runtime/errors.h"

namespace ddplab {
namespace {

// The UsageError's line for `ddplab train FLAGS` on `ranks` ranks, or "" where the checks pass.
std::string refusal(const std::vector<std::string>& flags, int ranks = 1) {
  CLI::App app{"ddplab"};
  TrainConfig config;
  add_train_flags(&app, config);
  std::vector<const char*> argv{"ddplab"};
  for (const std::string& flag : flags) argv.push_back(flag.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    validate(config);
    validate_for_ranks(config, ranks);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The global batch is an int wherever a step's samples are counted (it read as -2^31 in a run file's reports).
TEST(CliChecks, AGlobalBatchPastAnIntIsRefused) {
  EXPECT_EQ(refusal({"--batch", "1073741824"}, 2),
            "--batch 1073741824 x 2 ranks is more than the 2147483647 samples a step can count (the global batch): "
            "lower --batch");
  EXPECT_EQ(refusal({"--batch", "65536", "--grad-accum", "32768"}),
            "--batch 65536 x 1 rank x 32768 micro-batches (--grad-accum) is more than the 2147483647 samples a step "
            "can count (the global batch): lower --batch");
  EXPECT_NE(refusal({"--batch", "2147483647", "--grad-accum", "2147483647"}, 3), "");  // no 64-bit overflow either
  // At the bound the count fits (the host's memory may still refuse such a batch, for its activations).
  EXPECT_EQ(refusal({"--batch", "1073741823"}, 2).find("samples a step can count"), std::string::npos);
  EXPECT_EQ(refusal({"--batch", "2147483647"}).find("samples a step can count"), std::string::npos);
}

// An epoch's plan holds 16 bytes a sequence on every rank, made in the first step.
TEST(CliChecks, AnEpochPastThisHostsMemoryIsRefused) {
  struct sysinfo info;
  ASSERT_EQ(sysinfo(&info), 0);
  const uint64_t memory = (static_cast<uint64_t>(info.totalram) + info.totalswap) * info.mem_unit;
  const std::string most = std::to_string(memory / 16);
  const std::string refused = refusal({"--model", "tiny", "--epoch-size", std::to_string(memory / 16 + 1)});
  EXPECT_EQ(refused.rfind("--epoch-size must be at most " + most + " on this host, whose memory is ", 0), 0u)
      << refused;
  EXPECT_NE(refused.find(": an epoch's plan takes 16 bytes a sequence (got "), std::string::npos) << refused;
  EXPECT_NE(refusal({"--model", "tiny", "--epoch-size", "4611686018427387904"}), "");
  EXPECT_EQ(refusal({"--model", "tiny", "--epoch-size", most}), "");
}

// The loader holds --prefetch + 1 batches, made in the first step (with loader threads; without, one).
TEST(CliChecks, PrefetchPastThisHostsMemoryIsRefused) {
  // 2^31 batches of 2^16 x 2^16 features: 2^65 bytes, past any memory.
  const std::vector<std::string> huge = {"--batch", "65536", "--input-dim", "65536", "--prefetch", "2147483647"};
  std::vector<std::string> threaded = huge;
  threaded.insert(threaded.end(), {"--loader-threads", "1"});
  const std::string refused = refusal(threaded);
  EXPECT_EQ(refused.rfind("--prefetch must be at most ", 0), 0u) << refused;
  EXPECT_NE(refused.find(": the loader holds --prefetch + 1 batches of 65536 samples (--batch) of 65536 features "
                         "(--input-dim) (got 2147483647)"),
            std::string::npos)
      << refused;
  EXPECT_EQ(refusal(huge).rfind("--prefetch needs --loader-threads 1 or more", 0), 0u);  // nothing prefetched
  EXPECT_EQ(refusal({"--loader-threads", "2", "--prefetch", "64"}), "");
}

// The watchdog watches waits: a hung rank is found by its peers waiting for it, and one rank alone has none.
TEST(CliChecks, AHangNeedsAPeerToFindIt) {
  const std::vector<std::string> hang = {"--fault", "hang", "--fault-step", "2"};
  EXPECT_EQ(refusal(hang, 1),
            "--fault hang needs 2 or more ranks: a hung rank is found by its peers' watchdogs, and 1 rank has none");
  EXPECT_EQ(refusal(hang, 2), "");
  EXPECT_EQ(refusal({"--fault", "kill", "--fault-step", "2"}, 1), "");
}

// A flag that only another knob's setting makes the run read is refused without it, and taken with it.
TEST(CliChecks, AFlagWithoutTheKnobThatMakesItReadIsRefused) {
  struct Case {
    std::vector<std::string> alone, with_partner;
  };
  const Case cases[] = {
      {{"--fault-rank", "1"}, {"--fault-rank", "1", "--fault", "nan"}},
      {{"--fault-step", "1"}, {"--fault-step", "1", "--fault", "nan"}},
      {{"--prefetch", "4"}, {"--prefetch", "4", "--loader-threads", "1"}},
      {{"--barrier-every", "2"}, {"--barrier-every", "2", "--rank0-work-ms", "1"}},
      {{"--slow-rank", "1"}, {"--slow-rank", "1", "--straggler-ms", "1"}},
      {{"--slow-rank", "1", "--straggler-ms", "0"}, {"--slow-rank", "1", "--busy-threads", "1"}},
      {{"--momentum", "0.9"}, {"--momentum", "0.9", "--optimizer", "sgd"}},
      {{"--model", "tiny", "--loader-threads", "2"}, {"--loader-threads", "2"}},
      {{"--model", "tiny", "--data-cost-ms", "1"}, {"--data-cost-ms", "1"}},
  };
  for (const Case& c : cases) {
    const std::string flag = c.alone[c.alone[0] == "--model" ? 2 : 0];
    EXPECT_EQ(refusal(c.alone, 2).rfind(flag + " needs ", 0), 0u) << refusal(c.alone, 2);
    EXPECT_EQ(refusal(c.with_partner, 2), "");
  }
  // The partner set but at its own "off" is no partner: --loader-threads 0 prefetches nothing.
  EXPECT_NE(refusal({"--prefetch", "4", "--loader-threads", "0"}), "");
  // An empty path given is a variable left unset, not a request for the default.
  EXPECT_EQ(refusal({"--checkpoint", ""}), "--checkpoint needs a path (got an empty one)");
  EXPECT_EQ(refusal({"--resume", ""}), "--resume needs a path (got an empty one)");
  EXPECT_EQ(refusal({"--out", ""}), "--out needs a path (got an empty one)");
}

// `ddplab suite FLAGS` parsed as the binary parses it: the steps its cases run, or the UsageError's line.
std::string suite_steps(const std::vector<std::string>& flags) {
  CLI::App app{"ddplab"};
  SuiteOptions options;
  add_suite_command(app, options);
  std::vector<const char*> argv{"ddplab", "suite", "lab"};
  for (const std::string& flag : flags) argv.push_back(flag.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const UsageError& e) {
    return e.what();
  }
  return std::to_string(options.base.steps);
}

// --full makes a suite's cases 100 steps long (with --steps, refused: it is --steps 100), and --warmup-steps is held
// against the steps that will run, not the 20 of a suite without --full.
TEST(CliChecks, ASuitesWarmUpIsCheckedAgainstTheStepsItRuns) {
  EXPECT_EQ(suite_steps({}), "20");
  EXPECT_EQ(suite_steps({"--full"}), "100");
  EXPECT_EQ(suite_steps({"--full", "--warmup-steps", "30"}), "100");
  EXPECT_EQ(suite_steps({"--warmup-steps", "99", "--full"}), "100");
  EXPECT_EQ(suite_steps({"--full", "--warmup-steps", "100"}),
            "--warmup-steps 100 leaves none of the 100 steps (--steps) to measure: it must be smaller");
  for (const std::vector<std::string>& both :
       {std::vector<std::string>{"--full", "--steps", "50"}, {"--steps", "50", "--full"}, {"--steps", "100", "--full"}})
    EXPECT_EQ(suite_steps(both), "--full is --steps 100: give one of them");
  EXPECT_EQ(suite_steps({"--warmup-steps", "30"}),
            "--warmup-steps 30 leaves none of the 20 steps (--steps) to measure: it must be smaller");
}

}  // namespace
}  // namespace ddplab
