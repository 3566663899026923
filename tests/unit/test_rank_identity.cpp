// The line that refuses a job whose ranks run different subcommands or builds (runtime/rank_identity.h), over a
// table of per-rank identities; the collective around it is exercised end to end by tests/cli/bad_input.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/rank_identity.h"

namespace ddplab {
namespace {

RankIdentity rank(const std::string& command, const std::string& host = "a", const std::string& version = "0.1.0",
                  const std::string& commit = "d73cee0a1b2c") {
  return RankIdentity{command, version, commit, host};
}

struct Case {
  const char* name;
  std::vector<RankIdentity> ranks;
  std::string expected;
};

TEST(RankAgreement, NamesWhatDiffersAndWhichRanksOnWhichHosts) {
  const std::string build = "ddplab 0.1.0 (commit d73cee0a1b2c)";
  const std::vector<Case> cases = {
      {"one rank", {rank("train")}, ""},
      {"same everywhere", {rank("train"), rank("train", "b"), rank("train", "c")}, ""},
      {"different subcommand",
       {rank("train"), rank("suite")},
       "ranks disagree on the subcommand: rank 0 (host a) runs train, rank 1 (host a) runs suite"},
      {"groups of ranks, hosts once each",
       {rank("train"), rank("train", "b"), rank("suite", "b"), rank("train", "b"), rank("suite", "c")},
       "ranks disagree on the subcommand: ranks 0-1, 3 (hosts a, b) run train, ranks 2, 4 (hosts b, c) run suite"},
      {"no subcommand on one rank",
       {rank("devices"), rank("")},
       "ranks disagree on the subcommand: rank 0 (host a) runs devices, rank 1 (host a) runs no subcommand"},
      {"different commit",
       {rank("train"), rank("train", "b", "0.1.0", "0123456789ab")},
       "ranks disagree on the build: rank 0 (host a) runs " + build +
           ", rank 1 (host b) runs ddplab 0.1.0 (commit 0123456789ab); every rank needs the same ddplab"},
      {"different version",
       {rank("train", "a", "0.2.0"), rank("train", "b")},
       "ranks disagree on the build: rank 0 (host a) runs ddplab 0.2.0 (commit d73cee0a1b2c), rank 1 (host b) runs " +
           build + "; every rank needs the same ddplab"},
      {"the build before the subcommand",
       {rank("train"), rank("suite", "b", "0.1.0", "0123456789ab-dirty")},
       "ranks disagree on the build: rank 0 (host a) runs " + build +
           ", rank 1 (host b) runs ddplab 0.1.0 (commit 0123456789ab-dirty); every rank needs the same ddplab"},
  };
  for (const Case& c : cases) EXPECT_EQ(rank_identity_disagreement(c.ranks), c.expected) << c.name;
}

TEST(RankAgreement, ManyHostsAreCounted) {
  std::vector<RankIdentity> ranks;
  for (const char* host : {"h0", "h1", "h2", "h3", "h4", "h5"}) ranks.push_back(rank("train", host));
  ranks.push_back(rank("sweep", "h6"));
  EXPECT_EQ(rank_identity_disagreement(ranks),
            "ranks disagree on the subcommand: ranks 0-5 (hosts h0, h1, h2, h3 and 2 more) run train, rank 6 (host h6) "
            "runs sweep");
}

}  // namespace
}  // namespace ddplab
