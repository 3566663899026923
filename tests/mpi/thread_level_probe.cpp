// thread_level_probe LEVEL: starts MPI asking for LEVEL (single, funneled, serialized or multiple), standing for a
// library that gives no more, then makes the start-up check of every ddplab program (runtime/mpi_init.h). Passing it,
// one all-reduce and exit 0; tests/mpi/check_thread_level.py runs it.
#include <mpi.h>

#include <cstdio>
#include <cstring>

#include "runtime/mpi_init.h"

int main(int argc, char** argv) {
  const char* names[] = {"single", "funneled", "serialized", "multiple"};
  const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};
  int asked = -1;
  for (int i = 0; i < 4; ++i)
    if (argc > 1 && std::strcmp(argv[1], names[i]) == 0) asked = levels[i];
  if (asked < 0) {
    std::fprintf(stderr, "usage: thread_level_probe single|funneled|serialized|multiple\n");
    return 2;
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, asked, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("asked for %s, got %s\n", argv[1], ddplab::mpi_thread_level_name(provided));
  std::fflush(stdout);
  ddplab::require_mpi_thread_multiple(provided, "thread_level_probe");
  int one = 1, ranks = 0;
  MPI_Allreduce(&one, &ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("went on: %d ranks\n", ranks);
  MPI_Finalize();
  return 0;
}
