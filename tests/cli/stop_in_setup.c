/* A rank stopped during its start, as a debugger or a terminal's ^Z stops it (LD_PRELOAD on that rank alone): it
   stops itself (SIGSTOP) on entering its first MPI_Comm_split_type, the topology's split of the ranks by host, a
   collective of the run's setup in which the other ranks then wait for it; with STOP_IN=MPI_Allreduce in its
   environment, on entering its first MPI_Allreduce instead: the ranks' first agreement after MPI_Init (MPI's thread
   level), before any option is read. */
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static int stops_in(const char* name) {
  const char* where = getenv("STOP_IN");
  return strcmp(where ? where : "MPI_Comm_split_type", name) == 0;
}

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm* newcomm) {
  if (stops_in("MPI_Comm_split_type")) raise(SIGSTOP);
  return PMPI_Comm_split_type(comm, split_type, key, info, newcomm);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  static int calls = 0;
  if (calls++ == 0 && stops_in("MPI_Allreduce")) raise(SIGSTOP);
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}
