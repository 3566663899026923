// Which node each rank is on (docs/COMM.md: topology); the transport table (comm/transport_table.h) picks each
// pair's transport from it. Nodes are the hosts (ranks that share memory,
// MPI_COMM_TYPE_SHARED) or, to study several nodes on one machine, emulated: --ranks-per-node K puts rank r on node
// r / K, and the pairs across emulated nodes then talk MPI although they could share memory.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace ddplab {

struct Topology {
  std::vector<int> node_of_rank;  // per rank of the communicator: 0, 1, ... in the order of each node's first rank
  int ranks_per_node = 0;         // the --ranks-per-node K that emulated them; 0: the hosts are the nodes

  int size() const { return static_cast<int>(node_of_rank.size()); }
  int nodes() const;
  std::vector<int> node_sizes() const;  // ranks of each node, by node index
  bool same_node(int a, int b) const { return node_of_rank[a] == node_of_rank[b]; }
  bool emulated() const { return ranks_per_node > 0; }
  // "1 node", "2 nodes x 2 ranks (emulated)", "2 nodes of 3, 1 ranks"
  std::string describe() const;
};

// Collective over comm: the one place nodes are computed. ranks_per_node > 0 emulates nodes of K consecutive ranks
// and must divide the size of comm (std::invalid_argument naming both otherwise); 0 groups the ranks by host.
Topology detect_topology(MPI_Comm comm, int ranks_per_node);
// Any grouping, by node ids (equal id: one node): the tests' uneven splits, and a sub-communicator's view.
Topology topology_from_ids(const std::vector<int>& node_ids, int ranks_per_node = 0);

// Collective over comm: each rank's host, named by its lowest rank in comm (MPI_COMM_TYPE_SHARED).
std::vector<int> host_of_rank(MPI_Comm comm);

}  // namespace ddplab
