#include "launcher/rank_agreement.h"

#include <climits>
#include <cstdio>

#include "git_commit.h"
#include "record/version.h"

namespace ddplab {

RankIdentity this_rank_identity(int argc, char** argv) {
  return this_rank_runs(argc > 1 ? argv[1] : "", kVersion, DDPLAB_GIT_COMMIT);
}

std::string first_failing_reason(const std::string& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int failing = mine.empty() ? INT_MAX : rank;
  int first = INT_MAX, failed = 0;
  MPI_Allreduce(&failing, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return "";
  const int mine_failed = mine.empty() ? 0 : 1;
  MPI_Allreduce(&mine_failed, &failed, 1, MPI_INT, MPI_SUM, comm);
  char reason[1024] = {};
  std::snprintf(reason, sizeof reason, "%s", mine.c_str());
  MPI_Bcast(reason, sizeof reason, MPI_CHAR, first, comm);
  return (failed < size ? "rank " + std::to_string(first) + ": " : std::string()) + reason;
}

}  // namespace ddplab
