/* A rank stopped during the run's setup, as a debugger or a terminal's ^Z stops it (LD_PRELOAD on that rank alone):
   it stops itself (SIGSTOP) on entering its first MPI_Comm_split_type, the topology's split of the ranks by host, a
   collective in which the other ranks then wait for it. */
#include <mpi.h>
#include <signal.h>

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* newcomm) {
  raise(SIGSTOP);
  return PMPI_Comm_split_type(comm, split_type, key, info, newcomm);
}
