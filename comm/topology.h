// Which node each rank is on, and the transport that follows from it: shared memory between the ranks of a node,
// MPI between nodes, chosen per pair (docs/COMM.md: topology). Nodes are the hosts (ranks that share memory,
// MPI_COMM_TYPE_SHARED) or, to study several nodes on one machine, emulated: --ranks-per-node K puts rank r on node
// r / K, and the pairs across emulated nodes then talk MPI although they could share memory.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/ring_allreduce.h"
#include "comm/transport.h"

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

// The ring's transport over comm (collective), per pair: shared memory between ranks of one node that share a host,
// MPI for every other pair. DDPLAB_COMM_TRANSPORT=mpi takes MPI for all; a shared-memory setup that fails (no
// /dev/shm) is said on rank 0 and MPI serves instead. `name` says what each kind of hop uses: "shm" (one node),
// "shm within node (1 peer) + mpi across nodes (2 peers)", "mpi".
std::unique_ptr<Transport> connect_transport(MPI_Comm comm, const Topology& topology, const RingOptions& ring,
                                             std::string& name);
// What `transport` (as connect_transport made it) uses to reach the other ranks of `topology`; say_where: name the
// kind of hop even when there is one kind on one node ("shm within node (3 peers)" rather than "shm").
std::string describe_hops(const Topology& topology, const Transport& transport, bool say_where);

}  // namespace ddplab
