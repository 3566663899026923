// Whether every rank of a job runs the same program: the same subcommand of the same build of ddplab, or the same
// benchmark (allreduce_perf). An MPMD launch (`mpirun -np 1 ddplab train : -np 1 ddplab suite lab`, or a ddplab
// rank beside an allreduce_perf rank) or a shared install updated on some hosts but not others hands ranks different
// programs, which would enter different collectives and wait on each other forever. The check is one collective
// that every program here reaches first, so it completes whatever the ranks run.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace ddplab {

// What one rank runs and where. `command` is what it runs: ddplab's first word of its command line (the subcommand, or
// a flag such as --version), or the benchmark's name; `host` only names the rank in the message.
struct RankIdentity {
  std::string command;
  std::string version;
  std::string commit;
  std::string host;
};

// This process: what it runs (command), its build (version, commit), and MPI's processor name.
RankIdentity this_rank_runs(const std::string& command, const std::string& version, const std::string& commit);

// "" when every rank runs the same build and subcommand, else one line naming what differs and which ranks (with
// their hosts) run what, the build first (different builds may not even agree on what a subcommand means):
// "ranks disagree on the subcommand: rank 0 (host a) runs train, rank 1 (host a) runs suite". `ranks` is indexed by
// rank.
std::string rank_identity_disagreement(const std::vector<RankIdentity>& ranks);

// Collective over `comm`, the same fixed-size MPI_Allgather on every rank whatever it runs. Returns, on every rank,
// rank_identity_disagreement of every rank's identity. Fields longer than their slot are cut to fit.
std::string identity_disagreement(const RankIdentity& mine, MPI_Comm comm);

}  // namespace ddplab
