// What ddplab's ranks agree on before any work: that they run the same program (runtime/rank_identity.h; this
// process's identity is made here, from its command line and build), and that none refuses its own command line.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "runtime/rank_identity.h"

namespace ddplab {

// This process: the first word of argv, this build's version and commit, and MPI's processor name.
RankIdentity this_rank_identity(int argc, char** argv);

// Collective over `comm`: "" when `mine` (this rank's reason it cannot go on, "" if it can) is empty on every rank,
// else the lowest failing rank's reason, on every rank, prefixed "rank N: " when some rank did not fail (where all
// did, the reason is usually the same everywhere: a setting given to the whole job). So every rank refuses alike,
// rather than some failing inside a later collective while others wait there.
std::string first_failing_reason(const std::string& mine, MPI_Comm comm);

}  // namespace ddplab
