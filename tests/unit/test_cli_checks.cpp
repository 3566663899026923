// The checks `ddplab train` makes before any work (launcher/cli.h: validate, validate_for_ranks) on flags parsed as it
// parses them: sizes the run could not hold are refused with one line naming the flag and the limit.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "record/errors.h"

namespace ddplab {
namespace {

// The UsageError's line for `ddplab train FLAGS` on `ranks` ranks, or "" where the checks pass.
std::string refusal(const std::vector<std::string>& flags, int ranks = 1) {
  CLI::App app{"ddplab"};
  TrainConfig config;
  add_train_flags(&app, config);
  std::vector<const char*> argv{"ddplab"};
  for (const std::string& flag : flags) argv.push_back(flag.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  try {
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
  EXPECT_EQ(refusal({"--batch", "1073741823"}, 2), "");
  EXPECT_EQ(refusal({"--batch", "2147483647"}), "");
}

}  // namespace
}  // namespace ddplab
