#include "comm/topology.h"

#include <algorithm>
#include <stdexcept>

#include "runtime/mpi_check.h"
#include "runtime/owned_comm.h"

namespace ddplab {

int Topology::nodes() const {
  return node_of_rank.empty() ? 0 : *std::max_element(node_of_rank.begin(), node_of_rank.end()) + 1;
}

std::vector<int> Topology::node_sizes() const {
  std::vector<int> sizes(nodes(), 0);
  for (int node : node_of_rank) ++sizes[node];
  return sizes;
}

std::string Topology::describe() const {
  const std::vector<int> sizes = node_sizes();
  const bool equal = std::count(sizes.begin(), sizes.end(), sizes[0]) == static_cast<long>(sizes.size());
  std::string text = std::to_string(sizes.size()) + (sizes.size() == 1 ? " node" : " nodes");
  if (sizes.size() > 1 && equal) text += " x " + std::to_string(sizes[0]) + (sizes[0] == 1 ? " rank" : " ranks");
  if (!equal) {
    text += " of";
    for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : " ") + std::to_string(sizes[i]);
    text += " ranks";
  }
  return text + (emulated() ? " (emulated)" : "");
}

Topology topology_from_ids(const std::vector<int>& node_ids, int ranks_per_node) {
  Topology t;
  t.ranks_per_node = ranks_per_node;
  std::vector<int> seen;  // ids in order of first appearance: their index is the node's number
  for (int id : node_ids) {
    auto it = std::find(seen.begin(), seen.end(), id);
    if (it == seen.end()) it = seen.insert(seen.end(), id);
    t.node_of_rank.push_back(static_cast<int>(it - seen.begin()));
  }
  return t;
}

Topology detect_topology(MPI_Comm comm, int ranks_per_node) {
  int rank = 0, size = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &size));
  if (ranks_per_node < 0 || (ranks_per_node > 0 && size % ranks_per_node != 0))
    throw std::invalid_argument("--ranks-per-node " + std::to_string(ranks_per_node) + " does not divide the " +
                                std::to_string(size) + " ranks into equal nodes");
  if (ranks_per_node > 0) {
    std::vector<int> ids(size);
    for (int r = 0; r < size; ++r) ids[r] = r / ranks_per_node;
    return topology_from_ids(ids, ranks_per_node);
  }
  return topology_from_ids(host_of_rank(comm));
}

std::vector<int> host_of_rank(MPI_Comm comm) {
  int rank = 0, size = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &size));
  OwnedComm host;
  int lowest = 0;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, host.receive()));
  mpiCheck(MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, host));
  host.reset();
  std::vector<int> ids(size);
  mpiCheck(MPI_Allgather(&lowest, 1, MPI_INT, ids.data(), 1, MPI_INT, comm));
  return ids;
}

}  // namespace ddplab
