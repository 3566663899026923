// Small helpers shared by the multi-rank tests.
#pragma once
#include <mpi.h>

namespace ddplab {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Ranks of this job on this node (the GPU tests compare it with the node's device count).
inline int ranks_on_this_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

}  // namespace ddplab
